"""PythonWorker: steps Python envs for a farm-learner over ZeroMQ (DEALER -> ROUTER), as farm-worker does.

Hello, Welcome, then one StepRequest per group of envs; each ActionReply steps that group and sends its next
request at once, so while the learner acts for one group the others step (double buffering). It exits on Stop.

Threading: a PythonWorker is used by one thread; request_stop() may be called from a signal handler or another
thread.
"""
from __future__ import annotations

import itertools
import logging
import os
import socket
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from .errors import LearnerTimeout, ProtocolError, WorkerError, _StopRequested
from .normalizer import Normalizer, NormalizerOptions
from .spaces import _prod
from .vector import MAX_FRAME_STACK, FrameStack, VectorEnv, env_style
from .wire import (HANDSHAKE_CLOSES_BEFORE_FAILING, PROTOCOL_VERSION, check_endpoint, env_seed, from_le, le_bytes,
                   load_proto, mix_seed, read_curve_key, space_to_wire, zmq_module)

try:
    import numpy as np
except ImportError:  # the pure-Python path (farm_worker.vector) needs none
    np = None

_MAX_ROUND_TRIP_SAMPLES = 1 << 20


def _max_rss_mb() -> Optional[float]:
    """This process's peak resident set in MiB (as farm-worker's --stats-file has it); None where unknown."""
    try:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux
    except (ImportError, OSError):
        return None


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
            "max_rss_mb": _max_rss_mb(),
        }

    def __repr__(self):
        return f"WorkerStats({self.as_dict()})"


_instance_counter = itertools.count()
_log = logging.getLogger("farm_worker")


class PythonWorker:
    """Runs Python envs for a farm-learner.

    env_fns: one callable per env, each returning an env; they are split into num_groups equal groups
    (double buffering). An env is a Gymnasium single-agent env, a multi-agent env in the array style or a PettingZoo
    Parallel env (farm_worker.groups), or a vectorised env (num_envs): then each group is one such env, made by
    the first num_groups callables. use_numpy: step into numpy buffers (farm_worker.groups; needed for all but
    single-agent envs); None: when numpy can be imported. Without it, single-agent envs go through the pure-Python
    VectorEnv, with the same numbers on the wire. worker_id: the ZeroMQ routing identity
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

    env_source: where the env's code was found (cli.env_source), said in Hello; the learner records it in the
    run directory's config (env.python_found) so that eval and --resume find the env from the run directory.
    """

    def __init__(self, env_fns: Sequence[Callable[[], Any]], learner_endpoint: str, num_groups: int = 2,
                 worker_id: Optional[str] = None, seed: int = 0, give_up_s: float = 60, *,
                 index: Optional[int] = None, env_name: Optional[str] = None,
                 max_message_bytes: int = 64 << 20, proto_dir: Optional[str] = None,
                 curve_worker_secret_key_file: Optional[str] = None,
                 curve_learner_public_key_file: Optional[str] = None,
                 normalization: Optional[NormalizerOptions] = None, rollout_length: Optional[int] = None,
                 frame_stack: int = 1, use_numpy: Optional[bool] = None, env_source: str = "",
                 groups: Optional[list] = None):
        check_endpoint(learner_endpoint)
        self.env_source = env_source
        self.pb = load_proto(proto_dir)
        self.zmq = zmq_module()
        self._curve = None  # (secret, public, learner public), Z85 bytes
        if curve_worker_secret_key_file or curve_learner_public_key_file:
            if not (curve_worker_secret_key_file and curve_learner_public_key_file):
                raise WorkerError("CURVE needs both this worker's secret key file and the learner's public key file")
            if not self.zmq.has("curve"):
                raise WorkerError(f"CURVE is not available: libzmq {self.zmq.zmq_version()} was built without it")
            secret = read_curve_key(curve_worker_secret_key_file, "curve worker secret key file")
            server = read_curve_key(curve_learner_public_key_file, "curve learner public key file")
            self._curve = (secret, self.zmq.curve_public(secret), server)
        env_fns = list(env_fns)
        if groups is not None:  # farm_worker.policies: one policy's views of envs that others step
            env_fns = [None] * len(groups)
            num_groups = len(groups)
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
        if not 1 <= int(frame_stack) <= MAX_FRAME_STACK:
            raise WorkerError(f"frame_stack must be a whole number from 1 to {MAX_FRAME_STACK}, got {frame_stack}")
        if groups is not None:
            self.numpy = True
            self.groups = list(groups)
        else:
            self.groups = self._make_groups(env_fns, num_groups, use_numpy, int(frame_stack))
        first = self.groups[0]
        for g in self.groups[1:]:
            if (g.observation_space != first.observation_space or g.action_space != first.action_space
                    or getattr(g, "num_agents", 1) != getattr(first, "num_agents", 1)
                    or getattr(g, "state_space", None) != getattr(first, "state_space", None)):
                raise WorkerError("every env of a worker must have the same agents and spaces")
        env0 = first.envs[0]
        env0 = getattr(env0, "env", env0)  # a PettingZoo env behind its adapter
        spec = getattr(env0, "spec", None)
        metadata = getattr(env0, "metadata", None)
        self.env_name = (env_name or getattr(spec, "id", None) or
                         (metadata.get("name") if isinstance(metadata, dict) else None) or
                         type(getattr(env0, "unwrapped", env0)).__name__)
        self.num_agents = getattr(first, "num_agents", 1)
        self.state_space = getattr(first, "state_space", None)
        self.num_envs = sum(g.num_envs for g in self.groups)
        self.normalizer: Optional[Normalizer] = None
        self.rollout_length = 0
        if normalization is not None and normalization.any():
            if rollout_length is None or int(rollout_length) < 1:
                raise WorkerError("normalisation needs the learner's ppo.rollout_length (a positive integer): this "
                                  "worker sends its statistics once per rollout")
            self.rollout_length = int(rollout_length)
            if self.numpy:
                from .numpy_normalizer import NumpyNormalizer
                self.normalizer = NumpyNormalizer(normalization, first.obs_numel)
                for g in self.groups:
                    self.normalizer.add_group(g.num_envs, g.num_agents)
            else:
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

    def _make_groups(self, env_fns, num_groups: int, use_numpy: Optional[bool], frame_stack: int) -> list:
        if use_numpy and np is None:
            raise WorkerError("use_numpy: numpy cannot be imported (Debian: python3-numpy)")
        first = env_fns[0]()
        from_numpy = np is not None if use_numpy is None else bool(use_numpy)
        if from_numpy:
            from .groups import FrameStackGroup, make_group
            if env_style(first) == "batched":  # one vectorised env per group
                envs = [[first]] + [[fn()] for fn in env_fns[1:num_groups]]
                if len(envs) != num_groups:
                    raise WorkerError(f"{num_groups} groups of vectorised envs need {num_groups} env factories")
            else:
                size = len(env_fns) // num_groups
                made = [first] + [fn() for fn in env_fns[1:]]
                envs = [made[g * size:(g + 1) * size] for g in range(num_groups)]
            groups = [make_group(e) for e in envs]
            if frame_stack > 1:
                groups = [FrameStackGroup(g, frame_stack) for g in groups]
        else:
            style = env_style(first)
            if style != "single":
                raise WorkerError(f"a {style} env needs numpy (Debian: python3-numpy); without it, only single-agent "
                                  "Gymnasium-style envs can be stepped")
            size = len(env_fns) // num_groups
            made = [first] + [fn() for fn in env_fns[1:]]
            groups = [VectorEnv(made[g * size:(g + 1) * size]) for g in range(num_groups)]
            if frame_stack > 1:
                groups = [FrameStack(g, frame_stack) for g in groups]
        self.numpy = from_numpy
        return groups

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

    def _close(self, linger_ms: int = 0):
        """linger_ms: how long messages still queued may take to leave (0: dropped)."""
        if self._monitor is not None:
            self._monitor.close(linger=0)  # before the context ends, or term() waits for it
            self._monitor = None
        if self._sock is not None:
            self._sock.close(linger=linger_ms)
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
            return self._read()
        return None

    def _read(self):
        """The Envelope waiting on the socket, parsed and checked."""
        data = self._sock.recv(copy=True)
        env = self.pb.Envelope()
        try:
            env.ParseFromString(data)
        except Exception as e:  # google.protobuf.message.DecodeError
            raise ProtocolError(f"cannot parse a {len(data)}-byte message as farm.wire.Envelope: {e}") from e
        if env.WhichOneof("body") is None:
            raise ProtocolError("message has no body (unknown message type or empty envelope)")
        return env

    def request_stop(self) -> None:
        """Makes run() return soon (from another thread or a signal handler)."""
        self._stop_requested = True

    # -- protocol

    def _handshake(self, timeout_s: Optional[float] = None) -> bool:
        """Hello, then the learner's Welcome within timeout_s (default give_up_s). False when it says Stop or a stop
        is requested; raises LearnerTimeout, ProtocolError or WorkerError otherwise."""
        self._send_hello()
        return self._await_welcome(timeout_s)

    def _send_hello(self) -> None:
        pb = self.pb
        env = pb.Envelope()
        h = env.hello
        h.protocol_version = PROTOCOL_VERSION
        h.worker_id = self.identity.decode(errors="replace")
        h.env_name = self.env_name
        h.num_envs = self.num_envs
        h.num_groups = len(self.groups)
        space_to_wire(self.groups[0].observation_space, h.observation)
        space_to_wire(self.groups[0].action_space, h.action)
        h.num_agents = self.num_agents
        if self.state_space is not None:
            space_to_wire(self.state_space, h.global_state)
        if self.normalizer is not None:
            self.normalizer.options.to_wire(h.normalization)
        if self.env_source and "env_source" in h.DESCRIPTOR.fields_by_name:  # an older farm_pb2.py lacks it
            h.env_source = self.env_source
        self._send(env)

    def _await_welcome(self, timeout_s: Optional[float] = None) -> bool:
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
                base = mix_seed(self.seed, self.index * 1000 + g)
                group.reset(seed=[env_seed(base, i) for i in range(group.num_envs)])
            else:
                group.reset()
            if self.normalizer is not None:
                self.normalizer.on_reset(g, group)
            self._send_step(g, True)

    def _reconnect(self, why: str) -> bool:
        """A fresh socket under a new identity and a new handshake, with exponential backoff, until give_up_s
        (as farm-worker); then the episodes start over, since the learner kept nothing of them. False when the
        learner said Stop or a stop was requested meanwhile."""
        if not self._redial(why):
            return False
        self._start_groups(seeded=False)
        return True

    def _redial(self, why: str) -> bool:
        """_reconnect's new socket, identity and handshake (with backoff until give_up_s), without restarting the
        groups."""
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
            return True
        if self._stop_requested:
            self.stats.stop_reason = "stop requested"
            return False
        raise LearnerTimeout(f"could not reach the learner at {self.endpoint} again within {self.give_up_s:g} s; "
                             "giving up")

    def _tensor(self, out, data, shape) -> None:
        """A float32 tensor: one copy of a numpy array (already float32 and C-ordered), or an array('f')."""
        out.dtype = self.pb.FLOAT32
        out.shape.extend(shape)
        if np is not None and isinstance(data, np.ndarray):
            data = np.ascontiguousarray(data, dtype="<f4")
        out.data = le_bytes(data)

    def _send_step(self, g: int, first: bool, info: Optional[dict] = None) -> None:
        pb = self.pb
        group = self.groups[g]
        rows = getattr(group, "rows", group.num_envs)
        env = pb.Envelope()
        req = env.step
        req.group = g
        req.seq = self._next_seq[g]
        req.first = first
        norm = self.normalizer
        obs_shape = tuple(group.observation_space.shape)
        # With normalisation the normalised observations and scaled rewards; episode returns stay raw.
        self._tensor(req.obs, norm.obs(g) if norm else group.obs, (rows,) + obs_shape)
        state = getattr(group, "state", None)
        if state is not None:
            self._tensor(req.global_state, state, state.shape)
        if not first:
            self._tensor(req.reward, norm.reward(g) if norm else group.reward, (rows,))
            req.terminated = bytes(group.terminated)
            req.truncated = bytes(group.truncated)
            # Only while some agent has finished early (numpy array groups): absent, every row acts.
            if getattr(group, "any_inactive", False):
                req.active = bytes(group.active)
            idx = info["final_obs_index"]
            if idx:
                req.final_obs_index.extend(idx)
                self._tensor(req.final_obs, norm.final_obs(g) if norm else info["final_obs"], (len(idx),) + obs_shape)
                if state is not None:
                    fs = info["final_state"]
                    self._tensor(req.final_global_state, fs, fs.shape)
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

    def _decode_actions(self, group, t):
        """The reply's actions for `group`, checked: int64 [R] / [R, K] or float32 [R, ...]; numpy arrays on the
        numpy path (one copy), array('q'/'f') on the pure one."""
        pb = self.pb
        rows = getattr(group, "rows", group.num_envs)
        if group.discrete:
            shape, dtype, code = [rows], pb.INT64, "q"
        elif group.multi_discrete:
            shape, dtype, code = [rows, len(group.action_space.nvec)], pb.INT64, "q"
        else:
            shape, dtype, code = [rows, *group.action_space.shape], pb.FLOAT32, "f"
        self._check_tensor(t, dtype, shape, 8 if code == "q" else 4)
        if not self.numpy:
            actions = from_le(code, t.data)
            if group.discrete:
                for a in actions:
                    if a < 0 or a >= group.action_space.n:
                        raise ProtocolError(f"action {a} out of range [0, {group.action_space.n})")
            elif group.multi_discrete:
                nvec = group.action_space.nvec
                for j, a in enumerate(actions):
                    if a < 0 or a >= nvec[j % len(nvec)]:
                        raise ProtocolError(f"action {a} (component {j % len(nvec)} of row {j // len(nvec)}) "
                                            f"out of range [0, {nvec[j % len(nvec)]})")
            return actions
        actions = np.frombuffer(t.data, "<i8" if code == "q" else "<f4").reshape(shape)
        if group.discrete or group.multi_discrete:
            high = np.asarray([group.action_space.n] if group.discrete else group.action_space.nvec, np.int64)
            bad = np.argwhere((actions < 0) | (actions >= high))
            if len(bad):
                row, comp = (int(bad[0][0]), int(bad[0][1]) if actions.ndim == 2 else 0)
                a = int(actions[tuple(bad[0])])
                raise ProtocolError(f"action {a} (component {comp} of row {row}) out of range [0, {int(high[comp])})")
            return actions.astype(np.int64)  # native order, writable
        return actions.astype(np.float32)

    def _on_action(self, reply) -> None:
        g, actions = self._take_action(reply)
        self._step_group(g, actions)

    def _take_action(self, reply):
        """The reply checked against what this worker waits for, its statistics applied: (group, decoded actions)."""
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
        return g, self._decode_actions(self.groups[g], reply.action)

    def _step_group(self, g: int, actions) -> None:
        _, _, _, _, info = self.groups[g].step(actions)
        self._after_step(g, info)

    def _after_step(self, g: int, info: dict) -> None:
        """Group g has stepped: normalise, count, and send its next request."""
        group = self.groups[g]
        if self.normalizer is not None:
            self.normalizer.on_step(g, group, info["final_obs"])
        self.stats.env_steps += group.num_envs
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
