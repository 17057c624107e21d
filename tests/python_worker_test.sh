#!/usr/bin/env bash
# End to end with the Python worker: one farm-learner and two Python worker processes
# (worker/python/farm_worker.py) on tests/python/cue_env.py, a 10-step contextual bandit
# (max return 10, random policy 5). The learner learns the spaces from the handshake, so
# the config's env.name does not matter. Passes when the run is solved (mean return of the
# last 100 episodes >= 9.5) with both workers and no protocol error.
# Usage: python_worker_test.sh BUILD_DIR
# Needs python3 with zmq and google.protobuf (Debian: python3-zmq python3-protobuf).
set -euo pipefail
build_dir="$(cd "$1" && pwd)"
root="$(cd "$(dirname "$0")/.." && pwd)"

# The interpreter: $FARM_PYTHON, else python3 on PATH, else Debian's /usr/bin/python3
# (a pyenv or venv python3 on PATH does not see Debian's python3-* packages).
pick_python() {
  local py
  for py in ${FARM_PYTHON:-} python3 /usr/bin/python3; do
    command -v "$py" >/dev/null 2>&1 || continue
    if "$py" -c 'import zmq, google.protobuf' 2>/dev/null; then echo "$py"; return 0; fi
  done
  return 1
}
if ! py="$(pick_python)"; then
  echo "FAIL: python_worker_e2e needs a python3 that can import zmq and google.protobuf" >&2
  echo "      (tried: ${FARM_PYTHON:+$FARM_PYTHON }python3 /usr/bin/python3)." >&2
  echo "      Install them: apt-get install -y python3-zmq python3-protobuf" >&2
  exit 1
fi
proto_dir="$build_dir/python"
if [ ! -f "$proto_dir/farm_pb2.py" ]; then
  echo "FAIL: $proto_dir/farm_pb2.py is missing; build it: cmake --build $build_dir --target farm_proto_py" >&2
  exit 1
fi
learner_bin="$build_dir/learner/farm-learner"
[ -x "$learner_bin" ] || { echo "FAIL: $learner_bin not built" >&2; exit 1; }
export PYTHONDONTWRITEBYTECODE=1  # no __pycache__ in the source tree
echo "python: $py ($("$py" -c 'import sys, zmq, google.protobuf as p; print(sys.version.split()[0], "pyzmq", zmq.__version__, "protobuf", p.__version__)'))"

tmp="$(mktemp -d)"
run_dir="$tmp/run"
learner_pid=""
worker_pids=()
cleanup() {
  if [ -n "$learner_pid" ]; then kill -TERM "$learner_pid" 2>/dev/null || true; fi
  for p in "${worker_pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

# VectorEnv semantics first (no learner): auto-reset, truncation, final observations, episodes.
FARM_PYTHON_PATH="$proto_dir" "$py" - "$root" <<'PY'
import sys
root = sys.argv[1]
sys.path[:0] = [root + "/worker/python", root + "/tests/python"]
import farm_worker as fw, cue_env
v = fw.VectorEnv([cue_env.make() for _ in range(3)])
assert isinstance(v.action_space, fw.Discrete) and v.action_space.n == 2
assert v.observation_space.shape == (4,) and v.obs_numel == 4
obs, _ = v.reset(seed=1)
assert len(obs) == 12 and obs.typecode == "f"
for t in range(10):
    cues = [obs[4 * i] for i in range(3)]
    obs, r, term, trunc, info = v.step([1 if c > 0 else 0 for c in cues])
    assert list(r) == [1.0, 1.0, 1.0], (t, list(r))
    assert list(term) == [0, 0, 0]
    if t < 9:
        assert list(trunc) == [0, 0, 0] and not info["final_obs_index"] and not info["episodes"]
assert list(trunc) == [1, 1, 1] and info["final_obs_index"] == [0, 1, 2]
assert len(info["final_obs"]) == 12 and info["final_obs"][3] == 1.0  # t/length of the last observation
assert all(obs[4 * i + 3] == 0.0 for i in range(3)), "auto-reset: new first observations"
assert info["episodes"] == [(10.0, 10)] * 3, info["episodes"]
print("VectorEnv ok")
PY

# start_learner RUN_DIR KEY=VALUE...: the learner in the background; sets learner_pid and endpoint.
start_learner() {
  local dir="$1" sets=() kv
  shift
  for kv in "$@"; do sets+=(--set "$kv"); done
  rm -f "$tmp/endpoint"
  "$learner_bin" --config "$root/configs/cartpole.yaml" --set run_dir="$dir" --set learner.progress_interval_s=5 \
    "${sets[@]}" --endpoint-file "$tmp/endpoint" &
  learner_pid=$!
  for _ in $(seq 600); do
    [ -s "$tmp/endpoint" ] && break
    kill -0 "$learner_pid" 2>/dev/null || { echo "FAIL: the learner exited before listening" >&2; exit 1; }
    sleep 0.1
  done
  [ -s "$tmp/endpoint" ] || { echo "FAIL: the learner did not listen within 60 s" >&2; exit 1; }
  endpoint="$(cat "$tmp/endpoint")"
  echo "learner on $endpoint"
}
# start_worker INDEX FACTORY [ARGS...]: a Python worker with 8 envs in 2 groups.
start_worker() {
  FARM_PYTHON_PATH="$proto_dir" "$py" "$root/worker/python/farm_worker.py" --learner "$endpoint" \
    --env-module "$root/tests/python/cue_env.py:$2" --num-envs 8 --groups 2 --seed 7 --index "$1" \
    --give-up-s 60 --stats-file "$tmp/worker-$1.json" "${@:3}" &
  worker_pids+=($!)
}
# wait_all: the learner, then every worker; each must exit 0 (workers end on the learner's Stop).
wait_all() {
  local rc=0 i
  wait "$learner_pid" || rc=$?
  learner_pid=""
  [ "$rc" -eq 0 ] || { echo "FAIL: the learner exited with status $rc" >&2; exit 1; }
  for i in "${!worker_pids[@]}"; do
    rc=0
    wait "${worker_pids[$i]}" || rc=$?
    [ "$rc" -eq 0 ] || { echo "FAIL: Python worker $i exited with status $rc" >&2; exit 1; }
  done
  worker_pids=()
}

# 1. Discrete actions: two Python workers must solve the cue task.
start=$(date +%s)
start_learner "$run_dir" total_env_steps=60000 target_return=9.5 stop_at_target=true
start_worker 0 make
start_worker 1 make
wait_all
echo "wall: $(( $(date +%s) - start )) s"

"$py" - "$run_dir" "$tmp" <<'PY'
import json, os, sys
run, tmp = sys.argv[1], sys.argv[2]
s = json.load(open(os.path.join(run, "summary.json")))
print("summary:", json.dumps(s))
assert s["workers"] == 2, s["workers"]
assert s["protocol_errors"] == 0, s["protocol_errors"]
assert s["mean_return_100"] is not None and s["mean_return_100"] >= 9.5, s["mean_return_100"]
assert s["solved_at_steps"] is not None, "not solved"
for i in (0, 1):
    w = json.load(open(os.path.join(tmp, f"worker-{i}.json")))
    print(f"worker {i}:", json.dumps(w))
    assert w["env_steps"] > 0 and w["episodes"] > 0, w
    assert w["stop_reason"], "a worker must end on the learner's Stop"
print("ok: solved at", s["solved_at_steps"], "steps,", round(s["solved_at_seconds"], 1), "s")
PY

# 2. Continuous (float32 box) actions: a short run must go through without a protocol error.
rm -f "$tmp"/worker-*.json
start_learner "$tmp/run_box" total_env_steps=2000 stop_at_target=false
start_worker 0 make_continuous
wait_all
"$py" - "$tmp/run_box" "$tmp/worker-0.json" <<'PY'
import json, os, sys
s = json.load(open(os.path.join(sys.argv[1], "summary.json")))
w = json.load(open(sys.argv[2]))
print("box summary: env", s["env"], "steps", s["env_steps"], "mean_return_100", s["mean_return_100"],
      "protocol_errors", s["protocol_errors"])
assert s["env"] == "ContinuousCueEnv" and s["workers"] == 1, s
assert s["protocol_errors"] == 0 and s["env_steps"] >= 2000, s
assert w["env_steps"] >= 2000 and w["stop_reason"], w
print("ok: continuous actions")
PY

# 3. CURVE (docs/OPERATIONS.md, "Security: CURVE keys"): a Python worker without keys is told at once that the
# learner requires CURVE; one whose public key the learner lists trains.
keys="$tmp/keys"
for name in learner py-worker; do "$build_dir/tools/farm-keygen" "$keys" "$name" > /dev/null; done
rm -f "$tmp"/worker-*.json
start_learner "$tmp/run_curve" total_env_steps=2000 stop_at_target=false transport.curve=true \
  "transport.curve_learner_secret_key_file=$keys/learner.key" "transport.curve_authorized_keys=$keys/py-worker.pub"
rc=0
FARM_PYTHON_PATH="$proto_dir" timeout 30 "$py" "$root/worker/python/farm_worker.py" --learner "$endpoint" \
  --env-module "$root/tests/python/cue_env.py:make" --index 5 --give-up-s 20 > "$tmp/plain.log" 2>&1 || rc=$?
if [ "$rc" -ne 1 ] || ! grep -q "requires CURVE" "$tmp/plain.log"; then
  cat "$tmp/plain.log"; echo "FAIL: a Python worker without CURVE keys: expected status 1 and 'requires CURVE'" >&2; exit 1
fi
echo "ok: $(grep "requires CURVE" "$tmp/plain.log")"
start_worker 0 make --curve-worker-secret-key-file "$keys/py-worker.key" --curve-learner-public-key-file "$keys/learner.pub"
wait_all
"$py" - "$tmp/run_curve" <<'PY'
import json, os, sys
s = json.load(open(os.path.join(sys.argv[1], "summary.json")))
print("curve summary: workers", s["workers"], "steps", s["env_steps"], "auth_refused", s["auth_refused"])
assert s["workers"] == 1 and s["env_steps"] >= 2000 and s["protocol_errors"] == 0, s
print("ok: a Python worker with a listed CURVE key trained")
PY
