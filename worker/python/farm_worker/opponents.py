"""play_against(env, opponents, policy): a PettingZoo Parallel env in which the agents named by `opponents` act by a
fixed policy inside the env, so that the farm trains the other agents (one team) against them.

    from farm_worker import play_against
    def make_env():   # the good agents trained against a uniformly random adversary
        return play_against(simple_adversary_v3.parallel_env(continuous_actions=False), "adversary_*")
    def make_env():   # ... against a frozen adversary: a policy exported by `scripts/farm export RUN_DIR OUT.pt`
        return play_against(simple_adversary_v3.parallel_env(continuous_actions=False), "adversary_*",
                            policy="runs/adversary/policy.pt")

  * opponents: agent names or fnmatch patterns (`adversary_*`), a string or a list; each must name an agent of
    possible_agents, and at least one agent must be left to train;
  * policy: "random" (each opponent uniform over its own action space, from a generator seeded by the env's
    reset seed), a callable policy(agent, observation) -> action (an object with new_episode() is told of each
    reset), or the path of a TorchScript policy exported by farm-export (observation in, deterministic action out;
    with a recurrent core, each opponent's state carried from step to step and zeroed at each reset; loaded with
    Python's torch);
  * the env the farm sees: possible_agents, agents, observations, rewards, ends and infos of the trained agents
    only (their episode return is the farm's); state() and state_space are the env's own, the opponents included,
    for a centralised critic. The opponents' summed rewards of the last finished episode are in
    `opponent_returns` ({agent: return}), for a script that wants them.

Threading: as the env it wraps (the worker's one thread).
"""
from __future__ import annotations

import fnmatch
from typing import Any, Callable, Dict, List, Sequence, Union

try:
    import numpy as np
except ImportError:  # `import farm_worker` works without numpy; play_against needs it
    np = None

from .errors import WorkerError
from .spaces import Box, Discrete, MultiDiscrete, env_space, space_of


def _match(patterns: Sequence[str], agents: List[Any]) -> List[Any]:
    chosen = []
    for p in patterns:
        hit = [a for a in agents if a == p or fnmatch.fnmatchcase(str(a), str(p))]
        if not hit:
            raise WorkerError(f"play_against: {p!r} names no agent; expected one of {agents} (or an fnmatch pattern)")
        chosen += [a for a in hit if a not in chosen]
    return chosen


class _RandomPolicy:
    """Each agent uniform over its own action space."""

    def __init__(self, spaces: Dict[Any, Any]):
        self.spaces = spaces
        for a, s in spaces.items():
            if isinstance(s, Box) and not all(np.isfinite(s.low + s.high)):
                raise WorkerError(f"play_against: opponent {a!r} acts in {s!r} with unbounded entries; a random "
                                  "policy needs finite bounds")
        self.rng = np.random.default_rng(0)

    def seed(self, seed) -> None:
        self.rng = np.random.default_rng(seed)

    def __call__(self, agent, obs):
        s = self.spaces[agent]
        if isinstance(s, Discrete):
            return s.start + int(self.rng.integers(s.n))
        if isinstance(s, MultiDiscrete):
            return np.array([st + int(self.rng.integers(n)) for n, st in zip(s.nvec, s.start)], np.int64)
        return self.rng.uniform(np.asarray(s.low), np.asarray(s.high)).astype(np.float32).reshape(s.shape)


class _ExportedPolicy:
    """A policy exported by farm-export (TorchScript: observation [B, ...] in, action [B, ...] out; with a core,
    module(obs, state) -> (action, state) and initial_state(B)): each opponent keeps its own state, zero at every
    episode's start."""

    def __init__(self, path: str):
        try:
            import torch
        except ImportError:
            raise WorkerError(f"play_against: {path!r} is a TorchScript policy, and Python's torch cannot be "
                              "imported (Debian: python3-torch)") from None
        self.torch = torch
        try:
            self.module = torch.jit.load(path, map_location="cpu")
        except Exception as e:  # torch's own error types differ between versions
            raise WorkerError(f"play_against: cannot load the exported policy {path!r}: {e}") from None
        self.recurrent = hasattr(self.module, "initial_state")
        self.states: Dict[Any, Any] = {}
        self.module.eval()

    def new_episode(self) -> None:
        self.states = {}

    def __call__(self, agent, obs):
        with self.torch.no_grad():
            x = self.torch.as_tensor(np.asarray(obs, np.float32))[None]
            if self.recurrent:
                state = self.states.get(agent)
                action, self.states[agent] = self.module(x, self.module.initial_state(1) if state is None else state)
            else:
                action = self.module(x)
            action = action[0]
        return int(action) if action.dim() == 0 else action.numpy()


class PlayAgainst:
    """See the module's text."""

    def __init__(self, env, opponents: Union[str, Sequence[str]],
                 policy: Union[str, Callable[[Any, Any], Any]] = "random"):
        if np is None:
            raise WorkerError("play_against needs numpy (Debian: python3-numpy)")
        self.env = env
        everyone = list(getattr(env, "possible_agents", []) or [])
        if not everyone:
            raise WorkerError("play_against: the env has no possible_agents (expected a PettingZoo Parallel env)")
        self.opponents = _match([opponents] if isinstance(opponents, str) else list(opponents), everyone)
        self._opponent_set = frozenset(self.opponents)
        self.possible_agents = [a for a in everyone if a not in self._opponent_set]
        if not self.possible_agents:
            raise WorkerError(f"play_against: {opponents!r} names every agent ({everyone}); expected at least one "
                              "left to train")
        if policy == "random":
            self.policy = _RandomPolicy({a: space_of(env, "action_space", a) for a in self.opponents})
        elif isinstance(policy, str):
            self.policy = _ExportedPolicy(policy)
        elif callable(policy):
            self.policy = policy
        else:
            raise WorkerError(f"play_against: policy {policy!r}; expected 'random', a callable or an exported "
                              "policy's path")
        self._last: Dict[Any, Any] = {}
        self._returns: Dict[Any, float] = {}
        self.opponent_returns: Dict[Any, float] = {}

    @property
    def agents(self):
        return [a for a in self.env.agents if a not in self._opponent_set]

    def observation_space(self, agent):
        return env_space(self.env, "observation_space", agent)

    def action_space(self, agent):
        return env_space(self.env, "action_space", agent)

    def _split(self, per_agent: Dict[Any, Any]) -> Dict[Any, Any]:
        return {a: v for a, v in per_agent.items() if a not in self._opponent_set}

    def reset(self, seed=None, options=None):
        obs, infos = self.env.reset(seed=seed, options=options)
        if seed is not None and hasattr(self.policy, "seed"):
            self.policy.seed(seed)
        if hasattr(self.policy, "new_episode"):
            self.policy.new_episode()
        self._last = {a: obs[a] for a in self.opponents if a in obs}
        self._returns = {a: 0.0 for a in self.opponents}
        return self._split(obs), self._split(infos)

    def step(self, actions):
        live = set(self.env.agents)
        full = dict(actions)
        for a in self.opponents:
            if a in live:
                full[a] = self.policy(a, self._last[a])
        obs, rewards, terms, truncs, infos = self.env.step(full)
        for a in self.opponents:
            if a in obs:
                self._last[a] = obs[a]
            self._returns[a] += float(rewards.get(a, 0.0))
        if not self.agents:
            self.opponent_returns = dict(self._returns)
        return self._split(obs), self._split(rewards), self._split(terms), self._split(truncs), self._split(infos)

    def __getattr__(self, name):
        # state(), state_space, metadata, render, close ...: the env's own. (Called only for names not found above.)
        if name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)


def play_against(env, opponents: Union[str, Sequence[str]],
                 policy: Union[str, Callable[[Any, Any], Any]] = "random") -> PlayAgainst:
    """`env` (a PettingZoo Parallel env) with `opponents` acting by `policy` inside it: see the module's text."""
    return PlayAgainst(env, opponents, policy)
