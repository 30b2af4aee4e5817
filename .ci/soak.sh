#!/usr/bin/env bash
# CI stage "soak": `iha soak` for a short bounded time. Resident memory, open files and the
# OpenCL context's reference count must not grow after the warm-up:
#   - one context for every call (the way an application should use the library);
#   - a new context with its own cl_context for every call (an application that creates and
#     frees contexts: CLBlast's program cache must let freed contexts go, see
#     src/gemm/clblast_lock.h).
# A new context per call on one borrowed cl_context grows by a few KiB per context and is not
# gated.
# Usage: .ci/soak.sh [build-dir]   (a built tree; default build)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
"${1:-build}/tools/iha" soak --seconds 40 --warmup 10 --contexts none
# Owned contexts: this gates CLBlast's program cache keeping every freed cl_context (megabytes
# each). A context per call also shows the few KiB per context that borrowed contexts show, and
# the hundreds of contexts this mode creates would reach the default 4 MiB limit on that alone,
# so it allows 16 MiB.
"${1:-build}/tools/iha" soak --seconds 30 --warmup 10 --contexts owned --max-growth-mib 16
