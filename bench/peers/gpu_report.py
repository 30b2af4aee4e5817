"""gpu_report.py - iha beside PyTorch's SDPA on one device: a Markdown table and the issue's
targets, each met or not, from `iha bench --json` reports and cuda_sdpa.py's JSON.

    python gpu_report.py --peers peers.json --table table.md --targets targets.txt \
        --ceilings CEILINGS_JSON [--core16 IHA_JSON] [--forced IHA_JSON... --] IHA_JSON...

The ceilings (peak FMA, copy bandwidth) are those of the --ceilings report's run (its
`ceilings` section), used for every fraction, so that all rows divide by the same ceiling.
--core16 names a report of iha's attention core with 16-bit inputs, for the target that a
16-bit path be at least twice the float32 forward; without it that target is "not measured".
--forced names forward runs in configurations forced through a profile (gpu-check.sh's local
tiles and tensor-core variants): a row each, with the configuration that ran and the model's
fraction. A tensor-core row (variants 3 and 4, `iha bench --core-half`) is a fraction of the
16-bit tensor peak (--tensor-peak-tflops, dense, from the datasheet: the ceilings measure none),
with PyTorch's SDPA beside it where the float runs had the same problem; without --core16 the
fastest such row at d = 64 stands for the 16-bit target.
Standard library only: it runs wherever the iha reports are.
"""

import argparse
import json
import os

# The targets: fraction of the measured ceiling each result must reach.
FORWARD_OF_PEAK = {64: 0.5, 128: 0.4}
BACKWARD_OF_PEAK = 0.3
DECODE_OF_COPY = 0.5
CORE16_OVER_F32 = 2.0

# The performance model of doc/performance.md ("A model of the GPU kernels"): an SM issues four
# warps' FMAs and one 128-byte local-memory access (32 words) per clock, so an inner loop whose
# every local word read feeds fewer than 4 FMAs is bound by local memory at that share of peak.
FMA_PER_WORD_AT_PEAK = 4.0
# The tensor cores (cl/attention_mma_nv.cl) on SM 9.0: 2048 dense 16-bit FMAs per SM and clock
# against the same 32 words of local memory, so 64 FMAs per word at peak. H100 and H200 SXM:
# 989 TFLOP/s dense.
TENSOR_FMA_PER_WORD_AT_PEAK = 64.0
TENSOR_PEAK_TFLOPS = 989.0


def bound(parts):
    """The fraction of peak FMA that local reads allow: parts are (share of the FMAs, FMAs per
    4-byte word read from local memory)."""
    return 1.0 / sum(share / min(1.0, per_word / FMA_PER_WORD_AT_PEAK) for share, per_word in parts)


def param(config, name):
    for token in (config or "").split():
        key, _, value = token.partition("=")
        if key == name and value.lstrip("-").isdigit():
            return int(value)
    return None


def model_forward(config, d):
    """The model's fraction of peak for the forward configuration that ran (None: not modelled)."""
    variant = param(config, "variant")
    if variant == 1:  # a row per work-item: every FMA reads its key or value word from local memory
        return bound([(1.0, 1.0)])
    if variant == 2:  # TILE_RY x TILE_RX sub-tiles: each column of the scores and each key of P.V
        ry, rx = param(config, "TILE_RY") or 4, param(config, "TILE_RX") or 4
        cw = -(-d // ((param(config, "LOC_KEYS") or 32) // rx))  # output columns per work-item
        return bound([(0.5, ry * rx / (ry + rx)), (0.5, ry * cw / (ry + cw))])
    if variant == 0:
        rows = param(config, "ATT_ROWS") or 1
        if 2 * rows * d > 255:  # the rows' queries and accumulators exceed 255 registers and spill
            return 32.0 / 2 / 128  # a spilled word read and written per FMA, through the L1's 32 words a clock
        return bound([(1.0, float(rows))])
    return None


def model_mma(config):
    """The tensor-core forward's local-memory bound as a fraction of the tensor peak: per key tile
    a group of W warps does 32·W·KT·d' FMAs and reads W·KT·d' words of B fragments, writes KT·d'
    words of tiles and, transposing the values, meets 4-way bank conflicts on KT·d'/2 of them."""
    warps = (param(config, "group") or 64) // 16
    per_word = 32.0 * warps / (warps + 2.5)
    return min(1.0, per_word / TENSOR_FMA_PER_WORD_AT_PEAK)


def model_backward(d):
    """The built-in backward: the local tiles where they fit 48 KiB (d <= 64), else the row kernels.
    The passes execute 7d FMAs per visible pair (scores and dP twice) where the count is 5d."""
    if d <= 64:
        return bound([(4 / 7, 2.0), (3 / 7, 4.0)]) * 5 / 7
    return 32.0 / 2 / 128 * 5 / 7


def load(path):
    with open(path) as f:
        return json.load(f)


def fmt(x, digits=3):
    if x is None:
        return "-"
    return f"{x:.{digits}g}"


def ratio(a, b):
    return a / b if a and b else None


def peer_seconds(prob, dtype):
    r = prob["results"].get(dtype, {}) if prob else {}
    return r.get("seconds") if r.get("state") == "ran" else None


def peer_cell(prob, dtype, unit_scale):
    """A peer's rate in the row's unit, or why it has none."""
    r = prob["results"].get(dtype, {}) if prob else {}
    if r.get("state") == "ran":
        return fmt(unit_scale(prob, r))
    return "failed" if r else "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("iha_json", nargs="+")
    ap.add_argument("--peers", help="cuda_sdpa.py's JSON (absent or unreadable: iha's columns only)")
    ap.add_argument("--ceilings", required=True)
    ap.add_argument("--core16", help="an `iha bench --json` report of a 16-bit attention core")
    ap.add_argument("--forced", nargs="+", default=[], help="forward runs in forced configurations")
    ap.add_argument("--tensor-peak-tflops", type=float, default=TENSOR_PEAK_TFLOPS,
                    help="the device's dense 16-bit tensor peak (default: H100 and H200 SXM)")
    ap.add_argument("--table", required=True)
    ap.add_argument("--targets", required=True)
    args = ap.parse_args()

    ceil = load(args.ceilings).get("ceilings", {})
    peak = ceil.get("peak_fma_gflops") if ceil.get("state") == "ran" else None
    copy = ceil.get("copy_bytes_per_second") if ceil.get("state") == "ran" else None
    peers = None
    if args.peers and os.path.exists(args.peers):
        peers = load(args.peers)
    by_key = {}
    for prob in (peers or {}).get("problems", []):
        by_key[(prob["iha_json"], prob["kind"])] = prob

    rows, targets = [], []

    def target(text, value, goal, unit="", met=None):
        if value is None:
            targets.append(f"target {text}: not measured")
            return
        ok = value >= goal if met is None else met
        targets.append(f"target {text}: {value:.3g}{unit} against {goal:g}{unit}: {'met' if ok else 'NOT MET'}")

    def flops_rate(prob, r):
        return prob["flops"] / r["seconds"] / 1e12

    def bytes_rate(prob, r):
        return r["cache_bytes_per_second"] / 1e9

    f32_forward, forward_peers = {}, {}
    for path in args.iha_json:
        name = os.path.basename(path)
        rep = load(path)
        a, bw, dec = rep.get("attention", {}), rep.get("backward", {}), rep.get("decode", {})
        if a.get("state") == "ran":
            shape = f"B·H = {a['batch'] * a['heads']}, T = {a['t']}, d = {a['d']}"
            kinds = [("forward", a["seconds"], a["flops"])]
            if bw.get("state") == "ran":
                kinds.append(("backward", bw["seconds"], bw["flops"]))
            for kind, seconds, flops in kinds:
                prob = by_key.get((name, kind))
                tflops = flops / seconds / 1e12
                of_peak = flops / seconds / 1e9 / peak if peak else None
                p32, p16 = peer_seconds(prob, "float32"), peer_seconds(prob, "bfloat16")
                model = model_forward(a.get("config"), a["d"]) if kind == "forward" else model_backward(a["d"])
                rows.append([f"{a['mask']} {kind}, {shape}", "TFLOP/s", fmt(tflops), fmt(of_peak, 2) + " of peak FMA",
                             fmt(model, 2),
                             peer_cell(prob, "float32", flops_rate), peer_cell(prob, "bfloat16", flops_rate),
                             fmt(ratio(p32, seconds), 2), fmt(ratio(p16, seconds), 2)])
                what = f"{kind} fp32 {a['mask']} d={a['d']} T={a['t']} >= fraction of peak FMA"
                if kind == "forward":
                    f32_forward[(a["d"], a["t"], a["mask"])] = seconds
                    forward_peers[(a["d"], a["t"], a["mask"], a["batch"] * a["heads"])] = prob
                    target(what, of_peak, FORWARD_OF_PEAK.get(a["d"], FORWARD_OF_PEAK[128]))
                    target(f"forward fp32 {a['mask']} d={a['d']} faster than PyTorch fp32 SDPA (PyTorch's time over "
                           f"iha's)", ratio(p32, seconds), 1.0, "x", met=p32 is not None and seconds < p32)
                else:
                    target(what, of_peak, BACKWARD_OF_PEAK)
        if dec.get("state") == "ran":
            prob = by_key.get((name, "decode"))
            storage = "bf16" if dec.get("bf16") else "half" if dec.get("half") else "float"
            seconds = dec["attention_seconds"]
            of_copy = dec["cache_bytes_per_second"] / copy if copy else None
            p32, p16 = peer_seconds(prob, "float32"), peer_seconds(prob, "bfloat16")
            rows.append([f"decoding step's attention, {storage} cache, B = {dec['batch']}, H = {dec['heads']}, "
                         f"d = {dec['d']}, {dec['cached_tokens']} cached tokens ({dec['cached_tokens'] * dec['p']} "
                         f"keys), {fmt(seconds * 1e6)} µs", "GB/s", fmt(dec["cache_bytes_per_second"] / 1e9),
                         fmt(of_copy, 2) + " of copy", "1 (bytes)", peer_cell(prob, "float32", bytes_rate),
                         peer_cell(prob, "bfloat16", bytes_rate), fmt(ratio(p32, seconds), 2), fmt(ratio(p16, seconds), 2)])
            if dec["batch"] == 1:
                target(f"decode B=1 {storage} cache d={dec['d']} L={dec['cached_tokens']} >= fraction of copy bandwidth",
                       of_copy, DECODE_OF_COPY)
    core16_best = None
    for path in args.forced:
        a = load(path).get("attention", {})
        if a.get("state") != "ran":
            continue
        forced = a.get("config_source") == "profile_device_default"
        head = (f"{a['mask']} forward, B·H = {a['batch'] * a['heads']}, T = {a['t']}, d = {a['d']}, "
                f"{'forced' if forced else 'NOT the forced configuration, the library passed over it:'} "
                f"`{a.get('config')}`")
        tflops = a["flops"] / a["seconds"] / 1e12
        if param(a.get("config"), "variant") in (3, 4):
            prob = forward_peers.get((a["d"], a["t"], a["mask"], a["batch"] * a["heads"]))
            p32, p16 = peer_seconds(prob, "float32"), peer_seconds(prob, "bfloat16")
            rows.append([head + " (half storage)", "TFLOP/s", fmt(tflops),
                         fmt(tflops / args.tensor_peak_tflops, 2) + " of 16-bit tensor peak",
                         fmt(model_mma(a.get("config")), 2), peer_cell(prob, "float32", flops_rate),
                         peer_cell(prob, "bfloat16", flops_rate), fmt(ratio(p32, a["seconds"]), 2),
                         fmt(ratio(p16, a["seconds"]), 2)])
            if forced and a["d"] == 64 and (core16_best is None or a["seconds"] < core16_best["seconds"]):
                core16_best = a
            continue
        of_peak = a["flops"] / a["seconds"] / 1e9 / peak if peak else None
        rows.append([head, "TFLOP/s", fmt(tflops), fmt(of_peak, 2) + " of peak FMA",
                     fmt(model_forward(a.get("config"), a["d"]), 2), "-", "-", "-", "-"])
    a16 = None
    if args.core16 and os.path.exists(args.core16):
        a16 = load(args.core16).get("attention", {})
    elif core16_best is not None:
        a16 = core16_best
    if a16 is not None:
        base = f32_forward.get((a16.get("d"), a16.get("t"), a16.get("mask")))
        sp = ratio(base, a16.get("seconds")) if a16.get("state") == "ran" else None
        target(f"16-bit attention core d={a16.get('d')} >= times the fp32 forward's speed", sp, CORE16_OVER_F32, "x")
    else:
        targets.append("target 16-bit matrix-engine path >= 2x the fp32 forward: not measured (no --core16 report and "
                       "no forced tensor-core run at d = 64 ran)")

    head = ["problem (iha: `iha bench --json`)", "unit", "iha", "iha of ceiling", "model (doc/performance.md)", "PyTorch SDPA fp32",
            "PyTorch SDPA bf16", "iha / PyTorch fp32 (speed)", "iha / PyTorch bf16 (speed)"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    first = load(args.iha_json[0])
    lines.append("")
    lines.append(f"iha {first.get('iha_version')} on {first.get('device')}; ceilings from {os.path.basename(args.ceilings)}: "
                 f"peak FMA {fmt(peak / 1e3 if peak else None)} TFLOP/s, copy {fmt(copy / 1e9 if copy else None)} GB/s.")
    if peers:
        lines.append(f"PyTorch {peers['torch_version']} (CUDA {peers['cuda_version']}) on {peers['device_name']}, "
                     f"{peers['timer']}, median of {peers['reps']} after {peers['warmup']} warm-up calls, TF32 off; "
                     f"torch's copy {fmt(peers['copy_bytes_per_second'] / 1e9)} GB/s.")
    else:
        lines.append("No PyTorch figures: the peer run failed or did not run (peers.txt says why).")
    failed = [f"{p['kind']} {p['iha_json']} {d}: {r['note']}" for p in (peers or {}).get("problems", [])
              for d, r in p["results"].items() if r.get("state") != "ran"]
    lines += [f"failed: {f}" for f in failed]
    with open(args.table, "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(args.targets, "w") as f:
        f.write("\n".join(targets) + "\n")


if __name__ == "__main__":
    main()
