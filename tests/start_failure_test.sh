#!/usr/bin/env bash
# What the learner leaves behind when a run cannot start or goes wrong (and, on the way, the learning-rate
# schedule of a good run):
#  1. a --resume that fails (the checkpoint does not fit the config) exits non-zero and leaves the run
#     directory byte for byte as it was (checkpoints, latest, config.yaml, policy_spec.json, summary.json,
#     metrics.jsonl; only a TensorBoard event file is added);
#  2. a new run in a directory that holds another run's checkpoints is refused before it writes anything;
#  3. a learner.init_from that cannot be loaded is refused at start-up, before the run directory exists;
#  4. a diverged update (Pendulum at lr 1e30: a few Adam steps make the Gaussian mean ~1e31, whose squared error overflows float32: at 1e4 and at 1e8 the gSDE config stayed finite for over 230k steps in fresh-clone CI runs) exits non-zero, and no checkpoint holds non-finite weights:
#     farm-eval of the run's latest checkpoint returns finite numbers.
# Usage: start_failure_test.sh BUILD_DIR
build_dir="$(cd "$1" && pwd)"
source "$(dirname "$0")/lib.sh"
learner_bin="$build_dir/learner/farm-learner"
worker_bin="$build_dir/worker/farm-worker"
endpoint="tcp://127.0.0.1:$(free_port)"

# run_farm CONFIG RUN_DIR [--set k=v ...]: a learner and one worker to the end; the learner's status is echoed.
run_farm() {
  local config="$1" run="$2" rc=0
  shift 2
  "$learner_bin" --config "$config" --set "transport.bind=$endpoint" --set "run_dir=$run" \
    --set learner.progress_interval_s=100 "$@" > "$tmp/learner.log" 2>&1 &
  local learner=$!
  pids+=("$learner")
  timeout 120 "$worker_bin" --config "$config" --learner "$endpoint" "$@" > "$tmp/worker.log" 2>&1 &
  pids+=($!)
  wait "$learner" || rc=$?
  wait "${pids[-1]}" 2>/dev/null || true
  echo "$rc"
}
snapshot() { (cd "$1" && find . -type f ! -path './tb/*' -print0 | sort -z | xargs -0 sha256sum); }

# --- 1. a failed --resume ------------------------------------------------------------------------
run="$tmp/done"
rc=$(run_farm "$root/configs/cartpole.yaml" "$run" --set total_env_steps=3000 --set stop_at_target=false \
  --set learner.checkpoint_every=2)
[ "$rc" -eq 0 ] || { tail -20 "$tmp/learner.log"; fail "the first run failed ($rc)"; }
# On the way: ppo.anneal_lr as CleanRL's, from the full rate at the first update down to lr / updates at the
# last (the schedule's progress is the env steps before each rollout), never 0.
python3 - "$run/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
lrs = [r["learning_rate"] for r in rows]
steps = [r["env_steps"] for r in rows]
assert abs(lrs[0] - 1e-3) < 1e-12, lrs[:3]
for i in range(1, len(rows)):
    assert abs(lrs[i] - 1e-3 * (1 - steps[i - 1] / 3000)) < 1e-9, (i, lrs[i], steps[i - 1])
assert lrs[-1] > 0, lrs
print(f"ok: learning rate {lrs[0]:g} -> {lrs[-1]:g} over {len(lrs)} updates")
PY
before="$(snapshot "$run")"
"$learner_bin" --resume "$run" --set "transport.bind=$endpoint" --set "ppo.hidden_sizes=[32]" \
  --set total_env_steps=6000 > "$tmp/resume.log" 2>&1 &
learner=$!
pids+=("$learner")
timeout 60 "$worker_bin" --config "$root/configs/cartpole.yaml" --learner "$endpoint" > "$tmp/worker.log" 2>&1 || true
rc=0
wait "$learner" || rc=$?
[ "$rc" -ne 0 ] || { tail -20 "$tmp/resume.log"; fail "a failed resume exited 0"; }
grep -q "could not resume\|resume failed" "$tmp/resume.log" || { tail -20 "$tmp/resume.log"; fail "no reason given"; }
after="$(snapshot "$run")"
[ "$before" = "$after" ] || { diff <(echo "$before") <(echo "$after") || true; fail "the failed resume changed the run"; }
echo "ok: a failed resume exits $rc and leaves the run directory as it was"

# --- 2. a new run in a directory with checkpoints --------------------------------------------------
rc=0
"$learner_bin" --config "$root/configs/cartpole.yaml" --set "run_dir=$run" --set "transport.bind=$endpoint" \
  > "$tmp/fresh.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] || fail "a new run over old checkpoints was started"
grep -q "already holds another run's checkpoints" "$tmp/fresh.log" || { cat "$tmp/fresh.log"; fail "no reason given"; }
[ "$before" = "$(snapshot "$run")" ] || fail "the refused run changed the directory"
echo "ok: $(tail -1 "$tmp/fresh.log")"

# --- 3. learner.init_from that cannot be loaded --------------------------------------------------
rc=0
"$learner_bin" --config "$root/configs/cartpole.yaml" --set "run_dir=$tmp/never" \
  --set "learner.init_from=$tmp/nonexistent" --set "transport.bind=$endpoint" > "$tmp/init.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] || fail "a missing learner.init_from was accepted"
grep -q "learner.init_from" "$tmp/init.log" || { cat "$tmp/init.log"; fail "the message does not name learner.init_from"; }
[ ! -e "$tmp/never" ] || fail "a run directory was created for a run that cannot start"
echo "ok: $(tail -1 "$tmp/init.log")"

# --- 4. a diverged update ------------------------------------------------------------------------
run="$tmp/diverged"
rc=$(run_farm "$root/configs/pendulum.yaml" "$run" --set ppo.lr=1e30 --set ppo.anneal_lr=false \
  --set learner.checkpoint_every=1 --set total_env_steps=400000 --set stop_at_target=false)
[ "$rc" -ne 0 ] || { tail -20 "$tmp/learner.log"; fail "a diverged run exited 0"; }
grep -q "non-finite" "$tmp/learner.log" || { tail -20 "$tmp/learner.log"; fail "the divergence was not reported"; }
if [ -f "$run/checkpoints/latest" ]; then
  "$build_dir/tools/farm-eval" "$run" --episodes 2 --envs 2 > "$tmp/eval.json" 2> "$tmp/eval.log" ||
    { cat "$tmp/eval.log"; fail "farm-eval failed on the diverged run's latest checkpoint"; }
  # farm-eval's JSON writes a NaN as null: every number must be there and finite.
  python3 - "$tmp/eval.json" <<'PY' || { cat "$tmp/eval.json"; fail "the latest checkpoint holds non-finite weights"; }
import json, math, sys
e = json.load(open(sys.argv[1]))
for key in ("mean_return", "std_return", "min", "max", "mean_length"):
    assert isinstance(e[key], (int, float)) and math.isfinite(e[key]), (key, e[key])
PY
  echo "ok: diverged at $(grep -c . "$run/metrics.jsonl") updates; latest $(cat "$run/checkpoints/latest") evaluates to $(cat "$tmp/eval.json")"
else
  echo "ok: diverged before any checkpoint; none written"
fi
