#!/usr/bin/env bash
# CI stage "sanitize": the library, tools and tests built with AddressSanitizer (with
# LeakSanitizer) and UndefinedBehaviorSanitizer (cmake -DIHA_SANITIZE=address,undefined, see
# cmake/Sanitizers.cmake), then the whole test suite. The executables carry their sanitizer
# options and LeakSanitizer's suppressions (PoCL, LLVM, libclang-cpp only), so any report
# fails its test.
# Usage: .ci/sanitize.sh [build-dir]   (default build-asan, relative to the repository)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mkdir -p "${1:-build-asan}"
build=$(cd "${1:-build-asan}" && pwd)
jobs=$(nproc)

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DIHA_SANITIZE=address,undefined \
      -DIHA_BUILD_TESTS=ON -DIHA_BUILD_TOOLS=ON
cmake --build "$build" -j"$jobs"
# Programs built by the instrumented library go to a cache of their own; PoCL's cache of
# machine code (POCL_CACHE_DIR, set by .ci/run) is shared with the release build.
export IHA_CACHE_DIR="$build/cache/iha"
ctest --test-dir "$build" --output-on-failure -j"$jobs"
