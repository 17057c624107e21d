# shellcheck shell=bash
# Shell functions for scripts/slurm/farm.sbatch (scripts/farm launches through scripts/lib/farm_launch.py). Sourced,
# not run; the caller defines die MESSAGE (prints it, exits non-zero).

# wait_endpoint FILE PID WHAT [SECONDS]: until the learner started as the background job PID (WHAT names it: a
# process, or an srun step of learners) has written its endpoint to FILE, at most SECONDS (120); dies, naming WHAT
# and its exit status, when the job ends first or does not listen in time.
wait_endpoint() {
  local file="$1" pid="$2" what="$3" secs="${4:-120}" rc=0
  for _ in $(seq $((secs * 10))); do
    [ -s "$file" ] && return 0
    kill -0 "$pid" 2>/dev/null || { wait "$pid" || rc=$?; die "$what exited (status $rc) before listening"; }
    sleep 0.1
  done
  die "$what did not start listening within $secs s"
}

# wait_exited SECONDS PID...: whether one of the PIDs (children of this shell) has exited (or is a zombie, not yet
# reaped) within SECONDS.
wait_exited() {
  local secs="$1" p state
  shift
  for _ in $(seq $((secs * 10))); do
    for p in "$@"; do
      state="$(sed -n 's/^[0-9]* (.*) \([A-Z]\) .*/\1/p' "/proc/$p/stat" 2>/dev/null || true)"
      [ -n "$state" ] && [ "$state" != Z ] || return 0
    done
    sleep 0.1
  done
  return 1
}
