#!/usr/bin/env bash
# ppo.value_norm end to end: CartPole with PopArt trains on the LibTorch update (the fused one falls back), its
# metrics carry the statistics, policy_spec.json says value_norm, --resume continues from the statistics the
# checkpoint holds (not from scratch), and farm-eval rebuilds the policy with them.
# Usage: value_norm_e2e.sh BUILD_DIR
build_dir="$1"
source "$(dirname "$0")/lib.sh"
export FARM_BUILD_DIR="$build_dir" FARM_SKIP_BUILD=1
run="$tmp/run"
"$root/scripts/farm" run "$root/configs/cartpole.yaml" --workers 1 --set "run_dir=$run" --set total_env_steps=20000 \
  --set stop_at_target=false --set ppo.value_norm=popart --set learner.checkpoint_every=5 \
  --set learner.progress_interval_s=100 > "$tmp/log" 2>&1 || { tail -30 "$tmp/log"; fail "the run failed"; }
grep -q '"value_norm": true' "$run/policy_spec.json" || fail "policy_spec.json does not say value_norm"
before="$(wc -l < "$run/metrics.jsonl")"
"$root/scripts/farm" run --resume "$run" --set total_env_steps=30000 > "$tmp/log2" 2>&1 ||
  { tail -30 "$tmp/log2"; fail "--resume failed"; }
python3 - "$run/metrics.jsonl" "$run/summary.json" "$before" <<'PY' || fail "the statistics did not go on from the checkpoint"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
summary = json.load(open(sys.argv[2]))
n = int(sys.argv[3])
assert summary["update_path"] == "libtorch", summary["update_path"]
assert all("value_norm_mean" in r and "value_norm_std" in r for r in rows), rows[0].keys()
first, last_before, first_after = rows[0], rows[n - 1], rows[n]
# CartPole's returns are positive and grow: the mean follows them.
assert first["value_norm_mean"] > 0 and last_before["value_norm_mean"] > first["value_norm_mean"], (first, last_before)
# The resumed run's first update folds one batch into the saved statistics: it moves them a little, where statistics
# started afresh would be that batch's alone.
assert abs(first_after["value_norm_mean"] - last_before["value_norm_mean"]) < 0.2 * last_before["value_norm_mean"], \
    (last_before["value_norm_mean"], first_after["value_norm_mean"])
assert first_after["explained_variance"] > 0.2, first_after["explained_variance"]
print(f"value_norm_mean {first['value_norm_mean']:.1f} -> {last_before['value_norm_mean']:.1f}; "
      f"resumed at {first_after['value_norm_mean']:.1f}, explained variance {first_after['explained_variance']:.2f}")
PY
"$build_dir/tools/farm-eval" "$run" --episodes 4 > "$tmp/eval.json" || fail "farm-eval could not rebuild the policy"
echo "ok: value_norm trained, resumed and evaluated"
