"""forced_profile.py - a tuning profile that forces one attention configuration, for timing a
configuration the device's built-in does not choose (tools/scripts/gpu-check.sh times the local
tiles' sub-tile shapes with it).

    python forced_profile.py --key-from PROFILE --out FORCED.json NAME=VALUE...

The key is copied from PROFILE, a profile the library wrote for the same device (the tune step's),
so that the library loads the result; the configuration becomes the attention kernel's device-wide
default, every parameter not named taking the value of a local-tile configuration's canonical
form (src/tune/space_attention.c). `iha bench` then reports the configuration it ran, which a
caller compares with the one it asked for: the library passes over an entry that does not fit
the device. The tensor-core variants (3 and 4) are valid for 16-bit storage only, so their entry's
bucket says elem_bytes 2 and `iha bench` must run the core with --core-half. Standard library only.
"""

import argparse
import json
import sys

# The local tiles' canonical form: the register-tile parameters at the values the space fixes.
BASE = {"ATT_ROWS": 1, "ATT_TILES": 1, "ATT_KB": 16, "ATT_VD": 4, "group": 64, "variant": 2, "LOC_KEYS": 32,
        "ATT_PREFETCH": 0, "TILE_RY": 4, "TILE_RX": 4}
# The format_version whose parameters BASE lists (src/tune/profile.c).
FORMAT_VERSION = 2
# Every bucket key must be present; a device-wide default's are not compared.
BUCKET = {"mask": 0, "windowed": 0, "elem_bytes": 4, "d": 0, "P": 0, "T": 0, "span": 0}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--key-from", required=True, help="a profile the library wrote for this device")
    ap.add_argument("--out", required=True)
    ap.add_argument("params", nargs="+", help="NAME=VALUE of the attention configuration")
    args = ap.parse_args()
    config = dict(BASE)
    for p in args.params:
        name, _, value = p.partition("=")
        if name not in BASE or not value.lstrip("-").isdigit():
            sys.exit(f"forced_profile.py: {p!r} is not NAME=integer for one of {', '.join(BASE)}")
        config[name] = int(value)
    with open(args.key_from) as f:
        key = json.load(f)["key"]
    bucket = dict(BUCKET, elem_bytes=2 if config["variant"] in (3, 4) else 4)
    profile = {"format": "iha-tuning-profile", "format_version": FORMAT_VERSION, "key": key,
               "entries": [{"kernel": "attention", "role": "device_default", "bucket": bucket, "config": config,
                            "seconds": 0, "default_seconds": 0, "error": 0}]}
    with open(args.out, "w") as f:
        json.dump(profile, f, indent=1)
        f.write("\n")
    print(" ".join(f"{k}={v}" for k, v in config.items()))


if __name__ == "__main__":
    main()
