#!/usr/bin/env bash
# Runs the Python suite: makes a virtual environment under the build folder (IHA_BUILD_DIR,
# else build/) once, installs PyTorch, NumPy and pytest into it, installs ./python (which
# builds libiha.so into the package), and runs pytest on python/tests. Extra arguments go to
# pytest. tools/scripts/bootstrap.sh test runs it after ctest.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${IHA_BUILD_DIR:-$root/build}
venv=$build/python-venv
[ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check torch numpy pytest
"$venv/bin/python" -m pip install -q --disable-pip-version-check "$root/python"
cd "$root/python"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider tests "$@"
