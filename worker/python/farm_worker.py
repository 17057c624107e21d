#!/usr/bin/env python3
"""Rollout Farm worker in Python: steps Python environments for a farm-learner.

It speaks the same protocol as the C++ farm-worker (proto/farm.proto: one
Envelope per ZeroMQ frame, DEALER -> ROUTER): Hello, Welcome, then one
StepRequest per group of envs; each ActionReply steps that group and sends its
next request at once, so while the learner acts for one group the others step
(double buffering). It exits on Stop.

Dependencies: the standard library, pyzmq (Debian: python3-zmq) and
google.protobuf (python3-protobuf). The messages, farm_pb2.py, are generated at
build time into <build>/python (CMake target farm_proto_py); point
FARM_PYTHON_PATH or --proto-dir at that folder.

Envs follow Gymnasium's single-env API:
    reset(seed=None) -> (obs, info)
    step(action)     -> (obs, reward, terminated, truncated, info)
with `observation_space` (a box: `shape`, `low`, `high`) and `action_space`
(discrete: `n`; multi-discrete: a flat `nvec`, actions passed to step as a
list of K ints; else a box). Gymnasium space objects work, as do the small
`Discrete`/`MultiDiscrete`/`Box` classes below or dicts with the same keys. Time limits are the
env's business: it reports `truncated`. No numpy is needed (observations may be
lists, tuples, array('f') or anything with .tolist()).

Command line:
    farm_worker.py --learner tcp://HOST:PORT --env-module MODULE:FACTORY --num-envs N
                   [--groups 2] [--seed S] [--index I] [--proto-dir DIR]
                   [--curve-worker-secret-key-file NAME.key --curve-learner-public-key-file LEARNER.pub]
                   [--normalize-obs] [--normalize-reward] [--obs-clip C] [--reward-clip C]
                   [--gamma G] [--rollout-length T] [--frame-stack K]
MODULE is an importable module name or a path to a .py file; FACTORY() returns one env.
The two CURVE options match the learner's transport.curve (docs/OPERATIONS.md,
"Security: CURVE keys"): this worker's secret key and the learner's public key.
The normalisation options match the learner's env.normalize_obs, env.normalize_reward,
env.obs_clip, env.reward_clip, ppo.gamma and ppo.rollout_length: the worker then normalises
observations and scales rewards as farm-worker does (class Normalizer below; pure Python,
float64 statistics, float32 transforms) and sends its statistics once per rollout. A learner
whose settings differ refuses the worker at the handshake, naming each key.
--frame-stack K is the learner's env.frame_stack: each env's observation becomes its last K
observations, oldest first, along the first axis, as farm-worker stacks them (class FrameStack
below); the stacked space goes in Hello, and normalisation sees stacked observations.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import itertools
import json
import logging
import math
import os
import signal
import socket
import sys
import time
from array import array
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

# common/wire.h kProtocolVersion. Version 2 added multi-agent envs and global states
# (docs/ENVIRONMENTS.md); this worker's envs are single-agent: it leaves Hello.num_agents
# and global_state absent, which the learner reads as one agent per env and no state.
PROTOCOL_VERSION = 3
# A learner that closes the connection before the ZeroMQ handshake completes this many times in a row is refusing
# this worker (as farm-worker: WatchedDealer in common/transport.h).
HANDSHAKE_CLOSES_BEFORE_FAILING = 3
_MASK64 = (1 << 64) - 1
_LITTLE = sys.byteorder == "little"
_MAX_ROUND_TRIP_SAMPLES = 1 << 20

__all__ = [
    "Box", "Discrete", "VectorEnv", "PythonWorker", "WorkerStats", "WorkerError", "ProtocolError",
    "LearnerTimeout", "load_proto", "PROTOCOL_VERSION", "NormalizerOptions", "Normalizer", "RunningMoments",
    "ObsTransform",
]


# --------------------------------------------------------------------------- errors


class WorkerError(RuntimeError):
    """The worker cannot go on (refused by the learner, bad env, ...)."""


class ProtocolError(WorkerError):
    """The learner reported an Error, or sent something this worker cannot serve."""


class LearnerTimeout(WorkerError, TimeoutError):
    """The learner was unreachable or silent for give_up_s seconds."""


class _StopRequested(Exception):
    """request_stop() was called while waiting to send."""


# --------------------------------------------------------------------------- messages

_pb = None  # the farm_pb2 module, once loaded


def load_proto(proto_dir: Optional[str] = None):
    """Imports farm_pb2 from proto_dir, FARM_PYTHON_PATH (os.pathsep-separated), an
    importable location, $FARM_BUILD_DIR/python or <repo>/build/python, in that order."""
    global _pb
    if _pb is not None and proto_dir is None:
        return _pb
    candidates: List[str] = []
    if proto_dir:
        candidates.append(proto_dir)
    candidates += [p for p in os.environ.get("FARM_PYTHON_PATH", "").split(os.pathsep) if p]
    fallbacks = []
    if os.environ.get("FARM_BUILD_DIR"):
        fallbacks.append(os.path.join(os.environ["FARM_BUILD_DIR"], "python"))
    fallbacks.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "python"))
    for d in candidates:
        if not os.path.isfile(os.path.join(d, "farm_pb2.py")):
            raise WorkerError(f"farm_pb2.py not found in {d!r} (build it: cmake --build BUILD --target farm_proto_py)")
    for d in reversed(candidates):
        sys.path.insert(0, os.path.abspath(d))
    try:
        importlib.import_module("farm_pb2")  # generated by protoc
    except ImportError as e:
        if "google" in str(e) or "protobuf" in str(e):
            raise WorkerError(f"cannot import google.protobuf ({e}); install python3-protobuf") from e
        for d in fallbacks:
            if os.path.isfile(os.path.join(d, "farm_pb2.py")):
                sys.path.insert(0, os.path.abspath(d))
                break
        else:
            raise WorkerError("cannot find farm_pb2.py: set FARM_PYTHON_PATH or --proto-dir to <build>/python "
                              "(generated by: cmake --build BUILD --target farm_proto_py)") from e
        importlib.import_module("farm_pb2")
    _pb = sys.modules["farm_pb2"]
    return _pb


def _zmq():
    try:
        import zmq
    except ImportError as e:
        raise WorkerError(f"cannot import zmq ({e}); install python3-zmq") from e
    return zmq


def _read_curve_key(path: str, what: str) -> bytes:
    """The Z85 key of a farm-keygen key file: the first word of its first line that is not
    blank or a "# " comment (NAME.pub lines carry the name after the key)."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            lines = [ln.split() for ln in f.read().splitlines()
                     if ln.strip() and ln != "#" and not ln.startswith("# ")]
    except OSError as e:
        raise WorkerError(f"{what}: cannot read '{path}': {e.strerror} "
                          "(make keys with: scripts/farm keygen DIR NAME)") from e
    if not lines:
        raise WorkerError(f"{what}: '{path}' holds no key")
    key = lines[0][0]
    if len(key) != 40:
        raise WorkerError(f"{what}: '{path}': expected a CURVE key of 40 Z85 characters, got {len(key)} characters")
    try:
        import zmq.utils.z85
        zmq.utils.z85.decode(key)
    except (KeyError, ValueError) as e:
        raise WorkerError(f"{what}: '{path}': the key is not Z85 text") from e
    return key.encode("ascii")


# --------------------------------------------------------------------------- spaces


class Discrete:
    """One integer in [start, start + n)."""

    def __init__(self, n: int, start: int = 0):
        if int(n) <= 0:
            raise ValueError(f"Discrete needs n > 0, got {n}")
        self.n = int(n)
        self.start = int(start)

    def __repr__(self):
        return f"Discrete({self.n})" if self.start == 0 else f"Discrete({self.n}, start={self.start})"

    def __eq__(self, other):
        return isinstance(other, Discrete) and (self.n, self.start) == (other.n, other.start)


class MultiDiscrete:
    """K integers, component i in [start[i], start[i] + nvec[i]) (Gymnasium's MultiDiscrete with a flat nvec)."""

    def __init__(self, nvec: Sequence[int], start: Optional[Sequence[int]] = None):
        nvec = _to_list(nvec)
        if any(isinstance(v, (list, tuple)) for v in nvec):
            raise ValueError(f"MultiDiscrete needs a flat nvec, got {nvec!r} (flatten it and reshape in the env)")
        self.nvec = [int(v) for v in nvec]
        if not self.nvec or any(v <= 0 for v in self.nvec):
            raise ValueError(f"MultiDiscrete needs a non-empty nvec of integers > 0, got {self.nvec}")
        start = [0] * len(self.nvec) if start is None else [int(v) for v in _to_list(start)]
        if len(start) != len(self.nvec):
            raise ValueError(f"MultiDiscrete start has {len(start)} entries, nvec {len(self.nvec)}")
        self.start = start

    @property
    def numel(self) -> int:
        return len(self.nvec)

    def __repr__(self):
        return f"MultiDiscrete({self.nvec})" if not any(self.start) else f"MultiDiscrete({self.nvec}, start={self.start})"

    def __eq__(self, other):
        return isinstance(other, MultiDiscrete) and (self.nvec, self.start) == (other.nvec, other.start)


class Box:
    """A float32 tensor of `shape` with bounds low/high (scalars or flat/nested sequences)."""

    def __init__(self, low, high, shape: Optional[Sequence[int]] = None):
        if shape is None:
            shape = _infer_shape(low)
            if not shape:
                raise ValueError("Box needs a shape when low/high are scalars")
        self.shape = tuple(int(d) for d in shape)
        if not self.shape or any(d <= 0 for d in self.shape):
            raise ValueError(f"Box shape {self.shape} must be non-empty with positive dimensions")
        numel = _prod(self.shape)
        self.low = _broadcast(low, numel, "low")
        self.high = _broadcast(high, numel, "high")

    @property
    def numel(self) -> int:
        return _prod(self.shape)

    def __repr__(self):
        return f"Box(shape={self.shape})"

    def __eq__(self, other):
        return isinstance(other, Box) and (self.shape, self.low, self.high) == (other.shape, other.low, other.high)


def _prod(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _to_list(x):
    return x.tolist() if hasattr(x, "tolist") else x


def _infer_shape(x) -> Tuple[int, ...]:
    x = _to_list(x)
    shape = []
    while isinstance(x, (list, tuple, array)):
        shape.append(len(x))
        if not len(x):
            break
        x = x[0]
    return tuple(shape)


def _flatten_into(out: List[float], x) -> None:
    if isinstance(x, (list, tuple)):
        for v in x:
            _flatten_into(out, v)
    elif isinstance(x, (array, bytes, bytearray, memoryview)):
        out.extend(float(v) for v in x)
    else:
        out.append(float(x))


def _flatten(x) -> List[float]:
    out: List[float] = []
    _flatten_into(out, _to_list(x))
    return out


def _broadcast(v, numel: int, what: str) -> List[float]:
    flat = _flatten(v)
    if len(flat) == 1:
        flat = flat * numel
    if len(flat) != numel:
        raise ValueError(f"Box {what} has {len(flat)} entries, expected {numel}")
    return flat


def as_space(space) -> Any:
    """A Discrete, MultiDiscrete or Box from a gymnasium-like object or a dict (duck-typed:
    something with `nvec` is multi-discrete, with `n` discrete, anything else a box with
    shape/low/high)."""
    if isinstance(space, (Discrete, MultiDiscrete, Box)):
        return space
    if space is None:
        raise WorkerError("env has no observation_space/action_space")
    get = (lambda k, d=None: space.get(k, d)) if isinstance(space, dict) else (lambda k, d=None: getattr(space, k, d))
    if get("nvec") is not None:
        try:
            return MultiDiscrete(get("nvec"), get("start"))
        except ValueError as e:
            raise WorkerError(f"cannot read space {space!r}: {e}") from None
    if get("n") is not None:
        return Discrete(int(get("n")), int(get("start", 0) or 0))
    shape = get("shape")
    low, high = get("low"), get("high")
    if low is None or high is None:
        if shape is None:
            raise WorkerError(f"cannot read space {space!r}: expected `n` (discrete) or shape/low/high (box)")
        low = float("-inf") if low is None else low
        high = float("inf") if high is None else high
    return Box(low, high, shape)


def _space_to_wire(space, out) -> None:
    pb = load_proto()
    if isinstance(space, Discrete):
        out.kind = pb.Space.DISCRETE
        out.dtype = pb.INT64
        out.n = space.n
    elif isinstance(space, MultiDiscrete):
        out.kind = pb.Space.MULTI_DISCRETE
        out.dtype = pb.INT64
        out.shape.append(len(space.nvec))
        out.nvec.extend(space.nvec)
    else:
        out.kind = pb.Space.BOX
        out.dtype = pb.FLOAT32
        out.shape.extend(space.shape)
        out.low.extend(space.low)
        out.high.extend(space.high)


# --------------------------------------------------------------------------- seeds (as the C++ worker)


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _mix_seed(seed: int, index: int) -> int:  # worker_client.cpp MixSeed
    z = (seed + 0x9E3779B97F4A7C15 * (index + 1)) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _env_seed(seed: int, i: int) -> int:  # env_group.cpp EnvSeed
    return _splitmix64(_splitmix64(seed & _MASK64) ^ i)


# --------------------------------------------------------------------------- VectorEnv


def _le_bytes(a: array) -> bytes:
    if _LITTLE:
        return a.tobytes()
    b = array(a.typecode, a)
    b.byteswap()
    return b.tobytes()


def _from_le(typecode: str, data: bytes) -> array:
    a = array(typecode)
    a.frombytes(data)
    if not _LITTLE:
        a.byteswap()
    return a


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


# --------------------------------------------------------------------------- normalisation (as worker/normalizer.h)

# common/running_stats.h kNormalizerEpsilon: added to the variance before its square root.
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

    def on_reset(self, g: int, group: "VectorEnv") -> None:
        """After group g's reset: returns start at 0; first observations counted and normalised."""
        s = self._groups[g]
        s.returns = [0.0] * s.envs
        self._observe(s, group.obs, group.num_envs, array("f"))
        s.reward = array("f", bytes(4 * s.envs))  # the first request carries no rewards

    def on_step(self, g: int, group: "VectorEnv", final_obs: array) -> None:
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


# --------------------------------------------------------------------------- worker


class WorkerStats:
    def __init__(self):
        self.env_steps = 0
        self.episodes = 0
        self.messages = 0
        self.seconds = 0.0
        self.policy_version = 0
        self.stop_reason: Optional[str] = None
        self.episode_returns: List[float] = []  # the latest episodes (last 1000)
        self.round_trip_us: List[float] = []
        self.reconnects = 0  # handshakes redone after the learner went away or forgot this worker

    def round_trip_percentile(self, q: float) -> float:
        if not self.round_trip_us:
            return 0.0
        v = sorted(self.round_trip_us)
        return v[int(q * (len(v) - 1))]

    def as_dict(self) -> Dict[str, Any]:
        recent = self.episode_returns[-100:]
        return {
            "env_steps": self.env_steps,
            "episodes": self.episodes,
            "messages": self.messages,
            "seconds": self.seconds,
            "sps": self.env_steps / self.seconds if self.seconds > 0 else 0.0,
            "policy_version": self.policy_version,
            "stop_reason": self.stop_reason,
            "reconnects": self.reconnects,
            "mean_return_100": sum(recent) / len(recent) if recent else None,
            "round_trip_us_p50": self.round_trip_percentile(0.50),
            "round_trip_us_p99": self.round_trip_percentile(0.99),
        }

    def __repr__(self):
        return f"WorkerStats({self.as_dict()})"


_instance_counter = itertools.count()
_log = logging.getLogger("farm_worker")


class PythonWorker:
    """Runs Python envs for a farm-learner.

    env_fns: one callable per env, each returning a Gymnasium-style env; they are split into
    num_groups equal groups (double buffering). worker_id: the ZeroMQ routing identity
    (default "worker-HOST-INDEX-PID", as the C++ worker; unique per host and process).
    run() returns WorkerStats when the learner says Stop; it raises ProtocolError on an Error
    from the learner, LearnerTimeout when the learner stays unreachable for give_up_s, WorkerError
    when refused. A learner silent for its transport.heartbeat_timeout_s (sent in its Welcome, with
    the heartbeat interval), or one that answers Error UNKNOWN_WORKER (it restarted, or dropped this
    worker as silent), is connected to again under a new identity, as farm-worker does; the
    episodes then start over.

    normalization: the learner's env.normalize_obs / env.normalize_reward settings (NormalizerOptions),
    with rollout_length its ppo.rollout_length: observations are normalised and rewards scaled before
    they are sent, and once per rollout and group a request carries this worker's statistics delta, as
    the C++ worker does (docs/ENVIRONMENTS.md, "Observation and reward normalisation"). A learner whose
    settings differ refuses the worker at the handshake.

    frame_stack: the learner's env.frame_stack; each group is a FrameStack over its VectorEnv, so the
    Hello, the requests and the normaliser carry stacked observations (as farm-worker's).
    """

    def __init__(self, env_fns: Sequence[Callable[[], Any]], learner_endpoint: str, num_groups: int = 2,
                 worker_id: Optional[str] = None, seed: int = 0, give_up_s: float = 60, *,
                 index: Optional[int] = None, env_name: Optional[str] = None,
                 max_message_bytes: int = 64 << 20, proto_dir: Optional[str] = None,
                 curve_worker_secret_key_file: Optional[str] = None,
                 curve_learner_public_key_file: Optional[str] = None,
                 normalization: Optional[NormalizerOptions] = None, rollout_length: Optional[int] = None,
                 frame_stack: int = 1):
        check_endpoint(learner_endpoint)
        self.pb = load_proto(proto_dir)
        self.zmq = _zmq()
        self._curve = None  # (secret, public, learner public), Z85 bytes
        if curve_worker_secret_key_file or curve_learner_public_key_file:
            if not (curve_worker_secret_key_file and curve_learner_public_key_file):
                raise WorkerError("CURVE needs both this worker's secret key file and the learner's public key file")
            if not self.zmq.has("curve"):
                raise WorkerError(f"CURVE is not available: libzmq {self.zmq.zmq_version()} was built without it")
            secret = _read_curve_key(curve_worker_secret_key_file, "curve worker secret key file")
            server = _read_curve_key(curve_learner_public_key_file, "curve learner public key file")
            self._curve = (secret, self.zmq.curve_public(secret), server)
        env_fns = list(env_fns)
        if num_groups < 1 or not env_fns or len(env_fns) % num_groups != 0:
            raise WorkerError(f"num_envs ({len(env_fns)}) must be a positive multiple of num_groups ({num_groups})")
        if give_up_s <= 0:
            raise WorkerError(f"give_up_s must be > 0, got {give_up_s}")
        self.index = next(_instance_counter) if index is None else int(index)
        self.endpoint = learner_endpoint
        self.seed = int(seed)
        self.give_up_s = float(give_up_s)
        # The learner's transport.heartbeat_interval_s and heartbeat_timeout_s (defaults until its Welcome says).
        self.heartbeat_s = 1.0
        self.heartbeat_timeout_s = 10.0
        self._handshaken = False
        self._last_heartbeat = 0.0
        self.max_message_bytes = int(max_message_bytes)
        if worker_id is None:
            worker_id = f"worker-{socket.gethostname()}-{self.index}-{os.getpid()}"
        self.identity = worker_id.encode()[:240]
        if not self.identity or self.identity[0] == 0:
            raise WorkerError("worker_id must be non-empty and not start with a zero byte (ZeroMQ reserves those)")
        self._base_identity = self.identity  # then -cN for the Nth reconnection, as farm-worker
        self._connection = 0
        size = len(env_fns) // num_groups
        if not 1 <= int(frame_stack) <= MAX_FRAME_STACK:
            raise WorkerError(f"frame_stack must be a whole number from 1 to {MAX_FRAME_STACK}, got {frame_stack}")
        self.groups = [VectorEnv([fn() for fn in env_fns[g * size:(g + 1) * size]]) for g in range(num_groups)]
        if frame_stack > 1:
            self.groups = [FrameStack(g, frame_stack) for g in self.groups]
        first = self.groups[0]
        for g in self.groups[1:]:
            if g.observation_space != first.observation_space or g.action_space != first.action_space:
                raise WorkerError("every env of a worker must have the same spaces")
        env0 = first.envs[0]
        spec = getattr(env0, "spec", None)
        self.env_name = env_name or getattr(spec, "id", None) or type(getattr(env0, "unwrapped", env0)).__name__
        self.num_envs = len(env_fns)
        self.normalizer: Optional[Normalizer] = None
        self.rollout_length = 0
        if normalization is not None and normalization.any():
            if rollout_length is None or int(rollout_length) < 1:
                raise WorkerError("normalisation needs the learner's ppo.rollout_length (a positive integer): this "
                                  "worker sends its statistics once per rollout")
            self.rollout_length = int(rollout_length)
            self.normalizer = Normalizer(normalization, first.obs_numel)
            for g in self.groups:
                self.normalizer.add_group(g.num_envs)
        self.stats = WorkerStats()
        self._next_seq = [0] * num_groups
        self._waiting = [False] * num_groups
        self._sent_at = [0.0] * num_groups
        self._stop_requested = False
        self._ctx = None
        self._sock = None
        self._monitor = None  # handshake failures of _sock (a refused CURVE key, ...)

    # -- socket

    def _connect(self):
        zmq = self.zmq
        self._ctx = zmq.Context()
        s = self._ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        s.setsockopt(zmq.SNDHWM, 100000)
        s.setsockopt(zmq.RCVHWM, 100000)
        s.setsockopt(zmq.ROUTING_ID, self.identity)
        # IMMEDIATE stays 0 (unlike farm-worker): with 1, libzmq terminates the connection's pipe when the
        # learner closes it, dropping messages this process has not read yet -- the final Stop, which the
        # learner sends just before it exits. A worker that is still stepping a group then never sees it.
        # An absent learner is caught by the handshake's timeout instead.
        s.setsockopt(zmq.IMMEDIATE, 0)
        s.setsockopt(zmq.SNDTIMEO, int(self.give_up_s * 1000))
        if self._curve:
            s.curve_secretkey, s.curve_publickey, s.curve_serverkey = self._curve
        # The monitor is attached (its PAIR connected) before the DEALER connects, so that no event of a handshake
        # that ZeroMQ's I/O thread completes at once is missed.
        self._monitor = s.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED |
                                             zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH |
                                             zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                             zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
        self._in_handshake = False
        self._closed_in_handshake = 0
        s.connect(self.endpoint)
        self._sock = s

    def _check_handshakes(self) -> None:
        """Raises WorkerError when a handshake failed in a way retrying cannot mend (as farm-worker): a refused
        CURVE key, CURVE on one side only, a wrong learner key; or a learner that closed the connection before
        the handshake completed HANDSHAKE_CLOSES_BEFORE_FAILING times in a row (a mechanism mismatch looks so
        when the learner detects it first and resets the connection before this worker reads its greeting)."""
        zmq = self.zmq
        from zmq.utils.monitor import recv_monitor_message
        while self._monitor is not None and self._monitor.poll(0):
            ev = recv_monitor_message(self._monitor)
            event, value = ev["event"], ev["value"]
            if event == zmq.EVENT_CONNECTED:
                self._in_handshake = True
            elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._in_handshake = False
                self._closed_in_handshake = 0
            elif event == zmq.EVENT_DISCONNECTED:
                if self._in_handshake:
                    self._closed_in_handshake += 1
                    if self._closed_in_handshake >= HANDSHAKE_CLOSES_BEFORE_FAILING:
                        n = self._closed_in_handshake
                        if self._curve:
                            raise WorkerError(
                                f"the learner at {self.endpoint} closed the connection during the CURVE handshake "
                                f"{n} times in a row: is --curve-learner-public-key-file the learner's public key, "
                                f"does the learner use CURVE, and is this worker's key {self._curve[1].decode()} in "
                                "its transport.curve_authorized_keys?")
                        raise WorkerError(
                            f"the learner at {self.endpoint} closed the connection during the ZeroMQ handshake {n} "
                            "times in a row: it requires CURVE, most likely (pass --curve-worker-secret-key-file and "
                            "--curve-learner-public-key-file), or it is not a farm-learner")
                self._in_handshake = False
            elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                public = self._curve[1].decode() if self._curve else "(none)"
                raise WorkerError(f"the learner at {self.endpoint} refused this worker's CURVE public key {public} "
                                  f"(ZAP status {value}): add this worker's NAME.pub to the learner's "
                                  "transport.curve_authorized_keys")
            elif event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                if value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
                    raise WorkerError(f"the learner at {self.endpoint} does not use CURVE, but CURVE keys were given"
                                      if self._curve else
                                      f"the learner at {self.endpoint} requires CURVE: pass "
                                      "--curve-worker-secret-key-file and --curve-learner-public-key-file")
                raise WorkerError(f"the ZMTP handshake with the learner at {self.endpoint} failed: "
                                  f"protocol error {value:#x}")

    def _close(self):
        if self._monitor is not None:
            self._monitor.close(linger=0)  # before the context ends, or term() waits for it
            self._monitor = None
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    def _send(self, envelope) -> None:
        # Wait for room in short slices (only a full queue blocks: IMMEDIATE is 0), so that request_stop()
        # is seen; a blocking send would retry through signals.
        zmq = self.zmq
        deadline = time.monotonic() + self.give_up_s
        while True:
            if self._stop_requested:
                raise _StopRequested()
            left = deadline - time.monotonic()
            if left <= 0:
                raise LearnerTimeout(f"cannot reach the learner at {self.endpoint} within {self.give_up_s:g} s")
            if self._sock.poll(timeout=int(min(left, 0.5) * 1000) + 1, flags=zmq.POLLOUT):
                try:
                    self._sock.send(envelope.SerializeToString(), flags=zmq.NOBLOCK, copy=False)
                    break
                except zmq.Again:
                    continue
        self.stats.messages += 1

    def _receive(self, silent_what: str, timeout_s: Optional[float] = None):
        """The next Envelope; raises LearnerTimeout after timeout_s (default give_up_s) of silence. None on a
        stop request."""
        timeout_s = self.give_up_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        while not self._stop_requested:
            # Events first, also those queued before this call: a failed handshake is never taken for silence.
            if not self._handshaken:
                self._check_handshakes()
            left = deadline - time.monotonic()
            if left <= 0:
                raise LearnerTimeout(f"{silent_what} (the learner at {self.endpoint}, {timeout_s:g} s)")
            # Short slices, so that request_stop() from a signal handler is seen promptly.
            slice_s = min(left, 0.5, self.heartbeat_s / 2)
            if not self._handshaken and self._monitor is not None:
                # Until the Welcome, the monitor's events end the wait too.
                ready = dict(self.zmq.zmq_poll([(self._sock, self.zmq.POLLIN), (self._monitor, self.zmq.POLLIN)],
                                               int(slice_s * 1000) + 1))
                if self._sock not in ready:
                    continue
            elif not self._sock.poll(timeout=int(slice_s * 1000) + 1, flags=self.zmq.POLLIN):
                # Waiting: tell the learner we are alive (it drops workers silent for
                # transport.heartbeat_timeout_s), as the C++ worker does.
                if self._handshaken and time.monotonic() - self._last_heartbeat >= self.heartbeat_s:
                    beat = self.pb.Envelope()
                    beat.heartbeat.SetInParent()
                    self._send(beat)
                    self._last_heartbeat = time.monotonic()
                continue
            data = self._sock.recv(copy=True)
            env = self.pb.Envelope()
            try:
                env.ParseFromString(data)
            except Exception as e:  # google.protobuf.message.DecodeError
                raise ProtocolError(f"cannot parse a {len(data)}-byte message as farm.wire.Envelope: {e}") from e
            if env.WhichOneof("body") is None:
                raise ProtocolError("message has no body (unknown message type or empty envelope)")
            return env
        return None

    def request_stop(self) -> None:
        """Makes run() return soon (from another thread or a signal handler)."""
        self._stop_requested = True

    # -- protocol

    def _handshake(self, timeout_s: Optional[float] = None) -> bool:
        pb = self.pb
        env = pb.Envelope()
        h = env.hello
        h.protocol_version = PROTOCOL_VERSION
        h.worker_id = self.identity.decode(errors="replace")
        h.env_name = self.env_name
        h.num_envs = self.num_envs
        h.num_groups = len(self.groups)
        _space_to_wire(self.groups[0].observation_space, h.observation)
        _space_to_wire(self.groups[0].action_space, h.action)
        if self.normalizer is not None:
            self.normalizer.options.to_wire(h.normalization)
        self._send(env)
        reply = self._receive("no answer to Hello: is a farm-learner listening there?", timeout_s)
        if reply is None:
            self.stats.stop_reason = "stop requested"
            return False
        kind = reply.WhichOneof("body")
        if kind == "stop":
            self.stats.stop_reason = reply.stop.reason
            return False
        if kind == "error":
            raise ProtocolError(f"learner reported an error: {reply.error.message}")
        if kind != "welcome":
            raise ProtocolError(f"expected Welcome from the learner, got {kind}")
        if not reply.welcome.accepted:
            hint = ""
            if "preprocessing differs" in reply.welcome.error:
                hint = (" (start this worker with the learner's settings: --normalize-obs, --normalize-reward, "
                        "--obs-clip, --reward-clip, --gamma, --rollout-length)")
            raise WorkerError(f"learner refused this worker: {reply.welcome.error}{hint}")
        if reply.welcome.HasField("normalizer"):
            # The run's statistics so far (a rejoin, a resumed run, a served policy): normalise as the others do.
            if self.normalizer is None:
                raise ProtocolError("the learner's Welcome carries normalisation statistics, but this worker does "
                                    "not normalise: it would send raw observations and rewards")
            self.normalizer.apply_global(reply.welcome.normalizer, "Welcome: the learner's NormalizerStats")
        self.stats.policy_version = reply.welcome.policy_version
        if reply.welcome.heartbeat_interval_s > 0:
            self.heartbeat_s = reply.welcome.heartbeat_interval_s
        if reply.welcome.heartbeat_timeout_s > 0:
            self.heartbeat_timeout_s = reply.welcome.heartbeat_timeout_s
        self._handshaken = True
        return True

    def _start_groups(self, seeded: bool) -> None:
        """Resets every group (with the worker's seeds the first time) and sends its first request."""
        for g, group in enumerate(self.groups):
            self._next_seq[g] = 0
            self._waiting[g] = False
            if seeded:
                base = _mix_seed(self.seed, self.index * 1000 + g)
                group.reset(seed=[_env_seed(base, i) for i in range(group.num_envs)])
            else:
                group.reset()
            if self.normalizer is not None:
                self.normalizer.on_reset(g, group)
            self._send_step(g, True)

    def _reconnect(self, why: str) -> bool:
        """A fresh socket under a new identity and a new handshake, with exponential backoff, until give_up_s
        (as farm-worker); then the episodes start over, since the learner kept nothing of them. False when the
        learner said Stop or a stop was requested meanwhile."""
        _log.warning("%s: the learner at %s %s; reconnecting", self.identity.decode(errors="replace"),
                     self.endpoint, why)
        deadline = time.monotonic() + self.give_up_s
        backoff = 0.1
        while not self._stop_requested:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            # A new identity per attempt: a late Welcome for an abandoned attempt must not reach this socket.
            self._close()
            self._handshaken = False
            self._connection += 1
            self.identity = self._base_identity + f"-c{self._connection}".encode()
            self._connect()
            try:
                if not self._handshake(min(left, max(backoff, 1.0))):
                    return False
            except LearnerTimeout:
                time.sleep(max(0.0, min(backoff, deadline - time.monotonic())))
                backoff = min(backoff * 2, 5.0)
                continue
            self.stats.reconnects += 1
            _log.warning("%s: reconnected to %s", self.identity.decode(errors="replace"), self.endpoint)
            self._start_groups(seeded=False)
            return True
        if self._stop_requested:
            self.stats.stop_reason = "stop requested"
            return False
        raise LearnerTimeout(f"could not reach the learner at {self.endpoint} again within {self.give_up_s:g} s; "
                             "giving up")

    def _send_step(self, g: int, first: bool, info: Optional[dict] = None) -> None:
        pb = self.pb
        group = self.groups[g]
        n = group.num_envs
        env = pb.Envelope()
        req = env.step
        req.group = g
        req.seq = self._next_seq[g]
        req.first = first
        req.obs.dtype = pb.FLOAT32
        req.obs.shape.extend((n,) + group.observation_space.shape)
        norm = self.normalizer
        # With normalisation the normalised observations and scaled rewards; episode returns stay raw.
        req.obs.data = _le_bytes(norm.obs(g) if norm else group.obs)
        if not first:
            req.reward.dtype = pb.FLOAT32
            req.reward.shape.append(n)
            req.reward.data = _le_bytes(norm.reward(g) if norm else group.reward)
            req.terminated = bytes(group.terminated)
            req.truncated = bytes(group.truncated)
            idx = info["final_obs_index"]
            if idx:
                req.final_obs_index.extend(idx)
                req.final_obs.dtype = pb.FLOAT32
                req.final_obs.shape.extend((len(idx),) + group.observation_space.shape)
                req.final_obs.data = _le_bytes(norm.final_obs(g) if norm else info["final_obs"])
            for ret, length in info["episodes"]:
                e = req.episodes.add()
                e.episode_return = ret
                e.length = length
                self.stats.episode_returns.append(ret)
            self.stats.episodes += len(info["episodes"])
            if len(self.stats.episode_returns) > 1000:
                del self.stats.episode_returns[:-1000]
            # Once per rollout (rollout_length requests) per group, at the request that completes the group's
            # part of it: the statistics since the last delta. The reply brings the run's merged ones.
            if norm and not norm.frozen and req.seq % self.rollout_length == 0:
                norm.take_delta(req.stats_delta)
        self._send(env)
        self._next_seq[g] += 1
        self._sent_at[g] = time.perf_counter()
        self._waiting[g] = True

    def _on_action(self, reply) -> None:
        pb = self.pb
        g = reply.group
        if g >= len(self.groups) or not self._waiting[g] or reply.seq + 1 != self._next_seq[g]:
            raise ProtocolError(f"unexpected ActionReply for group {g} seq {reply.seq}")
        self._waiting[g] = False
        if reply.HasField("normalizer"):
            if self.normalizer is None:
                raise ProtocolError("ActionReply carries normalisation statistics, but this worker does not "
                                    "normalise: it would send raw observations and rewards")
            self.normalizer.apply_global(reply.normalizer, "ActionReply: the learner's NormalizerStats")
        if len(self.stats.round_trip_us) < _MAX_ROUND_TRIP_SAMPLES:
            self.stats.round_trip_us.append((time.perf_counter() - self._sent_at[g]) * 1e6)
        self.stats.policy_version = reply.policy_version
        group = self.groups[g]
        n = group.num_envs
        t = reply.action
        if group.discrete:
            self._check_tensor(t, pb.INT64, [n], 8)
            actions = _from_le("q", t.data)
            for a in actions:
                if a < 0 or a >= group.action_space.n:
                    raise ProtocolError(f"action {a} out of range [0, {group.action_space.n})")
        elif group.multi_discrete:
            nvec = group.action_space.nvec
            self._check_tensor(t, pb.INT64, [n, len(nvec)], 8)
            actions = _from_le("q", t.data)
            for j, a in enumerate(actions):
                if a < 0 or a >= nvec[j % len(nvec)]:
                    raise ProtocolError(f"action {a} (component {j % len(nvec)} of row {j // len(nvec)}) "
                                        f"out of range [0, {nvec[j % len(nvec)]})")
        else:
            self._check_tensor(t, pb.FLOAT32, [n, *group.action_space.shape], 4)
            actions = _from_le("f", t.data)
        _, _, _, _, info = group.step(actions)
        if self.normalizer is not None:
            self.normalizer.on_step(g, group, info["final_obs"])
        self.stats.env_steps += n
        self._send_step(g, False, info)

    def _check_tensor(self, t, dtype, shape, itemsize) -> None:
        pb = self.pb
        if t.dtype != dtype or list(t.shape) != list(shape):
            raise ProtocolError(f"ActionReply.action: expected {pb.DType.Name(dtype)} {list(shape)}, "
                                f"got {pb.DType.Name(t.dtype) if t.dtype in pb.DType.values() else t.dtype} "
                                f"{list(t.shape)}")
        if len(t.data) != _prod(shape) * itemsize:
            raise ProtocolError(f"ActionReply.action: shape {list(shape)} needs {_prod(shape) * itemsize} bytes, "
                                f"got {len(t.data)}")

    def run(self) -> WorkerStats:
        start = time.monotonic()
        self._connect()
        try:
            if not self._handshake():
                return self.stats
            self._start_groups(seeded=True)
            while True:
                try:
                    # A learner that answers no heartbeat for heartbeat_timeout_s is gone (crashed, restarted).
                    msg = self._receive("the learner was silent", self.heartbeat_timeout_s)
                except LearnerTimeout:
                    if not self._reconnect("stopped answering"):
                        return self.stats
                    continue
                if msg is None:  # request_stop()
                    self.stats.stop_reason = "stop requested"
                    return self.stats
                kind = msg.WhichOneof("body")
                if kind == "heartbeat":
                    continue
                if kind == "action":
                    self._on_action(msg.action)
                elif kind == "stop":
                    self.stats.stop_reason = msg.stop.reason
                    return self.stats
                elif kind == "error" and msg.error.code == self.pb.Error.UNKNOWN_WORKER:
                    # The learner restarted, or dropped this worker as silent: say Hello again.
                    if not self._reconnect(f"does not know this worker ({msg.error.message})"):
                        return self.stats
                elif kind == "error":
                    raise ProtocolError(f"learner reported an error: {msg.error.message}"
                                        f" (group {msg.error.group}, seq {msg.error.seq})")
                else:
                    raise ProtocolError(f"unexpected message type {kind} from the learner")
        except _StopRequested:
            self.stats.stop_reason = "stop requested"
            return self.stats
        finally:
            self.stats.seconds = time.monotonic() - start
            self._close()

    def close(self) -> None:
        for g in self.groups:
            g.close()


# --------------------------------------------------------------------------- command line


def _load_factory(spec: str) -> Callable[[], Any]:
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise WorkerError(f"--env-module: expected MODULE:FACTORY, got {spec!r}")
    if module_name.endswith(".py") or os.sep in module_name:
        path = os.path.abspath(module_name)
        if not os.path.isfile(path):
            raise WorkerError(f"--env-module: file {path} not found")
        name = os.path.splitext(os.path.basename(path))[0]
        sys.path.insert(0, os.path.dirname(path))
        mspec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(mspec)
        sys.modules[name] = module
        mspec.loader.exec_module(module)
    else:
        if "" not in sys.path and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        module = importlib.import_module(module_name)
    factory = module
    for part in attr.split("."):
        factory = getattr(factory, part, None)
        if factory is None:
            raise WorkerError(f"--env-module: {module_name} has no attribute {attr!r}")
    if not callable(factory):
        raise WorkerError(f"--env-module: {spec} is not callable")
    return factory


def _die_with_parent(launcher: int) -> bool:
    """PR_SET_PDEATHSIG(SIGTERM), as farm-worker: no orphans if the launcher is killed (Linux only).

    `launcher` is the parent pid recorded when main() started. The signal only covers a parent that dies
    after prctl; one that died before has already made this process an orphan, so returns False when the
    parent is no longer `launcher` (the caller exits at once), True otherwise.
    """
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)
    except Exception:
        pass
    return os.getppid() == launcher


def check_endpoint(endpoint: str) -> None:
    """Raises WorkerError unless ZeroMQ can connect to `endpoint`: tcp://HOST:PORT (PORT 1 to 65535),
    ipc://PATH or inproc://NAME. ZeroMQ itself would take a larger port modulo 65536 and throw on the rest.
    The same rule as farm-worker's (common/transport.h, CheckEndpoint)."""
    if endpoint.startswith(("ipc://", "inproc://")):
        return
    if not endpoint.startswith("tcp://"):
        raise WorkerError(f"the learner's endpoint (--learner): expected tcp://HOST:PORT, ipc://PATH or "
                          f"inproc://NAME, got '{endpoint}'")
    host, colon, port = endpoint[len("tcp://"):].rpartition(":")
    if not (colon and host and port.isascii() and port.isdigit() and len(port) <= 5 and 1 <= int(port) <= 65535):
        raise WorkerError(f"the learner's endpoint (--learner): expected tcp://HOST:PORT with PORT a number from 1 "
                          f"to 65535, got '{endpoint}'")


def main(argv: Optional[Sequence[str]] = None) -> int:
    launcher = os.getppid()  # before anything can delay us: see _die_with_parent
    p = argparse.ArgumentParser(description="Rollout Farm worker for Python (Gymnasium-style) environments")
    p.add_argument("--learner", required=True, help="learner endpoint, e.g. tcp://127.0.0.1:5555")
    p.add_argument("--env-module", required=True, metavar="MODULE:FACTORY",
                   help="FACTORY() returns one env; MODULE is a module name or a .py file")
    p.add_argument("--num-envs", type=int, default=8, help="envs in this worker (default 8)")
    p.add_argument("--groups", type=int, default=2, help="groups for double buffering (default 2)")
    p.add_argument("--seed", type=int, default=0, help="seeds every env (mixed with index and group)")
    p.add_argument("--index", type=int, default=0, help="this worker's index (seeds and identity)")
    p.add_argument("--worker-id", default=None, help="ZeroMQ identity (default worker-HOST-INDEX-PID)")
    p.add_argument("--env-name", default=None, help="env name in Hello (default: env.spec.id or the class name)")
    p.add_argument("--give-up-s", type=float, default=60, help="exit when the learner is silent this long")
    p.add_argument("--proto-dir", default=None, help="folder with farm_pb2.py (default: $FARM_PYTHON_PATH)")
    p.add_argument("--stats-file", default=None, help="write this worker's statistics (JSON) here at exit")
    p.add_argument("--curve-worker-secret-key-file", default=None, metavar="NAME.key",
                   help="CURVE: this worker's secret key (scripts/farm keygen); the learner must list its NAME.pub")
    p.add_argument("--curve-learner-public-key-file", default=None, metavar="LEARNER.pub",
                   help="CURVE: the learner's public key")
    n = p.add_argument_group("normalisation (must match the learner's config; docs/ENVIRONMENTS.md)")
    n.add_argument("--normalize-obs", action="store_true", help="env.normalize_obs: normalise observations")
    n.add_argument("--normalize-reward", action="store_true", help="env.normalize_reward: scale rewards")
    n.add_argument("--obs-clip", type=float, default=10.0, help="env.obs_clip (default 10)")
    n.add_argument("--reward-clip", type=float, default=10.0, help="env.reward_clip (default 10)")
    n.add_argument("--gamma", type=float, default=0.99, help="ppo.gamma, the running return's discount (default 0.99)")
    n.add_argument("--rollout-length", type=int, default=None,
                   help="ppo.rollout_length: a statistics delta every this many requests (needed to normalise)")
    p.add_argument("--frame-stack", type=int, default=1, metavar="K",
                   help="env.frame_stack: observations are each env's last K, stacked along the first axis "
                        "(default 1: off; must match the learner's config)")
    args = p.parse_args(argv)
    prog = f"farm_worker.py {args.index}"
    if args.num_envs < 1 or args.groups < 1 or args.num_envs % args.groups:
        print(f"{prog}: --num-envs ({args.num_envs}) must be a positive multiple of --groups ({args.groups})",
              file=sys.stderr)
        return 2
    if not _die_with_parent(launcher):
        print(f"{prog}: the launcher (pid {launcher}) exited before this worker started (parent now pid "
              f"{os.getppid()}); exiting", file=sys.stderr)
        return 1
    try:
        normalization = NormalizerOptions(args.normalize_obs, args.normalize_reward, args.obs_clip,
                                          args.reward_clip, args.gamma)
        factory = _load_factory(args.env_module)
        worker = PythonWorker([factory] * args.num_envs, args.learner, num_groups=args.groups,
                              worker_id=args.worker_id, seed=args.seed, give_up_s=args.give_up_s,
                              index=args.index, env_name=args.env_name, proto_dir=args.proto_dir,
                              curve_worker_secret_key_file=args.curve_worker_secret_key_file,
                              curve_learner_public_key_file=args.curve_learner_public_key_file,
                              normalization=normalization, rollout_length=args.rollout_length,
                              frame_stack=args.frame_stack)
    except WorkerError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: worker.request_stop())
    rc = 0
    try:
        stats = worker.run()
        print(f"{prog}: {worker.identity.decode(errors='replace')} done: {stats.env_steps} env steps, "
              f"{stats.episodes} episodes ({stats.stop_reason})", file=sys.stderr)
    except WorkerError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        rc = 1
    finally:
        worker.close()
    if args.stats_file:
        with open(args.stats_file, "w") as f:
            out = dict(worker.stats.as_dict(), index=args.index)
            if worker.normalizer is not None:
                out["normalizer"] = worker.normalizer.view_dict()  # the statistics it normalised with last
            json.dump(out, f)
            f.write("\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())
