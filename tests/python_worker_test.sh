#!/usr/bin/env bash
# End to end with the Python worker: one farm-learner and two Python worker processes
# (worker/python/farm_worker, python -m farm_worker) on tests/python/cue_env.py, a 10-step contextual bandit
# (max return 10, random policy 5). The learner learns the spaces from the handshake, so
# the config's env.name does not matter. Passes when the run is solved (mean return of the
# last 100 episodes >= 9.5) with both workers and no protocol error, a continuous-action run
# and a CURVE run go through, a run with --frame-stack 3 sends [12] observations and solves it,
# a run with env.normalize_obs and env.normalize_reward sends exactly the normalised data
# (part 4; checked message by message) and learns, a multi-discrete action env is learnt (part 5), and a
# multi-agent env with a global state, started by farm-worker from the config's env.python, is solved (part 6).
# Before the runs, without a learner: the pure-Python path's VectorEnv, FrameStack and Normalizer, and the numpy
# path (tests/python/numpy_path_test.py: the same bytes as the pure path, multi-agent, PettingZoo, vectorised).
# Usage: python_worker_test.sh BUILD_DIR
# Needs python3 with zmq, google.protobuf and numpy (Debian: python3-zmq python3-protobuf python3-numpy); the
# worker itself runs single-agent envs without numpy (the pure-Python path).
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
tap_pid=""
worker_pids=()
cleanup() {
  if [ -n "$learner_pid" ]; then kill -TERM "$learner_pid" 2>/dev/null || true; fi
  if [ -n "$tap_pid" ]; then kill -TERM "$tap_pid" 2>/dev/null || true; fi
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

# FrameStack (no learner): the stacked space, and each step's stacked rows and final observations against
# the rule written out here over a plain VectorEnv of the same envs and seeds (last k frames, oldest first;
# all k the reset observation after a reset); a PythonWorker stacks before it normalises.
FARM_PYTHON_PATH="$proto_dir" "$py" - "$root" <<'PY'
import random, sys
from collections import deque
root = sys.argv[1]
sys.path[:0] = [root + "/worker/python", root + "/tests/python"]
import farm_worker as fw

class Counter:  # observation [t, episode, -t]; action 1 terminates; truncated after 3 steps
    observation_space = fw.Box([-10.0, 0.0, -5.0], [10.0, 1e6, 5.0], (3,))
    action_space = fw.Discrete(2)
    def __init__(self): self.t, self.ep = 0, 0
    def _obs(self): return [float(self.t), float(self.ep), float(-self.t)]
    def reset(self, seed=None): self.t = 0; self.ep += 1; return self._obs(), {}
    def step(self, a): self.t += 1; return self._obs(), 0.0, a == 1, self.t >= 3, {}

k, n = 4, 3
s = fw.FrameStack(fw.VectorEnv([Counter() for _ in range(n)]), k)
assert s.observation_space.shape == (12,) and s.obs_numel == 12 and s.num_envs == n
assert s.observation_space.low == [-10.0, 0.0, -5.0] * 4 and s.observation_space.high == [10.0, 1e6, 5.0] * 4
img = fw.stacked_space(fw.Box(0.0, 1.0, (2, 5, 5)), 3)
assert img.shape == (6, 5, 5) and len(img.low) == 150
plain = fw.VectorEnv([Counter() for _ in range(n)])
obs, _ = s.reset(seed=1)
pobs, _ = plain.reset(seed=1)
hist = [deque([list(pobs[3 * i:3 * i + 3])] * k) for i in range(n)]
assert list(obs[:12]) == [0.0, 1.0, 0.0] * 4
rng = random.Random(3)
ends = {"terminated": 0, "truncated": 0}
for t in range(40):
    acts = [1 if rng.random() < 0.2 else 0 for _ in range(n)]
    obs, r, term, trunc, info = s.step(acts)
    pobs, _, pterm, ptrunc, pinfo = plain.step(acts)
    assert bytes(term) == bytes(pterm) and bytes(trunc) == bytes(ptrunc) and info["episodes"] == pinfo["episodes"]
    assert info["final_obs_index"] == pinfo["final_obs_index"]
    assert len(info["final_obs"]) == 12 * len(pinfo["final_obs_index"])
    for j, i in enumerate(pinfo["final_obs_index"]):
        h = list(hist[i])[1:] + [list(pinfo["final_obs"][3 * j:3 * j + 3])]
        assert list(info["final_obs"][12 * j:12 * j + 12]) == sum(h, []), (t, i)
    for i in range(n):
        frame = list(pobs[3 * i:3 * i + 3])
        if pterm[i] or ptrunc[i]:
            ends["terminated" if pterm[i] else "truncated"] += 1
            hist[i] = deque([frame] * k)
        else:
            hist[i].popleft(); hist[i].append(frame)
        assert list(obs[12 * i:12 * i + 12]) == sum(hist[i], []), (t, i, list(obs), list(hist[i]))
assert ends["terminated"] > 0 and ends["truncated"] > 0, ends
for bad in (0, 65):
    try:
        fw.FrameStack(fw.VectorEnv([Counter()]), bad); raise AssertionError(bad)
    except fw.WorkerError as e:
        assert "frame_stack" in str(e) and str(bad) in str(e), e
w = fw.PythonWorker([Counter] * 4, "tcp://127.0.0.1:1", num_groups=2, frame_stack=k,
                    normalization=fw.NormalizerOptions(obs=True), rollout_length=8, use_numpy=False)
assert all(isinstance(g, fw.FrameStack) for g in w.groups) and w.groups[0].observation_space.shape == (12,)
assert w.normalizer.obs_numel == 12 and w.normalizer.own_obs.dim == 12
w.close()
from farm_worker.groups import FrameStackGroup
from farm_worker.numpy_normalizer import NumpyNormalizer
w = fw.PythonWorker([Counter] * 4, "tcp://127.0.0.1:1", num_groups=2, frame_stack=k,
                    normalization=fw.NormalizerOptions(obs=True), rollout_length=8)
assert all(isinstance(g, FrameStackGroup) for g in w.groups) and w.groups[0].observation_space.shape == (12,)
assert isinstance(w.normalizer, NumpyNormalizer) and w.normalizer.own_obs.dim == 12
w.close()
print("FrameStack ok")
PY

# The Python worker's Normalizer (no learner): Welford statistics, the float32 transform and clip, reward
# scaling by hand (the numbers of tests/normalizer_test.cpp), deltas, the learner's statistics and their checks.
FARM_PYTHON_PATH="$proto_dir" "$py" - "$root" <<'PY'
import math, sys
root = sys.argv[1]
sys.path[:0] = [root + "/worker/python", root + "/tests/python"]
import farm_worker as fw
pb = fw.load_proto()
from array import array

# RunningMoments: Welford rows; rows with NaN/Inf are not counted.
m = fw.RunningMoments(3)
m.add_rows(array("f", [0, 10, -5, 2, 10, -5, float("nan"), 1, 1, 4, 10, -5, 1, float("inf"), 1]), 5)
assert m.count == 3 and m.mean == [2.0, 10.0, -5.0] and m.m2 == [8.0, 0.0, 0.0], (m.count, m.mean, m.m2)
assert fw.RunningMoments(2).variance(0) == 1.0
# ObsTransform: clip((x - mean) / sqrt(var + 1e-8), +-clip) in float32.
t = fw.ObsTransform(m, 5.0)
out = t.apply(array("f", [5, 10.01, -6]))
assert abs(out[0] - 3.0 / math.sqrt(8.0 / 3.0 + 1e-8)) < 1e-6 and out[1] == 5.0 and out[2] == -5.0, list(out)
again = t.apply(array("f", [5, 10, -5]))
f = lambda x: array("f", [x])[0]
assert again[0] == min(max(f(f(5.0 - t.mean[0]) / t.std[0]), -5.0), 5.0) and again[1] == 0.0 and again[2] == 0.0
ident = fw.ObsTransform(fw.RunningMoments(3), 10.0).apply(array("f", [0.5, -3, 42]))
assert abs(ident[0] - 0.5) < 1e-7 and abs(ident[1] + 3) < 1e-6 and ident[2] == 10.0, list(ident)

# Rewards 1, 2, 3 (terminated), then 1: G = 1, 2.5, 4.25, 1; reward' = r / sqrt(var(G so far) + 1e-8), clip 10
# (the numbers of tests/normalizer_test.cpp).
class Steps:
    observation_space = fw.Box(-1.0, 1.0, (1,))
    action_space = fw.Discrete(1)
    def __init__(self): self.k = 0
    def reset(self, seed=None): return [0.0], {}
    def step(self, a):
        self.k += 1
        return [float(self.k)], [1.0, 2.0, 3.0, 1.0][(self.k - 1) % 4], self.k == 3, False, {}
v = fw.VectorEnv([Steps()])
n = fw.Normalizer(fw.NormalizerOptions(reward=True, gamma=0.5), 1)
assert n.add_group(1) == 0
v.reset()
n.on_reset(0, v)
expected = [10.0, 2.666666642962963, 2.2588408920943572, 0.7468160427323144]
for k in range(4):
    _, _, _, _, info = v.step([0])
    n.on_step(0, v, info["final_obs"])
    assert abs(n.reward(0)[0] - expected[k]) < 1e-6 * expected[k], (k, n.reward(0)[0])
    assert n.obs(0) is v.obs  # untouched without normalize_obs
assert n.ret_view.count == 4 and n.ret_view.mean[0] == 2.1875

# Deltas and the learner's statistics.
o = fw.NormalizerOptions(obs=True, reward=True)
n = fw.Normalizer(o, 2)
n.add_group(2)
class Two:
    observation_space = fw.Box(-1e9, 1e9, (2,))
    action_space = fw.Discrete(2)
    def __init__(self): self.x = 0.0
    def reset(self, seed=None): self.x = 100.0; return [self.x, -self.x], {}
    def step(self, a): self.x += 10.0; return [self.x, 1.0], 5.0, False, False, {}
v = fw.VectorEnv([Two(), Two()])
v.reset(); n.on_reset(0, v)
assert n.own_obs.count == 2 and n.pending_obs.count == 2 and list(n.obs(0)) == [0.0, 0.0, 0.0, 0.0]
_, _, _, _, info = v.step([0, 0]); n.on_step(0, v, info["final_obs"])
d = pb.NormalizerStats()
n.take_delta(d)
assert d.HasField("obs") and d.HasField("ret") and d.obs.count == 4 and d.ret.count == 2, d
assert n.pending_obs.count == 0 and n.pending_ret.count == 0 and n.own_obs.count == 4
g = pb.NormalizerStats()
g.obs.count, g.ret.count = 10, 10
g.obs.mean.extend([100.0, 0.0]); g.obs.m2.extend([40.0, 10.0]); g.ret.mean.append(0.0); g.ret.m2.append(250.0)
n.apply_global(g, "test")
assert n.has_global_obs and n.obs_view.count == 10 and not n.frozen
_, _, _, _, info = v.step([0, 0]); n.on_step(0, v, info["final_obs"])
assert abs(n.obs(0)[0] - 20.0 / math.sqrt(4.0 + 1e-8)) < 1e-5, list(n.obs(0))  # x = 120
assert abs(n.reward(0)[0] - 1.0) < 1e-6, list(n.reward(0))  # 5 / sqrt(25)
assert n.own_obs.count == 4 and n.pending_obs.count == 2  # own statistics no longer updated
for bad in ("dim", "m2", "missing"):
    b = pb.NormalizerStats(); b.CopyFrom(g)
    if bad == "dim": b.obs.mean.append(1.0)
    if bad == "m2": b.obs.m2[0] = -1.0
    if bad == "missing": b.ClearField("ret")
    try:
        n.apply_global(b, "test"); raise AssertionError(bad)
    except fw.ProtocolError as e:
        pass
fz = pb.NormalizerStats(); fz.CopyFrom(g); fz.frozen = True; fz.obs.count = 0
n.apply_global(fz, "test")
assert n.frozen and n.obs_view.count == 0
h = pb.Hello(); o.to_wire(h.normalization)
assert h.normalization.normalize_obs and h.normalization.reward_clip == 10.0 and h.normalization.gamma == 0.99
print("Normalizer ok")
PY

# The numpy path (the default when numpy is there) without a learner: the same numbers as the pure path for
# single-agent envs, multi-agent envs (array style, PettingZoo Parallel) with global states, vectorised envs.
"$py" "$root/tests/python/numpy_path_test.py" "$root"

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
  PYTHONPATH="$root/worker/python" "$py" -m farm_worker --learner "$endpoint" \
    --env-module "$root/tests/python/cue_env.py:$2" --num-envs 8 --groups 2 --seed 7 --index "$1" \
    --give-up-s 60 --stats-file "$tmp/worker-$1.json" "${@:3}" &
  worker_pids+=($!)
}
# wait_all: the learner, then every worker; each must exit 0 (workers end on the learner's Stop).
# The workers first: they end on the learner's Stop, and a worker that fails (an env that raises) fails the test
# at once instead of leaving the learner waiting for it.
wait_all() {
  local rc=0 i
  for i in "${!worker_pids[@]}"; do
    rc=0
    wait "${worker_pids[$i]}" || rc=$?
    [ "$rc" -eq 0 ] || { echo "FAIL: Python worker $i exited with status $rc" >&2; exit 1; }
  done
  worker_pids=()
  rc=0
  wait "$learner_pid" || rc=$?
  learner_pid=""
  [ "$rc" -eq 0 ] || { echo "FAIL: the learner exited with status $rc" >&2; exit 1; }
}

# 1. Discrete actions: two Python workers must solve the cue task. The learner waits for both
# (learner.min_workers): it solves the task in well under a second, which a busy machine may
# take to start the second interpreter.
start=$(date +%s)
start_learner "$run_dir" total_env_steps=60000 target_return=9.5 stop_at_target=true learner.min_workers=2
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
# Solved: the 100-episode mean reached 9.5 (recorded when it happened, in solved_at_steps). Episodes that end
# between that moment and the stop move the final mean a little (9.49 once), so the final mean gets 2%.
assert s["solved_at_steps"] is not None, "not solved"
assert s["mean_return_100"] is not None and s["mean_return_100"] >= 9.5 * 0.98, s["mean_return_100"]
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

# 2b. Frame stacking: a Python worker with --frame-stack 3 declares observations of [12] (3 x 4) in its Hello;
# the learner builds its policy for them and the run still solves the cue task (the newest frame holds the cue).
rm -f "$tmp"/worker-*.json
start_learner "$tmp/run_stack" total_env_steps=60000 target_return=9.5 stop_at_target=true env.frame_stack=3
start_worker 0 make --frame-stack 3
wait_all
"$py" - "$tmp/run_stack" <<'PY'
import json, os, sys
s = json.load(open(os.path.join(sys.argv[1], "summary.json")))
spec = json.load(open(os.path.join(sys.argv[1], "policy_spec.json")))
print("stack summary: steps", s["env_steps"], "mean_return_100", s["mean_return_100"], "observation",
      spec["observation"]["shape"])
assert spec["observation"]["shape"] == [12], spec["observation"]
assert s["protocol_errors"] == 0 and s["solved_at_steps"] is not None, s
print("ok: frame stacking, solved at", s["solved_at_steps"], "steps")
PY

# 3. CURVE (docs/OPERATIONS.md, "Security: CURVE keys"): a Python worker without keys is told at once that the
# learner requires CURVE; one whose public key the learner lists trains.
keys="$tmp/keys"
# A learner endpoint ZeroMQ cannot connect to is refused at once, naming it (exit 2), as farm-worker does.
for bad in tcp://127.0.0.1:99999 tcp://127.0.0.1 foo://x; do
  rc=0
  PYTHONPATH="$root/worker/python" timeout 30 "$py" -m farm_worker --learner "$bad" \
    --env-module "$root/tests/python/cue_env.py:make" > "$tmp/bad-endpoint.log" 2>&1 || rc=$?
  if [ "$rc" -ne 2 ] || ! grep -qF "got '$bad'" "$tmp/bad-endpoint.log"; then
    cat "$tmp/bad-endpoint.log"; echo "FAIL: --learner $bad: expected status 2 and a message naming it" >&2; exit 1
  fi
done
echo "ok: $(tail -1 "$tmp/bad-endpoint.log")"
for name in learner py-worker; do "$build_dir/tools/farm-keygen" "$keys" "$name" > /dev/null; done
rm -f "$tmp"/worker-*.json
start_learner "$tmp/run_curve" total_env_steps=2000 stop_at_target=false transport.curve=true \
  "transport.curve_learner_secret_key_file=$keys/learner.key" "transport.curve_authorized_keys=$keys/py-worker.pub"
rc=0
PYTHONPATH="$root/worker/python" timeout 30 "$py" -m farm_worker --learner "$endpoint" \
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

# 4. Observation normalisation and reward scaling (docs/ENVIRONMENTS.md, "Observation and reward normalisation")
# on tests/python/cue_env.py make_scaled (observations around 200 and 1000 with rare spikes, rewards 0 or 50).
# A Python worker without the learner's settings is refused at the handshake, naming the keys. One with them
# talks to the learner through norm_tap.py proxy, which records every message; norm_tap.py check then replays
# them against what the envs returned ($CUE_ENV_LOG): every observation, final observation and reward sent must
# be the normalised one (own statistics first, then the learner's as each reply brought them), each delta the
# statistics of exactly the rows since the last one, once per rollout, and the learner's merged statistics those
# of every row up to that rollout. Needs numpy for the check (Debian: python3-numpy).
if ! "$py" -c 'import numpy' 2>/dev/null; then
  echo "FAIL: the normalisation check needs numpy in $py (apt-get install -y python3-numpy)" >&2; exit 1
fi
norm_sets=(total_env_steps=15360 target_return=475 stop_at_target=false env.normalize_obs=true
           env.normalize_reward=true ppo.rollout_length=32 ppo.gamma=0.98)
norm_args=(--normalize-obs --normalize-reward --gamma 0.98 --rollout-length 32)
rm -f "$tmp"/worker-*.json
start_learner "$tmp/run_norm" "${norm_sets[@]}"
rc=0
PYTHONPATH="$root/worker/python" timeout 30 "$py" -m farm_worker --learner "$endpoint" \
  --env-module "$root/tests/python/cue_env.py:make_scaled" --index 5 --give-up-s 20 > "$tmp/plain.log" 2>&1 || rc=$?
if [ "$rc" -ne 1 ] || ! grep -q "env.normalize_obs false (learner: true)" "$tmp/plain.log"; then
  cat "$tmp/plain.log"
  echo "FAIL: a Python worker without normalisation: expected status 1 and 'env.normalize_obs false (learner: true)'" >&2
  exit 1
fi
echo "ok: refused without normalisation: $(grep -o "env.normalize_obs false.*normalize_reward[^,;]*" "$tmp/plain.log")"
rm -f "$tmp/tap_endpoint" "$tmp/env_log.jsonl"
FARM_PYTHON_PATH="$proto_dir" "$py" "$root/tests/python/norm_tap.py" proxy "$endpoint" "$tmp/tap_endpoint" \
  "$tmp/capture.bin" &
tap_pid=$!
for _ in $(seq 300); do [ -s "$tmp/tap_endpoint" ] && break; sleep 0.1; done
[ -s "$tmp/tap_endpoint" ] || { echo "FAIL: norm_tap.py proxy did not start" >&2; exit 1; }
learner_endpoint="$endpoint"
endpoint="$(cat "$tmp/tap_endpoint")"
CUE_ENV_LOG="$tmp/env_log.jsonl" start_worker 0 make_scaled "${norm_args[@]}"
endpoint="$learner_endpoint"
wait_all
rc=0
wait "$tap_pid" || rc=$?
tap_pid=""
[ "$rc" -eq 0 ] || { echo "FAIL: norm_tap.py proxy exited with status $rc (no Stop forwarded)" >&2; exit 1; }
FARM_PYTHON_PATH="$proto_dir" "$py" "$root/tests/python/norm_tap.py" check "$tmp/capture.bin" "$tmp/env_log.jsonl" \
  --rollout-length 32 --gamma 0.98
"$py" - "$tmp/run_norm" "$tmp/worker-0.json" <<'PY'
import json, os, sys
s = json.load(open(os.path.join(sys.argv[1], "summary.json")))
w = json.load(open(sys.argv[2]))
print("norm summary: steps", s["env_steps"], "mean_return_100", s["mean_return_100"], "protocol_errors",
      s["protocol_errors"], "worker normalizer counts", w["normalizer"]["obs_count"], w["normalizer"]["ret_count"])
# The one protocol error is the refused worker's handshake.
assert s["workers"] == 1 and s["protocol_errors"] == 1 and s["env_steps"] >= 15360, s
n = w["normalizer"]
assert not n["frozen"] and n["obs_count"] > 0 and n["ret_count"] > 0, n
# Raw returns (0..500). Normalised, the run reached 475 at 2.9k steps and ended at 499.5; the same run
# without normalisation ended at 424, never reaching 475 (checked by hand, 2026-11-26).
assert s["mean_return_100"] is not None and s["mean_return_100"] >= 475, s["mean_return_100"]
print("ok: normalisation")
PY

# 5. Multi-discrete actions (nvec [2, 3], start [0, -1]): the space on the wire, the actions as lists of ints
# shifted by start, and a run that learns both components (random 4.2, max 10).
FARM_PYTHON_PATH="$proto_dir" "$py" - "$root" <<'PY'
import sys
root = sys.argv[1]
sys.path[:0] = [root + "/worker/python", root + "/tests/python"]
import farm_worker as fw, cue_env
pb = fw.load_proto()
v = fw.VectorEnv([cue_env.make_multi() for _ in range(2)])
assert v.action_space == fw.MultiDiscrete([2, 3], [0, -1]) and v.action_numel == 2, v.action_space
w = pb.Space()
fw.space_to_wire(v.action_space, w)
assert w.kind == pb.Space.MULTI_DISCRETE and list(w.nvec) == [2, 3] and list(w.shape) == [2] and w.dtype == pb.INT64
v.reset(seed=3)
_, r, _, _, _ = v.step([1, 2, 0, 0])  # wire actions [1, 2] -> env action [1, 1]; [0, 0] -> [0, -1]
assert all(x in (0.0, 0.5, 1.0) for x in r), list(r)
for bad in ({"nvec": [[2, 3]]}, {"nvec": [2, 0]}):
    try:
        fw.as_space(bad)
        raise AssertionError(f"as_space accepted {bad}")
    except fw.WorkerError as e:
        assert "MultiDiscrete" in str(e), e
print("MultiDiscrete ok")
PY
rm -f "$tmp"/worker-*.json
start_learner "$tmp/run_multi" total_env_steps=200000 target_return=9 stop_at_target=true
start_worker 0 make_multi
wait_all
"$py" - "$tmp/run_multi" <<'PY'
import json, os, sys
s = json.load(open(os.path.join(sys.argv[1], "summary.json")))
spec = json.load(open(os.path.join(sys.argv[1], "policy_spec.json")))
print("multi-discrete summary: steps", s["env_steps"], "mean_return_100", s["mean_return_100"], "solved at",
      s["solved_at_steps"], "protocol_errors", s["protocol_errors"])
assert spec["action"]["kind"] == "multi_discrete" and spec["action"]["nvec"] == [2, 3], spec["action"]
assert s["protocol_errors"] == 0 and s["solved_at_steps"] is not None, s
print("ok: multi-discrete actions")
PY

# 6. A multi-agent Python env with a global state (tests/python/cue_env.py make_team: 3 agents, array style,
# numpy, team reward), started the way scripts/farm starts workers: farm-worker with the config's env.python runs
# the Python worker in its place with the config's settings (envs, groups, seed, give-up time). Two such workers
# solve it (9 of 10) with the critic on the global state; final observations and states of truncated envs travel.
rm -f "$tmp"/worker-*.json
start_learner "$tmp/run_team" total_env_steps=100000 target_return=9.0 stop_at_target=true learner.min_workers=2
for i in 0 1; do
  "$build_dir/worker/farm-worker" --config "$root/configs/cartpole.yaml" --learner "$endpoint" --index "$i" \
    --set "env.python=$root/tests/python/cue_env.py:make_team" --set "env.python_interpreter=$py" \
    --set env.num_envs=8 --set env.num_groups=2 --stats-file "$tmp/worker-$i.json" > "$tmp/team-$i.log" 2>&1 &
  worker_pids+=($!)
done
wait_all
"$py" - "$tmp/run_team" "$tmp" <<'PY'
import json, os, sys
run, tmp = sys.argv[1], sys.argv[2]
s = json.load(open(os.path.join(run, "summary.json")))
spec = json.load(open(os.path.join(run, "policy_spec.json")))
print("team summary: steps", s["env_steps"], "agent steps", s["agent_steps"], "mean_return_100", s["mean_return_100"],
      "solved at", s["solved_at_steps"], "num_agents", s["num_agents"], "protocol_errors", s["protocol_errors"])
assert s["num_agents"] == 3 and s["agent_steps"] == 3 * s["env_steps"], s
assert s["protocol_errors"] == 0 and s["workers"] == 2 and s["solved_at_steps"] is not None, s
print("policy spec:", json.dumps({k: spec[k] for k in spec if k in ("num_agents", "global_state")}))
for i in (0, 1):
    w = json.load(open(os.path.join(tmp, f"worker-{i}.json")))
    assert w["index"] == i and w["env_steps"] > 0 and w["stop_reason"], w
print("ok: a multi-agent Python env with a global state, started by farm-worker from env.python")
PY
