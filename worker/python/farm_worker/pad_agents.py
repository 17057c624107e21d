"""pad_agents(env): a PettingZoo Parallel env whose agents have different spaces, as one whose agents share theirs,
so that one policy acts for all of them (the shared policy of MAPPO and EPyMARL, with an agent id).

    from farm_worker import pad_agents
    def make_env():
        return pad_agents(simple_speaker_listener_v4.parallel_env(continuous_actions=False))

What the policy sees and does (the padding conventions of SuperSuit's pad_observations and pad_action_space):
  * observations: each agent's Box, flattened, zero-padded at the end to the largest agent's size, then (agent_id,
    the default) a one-hot of the agent's index in possible_agents appended, so that the shared policy can tell the
    agents apart even where their observations look alike. Every agent's space is the same Box: per entry the
    widest bounds over the agents (0 included where an agent pads), [0, 1] on the id;
  * Discrete actions: the largest agent's number of actions; an action an agent does not have (index >= its own
    n) is taken as its first action (MPE's no-op). Box actions: flattened, the largest agent's size, per entry the
    widest bounds; an agent takes its own first entries, clipped to its own bounds. Agents whose actions are of
    different kinds (Discrete and Box), or MultiDiscrete, are refused by name;
  * everything else (state() and state_space for a centralised critic, agents, rewards, ends, infos, metadata,
    render, close) is the env's own.

An agent's padded actions are ones it never needs: the policy learns that they do what its first action does. A
policy per kind of agent, each with its own spaces, is the alternative this does not give.

Threading: as the env it wraps (the worker's one thread).
"""
from __future__ import annotations

from typing import Any, Dict

try:
    import numpy as np
except ImportError:  # `import farm_worker` works without numpy (the pure-Python path); pad_agents needs it
    np = None

from .errors import WorkerError
from .spaces import Box, Discrete, MultiDiscrete, space_of


def _space(env, name: str, agent):
    if getattr(env, name, None) is None:
        raise WorkerError(f"pad_agents: the env has no {name}")
    return space_of(env, name, agent)


def _widest(spaces, size: int, pad_value: float):
    """Per entry of `size`, the lowest low and highest high over Boxes (flattened) that reach it; an entry an agent
    does not reach counts `pad_value` (what that agent holds there)."""
    low, high = [], []
    for i in range(size):
        lo = [s.low[i] if i < s.numel else pad_value for s in spaces]
        hi = [s.high[i] if i < s.numel else pad_value for s in spaces]
        low.append(min(lo))
        high.append(max(hi))
    return low, high


class PaddedAgents:
    """A PettingZoo Parallel env (duck-typed) whose agents share one observation space and one action space; see the
    module's text. agent_id: append a one-hot of the agent's index to its observation."""

    def __init__(self, env, agent_id: bool = True):
        if np is None:
            raise WorkerError("pad_agents needs numpy (Debian: python3-numpy)")
        self.env = env
        self.possible_agents = list(getattr(env, "possible_agents", []) or [])
        if not self.possible_agents:
            raise WorkerError("pad_agents: the env has no possible_agents (expected a PettingZoo Parallel env)")
        self.agent_id = bool(agent_id)
        self._index = {a: i for i, a in enumerate(self.possible_agents)}
        self._obs_spaces = {a: _space(env, "observation_space", a) for a in self.possible_agents}
        self._act_spaces = {a: _space(env, "action_space", a) for a in self.possible_agents}

        for a, s in self._obs_spaces.items():
            if not isinstance(s, Box):
                raise WorkerError(f"pad_agents: agent {a!r} observes {s!r}; expected a Box")
        obs = list(self._obs_spaces.values())
        self._obs_size = max(s.numel for s in obs)
        low, high = _widest(obs, self._obs_size, 0.0)
        if self.agent_id:
            low += [0.0] * len(self.possible_agents)
            high += [1.0] * len(self.possible_agents)
        self._observation_space = Box(low, high, (len(low),))

        acts = list(self._act_spaces.values())
        kinds = {type(s).__name__ for s in acts}
        if any(isinstance(s, MultiDiscrete) for s in acts):
            raise WorkerError("pad_agents: MultiDiscrete actions are not padded (agents "
                              f"{[a for a, s in self._act_spaces.items() if isinstance(s, MultiDiscrete)]}); "
                              "expected Discrete or Box for every agent")
        if len(kinds) != 1:
            raise WorkerError("pad_agents: the agents' actions are of different kinds "
                              f"({ {a: repr(s) for a, s in self._act_spaces.items()} }); expected all Discrete or "
                              "all Box")
        if isinstance(acts[0], Discrete):
            self._action_space = Discrete(max(s.n for s in acts))
        else:
            size = max(s.numel for s in acts)
            # An entry an agent lacks is dropped for it: the widest bounds of those that have it.
            low = [min(s.low[i] for s in acts if i < s.numel) for i in range(size)]
            high = [max(s.high[i] for s in acts if i < s.numel) for i in range(size)]
            self._action_space = Box(low, high, (size,))

    # The spaces the farm sees: one for every agent.
    def observation_space(self, agent):
        self._check_agent(agent)
        return self._observation_space

    def action_space(self, agent):
        self._check_agent(agent)
        return self._action_space

    # The env's own spaces, for code that needs them.
    def original_observation_space(self, agent):
        return self._obs_spaces[agent]

    def original_action_space(self, agent):
        return self._act_spaces[agent]

    @property
    def agents(self):
        return self.env.agents

    def _check_agent(self, agent):
        if agent not in self._index:
            raise WorkerError(f"pad_agents: unknown agent {agent!r}; expected one of {self.possible_agents}")

    def pad_observation(self, agent, obs) -> np.ndarray:
        """The agent's observation as the shared policy sees it."""
        own = self._obs_spaces[agent]
        flat = np.asarray(obs, np.float32).reshape(-1)
        if flat.size != own.numel:
            raise WorkerError(f"pad_agents: agent {agent!r} observed {flat.size} numbers; its observation_space "
                              f"{own!r} has {own.numel}")
        out = np.zeros(self._observation_space.numel, np.float32)
        out[:flat.size] = flat
        if self.agent_id:
            out[self._obs_size + self._index[agent]] = 1.0
        return out

    def unpad_action(self, agent, action):
        """The shared policy's action as the agent takes it."""
        own = self._act_spaces[agent]
        if isinstance(own, Discrete):
            a = int(action)
            return own.start + (a if 0 <= a < own.n else 0)
        flat = np.asarray(action, np.float32).reshape(-1)[:own.numel]
        return np.clip(flat, np.asarray(own.low, np.float32), np.asarray(own.high, np.float32)).reshape(own.shape)

    def _pad_all(self, obs: Dict[Any, Any]) -> Dict[Any, np.ndarray]:
        return {a: self.pad_observation(a, o) for a, o in obs.items()}

    def reset(self, seed=None, options=None):
        obs, infos = self.env.reset(seed=seed, options=options)
        return self._pad_all(obs), infos

    def step(self, actions):
        obs, rewards, terms, truncs, infos = self.env.step(
            {a: self.unpad_action(a, act) for a, act in actions.items()})
        return self._pad_all(obs), rewards, terms, truncs, infos

    def __getattr__(self, name):
        # state(), state_space, metadata, render, close ...: the env's own. (Called only for names not found above.)
        if name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)


def pad_agents(env, agent_id: bool = True) -> PaddedAgents:
    """`env` (a PettingZoo Parallel env) with one observation and one action space for every agent: see the module's
    text."""
    return PaddedAgents(env, agent_id)
