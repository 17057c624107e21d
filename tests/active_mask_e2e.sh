#!/usr/bin/env bash
# End to end, agents that finish before their env ends (docs/ENVIRONMENTS.md, "Agents that finish early"):
#  1. uav_coverage with a battery (a C++ env declaring agents_finish_early): two workers train a few updates; the
#     finished UAVs' rows reach the learner as inactive and are counted as masked, with no protocol error; farm-eval
#     runs the policy on the same env.
#  2. A PettingZoo Parallel env in Python (tests/python/relay_env.py: the scout terminates after 3 steps, the runner
#     goes on to 10): the share of masked rows is exactly the scout's finished steps, 7 of every 20 agent rows, and
#     the team learns it (mean return 6.0 of 6.5; a random team returns 3.25).
# Usage: active_mask_e2e.sh BUILD_DIR
build_dir="$1"
source "$(dirname "$0")/lib.sh"

# 1. C++: 3 UAVs with 15 moves each on a 10 x 10 map, 40-step episodes.
env_options="env.options={agents: 3, grid: 10, obstacles: 6, window: 5, max_steps: 40, battery: 15}"
FARM_BUILD_DIR="$build_dir" timeout 100 "$root/scripts/farm" run "$root/configs/uav_coverage.yaml" --workers 2 \
  --set "$env_options" --set env.num_envs=4 --set env.num_groups=2 --set ppo.rollout_length=16 \
  --set ppo.num_minibatches=2 --set ppo.update_epochs=2 --set "ppo.hidden_sizes=[32]" --set total_env_steps=4000 \
  --set run_dir="$tmp/uav" --set learner.progress_interval_s=5
python3 - "$tmp/uav" <<'PY'
import json, os, sys
run = sys.argv[1]
s = json.load(open(os.path.join(run, "summary.json")))
print("uav summary:", {k: s[k] for k in ("env_steps", "updates", "masked_agent_rows", "protocol_errors", "episodes")})
assert s["protocol_errors"] == 0 and s["workers_lost"] == 0, s
assert s["updates"] >= 10 and s["masked_agent_rows"] > 0, s
rows = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
assert sum(r["masked_rows"] for r in rows) == s["masked_agent_rows"], rows
# A UAV with 15 moves in a 40-step episode is out for part of most episodes, never all of a rollout.
assert 0 < s["masked_agent_rows"] < s["agent_steps"], s
PY
"$build_dir/tools/farm-eval" "$tmp/uav" --episodes 4 --envs 2 --set "$env_options" > "$tmp/eval.json"
python3 -c 'import json,sys; e=json.load(open(sys.argv[1])); print("eval:", e); assert e["episodes"] == 4, e' \
  "$tmp/eval.json"

# 2. Python: the relay team, 2 workers of 8 envs (rollouts of 40 steps: 4 whole episodes per env).
FARM_BUILD_DIR="$build_dir" timeout 150 "$root/scripts/farm" run "$root/configs/cartpole.yaml" --workers 2 \
  --set "env.python=$root/tests/python/relay_env.py:make_env" --set env.num_envs=8 --set env.num_groups=2 \
  --set ppo.rollout_length=40 --set total_env_steps=100000 --set target_return=6.0 --set stop_at_target=true \
  --set run_dir="$tmp/relay" --set learner.progress_interval_s=10
python3 - "$tmp/relay" <<'PY'
import json, os, sys
run = sys.argv[1]
s = json.load(open(os.path.join(run, "summary.json")))
print("relay summary:", {k: s[k] for k in ("env_steps", "updates", "masked_agent_rows", "mean_return_100",
                                           "solved_at_steps", "update_path")})
assert s["protocol_errors"] == 0 and s["num_agents"] == 2, s
assert s["solved_at_steps"] is not None, s
rows = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
masked = sum(r["masked_rows"] for r in rows)
samples = sum(r["samples"] for r in rows)
assert masked == s["masked_agent_rows"] and samples > 0, (masked, s["masked_agent_rows"])
# Each 10-step episode: the scout acts on 3 observations and carries 7 inactive ones; the runner acts on all 10.
assert abs(masked / samples - 0.35) < 1e-9, (masked, samples)
# A rollout with finished agents stays on the fused CPU update (a 0/1 weight per row in its loss).
assert s["update_path"] == "fused", s["update_path"]
PY
echo "ok: agents that finish early, from a C++ and a Python env"
