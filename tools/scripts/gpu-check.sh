#!/usr/bin/env bash
# Checks iha on a machine with an NVIDIA GPU, in one prepared run (see the project's GPU.md):
#   1. when the build's libraries are missing there, unpacks the Debian packages brought along
#      in .deb/ into a private prefix (never over /, whose own libraries must stay intact) and
#      puts its library directories on LD_LIBRARY_PATH;
#   2. finds the driver's OpenCL library, libnvidia-opencl.so.1, under the driver's root
#      (default /usr/local/nvidia) or the system's library directories;
#   3. registers it with the ICD loader: nothing to do when a vendors file already names it;
#      else /etc/OpenCL/vendors/nvidia.icd when writable, else a private vendors directory
#      passed through OCL_ICD_VENDORS;
#   4. runs `iha devices`, the test suite with IHA_DEVICE=nvidia, `iha bench` with the
#      built-in tile sizes, `iha tune` with a short budget, `iha bench` again (table, JSON at
#      d=64 and d=128, the backward passes, a decoding step) and `iha soak`, each with a time
#      limit, each into a file of the output directory, and prints a short report (report.txt).
# Exit status: 0 all passed, 1 a step failed, 2 usage, 3 no NVIDIA OpenCL driver or platform.
#
#   tools/scripts/gpu-check.sh [--build DIR] [--out DIR] [--nvidia-root DIR] [--icd-dir DIR] [--device SPEC]
#                      [--tune-seconds S] [--bench-args "ARGS"] [--test-jobs N] [--test-seconds S]
#                      [--soak-seconds S] [--use-debs] [--no-tests] [--dry-run]
# --dry-run finds and registers the driver as above (use --icd-dir to keep /etc untouched) but
# only prints the iha commands it would run. --device (default nvidia) is the IHA_DEVICE the
# checks use and the name `iha devices` must show: with another driver standing in for
# NVIDIA's (say PoCL's library at <root>/lib64/libnvidia-opencl.so.1 and --device pocl), the
# whole script can be rehearsed on a machine without a GPU. --use-debs unpacks .deb/ even when
# the libraries are already there (to rehearse step 1). The test suite runs through ctest, whose
# files name the build directory by the absolute path it was configured in: on another machine,
# link that path to the build first (the caller's job; the report says when ctest finds nothing).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build="$root/build"
out=""
nvidia_root=/usr/local/nvidia
icd_dir=""
tune_seconds=60
device=nvidia
bench_args=""
test_jobs=$(nproc 2> /dev/null || echo 2)
test_seconds=900
soak_seconds=60
use_debs=0
run_tests=1
dry_run=0

usage() { grep -A1 '^#   tools/scripts/gpu-check.sh' "${BASH_SOURCE[0]}" | sed 's/^# *//' >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=${2:?}; shift 2 ;;
    --out) out=${2:?}; shift 2 ;;
    --nvidia-root) nvidia_root=${2:?}; shift 2 ;;
    --icd-dir) icd_dir=${2:?}; shift 2 ;;
    --device) device=${2:?}; shift 2 ;;
    --tune-seconds) tune_seconds=${2:?}; shift 2 ;;
    --bench-args) bench_args=${2?}; shift 2 ;;
    --test-jobs) test_jobs=${2:?}; shift 2 ;;
    --test-seconds) test_seconds=${2:?}; shift 2 ;;
    --soak-seconds) soak_seconds=${2:?}; shift 2 ;;
    --use-debs) use_debs=1; shift ;;
    --no-tests) run_tests=0; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) usage ;;
  esac
done
[ -d "$build" ] && build=$(cd "$build" && pwd)
[ -n "$out" ] || out="$build/gpu-check-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$out"
out=$(cd "$out" && pwd)
report="$out/report.txt"
: > "$report"
note() { echo "$*" | tee -a "$report"; }
failed=0

note "iha GPU check, $(date -u '+%Y-%m-%d %H:%M UTC') on $(hostname)"
command -v nvidia-smi > /dev/null &&
  note "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"

# ---- 1. Packages brought along ---------------------------------------------------------
iha="$build/tools/iha"
missing() { [ -x "$iha" ] && ldd "$iha" 2> /dev/null | grep 'not found' | awk '{print $1}' | tr '\n' ' '; }
if [ -d "$root/.deb" ] && { [ $use_debs -eq 1 ] || [ -n "$(missing)" ]; }; then
  prefix="$out/debroot"
  note "packages: missing [$(missing)], --use-debs $use_debs: unpacking $root/.deb/*.deb into $prefix"
  mkdir -p "$prefix"
  for f in "$root"/.deb/*.deb; do dpkg -x "$f" "$prefix"; done
  # The library directories, OpenBLAS's alternatives directory among them.
  libs=$(find "$prefix" -name '*.so*' -printf '%h\n' | sort -u | tr '\n' ':')
  export LD_LIBRARY_PATH="${libs%:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  [ -d "$prefix/usr/bin" ] && export PATH="$PATH:$prefix/usr/bin"
fi
if [ -n "$(missing)" ]; then note "packages: still missing: $(missing)"; fi

# ---- 2. The driver's OpenCL library -----------------------------------------------------
lib=""
for dir in "$nvidia_root/lib64" "$nvidia_root/lib" "$nvidia_root/lib/x86_64-linux-gnu" \
           /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib; do
  if [ -e "$dir/libnvidia-opencl.so.1" ]; then
    lib="$dir/libnvidia-opencl.so.1"
    break
  fi
done
if [ -z "$lib" ]; then
  lib=$(ldconfig -p | awk '/libnvidia-opencl\.so\.1/ {print $NF; exit}')
fi
if [ -z "$lib" ]; then
  note "driver: libnvidia-opencl.so.1 not found under $nvidia_root or the system's library directories:"
  note "        OpenCL is not possible on this machine (README device table: say so)"
  exit 3
fi
libdir=$(dirname "$lib")
note "driver: $lib"
# The driver's other libraries (libcuda, the PTX JIT) sit beside it.
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# ---- 3. Registration with the ICD loader --------------------------------------------------
system_icd=/etc/OpenCL/vendors
if [ -z "$icd_dir" ] && grep -qs libnvidia-opencl "$system_icd"/*.icd; then
  note "icd: already registered in $system_icd"
else
  if [ -z "$icd_dir" ]; then
    if mkdir -p "$system_icd" 2> /dev/null && [ -w "$system_icd" ]; then icd_dir=$system_icd; else icd_dir="$out/vendors"; fi
  fi
  mkdir -p "$icd_dir"
  # The full path: the driver's directory need not be on the loader's search path.
  echo "$lib" > "$icd_dir/nvidia.icd"
  note "icd: wrote $icd_dir/nvidia.icd"
  if [ "$icd_dir" != "$system_icd" ]; then
    export OCL_ICD_VENDORS="$icd_dir"
    note "icd: OCL_ICD_VENDORS=$icd_dir"
  fi
fi

# ---- 4. The checks -------------------------------------------------------------------------
if [ ! -x "$iha" ]; then
  note "build: $iha is missing: build first (cmake -S $root -B $build && cmake --build $build)"
  exit 1
fi
export IHA_DEVICE="$device" IHA_CACHE_DIR="$out/cache"

# step NAME SECONDS command...: output in $out/NAME.txt; failure noted, not fatal.
step() {
  local name=$1 limit=$2 t=$SECONDS rc=0
  shift 2
  if [ $dry_run -eq 1 ]; then
    note "$name: would run: timeout $limit $*"
    return 0
  fi
  timeout "$limit" "$@" > "$out/$name.txt" 2>&1 || rc=$?
  if [ $rc -eq 0 ]; then
    note "$name: ok ($((SECONDS - t)) s)"
  else
    failed=1
    note "$name: FAILED, exit $rc$([ $rc -eq 124 ] && echo ' (time limit)') after $((SECONDS - t)) s: $out/$name.txt"
  fi
  return $rc
}

step devices 60 "$iha" devices || exit 3
if [ $dry_run -eq 0 ]; then
  grep -qi "$device" "$out/devices.txt" || { note "devices: no device matching '$device' is visible"; exit 3; }
  note "devices: $(grep -i -m1 "$device" "$out/devices.txt" | sed 's/^ *//')"
fi

[ $dry_run -eq 1 ] || command -v clinfo > /dev/null && { clinfo > "$out/clinfo.txt" 2>&1 || true; }

if [ $run_tests -eq 1 ]; then
  if command -v ctest > /dev/null; then
    step tests "$test_seconds" ctest --test-dir "$build" --output-on-failure -j "$test_jobs" || true
    [ $dry_run -eq 1 ] || note "tests: $(grep -E 'tests passed|tests failed|No tests were found' "$out/tests.txt" | tail -1)"
    [ $dry_run -eq 1 ] || grep -E '^\s+[0-9]+ - ' "$out/tests.txt" | sed 's/^ */tests: failed /' | tee -a "$report" || true
  else # no CMake on the machine: the test executables one by one
    for t in "$build"/tests/test_* "$build"/tests/example*; do
      if [ -x "$t" ]; then step "$(basename "$t")" 300 "$t" || true; fi
    done
  fi
fi

# bench_summary FILE: the attention core's and the ceilings' figures from a --json run.
bench_summary() {
  [ $dry_run -eq 1 ] && return 0
  local py
  py=$(command -v python3 || true)
  if [ -n "$py" ] && [ -s "$1" ]; then
    "$py" - "$1" << 'PY' 2> /dev/null || grep -o '"gflops":[^,]*' "$1" | head -3
import json, sys
j = json.load(open(sys.argv[1]))
a = j["attention"]
f = {k[len("fraction_of_"):]: round(v, 3) for k, v in a.items() if k.startswith("fraction_of_") and v}
print("d=%s T=%s B*H=%s: %.4g s, %.1f GFLOP/s, %.3g GB/s; fractions %s" % (
    a["d"], a["t"], a["batch"] * a["heads"], a["seconds"], a["gflops"],
    a["bytes_per_second"] / 1e9, f))
PY
  fi
}

# Built-in tile sizes first, so that what tuning gains shows.
# shellcheck disable=SC2086 # --bench-args holds several options
step bench_builtin 300 "$iha" bench --json --no-cold-start --no-layer --no-baseline $bench_args || true
note "bench_builtin: $(bench_summary "$out/bench_builtin.txt")"
step tune $((tune_seconds + 300)) "$iha" tune --budget-s "$tune_seconds" || true
# shellcheck disable=SC2086
step bench 600 "$iha" bench $bench_args || true
[ $dry_run -eq 1 ] || grep -E '^  (copy kernel|CLBlast SGEMM 1024|peak FMA kernel|fused|layer \(wall\)|mixing \+|empty|warm)' \
  "$out/bench.txt" | head -20 |
  sed 's/^/bench: /' | tee -a "$report" || true
for d in 64 128; do
  # shellcheck disable=SC2086
  step "bench_d$d" 300 "$iha" bench --json --no-cold-start --d "$d" $bench_args || true
  note "bench_d$d: $(bench_summary "$out/bench_d$d.txt")"
done
# The backward passes (never yet run on a GPU): the attention step and the whole layer.
step bench_backward 300 "$iha" bench --backward --n 1024 --no-baseline --no-cold-start --no-ceilings || true
[ $dry_run -eq 1 ] || grep -E 'backward' "$out/bench_backward.txt" | grep -E 'ms|/ forward' | head -6 |
  sed 's/^/bench_backward: /' | tee -a "$report" || true
step bench_decode 300 "$iha" bench --decode || true
[ $dry_run -eq 1 ] || grep -E -i 'tokens/s|bandwidth' "$out/bench_decode.txt" | head -6 | sed 's/^/bench_decode: /' |
  tee -a "$report" || true
step soak $((soak_seconds + 60)) "$iha" soak --seconds "$soak_seconds" --warmup $((soak_seconds / 4)) || true
[ $dry_run -eq 1 ] || note "soak: $(grep '^result:' "$out/soak.txt" || echo 'no result')"

note "report: $report; everything else in $out"
exit $failed
