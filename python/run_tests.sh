#!/usr/bin/env bash
# Runs the Python suite: makes one virtual environment for every clone and build folder
# (IHA_PYTHON_VENV, else ~/.cache/iha-python-venv: beside the library's program cache
# ~/.cache/iha, not in it), installs PyTorch, NumPy and pytest into it when they are missing,
# installs ./python (which builds libiha.so.0 into the package, or holds IHA_PREBUILT_LIBRARY),
# and runs pytest on python/tests.
# Extra arguments go to pytest; --prepare alone makes the environment and stops (bootstrap.sh
# test runs that while ctest runs, so that PyTorch downloads in the meantime, then this after
# ctest).
# PyPI's torch for Linux x86-64 is the CUDA build, whose libraries need their nvidia-* wheels
# even on a CPU (libtorch.so links libcufile, libcusparseLt, libnvshmem_host), so the
# environment holds about 5 GB: it is made once and kept outside the build folder.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${IHA_PYTHON_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/iha-python-venv}
# A venv whose interpreter is gone (Python upgraded or removed) is made again.
"$venv/bin/python" -c "" 2> /dev/null || "${PYTHON:-python3}" -m venv --clear "$venv"
if ! "$venv/bin/python" -c "import torch, numpy, pytest" 2> /dev/null; then
  # --no-compile: Python compiles the modules the suite imports, not all of PyTorch's.
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-compile torch numpy pytest
fi
[ "${1:-}" != --prepare ] || exit 0
# IHA_PREBUILT_LIBRARY (python/CMakeLists.txt): the package holds that library instead of one
# of its own build. Passed empty too, so that python/build/'s cache does not keep an earlier one.
"$venv/bin/python" -m pip install -q --disable-pip-version-check \
  -C "cmake.define.IHA_PREBUILT_LIBRARY=${IHA_PREBUILT_LIBRARY:-}" "$root/python"
cd "$root/python"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider tests "$@"
