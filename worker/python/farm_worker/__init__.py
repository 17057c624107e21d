"""Rollout Farm's worker for Python environments.

It speaks the protocol of the C++ farm-worker (proto/farm.proto) to a farm-learner and steps Python envs: Gymnasium
single-agent envs, multi-agent envs with a global state (the array style or PettingZoo's Parallel API), and
vectorised envs, into numpy buffers sent as one copy per message (farm_worker.groups); without numpy, single-agent
envs through the pure-Python path (farm_worker.vector). Observation and reward normalisation and frame stacking
are done as farm-worker does them. docs/ENVIRONMENTS.md, "Python environments".

Modules: worker (PythonWorker, the protocol), groups (numpy env groups), vector (the pure-Python path), normalizer
and numpy_normalizer, spaces, wire (messages, seeds, bytes), cli (farm-worker-py),
pad_agents (agents of different spaces, padded for one shared policy), opponents (play_against: some agents acting by a
fixed policy inside the env: random, a callable or an exported one), policies (several policies in one env, each
served by a learner of its own; imported on its own: it needs numpy).
"""
from .errors import LearnerTimeout, ProtocolError, WorkerError
from .pad_agents import PaddedAgents, pad_agents
from .opponents import PlayAgainst, play_against
from .normalizer import NORMALIZER_EPSILON, Normalizer, NormalizerOptions, ObsTransform, RunningMoments
from .spaces import Box, Discrete, MultiDiscrete, as_space
from .vector import MAX_FRAME_STACK, FrameStack, VectorEnv, env_style, stacked_space
from .wire import PROTOCOL_VERSION, check_endpoint, load_proto, space_to_wire
from .worker import PythonWorker, WorkerStats
from .cli import load_factory, main

__version__ = "0.3.0"

__all__ = [
    "Box", "Discrete", "MultiDiscrete", "as_space", "VectorEnv", "FrameStack", "stacked_space", "env_style",
    "MAX_FRAME_STACK", "PythonWorker", "WorkerStats", "WorkerError", "ProtocolError", "LearnerTimeout",
    "load_proto", "space_to_wire", "check_endpoint", "PROTOCOL_VERSION", "NormalizerOptions", "Normalizer",
    "RunningMoments", "ObsTransform", "NORMALIZER_EPSILON", "load_factory", "main", "pad_agents", "PaddedAgents",
    "play_against", "PlayAgainst",
]
