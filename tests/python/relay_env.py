"""A PettingZoo Parallel env (duck-typed: PettingZoo itself is not needed) whose agents finish at different steps,
for tests/active_mask_e2e.sh.

Two agents see a cue (one of two, new every step) and their own id, and get reward 1 for the action that matches
the cue, 0 otherwise. The scout terminates after 3 steps; the runner is truncated after 10, which ends the env.
The episode return (the mean over agents of their summed rewards) is at most (3 + 10) / 2 = 6.5, and 3.25 for a
uniformly random team. The scout's rows from step 4 on are inactive: the farm leaves them out of training.
"""
import numpy as np


class _Box:
    def __init__(self, low, high, shape):
        self.low, self.high, self.shape, self.dtype = low, high, shape, np.float32


class _Discrete:
    def __init__(self, n):
        self.n, self.start, self.dtype = n, 0, np.int64


class RelayEnv:
    metadata = {"name": "relay_v0"}
    possible_agents = ["scout", "runner"]
    SCOUT_STEPS, RUNNER_STEPS = 3, 10

    def __init__(self, seed=0):
        self._rng = np.random.default_rng(seed)
        self.agents = []
        self._t = 0
        self._cue = 0

    def observation_space(self, agent):
        return _Box(0.0, 1.0, (4,))

    def action_space(self, agent):
        return _Discrete(2)

    def _obs(self, agent):
        o = np.zeros(4, np.float32)
        o[self._cue] = 1.0
        o[2 + self.possible_agents.index(agent)] = 1.0
        return o

    def reset(self, seed=None, options=None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self._t = 0
        self._cue = int(self._rng.integers(2))
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        if set(actions) != set(self.agents):
            raise ValueError(f"actions for {sorted(actions)}, expected the live agents {sorted(self.agents)}")
        rewards = {a: float(int(actions[a]) == self._cue) for a in self.agents}
        self._t += 1
        self._cue = int(self._rng.integers(2))
        terms = {a: a == "scout" and self._t >= self.SCOUT_STEPS for a in self.agents}
        truncs = {a: self._t >= self.RUNNER_STEPS for a in self.agents}
        obs = {a: self._obs(a) for a in self.agents}
        infos = {a: {} for a in self.agents}
        self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
        return obs, rewards, terms, truncs, infos


def make_env(seed=0):
    return RelayEnv(seed)
