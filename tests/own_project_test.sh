#!/usr/bin/env bash
# A researcher's own project, kept outside the checkout: my_env.py (tests/python/cue_env.py, a 10-step bandit, max
# return 10, uniform 5) beside my.yaml (env.python: my_env.py:make), trained with scripts/farm started from another
# directory. From a third directory and the run directory alone: scripts/farm eval (a served learner and a Python
# worker), train --resume (runs on to a larger budget), export. Then the run directory moved to another folder
# (the project kept), then the whole project folder moved with the run inside it: eval and --resume again. A
# second run starting from the first (learner.init_from: a relative path) resumed from elsewhere; a module name
# (env.python: my_envs.cue:make, a package in the project) evaluated from elsewhere; and the env's file gone: the
# message names each place tried and the key to set, and nothing is left running.
# Usage: own_project_test.sh BUILD_DIR
build_dir="$1"
source "$(dirname "$0")/lib.sh"
py="$(farm_python)"
for bin in tools/farm-eval tools/farm-export learner/farm-learner worker/farm-worker; do
  [ -x "$build_dir/$bin" ] || fail "$build_dir/$bin is not built"
done
farm=(env FARM_BUILD_DIR="$build_dir" FARM_SKIP_BUILD=1 "$root/scripts/farm")
proj="$tmp/proj"
mkdir -p "$proj/my_envs" "$tmp/other" "$tmp/third" "$tmp/moved"
cp "$root/tests/python/cue_env.py" "$proj/my_env.py"
cp "$root/tests/python/cue_env.py" "$proj/my_envs/cue.py"
: > "$proj/my_envs/__init__.py"
cat > "$proj/my.yaml" <<EOF
name: my
seed: 1
total_env_steps: 24000
env:
  python: my_env.py:make
  python_interpreter: $py
  num_envs: 8
  num_groups: 2
learner:
  progress_interval_s: 100
ppo:
  rollout_length: 32
  lr: 1.0e-3
EOF
# The run directory's recorded env (env.python_found) and run_dir.
recorded() { grep -E "^(run_dir|  python_found):" "$1/config.yaml" || true; }
# eval RUN_DIR NAME: 10 deterministic episodes from $tmp/third; the JSON line in $tmp/NAME.json.
evaluate() {
  (cd "$tmp/third" && "${farm[@]}" eval "$1" --episodes 10 --envs 2 > "$tmp/$2.json" 2> "$tmp/$2.log") ||
    { cat "$tmp/$2.log"; fail "$2: scripts/farm eval $1 from another directory failed"; }
  "$py" - "$tmp/$2.json" "$2" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).read().splitlines()[0])
print(sys.argv[2], "mean return", r["mean_return"], "after", r["env_steps_trained"], "env steps")
assert r["episodes"] == 10 and r["mean_length"] == 10, r
assert r["mean_return"] >= 8.0, r  # trained: a uniform policy averages 5
PY
}
# resume RUN_DIR STEPS NAME: scripts/farm run --resume from $tmp/third, on to STEPS env steps.
resume() {
  (cd "$tmp/third" && "${farm[@]}" run --resume "$1" --workers 1 --set "total_env_steps=$2" > "$tmp/$3.log" 2>&1) ||
    { tail -20 "$tmp/$3.log"; fail "$3: scripts/farm run --resume $1 from another directory failed"; }
  "$py" - "$1/summary.json" "$2" "$3" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(sys.argv[3], "resumed to", s["env_steps"], "env steps, workers lost", s["workers_lost"])
assert s["env_steps"] >= int(sys.argv[2]), s
PY
}

# 1. Trained from another directory: env.python is found beside the config; the run records where.
run1="$proj/runs/first"
(cd "$tmp/other" && "${farm[@]}" run ../proj/my.yaml --workers 1 --set "run_dir=$run1" > "$tmp/train.log" 2>&1) ||
  { tail -20 "$tmp/train.log"; fail "training the project's env from another directory failed"; }
grep -q "python_found: \"$proj/my_env.py\"" "$run1/config.yaml" ||
  fail "config.yaml does not record where the env was found: $(recorded "$run1")"
grep -q "run_dir: \"$run1\"" "$run1/config.yaml" || fail "config.yaml does not record the run directory: $(recorded "$run1")"

# 2. From a third directory, with the run directory alone: eval, export, resume.
evaluate "$run1" eval1
(cd "$tmp/third" && "${farm[@]}" export "$run1" "$tmp/policy.pt" > "$tmp/export.log" 2>&1) ||
  { cat "$tmp/export.log"; fail "scripts/farm export from another directory failed"; }
[ -s "$tmp/policy.pt" ] || fail "export wrote no file"
resume "$run1" 32000 resume1

# 3. The run directory moved to another folder (the project stays): the recorded path.
mv "$run1" "$tmp/moved/first"
evaluate "$tmp/moved/first" eval_moved
mv "$tmp/moved/first" "$run1"

# 4. The project folder moved with the run inside it: the recorded path is gone; the same place relative to the
# run directory is found.
mv "$proj" "$tmp/proj2"
proj="$tmp/proj2"
run1="$proj/runs/first"
evaluate "$run1" eval_project_moved
resume "$run1" 40000 resume_project_moved
grep -q "python_found: \"$proj/my_env.py\"" "$run1/config.yaml" ||
  fail "a resume after the move does not record where the env is now: $(recorded "$run1")"

# 5. A second run from the first (learner.init_from relative to the project, found beside the config), resumed
# from elsewhere: the record holds the absolute path.
cat > "$proj/second.yaml" <<EOF
name: second
total_env_steps: 8000
env: {python: my_env.py:make, python_interpreter: $py, num_envs: 8, num_groups: 2}
learner: {init_from: runs/first, progress_interval_s: 100}
ppo: {rollout_length: 32, lr: 1.0e-3}
EOF
run2="$proj/runs/second"
(cd "$tmp/other" && "${farm[@]}" run "$proj/second.yaml" --workers 1 --set "run_dir=$run2" > "$tmp/second.log" 2>&1) ||
  { tail -20 "$tmp/second.log"; fail "a run with learner.init_from relative to its config failed"; }
grep -q "init_from: \"$run1\"" "$run2/config.yaml" || fail "init_from not recorded as absolute: $(grep init_from "$run2/config.yaml")"
resume "$run2" 12000 resume_second

# 6. A module name: a package of the project, trained from the project folder (Python imports it from there),
# evaluated from elsewhere through the recorded sys.path folder.
run3="$proj/runs/module"
(cd "$proj" && "${farm[@]}" run my.yaml --workers 1 --set env.python=my_envs.cue:make --set "run_dir=$run3" \
  > "$tmp/module.log" 2>&1) || { tail -20 "$tmp/module.log"; fail "training a module name from the project failed"; }
grep -q "python_found: \"$proj\"" "$run3/config.yaml" ||
  fail "config.yaml does not record the module's sys.path folder: $(recorded "$run3")"
evaluate "$run3" eval_module

# 7. The env's file gone: eval and --resume stop, naming every place tried and the key to set; nothing left.
rm "$proj/my_env.py"
rc=0
(cd "$tmp/third" && "${farm[@]}" eval "$run1" --episodes 5 > "$tmp/gone.json" 2> "$tmp/gone.log") || rc=$?
cat "$tmp/gone.log"
[ "$rc" -ne 0 ] || fail "eval of a run whose env file is gone exited 0"
grep -q "env.python: file 'my_env.py' not found (looked for $proj/my_env.py," "$tmp/gone.log" ||
  fail "the message does not name the recorded place first"
grep -q -- "--set env.python=/path/to/my_env.py:make" "$tmp/gone.log" || fail "the message does not say what to set"
rc=0
(cd "$tmp/third" && "${farm[@]}" run --resume "$run1" --workers 1 --set total_env_steps=60000 > "$tmp/gone_resume.log" 2>&1) ||
  rc=$?
[ "$rc" -ne 0 ] || fail "--resume of a run whose env file is gone exited 0"
grep -q "nothing started" "$tmp/gone_resume.log" || { cat "$tmp/gone_resume.log"; fail "--resume started processes"; }
no_learner() { ! pgrep -f "farm-learner.*$proj" > /dev/null; }
wait_until 10 no_learner || fail "a learner is left running: $(pgrep -af "farm-learner.*$proj")"
echo "ok: a project outside the checkout is evaluated, exported and resumed from its run directory alone, moved too"
