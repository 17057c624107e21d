"""Spaces as the learner reads them: Discrete, MultiDiscrete and float32 Box, from Gymnasium objects or dicts."""
from __future__ import annotations

from array import array
from typing import Any, List, Optional, Sequence, Tuple

from .errors import WorkerError

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


def env_space(env, name: str, agent=None) -> Any:
    """env.<name> as the env holds it: an attribute, or PettingZoo's method taking an agent (None when absent)."""
    attr = getattr(env, name, None)
    if callable(attr) and not hasattr(attr, "shape") and not hasattr(attr, "n") and not hasattr(attr, "nvec"):
        attr = attr(agent)
    return attr


def space_of(env, name: str, agent=None) -> Any:
    """env.<name> (env_space) as a Discrete, MultiDiscrete or Box."""
    return as_space(env_space(env, name, agent))
