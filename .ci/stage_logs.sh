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

# Two lanes: the stages' runs are single programs that keep one core or less busy most of the
# time (a simulator's single-threaded checks, a driver compiling one program at a time), so two
# of them at once finish the stage sooner on CI's 2 cores. lane_start NAME COMMAND... runs a
# run in the background, once fewer than `lanes` are running; it prints its own lines into
# $logs/NAME.summary. lanes_finish waits for all, prints every summary in start order and
# returns 1 when any summary holds FAILED.
lanes=${IHA_CI_LANES:-2}
lane_names=()
lane_start() {
  local name=$1
  shift
  while [ "$(jobs -rp | wc -l)" -ge "$lanes" ]; do wait -n || true; done
  lane_names+=("$name")
  ("$@" > "$logs/$name.summary" 2>&1) &
}
lanes_finish() {
  wait || true
  local name bad=0
  for name in "${lane_names[@]}"; do
    cat "$logs/$name.summary"
    grep -q FAILED "$logs/$name.summary" && bad=1
  done
  return $bad
}
