#!/usr/bin/env bash
# Several policies in one run, end to end: two farm-learners, one per policy, and two Python workers
# (python -m farm_worker --policy ...) stepping tests/python/signals_env.py, whose speaker (observation [3], 3
# actions) and two listeners (observation [2, 5], 5 actions; listener_1 finishes after 6 of 10 steps) have spaces of
# their own. Each learner learns its policy's spaces from the handshake and trains it alone. Passes when each run
# dir holds its own policy (its spec's spaces, its checkpoint), each policy's return beats the uniformly random
# team's by far (speaker: random 3.3, best 10; listeners: random 1.6, best 8), the listeners' learner saw inactive
# rows (listener_1 after it finished), and no protocol error; then a worker whose patterns leave an agent out is
# refused by name.
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
# An agent no policy claims is refused by name, before any learner is asked.
rc=0
PYTHONPATH="$root/worker/python" "$py" -m farm_worker --env-module "$root/tests/python/signals_env.py:make" \
  --policy talk tcp://127.0.0.1:1 speaker --policy hear tcp://127.0.0.1:2 listener_0 --num-envs 2 \
  > "$tmp/refused.log" 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -F "'listener_1' belongs to no policy" "$tmp/refused.log" >/dev/null ||
  { cat "$tmp/refused.log" >&2; echo "FAIL: expected a refusal naming listener_1 (status 2, got $rc)" >&2; exit 1; }
echo "ok: an agent without a policy is refused by name"
