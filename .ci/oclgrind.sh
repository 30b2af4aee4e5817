#!/usr/bin/env bash
# CI stage "oclgrind": the library's kernels under Oclgrind, an OpenCL device simulator that
# reports out-of-bounds accesses, data races and uses of uninitialised values. The `oclgrind`
# wrapper preloads the simulator as the process's only OpenCL platform ("Oclgrind
# Simulator", a GPU to the library). Oclgrind exits 0 whatever it finds, so each run writes
# its reports to a log (--log) and any non-empty log fails the stage, as does a failed test.
#   1. tests/test_small_shapes with --data-races: every kernel on small shapes with ragged
#      tails, every mask, windows, P = 1 and P > 1, odd d, d = 1 and d > 128, in both launch
#      geometries (GPU and CPU), each output checked against the float64 reference, and the
#      copy and attention-loops measurement kernels;
#   2. tests/test_decode (without its 300-token caches: split_keys_small splits the keys as they
#      do), tests/test_decode_compact (the compact cache's kernels in their GPU
#      configuration, the quick cases also in the CPU's; without its 300-token cases), tests/test_mha, tests/test_errors, tests/test_buffer_sizes,
#      tests/test_half (the half conversions and the half-weight GEMV), tests/test_bf16 and
#      tests/test_bf16_convert (the same for bfloat16, and its decoding cache; without the
#      226-row forward, which the simulator takes minutes over) and tests/test_nonfinite (NaN and infinities reach
#      exactly the outputs float64 makes non-finite; IHA_TEST_GRID=pairs, a pairwise cover of
#      each grid of plants, masks and windows: tests/test_grid.h): the decoding kernels, and
#      numeric and refusal tests on a second, strict OpenCL implementation (anything passing
#      on PoCL but not here is a portability bug). Memory checks only: race detection would
#      multiply the stage's time; the simulator is a GPU, so the decoding runs the work-group
#      kernel (cl/attention_decode_groups.cl), whose barriers test_decode_groups' small case and
#      its case of key groups that do not divide the tile check with --data-races;
#   3. tests/test_attention_variants with --data-races: every attention variant (register
#      tiles, local memory, local tiles with register sub-tiles of 4 x 4, 8 x 8, 8 x 4 and 4 x 8)
#      in several tile configurations, forced whatever the simulator's built-in (those larger
#      than its local memory are skipped); the simulator's own built-in at d <= 72 is the local
#      tiles, so every GPU forward of the other runs goes through them as well;
#   3b. tests/test_attention_mma with --data-races: the tensor-core attention's emulated path
#      (fragments exchanged through local memory between barriers) with 8 warps and 64-key tiles
#      in bfloat16 and 2 warps and 32-key tiles in half, each on three ragged shapes, d = 1, 13
#      and 160, the non-finite rule (its tile flag is a local atomic) and the lookup's storage
#      rule (16-bit storage runs it through iha_attention);
#   4. tests/test_gemm with --data-races: the library's SGEMM kernel in every tile of its tuning
#      space on ragged shapes, with buffers that end where their matrices do;
#   5. tests/test_backward with --data-races: the attention backward kernels on ragged shapes
#      under every mask, windows, P = 1, d = 1 to 256 (the simulator is a GPU: the local-tile
#      passes of cl/attention_backward_local.cl where they fit); tests/test_backward_variants'
#      small case with --data-races: those passes in several tiles, packed sequences with a dead
#      row; tests/test_layer_backward with
#      --data-races: the layer backward's transposes, inverse rotary and mixing gradients, and
#      the GEMM with beta = 1, on ragged shapes; tests/test_partial with --data-races: the partial
#      attention kernels and their merge over 2 to 4 blocks; tests/test_core_backward and tests/test_accumulate
#      (memory checks): the core's backward and the accumulation kernels;
#   6. --uninitialized where Oclgrind 21.10 can run it: the unfused baseline's softmax. For the
#      other kernels it stops on LLVM's `freeze` instruction ("Unsupported instruction"),
#      crashes on the whole layer, or (built with -cl-opt-disable) loses track of values
#      passed through vector built-ins and reports every one of them.
# The runs go two at a time (.ci/stage_logs.sh's lanes; IHA_CI_LANES=1 runs them one by one),
# the longest first; each run's verdict is printed in the order below when all have ended.
# Usage: .ci/oclgrind.sh [build-dir]   (a configured and built release tree; default build)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=.ci/stage_logs.sh
. .ci/stage_logs.sh
stage_logs oclgrind "${1:-build}"
export IHA_DEVICE=oclgrind IHA_CACHE_DIR="$logs/cache"
# check NAME [oclgrind options] -- command...: one run, its verdict on stdout.
# shellcheck disable=SC2317 # called through lane_start
check() {
  local name=$1 t=$SECONDS rc=0
  shift
  local opts=()
  while [ "$1" != -- ]; do opts+=("$1"); shift; done
  shift
  oclgrind "${opts[@]}" --log "$logs/$name.log" "$@" > "$logs/$name.out" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ] || [ -s "$logs/$name.log" ]; then
    echo "oclgrind: $name FAILED (exit $rc, $(grep -c 'Kernel:' "$logs/$name.log" || true) reports, $((SECONDS - t)) s)"
    grep -E 'FAILED|ERROR' "$logs/$name.out" | head -20 || true
    # One line per kind of report and kernel, then the first reports in full.
    awk '/^[A-Z]/ && !/^\t/ {what=$0} /Kernel:/ {print "  " $2 ": " what}' "$logs/$name.log" |
      sed 's/ at global memory address 0x[0-9a-f]*//; s/ (.*)//' | sort | uniq -c | head -20
    head -40 "$logs/$name.log"
  else
    echo "oclgrind: $name clean ($((SECONDS - t)) s)"
  fi
}
# run NAME [oclgrind options] -- command...: check in one of the two lanes; the variables set
# before `run` on its line (IHA_TEST_ONLY and the like) reach the command.
run() { lane_start "$1" check "$@"; }

tests="$build/tests"
# The longest runs start first, so that the lanes end together.
run backward_races --data-races -- "$tests/test_backward"
run layer_backward_races --data-races -- "$tests/test_layer_backward"
run half -- "$tests/test_half"
run partial_races --data-races -- "$tests/test_partial"
run packed_races --data-races -- "$tests/test_packed"
run mha -- "$tests/test_mha"
IHA_TEST_GRID=pairs run nonfinite -- "$tests/test_nonfinite"
IHA_TEST_SKIP='many_rows_*' run bf16 -- "$tests/test_bf16"
run core_backward -- "$tests/test_core_backward"
run accumulate -- "$tests/test_accumulate"
run bf16_convert -- "$tests/test_bf16_convert"
run small_shapes_races --data-races -- "$tests/test_small_shapes"
IHA_TEST_SKIP='long_prompt_many_splits*' run decode_compact -- "$tests/test_decode_compact"
run attention_variants_races --data-races -- "$tests/test_attention_variants"
IHA_TEST_ONLY='W=8 KT=64 bf16' run attention_mma_w8_races --data-races -- "$tests/test_attention_mma"
IHA_TEST_ONLY='W=2 KT=32 f16' run attention_mma_w2_races --data-races -- "$tests/test_attention_mma"
IHA_TEST_ONLY='storage rule' run attention_mma_rule_races --data-races -- "$tests/test_attention_mma"
IHA_TEST_ONLY='non-finite values' run attention_mma_nonfinite_races --data-races -- "$tests/test_attention_mma"
IHA_TEST_ONLY='odd widths' run attention_mma_widths_races --data-races -- "$tests/test_attention_mma"
run gemm_races --data-races -- "$tests/test_gemm"
IHA_TEST_SKIP='long_cache_*' run decode -- "$tests/test_decode"
IHA_TEST_ONLY=uneven_key_groups run decode_groups_uneven_races --data-races -- "$tests/test_decode_groups"
IHA_TEST_ONLY=ragged_f32_causal_window run decode_groups_races --data-races -- "$tests/test_decode_groups"
IHA_TEST_ONLY=small_packed_and_dead run backward_variants_races --data-races -- "$tests/test_backward_variants"
run errors -- "$tests/test_errors"
run buffer_sizes -- "$tests/test_buffer_sizes"
IHA_SMALL_SHAPES_FILTER='unfused*' run unfused_uninitialized --uninitialized -- "$tests/test_small_shapes"
failed=0
lanes_finish || failed=1
[ $failed -eq 0 ] && echo "oclgrind: all clean; logs in $logs"
exit $failed
