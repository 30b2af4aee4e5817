#!/usr/bin/env bash
# CI stage "mpi": libiha_mpi's tests under mpirun (doc/mpi.md). The test stage's build has no
# MPI (the deps stage installs Open MPI after it), so this stage reconfigures that build with
# -DIHA_MPI=ON, which adds libiha_mpi, its tests and iha-mpi beside the unchanged libiha, builds
# them and runs test_mpi_attention and test_mpi_layer on 2, 3 and 4 ranks, iha-mpi forward on 2
# and 3 against iha forward and the float64 reference, and iha-mpi bench on 2 (their ctest
# entries allow Open MPI to run as root and oversubscribe the cores).
# Usage: .ci/mpi.sh [build-dir]   (default build)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${1:-build}
cmake -S . -B "$build" -DIHA_MPI=ON
cmake --build "$build" -j2 --target test_mpi_attention test_mpi_layer test_mpi_cli iha_mpi_cli iha_cli
ctest --test-dir "$build" -R '^(test_mpi_attention_|test_mpi_layer_|cli_mpi_forward$|cli_mpi_bench)' --output-on-failure
