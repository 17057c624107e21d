#!/usr/bin/env bash
# kill -9 one of three workers in the middle of training: the learner notices
# the silence (heartbeats), drops that worker's partial trajectories, and the
# run still reaches its target with the two others.
# Usage: fault_test.sh BUILD_DIR
build_dir="$1"
source "$(dirname "$0")/lib.sh"
FARM_BUILD_DIR="$build_dir" FARM_SKIP_BUILD=1 "$root/scripts/farm" run "$root/configs/cartpole.yaml" --workers 3 \
  --set seed=5 --set total_env_steps=600000 --set "run_dir=$tmp/run" --set learner.progress_interval_s=1 \
  --set transport.heartbeat_interval_s=0.2 --set transport.heartbeat_timeout_s=1.5 > "$tmp/log" 2>&1 &
farm=$!
pids+=("$farm")  # on exit, TERM: the launcher stops its learner and workers
# Kill a worker once training is under way (a few updates in), and before the run is solved.
wait_until 60 has_rows "$tmp/run/metrics.jsonl" 5 || { cat "$tmp/log"; fail "training did not get under way"; }
victim="$(pgrep -P "$farm" -f "farm-worker.*--index 0" | sed -n 1p)"
[ -n "$victim" ] || { cat "$tmp/log"; fail "no worker to kill"; }
! grep -q "stopping:" "$tmp/log" || { cat "$tmp/log"; fail "the run ended before a worker could be killed"; }
kill -9 "$victim"
echo "killed worker pid $victim"
wait "$farm" || { echo "farm run failed"; tail -30 "$tmp/log"; exit 1; }
python3 - "$tmp/run" <<'PY'
import json, os, sys
run = sys.argv[1]
s = json.load(open(os.path.join(run, "summary.json")))
print("summary:", json.dumps(s))
assert s["workers_lost"] == 1, s["workers_lost"]
assert s["workers_active"] == 2, s["workers_active"]
assert s["solved_at_steps"] is not None, "the run still reaches its target"
rows = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
steps = [r["env_steps"] for r in rows]
assert steps == sorted(steps) and steps[-1] > steps[4], "the step counter kept rising"
print("ok: lost 1 worker, solved at", s["solved_at_steps"], "steps")
PY
grep -q "dropped worker" "$tmp/log" || fail "the learner did not report the dropped worker"
