#!/bin/sh
# run.sh - iha and its peers (PyTorch, FlexAttention, OpenVINO) on the same problems in one run;
# prints one Markdown table and writes it to bench/peers/.work/peers-<UTC time>.md (or --out).
# Needs setup.sh's environment and a built iha (IHA=path, else build/tools/iha).
#   bench/peers/run.sh [--reps R] [--rounds N] [--out FILE] [--no-flex] [--no-openvino] [--tune-budget S]
# --tune-budget S adds iha's tuned column: `iha tune --budget-s S` on each of run_peers.py's
# TUNE_SHAPES into a fresh profile, beside the built-in column (always with the profile off).
# OpenBLAS variables that force an older core (OPENBLAS_CORETYPE) or a cache size are unset for
# this command alone: they would slow NumPy's OpenBLAS, not measure the machine.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
python="$here/.work/venv/bin/python"
iha=${IHA:-$repo/build/tools/iha}
if [ ! -x "$python" ]; then
    echo "run.sh: no environment at $here/.work/venv: run bench/peers/setup.sh first" >&2
    exit 2
fi
if [ ! -x "$iha" ]; then
    echo "run.sh: no iha tool at $iha: build it (cmake -S . -B build && cmake --build build) or set IHA" >&2
    exit 2
fi
out="$here/.work/peers-$(date -u +%Y%m%d-%H%M%S).md"
for arg in "$@"; do
    case "$arg" in --out|--out=*) out= ;; esac
done
if [ -n "$out" ]; then
    set -- --out "$out" "$@"
fi
exec env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$python" "$here/run_peers.py" --iha "$iha" --repo "$repo" "$@"
