#!/usr/bin/env bash
# Serving: train Debug-v0 until solved, then `farm-learner --serve RUN_DIR`
# answers a fresh worker with the trained policy, without training.
# Usage: serve_test.sh BUILD_DIR
set -euo pipefail
build_dir="$1"
root="$(cd "$(dirname "$0")/.." && pwd)"
tmp="$(mktemp -d)"
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$tmp"' EXIT
env_opts=(--set env.name=Debug-v0 --set "env.options={length: 8}")
FARM_BUILD_DIR="$build_dir" FARM_SKIP_BUILD=1 "$root/scripts/farm" run "$root/configs/cartpole.yaml" --workers 1 \
  "${env_opts[@]}" --set target_return=7.9 --set ppo.gamma=0.9 --set "run_dir=$tmp/train" \
  --set learner.progress_interval_s=100 >/dev/null 2>&1

"$build_dir/learner/farm-learner" --serve "$tmp/train" --set learner.deterministic=true --set max_wall_seconds=3 \
  --set "run_dir=$tmp/serve" --set learner.progress_interval_s=100 --endpoint-file "$tmp/endpoint" &
learner=$!
pids+=("$learner")
for _ in $(seq 300); do [ -s "$tmp/endpoint" ] && break; sleep 0.1; done
"$build_dir/worker/farm-worker" --config "$tmp/train/config.yaml" --learner "$(cat "$tmp/endpoint")" \
  --stats-file "$tmp/worker.json" &
pids+=($!)
wait "$learner"
python3 - "$tmp" <<'PY'
import json, os, sys
tmp = sys.argv[1]
train = json.load(open(os.path.join(tmp, "train", "summary.json")))
serve = json.load(open(os.path.join(tmp, "serve", "summary.json")))
print("trained:", train["mean_return_100"], "at", train["solved_at_steps"], "steps")
print("served: ", json.dumps(serve))
assert train["solved_at_steps"] is not None
assert serve["updates"] == 0, "serving never trains"
assert serve["mean_return_100"] is not None and serve["mean_return_100"] >= 7.9, serve["mean_return_100"]
w = json.load(open(os.path.join(tmp, "worker.json")))
print("latency p50/p99 (us):", w["round_trip_us_p50"], w["round_trip_us_p99"], "steps/s", w["sps"])
PY
