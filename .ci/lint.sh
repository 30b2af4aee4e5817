#!/usr/bin/env bash
# The project's shell scripts under shellcheck (CI stage "lint").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
shellcheck --version | sed -n 2p
shellcheck .ci/run .ci/*.sh tools/scripts/*.sh tools/man/*.sh bench/peers/*.sh python/run_tests.sh
echo "lint: shellcheck clean"
