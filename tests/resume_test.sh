#!/usr/bin/env bash
# kill -9 the learner in the middle of training and restart it with --resume:
# the workers reconnect on their own, the counters continue from the latest
# checkpoint, and the run goes on to its step budget.
# Usage: resume_test.sh BUILD_DIR
set -euo pipefail
build_dir="$1"
root="$(cd "$(dirname "$0")/.." && pwd)"
tmp="$(mktemp -d)"
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$tmp"' EXIT
port=$((30000 + $$ % 20000))
run="$tmp/run"
common=(--set total_env_steps=40000 --set stop_at_target=false --set learner.checkpoint_every=5
        --set learner.progress_interval_s=100 --set transport.heartbeat_interval_s=0.2
        --set transport.heartbeat_timeout_s=1.0 --set transport.worker_give_up_s=60)
"$build_dir/learner/farm-learner" --config "$root/configs/cartpole.yaml" "${common[@]}" \
  --set "transport.bind=tcp://127.0.0.1:$port" --set "run_dir=$run" > "$tmp/learner1.log" 2>&1 &
learner=$!
pids+=("$learner")
for i in 0 1; do
  "$build_dir/worker/farm-worker" --config "$root/configs/cartpole.yaml" "${common[@]}" \
    --learner "tcp://127.0.0.1:$port" --index "$i" --stats-file "$tmp/worker-$i.json" > "$tmp/worker-$i.log" 2>&1 &
  pids+=($!)
done
# Let it write a few checkpoints, then kill it without warning.
for _ in $(seq 600); do
  [ -f "$run/metrics.jsonl" ] && [ "$(wc -l < "$run/metrics.jsonl")" -ge 12 ] && break
  sleep 0.1
done
kill -9 "$learner"
wait "$learner" 2>/dev/null || true
before="$(cat "$run/checkpoints/latest")"
echo "killed the learner; latest checkpoint $before"
sleep 1.5  # the workers notice the silence
"$build_dir/learner/farm-learner" --resume "$run" > "$tmp/learner2.log" 2>&1 &
learner=$!
pids+=("$learner")
wait "$learner"
for p in "${pids[@]:1}"; do wait "$p" || { echo "a worker failed"; cat "$tmp"/worker-*.log | tail -20; exit 1; }; done
python3 - "$run" "$before" "$tmp" <<'PY'
import json, os, sys
run, before, tmp = sys.argv[1], sys.argv[2].strip(), sys.argv[3]
s = json.load(open(os.path.join(run, "summary.json")))
print("summary:", json.dumps(s))
resumed_updates = int(before.split("-")[1].split(".")[0])
assert s["env_steps"] >= 40000, s["env_steps"]
assert s["updates"] > resumed_updates, (s["updates"], resumed_updates)
assert s["workers_active"] == 2, s  # abandoned handshakes may show as lost workers
rows = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
updates = [r["update"] for r in rows]
# The rows after the restart continue the update count from the checkpoint.
restart = next(i for i in range(1, len(rows)) if rows[i]["update"] <= rows[i - 1]["update"])
assert rows[restart]["update"] == resumed_updates + 1, (rows[restart]["update"], resumed_updates)
assert rows[restart]["env_steps"] > rows[0]["env_steps"]
for i in (0, 1):
    w = json.load(open(os.path.join(tmp, f"worker-{i}.json")))
    assert w["reconnects"] >= 1, w
print("ok: resumed from update", resumed_updates, "to", s["updates"], "with", s["env_steps"], "env steps")
PY
