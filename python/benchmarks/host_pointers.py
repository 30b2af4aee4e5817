"""Host pointers (the device works on the arrays' own memory) against copies (device buffers
filled from the arrays and read back), for the calls the Python API makes: iha.Layer.forward
and iha.torch.iha_layer forward plus backward, on one layer shape.

    python python/benchmarks/host_pointers.py --shape 1,1024,512,8,64,4 --reps 7

The two modes run alternately after one untimed call each, and the medians are printed; the
difference is what moving the tensors costs on the device.
"""

import argparse
import statistics
import time

import iha
import iha.torch
import numpy as np
import torch


def seconds(function):
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="1,1024,512,8,64,4", help="B,N,D,H,d,P")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--device", default=None)
    args = parser.parse_args()
    B, N, D, H, d, P = (int(v) for v in args.shape.split(","))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((B, N, D), dtype=np.float32)
    weights = [rng.standard_normal(s, dtype=np.float32) * s[0] ** -0.5
               for s in [(D, H * d)] * 3 + [(H * d, D)] + [(H, H, P)] * 4]
    contexts = {mode: iha.Context(args.device, host_pointers=mode) for mode in (True, False)}
    print(f"device: {contexts[True].device_name}, unified memory: {contexts[True].unified_memory}, shape {args.shape}")
    params = [torch.from_numpy(w).requires_grad_() for w in weights]
    tx = torch.from_numpy(x).requires_grad_()

    def train_step(ctx):
        z = iha.torch.iha_layer(tx, *params, context=ctx)
        z.backward(torch.ones_like(z))

    def forward(ctx):
        layer = iha.Layer(*weights, context=ctx)
        return lambda: layer(x)

    results = {}
    for name, make in (("Layer.forward", forward),
                       ("iha_layer forward+backward", lambda ctx: lambda: train_step(ctx))):
        calls = {mode: make(ctx) for mode, ctx in contexts.items()}
        for call in calls.values():
            call()  # builds the programs and grows the workspace
        samples = {True: [], False: []}
        for _ in range(args.reps):
            for mode in (True, False):
                samples[mode].append(seconds(calls[mode]))
        results[name] = {mode: statistics.median(s) for mode, s in samples.items()}
    for name, medians in results.items():
        print(f"{name}: host pointers {medians[True] * 1e3:.1f} ms, copies {medians[False] * 1e3:.1f} ms "
              f"(median of {args.reps})")


if __name__ == "__main__":
    main()
