"""A delayed cue in numpy, vectorised: MemoryCue-v0 (worker/envs/memory_cue.h) written the way a numpy project writes
a batched env, a partially observable task for a recurrent policy (ppo.core: gru). The first observation of an
episode shows a cue; `delay` steps later the agent must answer it, with nothing in between to remind it.

The farm's worker takes it as it is (the "vectorised" style of docs/ENVIRONMENTS.md, "Python environments"; the
factory is called once per group, and each call is one group of num_envs envs stepped with one call):
    num_envs, single_observation_space, single_action_space, metadata["autoreset_mode"] == "SAME_STEP"
    reset(seed=None) -> (obs [N, 2 + C], infos)          seed: None, an int, or one int per env (the farm's)
    step(actions [N]) -> (obs, rewards [N], terminated [N], truncated [N], infos)
A finished env starts its next episode within the same step (its row of obs is the new first observation) and its
last observation is in infos["final_obs"] (mask infos["_final_obs"]), Gymnasium's same-step convention.

Rules (MemoryCue-v0's, D = delay, C = choices, t the steps taken in the episode so far, 0 at reset):
    observation [2 + C] floats in [0, 1]: [t / D, 1 if t == 0 else 0, one-hot cue if t == 0 else C zeros];
    the cue is drawn uniformly from [0, C) at each reset; actions Discrete(C);
    the actions at t = 0 .. D - 1 pay 0; the action at t = D (the answer step, obs[0] == 1) pays +1 when it equals
    the cue, else 0, and ends the episode (terminated; never truncated). An episode is D + 1 steps, its return 1 or
    0, so the mean return is the fraction answered right. The last observation (never acted on) is [1, 0, ..., 0].
A memoryless (MLP) policy sees [1, 0, ..., 0] at the answer step whatever the cue, so it is right 1 / C of the time
(0.5 with C = 2) whatever it learns; a policy that keeps the cue for D steps is always right. The farm's target for
it is 0.95 (examples/python/memory_cue.yaml), MemoryCue-v0's reward_threshold.

Baseline: `python3 memory_cue_np.py` plays the best memoryless policy (always answer 0) and one that remembers, and
prints their mean returns.
"""
from __future__ import annotations

import numpy as np

# Gymnasium's spaces work here too; the farm reads any object with n, or shape/low/high.
try:
    from farm_worker import Box, Discrete
except ImportError:  # without the farm on the path: simple stand-ins with the same fields
    class Discrete:  # type: ignore[no-redef]
        def __init__(self, n):
            self.n = n

    class Box:  # type: ignore[no-redef]
        def __init__(self, low, high, shape):
            self.low, self.high, self.shape = low, high, tuple(shape)


class MemoryCueVec:
    """num_envs MemoryCue episodes stepped together (see the module's docstring for the rules)."""

    metadata = {"name": "memory_cue_np", "autoreset_mode": "SAME_STEP"}

    def __init__(self, num_envs: int = 16, delay: int = 32, choices: int = 2, seed=None):
        for key, value, low in (("num_envs", num_envs, 1), ("delay", delay, 1), ("choices", choices, 2)):
            if int(value) != value or value < low:
                raise ValueError(f"{key} must be a whole number >= {low}, got {value}")
        self.num_envs, self.delay, self.choices = int(num_envs), int(delay), int(choices)
        self.single_observation_space = Box(0.0, 1.0, (2 + self.choices,))
        self.single_action_space = Discrete(self.choices)
        self.rng = np.random.default_rng(seed)
        self.t = np.zeros(self.num_envs, np.int64)  # steps taken in each env's episode
        self.cue = np.zeros(self.num_envs, np.int64)
        self._rows = np.arange(self.num_envs)

    def reset(self, seed=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)  # an int or a list of ints (one per env) alike
        self.t[:] = 0
        self.cue[:] = self.rng.integers(0, self.choices, self.num_envs)
        return self._obs(), {}

    def step(self, actions):
        a = np.asarray(actions, np.int64).reshape(-1)
        if a.shape != (self.num_envs,):
            raise ValueError(f"expected {self.num_envs} actions, got shape {list(np.shape(actions))}")
        bad = np.flatnonzero((a < 0) | (a >= self.choices))
        if len(bad):
            raise ValueError(f"env {bad[0]}: action {a[bad[0]]} outside [0, {self.choices})")
        answer = self.t == self.delay
        reward = (answer & (a == self.cue)).astype(np.float32)
        terminated = answer
        self.t += 1
        infos = {}
        if terminated.any():
            infos = {"final_obs": self._obs(), "_final_obs": terminated.copy()}
            # Same-step auto-reset: a new cue and t = 0 for the envs that answered.
            done = np.flatnonzero(terminated)
            self.t[done] = 0
            self.cue[done] = self.rng.integers(0, self.choices, len(done))
        return self._obs(), reward, terminated, np.zeros(self.num_envs, bool), infos

    def _obs(self):
        obs = np.zeros((self.num_envs, 2 + self.choices), np.float32)
        obs[:, 0] = np.minimum(self.t, self.delay) / self.delay  # stays 1 after the answer, within the box
        first = self.t == 0
        obs[first, 1] = 1.0
        obs[self._rows[first], 2 + self.cue[first]] = 1.0
        return obs


def make_env():
    """The factory the config names (env.python: examples/python/memory_cue_np.py:make_env): 16 envs, delay 32, two
    cues. For other settings, name a factory of your own, e.g. `def make_env8(): return MemoryCueVec(delay=8)`."""
    return MemoryCueVec()


def play(policy: str, episodes: int = 2000, delay: int = 32, choices: int = 2, seed: int = 0) -> float:
    """The mean return of 'always0' (answer 0 whatever the cue: as good as any memoryless policy) or 'remember'
    (answer the cue seen at the first step) over at least `episodes` episodes."""
    env = MemoryCueVec(num_envs=64, delay=delay, choices=choices)
    obs, _ = env.reset(seed=seed)
    seen = np.zeros(env.num_envs, np.int64)
    returns = []
    while len(returns) < episodes:
        shown = obs[:, 1] == 1.0
        seen[shown] = np.argmax(obs[shown, 2:], axis=1)
        act = np.zeros(env.num_envs, np.int64) if policy == "always0" else np.where(obs[:, 0] == 1.0, seen, 0)
        obs, reward, terminated, _, _ = env.step(act)
        returns.extend(reward[terminated].tolist())
    return float(np.mean(returns))


if __name__ == "__main__":
    for policy in ("always0", "remember"):
        print(f"{policy:>8}: mean return {play(policy):.3f} over 2000+ episodes (delay 32, 2 cues)")
