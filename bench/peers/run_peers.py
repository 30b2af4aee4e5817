"""run_peers.py - iha and its peers on the same problems in one run (bench/peers/README.md):
for each problem it runs `iha bench --json` for iha's time and FLOP count, then each peer on the
same shapes, checked against a float64 reference or iha's own output before it is timed, and
prints one Markdown table. Run it through run.sh, which sets up the environment."""

import argparse
import datetime
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import torch

import attention
import layer
from iha_tool import IhaTool
from timing import THREADS, Mismatch, check, median_seconds

HEADS, PSEUDO = 8, 4  # B*H = 8 with B = 1; P = 4 as in the demo layer
DEMO = {"n": 1024, "dim": 512, "d": 64}  # the demo layer: B=1 N=1024 D=512 H=8 d=64 P=4
CACHED_TOKENS = 4096
DECODE_REPS_FACTOR = 4

# Columns: the peers in the order the table shows them.
PEERS = ("PyTorch", "FlexAttention (compiled)", "OpenVINO")


class Row:
    """One problem: iha's value with the built-in configurations, with a tuned profile (None when
    not tuned), and each peer's, all in `unit` (GFLOP/s: higher is better; ms: lower is better);
    a peer's cell is a number or the reason it has none."""

    def __init__(self, problem, unit, iha_value):
        self.problem, self.unit, self.iha = problem, unit, iha_value
        self.iha_tuned = None
        self.cells = {name: "-" for name in PEERS}

    def best(self):
        numbers = {k: v for k, v in self.cells.items() if isinstance(v, float)}
        if not numbers:
            return None, None
        pick = max if self.unit == "GFLOP/s" else min
        name = pick(numbers, key=numbers.get)
        return name, numbers[name]

    def merge(self, other):
        """Keeps the better value of each cell from another round of the same problem: on a
        shared machine a neighbour only slows a round down, so the faster round is nearer to what
        the code can do; iha and every peer get the same number of rounds."""
        better = max if self.unit == "GFLOP/s" else min
        if other.iha is not None:
            self.iha = other.iha if self.iha is None else better(self.iha, other.iha)
        if other.iha_tuned is not None:
            self.iha_tuned = other.iha_tuned if self.iha_tuned is None else better(self.iha_tuned, other.iha_tuned)
        for name, value in other.cells.items():
            mine = self.cells[name]
            if isinstance(value, float):
                self.cells[name] = better(mine, value) if isinstance(mine, float) else value

    def speedup(self, value):
        """iha's speed (value: self.iha or self.iha_tuned) over the best peer's: above 1, iha is
        faster."""
        _, best = self.best()
        if best is None or value is None:
            return None
        return value / best if self.unit == "GFLOP/s" else best / value


def measure_peer(row, column, prepare, verify, reps, value_of, log, warmup=1):
    """Prepares a peer, runs it once and checks its output (a Mismatch is reported, never timed),
    then times it. Every failure becomes the cell's text: a peer that does not run here is
    reported as failed, not left out."""
    try:
        run = prepare()
        verify(run())
        seconds = median_seconds(run, reps, warmup)
        row.cells[column] = value_of(seconds)
        log(f"  {column}: {row.cells[column]:.4g} {row.unit}")
    except Mismatch as e:
        row.cells[column] = f"wrong ({e})"
        log(f"  {column}: {row.cells[column]}")
    except Exception as e:  # noqa: BLE001 - any failure of a peer is a result to report
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        row.cells[column] = f"failed ({type(e).__name__}: {first[:120]})"
        log(f"  {column}: {row.cells[column]}")


CORE_PROBLEMS = [  # (virtual tokens T, head width d, window in virtual keys, unit)
    (8192, 64, 0, "GFLOP/s"),
    (4096, 128, 0, "GFLOP/s"),
    (8192, 128, 0, "GFLOP/s"),
    (4096, 64, 128, "ms"),
]

# The layer shapes (B, N, D, H, d, P) `iha tune` tunes for the tuned column: the demo layer
# (its global and sliding-window layers hold the T = 4096 cores, the window's and the decoding
# step's buckets), and the longer and wider cores.
TUNE_SHAPES = [
    (1, DEMO["n"], DEMO["dim"], HEADS, DEMO["d"], PSEUDO),
    (1, 8192 // PSEUDO, DEMO["dim"], HEADS, 64, PSEUDO),
    (1, 4096 // PSEUDO, HEADS * 128, HEADS, 128, PSEUDO),
    (1, 8192 // PSEUDO, HEADS * 128, HEADS, 128, PSEUDO),
]


def core_value(iha, t, d, window_keys, unit, reps, what):
    """iha's rate (GFLOP/s) or time (ms) on one core problem, its FLOP count checked."""
    report = iha.core(HEADS, t // PSEUDO, PSEUDO, d, window_keys // PSEUDO, reps)
    flops = report["attention"]["flops"]
    expected = 4 * HEADS * d * attention.visible_pairs(t, window_keys)
    if flops != expected:
        raise SystemExit(f"iha bench counts {flops} FLOPs for {what}, the peers {expected}")
    seconds = report["attention"]["seconds"]
    return flops / seconds * 1e-9 if unit == "GFLOP/s" else seconds * 1e3


def core_what(t, d, window_keys):
    return f"causal core, T = {t}, d = {d}" if window_keys == 0 else (
        f"sliding-window core, T = {t}, d = {d}, {window_keys} virtual keys")


def core_rows(iha, reps, log, flex, openvino):
    rows = []
    for t, d, window_keys, unit in CORE_PROBLEMS:
        what = core_what(t, d, window_keys)
        log(what)

        def value_of(s):
            return HEADS * 4 * d * attention.visible_pairs(t, window_keys) / s * 1e-9 if unit == "GFLOP/s" else s * 1e3

        row = Row(what, unit, core_value(iha, t, d, window_keys, unit, reps, what))
        log(f"  iha: {row.iha:.4g} {unit}")
        q, k, v = attention.inputs(HEADS, t, d, seed=t + d + window_keys)
        rows_checked = attention.check_rows(t, window_keys)
        ref = attention.reference_rows(q, k, v, window_keys, rows_checked)

        def verify(out, name):
            check(f"{name}, {what}", out[:, :, rows_checked], ref)

        peers = [("PyTorch", lambda: attention.TorchSdpa())]
        if flex:
            peers.append(("FlexAttention (compiled)", attention.FlexAttention))
        else:
            row.cells["FlexAttention (compiled)"] = "skipped (--no-flex)"
        if openvino:
            peers.append(("OpenVINO", lambda: attention.OpenVinoSdpa(THREADS)))
        else:
            row.cells["OpenVINO"] = "skipped (--no-openvino)"
        for column, make in peers:
            measure_peer(row, column, lambda m=make: m().prepare(q, k, v, window_keys),
                         lambda out, c=column: verify(out, c), reps, value_of, log)
        rows.append(row)
    return rows


def layer_values(iha, reps):
    """iha's demo layer forward and forward + backward (the saved pair), in ms."""
    report = iha.layer(HEADS, DEMO["n"], DEMO["dim"], PSEUDO, DEMO["d"], reps)["layer"]
    saved = report["backward"]["saved_pair"]
    return report["seconds"] * 1e3, (saved["forward_save_seconds"] + saved["backward_saved_seconds"]) * 1e3


def decode_values(iha, reps):
    """iha's decoding step against CACHED_TOKENS cached tokens of the demo layer, in ms, on the
    pseudo-token cache and on the compact cache, measured in one run."""
    report = iha.decode(HEADS, DEMO["dim"], PSEUDO, DEMO["d"], CACHED_TOKENS, reps * DECODE_REPS_FACTOR)["decode"]
    return report["step_seconds"] * 1e3, report["compact"]["step_seconds"] * 1e3


def iha_values(iha, reps, log):
    """iha's value for every row, in the table's order (core_rows, layer_rows, decode_rows)."""
    values = []
    for t, d, window_keys, unit in CORE_PROBLEMS:
        values.append(core_value(iha, t, d, window_keys, unit, reps, core_what(t, d, window_keys)))
    values.extend(layer_values(iha, reps))
    values.extend(decode_values(iha, reps))
    log("  iha tuned: " + ", ".join(f"{v:.4g}" for v in values))
    return values


def layer_rows(iha, reps, log, openvino):
    """The demo layer, forward and forward plus backward, against iha's saved pair."""
    log("demo layer")
    n, dim, d = DEMO["n"], DEMO["dim"], DEMO["d"]
    forward_ms, training_ms = layer_values(iha, reps)
    forward = Row(f"demo layer forward (B=1 N={n} D={dim} H={HEADS} d={d} P={PSEUDO})", "ms", forward_ms)
    training = Row("demo layer forward + backward (iha: the saved pair)", "ms", training_ms)
    log(f"  iha: forward {forward.iha:.4g} ms, forward + backward {training.iha:.4g} ms")

    x, w = layer.random_layer(1, n, dim, HEADS, d, PSEUDO, seed=5)
    dz = torch.randn(1, n, dim, generator=torch.Generator().manual_seed(6))
    with tempfile.TemporaryDirectory() as tmp:
        layer.save_npy_layer(tmp, x, w)
        iha_z = iha.forward(tmp)
    x64, w64 = x.double(), {k: v.double() for k, v in w.items()}
    with torch.no_grad():
        z64 = layer.forward(x64, w64, HEADS, d)
    check("iha forward on the demo layer", iha_z, z64.numpy())

    def verify_forward(z):
        check("PyTorch layer forward", z, z64.numpy())
        check("PyTorch layer forward against iha forward", z, iha_z)

    def run_forward():
        with torch.inference_mode():
            return layer.forward(x, w, HEADS, d)

    grads64 = layer.gradients(x64, w64, dz.double(), HEADS, d)

    def verify_backward(grads):
        for name, g, g64 in zip(("dx",) + tuple("d" + k for k in layer.WEIGHT_NAMES), grads, grads64):
            check(f"PyTorch layer backward, {name}", g, g64.numpy())

    measure_peer(forward, "PyTorch", lambda: run_forward, verify_forward, reps, lambda s: s * 1e3, log)
    if openvino:
        measure_peer(forward, "OpenVINO", lambda: layer.openvino_forward(x, w, HEADS, d, THREADS), verify_forward,
                     reps, lambda s: s * 1e3, log)
    else:
        forward.cells["OpenVINO"] = "skipped (--no-openvino)"
    measure_peer(training, "PyTorch", lambda: lambda: layer.gradients(x, w, dz, HEADS, d), verify_backward,
                 reps, lambda s: s * 1e3, log)
    return [forward, training]


def decode_rows(iha, reps, log):
    """One generated token per sequence against CACHED_TOKENS cached tokens of the demo layer,
    iha on its pseudo-token cache and on its compact cache (1/P of the bytes), against the
    PyTorch layer's step on its cache of pseudo-tokens. A step takes milliseconds, so both sides
    take DECODE_REPS_FACTOR times the repeats."""
    log("decoding step")
    dim, d = DEMO["dim"], DEMO["d"]
    pseudo_ms, compact_ms = decode_values(iha, reps)
    row = Row(f"decoding step, {CACHED_TOKENS} cached tokens (demo layer)", "ms", pseudo_ms)
    compact = Row(f"decoding step, {CACHED_TOKENS} cached tokens, iha's compact cache (demo layer)", "ms", compact_ms)
    reps *= DECODE_REPS_FACTOR
    log(f"  iha: {row.iha:.4g} ms, compact cache {compact.iha:.4g} ms")

    # The step must give the last row of a full forward pass over the same tokens.
    xs, ws = layer.random_layer(1, 65, dim, HEADS, d, PSEUDO, seed=7)
    with torch.no_grad():
        z_full = layer.forward(xs, ws, HEADS, d)[:, -1:]
        small = layer.DecodeState(*layer.cache_of(xs[:, :64], ws, HEADS, d), t_max=65 * PSEUDO)
    check_target = z_full.numpy()

    x, w = layer.random_layer(1, CACHED_TOKENS + 1, dim, HEADS, d, PSEUDO, seed=8)
    with torch.no_grad():
        state = layer.DecodeState(*layer.cache_of(x[:, :CACHED_TOKENS], w, HEADS, d),
                                  t_max=(CACHED_TOKENS + 1) * PSEUDO)
    x_new = x[:, CACHED_TOKENS:]

    def run():
        with torch.inference_mode():
            state.rewind(CACHED_TOKENS * PSEUDO)
            return layer.decode_step(state, x_new, w, HEADS, d)

    def verify(_):
        with torch.inference_mode():
            check("PyTorch decoding step against its full forward", layer.decode_step(small, xs[:, 64:], ws, HEADS, d),
                  check_target)

    measure_peer(row, "PyTorch", lambda: run, verify, reps, lambda s: s * 1e3, log, warmup=3)
    compact.cells["PyTorch"] = row.cells["PyTorch"]
    return [row, compact]


SGEMM_N = 2048  # the host's SGEMM ceiling: one n x n x n product in float32


def blas_name():
    """NumPy's BLAS as its build reports it ("scipy-openblas 0.3.31.188.0")."""
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{blas.get('name', '?')} {blas.get('version', '')}".strip()
    except Exception:  # noqa: BLE001 - an older NumPy without mode="dicts": the name is only a label
        return "its BLAS"


def sgemm_ceilings(reps, log):
    """The host's SGEMM in GFLOP/s through the BLAS libraries PyPI brings, which know the CPU:
    PyTorch's (MKL where torch.backends.mkl says so) and NumPy's (OpenBLAS). The core's
    roofline ceiling: attention is two products per key block, so a fused kernel near their
    rate is as fast as its arithmetic allows. Debian's OpenBLAS, which `iha bench` opens, may not
    know the CPU (doc/benchmarking.md)."""
    n = SGEMM_N
    gen = torch.Generator().manual_seed(11)
    a, b = torch.randn(n, n, generator=gen), torch.randn(n, n, generator=gen)
    an, bn = a.numpy(), b.numpy()
    torch_blas = "MKL" if torch.backends.mkl.is_available() else "its BLAS"
    out = {}
    for name, fn in ((f"PyTorch torch.matmul ({torch_blas})", lambda: torch.matmul(a, b)),
                     (f"NumPy matmul ({blas_name()})", lambda: an @ bn)):
        out[name] = 2.0 * n ** 3 / median_seconds(fn, reps, warmup=2) * 1e-9
        log(f"  SGEMM {n}: {name} {out[name]:.4g} GFLOP/s")
    return out


def sh(*cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def machine_line(iha):
    model = re.search(r"Model name:\s*(.+)", sh("lscpu"))
    pocl = re.search(r"PoCL [^ ,]+", iha.devices())
    return (f"{model.group(1).strip() if model else 'unknown CPU'}, {os.cpu_count()} cores online, "
            f"{pocl.group(0) if pocl else 'PoCL: not found'}")


def commit_line(repo):
    head = sh("git", "-C", repo, "rev-parse", "--short", "HEAD") or "unknown"
    dirty = sh("git", "-C", repo, "status", "--porcelain", "--untracked-files=no")
    return head + (" (working tree differs from it)" if dirty else "")


def fmt(value, unit):
    if not isinstance(value, float):
        return value
    return f"{value:.1f}" if unit == "GFLOP/s" or value >= 10 else f"{value:.2f}"


def ratio_text(ratio):
    return f"{ratio:.2f}" if ratio is not None else "-"


def ceilings_table(rows, sgemm):
    """The SGEMM ceilings and each core rate's fraction of them (built-in, and tuned where run)."""
    out = ["", f"SGEMM {SGEMM_N}³ on the host, {THREADS} threads, the better of the rounds:", "",
           "| SGEMM | GFLOP/s |", "| --- | --- |"]
    out += [f"| {name} | {value:.1f} |" for name, value in sgemm.items()]
    best_name = max(sgemm, key=sgemm.get)
    mkl = next((name for name in sgemm if "MKL" in name), None)
    out += ["", "| core (GFLOP/s rows) | iha / best SGEMM (" + best_name + ") |"
            + (" iha / MKL's SGEMM |" if mkl and mkl != best_name else ""),
            "| --- | --- |" + (" --- |" if mkl and mkl != best_name else "")]
    for r in rows:
        if r.unit != "GFLOP/s":
            continue
        def frac(ceiling):
            text = f"{r.iha / ceiling:.2f}"
            return text + (f" (tuned {r.iha_tuned / ceiling:.2f})" if r.iha_tuned is not None else "")
        out.append(f"| {r.problem} | {frac(sgemm[best_name])} |"
                   + (f" {frac(sgemm[mkl])} |" if mkl and mkl != best_name else ""))
    return "\n".join(out) + "\n"


def table(rows, header, tuned):
    """The table; with `tuned`, iha's tuned column and its ratio beside the built-in's."""
    out = list(header)
    out.append("")
    iha_columns = "iha built-in | iha tuned" if tuned else "iha built-in"
    ratio_columns = "built-in / best | tuned / best" if tuned else "iha / best"
    columns = ["problem (B·H = 8)", "unit", iha_columns, *PEERS, "best peer", ratio_columns]
    out.append("| " + " | ".join(columns) + " |")
    out.append("|" + " --- |" * (len(PEERS) + 5 + (2 if tuned else 0)))
    for r in rows:
        name, best = r.best()
        cells = [fmt(r.iha, r.unit)] + ([fmt(r.iha_tuned, r.unit) if r.iha_tuned is not None else "-"] if tuned else [])
        ratios = [ratio_text(r.speedup(r.iha))] + ([ratio_text(r.speedup(r.iha_tuned))] if tuned else [])
        out.append(f"| {r.problem} | {r.unit} | " + " | ".join(cells) + " | "
                   + " | ".join(fmt(r.cells[p], r.unit) for p in PEERS)
                   + f" | {name + ' ' + fmt(best, r.unit) if name else '-'} | " + " | ".join(ratios) + " |")
    out.append("")
    out.append("iha built-in runs with the tuning profile off (IHA_PROFILE=off): the configurations a user gets "
               "without tuning. " + ("iha tuned runs on a profile that `iha tune --budget-s "
                                    f"{tuned}` filled in this run for each of the layer shapes "
                                    + ", ".join(",".join(str(x) for x in s) for s in TUNE_SHAPES)
                                    + " (B,N,D,H,d,P; global and sliding-window layers). " if tuned else ""))
    out.append("iha / best (built-in / best, tuned / best) is iha's speed over the best peer's (above 1: iha is "
               "faster): the ratio of the rates "
               "for GFLOP/s, of the peer's time to iha's for ms. GFLOP/s count the visible pairs only, 4·d FLOPs "
               "each (doc/spec.md's cost model), the same count for every column. PyTorch is "
               "scaled_dot_product_attention for the cores (a dense boolean mask for the window) and the layer "
               "written the paper's way (einsum mixing, SDPA over the interleaved sequence, einsum collapse; "
               "autograd for the backward; SDPA against a preallocated cache for the decoding step); OpenVINO is its "
               "ScaledDotProductAttention op for the cores and the PyTorch layer converted by openvino.convert_model "
               "for the layer. iha's "
               "forward + backward is iha_forward_save then iha_backward_saved. Each cell is the median of the "
               "repeats after a warm-up, in the better of the rounds; \"-\" means the peer has no such operation.")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--iha", required=True, help="the iha command-line tool")
    ap.add_argument("--repo", required=True, help="the repository, for the commit")
    ap.add_argument("--out", required=True, help="where to write the table")
    ap.add_argument("--reps", type=int, default=5, help="timed repeats after the warm-up (default 5)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds over every problem; each cell keeps its best round's median (default 3)")
    ap.add_argument("--no-flex", action="store_true", help="skip FlexAttention (its compiles take minutes)")
    ap.add_argument("--no-openvino", action="store_true", help="skip OpenVINO")
    ap.add_argument("--tune-budget", type=float, default=0,
                    help="seconds of `iha tune` per shape of TUNE_SHAPES into a fresh profile, then a tuned column "
                         "beside the built-in one (default 0: the built-in only)")
    args = ap.parse_args()

    torch.set_num_threads(THREADS)
    iha = IhaTool(args.iha)
    tuned_dir = tempfile.TemporaryDirectory() if args.tune_budget > 0 else None
    tuned_iha = iha.with_profile(os.path.join(tuned_dir.name, "profile.json")) if tuned_dir else None

    def log(line):
        print(line, file=sys.stderr, flush=True)

    start = datetime.datetime.now(datetime.timezone.utc)
    load_start = sh("uptime")
    if tuned_iha:
        for shape in TUNE_SHAPES:
            log(f"iha tune {','.join(str(x) for x in shape)} ({args.tune_budget:g} s)")
            tuned_iha.tune(shape, args.tune_budget)
    rows = None
    sgemm = {}
    for r in range(args.rounds):
        log(f"round {r + 1} of {args.rounds}")
        for name, value in sgemm_ceilings(args.reps, log).items():
            sgemm[name] = max(value, sgemm.get(name, 0.0))
        this = core_rows(iha, args.reps, log, not args.no_flex, not args.no_openvino)
        this += layer_rows(iha, args.reps, log, not args.no_openvino)
        this.extend(decode_rows(iha, args.reps, log))
        if tuned_iha:
            for row, value in zip(this, iha_values(tuned_iha, args.reps, log)):
                row.iha_tuned = value
        if rows is None:
            rows = this
        else:
            for mine, other in zip(rows, this):
                mine.merge(other)
    load_end = sh("uptime")
    try:
        import openvino
        openvino_version = openvino.__version__
    except ImportError:
        openvino_version = "not installed"

    header = [
        f"Peers side by side, {start:%Y-%m-%d %H:%M} UTC, commit {commit_line(args.repo)}",
        "",
        f"- machine: {machine_line(iha)}; {THREADS} threads for every peer",
        f"- versions: iha {iha.version()}, PyTorch {torch.__version__}, OpenVINO {openvino_version}, "
        f"NumPy {np.__version__}",
        f"- load (uptime): before `{load_start}`; after `{load_end}`",
        f"- command: `bench/peers/run.sh --reps {args.reps} --rounds {args.rounds}"
        f"{' --no-flex' if args.no_flex else ''}{' --no-openvino' if args.no_openvino else ''}"
        f"{f' --tune-budget {args.tune_budget:g}' if tuned_iha else ''}` (medians of "
        f"{args.reps} after a warm-up, {args.reps * DECODE_REPS_FACTOR} for the decoding step; the better of "
        f"{args.rounds} rounds)",
    ]
    text = table(rows, header, f"{args.tune_budget:g}" if tuned_iha else None) + ceilings_table(rows, sgemm)
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, args.out)
    print(text)
    log(f"table written to {args.out}")


if __name__ == "__main__":
    main()
