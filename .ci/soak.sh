#!/usr/bin/env bash
# CI stage "soak": `iha soak` for a short bounded time with one context for every call (the
# way an application should use the library). Resident memory, open files and the OpenCL
# context's reference count must not grow after the warm-up. The modes that create a context
# per call (--contexts borrowed|owned) still grow (BENCHMARKS.md, "Soak") and are not gated yet.
# Usage: .ci/soak.sh [build-dir]   (a built tree; default build)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
"${1:-build}/tools/iha" soak --seconds 40 --warmup 10 --contexts none
