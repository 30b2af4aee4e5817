#!/usr/bin/env bash
# Installs the Debian 12 packages iha needs (only those missing), builds it, then runs the
# demo or the test suite. Usage: tools/scripts/bootstrap.sh demo|test|build|ci-deps
# ci-deps installs the packages and CI's own tools (.ci/run) and builds nothing.
# As root it installs directly; otherwise through sudo. CI and the README call it.
set -euo pipefail

mode=${1:-demo}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${IHA_BUILD_DIR:-$root/build}

# libopenblas-dev is optional and needed at run time only: "iha bench" opens OpenBLAS for the host's
# SGEMM ceiling. Without it, it may open Debian's untuned reference libblas, a meaningless ceiling. python3-venv: the
# test mode's Python suite makes a virtual environment (PyTorch, NumPy, pytest come from PyPI).
# The manual pages are made with awk and gzip, which every Debian system has.
packages=(build-essential cmake pkg-config ocl-icd-opencl-dev opencl-headers libclblast-dev pocl-opencl-icd
          libcmocka-dev libcjson-dev libopenblas-dev python3-venv)
# CI's reliability stages: the OpenCL simulator, Mesa's OpenCL drivers (rusticl on llvmpipe,
# a second implementation), clang with libFuzzer and the sanitizer runtimes (a recommendation
# of clang, so named here), llvm-symbolizer, shellcheck; for the package stage clang++ (in
# clang), dpkg-shlibdeps (dpkg-dev, with file) and lintian; Open MPI for libiha_mpi and its
# mpirun tests (doc/mpi.md); clang-15 and libclc-15 (its NVPTX built-ins) for the ptx stage.
[ "$mode" = ci-deps ] && packages+=(oclgrind mesa-opencl-icd clang libclang-rt-dev llvm shellcheck
                                   dpkg-dev file lintian libopenmpi-dev openmpi-bin clang-15 libclc-15)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  echo "bootstrap: installing ${missing[*]}"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
[ "$mode" = ci-deps ] && exit 0

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release
# The demo needs the iha command alone, not the test programs.
targets=()
[ "$mode" = demo ] && targets=(--target iha_cli)
cmake --build "$build" -j"$(nproc)" "${targets[@]}"

case "$mode" in
  demo)  exec "$build/tools/iha" demo ;;
  # Both suites run; the status is a failure if either fails. The full tier (ctest -L full,
  # doc/testing.md) and the MPI tests (ctest -L mpi, when Open MPI is installed) are CI's. Every test, the command-line ones and the Python suite included,
  # shares one program cache (unless the caller chose one), and PoCL compiles each kernel once,
  # not once per work-group size (tests/CMakeLists.txt says why). The Python suite's
  # environment (PyTorch's download, on a first run) is made while ctest runs.
  test)  status=0
         "$root/python/run_tests.sh" --prepare > "$build/python-prepare.log" 2>&1 &
         prepare=$!
         export IHA_CACHE_DIR="${IHA_CACHE_DIR:-$build/tests/cache/iha}"
         export POCL_CACHE_DIR="${POCL_CACHE_DIR:-$build/tests/cache/pocl}"
         export POCL_WORK_GROUP_SPECIALIZATION="${POCL_WORK_GROUP_SPECIALIZATION:-0}"
         ctest --test-dir "$build" --output-on-failure -j"$(nproc)" -LE 'full|mpi' || status=$?
         wait "$prepare" || cat "$build/python-prepare.log" >&2 # the suite's own run retries it
         # The package holds the library ctest has just tested (.ci/package.sh builds the wheel's own).
         IHA_PREBUILT_LIBRARY="$(cd "$build" && pwd)/libiha.so.0" "$root/python/run_tests.sh" || status=$?
         exit "$status" ;;
  build) ;;
  *) echo "usage: $0 demo|test|build|ci-deps" >&2; exit 2 ;;
esac
