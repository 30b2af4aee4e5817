"""iha_tool.py - iha's side of the peer run, through the `iha` command: `iha bench --json` for
times and FLOP counts (doc/benchmarking.md lists its keys), `iha forward` for a layer's output,
`iha tune` for a tuned profile. Every command runs with one tuning profile (IHA_PROFILE): "off"
for the built-in configurations a newcomer gets, or a file that `tune` fills."""

import json
import os
import subprocess
import tempfile

import numpy as np

# Only the section a row needs: the ceilings, the unfused baseline and the cold start would
# take minutes and are no part of the comparison.
QUIET = ("--no-ceilings", "--no-baseline", "--no-cold-start")


class IhaTool:
    def __init__(self, path, profile="off"):
        self.path = path
        self.profile = profile
        self._version = None

    def with_profile(self, profile):
        """The same tool on another tuning profile."""
        return IhaTool(self.path, profile)

    def _run(self, *args):
        env = dict(os.environ, IHA_PROFILE=self.profile)
        done = subprocess.run([self.path, *args], capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise RuntimeError(f"{self.path} {' '.join(args)} exited with {done.returncode}:\n{done.stderr}")
        return done.stdout

    def bench(self, *args):
        report = json.loads(self._run("bench", *args, "--json"))
        self._version = report.get("iha_version")
        return report

    def core(self, heads, n, p, d, window, reps):
        """The attention core, B = 1: iha_attention over T = n*p virtual tokens."""
        return self.bench("--batch", "1", "--heads", str(heads), "--n", str(n), "--p", str(p), "--d", str(d),
                          "--window", str(window), "--reps", str(reps), "--no-layer", *QUIET)

    def layer(self, heads, n, dim, p, d, reps):
        """The whole layer's forward and, with --backward, its saved pair; the core is made
        small (--n 64), as only the layer's figures are used."""
        return self.bench("--batch", "1", "--heads", str(heads), "--n", "64", "--p", str(p), "--d", str(d),
                          "--layer-n", str(n), "--model-dim", str(dim), "--backward", "--reps", str(reps), *QUIET)

    def decode(self, heads, dim, p, d, cached, reps):
        """The decoding step on both cache layouts in one run: the pseudo-token cache, and the
        compact one (the heads' own keys and values) under `decode.compact`."""
        return self.bench("--decode", "--compact", "--batch", "1", "--heads", str(heads), "--p", str(p), "--d",
                          str(d), "--model-dim", str(dim), "--cache-tokens", str(cached), "--reps", str(reps),
                          "--no-ceilings")

    def forward(self, directory):
        """Z of the layer stored in directory (layer.save_npy_layer), through `iha forward`."""
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "z.npy")
            self._run("forward", "--in", directory, "--out", out)
            return np.load(out)

    def tune(self, shape, budget_s):
        """`iha tune` of a layer shape (B, N, D, H, d, P), global and sliding-window layers, every
        kernel, into this tool's profile."""
        return self._run("tune", "--shapes", ",".join(str(x) for x in shape), "--budget-s", str(budget_s))

    def devices(self):
        return self._run("devices")

    def version(self):
        return self._version or "unknown"
