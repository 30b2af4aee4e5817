# shellcheck shell=bash
# Sourced by the CI stages that keep one log per test.
# stage_logs STAGE [build-dir]: sets build (the built tree, as an absolute path; default build)
# and logs (<build>/STAGE, emptied), and fails when the tree does not exist.
stage_logs() {
  build=$(cd "${2:-build}" && pwd)
  logs="$build/$1"
  rm -rf "$logs"
  mkdir -p "$logs"
}
