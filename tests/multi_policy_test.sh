#!/usr/bin/env bash
# Several policies in one run, end to end: two farm-learners, one per policy, and two Python workers
# (python -m farm_worker --policy ...) stepping tests/python/signals_env.py, whose speaker (observation [3], 3
# actions) and two listeners (observation [2, 5], 5 actions; listener_1 finishes after 6 of 10 steps) have spaces of
# their own. Each learner learns its policy's spaces from the handshake and trains it alone. Passes when each run
# dir holds its own policy (its spec's spaces, its checkpoint), each policy's return beats the uniformly random
# team's by far (speaker: random 3.3, best 10; listeners: random 1.6, best 8), the listeners' learner saw inactive
# rows (listener_1 after it finished), and no protocol error; scripts/farm run and --resume (each policy's value
# normaliser going on from its checkpoint) start such a run from a config's policies; a worker whose patterns leave
# an agent out is refused by name.
# Usage: multi_policy_test.sh BUILD_DIR
set -euo pipefail
build_dir="$(cd "$1" && pwd)"
root="$(cd "$(dirname "$0")/.." && pwd)"
py=/usr/bin/python3
for candidate in ${FARM_PYTHON:-} python3 /usr/bin/python3; do
  if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import zmq, google.protobuf, numpy' 2>/dev/null; then
    py="$candidate"
    break
  fi
done
learner_bin="$build_dir/learner/farm-learner"
[ -x "$learner_bin" ] || { echo "FAIL: $learner_bin not built" >&2; exit 1; }
export PYTHONDONTWRITEBYTECODE=1 FARM_PYTHON_PATH="$build_dir/python"

tmp="$(mktemp -d)"
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
[ -z "${KEEP_TMP:-}" ] || trap - EXIT

# start_learner NAME: a learner for one policy, run dir $tmp/NAME, its endpoint in $tmp/NAME.endpoint.
start_learner() {
  local name="$1"
  "$learner_bin" --config "$root/configs/cartpole.yaml" --set "run_dir=$tmp/$name" --set name="signals-$name" \
    --set total_env_steps=30000 --set ppo.rollout_length=10 --set ppo.lr=0.003 --set learner.min_workers=2 \
    --set learner.progress_interval_s=5 --set learner.checkpoint_every=20 \
    --endpoint-file "$tmp/$name.endpoint" > "$tmp/$name.log" 2>&1 &
  pids+=($!)
  eval "${name}_pid=$!"
}
start_learner talk
start_learner hear
for name in talk hear; do
  for _ in $(seq 600); do [ -s "$tmp/$name.endpoint" ] && break; sleep 0.1; done
  [ -s "$tmp/$name.endpoint" ] || { cat "$tmp/$name.log" >&2; echo "FAIL: the $name learner did not listen" >&2; exit 1; }
done
talk_ep="$(cat "$tmp/talk.endpoint")"
hear_ep="$(cat "$tmp/hear.endpoint")"
echo "learners: talk on $talk_ep, hear on $hear_ep"
worker_pids=()
for i in 0 1; do
  PYTHONPATH="$root/worker/python" "$py" -m farm_worker --env-module "$root/tests/python/signals_env.py:make" \
    --policy talk "$talk_ep" speaker --policy hear "$hear_ep" 'listener_*' --num-envs 8 --groups 2 --seed 3 \
    --index "$i" --give-up-s 60 --stats-file "$tmp/worker-$i.json" > "$tmp/worker-$i.log" 2>&1 &
  pids+=($!)
  worker_pids+=($!)
done
for i in 0 1; do
  rc=0
  wait "${worker_pids[$i]}" || rc=$?
  [ "$rc" -eq 0 ] || { cat "$tmp/worker-$i.log" >&2; echo "FAIL: worker $i exited with status $rc" >&2; exit 1; }
done
# The first learner to reach total_env_steps stops the workers; the other is one step short of it and is stopped
# as the launcher stops it (TERM: a final checkpoint and summary).
for name in talk hear; do
  pid_var="${name}_pid"
  kill -TERM "${!pid_var}" 2>/dev/null || true
  rc=0
  wait "${!pid_var}" || rc=$?
  [ "$rc" -eq 0 ] || [ "$rc" -eq 143 ] || [ "$rc" -eq 130 ] ||
    { tail -n 20 "$tmp/$name.log" >&2; echo "FAIL: the $name learner exited with status $rc" >&2; exit 1; }
done
"$py" - "$tmp" <<'PY'
import glob, json, os, sys
tmp = sys.argv[1]
specs = {}
for name, obs, actions, best, random_return in (("talk", [3], 3, 10.0, 10 / 3), ("hear", [2, 5], 5, 8.0, 1.6)):
    run = os.path.join(tmp, name)
    s = json.load(open(os.path.join(run, "summary.json")))
    spec = json.load(open(os.path.join(run, "policy_spec.json")))
    ckpts = glob.glob(os.path.join(run, "checkpoints", "ckpt-*.pt"))
    print(f"{name}: env steps {s['env_steps']}, agent steps {s['agent_steps']}, mean_return_100 "
          f"{s['mean_return_100']:.2f} (random {random_return:.2f}, best {best:g}), num_agents {s['num_agents']}, "
          f"workers {s['workers']}, protocol errors {s['protocol_errors']}, checkpoints {len(ckpts)}")
    assert spec["observation"]["shape"] == obs and spec["action"]["n"] == actions, spec
    assert s["num_agents"] == (1 if name == "talk" else 2) and s["protocol_errors"] == 0 and s["workers"] == 2, s
    assert s["env_steps"] >= 25000 and ckpts, s
    assert s["mean_return_100"] >= 0.8 * best, (name, s["mean_return_100"])
    specs[name] = s
# listener_1 is inactive for 4 of every 10 steps: the listeners' learner masked its rows.
hear = specs["hear"]
print("masked agent rows: talk", specs["talk"]["masked_agent_rows"], "hear", hear["masked_agent_rows"])
# listener_1 sits out steps 7-10 of each episode: 4 of the policy's 20 rows per episode (give or take the episodes
# in flight at the end).
assert abs(hear["masked_agent_rows"] / hear["agent_steps"] - 0.2) < 0.02 and specs["talk"]["masked_agent_rows"] == 0
for i in (0, 1):
    w = json.load(open(os.path.join(tmp, f"worker-{i}.json")))
    assert set(w["policies"]) == {"talk", "hear"}, w
    steps = {n: p["env_steps"] for n, p in w["policies"].items()}
    assert steps["talk"] == steps["hear"] > 0, steps  # every env step is both policies'
print("ok: two policies of different spaces trained by their own learners")
PY
# The same kind of run from a config with policies, as users start it, from a project folder of their own (the
# env's file beside the config, named relative to it; started from another directory): scripts/farm run starts one
# learner per policy (run directories RUN/talk and RUN/hear, the listeners' network from its own `set`) and the
# workers; the run directory is then moved, and --resume from where it is now continues both policies from their
# checkpoints.
mkdir -p "$tmp/project" "$tmp/elsewhere"
cp "$root/tests/python/signals_env.py" "$tmp/project/"
cat > "$tmp/project/signals.yaml" <<EOF
name: signals
seed: 2
total_env_steps: 20000
run_dir: $tmp/first_place
env:
  python: signals_env.py:make
  num_envs: 8
  num_groups: 2
learner: {min_workers: 2, checkpoint_every: 20, progress_interval_s: 5}
ppo: {rollout_length: 10, lr: 0.003, value_norm: running}
policies:
  - {name: talk, agents: [speaker]}
  - {name: hear, agents: ["listener_*"], set: ["ppo.hidden_sizes=[32]", "ppo.value_norm=popart"]}
EOF
export FARM_SKIP_BUILD=1 FARM_BUILD_DIR="$build_dir"
rc=0
(cd "$tmp/elsewhere" && "$root/scripts/farm" run ../project/signals.yaml --workers 2 --set "env.python_interpreter=$py") \
  > "$tmp/farm_run.log" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || { tail -n 30 "$tmp/farm_run.log" >&2; echo "FAIL: scripts/farm run with policies: status $rc" >&2; exit 1; }
mv "$tmp/first_place" "$tmp/farm_run"
for name in talk hear; do wc -l < "$tmp/farm_run/$name/metrics.jsonl" > "$tmp/$name.rows_before"; done
rc=0
(cd "$tmp/elsewhere" && "$root/scripts/farm" run --resume ../farm_run --workers 2 --set total_env_steps=30000) \
  > "$tmp/farm_resume.log" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || { tail -n 30 "$tmp/farm_resume.log" >&2; echo "FAIL: scripts/farm run --resume with policies: status $rc" >&2; exit 1; }
"$py" - "$tmp" <<'PY'
import json, os, re, sys
tmp = sys.argv[1]
run = os.path.join(tmp, "farm_run")
assert not os.path.exists(os.path.join(tmp, "first_place")), "resumed where the run was, not where it is"
recorded = open(os.path.join(run, "config.yaml")).read()
assert "policies:" in recorded and f'python: "{tmp}/project/signals_env.py:make"' in recorded, recorded
resume_log = open(os.path.join(tmp, "farm_resume.log")).read()
for name, best, hidden in (("talk", 10.0, "[64, 64]"), ("hear", 8.0, "[32]")):
    s = json.load(open(os.path.join(run, name, "summary.json")))
    config = open(os.path.join(run, name, "config.yaml")).read()
    print(f"scripts/farm run, policy {name}: env steps {s['env_steps']}, mean_return_100 {s['mean_return_100']:.2f}")
    assert f"hidden_sizes: {hidden}" in config and f'run_dir: "{run}/{name}"' in config, config
    assert s["env_steps"] >= 29000 and s["protocol_errors"] == 0 and s["mean_return_100"] >= 0.8 * best, s
    # Resumed from its own checkpoint (about 20k env steps), not started over.
    m = re.search(rf"resumed {re.escape(run)}/{name}/checkpoints/ckpt-\d+\.pt: (\d+) env steps", resume_log)
    assert m and int(m.group(1)) >= 19000, (name, m and m.group(0))
    # Each policy's value normaliser (talk: running, hear: popart) went on from its checkpoint: the resumed run's
    # first update folds one batch into the saved statistics, where statistics started afresh would be that
    # batch's alone (the returns grow from about 3 to 10 and 8 over the run).
    spec = json.load(open(os.path.join(run, name, "policy_spec.json")))
    assert spec.get("value_norm") is True, spec
    rows = [json.loads(line) for line in open(os.path.join(run, name, "metrics.jsonl"))]
    n = int(open(os.path.join(tmp, f"{name}.rows_before")).read())
    first, last_before, first_after = rows[0], rows[n - 1], rows[n]
    print(f"  value_norm_mean {first['value_norm_mean']:.2f} -> {last_before['value_norm_mean']:.2f}, resumed at "
          f"{first_after['value_norm_mean']:.2f}; explained variance after resuming "
          f"{first_after['explained_variance']:.2f}")
    assert last_before["value_norm_mean"] > first["value_norm_mean"] > 0, (first, last_before)
    assert abs(first_after["value_norm_mean"] - last_before["value_norm_mean"]) < \
        0.1 * last_before["value_norm_mean"], (last_before["value_norm_mean"], first_after["value_norm_mean"])
print("ok: scripts/farm run and --resume with policies and their value normalisers")
PY
# farm-eval on the run serves every policy's checkpoint to one worker and reports each policy's return (both at
# their best: the speaker 10, the listeners 8); on one policy's directory it refuses, naming the run to evaluate.
"$build_dir/tools/farm-eval" "$tmp/farm_run" --episodes 40 --envs 8 > "$tmp/eval.json" 2> "$tmp/eval.log" ||
  { cat "$tmp/eval.log" >&2; echo "FAIL: farm-eval of the run with policies" >&2; exit 1; }
"$py" - "$tmp/eval.json" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
print("farm-eval:", [(r["policy"], r["episodes"], r["mean_return"]) for r in rows])
assert [r["policy"] for r in rows] == ["talk", "hear"], rows
assert all(r["episodes"] == 40 and r["actions"] == "deterministic" for r in rows), rows
assert rows[0]["mean_return"] == 10.0 and rows[1]["mean_return"] == 8.0, rows
assert rows[0]["env_steps_trained"] >= 29000, rows
PY
# --policy-set: the listeners act uniformly at random (learner.random_actions) beside the trained speaker.
"$build_dir/tools/farm-eval" "$tmp/farm_run" --episodes 40 --envs 8 --policy-set hear:learner.random_actions=true \
  > "$tmp/eval_random.json" 2> "$tmp/eval.log" ||
  { cat "$tmp/eval.log" >&2; echo "FAIL: farm-eval --policy-set" >&2; exit 1; }
"$py" - "$tmp/eval_random.json" <<'PY'
import json, sys
rows = {r["policy"]: r for r in (json.loads(line) for line in open(sys.argv[1]) if line.strip())}
print("farm-eval, random listeners:", {k: r["mean_return"] for k, r in rows.items()})
assert rows["talk"]["mean_return"] == 10.0 and rows["hear"]["mean_return"] < 3.0, rows  # random: 1.6
PY
rc=0
"$build_dir/tools/farm-eval" "$tmp/farm_run/talk" --episodes 5 > "$tmp/eval.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] && grep -F "is one policy of a run with several policies (2 of them)" "$tmp/eval.log" >/dev/null ||
  { cat "$tmp/eval.log" >&2; echo "FAIL: farm-eval of one policy's directory: expected a refusal" >&2; exit 1; }
echo "ok: farm-eval evaluates every policy of the run, and refuses one policy's directory"
# An agent no policy claims is refused by name, before any learner is asked.
rc=0
PYTHONPATH="$root/worker/python" "$py" -m farm_worker --env-module "$root/tests/python/signals_env.py:make" \
  --policy talk tcp://127.0.0.1:1 speaker --policy hear tcp://127.0.0.1:2 listener_0 --num-envs 2 \
  > "$tmp/refused.log" 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -F "'listener_1' belongs to no policy" "$tmp/refused.log" >/dev/null ||
  { cat "$tmp/refused.log" >&2; echo "FAIL: expected a refusal naming listener_1 (status 2, got $rc)" >&2; exit 1; }
echo "ok: an agent without a policy is refused by name"
