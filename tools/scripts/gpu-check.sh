#!/usr/bin/env bash
# Checks iha on a machine with an NVIDIA GPU, in one prepared run (see the project's GPU.md and
# doc/performance.md, "Preparing a lent GPU's run"):
#   1. when the build was configured elsewhere, links the configured source and build paths to
#      this tree (ctest's files name them absolutely) and restores the build's library links;
#      when the build's libraries are missing, unpacks the Debian packages brought along in .deb/
#      into a private prefix (never over /, whose own libraries must stay intact) and puts its
#      library directories on LD_LIBRARY_PATH;
#   2. finds the driver's OpenCL library, libnvidia-opencl.so.1, under the driver's root
#      (default /usr/local/nvidia) or the system's library directories;
#   3. registers it with the ICD loader: nothing to do when a vendors file already names it;
#      else /etc/OpenCL/vendors/nvidia.icd when writable, else a private vendors directory
#      passed through OCL_ICD_VENDORS;
#   4. runs, each step with a time limit and within --total-seconds for all of them, each into a
#      file of the output directory: `iha devices`, `iha check`, `iha bench --json` with the
#      built-in tile sizes, `iha tune` with a short budget (and the attention of half storage,
#      where the tuner tries the tensor cores), the attention forward's local tiles in
#      six register sub-tile shapes and the tensor cores in four configurations with the core in
#      half (forced through a profile, bench/peers/forced_profile.py), then `iha bench --json` on the
#      problems of the side-by-side table (the causal and the unmasked core at d = 64 and 128
#      with their backward, T = 8192; a decoding step, B = 1, --cache-tokens cached tokens,
#      float and bf16 cache, d = 64 and a float cache at d = 128), PyTorch's SDPA on the same
#      problems (bench/peers/cuda_sdpa.py, float32 and bfloat16), the table and the targets
#      (bench/peers/gpu_report.py: table.md, the targets in report.txt), the test suite with
#      IHA_DEVICE=nvidia, `iha bench`'s full table and `iha soak`; report.txt is the summary.
# Exit status: 0 all passed, 1 a step failed or had no time left, 2 usage, 3 no NVIDIA OpenCL
# driver or platform. Targets not met do not fail the run: report.txt says which.
#
#   tools/scripts/gpu-check.sh [--build DIR] [--out DIR] [--nvidia-root DIR] [--icd-dir DIR] [--device SPEC]
#                      [--total-seconds S] [--tune-seconds S] [--bench-args "ARGS"] [--cache-tokens L]
#                      [--test-jobs N] [--test-seconds S] [--check-seconds S] [--soak-seconds S]
#                      [--python PY] [--peer-device DEV] [--peer-reps R] [--core16-args "ARGS"]
#                      [--tests REGEX] [--use-debs] [--no-tests] [--no-peers] [--dry-run]
#   tools/scripts/gpu-check.sh --prepare [--build DIR]
# --dry-run finds and registers the driver as above (use --icd-dir to keep /etc untouched) but
# only prints the commands it would run. --device (default nvidia) is the IHA_DEVICE the
# checks use and the name `iha devices` must show: with another driver standing in for
# NVIDIA's (say PoCL's library linked as <root>/lib/x86_64-linux-gnu/libnvidia-opencl.so.1,
# with <root>/lib/x86_64-linux-gnu/pocl and <root>/share/pocl linked to PoCL's own directories,
# which it finds beside its library, and --device pocl), the whole script can be rehearsed on
# a machine without a GPU, with --peer-device cpu for the peers and --bench-args "--n 128" for
# small cores. --use-debs unpacks .deb/ even when the libraries are already there (to rehearse
# step 1). --bench-args go to every core run (not the
# decoding steps). --python is the Python with torch for the peers (default: the first of
# bench/peers/.work/venv/bin/python, python3, /usr/bin/python3, /opt/conda/bin/python that
# imports torch). --core16-args, when iha bench can run a 16-bit attention core, are the options
# that make it do so; the table's 16-bit target reads that run. --tests REGEX runs only the
# tests whose names match (ctest -R). Scratch files (the unpacked packages, the program cache)
# go to a temporary directory, so that --out holds only what is worth reading.
# --prepare runs nothing: on the build machine, it copies into .deb/ the Debian packages of the
# libraries the build's tools and tests load (the C and C++ runtimes and MPI's excepted: the
# lent machine's own are newer, and the MPI tests are left out where mpiexec is missing), from
# apt's cache or through apt-get download, and prints what a device run would carry (build and
# .deb, 64 MiB at most) and the command line (doc/performance.md, "Preparing a lent GPU's run").
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build="$root/build"
out=""
nvidia_root=/usr/local/nvidia
icd_dir=""
total_seconds=480
tune_seconds=30
device=nvidia
bench_args=""
# Cached tokens of the decoding steps: a bf16 cache of 4096 tokens (34 MB at d = 64) fits an H200's L2,
# which repeated steps would then read instead of memory.
cache_tokens=8192
test_jobs=$(nproc 2> /dev/null || echo 2)
test_seconds=180
check_seconds=120
soak_seconds=20
python=""
peer_device=cuda
peer_reps=10
core16_args=""
use_debs=0
prepare=0
tests_regex=""
run_tests=1
run_peers=1
dry_run=0

usage() { sed -n '/^#   tools\/scripts\/gpu-check.sh/,/^# --dry-run/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# *//' >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=${2:?}; shift 2 ;;
    --out) out=${2:?}; shift 2 ;;
    --nvidia-root) nvidia_root=${2:?}; shift 2 ;;
    --icd-dir) icd_dir=${2:?}; shift 2 ;;
    --device) device=${2:?}; shift 2 ;;
    --total-seconds) total_seconds=${2:?}; shift 2 ;;
    --tune-seconds) tune_seconds=${2:?}; shift 2 ;;
    --bench-args) bench_args=${2?}; shift 2 ;;
    --cache-tokens) cache_tokens=${2:?}; shift 2 ;;
    --test-jobs) test_jobs=${2:?}; shift 2 ;;
    --test-seconds) test_seconds=${2:?}; shift 2 ;;
    --check-seconds) check_seconds=${2:?}; shift 2 ;;
    --soak-seconds) soak_seconds=${2:?}; shift 2 ;;
    --python) python=${2:?}; shift 2 ;;
    --peer-device) peer_device=${2:?}; shift 2 ;;
    --peer-reps) peer_reps=${2:?}; shift 2 ;;
    --core16-args) core16_args=${2?}; shift 2 ;;
    --tests) tests_regex=${2:?}; shift 2 ;;
    --prepare) prepare=1; shift ;;
    --use-debs) use_debs=1; shift ;;
    --no-tests) run_tests=0; shift ;;
    --no-peers) run_peers=0; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) usage ;;
  esac
done
deadline=$((SECONDS + total_seconds))
[ -d "$build" ] && build=$(cd "$build" && pwd)

if [ $prepare -eq 1 ]; then
  [ -x "$build/tools/iha" ] || { echo "prepare: no $build/tools/iha: build first" >&2; exit 1; }
  kind=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$build/CMakeCache.txt")
  [ "$kind" = Release ] || echo "prepare: warning: $build is a '$kind' build; measure a Release one" >&2
  mkdir -p "$root/.deb"
  # The package owning each library the binaries load (a merged /usr registers /usr/lib paths).
  packages=$(for f in "$build"/tools/iha "$build"/tests/test_* "$build"/tests/example_*; do
      case $f in *mpi*) continue ;; esac
      [ -x "$f" ] && ldd "$f" | awk '/=> \// {print $3}'
    done | sort -u | while read -r p; do
      dpkg -S "$p" 2> /dev/null || dpkg -S "/usr$p" 2> /dev/null || dpkg -S "$(readlink -f "$p")" 2> /dev/null || true
    done | cut -d: -f1 | sort -u | grep -vx -e libc6 -e libgcc-s1 -e libstdc++6)
  for p in $packages; do
    v=$(dpkg-query -W -f '${Version}' "$p") a=$(dpkg-query -W -f '${Architecture}' "$p")
    f="/var/cache/apt/archives/${p}_${v//:/%3a}_$a.deb"
    if [ -e "$f" ]; then cp "$f" "$root/.deb/"; else (cd "$root/.deb" && apt-get download -q "$p=$v"); fi
  done
  echo "prepare: .deb holds: $(find "$root/.deb" -name "*.deb" -printf "%f ")"
  rel=${build#"$root"/}
  size=$(du -scb "$build" "$root/.deb" | tail -1 | cut -f1)
  echo "prepare: carry [\"$rel\", \".deb\"]: $((size / 1048576)) MiB of 64 MiB ($size bytes)"
  if [ "$size" -gt $((64 << 20)) ]; then
    echo "prepare: too large; the largest parts of $build:" >&2
    du -sm "$build"/* | sort -n | tail -5 >&2
    exit 1
  fi
  echo "prepare: device command (carry [\"$rel\", \".deb\"], timeout_s 570):"
  echo "  tools/scripts/gpu-check.sh --build $rel --out \"\$OUT/gpu-check\" --total-seconds 480"
  exit 0
fi
[ -n "$out" ] || out="$build/gpu-check-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$out"
out=$(cd "$out" && pwd)
report="$out/report.txt"
: > "$report"
note() { echo "$*" | tee -a "$report"; }
failed=0
scratch=$(mktemp -d "${TMPDIR:-/tmp}/iha-gpu-check.XXXXXX")
# The peers' Python gets the environment as it came: the packages' older libraries (step 1)
# are the build's, not PyTorch's.
orig_ld_library_path=${LD_LIBRARY_PATH-}
# NVIDIA's OpenCL ends the process when a write to its compute cache fails (GPU.md): the cache
# goes to the scratch directory, which is writable, unless the caller chose its own.
export CUDA_CACHE_PATH=${CUDA_CACHE_PATH:-$scratch/cuda-cache}

note "iha GPU check, $(date -u '+%Y-%m-%d %H:%M UTC') on $(hostname)"
command -v nvidia-smi > /dev/null &&
  note "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"

# ---- 1. The build's paths and the packages brought along --------------------------------
# cached NAME: a path CMake recorded in the build's cache.
cached() { sed -n "s|^$1:INTERNAL=||p" "$build/CMakeCache.txt" 2> /dev/null | head -1; }
# A build configured at another path (the machine it was built on): ctest's files and the
# binaries' run paths name that path, so it is linked to this tree when it is free to take.
for pair in "$(cached CMAKE_HOME_DIRECTORY)=$root" "$(cached CMAKE_CACHEFILE_DIR)=$build"; do
  from=${pair%%=*} to=${pair#*=}
  if [ -n "$from" ] && [ ! -e "$from" ] && [ "$from" != "$to" ]; then
    if mkdir -p "$(dirname "$from")" 2> /dev/null && ln -s "$to" "$from" 2> /dev/null; then
      note "paths: linked $from -> $to (the build was configured there)"
    else
      note "paths: cannot link $from -> $to: ctest will find no tests"
    fi
  fi
done
# A copy that dropped symbolic links loses libiha.so.0 -> libiha.so.0.1.0 and the like.
for f in "$build"/lib*.so.*.*.*; do
  [ -f "$f" ] || continue
  for l in "${f%.*.*}" "${f%.*.*.*}"; do [ -e "$l" ] || ln -s "$(basename "$f")" "$l"; done
done
iha="$build/tools/iha"
missing() { [ -x "$iha" ] && ldd "$iha" 2> /dev/null | grep 'not found' | awk '{print $1}' | tr '\n' ' '; }
if [ -d "$root/.deb" ] && { [ $use_debs -eq 1 ] || [ -n "$(missing)" ]; }; then
  prefix="$scratch/debroot"
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
export IHA_DEVICE="$device" IHA_CACHE_DIR="$scratch/cache"

# step NAME SECONDS command...: output in $out/NAME.txt; failure noted, not fatal. The limit is
# cut to what --total-seconds leaves, and a step with under 10 s left does not start.
step() {
  local name=$1 limit=$2 t=$SECONDS rc=0 left=$((deadline - SECONDS))
  shift 2
  if [ $dry_run -eq 1 ]; then
    note "$name: would run: timeout $limit $*"
    return 0
  fi
  [ "$limit" -le "$left" ] || limit=$left
  if [ "$limit" -lt 10 ]; then
    failed=1
    note "$name: SKIPPED, no time left of --total-seconds $total_seconds"
    return 1
  fi
  timeout "$limit" "$@" > "$out/$name.txt" 2>&1 || rc=$?
  if [ $rc -eq 0 ]; then
    note "$name: ok ($((SECONDS - t)) s)"
  else
    failed=1
    note "$name: FAILED, exit $rc$([ $rc -eq 124 ] && echo " (time limit $limit s)") after $((SECONDS - t)) s: $out/$name.txt"
  fi
  return $rc
}

step devices 60 "$iha" devices || exit 3
if [ $dry_run -eq 0 ]; then
  grep -qi "$device" "$out/devices.txt" || { note "devices: no device matching '$device' is visible"; exit 3; }
  note "devices: $(grep -i -m1 "$device" "$out/devices.txt" | sed 's/^ *//')"
fi

[ $dry_run -eq 1 ] || command -v clinfo > /dev/null && { clinfo > "$out/clinfo.txt" 2>&1 || true; }

# Every kernel family against float64 on this device before any figure is trusted.
step check "$check_seconds" "$iha" check || true
[ $dry_run -eq 1 ] || note "check: $(awk '$3 == "ok" {o++} $3 == "FAILED" {f++} $3 == "unsupported" {u++}
  END {printf "%d rows ok, %d FAILED, %d unsupported", o, f, u}' "$out/check.txt" 2> /dev/null)"

# bench_summary FILE: the attention core's and the ceilings' figures from a --json run.
bench_summary() {
  [ $dry_run -eq 1 ] && return 0
  local py
  py=$(command -v python3 || true)
  if [ -n "$py" ] && [ -s "$1" ]; then
    "$py" - "$1" << 'PY' 2> /dev/null || grep -o '"gflops":[^,]*' "$1" | head -3
import json, sys
j = json.load(open(sys.argv[1]))
a, b, d = j["attention"], j["backward"], j["decode"]
if a["state"] == "ran":
    f = {k[len("fraction_of_"):]: round(v, 3) for k, v in a.items() if k.startswith("fraction_of_") and v}
    print("%s d=%s T=%s B*H=%s: %.4g s, %.1f GFLOP/s, %.3g GB/s; fractions %s; config %s (%s)" % (
        a["mask"], a["d"], a["t"], a["batch"] * a["heads"], a["seconds"], a["gflops"],
        a["bytes_per_second"] / 1e9, f, a.get("config"), a.get("config_source")))
if b["state"] == "ran":
    print("  backward: %.4g s, %.1f GFLOP/s, %.2f x the forward's time" % (
        b["seconds"], b["gflops"], b["backward_over_forward"]))
if d["state"] == "ran":
    print("decode B=%s d=%s L=%s bf16=%s half=%s: step %.4g ms, attention %.4g ms, cache %.4g GB/s" % (
        d["batch"], d["d"], d["cached_tokens"], d["bf16"], d["half"], d["step_seconds"] * 1e3,
        d["attention_seconds"] * 1e3, d["cache_bytes_per_second"] / 1e9))
    c = d.get("compact", {})
    if c.get("state") == "ran":
        print("  compact cache: step %.4g ms, attention %.4g ms, cache %.4g GB/s, %.0f bytes per token" % (
            c["step_seconds"] * 1e3, c["attention_seconds"] * 1e3, c["cache_bytes_per_second"] / 1e9,
            c["cache_bytes_per_token"]))
PY
  fi
}

# Built-in tile sizes first, so that what tuning gains shows.
# shellcheck disable=SC2086 # --bench-args holds several options
step bench_builtin 120 "$iha" bench --json --no-cold-start --no-layer --no-baseline $bench_args || true
note "bench_builtin: $(bench_summary "$out/bench_builtin.txt")"
step tune $((tune_seconds + 120)) "$iha" tune --budget-s "$tune_seconds" || true
# The attention of half-storage calls, where the tuner starts from the tensor cores (their
# entries go to the same profile; the float runs below do not read them).
step tune_half 60 "$iha" tune --kernels attention --storage half --layers global --budget-s 20 || true

# The local tiles' register sub-tiles (doc/performance.md, "A model of the GPU kernels"), each
# forced as the attention kernel's device-wide default in a profile that carries the key of the
# tune step's (bench/peers/forced_profile.py) and timed on the causal forward alone, B*H = 8,
# T = 8192: the shapes that fit 48 KiB of local memory at d = 64 (8 x 4 is the built-in there),
# 8 x 8 at d = 32, and at d = 128 the two that fit. A shape the device cannot run is passed over by
# the library; the table then names the configuration that ran instead.
key_profile=""
for f in "$IHA_CACHE_DIR"/profile-*.json; do [ -e "$f" ] && key_profile=$f; done
forced_runs=()
# forced_run NAME D LIMIT BENCH-OPTION... -- PARAM=VALUE...: one such run.
forced_run() {
  local name=$1 d=$2 limit=$3 forced_file="$scratch/$1.json" opts=()
  shift 3
  while [ "$1" != -- ]; do opts+=("$1"); shift; done
  shift
  if [ $dry_run -eq 0 ] && [ -z "$key_profile" ]; then
    note "$name: SKIPPED, the tune step wrote no profile to take the device's key from"
    return 0
  fi
  if [ $dry_run -eq 0 ]; then
    python3 "$root/bench/peers/forced_profile.py" --key-from "$key_profile" --out "$forced_file" "$@" > /dev/null ||
      { note "$name: FAILED to write $forced_file"; return 0; }
  fi
  # shellcheck disable=SC2086 # --bench-args holds several options
  if step "$name" "$limit" env IHA_PROFILE="$forced_file" "$iha" bench --json --no-cold-start --no-layer --no-baseline \
      --no-ceilings --d "$d" --mask causal "${opts[@]}" $bench_args; then
    forced_runs+=("$out/$name.txt")
    note "$name: $(bench_summary "$out/$name.txt")"
  fi
  return 0
}
forced() { # NAME D ROWS KEYS TILE_RY TILE_RX
  forced_run "$1" "$2" 45 -- group="$3" LOC_KEYS="$4" TILE_RY="$5" TILE_RX="$6"
}
forced tiles_d64_64x32_8x4 64 64 32 8 4
forced tiles_d64_64x32_4x4 64 64 32 4 4
forced tiles_d64_64x32_4x8 64 64 32 4 8
forced tiles_d32_64x64_8x8 32 64 64 8 8
forced tiles_d128_16x32_4x4 128 16 32 4 4
forced tiles_d128_32x16_4x4 128 32 16 4 4
# The tensor cores (cl/attention_mma_nv.cl), on the same causal problem with the core stored in
# half (the only storage they serve): 4 and 8 warps with 64-key tiles, half and bfloat16 inputs
# at d = 64, and 32-key tiles at d = 128. The table puts PyTorch's SDPA beside them (bf16 is the
# fair peer) and the fastest at d = 64 stands for the 16-bit target. On a device that does not
# offer them, the library passes over the profile and the table says so.
mma() { # NAME D WARPS KEYS VARIANT
  forced_run "$1" "$2" 40 --core-half -- group=$(($3 * 16)) LOC_KEYS="$4" variant="$5"
}
mma mma_d64_w4_k64_f16 64 4 64 3
mma mma_d64_w8_k64_f16 64 8 64 3
mma mma_d64_w4_k64_bf16 64 4 64 4
mma mma_d128_w4_k32_f16 128 4 32 3

# The table's problems, each as one JSON report: the first one also measures the ceilings that
# every fraction of the table divides by.
json_runs=()
json_run() { # NAME LIMIT bench-options...
  local name=$1 limit=$2
  shift 2
  if step "$name" "$limit" "$iha" bench --json "$@"; then
    json_runs+=("$out/$name.txt")
    note "$name: $(bench_summary "$out/$name.txt")"
  fi
  return 0
}
for d in 64 128; do
  for mask in causal none; do
    ceilings=--no-ceilings
    [ "$d$mask" = 64causal ] && ceilings=""
    # shellcheck disable=SC2086
    json_run "core_d${d}_$mask" 150 --no-cold-start --no-layer --no-baseline $ceilings --backward --d "$d" \
      --mask "$mask" $bench_args
  done
done
json_run decode_d64_float 90 --decode --no-ceilings --batch 1 --d 64 --cache-tokens "$cache_tokens"
json_run decode_d64_bf16 90 --decode --no-ceilings --batch 1 --d 64 --cache-tokens "$cache_tokens" --bf16
json_run decode_d128_float 90 --decode --no-ceilings --batch 1 --d 128 --cache-tokens "$cache_tokens"
# The compact cache beside the pseudo-token one in one run (doc/performance.md, "Decoding with a
# compact KV cache"), at 32768 cached tokens and P = 4.
json_run decode_d64_compact 120 --decode --compact --batch 1 --heads 8 --d 64 --p 4 --cache-tokens 32768
core16=""
if [ -n "$core16_args" ]; then
  # shellcheck disable=SC2086
  step core16 150 "$iha" bench --json --no-cold-start --no-layer --no-baseline --no-ceilings $core16_args || true
  core16="$out/core16.txt"
fi

# PyTorch's SDPA on the same problems, then the table and the targets.
if [ $run_peers -eq 1 ]; then
  if [ -z "$python" ]; then
    for py in "$root/bench/peers/.work/venv/bin/python" python3 /usr/bin/python3 /opt/conda/bin/python; do
      if command -v "$py" > /dev/null && LD_LIBRARY_PATH=$orig_ld_library_path "$py" -c 'import torch' 2> /dev/null; then
        python=$py
        break
      fi
    done
  fi
  if [ -z "$python" ]; then
    failed=1
    note "peers: FAILED, no Python that imports torch (--python PY)"
  elif [ ${#json_runs[@]} -gt 0 ] || [ $dry_run -eq 1 ]; then
    note "peers: $python, torch $(LD_LIBRARY_PATH=$orig_ld_library_path "$python" -c 'import torch; print(torch.__version__)' 2> /dev/null)"
    step peers 240 env LD_LIBRARY_PATH="$orig_ld_library_path" "$python" "$root/bench/peers/cuda_sdpa.py" \
      --device "$peer_device" --reps "$peer_reps" --out "$out/peers.json" "${json_runs[@]}" || true
  fi
fi
if [ $dry_run -eq 0 ] && [ ${#json_runs[@]} -gt 0 ] && [ "${json_runs[0]}" = "$out/core_d64_causal.txt" ]; then
  if python3 "$root/bench/peers/gpu_report.py" --peers "$out/peers.json" --ceilings "$out/core_d64_causal.txt" \
      --table "$out/table.md" --targets "$out/targets.txt" ${core16:+--core16 "$core16"} \
      ${forced_runs[0]:+--forced "${forced_runs[@]}" --} "${json_runs[@]}" \
      > "$out/gpu_report.txt" 2>&1; then
    sed 's/^/table: /' "$out/table.md" >> "$report"
    tee -a "$report" < "$out/targets.txt"
  else
    failed=1
    note "table: FAILED: $out/gpu_report.txt"
  fi
fi

if [ $run_tests -eq 1 ]; then
  if command -v ctest > /dev/null; then
    # The MPI tests need mpiexec, and the script tests the cmake their build machine named
    # (`cmake -P`): the lent machine need not have either.
    skip=()
    if ! command -v mpiexec > /dev/null; then skip+=(mpi); note "tests: no mpiexec: the MPI tests are left out"; fi
    unrunnable=$(ctest --test-dir "$build" --show-only=json-v1 2> /dev/null | python3 -c '
import json, os, sys
tests = json.load(sys.stdin).get("tests", [])
print(" ".join(t["name"] for t in tests if t.get("command") and not os.access(t["command"][0], os.X_OK)))' 2> /dev/null || true)
    if [ -n "$unrunnable" ]; then
      for t in $unrunnable; do skip+=("^$t\$"); done
      note "tests: left out, their program is missing here: $unrunnable"
    fi
    exclude=()
    [ ${#skip[@]} -eq 0 ] || exclude=(-E "$(IFS='|'; echo "${skip[*]}")")
    [ -z "$tests_regex" ] || exclude+=(-R "$tests_regex")
    step tests "$test_seconds" ctest --test-dir "$build" --output-on-failure -j "$test_jobs" --timeout 120 \
      "${exclude[@]}" || true
    [ $dry_run -eq 1 ] || note "tests: $(grep -E 'tests passed|tests failed|No tests were found' "$out/tests.txt" | tail -1)"
    [ $dry_run -eq 1 ] || grep -E '^\s+[0-9]+ - ' "$out/tests.txt" | sed 's/^ */tests: failed /' | tee -a "$report" || true
  else # no CMake on the machine: the test executables without arguments, --test-jobs at a time
    mkdir -p "$out/tests"
    # shellcheck disable=SC2016 # expanded by the inner shell
    step tests "$test_seconds" bash -c 'ls "$1"/tests/test_* "$1"/tests/example_* | grep -v mpi | grep -E -- "${3:-.}" |
      xargs -P "$2" -I{} sh -c '\''timeout 60 "$1" > "$2/tests/$(basename "$1").txt" 2>&1 && echo "ok $1" ||
      echo "FAILED $1"'\'' _ {} "$4"' _ "$build" "$test_jobs" "$tests_regex" "$out" || true
    [ $dry_run -eq 1 ] || grep -c '^ok' "$out/tests.txt" | sed 's/^/tests: passed /' | tee -a "$report" || true
    [ $dry_run -eq 1 ] || grep '^FAILED' "$out/tests.txt" | sed 's/^/tests: /' | tee -a "$report" || true
  fi
fi

# shellcheck disable=SC2086
step bench 180 "$iha" bench $bench_args || true
[ $dry_run -eq 1 ] || grep -E '^  (copy kernel|CLBlast SGEMM 1024|peak FMA kernel|fused|layer \(wall\)|mixing \+|empty|warm)' \
  "$out/bench.txt" | head -20 |
  sed 's/^/bench: /' | tee -a "$report" || true
step soak $((soak_seconds + 60)) "$iha" soak --seconds "$soak_seconds" --warmup $((soak_seconds / 4)) || true
[ $dry_run -eq 1 ] || note "soak: $(grep '^result:' "$out/soak.txt" || echo 'no result')"

rm -rf "$scratch"
note "time: $SECONDS s of --total-seconds $total_seconds"
note "report: $report; table: $out/table.md; everything else in $out"
exit $failed
