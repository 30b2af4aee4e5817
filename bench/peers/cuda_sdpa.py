"""cuda_sdpa.py - PyTorch's scaled_dot_product_attention on the problems `iha bench --json` ran,
in float32 and bfloat16, on a CUDA device (or, to rehearse, the CPU), written as one JSON object.

    python cuda_sdpa.py --out peers.json [--device cuda|cpu] [--reps R] [--warmup W] IHA_JSON...

Each IHA_JSON is one `iha bench --json` report (doc/benchmarking.md lists its keys); its problem
is read from it, so both sides run the same shapes:
  - `attention` ran: the core's forward, [B, H, T, d], causal over the virtual sequence
    (is_causal) or global without a mask ("none"); FLOPs 4*d per visible pair;
  - `backward` ran too: the gradients of that forward (dq, dk, dv from one saved forward),
    10*d FLOPs per visible pair, doc/spec.md's cost model;
  - `decode` ran: one decoding step's attention, the new token's P pseudo-queries against a
    cache of (L + 1)*P keys and values (bottom-right causal: pseudo-query p of the new token
    sees the cache and the new token's keys up to p), judged by the K and V bytes it reads.
Every result is checked before it is timed: the forward and the decoding step on some query
rows of the timed inputs against float64, the backward on a small problem of the same d, mask
and dtype against float64 autograd. Times are medians after warm-up: CUDA events on a GPU,
the wall clock on the CPU. TF32 stays off, so float32 means float32 arithmetic.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

# Relative L2 error against float64: float32 sums in another order than the reference; bfloat16
# rounds its inputs and output to 8 bits of mantissa (about 4e-3 relative each).
TOLERANCE = {"float32": 1e-4, "bfloat16": 3e-2}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def visible_pairs(t, mask):
    return t * (t + 1) // 2 if mask == "causal" else t * t


class Timer:
    """Median seconds of one call of fn after warm-up. A call shorter than about a millisecond is
    timed in groups, so that the timer's own resolution and launch gaps do not dominate."""

    def __init__(self, device, reps, warmup):
        self.cuda = device.type == "cuda"
        self.reps, self.warmup = reps, warmup

    def _group(self, fn, calls):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3 / calls
        begin = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - begin) / calls

    def median(self, fn):
        for _ in range(self.warmup):
            fn()
        first = self._group(fn, 1)
        calls = max(1, min(1000, int(2e-3 / max(first, 1e-7))))
        return statistics.median(self._group(fn, calls) for _ in range(self.reps))


def rel_l2(out, ref):
    out, ref = out.double(), ref.double()
    if not torch.isfinite(out).all():
        return float("inf")
    return float(torch.linalg.norm(out - ref) / torch.linalg.norm(ref))


def reference_rows(q, k, v, rows, mask, offset=0):
    """float64 outputs of query rows `rows` ([B, H, len(rows), d]); query row r sits at virtual
    position r + offset, so that a decoding step's queries see the cache before them."""
    qd, kd, vd = (x.detach().double().cpu() for x in (q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1])
    out = []
    for r in rows:
        hi = r + offset + 1 if mask == "causal" else kd.shape[2]
        s = torch.einsum("bhc,bhuc->bhu", qd[:, :, r], kd[:, :, :hi]) * scale
        out.append(torch.einsum("bhu,bhuc->bhc", torch.softmax(s, dim=-1), vd[:, :, :hi]))
    return torch.stack(out, dim=2)


def check_rows(t):
    return sorted({0, 1, t // 3, t // 2, t - 2, t - 1} & set(range(t)))


def sdpa(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, is_causal=mask == "causal")


def random_qkv(shape, dtype, device, seed, grad=False):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g).to(device=device, dtype=dtype).requires_grad_(grad) for _ in range(3)]


def checked(name, err, dtype_name):
    if not err <= TOLERANCE[dtype_name]:
        raise ArithmeticError(f"{name}: relative L2 error {err:.3g} against float64 (at most {TOLERANCE[dtype_name]:g})")
    return err


def forward(problem, dtype_name, device, timer):
    b, h, t, d, mask = (problem[k] for k in ("batch", "heads", "t", "d", "mask"))
    q, k, v = random_qkv((b, h, t, d), DTYPES[dtype_name], device, 1)
    with torch.inference_mode():
        rows = check_rows(t)
        err = checked("forward", rel_l2(sdpa(q, k, v, mask)[:, :, rows].cpu(), reference_rows(q, k, v, rows, mask)),
                      dtype_name)
        seconds = timer.median(lambda: sdpa(q, k, v, mask))
    return {"seconds": seconds, "rel_l2": err}


def backward_check(d, mask, dtype_name, device):
    """dq, dk, dv of a small problem against float64 autograd on the same (rounded) inputs."""
    q, k, v = random_qkv((1, 2, 256, d), DTYPES[dtype_name], device, 2, grad=True)
    do = torch.randn(1, 2, 256, d, generator=torch.Generator().manual_seed(3)).to(device=device, dtype=q.dtype)
    grads = torch.autograd.grad(sdpa(q, k, v, mask), (q, k, v), do)
    ref_in = [x.detach().double().cpu().requires_grad_(True) for x in (q, k, v)]
    ref = torch.autograd.grad(sdpa(*ref_in, mask), ref_in, do.double().cpu())
    return max(checked("backward d" + n, rel_l2(g.cpu(), r), dtype_name) for n, g, r in zip("qkv", grads, ref))


def backward(problem, dtype_name, device, timer):
    b, h, t, d, mask = (problem[k] for k in ("batch", "heads", "t", "d", "mask"))
    err = backward_check(d, mask, dtype_name, device)
    q, k, v = random_qkv((b, h, t, d), DTYPES[dtype_name], device, 1, grad=True)
    o = sdpa(q, k, v, mask)
    do = torch.randn_like(o)
    seconds = timer.median(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True))
    return {"seconds": seconds, "rel_l2": err}


def decode(problem, dtype_name, device, timer):
    b, h, p, d, cached = (problem[k] for k in ("batch", "heads", "p", "d", "cached_tokens"))
    keys = (cached + 1) * p
    dtype = DTYPES[dtype_name]
    g = torch.Generator().manual_seed(4)
    q = torch.randn(b, h, p, d, generator=g).to(device=device, dtype=dtype)
    k, v = (torch.randn(b, h, keys, d, generator=g).to(device=device, dtype=dtype) for _ in range(2))
    # Pseudo-query i of the new token sees keys u <= cached*p + i: a boolean mask of the last p
    # keys' triangle (a dense [p, keys] mask is p*keys bytes, negligible beside the cache).
    allowed = torch.ones(p, keys, dtype=torch.bool, device=device)
    allowed[:, cached * p :] = torch.tril(torch.ones(p, p, dtype=torch.bool, device=device))
    if problem["mask"] != "causal":
        allowed[:] = True

    def step():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)

    with torch.inference_mode():
        rows = list(range(p))
        ref = reference_rows(q, k, v, rows, problem["mask"], offset=cached * p)
        err = checked("decode", rel_l2(step().cpu(), ref), dtype_name)
        seconds = timer.median(step)
    cache_bytes = 2 * b * h * keys * d * q.element_size()
    return {"seconds": seconds, "rel_l2": err, "cache_bytes_read": cache_bytes, "cache_bytes_per_second": cache_bytes / seconds}


def copy_bandwidth(device, timer):
    """Bytes read and written per second by a device-to-device copy of 256 MiB, as iha's copy
    ceiling counts them."""
    src = torch.empty(64 << 20, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    seconds = timer.median(lambda: dst.copy_(src))
    return 2 * src.numel() * 4 / seconds


def problems_of(path):
    """The problems of one `iha bench --json` report."""
    name = os.path.basename(path)
    try:
        with open(path) as f:
            report = json.load(f)
    except (OSError, ValueError) as e:
        print(f"cuda_sdpa: {name}: not an iha bench JSON report ({e}): skipped", file=sys.stderr)
        return []
    found = []
    a = report.get("attention", {})
    if a.get("state") == "ran":
        core = {k: a[k] for k in ("batch", "heads", "t", "d", "mask", "window")}
        if core["window"] or core["mask"] not in ("causal", "none"):
            print(f"cuda_sdpa: {name}: mask {core['mask']} window {core['window']}: no SDPA peer", file=sys.stderr)
        else:
            pairs = core["batch"] * core["heads"] * visible_pairs(core["t"], core["mask"])
            if 4 * core["d"] * pairs != a["flops"]:
                raise SystemExit(f"cuda_sdpa: {name}: iha counts {a['flops']} FLOPs, this script {4 * core['d'] * pairs}")
            found.append(dict(core, kind="forward", iha_json=name, flops=4 * core["d"] * pairs))
            if report.get("backward", {}).get("state") == "ran":
                found.append(dict(core, kind="backward", iha_json=name, flops=10 * core["d"] * pairs))
    dec = report.get("decode", {})
    if dec.get("state") == "ran" and not dec.get("window"):
        found.append(dict({k: dec[k] for k in ("batch", "heads", "p", "d", "mask", "cached_tokens")}, kind="decode",
                          iha_json=name, iha_cache_bf16=bool(dec.get("bf16")), iha_cache_half=bool(dec.get("half"))))
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("iha_json", nargs="+", help="`iha bench --json` reports whose problems to run")
    ap.add_argument("--out", required=True, help="the JSON file to write")
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu (to rehearse)")
    ap.add_argument("--reps", type=int, default=10, help="timed groups after warm-up; the median is kept")
    ap.add_argument("--warmup", type=int, default=3, help="untimed calls first")
    ap.add_argument("--threads", type=int, default=0, help="with --device cpu: torch's threads (default: torch's)")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    args = ap.parse_args()

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("cuda_sdpa: torch sees no CUDA device (use --device cpu to rehearse)")
    if device.type == "cpu" and args.threads:
        torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    timer = Timer(device, args.reps, args.warmup)
    runs = {"forward": forward, "backward": backward, "decode": decode}
    problems = [p for path in args.iha_json for p in problems_of(path)]
    for prob in problems:
        prob["results"] = {}
        for dtype_name in args.dtypes.split(","):
            label = f"{prob['kind']} {prob['iha_json']} {dtype_name}"
            begin = time.perf_counter()
            try:
                r = runs[prob["kind"]](prob, dtype_name, device, timer)
                r["state"] = "ran"
                if "flops" in prob:
                    r["tflops"] = prob["flops"] / r["seconds"] / 1e12
            except Exception as e:  # one failing peer must not lose the others' figures
                r = {"state": "failed", "note": f"{type(e).__name__}: {e}"[:500]}
            prob["results"][dtype_name] = r
            print(f"cuda_sdpa: {label}: {r.get('seconds', r.get('note'))} ({time.perf_counter() - begin:.1f} s)",
                  file=sys.stderr)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    report = {
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "threads": torch.get_num_threads(),
        "timer": "cuda_events" if device.type == "cuda" else "perf_counter",
        "tf32": False,
        "reps": args.reps,
        "warmup": args.warmup,
        "copy_bytes_per_second": copy_bandwidth(device, timer),
        "problems": problems,
    }
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1)
    os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
