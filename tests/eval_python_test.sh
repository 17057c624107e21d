#!/usr/bin/env bash
# `scripts/farm eval` on a Python env's run (env.python): farm-eval serves the run's policy with
# `farm-learner --serve` (learner.eval_episodes) to one farm-worker running the Python env, and prints the same
# JSON line as for a C++ env. Trains tests/python/cue_env.py (a 10-step bandit, max return 10, uniform 5) until
# solved, then: 20 deterministic episodes near the max; --sample says so; a Python env that raises fails with
# its error and a non-zero status; SIGTERM to farm-eval mid-evaluation; no process left behind in either case.
# Usage: eval_python_test.sh BUILD_DIR
build_dir="$1"
source "$(dirname "$0")/lib.sh"
py="$(farm_python)"
for bin in tools/farm-eval learner/farm-learner worker/farm-worker; do
  [ -x "$build_dir/$bin" ] || fail "$build_dir/$bin is not built"
done
farm=(env FARM_BUILD_DIR="$build_dir" FARM_SKIP_BUILD=1 "$root/scripts/farm")
# A marker no other process has: the env modules below are copies named after it, so that pgrep -f finds every
# process of this test's evaluations (the learner and worker get env.python on their command lines).
marker="evalpy$$x$RANDOM"
cp "$root/tests/python/cue_env.py" "$tmp/cue_$marker.py"
printf 'def make():\n    raise RuntimeError("%s: this env cannot be built")\n' "$marker" > "$tmp/boom_$marker.py"
leftover() { pgrep -f "$marker" > /dev/null; }
no_leftover() { ! leftover; }

"${farm[@]}" run "$root/configs/cartpole.yaml" --workers 1 --set "env.python=$root/tests/python/cue_env.py:make" \
  --set "env.python_interpreter=$py" --set env.num_envs=8 --set env.num_groups=2 --set total_env_steps=60000 \
  --set target_return=9.5 --set stop_at_target=true --set "run_dir=$tmp/run" --set learner.progress_interval_s=100 \
  > "$tmp/train.log" 2>&1 || { tail -20 "$tmp/train.log"; fail "training the Python env failed"; }

# 1. Deterministic, 20 episodes over 6 envs (quotas 4,4,3,3,3,3).
"${farm[@]}" eval "$tmp/run" --episodes 20 --envs 6 --seed 3 --set "env.python=$tmp/cue_$marker.py:make" \
  > "$tmp/det.json" 2> "$tmp/det.log" || { cat "$tmp/det.log"; fail "farm eval on the Python env's run failed"; }
wait_until 10 no_leftover || fail "processes left after an evaluation: $(pgrep -af "$marker")"
# 2. Sampled.
"${farm[@]}" eval "$tmp/run" --episodes 10 --envs 2 --sample --set "env.python=$tmp/cue_$marker.py:make" \
  > "$tmp/sample.json" 2> "$tmp/sample.log" || { cat "$tmp/sample.log"; fail "farm eval --sample failed"; }
grep -q "farm-eval: " "$tmp/det.log" || fail "no human line on stderr: $(cat "$tmp/det.log")"
"$py" - "$tmp" <<'PY'
import json, os, sys
tmp = sys.argv[1]
train = json.load(open(os.path.join(tmp, "run", "summary.json")))
for name, n, actions in (("det", 20, "deterministic"), ("sample", 10, "sampled")):
    lines = open(os.path.join(tmp, name + ".json")).read().splitlines()
    assert len(lines) == 1, f"{name}: one JSON line expected, got {lines!r}"
    r = json.loads(lines[0])
    print(name, json.dumps(r))
    keys = ["episodes", "mean_return", "std_return", "min", "max", "mean_length", "checkpoint", "env_steps_trained",
            "env", "seed", "actions"]
    assert list(r) == keys, list(r)
    assert r["episodes"] == n and r["actions"] == actions, r
    assert r["mean_length"] == 10, r  # every cue episode is 10 steps
    assert r["env_steps_trained"] == train["env_steps"], (r, train["env_steps"])
    assert r["env"], r
print("trained: mean_return_100", train["mean_return_100"], "solved at", train["solved_at_steps"])
det = json.loads(open(os.path.join(tmp, "det.json")).read())
assert train["solved_at_steps"] is not None, train
# Solved at 9.5 while sampling: acting with the mode does at least about as well.
assert det["mean_return"] >= 9.0, det
assert det["seed"] == 3, det
PY

# 3. A Python env that raises: the error, a non-zero status, nothing left running.
rc=0
"${farm[@]}" eval "$tmp/run" --episodes 5 --set "env.python=$tmp/boom_$marker.py:make" > "$tmp/boom.json" \
  2> "$tmp/boom.log" || rc=$?
cat "$tmp/boom.log"
[ "$rc" -ne 0 ] || fail "farm eval on an env that raises exited 0"
[ ! -s "$tmp/boom.json" ] || fail "farm eval printed a result for an env that raises: $(cat "$tmp/boom.json")"
grep -q "this env cannot be built" "$tmp/boom.log" || fail "the env's error is not in farm-eval's message"
wait_until 10 no_leftover || fail "processes left after a failed evaluation: $(pgrep -af "$marker")"

# --video films a MuJoCo env that farm-eval steps itself: a Python env's run is refused by name, nothing started.
rc=0
"$build_dir/tools/farm-eval" "$tmp/run" --episodes 1 --video "$tmp/cue.gif" --set "env.python=$tmp/cue_$marker.py:make" \
  > /dev/null 2> "$tmp/video.log" || rc=$?
cat "$tmp/video.log"
[ "$rc" -ne 0 ] || fail "farm-eval --video on a Python env's run exited 0"
grep -q "is a Python env" "$tmp/video.log" || fail "farm-eval --video did not say why it refused"
[ ! -e "$tmp/cue.gif" ] && [ ! -e "$tmp/cue.csv" ] || fail "farm-eval --video wrote files for a Python env"

# 4. SIGTERM to farm-eval while it evaluates (many episodes): it stops both children and exits non-zero.
"$build_dir/tools/farm-eval" "$tmp/run" --episodes 1000000 --envs 2 --set "env.python=$tmp/cue_$marker.py:make" \
  > "$tmp/term.json" 2> "$tmp/term.log" &
eval_pid=$!
pids+=("$eval_pid")
worker_python() { pgrep -f "farm_worker.*$marker" > /dev/null; }
wait_until 60 worker_python || { cat "$tmp/term.log"; fail "the evaluation's Python worker did not start"; }
kill -TERM "$eval_pid"
rc=0
wait "$eval_pid" || rc=$?
cat "$tmp/term.log"
[ "$rc" -ne 0 ] || fail "farm-eval exited 0 after SIGTERM"
grep -q "SIGTERM" "$tmp/term.log" || fail "farm-eval did not say it was stopped by SIGTERM"
wait_until 10 no_leftover || fail "processes left after SIGTERM: $(pgrep -af "$marker")"
echo "ok: Python env runs evaluated (deterministic and sampled), failures and SIGTERM leave nothing running"
