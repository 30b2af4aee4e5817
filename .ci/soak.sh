#!/usr/bin/env bash
# CI stage "soak": `iha soak` for a short bounded time, with one context for every call and
# with a new context per call on the same OpenCL queue. Resident memory, open files and the
# OpenCL context's reference count must not grow after the warm-up (BENCHMARKS.md, "Soak").
# Usage: .ci/soak.sh [build-dir]   (a built tree; default build)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
iha="${1:-build}/tools/iha"
"$iha" soak --seconds 30 --warmup 10 --contexts none
"$iha" soak --seconds 20 --warmup 8 --contexts borrowed
