"""Observation normalisation and reward scaling in numpy, for the numpy groups (farm_worker.groups): the same
rules and the same interface as farm_worker.normalizer.Normalizer (the pure-Python one, which follows
worker/normalizer.h row by row), vectorised.

The transforms are bit for bit those of the pure path for the same statistics (float32 mean and std rounded once,
one float32 operation at a time, clipped in float64 then rounded for rewards). The statistics of a batch of rows
are merged at once (Chan et al.'s parallel form) rather than row by row (Welford), which differs from the pure
path in the last bits of the float64 mean and M2 (relative 1e-15); the learner merges workers' deltas the same
way. Multi-agent groups: every agent row is a sample of the observation statistics; the running return G is per
env, of the env's reward averaged over its agents (the team reward when the env gives one, as farm-worker: the
group's env_reward, since a row whose agent finished early carries 0), restarts only when the env ends (every one
of its rows flagged, not one agent's own end), and scales every row of the env.

Threading: belongs to the worker's one thread.
"""
from __future__ import annotations

from typing import Any, Dict, List

import numpy as np

from .normalizer import NORMALIZER_EPSILON, NormalizerOptions, RunningMoments, check_normalizer_stats


class NumpyMoments:
    """Per-element count, mean and M2 in float64; rows holding NaN or Inf are not counted."""

    __slots__ = ("count", "mean", "m2")

    def __init__(self, dim: int = 0):
        self.reset(dim)

    def reset(self, dim: int) -> None:
        self.count = 0
        self.mean = np.zeros(dim, np.float64)
        self.m2 = np.zeros(dim, np.float64)

    @property
    def dim(self) -> int:
        return len(self.mean)

    def empty(self) -> bool:
        return self.count == 0

    def variance(self) -> np.ndarray:
        """Population variance per element (M2 / count); 1 while empty."""
        return np.ones(self.dim) if self.count == 0 else self.m2 / self.count

    def add_rows(self, data: np.ndarray) -> None:
        """data: [rows, dim] (any float dtype)."""
        x = np.asarray(data, np.float64).reshape(-1, self.dim)
        if not x.size:
            return
        x = x[np.isfinite(x).all(axis=1)]
        n = len(x)
        if n == 0:
            return
        mean_b = x.mean(axis=0)
        m2_b = ((x - mean_b) ** 2).sum(axis=0)
        if self.count == 0:
            self.count, self.mean, self.m2 = n, mean_b, m2_b
            return
        total = self.count + n
        delta = mean_b - self.mean
        self.mean = self.mean + delta * (n / total)
        self.m2 = self.m2 + m2_b + delta * delta * (self.count * n / total)
        self.count = total

    def to_wire(self, out) -> None:
        out.Clear()
        out.count = self.count
        out.mean.extend(self.mean.tolist())
        out.m2.extend(self.m2.tolist())

    @staticmethod
    def of(m: RunningMoments) -> "NumpyMoments":
        n = NumpyMoments(m.dim)
        n.count = m.count
        n.mean = np.asarray(m.mean, np.float64)
        n.m2 = np.asarray(m.m2, np.float64)
        return n


class _Transform:
    def __init__(self, moments: NumpyMoments, clip: float):
        self.mean = (np.zeros(moments.dim) if moments.empty() else moments.mean).astype(np.float32)
        self.std = np.sqrt(moments.variance() + NORMALIZER_EPSILON).astype(np.float32)
        self.clip = np.float32(clip)

    def apply(self, data: np.ndarray) -> np.ndarray:
        rows = data.reshape(len(data), -1) if len(data) else data.reshape(0, len(self.mean))
        out = (rows - self.mean) / self.std
        np.clip(out, -self.clip, self.clip, out=out)
        return out.reshape(data.shape)


class _Group:
    __slots__ = ("envs", "agents", "returns", "obs", "final_obs", "reward")

    def __init__(self, envs: int, agents: int):
        self.envs, self.agents = envs, agents
        self.returns = np.zeros(envs, np.float64)
        self.obs = self.final_obs = None
        self.reward = np.zeros(envs * agents, np.float32)


class NumpyNormalizer:
    """As farm_worker.normalizer.Normalizer (the view, pending deltas, frozen statistics), on numpy groups."""

    def __init__(self, options: NormalizerOptions, obs_numel: int):
        self.options = options
        self.obs_numel = int(obs_numel)
        obs_dim = self.obs_numel if options.obs else 0
        ret_dim = 1 if options.reward else 0
        self.global_obs, self.own_obs, self.pending_obs = (NumpyMoments(obs_dim) for _ in range(3))
        self.global_ret, self.own_ret, self.pending_ret = (NumpyMoments(ret_dim) for _ in range(3))
        self.has_global_obs = self.has_global_ret = False
        self.frozen = False
        self._groups: List[_Group] = []
        self._transform = _Transform(self.obs_view, options.obs_clip)

    @property
    def obs_view(self) -> NumpyMoments:
        return self.global_obs if self.has_global_obs else self.own_obs

    @property
    def ret_view(self) -> NumpyMoments:
        return self.global_ret if self.has_global_ret else self.own_ret

    def add_group(self, num_envs: int, num_agents: int = 1) -> int:
        self._groups.append(_Group(num_envs, num_agents))
        return len(self._groups) - 1

    def _observe(self, s: _Group, obs: np.ndarray, final_obs: np.ndarray, active=None) -> None:
        if not self.options.obs:
            s.obs, s.final_obs = obs, final_obs
            return
        if not self.frozen:
            flat = obs.reshape(len(obs), -1)
            if active is not None:  # the acting rows: a finished agent repeats its last observation until its env ends
                flat = flat[active.astype(bool)]
            self.pending_obs.add_rows(flat)
            if not self.has_global_obs:
                self.own_obs.add_rows(flat)
                self._transform = _Transform(self.obs_view, self.options.obs_clip)
        s.obs = self._transform.apply(obs)
        s.final_obs = self._transform.apply(final_obs)

    def on_reset(self, g: int, group) -> None:
        s = self._groups[g]
        s.returns[:] = 0.0
        self._observe(s, group.obs, np.zeros((0,) + group.obs.shape[1:], np.float32))
        s.reward = np.zeros(s.envs * s.agents, np.float32)

    def on_step(self, g: int, group, final_obs) -> None:
        s = self._groups[g]
        self._observe(s, group.obs, final_obs, group.active if getattr(group, "any_inactive", False) else None)
        if not self.options.reward:
            s.reward = group.reward
            return
        env_reward = np.asarray(group.env_reward, np.float64)
        if not self.frozen:
            # One env at a time in env order, as the C++ worker adds them (a sample per env and step).
            s.returns = self.options.gamma * s.returns + env_reward
            self.pending_ret.add_rows(s.returns[:, None])
            if not self.has_global_ret:
                self.own_ret.add_rows(s.returns[:, None])
        denom = float(np.sqrt(self.ret_view.variance()[0] + NORMALIZER_EPSILON))
        clip = self.options.reward_clip
        r = group.reward.astype(np.float64) / denom
        s.reward = np.clip(r, -clip, clip).astype(np.float32)  # NaN stays NaN, as std::min/max in C++
        # An env ended when every one of its rows is flagged: a row flagged alone is an agent that finished early.
        ended = (group.terminated.reshape(s.envs, s.agents) | group.truncated.reshape(s.envs, s.agents)).all(axis=1)
        s.returns[ended.astype(bool)] = 0.0

    def obs(self, g: int) -> np.ndarray:
        return self._groups[g].obs

    def final_obs(self, g: int) -> np.ndarray:
        return self._groups[g].final_obs

    def reward(self, g: int) -> np.ndarray:
        return self._groups[g].reward

    def take_delta(self, out) -> None:
        out.Clear()
        if self.options.obs:
            self.pending_obs.to_wire(out.obs)
            self.pending_obs.reset(self.obs_numel)
        if self.options.reward:
            self.pending_ret.to_wire(out.ret)
            self.pending_ret.reset(1)

    def apply_global(self, stats, what: str) -> None:
        obs, ret = check_normalizer_stats(stats, self.options, self.obs_numel, what)
        self.frozen = bool(stats.frozen)
        if self.options.obs and (self.frozen or not obs.empty()):
            self.global_obs = NumpyMoments.of(obs)
            self.has_global_obs = True
            self._transform = _Transform(self.obs_view, self.options.obs_clip)
        if self.options.reward and (self.frozen or not ret.empty()):
            self.global_ret = NumpyMoments.of(ret)
            self.has_global_ret = True

    def view_dict(self) -> Dict[str, Any]:
        o, r = self.obs_view, self.ret_view
        return {"frozen": self.frozen, "obs_count": o.count, "obs_mean": o.mean.tolist(), "obs_m2": o.m2.tolist(),
                "ret_count": r.count, "ret_mean": r.mean.tolist(), "ret_m2": r.m2.tolist()}
