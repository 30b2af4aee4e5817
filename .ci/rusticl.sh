#!/usr/bin/env bash
# CI stage "rusticl": the numeric suites on a second, independent OpenCL implementation, Mesa's
# rusticl on llvmpipe (Debian's mesa-opencl-icd, enabled with RUSTICL_ENABLE=llvmpipe), whose
# device has GPU-like limits (32 KiB of local memory, work-groups of at most 1024). Its driver
# ends every kernel's loops after 65535 iterations in all (doc/drivers.md), which the library
# turns into IHA_ERROR_UNSUPPORTED: test_loop_limit checks that a long sequence is right or
# refused, never wrong. llvmpipe computes three orders of magnitude slower than PoCL and takes
# long to compile each program, so the stage runs the suites, or the cases of them (IHA_TEST_ONLY, IHA_TEST_SKIP:
# tests/test_util.h), whose shapes are small. CI runs the first list, which keeps the stage within
# CI's time budget; IHA_RUSTICL_ALL=1 runs both:
#   - test_loop_limit: 2048 virtual tokens right, a longer sequence refused;
#   - test_attention_variants: every attention variant forced (register tiles, local memory,
#     local tiles), and the local tiles' 8 x 8, 8 x 4 and 4 x 8 register sub-tiles on a shorter
#     shape set with packed sequences (those over 32 KiB of local memory skipped);
#   - test_mha: multi-head attention (P = 1, the identity shortcut);
#   - test_attention_mma's 8-warp, 64-key cases: the tensor-core attention's emulated path in
#     half and bfloat16 (the whole of its quick tier with IHA_RUSTICL_ALL=1);
#   - test_backward without its tiles_ cases: the row kernels, which the library uses there;
#   - test_partial's invisible block (the partial attention kernels and their merge).
# (The packed sequences' bounds in the attention kernels are checked on a second implementation
# by the oclgrind stage, test_packed under --data-races.)
# With IHA_RUSTICL_ALL=1 also:
#   - test_small_shapes: every forward kernel on ragged shapes, every mask, windows, both launch
#     geometries (GPU and CPU);
#   - test_nonfinite: the non-finite grid, with the forward, both backwards, decoding and half
#     storage checked against float64;
#   - test_decode without its long-cache cases, test_half's attention and layer backwards, and
#     test_bf16's decoding steps (bfloat16 x, z, weights and cache: its conversions, GEMV and
#     cache kernels);
#   - the whole of test_backward (the tile kernels forced), test_packed and test_partial,
#     test_core_backward and test_accumulate.
# The tests run two at a time (.ci/stage_logs.sh's lanes; IHA_CI_LANES=1 runs them one by one):
# llvmpipe builds one program at a time on one core. Each test's output stays in <build>/rusticl/.
# Usage: .ci/rusticl.sh [build-dir]   (a configured and built release tree; default build)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=.ci/stage_logs.sh
. .ci/stage_logs.sh
stage_logs rusticl "${1:-build}"
unset OCL_ICD_VENDORS
export RUSTICL_ENABLE=llvmpipe IHA_DEVICE=llvmpipe IHA_CACHE_DIR="$logs/cache"
if ! "$build/tools/iha" devices 2>/dev/null | grep -q llvmpipe; then
  echo "rusticl: no llvmpipe device (is mesa-opencl-icd installed? tools/scripts/bootstrap.sh ci-deps installs it)"
  exit 1
fi
# check TEST [VAR=VALUE...]: one test binary with the given environment, its verdict on stdout.
# shellcheck disable=SC2317 # called through lane_start
check() {
  local t=$1 s=$SECONDS rc=0
  shift
  env "$@" timeout 1200 "$build/tests/$t" > "$logs/$t.out" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ]; then
    echo "rusticl: $t passed ($((SECONDS - s)) s)"
  else
    echo "rusticl: $t FAILED (exit $rc, $((SECONDS - s)) s)"
    grep -vF 'MESA: warning' "$logs/$t.out" | grep -E -B2 -A8 'FAILED|ERROR|error' | head -60 || true
  fi
}
# run TEST [VAR=VALUE...]: check in one of the two lanes (.ci/stage_logs.sh).
run() { lane_start "$1" check "$@"; }
# The longest runs start first, so that the lanes end together.
if [ "${IHA_RUSTICL_ALL:-0}" = 1 ]; then
  run test_backward
  run test_loop_limit
  run test_attention_variants
  run test_mha
  run test_small_shapes
  run test_nonfinite
  run test_decode IHA_TEST_SKIP='long_*'
  run test_half IHA_TEST_ONLY='*_backward_half'
  run test_packed
  run test_core_backward
  run test_accumulate
  run test_partial
  run test_bf16 IHA_TEST_ONLY='decode_steps'
  run test_attention_mma IHA_TEST_SKIP='full_*'
else
  run test_backward IHA_TEST_SKIP='tiles_*'
  run test_loop_limit
  run test_attention_variants
  run test_mha
  run test_partial IHA_TEST_ONLY='invisible_block_keeps_state'
  run test_attention_mma IHA_TEST_ONLY='W=8 KT=64*'
fi
failed=0
lanes_finish || failed=1
exit $failed
