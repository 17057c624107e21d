"""The Python worker's numpy path without a learner (run by tests/python_worker_test.sh):

1. single-agent Gymnasium-style envs give the same numbers through the numpy groups as through the pure-Python
   VectorEnv (observations, rewards, flags, final observations, episodes), frame-stacked too;
2. the numpy normaliser agrees with the pure one on the same stream (statistics to 1e-12, transforms to 1e-6);
3. multi-agent envs in the array style: rows env-major, one state per env, team and per-agent rewards, whole
   truncated envs with their final observations and states, episode returns as the mean over agents;
4. PettingZoo Parallel envs (duck-typed): agents in possible_agents order, an agent that finishes early keeps its
   last observation, gets reward 0 and no action, the env ends when all have;
5. vectorised envs: one step call per group, final observations from infos, autoreset modes other than same-step
   refused by name; every error names what was expected.
Usage: python3 numpy_path_test.py REPO_ROOT
"""
import random
import sys

root = sys.argv[1]
sys.path[:0] = [root + "/worker/python", root + "/tests/python"]

import numpy as np  # noqa: E402

import farm_worker as fw  # noqa: E402
from farm_worker.groups import ArrayGroup, BatchedGroup, FrameStackGroup, GymGroup, ParallelEnvAdapter  # noqa: E402
from farm_worker.numpy_normalizer import NumpyNormalizer  # noqa: E402


def expect_error(fn, *words):
    try:
        fn()
    except fw.WorkerError as e:
        for w in words:
            assert w in str(e), (w, str(e))
        return
    raise AssertionError(f"no WorkerError (expected one naming {words})")


# 1. Parity with the pure path.
class Counter:  # observation [t, episode, -t, noise]; action 1 terminates; truncated after 5 steps; reward t
    observation_space = fw.Box([-10.0, 0.0, -5.0, -1.0], [10.0, 1e6, 5.0, 1.0], (4,))
    action_space = fw.Discrete(2)

    def __init__(self):
        self.t, self.ep, self.rng = 0, 0, random.Random(0)

    def _obs(self):
        return [float(self.t), float(self.ep), float(-self.t), self.rng.uniform(-1, 1)]

    def reset(self, seed=None):
        if seed is not None:
            self.rng = random.Random(seed)
        self.t = 0
        self.ep += 1
        return self._obs(), {}

    def step(self, a):
        self.t += 1
        return self._obs(), 0.5 * self.t, a == 1, self.t >= 5, {}


for k in (1, 3):
    n = 6
    pure = fw.VectorEnv([Counter() for _ in range(n)])
    fast = GymGroup([Counter() for _ in range(n)])
    if k > 1:
        pure, fast = fw.FrameStack(pure, k), FrameStackGroup(fast, k)
    pobs, _ = pure.reset(seed=[11 + i for i in range(n)])
    fobs, _ = fast.reset(seed=[11 + i for i in range(n)])
    assert fobs.dtype == np.float32 and fobs.shape == (n, 4 * k)
    assert fobs.tobytes() == pobs.tobytes()
    rng = random.Random(5)
    ends = 0
    for t in range(60):
        acts = [1 if rng.random() < 0.15 else 0 for _ in range(n)]
        pobs, pr, pterm, ptrunc, pinfo = pure.step(acts)
        fobs, fr, fterm, ftrunc, finfo = fast.step(np.asarray(acts, np.int64))
        assert fobs.tobytes() == pobs.tobytes(), (k, t)
        assert fr.tobytes() == pr.tobytes() and bytes(fterm) == bytes(pterm) and bytes(ftrunc) == bytes(ptrunc)
        assert finfo["final_obs_index"] == pinfo["final_obs_index"]
        assert finfo["final_obs"].tobytes() == pinfo["final_obs"].tobytes(), (k, t)
        assert finfo["episodes"] == pinfo["episodes"], (finfo["episodes"], pinfo["episodes"])
        ends += len(finfo["episodes"])
    assert ends > 10
print("numpy groups = pure VectorEnv (frame stack 1 and 3)")

# 2. The numpy normaliser against the pure one, on the same stream of observations and rewards.
opts = fw.NormalizerOptions(obs=True, reward=True, gamma=0.9, obs_clip=3.0, reward_clip=4.0)
pure_env, fast_env = fw.VectorEnv([Counter() for _ in range(4)]), GymGroup([Counter() for _ in range(4)])
pn, nn = fw.Normalizer(opts, 4), NumpyNormalizer(opts, 4)
pn.add_group(4)
nn.add_group(4, 1)
pure_env.reset(seed=[1, 2, 3, 4])
fast_env.reset(seed=[1, 2, 3, 4])
pn.on_reset(0, pure_env)
nn.on_reset(0, fast_env)
rng = random.Random(9)
for t in range(50):
    acts = [1 if rng.random() < 0.1 else 0 for _ in range(4)]
    _, _, _, _, pinfo = pure_env.step(acts)
    _, _, _, _, finfo = fast_env.step(np.asarray(acts, np.int64))
    pn.on_step(0, pure_env, pinfo["final_obs"])
    nn.on_step(0, fast_env, finfo["final_obs"])
    assert np.allclose(np.frombuffer(pn.obs(0).tobytes(), np.float32), nn.obs(0).reshape(-1), atol=1e-6), t
    assert np.allclose(np.frombuffer(pn.reward(0).tobytes(), np.float32), nn.reward(0), rtol=1e-6, atol=1e-7), t
    assert np.allclose(np.frombuffer(pn.final_obs(0).tobytes(), np.float32), nn.final_obs(0).reshape(-1), atol=1e-6)
    if t == 20:  # deltas agree too
        pd, nd = fw.load_proto().NormalizerStats(), fw.load_proto().NormalizerStats()
        pn.take_delta(pd)
        nn.take_delta(nd)
        assert pd.obs.count == nd.obs.count and pd.ret.count == nd.ret.count
        assert np.allclose(pd.obs.mean, nd.obs.mean, rtol=1e-12) and np.allclose(pd.obs.m2, nd.obs.m2, rtol=1e-12)
        assert np.allclose(pd.ret.m2, nd.ret.m2, rtol=1e-12)
po, no = pn.obs_view, nn.obs_view
assert po.count == no.count and np.allclose(po.mean, no.mean, rtol=1e-12) and np.allclose(po.m2, no.m2, rtol=1e-12)
assert pn.ret_view.count == nn.ret_view.count and np.allclose(pn.ret_view.m2, nn.ret_view.m2, rtol=1e-12)
print("numpy normaliser = pure normaliser (counts equal, moments to 1e-12, outputs to 1e-6)")


# 3. Multi-agent, array style.
class Team:
    """3 agents; obs [agent, t, env id]; state [t, 10 * t]; team reward 1 (or per agent [0, 1, 2] with per_agent);
    truncated after 4 steps, terminated when every agent picks action 1."""
    num_agents = 3
    observation_space = fw.Box(-100.0, 100.0, (3,))
    action_space = fw.Discrete(2)
    state_space = fw.Box(-100.0, 100.0, (2,))
    made = 0

    def __init__(self, per_agent=False):
        self.id, self.per_agent, self.t = Team.made, per_agent, 0
        Team.made += 1

    def _out(self):
        return ([[a, self.t, self.id] for a in range(3)], [self.t, 10 * self.t])

    def reset(self, seed=None):
        self.t = 0
        return self._out()

    def step(self, actions):
        assert actions.shape == (3,) and actions.dtype == np.int64, actions
        self.t += 1
        obs, state = self._out()
        reward = [0.0, 1.0, 2.0] if self.per_agent else 1.0
        return obs, state, reward, bool((actions == 1).all()), self.t >= 4, {}


g = ArrayGroup([Team(), Team(per_agent=True)])
assert (g.num_envs, g.num_agents, g.rows) == (2, 3, 6) and g.state.shape == (2, 2)
obs, _ = g.reset()
assert obs.shape == (6, 3) and obs[:, 0].tolist() == [0, 1, 2, 0, 1, 2] and obs[:, 2].tolist() == [0, 0, 0, 1, 1, 1]
for t in range(1, 4):
    obs, r, term, trunc, info = g.step(np.array([0, 0, 0, 1, 1, 0], np.int64))
    assert r.tolist() == [1, 1, 1, 0, 1, 2] and not term.any() and not trunc.any() and not info["final_obs_index"]
    assert g.state.tolist() == [[t, 10 * t]] * 2
obs, r, term, trunc, info = g.step(np.array([1, 1, 1, 0, 0, 0], np.int64))
assert term.tolist() == [1, 1, 1, 0, 0, 0] and trunc.tolist() == [0, 0, 0, 1, 1, 1], (term, trunc)
assert info["final_obs_index"] == [3, 4, 5] and info["final_obs"][:, 1].tolist() == [4, 4, 4]
assert info["final_state"].tolist() == [[4, 40]] and g.state.tolist() == [[0, 0], [0, 0]]  # both reset
assert info["episodes"] == [(4.0, 4), (4.0, 4)], info["episodes"]  # team 4 x 1; mean over agents 4 x 1
assert obs[:, 1].tolist() == [0] * 6


class BadState(Team):
    def step(self, actions):
        obs, state, reward, term, trunc, info = super().step(actions)
        return obs, None, reward, term, trunc, info


bad = ArrayGroup([BadState()])
bad.reset()
expect_error(lambda: bad.step(np.zeros(3, np.int64)), "state_space", "no state")


class WrongObs(Team):
    def reset(self, seed=None):
        return [[0.0, 0.0]] * 3, [0, 0]


expect_error(lambda: ArrayGroup([WrongObs()]).reset(), "env 0", "expected 9 values", "[3, 2]")
print("array-style multi-agent groups ok")


# 4. PettingZoo Parallel API, duck-typed.
class Zoo:
    """Agents a0..a2; a1 terminates after step 2; everyone truncated after step 5; state = [t]."""
    metadata = {"name": "zoo_v0"}

    def __init__(self):
        self.possible_agents = ["a0", "a1", "a2"]
        self.state_space = fw.Box(0.0, 10.0, (1,))
        self.seen = []

    def observation_space(self, agent):
        return fw.Box(-10.0, 10.0, (2,))

    def action_space(self, agent):
        return fw.Discrete(3)

    def state(self):
        return np.array([self.t], np.float32)

    def reset(self, seed=None, options=None):
        self.t, self.agents = 0, list(self.possible_agents)
        return {a: [i, 0] for i, a in enumerate(self.agents)}, {a: {} for a in self.agents}

    def step(self, actions):
        self.seen.append(dict(actions))
        self.t += 1
        obs = {a: [i, self.t] for i, a in enumerate(self.possible_agents) if a in self.agents}
        rew = {a: 1.0 for a in self.agents}
        term = {a: a == "a1" and self.t == 2 for a in self.agents}
        trunc = {a: self.t >= 5 for a in self.agents}
        self.agents = [a for a in self.agents if not (term[a] or trunc[a])]
        return obs, rew, term, trunc, {a: {} for a in obs}


z = Zoo()
g = ArrayGroup([z])
assert isinstance(g.envs[0], ParallelEnvAdapter) and g.num_agents == 3 and g.state_space.shape == (1,)
g.reset()
for t in range(1, 6):
    obs, r, term, trunc, info = g.step(np.array([2, 1, 0], np.int64))
    if t < 5:
        # a1's own end terminates its row alone at step 2; it is inactive from then on.
        assert not trunc.any() and term.tolist() == ([0, 1, 0] if t == 2 else [0, 0, 0]), (t, term)
        assert g.active.tolist() == ([1, 1, 1] if t < 2 else [1, 0, 1]), (t, g.active)
        assert obs[1].tolist() == [1, min(t, 2)], (t, obs)  # a1 keeps its last observation after it finished
        assert r.tolist() == ([1, 1, 1] if t <= 2 else [1, 0, 1]), (t, r)
assert trunc.tolist() == [1, 1, 1] and info["final_obs_index"] == [0, 1, 2] and info["final_state"].tolist() == [[5]]
assert g.active.tolist() == [1, 1, 1] and not g.any_inactive  # reset: every agent acts again
assert info["final_obs"][:, 1].tolist() == [5, 2, 5]
assert z.seen[0] == {"a0": 2, "a1": 1, "a2": 0} and z.seen[2] == {"a0": 2, "a2": 0}, z.seen
assert g.state.tolist() == [[0]]  # reset in the same step
w = fw.PythonWorker([Zoo] * 4, "tcp://127.0.0.1:1", num_groups=2)
assert w.num_agents == 3 and w.state_space.shape == (1,) and w.env_name == "zoo_v0" and w.num_envs == 4
w.close()
print("PettingZoo Parallel envs ok")


# 4b. Agents that finish before their env: one terminated alone, one truncated alone (PettingZoo and the array style
# with per-agent flags), the rows' flags, active bytes and rewards, frame stacking, the normaliser and the request.
class EarlyZoo:
    """Agents b0..b2, team reward 1 to each live agent; b0 terminates after step 1, b2 is truncated after step 2 (its
    own time limit), b1 goes on until step 4 (terminated: the env ends). Observations [agent, t]."""
    metadata = {"name": "early_zoo_v0"}

    def __init__(self):
        self.possible_agents = ["b0", "b1", "b2"]

    def observation_space(self, agent):
        return fw.Box(-10.0, 10.0, (2,))

    def action_space(self, agent):
        return fw.Discrete(2)

    def reset(self, seed=None, options=None):
        self.t, self.agents = 0, list(self.possible_agents)
        return {a: [i, 0] for i, a in enumerate(self.agents)}, {a: {} for a in self.agents}

    def step(self, actions):
        assert set(actions) == set(self.agents), (actions, self.agents)  # no action for a finished agent
        self.t += 1
        obs = {a: [self.possible_agents.index(a), self.t] for a in self.agents}
        rew = {a: 1.0 for a in self.agents}
        term = {a: (a == "b0" and self.t == 1) or (a == "b1" and self.t == 4) for a in self.agents}
        trunc = {a: a == "b2" and self.t == 2 for a in self.agents}
        self.agents = [a for a in self.agents if not (term[a] or trunc[a])]
        return obs, rew, term, trunc, {a: {} for a in obs}


class EarlyArrays:
    """The same episode in the array style, with per-agent flag arrays and a team reward of 1."""
    num_agents = 3
    observation_space = fw.Box(-10.0, 10.0, (2,))
    action_space = fw.Discrete(2)

    def reset(self, seed=None):
        self.t = 0
        self.last = [[a, 0] for a in range(3)]
        return self.last, None

    def step(self, actions):
        self.t += 1
        live = [self.t <= 1, self.t <= 4, self.t <= 2]
        self.last = [[a, self.t] if live[a] else self.last[a] for a in range(3)]
        # b0's terminated stays True after its end (ignored: not a new end).
        term = np.array([self.t >= 1, self.t == 4, False])
        trunc = np.array([False, False, self.t == 2])
        return self.last, None, 1.0, term, trunc, {}


# Step by step for an env of either kind: (terminated, truncated, active, reward) of its rows after step t.
EARLY = {1: ([1, 0, 0], [0, 0, 0], [0, 1, 1], [1, 1, 1]),   # b0 terminated alone: its row flagged, inactive
         2: ([0, 0, 0], [0, 0, 0], [0, 1, 0], [0, 1, 1]),   # b2 truncated alone: no flag, inactive; b0's reward 0
         3: ([0, 0, 0], [0, 0, 0], [0, 1, 0], [0, 1, 0]),
         4: ([1, 1, 1], [0, 0, 0], [1, 1, 1], [0, 1, 0])}   # b1 terminates, last: the env ends, every row flagged
for make in (EarlyZoo, EarlyArrays):
    g = ArrayGroup([make(), make()])
    g.reset()
    for t in range(1, 9):
        obs, r, term, trunc, info = g.step(np.zeros(6, np.int64))
        want_term, want_trunc, want_active, want_r = EARLY[(t - 1) % 4 + 1]
        for name, got, want in (("terminated", term, want_term), ("truncated", trunc, want_trunc),
                                ("active", g.active, want_active), ("reward", r, want_r)):
            assert got.tolist() == want * 2, (make.__name__, t, name, got.tolist())
        assert g.any_inactive == (t % 4 != 0)
        assert g.env_ended.tolist() == [t % 4 == 0] * 2
        assert not info["final_obs_index"]  # b2's truncation alone has no final observation: its row keeps its last
        if t % 4 == 2:
            assert obs[:3].tolist() == [[0, 1], [1, 2], [2, 2]], obs  # finished agents keep their last observation
        if t % 4 == 0:
            # The team's 1 a step (arrays), or the mean over agents of their summed rewards (PettingZoo: 3 + 2 + 1 + 1).
            want = 4.0 if make is EarlyArrays else 7 / 3
            assert [(round(ret, 9), n) for ret, n in info["episodes"]] == [(round(want, 9), 4)] * 2, info["episodes"]
            assert obs[:, 1].tolist() == [0] * 6  # reset
print("agents that finish early ok (PettingZoo and per-agent arrays)")

# Time-limit truncation of the whole env after an agent finished: every row truncated, whole envs listed.
class LimitedZoo(EarlyZoo):
    """EarlyZoo with a time limit at step 3: every live agent (b1) truncated then, after b0 and b2 finished."""

    def step(self, actions):
        obs, rew, term, trunc, infos = super().step(actions)
        if self.t == 3:
            trunc = {a: True for a in trunc}
            self.agents = []
        return obs, rew, term, trunc, infos


g = ArrayGroup([LimitedZoo()])
g.reset()
for t in range(1, 4):
    obs, r, term, trunc, info = g.step(np.zeros(3, np.int64))
assert trunc.tolist() == [1, 1, 1] and term.tolist() == [0, 0, 0] and info["final_obs_index"] == [0, 1, 2]
assert info["final_obs"].tolist() == [[0, 1], [1, 3], [2, 2]] and g.active.tolist() == [1, 1, 1]
expect_error(lambda: ArrayGroup([type("Bad", (EarlyArrays,), {"step": lambda self, a: (
    [[0, 0]] * 3, None, 1.0, np.zeros(2, bool), False, {})})()]).step(np.zeros(3, np.int64)),
    "env 0", "terminated has 2 values", "expected a bool (the team's) or 3 (one per agent)")

# Frame stacking: a row whose agent finished alone keeps its frames (no reset fill); the env's reset fills them.
fs = FrameStackGroup(ArrayGroup([EarlyArrays()]), 2)
fs.reset()
fs.step(np.zeros(3, np.int64))
assert fs.obs[0].tolist() == [0, 0, 0, 1], fs.obs  # b0 terminated alone: the reset frame, then its last
fs.step(np.zeros(3, np.int64))
assert fs.obs[0].tolist() == [0, 1, 0, 1] and fs.obs[2].tolist() == [2, 1, 2, 2], fs.obs
fs.step(np.zeros(3, np.int64))
fs.step(np.zeros(3, np.int64))
assert fs.obs[:, 1].tolist() == [0] * 3 and fs.obs[:, 3].tolist() == [0] * 3  # reset: every frame the first

# The normaliser: each env's return G restarts only when the env ends, of the team's reward (rows inactive carry 0).
opts = fw.NormalizerOptions(obs=False, reward=True, gamma=0.5)
nn = NumpyNormalizer(opts, 2)
nn.add_group(1, 3)
g = ArrayGroup([EarlyArrays()])
g.reset()
nn.on_reset(0, g)
for t in range(1, 6):
    _, r, _, _, info = g.step(np.zeros(3, np.int64))
    nn.on_step(0, g, info["final_obs"])
    assert (nn.reward(0) == 0).tolist() == (r == 0).tolist()  # 0 stays 0 when scaled
# G = 1, 1.5, 1.75, 1.875 (env over: restart), 1 (team reward 1 a step, whoever finished).
assert nn.pending_ret.count == 5 and abs(nn.pending_ret.mean[0] - (1 + 1.5 + 1.75 + 1.875 + 1) / 5) < 1e-12, \
    nn.pending_ret.mean

# Observation statistics count the acting rows only (a finished agent repeats its last observation): 3 at the
# reset, then the active rows after EARLY's steps 1-3 (2, 1, 1), 3 after the env's end (step 4), 2 after step 5.
nn = NumpyNormalizer(fw.NormalizerOptions(obs=True, reward=False), 2)
nn.add_group(1, 3)
g = ArrayGroup([EarlyArrays()])
g.reset()
nn.on_reset(0, g)
counts = [nn.pending_obs.count]
for t in range(1, 6):
    _, _, _, _, info = g.step(np.zeros(3, np.int64))
    nn.on_step(0, g, info["final_obs"])
    counts.append(nn.pending_obs.count)
assert counts == [3, 5, 6, 7, 10, 12], counts

# The request: StepRequest.active only while some row is inactive.
sent = []
w = fw.PythonWorker([EarlyZoo] * 2, "tcp://127.0.0.1:1", num_groups=1)
w._send = sent.append
w._start_groups(seeded=True)
for seq in range(5):
    req = sent[-1].step
    assert req.seq == seq and bytes(req.active) == (b"" if seq in (0, 4) else bytes(EARLY[seq][2] * 2)), \
        (seq, bytes(req.active))
    if seq:
        assert bytes(req.terminated) == bytes(EARLY[seq][0] * 2), (seq, bytes(req.terminated))
    reply = w.pb.ActionReply(group=0, seq=seq)
    reply.action.dtype = w.pb.INT64
    reply.action.shape.extend([6])
    reply.action.data = np.zeros(6, "<i8").tobytes()
    w._waiting[0] = True
    w._on_action(reply)
w.close()
print("finished agents' flags, frames, normaliser and requests ok")


# 4c. Agents of different spaces, padded for one shared policy (farm_worker.pad_agents).
class TwoKinds:
    """A speaker (observation [3], 3 actions) and a listener (observation [2, 2], 5 actions), as MPE's
    simple_speaker_listener; state [2]; every step returns the actions the env was given as the reward."""
    metadata = {"name": "two_kinds_v0"}

    def __init__(self, kinds=("d", "d")):
        self.possible_agents = ["speaker", "listener"]
        self.kinds = dict(zip(self.possible_agents, kinds))
        self.state_space = fw.Box(0.0, 9.0, (2,))
        self.seen = []

    def observation_space(self, agent):
        return fw.Box(-1.0, 4.0, (3,)) if agent == "speaker" else fw.Box([[-2.0, 0.0], [0.0, 0.0]], 5.0, (2, 2))

    def action_space(self, agent):
        n = 3 if agent == "speaker" else 5
        return fw.Discrete(n) if self.kinds[agent] == "d" else fw.Box(-0.5 if agent == "speaker" else 0.0, 1.0, (n,))

    def state(self):
        return np.array([1, 2], np.float32)

    def _obs(self):
        return {"speaker": [1, 2, 3], "listener": [[4, 5], [6, 7]]}

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions):
        self.seen.append(dict(actions))
        return (self._obs(), {a: 0.0 for a in self.agents}, {a: False for a in self.agents},
                {a: False for a in self.agents}, {a: {} for a in self.agents})


expect_error(lambda: ParallelEnvAdapter(TwoKinds()), "'listener' has other spaces", "pad_agents")
p = fw.pad_agents(TwoKinds())
assert p.observation_space("speaker") == p.observation_space("listener") == fw.Box(
    [-2.0, -1.0, -1.0, 0.0, 0.0, 0.0], [5.0, 5.0, 5.0, 5.0, 1.0, 1.0], (6,)), p.observation_space("speaker").low
assert p.action_space("speaker") == p.action_space("listener") == fw.Discrete(5)
g = ArrayGroup([p])
assert g.num_agents == 2 and g.state_space.shape == (2,) and g.observation_space.shape == (6,)
g.reset()
assert g.obs.tolist() == [[1, 2, 3, 0, 1, 0], [4, 5, 6, 7, 0, 1]] and g.state.tolist() == [[1, 2]], g.obs
for speaker_action, taken in ((2, 2), (3, 0), (4, 0), (0, 0)):  # an action the speaker lacks is its first
    g.step(np.array([speaker_action, 4], np.int64))
    assert p.env.seen[-1] == {"speaker": taken, "listener": 4}, p.env.seen[-1]
q = fw.pad_agents(TwoKinds(), agent_id=False)
assert q.observation_space("speaker").shape == (4,) and q.pad_observation("speaker", [1, 2, 3]).tolist() == [1, 2, 3, 0]
expect_error(lambda: q.pad_observation("speaker", [1, 2]), "'speaker' observed 2 numbers", "has 3")
expect_error(lambda: q.action_space("nobody"), "unknown agent 'nobody'")
# Box actions: the widest bounds per entry; an agent takes its own first entries, clipped to its own bounds.
b = fw.pad_agents(TwoKinds(("b", "b")))
assert b.action_space("speaker") == fw.Box([-0.5, -0.5, -0.5, 0.0, 0.0], 1.0, (5,)), b.action_space("speaker")
assert b.unpad_action("speaker", [-0.75, 0.25, 2.0, 0.5, 0.5]).tolist() == [-0.5, 0.25, 1.0]
assert b.unpad_action("listener", [-0.75, 0.25, 0.5, 2.0, 0.75]).tolist() == [0.0, 0.25, 0.5, 1.0, 0.75]
expect_error(lambda: fw.pad_agents(TwoKinds(("d", "b"))), "different kinds", "all Discrete or all Box")
print("agents of different spaces, padded for one policy ok")


# 4e. Several policies (farm_worker.policies): each policy's rows of a joint env, its own spaces and returns.
from farm_worker.policies import MultiPolicyGroup, MultiPolicyWorker, PolicySpec, assign_agents  # noqa: E402
import signals_env  # noqa: E402

specs = [PolicySpec("talk", "tcp://127.0.0.1:1", ["speaker"]), PolicySpec("hear", "tcp://127.0.0.1:2", ["listener_*"])]
assert assign_agents(["speaker", "listener_0", "listener_1"], specs) == [[0], [1, 2]]
# The first policy that matches takes an agent; agent indices name the agents of an array-style env.
assert assign_agents(["0", "1", "2"], [PolicySpec("a", "", ["1"]), PolicySpec("b", "", ["*"])]) == [[1], [0, 2]]
expect_error(lambda: assign_agents(["speaker", "listener_0", "other"], specs), "'other' belongs to no policy",
             "listener_*")
expect_error(lambda: assign_agents(["speaker", "x"], [PolicySpec("a", "", ["*"]), PolicySpec("b", "", ["x"])]),
             "policy 'b'", "matches none")
expect_error(lambda: assign_agents(["a"], [PolicySpec("p", "", ["a"]), PolicySpec("p", "", ["a"])]), "must differ")
expect_error(lambda: PolicySpec("bad name", "", ["a"]), "policy name 'bad name'")
expect_error(lambda: PolicySpec("p", "", []), "names no agents")
expect_error(lambda: MultiPolicyGroup([signals_env.make()], [PolicySpec("all", "", ["*"])]),
             "policy 'all'", "'listener_0' has other spaces than agent 'speaker'")
expect_error(lambda: MultiPolicyGroup([Counter()], specs), "multi-agent env", "single")

envs = [signals_env.Signals(), signals_env.Signals(early=3)]
g = MultiPolicyGroup(envs, specs)
talk, hear = g.views
assert (talk.num_agents, hear.num_agents, talk.rows, hear.rows) == (1, 2, 2, 4)
assert talk.observation_space.shape == (3,) and hear.observation_space.shape == (2, 5)
assert talk.action_space == fw.Discrete(3) and hear.action_space == fw.Discrete(5)
assert talk.state_space.shape == hear.state_space.shape == (2,)
g.reset(seed=[5, 6])
assert talk.obs.shape == (2, 3) and hear.obs.shape == (4, 2, 5) and talk.state.shape == hear.state.shape == (2, 2)
cue = lambda e: int(np.argmax(talk.obs[e]))
target = lambda e, k: int(np.argmax(hear.obs[2 * e + k, 0]))
returns = {"talk": [0.0, 0.0], "hear": [0.0, 0.0]}
for t in range(10):
    # The speakers right; listener_0 right, listener_1 wrong in env 0, both right in env 1.
    ta = np.array([cue(0), cue(1)], np.int64)
    ha = np.array([target(0, 0), (target(0, 1) + 1) % 5, target(1, 0), target(1, 1)], np.int64)
    active_before = hear.active.copy()
    info_t, info_h = g.step([ta, ha])
    assert talk.reward.tolist() == [1.0, 1.0], (t, talk.reward)
    want_h = [1.0, 0.0, 1.0, 1.0 if active_before[3] else 0.0]
    assert hear.reward.tolist() == want_h, (t, hear.reward, want_h)
    if t == 2:  # env 1's listener_1 finishes: its row alone is terminated and inactive from now on
        assert hear.terminated.tolist() == [0, 0, 0, 1] and hear.active.tolist() == [1, 1, 1, 0]
        assert talk.terminated.tolist() == [0, 0] and talk.active.tolist() == [1, 1]
    if t == 5:
        assert hear.terminated.tolist() == [0, 1, 0, 0] and hear.active.tolist() == [1, 0, 1, 0], hear.active
    if t < 9:
        assert not info_t["episodes"] and not info_h["final_obs_index"]
# Step 10: every env truncated; every policy's rows flagged alike, final observations per policy, the state to both.
assert talk.truncated.tolist() == [1, 1] and hear.truncated.tolist() == [1, 1, 1, 1] and hear.terminated.sum() == 0
assert info_t["final_obs_index"] == [0, 1] and info_h["final_obs_index"] == [0, 1, 2, 3]
assert info_t["final_obs"].shape == (2, 3) and info_h["final_obs"].shape == (4, 2, 5)
assert info_t["final_state"].tolist() == info_h["final_state"].tolist() and info_t["final_state"][0][0] == 1.0
# Returns: the speaker's own; the listeners' mean: env 0 (10 + 0) / 2, env 1 (10 + 3) / 2.
assert info_t["episodes"] == [(10.0, 10), (10.0, 10)], info_t["episodes"]
assert info_h["episodes"] == [(5.0, 10), (6.5, 10)], info_h["episodes"]
assert hear.active.all() and talk.state[:, 0].tolist() == [0.0, 0.0]  # reset within the step
# Actions reach the agents they are for: the speaker's 2 and the listeners' 4 and 3.
seen = []
class Spy(signals_env.Signals):
    def step(self, actions):
        seen.append(dict(actions))
        return super().step(actions)
h = MultiPolicyGroup([Spy()], specs)
h.reset(seed=1)
h.step([np.array([2], np.int64), np.array([4, 3], np.int64)])
assert seen == [{"speaker": 2, "listener_0": 4, "listener_1": 3}], seen
# Every agent of one policy finishing while another policy's agents act on is refused by name.
solo = [PolicySpec("talk", "", ["speaker"]), PolicySpec("hear", "", ["listener_0"]), PolicySpec("late", "", ["listener_1"])]
g2 = MultiPolicyGroup([signals_env.Signals(early=2)], solo)
g2.reset(seed=1)
acts = [np.zeros(1, np.int64)] * 3
g2.step(acts)
expect_error(lambda: g2.step(acts), "every agent of policy 'late'", "not supported")
# The worker: one connection per policy over that policy's views, identities per policy.
w = MultiPolicyWorker([signals_env.make] * 4, specs, num_groups=2, worker_id="w7")
assert [c.identity for c in w.channels] == [b"w7-talk-c0", b"w7-hear-c0"]
assert [c.groups[1] for c in w.channels] == w.groups[1].views and w.channels[1].groups[0].num_agents == 2
assert w.channels[0].num_agents == 1 and w.channels[1].state_space.shape == (2,)
assert w.channels[0].env_name == "signals_v0"
w.close()
print("several policies ok (rows, spaces, ends, returns, actions, worker connections)")


# 4d. One team trained against opponents that act inside the env (farm_worker.play_against).
class Duel:
    """adv_0 (3 actions) against good_0 and good_1 (2 actions each); observations [agent index, t]; each agent's reward
    is its action; everyone truncated after step 3; state [t]."""
    metadata = {"name": "duel_v0"}

    def __init__(self):
        self.possible_agents = ["adv_0", "good_0", "good_1"]
        self.state_space = fw.Box(0.0, 10.0, (1,))
        self.seen = []

    def observation_space(self, agent):
        return fw.Box(-10.0, 10.0, (2,))

    def action_space(self, agent):
        return fw.Discrete(3 if agent.startswith("adv") else 2)

    def state(self):
        return np.array([self.t], np.float32)

    def _obs(self):
        return {a: np.array([i, self.t], np.float32) for i, a in enumerate(self.possible_agents) if a in self.agents}

    def reset(self, seed=None, options=None):
        self.t, self.agents = 0, list(self.possible_agents)
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions):
        assert set(actions) == set(self.agents), actions
        self.seen.append(dict(actions))
        self.t += 1
        rew = {a: float(actions[a]) for a in self.agents}
        trunc = {a: self.t >= 3 for a in self.agents}
        obs = self._obs()
        self.agents = [a for a in self.agents if not trunc[a]]
        return obs, rew, {a: False for a in trunc}, trunc, {a: {} for a in trunc}


# A callable opponent sees its own last observation; the farm sees the good agents alone.
calls = []
d = fw.play_against(Duel(), "adv_*", policy=lambda agent, obs: calls.append((agent, obs.tolist())) or 2)
assert d.possible_agents == ["good_0", "good_1"] and d.observation_space("good_0").shape == (2,)
g = ArrayGroup([d])
assert g.num_agents == 2 and g.state_space.shape == (1,)
g.reset()
for t in range(1, 4):
    obs, r, term, trunc, info = g.step(np.array([1, 0], np.int64))
    assert d.env.seen[-1] == {"adv_0": 2, "good_0": 1, "good_1": 0} and r.tolist() == [1, 0], (d.env.seen, r)
assert calls == [("adv_0", [0, 0]), ("adv_0", [0, 1]), ("adv_0", [0, 2])], calls
assert trunc.tolist() == [1, 1] and info["episodes"] == [(1.5, 3)], (trunc, info)
assert d.opponent_returns == {"adv_0": 6.0}, d.opponent_returns
assert g.state.tolist() == [[0]]  # reset in the same step, as any PettingZoo env
# A random opponent: uniform over its own actions, seeded by the env's reset seed.
draws = []
for seed in (5, 5, 6):
    r_env = fw.play_against(Duel(), ["adv_0"])
    r_env.reset(seed=seed)
    for _ in range(3):
        r_env.step({"good_0": 0, "good_1": 0})
    draws.append([s["adv_0"] for s in r_env.env.seen])
assert draws[0] == draws[1] and all(a in (0, 1, 2) for a in draws[0]), draws
many = fw.play_against(Duel(), "adv_0")
many.reset(seed=1)
seen = set()
for _ in range(60):
    if not many.agents:
        many.reset()
    many.step({"good_0": 0, "good_1": 0})
    seen.add(many.env.seen[-1]["adv_0"])
assert seen == {0, 1, 2}, seen
expect_error(lambda: fw.play_against(Duel(), "red_*"), "'red_*' names no agent", "adv_0")
expect_error(lambda: fw.play_against(Duel(), "*"), "names every agent", "at least one")
expect_error(lambda: fw.play_against(Duel(), "adv_0", policy=3), "expected 'random', a callable")
try:
    import torch
except ImportError:
    torch = None
if torch is not None:
    # A frozen opponent: a TorchScript policy as farm-export writes one (observation in, action out).
    import tempfile

    class Argmax(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x[:, 1] % 3).to(torch.int64)

    with tempfile.TemporaryDirectory() as tmp:
        torch.jit.script(Argmax()).save(tmp + "/adv.pt")
        e = fw.play_against(Duel(), "adv_0", policy=tmp + "/adv.pt")
        e.reset()
        for _ in range(3):
            e.step({"good_0": 0, "good_1": 0})
        assert [s["adv_0"] for s in e.env.seen] == [0, 1, 2], e.env.seen
    expect_error(lambda: fw.play_against(Duel(), "adv_0", policy="/nonexistent.pt"), "cannot load", "nonexistent")

    # A recurrent one (as farm-export writes a policy with a core): the state carried, zeroed at each reset. This
    # one acts (number of steps seen in the episode) % 3.
    class Counting(torch.nn.Module):
        def forward(self, x: torch.Tensor, state: torch.Tensor):
            state = state + 1
            return (state[:, 0] % 3).to(torch.int64), state

        @torch.jit.export
        def initial_state(self, batch: int):
            return torch.zeros([batch, 2])

    with tempfile.TemporaryDirectory() as tmp:
        torch.jit.script(Counting()).save(tmp + "/adv.pt")
        e = fw.play_against(Duel(), "adv_0", policy=tmp + "/adv.pt")
        for _ in range(2):
            e.reset()
            for _ in range(3):
                e.step({"good_0": 0, "good_1": 0})
        assert [s["adv_0"] for s in e.env.seen] == [1, 2, 0, 1, 2, 0], e.env.seen
    print("play_against ok (random, callable and exported opponents, feed-forward and recurrent)")
else:
    print("play_against ok (random and callable opponents; exported ones skipped: no Python torch)")


# 5. Vectorised envs.
class Batched:
    """num_envs counters; env i truncates after 3 + i steps; same-step autoreset with infos['final_obs']."""

    def __init__(self, n=3, mode="SAME_STEP", key="final_obs"):
        self.num_envs, self.key = n, key
        self.metadata = {"autoreset_mode": mode} if mode else {}
        self.single_observation_space = fw.Box(-1e3, 1e3, (2,))
        self.single_action_space = fw.Box(-1.0, 1.0, (1,))
        self.calls = 0

    def reset(self, seed=None):
        self.t = np.zeros(self.num_envs)
        return np.stack([self.t, np.arange(self.num_envs)], 1), {}

    def step(self, actions):
        assert actions.shape == (self.num_envs, 1) and actions.dtype == np.float32
        self.calls += 1
        self.t += 1
        trunc = self.t >= 3 + np.arange(self.num_envs)
        final = np.stack([self.t, np.arange(self.num_envs)], 1)
        self.t[trunc] = 0
        obs = np.stack([self.t, np.arange(self.num_envs)], 1)
        infos = {self.key: np.where(trunc[:, None], final, 0), "_" + self.key: trunc} if trunc.any() else {}
        return obs, actions[:, 0] * 2, np.zeros(self.num_envs, bool), trunc, infos


for key in ("final_obs", "final_observation"):
    b = BatchedGroup(Batched(key=key))
    b.reset()
    for t in range(3):
        obs, r, term, trunc, info = b.step(np.full((3, 1), 0.25, np.float32))
    assert b.venv.calls == 3 and r.tolist() == [0.5] * 3
    assert info["final_obs_index"] == [0] and info["final_obs"].tolist() == [[3, 0]] and obs[0].tolist() == [0, 0]
    assert info["episodes"] == [(1.5, 3)]
expect_error(lambda: BatchedGroup(Batched(mode="NEXT_STEP")), "NEXT_STEP", "SAME_STEP")
w = fw.PythonWorker([Batched] * 8, "tcp://127.0.0.1:1", num_groups=2)
assert w.num_envs == 6 and all(isinstance(g, BatchedGroup) for g in w.groups)
w.close()
expect_error(lambda: fw.PythonWorker([Team] * 2, "tcp://127.0.0.1:1", num_groups=1, use_numpy=False), "numpy")
print("vectorised envs ok")
