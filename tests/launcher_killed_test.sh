#!/usr/bin/env bash
# The launcher itself goes away while training:
# - kill -9 of `scripts/farm run` (as the OOM killer would): its workers die with it (PR_SET_PDEATHSIG), and its
#   learner must not be left behind waiting for them forever. It gets TERM, writes a final checkpoint and exits.
# - SIGHUP (the terminal or ssh session closed): the launcher stops the learner in order, waits for its final
#   checkpoint, removes its temporary files and only then exits, with status 129.
# Usage: launcher_killed_test.sh BUILD_DIR
build_dir="$(cd "$1" && pwd)"
source "$(dirname "$0")/lib.sh"

# start_training RUN: `scripts/farm run` in the background (pid in $farm, its learner's in $learner) once it has
# written 2 metrics rows. The launcher's temporary files go to RUN.tmp (one killed -9 cannot remove them).
start_training() {
  mkdir -p "$1.tmp"
  TMPDIR="$1.tmp" FARM_BUILD_DIR="$build_dir" FARM_SKIP_BUILD=1 "$root/scripts/farm" run \
    "$root/configs/cartpole.yaml" --workers 1 --set total_env_steps=100000000 --set stop_at_target=false \
    --set "run_dir=$1" --set learner.progress_interval_s=100 > "$1.log" 2>&1 &
  farm=$!
  pids+=("$farm")
  wait_until 60 has_rows "$1/metrics.jsonl" 2 || { tail -20 "$1.log"; fail "the run did not start training"; }
  learner="$(pgrep -P "$farm" -x farm-learner || true)"
  [ -n "$learner" ] || fail "no learner under the launcher"
  pids+=("$learner")
}

# exited PID: gone, or a zombie not yet reaped (the launcher is this script's child until `wait`).
exited() { ! running "$1" || [ "$(ps -o stat= -p "$1" 2>/dev/null | cut -c1)" = Z ]; }

# stopped_cleanly RUN: summary.json says SIGTERM, and a final checkpoint is there.
stopped_cleanly() {
  python3 - "$1/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert s["stop_reason"] == "terminated (SIGTERM)", s["stop_reason"]
print("ok: the learner stopped:", s["stop_reason"], "at", s["env_steps"], "env steps")
PY
  ls "$1/checkpoints/"ckpt-*.pt > /dev/null || fail "no final checkpoint in $1"
}

start_training "$tmp/run"
kill -9 "$farm"
wait "$farm" 2>/dev/null || true
echo "killed the launcher (pid $farm); its learner is pid $learner"
wait_until 30 exited "$learner" || fail "the learner (pid $learner) was still running 30 s after its launcher was killed"
stopped_cleanly "$tmp/run"

start_training "$tmp/run-hup"
kill -HUP "$farm"
wait_until 60 exited "$farm" || fail "the launcher was still running 60 s after SIGHUP"
status=0
wait "$farm" || status=$?
[ "$status" -eq 129 ] || fail "the launcher exited with status $status on SIGHUP, expected 129"
exited "$learner" || fail "the launcher exited on SIGHUP before its learner (pid $learner) had stopped"
[ -z "$(ls -A "$tmp/run-hup.tmp")" ] || fail "the launcher left its temporary files on SIGHUP: $(ls "$tmp/run-hup.tmp")"
stopped_cleanly "$tmp/run-hup"
echo "ok: on SIGHUP the launcher waited for its learner's final checkpoint"
