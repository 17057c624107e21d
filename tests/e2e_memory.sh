#!/usr/bin/env bash
# End to end with memory: one learner and two workers train MemoryCue-v0 (the cue shown only at the first step,
# the rewarded answer `delay` steps later) with a GRU core to >= 95% right answers, and farm-eval's deterministic
# policy, carrying its state from step to step, answers as well; the same settings without a core stay near
# chance (1/choices = 0.5): the learner's per-row states and the update through chunks are what solve it.
# Usage: e2e_memory.sh BUILD_DIR MODE SEED [KEY=VALUE ...]
build_dir="$1" mode="$2" seed="$3"
shift 3
source "$(dirname "$0")/lib.sh"
extra=()
for kv in "$@"; do extra+=(--set "$kv"); done
budget=300000
# lr 1e-3, not 3e-3: at 3e-3 the GRU solves within ~7k steps and then can fall apart, at the next update or later
# (async CI: the window at 0.96 after 11 updates, the final checkpoint's deterministic policy right 53% of the time;
# sync, run on to 300k steps: back to 0.5). At 1e-3 it solves at 6-9k steps (seeds 1-5) and stays at 1.0 to 300k.

train() {  # RUN_DIR [KEY=VALUE ...]
  local run_dir="$1"
  shift
  local sets=()
  for kv in "$@"; do sets+=(--set "$kv"); done
  FARM_BUILD_DIR="$build_dir" "$root/scripts/farm" run "$root/configs/memory_cue.yaml" --workers 2 \
    --set mode="$mode" --set seed="$seed" --set total_env_steps=$budget --set run_dir="$run_dir" \
    --set env.options.delay=6 --set ppo.rollout_length=16 --set ppo.bptt=16 --set ppo.core_size=32 \
    --set "ppo.hidden_sizes=[32]" --set ppo.lr=1e-3 --set learner.checkpoint_every=0 \
    --set learner.progress_interval_s=5 "${extra[@]}" "${sets[@]}"
}

train "$tmp/gru"
"$build_dir/tools/farm-eval" "$tmp/gru" --episodes 200 >"$tmp/gru/eval.json"
train "$tmp/mlp" ppo.core=none stop_at_target=false total_env_steps=100000
python3 - "$tmp" "$budget" <<'PY'
import json, os, sys
tmp, budget = sys.argv[1], int(sys.argv[2])
gru = json.load(open(os.path.join(tmp, "gru", "summary.json")))
mlp = json.load(open(os.path.join(tmp, "mlp", "summary.json")))
ev = json.load(open(os.path.join(tmp, "gru", "eval.json")))
spec = json.load(open(os.path.join(tmp, "gru", "policy_spec.json")))
print("gru:", gru["mean_return_100"], "solved at", gru["solved_at_steps"], "| eval:", ev["mean_return"],
      "| mlp:", mlp["mean_return_100"])
assert spec.get("core") == "gru" and spec.get("core_size") == 32, spec
assert gru["solved_at_steps"] is not None and gru["solved_at_steps"] <= budget, gru["solved_at_steps"]
# solved_at_steps decides. In async mode the episodes that end between the solve and the stop (a batch holds up to
# 32 envs' episodes, each moving a 0/1 mean by 0.01) can lower the final window below the target (0.92 was seen).
assert gru["mean_return_100"] >= 0.85, gru["mean_return_100"]
assert gru["protocol_errors"] == 0 and gru["workers_lost"] == 0
assert ev["episodes"] == 200 and ev["mean_return"] >= 0.95, ev
# Chance is 0.5: a memoryless policy cannot see the cue when it answers.
assert mlp["mean_return_100"] <= 0.7, mlp["mean_return_100"]
print("ok")
PY
