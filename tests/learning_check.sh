#!/usr/bin/env bash
# A short learning check, so that a regression in PPO shows in CI at once: trains a shipped config as it is
# (seed 1, two workers) for a shorter step budget than its own (the learning rate annealed over it), requires
# the final 100-episode mean to reach a lower bar than the config's target, then evaluates the final policy
# with farm-eval (deterministic, 50 episodes) against a second bar. The full targets (3 seeds, the references'
# budgets) are scripts/farm bench --cases learning's.
# Usage: learning_check.sh BUILD_DIR CONFIG TRAIN_BAR STEP_BUDGET EVAL_BAR [KEY=VALUE ...]
build_dir="$1" config="$2" train_bar="$3" budget="$4" eval_bar="$5"
shift 5
source "$(dirname "$0")/lib.sh"
extra=()
for kv in "$@"; do extra+=(--set "$kv"); done
run_dir="$tmp/run"

start=$SECONDS
FARM_BUILD_DIR="$build_dir" "$root/scripts/farm" run "$root/$config" --workers 2 --set seed=1 \
  --set target_return="$train_bar" --set stop_at_target=false --set total_env_steps="$budget" \
  --set run_dir="$run_dir" --set learner.progress_interval_s=5 "${extra[@]}"
"$build_dir/tools/farm-eval" "$run_dir" --episodes 50 >"$tmp/eval.json"

python3 - "$run_dir/summary.json" "$tmp/eval.json" "$train_bar" "$budget" "$eval_bar" "$((SECONDS - start))" <<'PY'
import json, sys
s, e = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
train_bar, budget, eval_bar, took = float(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), sys.argv[6]
print(f"{s['env']}: 100-episode mean {s['mean_return_100']} at {s['env_steps']} env steps, solved at "
      f"{s['solved_at_steps']} steps ({s['solved_at_seconds']} s); eval {e['mean_return']:.1f} +- "
      f"{e['std_return']:.1f} over {e['episodes']} episodes; {took} s in all")
assert s["env_steps"] >= budget, s["env_steps"]
assert s["mean_return_100"] is not None and s["mean_return_100"] >= train_bar, \
    f"the final 100-episode mean {s['mean_return_100']} is below {train_bar} after {budget} env steps"
assert e["episodes"] == 50, e
assert e["mean_return"] >= eval_bar, f"farm-eval's mean {e['mean_return']:.1f} is below {eval_bar}"
print("ok")
PY
