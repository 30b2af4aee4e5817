#!/usr/bin/env bash
# CI stage "tsan": the library and two tests built with ThreadSanitizer (cmake
# -DIHA_SANITIZE=thread), run under it. Only tests that run our code on several threads at
# once: TSan slows instrumented code 5-15x, most of the suite runs our code on one thread
# (PoCL's worker threads run uninstrumented kernels), and test_tune's two profile writers tune
# within a time budget that the slowdown would distort. The two:
#   - tests/test_threads: each guarantee of iha.h's thread-safety contract (threads with their
#     own contexts filling one cold program cache, threads sharing a context behind a mutex
#     with their own queues on its cl_context, two processes filling one cache directory);
#   - tests/test_context: two contexts on two threads with other shapes, masks and the
#     environment's defaults, and the context's lifecycle around PoCL's threads (borrowed
#     queues whose references PoCL drops from its workers, trimmed workspace, cache files).
# .ci/run shares POCL_CACHE_DIR with the release build, whose tests build the same kernels, so
# PoCL's compilations are mostly warm here. Any report fails its test (TSan exits 66).
# .ci/tsan.supp may list races inside PoCL, LLVM, the ICD loader or CLBlast (uninstrumented, not
# ours); it lists none.
# GCC 12's TSan needs mmap randomisation of at most 28 bits ("FATAL: ThreadSanitizer: unexpected
# memory mapping" otherwise, google/sanitizers#1716): on kernels set higher the tests run with
# ASLR off (setarch -R), which needs personality(2) (refused by some container seccomp profiles).
# GCC's TSan runtime (libtsan2) comes with build-essential, which tools/scripts/bootstrap.sh installs.
# Usage: .ci/tsan.sh [build-dir]   (default build-tsan, relative to the repository)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mkdir -p "${1:-build-tsan}"
build=$(cd "${1:-build-tsan}" && pwd)
jobs=$(nproc)
tests=(test_threads test_context)

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DIHA_SANITIZE=thread \
      -DIHA_BUILD_TESTS=ON -DIHA_BUILD_TOOLS=ON
cmake --build "$build" -j"$jobs" --target "${tests[@]}"
# Programs built by the instrumented library go to a cache of their own; PoCL's cache of
# machine code (POCL_CACHE_DIR, set by .ci/run) is shared with the release build.
export IHA_CACHE_DIR="$build/cache/iha"
export TSAN_OPTIONS="suppressions=$PWD/.ci/tsan.supp:second_deadlock_stack=1${TSAN_OPTIONS:+:$TSAN_OPTIONS}"
no_aslr=()
if [ "$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo 28)" -gt 28 ]; then
  no_aslr=(setarch "$(uname -m)" -R)
  echo "tsan: vm.mmap_rnd_bits > 28, running with ASLR off"
fi
pattern="^($(IFS='|'; echo "${tests[*]}"))\$"
"${no_aslr[@]}" ctest --test-dir "$build" --output-on-failure -j"$jobs" -R "$pattern"
