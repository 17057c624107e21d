#!/usr/bin/env bash
# MemoryCue-v0 (a cue in the first observation only, answered DELAY steps later) learned with the defaults: a config
# that sets only the env, the delay and ppo.core: gru (every other key at its default: the core's rollout of 128
# steps, the whole rollout trained through, lr 1e-3, a core of 64, chrono initialisation). Each delay must reach 95 %
# right in the training window within the default budget, and the trained policy must answer 95 of 100 fresh
# episodes right (farm-eval, deterministic); the start line must say how far back the gradients reach. A memoryless
# policy is right half the time.
# Usage: memory_defaults_test.sh BUILD_DIR DELAY...
build_dir="$1"
shift
source "$(dirname "$0")/lib.sh"
for bin in tools/farm-eval learner/farm-learner worker/farm-worker; do
  [ -x "$build_dir/$bin" ] || fail "$build_dir/$bin is not built"
done
farm=(env FARM_BUILD_DIR="$build_dir" FARM_SKIP_BUILD=1 "$root/scripts/farm")
for delay in "$@"; do
  cat > "$tmp/memory.yaml" <<EOF
name: memory
env:
  name: MemoryCue-v0
  options: {delay: $delay}
ppo:
  core: gru
target_return: 0.95
stop_at_target: true
EOF
  run="$tmp/run-$delay"
  "${farm[@]}" run "$tmp/memory.yaml" --workers 2 --set "run_dir=$run" --set learner.progress_interval_s=10 \
    > "$tmp/train-$delay.log" 2>&1 || { tail -20 "$tmp/train-$delay.log"; fail "delay $delay: training failed"; }
  grep -q "gradients reach back at most 128 steps (ppo.bptt 0: the whole rollout of 128)" "$tmp/train-$delay.log" ||
    fail "delay $delay: the start line does not say how far back the gradients reach"
  "$build_dir/tools/farm-eval" "$run" --episodes 100 > "$tmp/eval-$delay.json" 2> "$tmp/eval-$delay.log" ||
    { cat "$tmp/eval-$delay.log"; fail "delay $delay: farm-eval failed"; }
  python3 - "$run/summary.json" "$tmp/eval-$delay.json" "$delay" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
e = json.loads(open(sys.argv[2]).read().splitlines()[0])
print(f"delay {sys.argv[3]}: solved at {s['solved_at_steps']} env steps, {s['solved_at_seconds']} s; window "
      f"{s['mean_return_100']}; farm-eval {e['mean_return']} over {e['episodes']} episodes")
assert s["solved_at_steps"] is not None, f"not solved within {s['env_steps']} env steps: {s['mean_return_100']}"
assert e["mean_return"] >= 0.95, e
PY
done
echo "ok: MemoryCue learned with the defaults at delays $*"
