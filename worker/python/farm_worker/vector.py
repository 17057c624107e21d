"""The pure-Python path: a list of single-agent Gymnasium-style envs stepped together (VectorEnv) and frame
stacking over it, with array('f') buffers and no numpy. The numpy path (farm_worker.groups) gives the same
numbers for such envs and also takes multi-agent and vectorised envs."""
from __future__ import annotations

from array import array
from typing import Any, List, Optional, Sequence, Tuple

from .errors import WorkerError
from .spaces import Box, Discrete, MultiDiscrete, _flatten, as_space

def env_style(env) -> str:
    """'parallel' (PettingZoo Parallel API), 'batched' (num_envs and batched calls), 'array' (multi-agent, array
    style) or 'single' (Gymnasium single-agent)."""
    if hasattr(env, "possible_agents"):
        return "parallel"
    if getattr(env, "num_envs", None) is not None:
        return "batched"
    if getattr(env, "num_agents", None) is not None:
        return "array"
    return "single"


class VectorEnv:
    """A list of Gymnasium-style envs stepped together, with auto-reset in the same step.

    reset(seed=None) -> (obs, info) and step(actions) -> (obs, reward, terminated, truncated, info),
    where obs is a flat array('f') [num_envs * obs_numel] (row i: env i), reward array('f'),
    terminated/truncated bytearrays of 0/1. A finished env is reset at once, so obs holds its
    new first observation. info holds:
      "final_obs_index": envs truncated (and not terminated) by this step,
      "final_obs": their last observations (array('f'), one row each), so the learner can bootstrap,
      "episodes": [(return, length), ...] for every episode that ended in this step,
      "infos": the envs' own info dicts.
    `observation_space` / `action_space` are the single env's spaces (Box / Discrete / MultiDiscrete).
    """

    def __init__(self, envs: Sequence[Any]):
        if not envs:
            raise WorkerError("VectorEnv needs at least one env")
        self.envs = list(envs)
        self.observation_space = as_space(getattr(self.envs[0], "observation_space", None))
        self.action_space = as_space(getattr(self.envs[0], "action_space", None))
        if not isinstance(self.observation_space, Box):
            raise WorkerError(f"observation space must be a box, got {self.observation_space!r}")
        for i, e in enumerate(self.envs[1:], 1):
            if (as_space(getattr(e, "observation_space", None)) != self.observation_space
                    or as_space(getattr(e, "action_space", None)) != self.action_space):
                raise WorkerError(f"env {i} has other spaces than env 0")
        self.obs_numel = self.observation_space.numel
        self.discrete = isinstance(self.action_space, Discrete)
        self.multi_discrete = isinstance(self.action_space, MultiDiscrete)
        self.action_numel = 1 if self.discrete else self.action_space.numel
        n = len(self.envs)
        self.obs = array("f", bytes(4 * n * self.obs_numel))
        self.reward = array("f", bytes(4 * n))
        self.terminated = bytearray(n)
        self.truncated = bytearray(n)
        self._ep_return = [0.0] * n
        self._ep_length = [0] * n

    @property
    def num_envs(self) -> int:
        return len(self.envs)

    def _put_obs(self, i: int, obs, dst: Optional[array] = None) -> None:
        flat = obs if isinstance(obs, array) and obs.typecode == "f" else array("f", _flatten(obs))
        if len(flat) != self.obs_numel:
            raise WorkerError(f"env {i} returned an observation of {len(flat)} values, "
                              f"its space {self.observation_space!r} has {self.obs_numel}")
        if dst is None:
            k = i * self.obs_numel
            self.obs[k:k + self.obs_numel] = flat
        else:
            dst.extend(flat)

    def _action(self, actions, i: int):
        if self.discrete:
            return int(actions[i]) + self.action_space.start
        k = i * self.action_numel
        if self.multi_discrete:  # a list of K ints, each shifted by its component's start
            return [int(a) + s for a, s in zip(actions[k:k + self.action_numel], self.action_space.start)]
        flat = [float(v) for v in actions[k:k + self.action_numel]]
        shape = self.action_space.shape
        for d in reversed(shape[1:]):  # nested lists for multi-dimensional boxes
            flat = [flat[j:j + d] for j in range(0, len(flat), d)]
        return flat

    def reset(self, seed: Optional[int] = None):
        """Resets every env; env i gets seed + i (Gymnasium's convention) or seed[i] for a list."""
        infos = []
        for i, env in enumerate(self.envs):
            s = None if seed is None else (seed[i] if isinstance(seed, (list, tuple)) else seed + i)
            obs, info = env.reset(seed=s)
            self._put_obs(i, obs)
            infos.append(info)
        self.reward = array("f", bytes(4 * self.num_envs))
        self.terminated = bytearray(self.num_envs)
        self.truncated = bytearray(self.num_envs)
        self._ep_return = [0.0] * self.num_envs
        self._ep_length = [0] * self.num_envs
        return self.obs, {"infos": infos}

    def step(self, actions):
        """actions: num_envs ints (discrete), num_envs * K ints (multi-discrete, flat) or
        num_envs * action_numel floats (box, flat), any sequence."""
        expected = self.num_envs * self.action_numel
        if len(actions) != expected:
            raise WorkerError(f"step got {len(actions)} actions, expected {expected}")
        final_index: List[int] = []
        final_obs = array("f")
        episodes: List[Tuple[float, int]] = []
        infos = []
        for i, env in enumerate(self.envs):
            obs, reward, terminated, truncated, info = env.step(self._action(actions, i))
            reward = float(reward)
            terminated = bool(terminated)
            # As Gymnasium's TimeLimit: never truncated on a real terminal (no bootstrap past it).
            truncated = bool(truncated) and not terminated
            self._ep_return[i] += reward
            self._ep_length[i] += 1
            self.reward[i] = reward
            self.terminated[i] = terminated
            self.truncated[i] = truncated
            if terminated or truncated:
                episodes.append((self._ep_return[i], self._ep_length[i]))
                if truncated:
                    final_index.append(i)
                    self._put_obs(i, obs, final_obs)
                obs, info_reset = env.reset()
                info = dict(info or {}, reset_info=info_reset)
                self._ep_return[i] = 0.0
                self._ep_length[i] = 0
            self._put_obs(i, obs)
            infos.append(info)
        info = {"final_obs_index": final_index, "final_obs": final_obs, "episodes": episodes, "infos": infos}
        return self.obs, self.reward, self.terminated, self.truncated, info

    def close(self) -> None:
        for env in self.envs:
            close = getattr(env, "close", None)
            if callable(close):
                close()


# --------------------------------------------------------------------------- frame stacking (as worker/env_group.h)

# worker/env_group.h kMaxFrameStack (env.frame_stack's range is 1 to this).
MAX_FRAME_STACK = 64


def stacked_space(frame: Box, k: int) -> Box:
    """k frames of `frame` along the first axis ([D] -> [k*D], [C, H, W] -> [k*C, H, W]), bounds repeated."""
    shape = (frame.shape[0] * k,) + tuple(frame.shape[1:])
    return Box(frame.low * k, frame.high * k, shape)


class FrameStack:
    """A VectorEnv whose observations are each env's last k observations, oldest first, concatenated
    along the first axis, exactly as farm-worker's EnvGroup stacks them (env.frame_stack;
    docs/ENVIRONMENTS.md, "Frame stacking"): after a reset (reset() and every auto-reset) all k frames
    are the reset observation; info["final_obs"] of a truncated env is its stacked last frames, the
    final observation newest. Everything else (rewards, flags, episodes, actions) is the VectorEnv's.
    """

    def __init__(self, venv: VectorEnv, k: int):
        if not 1 <= int(k) <= MAX_FRAME_STACK:
            raise WorkerError(f"frame_stack must be a whole number from 1 to {MAX_FRAME_STACK}, got {k}")
        self.venv = venv
        self.k = int(k)
        self.frame_numel = venv.obs_numel
        self.observation_space = stacked_space(venv.observation_space, self.k)
        self.obs_numel = self.observation_space.numel
        self.obs = array("f", bytes(4 * venv.num_envs * self.obs_numel))

    def __getattr__(self, name):  # envs, action_space, discrete, num_envs, reward, terminated, ...
        return getattr(self.venv, name)

    def _fill(self, i: int) -> None:
        f = self.frame_numel
        frame = self.venv.obs[i * f:(i + 1) * f]
        self.obs[i * self.obs_numel:(i + 1) * self.obs_numel] = frame * self.k

    def _push(self, i: int, frame: array, dst: array, at: int) -> None:
        f, row = self.frame_numel, i * self.obs_numel
        dst[at:at + self.obs_numel] = self.obs[row + f:row + self.obs_numel] + frame

    def reset(self, seed: Optional[int] = None):
        _, info = self.venv.reset(seed=seed)
        for i in range(self.venv.num_envs):
            self._fill(i)
        return self.obs, info

    def step(self, actions):
        _, reward, terminated, truncated, info = self.venv.step(actions)
        f = self.frame_numel
        final = info["final_obs"]
        stacked_final = array("f", bytes(4 * len(info["final_obs_index"]) * self.obs_numel))
        j = 0  # final_obs_index is ascending
        for i in range(self.venv.num_envs):
            if truncated[i]:
                self._push(i, final[j * f:(j + 1) * f], stacked_final, j * self.obs_numel)
                j += 1
            if terminated[i] or truncated[i]:
                self._fill(i)
            else:
                self._push(i, self.venv.obs[i * f:(i + 1) * f], self.obs, i * self.obs_numel)
        info = dict(info, final_obs=stacked_final)
        return self.obs, reward, terminated, truncated, info
