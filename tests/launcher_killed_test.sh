#!/usr/bin/env bash
# The launcher itself goes away while training:
# - kill -9 of `scripts/farm run` (as the OOM killer would): its workers die with it (PR_SET_PDEATHSIG), and its
#   learner must not be left behind waiting for them forever. It gets TERM, writes a final checkpoint and exits.
# - SIGHUP (the terminal or ssh session closed): the launcher stops the learner in order, waits for its final
#   checkpoint, removes its temporary files and only then exits, with status 129.
# Usage: launcher_killed_test.sh BUILD_DIR
set -euo pipefail
build_dir="$1"
root="$(cd "$(dirname "$0")/.." && pwd)"
tmp="$(mktemp -d)"
learner=""
cleanup() {
  [ -z "$learner" ] || kill -KILL "$learner" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; tail -20 "$tmp/log" || true; exit 1; }

# start_training RUN: `scripts/farm run` in the background (pid in $farm, learner's in $learner) once it trains.
start_training() {
  mkdir -p "$1.tmp"  # the launcher's temporary files (one that is killed -9 cannot remove them)
  TMPDIR="$1.tmp" FARM_BUILD_DIR="$build_dir" FARM_SKIP_BUILD=1 "$root/scripts/farm" run "$root/configs/cartpole.yaml" --workers 1 \
    --set total_env_steps=100000000 --set stop_at_target=false --set "run_dir=$1" \
    --set learner.progress_interval_s=100 > "$tmp/log" 2>&1 &
  farm=$!
  for _ in $(seq 600); do
    [ -f "$1/metrics.jsonl" ] && [ "$(wc -l < "$1/metrics.jsonl")" -ge 2 ] && break
    sleep 0.1
  done
  [ -f "$1/metrics.jsonl" ] || fail "the run did not start training"
  learner="$(pgrep -P "$farm" -x farm-learner || true)"
  [ -n "$learner" ] || fail "no learner under the launcher"
}

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
for _ in $(seq 300); do kill -0 "$learner" 2>/dev/null || break; sleep 0.1; done
kill -0 "$learner" 2>/dev/null && fail "the learner (pid $learner) was still running 30 s after its launcher was killed"
learner=""
stopped_cleanly "$tmp/run"

start_training "$tmp/run-hup"
kill -HUP "$farm"
status=0
wait "$farm" || status=$?
[ "$status" -eq 129 ] || fail "the launcher exited with status $status on SIGHUP, expected 129"
kill -0 "$learner" 2>/dev/null && fail "the launcher exited on SIGHUP before its learner (pid $learner) had stopped"
[ -z "$(ls -A "$tmp/run-hup.tmp")" ] || fail "the launcher left its temporary files on SIGHUP: $(ls "$tmp/run-hup.tmp")"
learner=""
stopped_cleanly "$tmp/run-hup"
echo "ok: on SIGHUP the launcher waited for its learner's final checkpoint"
