#!/usr/bin/env bash
# Serving: train Debug-v0 until solved, then `farm-learner --serve RUN_DIR`
# answers a fresh worker with the trained policy, without training.
# Usage: serve_test.sh BUILD_DIR
build_dir="$1"
source "$(dirname "$0")/lib.sh"
env_opts=(--set env.name=Debug-v0 --set "env.options={length: 8}")
FARM_BUILD_DIR="$build_dir" FARM_SKIP_BUILD=1 "$root/scripts/farm" run "$root/configs/cartpole.yaml" --workers 1 \
  "${env_opts[@]}" --set target_return=7.9 --set ppo.gamma=0.9 --set "run_dir=$tmp/train" \
  --set learner.progress_interval_s=100 > "$tmp/train.log" 2>&1 || { tail -20 "$tmp/train.log"; fail "training failed"; }

# Served until the worker has taken 4000 env steps (500 episodes), not for a fixed time: a busy machine may
# be slow to start the worker.
"$build_dir/learner/farm-learner" --serve "$tmp/train" --set learner.deterministic=true --set total_env_steps=4000 \
  --set "run_dir=$tmp/serve" --set learner.progress_interval_s=100 --endpoint-file "$tmp/endpoint" &
learner=$!
pids+=("$learner")
wait_until 60 test -s "$tmp/endpoint" || fail "the serving learner did not listen within 60 s"
"$build_dir/worker/farm-worker" --config "$tmp/train/config.yaml" --learner "$(cat "$tmp/endpoint")" \
  --stats-file "$tmp/worker.json" &
worker=$!
pids+=("$worker")
wait "$learner" || fail "the serving learner failed"
wait "$worker" || fail "the worker did not end on the serving learner's Stop"
python3 - "$tmp" <<'PY'
import json, os, sys
tmp = sys.argv[1]
train = json.load(open(os.path.join(tmp, "train", "summary.json")))
serve = json.load(open(os.path.join(tmp, "serve", "summary.json")))
print("trained:", train["mean_return_100"], "at", train["solved_at_steps"], "steps")
print("served: ", json.dumps(serve))
assert train["solved_at_steps"] is not None
assert serve["updates"] == 0, "serving never trains"
assert serve["env_steps"] >= 4000, serve["env_steps"]
assert serve["mean_return_100"] is not None and serve["mean_return_100"] >= 7.9, serve["mean_return_100"]
w = json.load(open(os.path.join(tmp, "worker.json")))
print("latency p50/p99 (us):", w["round_trip_us_p50"], w["round_trip_us_p99"], "steps/s", w["sps"])
PY
