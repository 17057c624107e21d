"""Observation normalisation and reward scaling on the worker, as worker/normalizer.h: the pure-Python
classes (RunningMoments, ObsTransform, Normalizer). farm_worker.numpy_normalizer has the same in numpy."""
from __future__ import annotations

import itertools
import math
from array import array
from typing import Any, Dict, List

from .errors import ProtocolError, WorkerError

NORMALIZER_EPSILON = 1e-8


class NormalizerOptions:
    """What the worker does to observations and rewards (the learner's env.normalize_obs,
    env.normalize_reward, env.obs_clip, env.reward_clip and ppo.gamma). The learner refuses a worker
    whose settings differ from its own (Hello.normalization), naming each key."""

    def __init__(self, obs: bool = False, reward: bool = False, obs_clip: float = 10.0, reward_clip: float = 10.0,
                 gamma: float = 0.99):
        self.obs = bool(obs)
        self.reward = bool(reward)
        self.obs_clip = float(obs_clip)
        self.reward_clip = float(reward_clip)
        self.gamma = float(gamma)
        if self.obs_clip <= 0 or self.reward_clip <= 0:
            raise WorkerError(f"obs_clip and reward_clip must be > 0, got {self.obs_clip:g} and {self.reward_clip:g}")
        if not 0 <= self.gamma <= 1:
            raise WorkerError(f"gamma must be in [0, 1], got {self.gamma:g}")

    def any(self) -> bool:
        return self.obs or self.reward

    def to_wire(self, out) -> None:
        out.normalize_obs = self.obs
        out.normalize_reward = self.reward
        out.obs_clip = self.obs_clip
        out.reward_clip = self.reward_clip
        out.gamma = self.gamma


def _isfinite(v: float) -> bool:
    return v - v == 0.0  # False for NaN and +-Inf


class RunningMoments:
    """Per-element count, mean and M2 in float64, added a row at a time with Welford's update in the
    same order of operations as common/running_stats.cpp (so a delta is what the C++ worker would send
    for the same rows). Rows holding NaN or Inf are not counted."""

    __slots__ = ("count", "mean", "m2")

    def __init__(self, dim: int = 0):
        self.reset(dim)

    def reset(self, dim: int) -> None:
        self.count = 0
        self.mean = [0.0] * dim
        self.m2 = [0.0] * dim

    @property
    def dim(self) -> int:
        return len(self.mean)

    def empty(self) -> bool:
        return self.count == 0

    def variance(self, i: int) -> float:
        """Population variance of element i (M2 / count); 1 while empty."""
        return 1.0 if self.count == 0 else self.m2[i] / self.count

    def add_rows(self, data, rows: int) -> None:
        """`rows` rows of dim floats each, row-major (any sequence of floats)."""
        d = self.dim
        mean, m2 = self.mean, self.m2
        for r in range(rows):
            x = data[r * d:(r + 1) * d]
            if not all(_isfinite(v) for v in x):
                continue
            self.count += 1
            inv = 1.0 / self.count
            for i in range(d):
                v = x[i]
                delta = v - mean[i]
                mean[i] += delta * inv
                m2[i] += delta * (v - mean[i])

    def to_wire(self, out) -> None:
        out.Clear()
        out.count = self.count
        out.mean.extend(self.mean)
        out.m2.extend(self.m2)

    @staticmethod
    def from_wire(msg, dim: int, what: str) -> "RunningMoments":
        """Checked as common/running_stats.cpp FromWire: count >= 0, dim finite means, dim finite M2 >= 0."""
        if msg.count < 0:
            raise ProtocolError(f"{what}.count: expected >= 0, got {msg.count}")
        if len(msg.mean) != dim or len(msg.m2) != dim:
            raise ProtocolError(f"{what}: expected mean and m2 of {dim} entries each, got {len(msg.mean)} and "
                                f"{len(msg.m2)}")
        for i, (mean, m2) in enumerate(zip(msg.mean, msg.m2)):
            if not _isfinite(mean):
                raise ProtocolError(f"{what}.mean[{i}]: expected a finite number, got {mean}")
            if not _isfinite(m2) or m2 < 0:
                raise ProtocolError(f"{what}.m2[{i}]: expected a finite number >= 0, got {m2}")
        m = RunningMoments()
        m.count = int(msg.count)
        m.mean = list(msg.mean)
        m.m2 = list(msg.m2)
        return m


def check_normalizer_stats(stats, options: NormalizerOptions, obs_dim: int, what: str):
    """(obs, ret) RunningMoments of a NormalizerStats message (empty for what is off), checked against
    the options as common/running_stats.cpp CheckNormalizerStats: a part present exactly when it is on."""
    has_obs, has_ret = stats.HasField("obs"), stats.HasField("ret")
    if has_obs != options.obs:
        raise ProtocolError(f"{what}.obs: " + ("sent, but observations are not normalised" if has_obs else "missing")
                            + f" (env.normalize_obs is {str(options.obs).lower()})")
    if has_ret != options.reward:
        raise ProtocolError(f"{what}.ret: " + ("sent, but rewards are not scaled" if has_ret else "missing")
                            + f" (env.normalize_reward is {str(options.reward).lower()})")
    obs = RunningMoments.from_wire(stats.obs, obs_dim, what + ".obs") if options.obs else RunningMoments(0)
    ret = RunningMoments.from_wire(stats.ret, 1, what + ".ret") if options.reward else RunningMoments(0)
    return obs, ret


class ObsTransform:
    """out = clamp((x - mean) / std, -clip, clip) per element, in float32 as common/running_stats.cpp
    ObsTransform (mean and std = sqrt(var + 1e-8) rounded to float32 once; each float32 operation is
    done in float64 and rounded, which gives the float32 result exactly)."""

    def __init__(self, moments: RunningMoments, clip: float):
        d = moments.dim
        self.mean = list(array("f", [0.0] * d if moments.empty() else moments.mean))
        self.std = list(array("f", [math.sqrt(moments.variance(i) + NORMALIZER_EPSILON) for i in range(d)]))
        self.clip = array("f", (clip,))[0]

    def apply(self, data: array) -> array:
        """data: rows x dim floats (array('f')); a new array('f')."""
        if not len(data):
            return array("f")
        diff = array("f", [x - m for x, m in zip(data, itertools.cycle(self.mean))])
        q = array("f", [x / s for x, s in zip(diff, itertools.cycle(self.std))])
        lo, hi = -self.clip, self.clip
        return array("f", [lo if v < lo else (hi if v > hi else v) for v in q])


class _NormGroup:
    __slots__ = ("envs", "returns", "obs", "final_obs", "reward")

    def __init__(self, envs: int):
        self.envs = envs
        self.returns = [0.0] * envs  # per env: the running discounted return G
        self.obs = array("f")        # what the next request sends
        self.final_obs = array("f")
        self.reward = array("f", bytes(4 * envs))


class Normalizer:
    """Observation normalisation and reward scaling on the worker, as worker/normalizer.h:

      obs'    = clip((obs - mean) / sqrt(var + 1e-8), +-obs_clip)  per element (final observations too);
      reward' = clip(reward / sqrt(var_G + 1e-8), +-reward_clip)    G = gamma * G + reward per env,
                reset to 0 when its episode ends; var_G the variance of every G seen.

    It transforms with a *view*: the run's statistics as the learner last sent them (Welcome, or the
    reply to a request that carried a delta), fixed between syncs; until the learner has any, this
    worker's own statistics, updated before each use. What it saw since its last delta is *pending*
    until take_delta. Frozen (the learner serves a trained policy): the view stays as received and
    nothing is gathered. Episode returns (EpisodeStats) stay raw."""

    def __init__(self, options: NormalizerOptions, obs_numel: int):
        self.options = options
        self.obs_numel = int(obs_numel)
        obs_dim = self.obs_numel if options.obs else 0
        ret_dim = 1 if options.reward else 0
        self.global_obs, self.own_obs, self.pending_obs = (RunningMoments(obs_dim) for _ in range(3))
        self.global_ret, self.own_ret, self.pending_ret = (RunningMoments(ret_dim) for _ in range(3))
        self.has_global_obs = False
        self.has_global_ret = False
        self.frozen = False
        self._groups: List[_NormGroup] = []
        self._transform = ObsTransform(self.obs_view, options.obs_clip)

    @property
    def obs_view(self) -> RunningMoments:
        return self.global_obs if self.has_global_obs else self.own_obs

    @property
    def ret_view(self) -> RunningMoments:
        return self.global_ret if self.has_global_ret else self.own_ret

    def add_group(self, num_envs: int) -> int:
        self._groups.append(_NormGroup(num_envs))
        return len(self._groups) - 1

    def _refresh(self) -> None:
        if self.options.obs:
            self._transform = ObsTransform(self.obs_view, self.options.obs_clip)

    def _observe(self, s: _NormGroup, obs: array, rows: int, final_obs: array) -> None:
        if not self.options.obs:
            s.obs, s.final_obs = obs, final_obs
            return
        if not self.frozen:
            self.pending_obs.add_rows(obs, rows)
            if not self.has_global_obs:
                self.own_obs.add_rows(obs, rows)
                self._refresh()
        s.obs = self._transform.apply(obs)
        s.final_obs = self._transform.apply(final_obs)

    def on_reset(self, g: int, group) -> None:
        """After group g's reset: returns start at 0; first observations counted and normalised."""
        s = self._groups[g]
        s.returns = [0.0] * s.envs
        self._observe(s, group.obs, group.num_envs, array("f"))
        s.reward = array("f", bytes(4 * s.envs))  # the first request carries no rewards

    def on_step(self, g: int, group, final_obs: array) -> None:
        """After group g's step: observations counted and normalised (final observations normalised
        only), returns advanced and counted, rewards scaled, ended episodes' returns reset."""
        s = self._groups[g]
        self._observe(s, group.obs, group.num_envs, final_obs)
        if not self.options.reward:
            s.reward = group.reward
            return
        rewards = group.reward  # float32 values, as the C++ EnvGroup's
        if not self.frozen:
            gamma = self.options.gamma
            for e in range(s.envs):
                s.returns[e] = gamma * s.returns[e] + rewards[e]
                self.pending_ret.add_rows((s.returns[e],), 1)
                if not self.has_global_ret:
                    self.own_ret.add_rows((s.returns[e],), 1)
        denom = math.sqrt(self.ret_view.variance(0) + NORMALIZER_EPSILON)
        clip = self.options.reward_clip
        # clamp(r / std, -clip, clip) in float64, then float32 (std::min(std::max(...)) passes NaN through).
        s.reward = array("f", [max(-clip, min(clip, r / denom)) if r == r else r for r in rewards])
        for e in range(s.envs):
            if group.terminated[e] or group.truncated[e]:
                s.returns[e] = 0.0

    def obs(self, g: int) -> array:
        return self._groups[g].obs

    def final_obs(self, g: int) -> array:
        return self._groups[g].final_obs

    def reward(self, g: int) -> array:
        return self._groups[g].reward

    def take_delta(self, out) -> None:
        """Moves the pending statistics into `out` (a NormalizerStats) and starts a new delta."""
        out.Clear()
        if self.options.obs:
            self.pending_obs.to_wire(out.obs)
            self.pending_obs.reset(self.obs_numel)
        if self.options.reward:
            self.pending_ret.to_wire(out.ret)
            self.pending_ret.reset(1)

    def apply_global(self, stats, what: str) -> None:
        """The learner's statistics become the view (a part with no samples while not frozen leaves
        this worker's own in use). Raises ProtocolError when they do not fit the options."""
        obs, ret = check_normalizer_stats(stats, self.options, self.obs_numel, what)
        self.frozen = bool(stats.frozen)
        if self.options.obs and (self.frozen or not obs.empty()):
            self.global_obs = obs
            self.has_global_obs = True
            self._refresh()
        if self.options.reward and (self.frozen or not ret.empty()):
            self.global_ret = ret
            self.has_global_ret = True

    def view_dict(self) -> Dict[str, Any]:
        """The statistics this worker normalised with last, as farm-worker's --stats-file has them."""
        o, r = self.obs_view, self.ret_view
        return {"frozen": self.frozen, "obs_count": o.count, "obs_mean": list(o.mean), "obs_m2": list(o.m2),
                "ret_count": r.count, "ret_mean": list(r.mean), "ret_m2": list(r.m2)}
