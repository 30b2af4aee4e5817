#!/usr/bin/env bash
# CI stage "fuzz": the libFuzzer targets of tests/fuzz (the .npy reader, the public API's
# argument checks, the tuning profile reader) built with clang, ASan and UBSan, each run for
# IHA_FUZZ_SECONDS (default 60) from its committed seed corpus (tests/fuzz/corpus/<target>).
# New inputs go to <build>/corpus/<target>, crashes to <build>/artifacts/. A crash, a sanitizer
# report, a leak or a broken oracle fails the stage; reproduce with
#   <build>/tests/fuzz/<target> <build>/artifacts/<file>
# Usage: .ci/fuzz.sh [build-dir]   (default build-fuzz, relative to the repository)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mkdir -p "${1:-build-fuzz}"
build=$(cd "${1:-build-fuzz}" && pwd)
seconds=${IHA_FUZZ_SECONDS:-60}

CC=clang cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DIHA_FUZZ=ON -DIHA_SANITIZE=address,undefined \
      -DIHA_BUILD_TESTS=OFF -DIHA_BUILD_TOOLS=OFF
cmake --build "$build" -j"$(nproc)" --target fuzz_npy fuzz_api fuzz_profile
export IHA_CACHE_DIR="$build/cache/iha"
mkdir -p "$build/artifacts"
failed=0
for target in fuzz_npy fuzz_api fuzz_profile; do
  corpus="$build/corpus/$target"
  mkdir -p "$corpus"
  # The OpenCL targets allocate inside PoCL's C++ code: full stacks let LeakSanitizer's
  # suppressions see the library a leak belongs to.
  asan=""
  [ "$target" = fuzz_npy ] || asan=fast_unwind_on_malloc=0
  t=$SECONDS
  # Warm-up: the seeds once each, without the per-input timeout. With cold caches the first
  # inputs of the OpenCL targets wait for PoCL to compile whole programs, which can outlast the
  # 60 s hang detector below under load.
  if [ "$target" != fuzz_npy ]; then
    ASAN_OPTIONS=$asan "$build/tests/fuzz/$target" -timeout=1200 "tests/fuzz/corpus/${target#fuzz_}"/* \
      > "$build/$target.warmup.log" 2>&1 || { failed=1; echo "fuzz: $target FAILED on its seeds:"; tail -40 "$build/$target.warmup.log"; continue; }
  fi
  if ASAN_OPTIONS=$asan "$build/tests/fuzz/$target" "$corpus" "tests/fuzz/corpus/${target#fuzz_}" \
       -max_total_time="$seconds" -timeout=60 -rss_limit_mb=4096 -print_final_stats=1 \
       -artifact_prefix="$build/artifacts/$target-" > "$build/$target.log" 2>&1; then
    echo "fuzz: $target clean: $(grep -E '^stat::number_of_executed_units' "$build/$target.log" | cut -d: -f4) runs" \
         "in $((SECONDS - t)) s, corpus $(find "$corpus" -type f | wc -l) new inputs"
  else
    failed=1
    echo "fuzz: $target FAILED after $((SECONDS - t)) s; the end of its log:"
    grep -v '^"' "$build/$target.log" | tail -40
  fi
done
exit $failed
