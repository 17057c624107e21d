#!/usr/bin/env bash
# End to end, centralised training: one learner and two worker processes train
# uav_coverage (a small map) with the critic on the global state and the cnn
# encoder for a few updates, then farm-eval and farm-export rebuild the run's
# policy from policy_spec.json. Checks that it runs without errors and counts
# env and agent steps apart; it does not check learning (see docs/ENVIRONMENTS.md
# for a real run). Bounded to well under a minute on two cores.
# Usage: e2e_uav_ctde.sh BUILD_DIR
build_dir="$1"
source "$(dirname "$0")/lib.sh"
run_dir="$tmp/run"

# 3 UAVs on a 10 x 10 map, 40-step episodes: 4 envs per worker are 12 agent rows; 8 steps per rollout.
env_options="env.options={agents: 3, grid: 10, obstacles: 6, window: 5, max_steps: 40}"
FARM_BUILD_DIR="$build_dir" timeout 50 "$root/scripts/farm" run "$root/configs/uav_coverage.yaml" --workers 2 \
  --set "$env_options" --set env.num_envs=4 --set env.num_groups=2 --set ppo.rollout_length=8 \
  --set ppo.num_minibatches=2 --set ppo.update_epochs=2 --set "ppo.hidden_sizes=[32]" --set ppo.encoder=cnn \
  --set batcher.max_rows=64 --set total_env_steps=1200 --set run_dir="$run_dir" --set learner.checkpoint_every=2 \
  --set learner.progress_interval_s=5

python3 - "$run_dir" <<'PY'
import json, os, sys
run = sys.argv[1]
s = json.load(open(os.path.join(run, "summary.json")))
print("summary:", json.dumps(s))
assert s["workers"] == 2, s["workers"]
assert s["protocol_errors"] == 0, s["protocol_errors"]
assert s["updates"] >= 3, s["updates"]
assert s["num_agents"] == 3 and s["num_envs"] == 8, (s["num_agents"], s["num_envs"])
# total_env_steps counts env steps; every env step is 3 agent transitions.
assert s["env_steps"] >= 1200 and s["agent_steps"] == 3 * s["env_steps"], (s["env_steps"], s["agent_steps"])
assert s["episodes"] > 0 and s["mean_return_100"] is not None
rows = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
assert rows and all(r["policy_loss"] is not None and r["value_loss"] is not None for r in rows), rows[-1]
assert all(r["agent_steps"] == 3 * r["env_steps"] for r in rows)
spec = json.load(open(os.path.join(run, "policy_spec.json")))
assert spec["encoder"] == "cnn", spec["encoder"]
assert spec["global_state"]["shape"] == [3, 10, 10], spec["global_state"]
assert spec["observation"]["shape"] == [5, 5, 5], spec["observation"]
PY

# Decentralised execution: farm-eval acts on the agents' own observations with the rebuilt actor.
"$build_dir/tools/farm-eval" "$run_dir" --episodes 4 --envs 2 --set "$env_options" \
  --set env.options.cell_reward=1 --set env.options.collision_penalty=0 > "$run_dir/eval.json"
python3 - "$run_dir/eval.json" <<'PY'
import json, sys
e = json.load(open(sys.argv[1]))
print("eval:", json.dumps(e))
assert e["episodes"] == 4 and e["env"] == "uav_coverage", e
assert 0 <= e["min"] and e["max"] <= 100 - 6 - 3, e  # new cells: at most the free cells beyond the start cells
PY
"$build_dir/tools/farm-export" "$run_dir" "$run_dir/policy.pt"
test -s "$run_dir/policy.pt"
echo "ok: centralised critic + cnn on uav_coverage"
