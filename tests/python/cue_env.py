"""CueEnv: a tiny episodic contextual bandit for the Python worker's end-to-end test.

Observation: 4 floats [cue, noise, noise, t / length], cue = -1 or +1 drawn anew every step.
Actions: 2; reward 1 when the action matches the cue (0 for -1, 1 for +1), else 0.
Episodes end by the time limit after `length` (10) steps, reported as truncated (Gymnasium
semantics), so the maximum return is 10 and a uniform policy averages 5.

make_continuous() gives the same cue with one continuous action in [-1, 1]
(reward 1 - |action - cue| / 2), for the float32 action path.

make_multi() gives two cues answered by one multi-discrete action, nvec [2, 3] with start
[0, -1] (Gymnasium's MultiDiscrete start): action[0] in {0, 1} answers the sign cue as above,
action[1] in {-1, 0, 1} repeats a second cue; reward 0.5 per component matched (max return 10,
uniform policy 10 * (1/4 + 1/6) = 4.2). It raises on an action that is not two ints in range.

make_scaled() gives the same task with badly scaled observations and rewards, for the
normalisation test: observation [200 + 50 cue, noise with rare spikes of 1000, 3 + 0.01 noise,
1000 t / length], reward 50 or 0 (max return 500). With $CUE_ENV_LOG set, each such env
appends what it returned (every observation, whether it ended an episode, every reward) as one
JSON line to that file when it is closed.

Pure Python, no numpy or gymnasium: its spaces are small duck-typed objects, as a
Gymnasium env's would be (Discrete: `n`; Box: `shape`, `low`, `high`).
"""
import itertools
import json
import os
import random


class _Discrete:
    def __init__(self, n):
        self.n = n


class _MultiDiscrete:
    def __init__(self, nvec, start):
        self.nvec, self.start = nvec, start


class _Box:
    def __init__(self, low, high, shape):
        self.low, self.high, self.shape = low, high, shape


class CueEnv:
    def __init__(self, length=10):
        self.length = length
        self.observation_space = _Box(low=[-1.0, -1.0, -1.0, 0.0], high=[1.0, 1.0, 1.0, 1.0], shape=(4,))
        self.action_space = _Discrete(2)
        self._rng = random.Random()
        self._t = 0
        self._cue = 1.0

    def _obs(self):
        self._cue = self._rng.choice((-1.0, 1.0))
        return [self._cue, self._rng.uniform(-1, 1), self._rng.uniform(-1, 1), self._t / self.length]

    def reset(self, seed=None, options=None):
        if seed is not None:
            self._rng.seed(seed)
        self._t = 0
        return self._obs(), {}

    def step(self, action):
        reward = 1.0 if (action == 1) == (self._cue > 0) else 0.0
        self._t += 1
        truncated = self._t >= self.length
        return self._obs(), reward, False, truncated, {}


class ContinuousCueEnv(CueEnv):
    """The same cue with one continuous action in [-1, 1]: reward 1 - |action - cue| / 2."""

    def __init__(self, length=10):
        super().__init__(length)
        self.action_space = _Box(low=-1.0, high=1.0, shape=(1,))

    def step(self, action):
        a = max(-1.0, min(1.0, float(action[0])))
        reward = 1.0 - abs(a - self._cue) / 2.0
        self._t += 1
        return self._obs(), reward, False, self._t >= self.length, {}


class MultiCueEnv(CueEnv):
    """Two cues, one multi-discrete action (see above)."""

    def __init__(self, length=10):
        super().__init__(length)
        self.action_space = _MultiDiscrete(nvec=[2, 3], start=[0, -1])
        self._cue2 = 0

    def _obs(self):
        obs = super()._obs()
        self._cue2 = self._rng.choice((-1, 0, 1))
        obs[1] = float(self._cue2)
        return obs

    def step(self, action):
        if hasattr(action, "tolist"):  # a numpy array, as the worker's numpy path passes (Gymnasium envs take both)
            action = action.tolist()
        if (not isinstance(action, list) or len(action) != 2 or not all(isinstance(a, int) for a in action)
                or action[0] not in (0, 1) or action[1] not in (-1, 0, 1)):
            raise ValueError(f"MultiCueEnv: expected [0..1, -1..1] as two ints, got {action!r}")
        reward = 0.5 * ((action[0] == 1) == (self._cue > 0)) + 0.5 * (action[1] == self._cue2)
        self._t += 1
        return self._obs(), reward, False, self._t >= self.length, {}


class ScaledCueEnv(CueEnv):
    """CueEnv with observations and rewards far from unit scale; logs what it returned (see above)."""

    _ids = itertools.count()

    def __init__(self, length=10):
        super().__init__(length)
        self.observation_space = _Box(low=[150.0, -1.0, 2.99, 0.0], high=[250.0, 1000.0, 3.01, 1000.0], shape=(4,))
        self.id = next(ScaledCueEnv._ids)  # creation order: the worker builds group 0's envs first
        self.log = {"id": self.id, "obs": [], "ended": [], "rewards": []}

    def _scaled(self, obs):
        cue, noise, noise2, t = obs
        spike = 1000.0 if self._rng.random() < 0.003 else noise
        return [200.0 + 50.0 * cue, spike, 3.0 + 0.01 * noise2, 1000.0 * t]

    def reset(self, seed=None, options=None):
        obs, info = super().reset(seed, options)
        obs = self._scaled(obs)
        self.log["obs"].append(obs)
        self.log["ended"].append(False)
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        obs, reward = self._scaled(obs), 50.0 * reward
        self.log["obs"].append(obs)
        self.log["ended"].append(bool(terminated or truncated))
        self.log["rewards"].append(reward)
        return obs, reward, terminated, truncated, info

    def close(self):
        path = os.environ.get("CUE_ENV_LOG")
        if path:
            with open(path, "a") as f:
                f.write(json.dumps(self.log) + "\n")


class TeamCueEnv:
    """Multi-agent, in the array style, numpy: 3 agents, each sees a cue of its own ([cue, noise, t / length]);
    the team reward is the fraction of agents whose action matches their cue (max return 10, uniform random 5).
    The global state is every agent's cue and t / length ([4]); episodes end by the time limit (truncated), so
    final observations and final states travel. Needs numpy."""

    num_agents = 3

    def __init__(self, length=10):
        import numpy as np
        self.np, self.length = np, length
        self.observation_space = _Box(low=-1.0, high=1.0, shape=(3,))
        self.action_space = _Discrete(2)
        self.state_space = _Box(low=-1.0, high=1.0, shape=(4,))
        self._rng = np.random.default_rng()
        self._t = 0

    def _out(self):
        np = self.np
        self._cues = self._rng.choice([-1.0, 1.0], size=3)
        obs = np.stack([self._cues, self._rng.uniform(-1, 1, 3), np.full(3, self._t / self.length)], axis=1)
        return obs, np.append(self._cues, self._t / self.length)

    def reset(self, seed=None):
        if seed is not None:
            self._rng = self.np.random.default_rng(seed)
        self._t = 0
        return self._out()

    def step(self, actions):
        reward = float(((actions == 1) == (self._cues > 0)).mean())
        self._t += 1
        obs, state = self._out()
        return obs, state, reward, False, self._t >= self.length, {}


def make():
    return CueEnv()


def make_team():
    return TeamCueEnv()


def make_multi():
    return MultiCueEnv()


def make_scaled():
    return ScaledCueEnv()


def make_continuous():
    return ContinuousCueEnv()
