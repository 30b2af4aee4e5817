#!/usr/bin/env bash
# CI stage "rusticl": the numeric suites on a second, independent OpenCL implementation, Mesa's
# rusticl on llvmpipe (Debian's mesa-opencl-icd, enabled with RUSTICL_ENABLE=llvmpipe), whose
# device has GPU-like limits (32 KiB of local memory, work-groups of at most 1024). Its driver
# ends every kernel's loops after 65535 iterations in all (doc/drivers.md), which the library
# turns into IHA_ERROR_UNSUPPORTED: test_loop_limit checks that a long sequence is right or
# refused, never wrong. llvmpipe runs at about 0.1-1 GFLOP/s, so the suites here are the ones
# whose shapes are small: every kernel on ragged shapes in both launch geometries
# (test_small_shapes), every attention variant forced (test_attention_variants), 2048 virtual
# tokens and the refusal (test_loop_limit), multi-head attention (test_mha), decoding
# (test_decode), the attention and layer backwards (test_backward, test_layer_backward) and
# half storage (test_half). Each test's output stays in <build>/rusticl/.
# Usage: .ci/rusticl.sh [build-dir]   (a configured and built release tree; default build)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=$(cd "${1:-build}" && pwd)
logs="$build/rusticl"
rm -rf "$logs"
mkdir -p "$logs"
unset OCL_ICD_VENDORS
export RUSTICL_ENABLE=llvmpipe IHA_DEVICE=llvmpipe IHA_CACHE_DIR="$logs/cache"
if ! "$build/tools/iha" devices 2>/dev/null | grep -q llvmpipe; then
  echo "rusticl: no llvmpipe device (is mesa-opencl-icd installed? tools/bootstrap.sh ci-deps installs it)"
  exit 1
fi
failed=0
for t in test_loop_limit test_small_shapes test_attention_variants test_mha test_decode test_backward \
         test_layer_backward test_half; do
  s=$SECONDS rc=0
  timeout 900 "$build/tests/$t" > "$logs/$t.out" 2>&1 || rc=$?
  if [ $rc -eq 0 ]; then
    echo "rusticl: $t passed ($((SECONDS - s)) s)"
  else
    failed=1
    echo "rusticl: $t FAILED (exit $rc, $((SECONDS - s)) s)"
    grep -vF 'MESA: warning' "$logs/$t.out" | grep -E -B2 -A8 'FAILED|ERROR|error' | head -60 || true
  fi
done
exit $failed
