#!/bin/sh
# setup.sh - creates the peer runner's virtual environment (PyTorch, OpenVINO, NumPy from PyPI)
# in bench/peers/.work/venv (git ignores bench/peers/.work/, which also takes run.sh's tables).
# Run it once; run.sh uses it. Arguments pin versions instead of taking the newest, e.g.
# `bench/peers/setup.sh torch==2.15.0 openvino==2026.4.1`.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
venv="$here/.work/venv"
if [ ! -x "$venv/bin/python" ]; then
    mkdir -p "$here/.work"
    python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --upgrade pip >/dev/null
if [ "$#" -gt 0 ]; then
    "$venv/bin/python" -m pip install "$@" numpy
else
    "$venv/bin/python" -m pip install torch openvino numpy
fi
"$venv/bin/python" - <<'PY'
import numpy, openvino, torch
print("peers venv: torch", torch.__version__, "openvino", openvino.__version__, "numpy", numpy.__version__)
PY
