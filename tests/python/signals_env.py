"""signals_v0: a PettingZoo-style Parallel env (duck-typed, numpy only) whose agents have spaces of their own, for the
tests of several policies (farm_worker.policies).

  * "speaker": observation [3], a one-hot cue redrawn every step; 3 actions; reward 1 when its action is the cue;
  * "listener_0", "listener_1": observation [2, 5], row 0 a one-hot target redrawn every step, row 1 zeros; 5
    actions; reward 1 when the action is the target. listener_1 finishes (terminated) after `early` steps
    (default 6), then the others play on;
  * every episode is truncated after 10 steps; state() is [t / 10, the speaker's cue / 2], state_space [2].

Best returns (the mean over a policy's agents of their summed rewards): speaker 10, listeners (10 + 6) / 2 = 8;
uniformly random: 10 / 3 and 8 / 5.
"""
import numpy as np


class Box:
    def __init__(self, low, high, shape):
        self.low = np.full(shape, low, np.float32)
        self.high = np.full(shape, high, np.float32)
        self.shape = tuple(shape)
        self.dtype = np.float32


class Discrete:
    def __init__(self, n):
        self.n = n
        self.start = 0


class Signals:
    metadata = {"name": "signals_v0"}
    length = 10

    def __init__(self, early=6):
        self.possible_agents = ["speaker", "listener_0", "listener_1"]
        self.early = early
        self.state_space = Box(0.0, 1.0, (2,))
        self._rng = np.random.default_rng(0)
        self.agents = []

    def observation_space(self, agent):
        return Box(0.0, 1.0, (3,)) if agent == "speaker" else Box(0.0, 1.0, (2, 5))

    def action_space(self, agent):
        return Discrete(3 if agent == "speaker" else 5)

    def _draw(self):
        self.cue = int(self._rng.integers(3))
        self.targets = [int(x) for x in self._rng.integers(5, size=2)]

    def _obs(self):
        out = {}
        if "speaker" in self.agents:
            out["speaker"] = np.eye(3, dtype=np.float32)[self.cue]
        for k in (0, 1):
            a = f"listener_{k}"
            if a in self.agents:
                o = np.zeros((2, 5), np.float32)
                o[0, self.targets[k]] = 1.0
                out[a] = o
        return out

    def state(self):
        return np.array([self.t / self.length, self.cue / 2], np.float32)

    def reset(self, seed=None, options=None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self.t = 0
        self._draw()
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions):
        rewards = {}
        for a, act in actions.items():
            want = self.cue if a == "speaker" else self.targets[int(a[-1])]
            rewards[a] = 1.0 if int(act) == want else 0.0
        self.t += 1
        terms = {a: a == "listener_1" and self.t >= self.early for a in self.agents}
        truncs = {a: self.t >= self.length and not terms[a] for a in self.agents}
        self._draw()
        obs = self._obs()
        infos = {a: {} for a in self.agents}
        self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
        return obs, rewards, terms, truncs, infos


def make():
    return Signals()
