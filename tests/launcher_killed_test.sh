#!/usr/bin/env bash
# kill -9 `scripts/farm run` itself (as the OOM killer would): its workers die with it (PR_SET_PDEATHSIG), and its
# learner must not be left behind waiting for them forever. It gets TERM, writes a final checkpoint and exits.
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
FARM_BUILD_DIR="$build_dir" FARM_SKIP_BUILD=1 "$root/scripts/farm" run "$root/configs/cartpole.yaml" --workers 1 \
  --set total_env_steps=100000000 --set stop_at_target=false --set "run_dir=$tmp/run" \
  --set learner.progress_interval_s=100 > "$tmp/log" 2>&1 &
farm=$!
for _ in $(seq 600); do
  [ -f "$tmp/run/metrics.jsonl" ] && [ "$(wc -l < "$tmp/run/metrics.jsonl")" -ge 2 ] && break
  sleep 0.1
done
[ -f "$tmp/run/metrics.jsonl" ] || fail "the run did not start training"
learner="$(pgrep -P "$farm" -x farm-learner || true)"
[ -n "$learner" ] || fail "no learner under the launcher"
kill -9 "$farm"
wait "$farm" 2>/dev/null || true
echo "killed the launcher (pid $farm); its learner is pid $learner"
for _ in $(seq 300); do kill -0 "$learner" 2>/dev/null || break; sleep 0.1; done
kill -0 "$learner" 2>/dev/null && fail "the learner (pid $learner) was still running 30 s after its launcher was killed"
learner=""
python3 - "$tmp/run/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert s["stop_reason"] == "terminated (SIGTERM)", s["stop_reason"]
print("ok: the learner stopped on its launcher's death:", s["stop_reason"], "at", s["env_steps"], "env steps")
PY
ls "$tmp/run/checkpoints/"ckpt-*.pt > /dev/null || fail "no final checkpoint"
