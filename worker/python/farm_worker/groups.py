"""The numpy path: a group of envs stepped together into preallocated numpy buffers, whatever the env's style.

A group is what one StepRequest carries: E envs of A agents each, R = E * A rows, env-major (agent a of env e is
row e * A + a), as worker/env_group.h lays them out. After reset() and step() it holds

    obs         float32 [R, *observation_space.shape]  what the policy acts on (a finished env's new first obs)
    state       float32 [E, *state_space.shape]        the global state per env (None without one)
    reward      float32 [R]                            the step's reward per row (the team's, or each agent's);
                                                       0 on a row inactive before the step
    terminated  uint8   [R], truncated uint8 [R]       per row: equal for every row of an env at its end; an
                                                       agent that finishes before its env terminates its row alone
                                                       (terminated) or flags nothing (truncated alone)
    active      uint8   [R]                            1 where the row's agent acts on obs, 0 where it finished
                                                       earlier in its env's episode (StepRequest.active)
    env_ended   bool    [E]                            the envs whose episode ended with the step (every row flagged)
    env_reward  float64 [E]                            each env's reward of the step: the team's, or the mean over
                                                       its agents of their (inactive: 0) rewards

and step() returns info with "final_obs_index" (the rows of the envs the time limit truncated, ascending, whole
envs), "final_obs" (float32 [len(index), ...]), "final_state" (float32 [len(index) / A, ...]) and "episodes"
([(return, length)] per ended episode; a multi-agent return is the mean over agents of their summed rewards).

Env styles (docs/ENVIRONMENTS.md, "Python environments"):
  * Gymnasium single-agent envs, one per factory call (GymGroup);
  * multi-agent envs in the array style (ArrayGroup): attributes num_agents, observation_space and action_space
    (per agent), state_space (optional); reset(seed=None) -> (obs [A, ...], state); step(actions [A]) ->
    (obs [A, ...], state, reward (a number for the team or [A]), terminated, truncated, info), where terminated
    and truncated are each a bool (the team's: every agent ends with it) or [A] bools, one per agent. With
    arrays an agent may finish before its env: terminated alone, its row is terminated on that step; truncated
    alone, its row gets no flag (the learner bootstraps from the last observation the row keeps); either way the
    row is inactive from then on (its action is still passed and must be ignored, its reward is 0) until the env
    ends, which is when every agent has finished: every row of it is then flagged truncated if an agent that
    finished on that step was truncated (and not terminated), else terminated. A flag on an agent that had
    already finished is ignored;
  * PettingZoo Parallel envs, duck-typed (ParallelEnvAdapter turns one into the array style);
  * vectorised envs with num_envs and batched reset/step with same-step auto-reset (BatchedGroup), stepped with
    one call per group.

Threading: a group belongs to the worker's one thread.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .errors import WorkerError
from .spaces import Box, Discrete, MultiDiscrete, as_space, space_of
from .vector import MAX_FRAME_STACK, env_style




def _box_or_none(space, what: str) -> Optional[Box]:
    if space is None:
        return None
    s = as_space(space)
    if not isinstance(s, Box):
        raise WorkerError(f"{what} must be a box, got {s!r}")
    return s


def step_ends(term: np.ndarray, trunc: np.ndarray, was_active: np.ndarray):
    """One env's step, per agent: its terminated and truncated flags (bool [A], truncated without terminated) and
    which agents acted on the observation it answers -> (terminated [A], truncated [A], active [A], env_end).

    Flags on agents that had already finished are ignored. While some agent acts on, env_end is None: an agent
    ending now alone is terminated on its row, or, truncated, flags nothing (the learner bootstraps from the last
    observation the row keeps), and is inactive until the env ends. When every agent has finished the env ends:
    env_end is "truncated" if an agent ending now was truncated, else "terminated", every row is flagged alike (the
    learner keeps an env's agents together, final observations for whole envs) and every agent acts again after
    the reset."""
    ending = (term | trunc) & was_active
    n = term.size
    if (ending | ~was_active).all():
        truncated = bool(trunc[ending].any())
        return (np.full(n, not truncated), np.full(n, truncated), np.ones(n, bool),
                "truncated" if truncated else "terminated")
    return term & ending, np.zeros(n, bool), was_active & ~ending, None


def agent_rewards(reward, was_active: np.ndarray, e: int):
    """One env's step reward (a number for the team, or one per agent) -> (float32 [A] per agent, 0 where the agent
    had finished; the team's reward as a float, or None when the rewards are per agent)."""
    a = was_active.size
    r = np.asarray(reward, np.float32).reshape(-1)
    if r.size not in (1, a):
        raise WorkerError(f"env {e}: reward has {r.size} values, expected 1 (the team's) or {a} (per agent)")
    out = np.where(was_active, r if r.size == a else np.float32(r[0]), np.float32(0)).astype(np.float32)
    return out, (float(r[0]) if r.size == 1 else None)


def env_reset_seed(seed, i: int):
    """Env i's seed of a group's reset(seed): one per env (a list), a base (env i gets base + i), or None."""
    return None if seed is None else (seed[i] if isinstance(seed, (list, tuple)) else seed + i)


class _Group:
    """Buffers and episode bookkeeping shared by every style."""

    def __init__(self, num_envs: int, num_agents: int, observation_space, action_space, state_space):
        if not isinstance(observation_space, Box):
            raise WorkerError(f"observation space must be a box, got {observation_space!r}")
        if num_agents < 1:
            raise WorkerError(f"num_agents must be >= 1, got {num_agents}")
        self.num_envs = int(num_envs)
        self.num_agents = int(num_agents)
        self.rows = self.num_envs * self.num_agents
        self.observation_space = observation_space
        self.action_space = action_space
        self.state_space = state_space
        self.discrete = isinstance(action_space, Discrete)
        self.multi_discrete = isinstance(action_space, MultiDiscrete)
        self.action_numel = 1 if self.discrete else action_space.numel
        self.obs_numel = observation_space.numel
        self.obs = np.zeros((self.rows,) + observation_space.shape, np.float32)
        self.state = None if state_space is None else np.zeros((self.num_envs,) + state_space.shape, np.float32)
        self.reward = np.zeros(self.rows, np.float32)
        self.terminated = np.zeros(self.rows, np.uint8)
        self.truncated = np.zeros(self.rows, np.uint8)
        self.active = np.ones(self.rows, np.uint8)
        self.env_ended = np.zeros(self.num_envs, bool)
        self.env_reward = np.zeros(self.num_envs, np.float64)
        self._ep_return = np.zeros(self.num_envs, np.float64)
        self._ep_length = np.zeros(self.num_envs, np.int64)

    @property
    def any_inactive(self) -> bool:
        """Whether some agent has finished before its env (StepRequest.active is sent only then)."""
        return not self.active.all()

    # Actions as the env takes them, from the decoded reply (int64 [R] / [R, K] with start added, or float32
    # [R, *shape]).
    def _actions(self, actions: np.ndarray) -> np.ndarray:
        if self.discrete:
            return actions + self.action_space.start if self.action_space.start else actions
        if self.multi_discrete:
            start = np.asarray(self.action_space.start, np.int64)
            return actions + start if start.any() else actions
        return actions.reshape((self.rows,) + tuple(self.action_space.shape))

    def _put(self, dst: np.ndarray, value, what: str) -> None:
        try:
            dst[...] = np.asarray(value, dtype=np.float32).reshape(dst.shape)
        except ValueError:
            got = np.shape(value)
            raise WorkerError(f"{what}: expected {dst.size} values (shape {list(dst.shape)}), got shape {list(got)}") \
                from None

    def _finish(self, ended: np.ndarray, truncated_envs: np.ndarray) -> List[Tuple[float, int]]:
        """Per-env bookkeeping after a step: env_reward holds each env's (mean-over-agents) reward."""
        self.env_ended[:] = ended
        self._ep_return += self.env_reward
        self._ep_length += 1
        episodes = [(float(self._ep_return[e]), int(self._ep_length[e])) for e in np.flatnonzero(ended)]
        self._ep_return[ended] = 0.0
        self._ep_length[ended] = 0
        return episodes

    def _put_state(self, e: int, state, what: str) -> None:
        """Env e's global state, when the group has one (the env must then return it)."""
        if self.state is not None:
            if state is None:
                raise WorkerError(f"{what}: the env declares state_space but returned no state")
            self._put(self.state[e], state, what)

    def _reset_bookkeeping(self) -> None:
        self.reward[:] = 0
        self.terminated[:] = 0
        self.truncated[:] = 0
        self.active[:] = 1  # every agent acts after a reset
        self.env_ended[:] = False
        self.env_reward[:] = 0
        self._ep_return[:] = 0
        self._ep_length[:] = 0

    def final_rows(self, truncated_envs: np.ndarray) -> List[int]:
        a = self.num_agents
        return [int(e) * a + k for e in truncated_envs for k in range(a)]

    def close(self) -> None:
        for env in getattr(self, "envs", []):
            close = getattr(env, "close", None)
            if callable(close):
                close()


class GymGroup(_Group):
    """Single-agent Gymnasium-style envs: reset(seed=None) -> (obs, info), step(action) -> (obs, reward,
    terminated, truncated, info); a finished env is reset in the same step."""

    def __init__(self, envs: Sequence[Any]):
        self.envs = list(envs)
        if not self.envs:
            raise WorkerError("a group needs at least one env")
        obs_space = as_space(getattr(self.envs[0], "observation_space", None))
        act_space = as_space(getattr(self.envs[0], "action_space", None))
        for i, e in enumerate(self.envs[1:], 1):
            if (as_space(getattr(e, "observation_space", None)) != obs_space
                    or as_space(getattr(e, "action_space", None)) != act_space):
                raise WorkerError(f"env {i} has other spaces than env 0")
        super().__init__(len(self.envs), 1, obs_space, act_space, None)

    def reset(self, seed=None):
        for i, env in enumerate(self.envs):
            s = env_reset_seed(seed, i)
            obs, _ = env.reset(seed=s)
            self._put(self.obs[i], obs, f"env {i}: reset's observation")
        self._reset_bookkeeping()
        return self.obs, {}

    def step(self, actions: np.ndarray):
        acts = self._actions(actions).tolist() if self.discrete else self._actions(actions)
        trunc_envs: List[int] = []
        finals: List[Any] = []
        ended: List[int] = []
        observations: List[Any] = []
        rewards: List[float] = []
        terminated_flags: List[bool] = []
        truncated_flags: List[bool] = []
        for i, env in enumerate(self.envs):
            obs, reward, terminated, truncated, _ = env.step(acts[i])
            terminated = bool(terminated)
            truncated = bool(truncated) and not terminated  # as Gymnasium's TimeLimit
            rewards.append(reward)
            terminated_flags.append(terminated)
            truncated_flags.append(truncated)
            if terminated or truncated:
                ended.append(i)
                if truncated:
                    trunc_envs.append(i)
                    finals.append(obs)
                obs, _ = env.reset()
            observations.append(obs)
        # One conversion per group, not per env (a list of lists or of arrays alike); per env only to name the
        # env whose observation does not fit.
        try:
            self.obs[...] = np.asarray(observations, dtype=np.float32).reshape(self.obs.shape)
        except ValueError:
            for i, obs in enumerate(observations):
                self._put(self.obs[i], obs, f"env {i}: step's observation")
        self.reward[:] = rewards
        self.terminated[:] = terminated_flags
        self.truncated[:] = truncated_flags
        final_obs = np.empty((len(finals),) + self.obs.shape[1:], np.float32)
        for j, obs in enumerate(finals):
            self._put(final_obs[j], obs, f"env {trunc_envs[j]}: step's observation")
        self.env_reward[:] = self.reward
        mask = np.zeros(self.num_envs, bool)
        mask[ended] = True
        episodes = self._finish(mask, np.asarray(trunc_envs, np.int64))
        return self.obs, self.reward, self.terminated, self.truncated, {
            "final_obs_index": trunc_envs, "final_obs": final_obs, "final_state": None, "episodes": episodes}


class ParallelEnvAdapter:
    """A PettingZoo Parallel env in the array style (duck-typed: PettingZoo itself is not needed).

    The agents are possible_agents, in that order, a fixed number per env. An agent that finishes before the others
    is reported as its own end (terminated and truncated [A] arrays: the step's new ends, each agent once) and from
    then on keeps its last observation, gets reward 0 and is not passed an action until the env ends; the env ends
    when every agent is terminated or truncated, or when env.agents is empty: the agents still live then end with
    it, as truncated if any agent was truncated on that step, else as terminated. The state is env.state() with
    env.state_space (no state without state_space)."""

    def __init__(self, env, same_spaces: bool = True):
        self.env = env
        self.agents = list(env.possible_agents)
        if not self.agents:
            raise WorkerError("the PettingZoo env has no possible_agents")
        self.num_agents = len(self.agents)
        # Each agent's own spaces; same_spaces=False (farm_worker.policies: agents of several policies) keeps them
        # apart and observations as a list, one array per agent.
        self.observation_spaces = [space_of(env, "observation_space", a) for a in self.agents]
        self.action_spaces = [space_of(env, "action_space", a) for a in self.agents]
        self.same_spaces = same_spaces
        self.observation_space = self.observation_spaces[0]
        self.action_space = self.action_spaces[0]
        for i, a in enumerate(self.agents[1:], 1):
            if same_spaces and (self.observation_spaces[i] != self.observation_space or
                                self.action_spaces[i] != self.action_space):
                raise WorkerError(f"agent {a!r} has other spaces than agent {self.agents[0]!r}: the farm's agents share "
                                  "one policy and need the same spaces; farm_worker.pad_agents(env) pads them to "
                                  "one (observations zero-padded with an agent id, extra actions taken as the first), "
                                  "or give each kind of agent a policy of its own (farm_worker.policies)")
        self.state_space = _box_or_none(getattr(env, "state_space", None), "state_space")
        self._last = None
        self._done: Dict[Any, bool] = {}

    def _obs(self, obs: Dict[Any, Any]):
        for i, a in enumerate(self.agents):
            if a in obs:
                self._last[i] = np.asarray(obs[a], np.float32).reshape(self.observation_spaces[i].shape)
        return self._last

    def _state(self):
        return None if self.state_space is None else self.env.state()

    def reset(self, seed=None):
        obs, _ = self.env.reset(seed=seed)
        self._last = (np.zeros((self.num_agents,) + self.observation_space.shape, np.float32) if self.same_spaces
                      else [np.zeros(sp.shape, np.float32) for sp in self.observation_spaces])
        missing = [a for a in self.agents if a not in obs]
        if missing:
            raise WorkerError(f"the PettingZoo env's reset gave no observation for agents {missing}")
        self._done = {a: False for a in self.agents}
        return self._copy(self._obs(obs)), self._state()

    def step(self, actions):
        live = {a: (int(actions[i]) if np.ndim(actions[i]) == 0 else actions[i])
                for i, a in enumerate(self.agents) if not self._done[a]}
        obs, rewards, terms, truncs, infos = self.env.step(live)
        reward = np.array([float(rewards.get(a, 0.0)) for a in self.agents], np.float32)
        # This step's ends, each agent once (a flag repeated on an agent that had finished is not a new end).
        terminated = np.zeros(self.num_agents, bool)
        truncated = np.zeros(self.num_agents, bool)
        for i, a in enumerate(self.agents):
            if self._done[a]:
                continue
            term, trunc = bool(terms.get(a, False)), bool(truncs.get(a, False))
            if term or trunc:
                self._done[a] = True
                terminated[i] = term
                truncated[i] = trunc and not term  # as Gymnasium's TimeLimit: a real terminal is never bootstrapped
        if not getattr(self.env, "agents", self.agents):
            # The env removed every agent: those still live end with it.
            live_now = [i for i, a in enumerate(self.agents) if not self._done[a]]
            if live_now:
                (truncated if truncated.any() else terminated)[live_now] = True
                for i in live_now:
                    self._done[self.agents[i]] = True
        return self._copy(self._obs(obs)), self._state(), reward, terminated, truncated, infos

    def _copy(self, last):
        return last.copy() if self.same_spaces else [x.copy() for x in last]

    def close(self):
        close = getattr(self.env, "close", None)
        if callable(close):
            close()


class ArrayGroup(_Group):
    """Multi-agent envs in the array style (or PettingZoo Parallel envs through ParallelEnvAdapter), one per
    factory call; a finished env is reset in the same step."""

    def __init__(self, envs: Sequence[Any]):
        self.envs = [ParallelEnvAdapter(e) if env_style(e) == "parallel" else e for e in envs]
        if not self.envs:
            raise WorkerError("a group needs at least one env")
        e0 = self.envs[0]
        spaces = (int(e0.num_agents), as_space(e0.observation_space), as_space(e0.action_space),
                  _box_or_none(getattr(e0, "state_space", None), "state_space"))
        for i, e in enumerate(self.envs[1:], 1):
            other = (int(e.num_agents), as_space(e.observation_space), as_space(e.action_space),
                     _box_or_none(getattr(e, "state_space", None), "state_space"))
            if other != spaces:
                raise WorkerError(f"env {i} has other agents or spaces than env 0")
        super().__init__(len(self.envs), *spaces)
        self._final_state = None if self.state is None else np.zeros_like(self.state)

    def _rows(self, e: int) -> slice:
        return slice(e * self.num_agents, (e + 1) * self.num_agents)

    def _agent_flags(self, flags, e: int, what: str) -> np.ndarray:
        """A step's terminated or truncated as [A] bools: a bool is the team's (every agent), an array per agent."""
        f = np.asarray(flags)
        if f.ndim == 0:
            return np.full(self.num_agents, bool(f))
        if f.size != self.num_agents:
            raise WorkerError(f"env {e}: {what} has {f.size} values, expected a bool (the team's) or "
                              f"{self.num_agents} (one per agent)")
        return f.reshape(-1).astype(bool)

    def reset(self, seed=None):
        for i, env in enumerate(self.envs):
            s = env_reset_seed(seed, i)
            obs, state = env.reset(seed=s)[:2]
            self._put(self.obs[self._rows(i)], obs, f"env {i}: reset's observations")
            self._put_state(i, state, f"env {i}: reset's state")
        self._reset_bookkeeping()
        return self.obs, {}

    def step(self, actions: np.ndarray):
        acts = self._actions(actions)
        a = self.num_agents
        trunc_envs: List[int] = []
        finals: List[np.ndarray] = []
        final_states: List[np.ndarray] = []
        ended = np.zeros(self.num_envs, bool)
        for i, env in enumerate(self.envs):
            rows = self._rows(i)
            out = env.step(acts[rows])
            if len(out) != 6:
                raise WorkerError(f"env {i}: step returned {len(out)} values, expected (obs, state, reward, "
                                  "terminated, truncated, info)")
            obs, state, reward, terminated, truncated, _ = out
            term = self._agent_flags(terminated, i, "terminated")
            trunc = self._agent_flags(truncated, i, "truncated") & ~term  # as Gymnasium's TimeLimit, per agent
            was_active = self.active[rows].astype(bool)  # acted on the observation this step answers
            self.reward[rows], team = agent_rewards(reward, was_active, i)
            # The team's reward, or the mean over the agents (those that had finished count 0).
            self.env_reward[i] = team if team is not None else float(self.reward[rows].mean(dtype=np.float64))
            row_term, row_trunc, active, env_end = step_ends(term, trunc, was_active)
            self.terminated[rows] = row_term
            self.truncated[rows] = row_trunc
            self.active[rows] = active
            terminated, truncated = env_end == "terminated", env_end == "truncated"
            if terminated or truncated:
                ended[i] = True
                if truncated:
                    trunc_envs.append(i)
                    f = np.empty((a,) + self.obs.shape[1:], np.float32)
                    self._put(f, obs, f"env {i}: step's observations")
                    finals.append(f)
                    if self.state is not None:
                        fs = np.empty(self.state.shape[1:], np.float32)
                        self._put(fs, state, f"env {i}: step's state")
                        final_states.append(fs)
                obs, state = env.reset()[:2]
            self._put(self.obs[rows], obs, f"env {i}: step's observations")
            self._put_state(i, state, f"env {i}: step's state")
        episodes = self._finish(ended, np.asarray(trunc_envs, np.int64))
        final_obs = np.concatenate(finals) if finals else np.zeros((0,) + self.obs.shape[1:], np.float32)
        final_state = None
        if self.state is not None:
            final_state = np.stack(final_states) if final_states else np.zeros((0,) + self.state.shape[1:], np.float32)
        return self.obs, self.reward, self.terminated, self.truncated, {
            "final_obs_index": self.final_rows(trunc_envs), "final_obs": final_obs, "final_state": final_state,
            "episodes": episodes}


def _autoreset_mode(venv) -> Optional[str]:
    mode = (getattr(venv, "metadata", None) or {}).get("autoreset_mode")
    if mode is None:
        return None
    return str(getattr(mode, "name", mode)).upper().replace("SAMESTEP", "SAME_STEP").replace("NEXTSTEP", "NEXT_STEP")


class BatchedGroup(_Group):
    """One vectorised single-agent env (Gymnasium's VectorEnv or alike): num_envs, reset(seed=[...]) -> (obs [N, ...],
    infos), step(actions [N]) -> (obs, rewards [N], terminations [N], truncations [N], infos), stepped with one call.
    Finished envs must be reset within the same step (Gymnasium's AutoresetMode.SAME_STEP, metadata["autoreset_mode"];
    Gymnasium < 1.0 did so), with the last observations of finished envs in infos["final_obs"] (mask
    infos["_final_obs"]) or infos["final_observation"] (Gymnasium < 1.0)."""

    def __init__(self, venv):
        mode = _autoreset_mode(venv)
        if mode is not None and mode != "SAME_STEP":
            raise WorkerError(f"the vectorised env resets finished envs in mode {mode}; the farm needs them reset in "
                              "the same step: create it with autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP")
        self.venv = venv
        self.envs = [venv]
        obs_space = as_space(getattr(venv, "single_observation_space", None) or venv.observation_space)
        act_space = as_space(getattr(venv, "single_action_space", None) or venv.action_space)
        super().__init__(int(venv.num_envs), 1, obs_space, act_space, None)

    def reset(self, seed=None):
        obs, _ = self.venv.reset(seed=seed)
        self._put(self.obs, obs, "the vectorised env's reset observations")
        self._reset_bookkeeping()
        return self.obs, {}

    @staticmethod
    def _finals(infos) -> Tuple[Any, Any]:
        for key in ("final_obs", "final_observation"):
            if isinstance(infos, dict) and key in infos:
                return infos[key], infos.get("_" + key)
        return None, None

    def step(self, actions: np.ndarray):
        acts = self._actions(actions)
        obs, reward, terminated, truncated, infos = self.venv.step(acts)
        term = np.asarray(terminated, bool).reshape(self.num_envs)
        trunc = np.asarray(truncated, bool).reshape(self.num_envs) & ~term
        self._put(self.obs, obs, "the vectorised env's observations")
        self.reward[:] = np.asarray(reward, np.float32).reshape(self.num_envs)
        self.terminated[:] = term
        self.truncated[:] = trunc
        trunc_envs = np.flatnonzero(trunc)
        final_obs = np.zeros((len(trunc_envs),) + self.obs.shape[1:], np.float32)
        if len(trunc_envs):
            finals, mask = self._finals(infos)
            if finals is None:
                raise WorkerError("the vectorised env truncated envs without their last observations in "
                                  "infos['final_obs'] (or 'final_observation'): the learner needs them to bootstrap")
            for j, e in enumerate(trunc_envs):
                if mask is not None and not mask[e]:
                    raise WorkerError(f"env {e} was truncated but infos['_final_obs'][{e}] is False")
                self._put(final_obs[j], finals[e], f"env {e}: final observation")
        self.env_reward[:] = self.reward
        episodes = self._finish(term | trunc, trunc_envs)
        return self.obs, self.reward, self.terminated, self.truncated, {
            "final_obs_index": [int(e) for e in trunc_envs], "final_obs": final_obs, "final_state": None,
            "episodes": episodes}


class FrameStackGroup:
    """A group whose observations are each row's last k observations, oldest first, along the first axis, as
    worker/env_group.h stacks them (env.frame_stack): every frame the reset observation after a reset; a
    truncated env's final observations stacked with the final one newest. The global state is not stacked."""

    def __init__(self, group, k: int):
        if not 1 <= int(k) <= MAX_FRAME_STACK:
            raise WorkerError(f"frame_stack must be a whole number from 1 to {MAX_FRAME_STACK}, got {k}")
        self.group = group
        self.k = int(k)
        f = group.observation_space
        self.observation_space = Box(f.low * self.k, f.high * self.k, (f.shape[0] * self.k,) + tuple(f.shape[1:]))
        self.obs_numel = self.observation_space.numel
        self.obs = np.zeros((group.rows,) + self.observation_space.shape, np.float32)
        self._frames = self.obs.reshape((group.rows, self.k) + tuple(f.shape))  # a view

    def __getattr__(self, name):
        return getattr(self.group, name)

    def reset(self, seed=None):
        self.group.reset(seed=seed)
        self._frames[:] = self.group.obs[:, None]
        return self.obs, {}

    def step(self, actions):
        _, reward, terminated, truncated, info = self.group.step(actions)
        rows = np.asarray(info["final_obs_index"], np.int64)
        final = np.empty((len(rows),) + self.observation_space.shape, np.float32)
        if len(rows):
            ff = final.reshape((len(rows), self.k) + self._frames.shape[2:])
            ff[:, :-1] = self._frames[rows, 1:]
            ff[:, -1] = info["final_obs"]
        # Rows start over only where their env was reset, not where an agent finished alone (its row keeps its
        # observations, as worker/env_group.h's frames do).
        ended = np.repeat(self.group.env_ended, self.group.num_agents)
        self._frames[:, :-1] = self._frames[:, 1:].copy()
        self._frames[:, -1] = self.group.obs
        self._frames[ended] = self.group.obs[ended][:, None]
        return self.obs, reward, terminated, truncated, dict(info, final_obs=final)


def make_group(envs: Sequence[Any]):
    """The group for a list of envs of one style (a batched env comes alone: one call per group)."""
    style = env_style(envs[0])
    if any(env_style(e) != style for e in envs[1:]):
        raise WorkerError("every env of a worker must be of the same style")
    if style == "batched":
        if len(envs) != 1:
            raise WorkerError("a vectorised env (num_envs) is one group on its own")
        return BatchedGroup(envs[0])
    if style in ("array", "parallel"):
        return ArrayGroup(envs)
    return GymGroup(envs)
