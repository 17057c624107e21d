"""Several policies in one env: each agent is trained by the policy its name maps to, each policy by its own
farm-learner (Sample Factory's and RLlib's multi-policy training, with one learner per policy).

    from farm_worker.policies import MultiPolicyWorker, PolicySpec
    worker = MultiPolicyWorker([make_env] * 8, [PolicySpec("speaker", "tcp://host:5555", ["speaker_*"]),
                                                PolicySpec("listener", "tcp://host:5556", ["listener_*"])])
    stats = worker.run()   # {policy name: WorkerStats}

or, on the command line, farm-worker-py --policy speaker tcp://host:5555 'speaker_*' --policy listener ... .

  * the agents: a PettingZoo Parallel env's possible_agents, or "0", "1", ... for an env in the array style; each
    agent belongs to the first policy one of whose patterns (fnmatch: `adversary_*`, or a name) matches it. An agent
    no policy claims, and a policy that claims no agent, are refused by name. The agents of one policy share its
    spaces (refused by name otherwise); policies may have different observation and action spaces;
  * each policy sees its own agents' rows only (agent a of env e at row e * A_p + a, its agents in
    possible_agents order), their rewards, ends and active masks, the env's global state (for a centralised
    critic), the final observations of its rows when the env is truncated, and its own episode returns (the mean
    over its agents of their summed rewards);
  * an env is stepped once every policy's actions for its group have arrived, so a slow learner slows the others;
  * an agent may finish before its env (it is masked in its policy's update), but not every agent of a policy while
    other policies' agents act on: that is refused by name (its learner would see its env end while it goes on);
  * a policy's learner that says Stop ends the worker (the env cannot go on without that policy's actions): the
    launcher stops the others; a learner that restarted or went silent makes the worker connect to every learner
    again under new identities, and the episodes start over.

Threading: a MultiPolicyWorker is used by one thread; request_stop() may be called from a signal handler or another
thread.
"""
from __future__ import annotations

import fnmatch
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from .errors import LearnerTimeout, ProtocolError, WorkerError, _StopRequested
from .groups import _box_or_none, _Group, agent_rewards, env_reset_seed, step_ends, ParallelEnvAdapter
from .normalizer import NormalizerOptions
from .spaces import as_space
from .vector import env_style
from .wire import env_seed, mix_seed
from .worker import PythonWorker, WorkerStats, _instance_counter


class PolicySpec:
    """One policy: its name (letters, digits, '_', '-', '.'), its learner's endpoint, the agent patterns it claims,
    and, when its learner's settings differ from the worker's, its normalisation options and rollout length."""

    def __init__(self, name: str, endpoint: str, agents: Sequence[str],
                 normalization: Optional[NormalizerOptions] = None, rollout_length: Optional[int] = None):
        if not name or not all(c.isalnum() or c in "_-." for c in name):
            raise WorkerError(f"policy name {name!r}: expected letters, digits, '_', '-' or '.'")
        if isinstance(agents, str):
            agents = [agents]
        agents = [str(a) for a in agents if str(a)]
        if not agents:
            raise WorkerError(f"policy {name!r} names no agents (expected agent names or patterns such as 'adversary_*')")
        self.name = name
        self.endpoint = endpoint
        self.agents = agents
        self.normalization = normalization
        self.rollout_length = rollout_length

    def __repr__(self):
        return f"PolicySpec({self.name!r}, {self.endpoint!r}, {self.agents!r})"


def assign_agents(agents: Sequence[Any], policies: Sequence[PolicySpec]) -> List[List[int]]:
    """The indices into `agents` of each policy's agents (in `agents` order): each agent goes to the first policy
    whose pattern matches its name. Raises WorkerError naming an agent no policy claims or a policy with none."""
    names = [p.name for p in policies]
    if len(set(names)) != len(names):
        raise WorkerError(f"policy names must differ, got {names}")
    owned: List[List[int]] = [[] for _ in policies]
    for i, agent in enumerate(agents):
        for k, p in enumerate(policies):
            if any(fnmatch.fnmatchcase(str(agent), pattern) for pattern in p.agents):
                owned[k].append(i)
                break
        else:
            raise WorkerError(f"agent {str(agent)!r} belongs to no policy (the env's agents: "
                              f"{[str(a) for a in agents]}; the policies' patterns: "
                              f"{ {p.name: p.agents for p in policies} })")
    for k, p in enumerate(policies):
        if not owned[k]:
            raise WorkerError(f"policy {p.name!r} ({p.agents}) matches none of the env's agents "
                              f"{[str(a) for a in agents]} (or only agents an earlier policy claims)")
    return owned


class _ArrayAgents:
    """An env in the array style seen agent by agent: agents "0", "1", ..., one space for all."""

    def __init__(self, env):
        self.env = env
        self.num_agents = int(env.num_agents)
        self.agents = [str(i) for i in range(self.num_agents)]
        self.observation_spaces = [as_space(env.observation_space)] * self.num_agents
        self.action_spaces = [as_space(env.action_space)] * self.num_agents
        self.state_space = _box_or_none(getattr(env, "state_space", None), "state_space")

    def reset(self, seed=None):
        obs, state = self.env.reset(seed=seed)[:2]
        return list(np.asarray(obs, np.float32)), state

    def step(self, actions):
        obs, state, reward, terminated, truncated, info = self.env.step(np.stack(actions))
        return list(np.asarray(obs, np.float32)), state, reward, terminated, truncated, info

    def close(self):
        close = getattr(self.env, "close", None)
        if callable(close):
            close()


class PolicyView(_Group):
    """One policy's rows of a MultiPolicyGroup: a group as PythonWorker sends it (obs, state, reward, flags, active,
    episodes). It is filled by its MultiPolicyGroup; stepping and closing are the joint group's."""

    def __init__(self, joint: "MultiPolicyGroup", name: str, agents: List[int]):
        j = joint.envs[0]
        first = agents[0]
        obs_space, act_space = j.observation_spaces[first], j.action_spaces[first]
        for i in agents[1:]:
            if (j.observation_spaces[i], j.action_spaces[i]) != (obs_space, act_space):
                raise WorkerError(f"policy {name!r}: agent {j.agents[i]!r} has other spaces than agent "
                                  f"{j.agents[first]!r}; the agents of one policy share its spaces (its agents: "
                                  f"{[j.agents[k] for k in agents]})")
        super().__init__(joint.num_envs, len(agents), obs_space, act_space, j.state_space)
        self.name = name
        self.agent_indices = agents
        self.envs = joint.envs  # for the env's name in Hello; closed by the joint group

    def reset(self, seed=None):
        raise WorkerError(f"policy {self.name!r}: a policy's view is reset by its MultiPolicyGroup")

    def step(self, actions):
        raise WorkerError(f"policy {self.name!r}: a policy's view is stepped by its MultiPolicyGroup")

    def close(self) -> None:
        pass


class MultiPolicyGroup:
    """E envs whose agents several policies act for, stepped together; views[k] is policy k's group.

    Agents end as in farm_worker.groups (an agent that finishes early is inactive until its env ends, which is when
    every agent of every policy has finished); every policy's rows of an ended env are flagged alike. The global
    state, when the env has one, goes to every policy."""

    def __init__(self, envs: Sequence[Any], policies: Sequence[PolicySpec]):
        wrapped = []
        for e in envs:
            style = env_style(e)
            if style == "parallel":
                wrapped.append(ParallelEnvAdapter(e, same_spaces=False))
            elif style == "array":
                wrapped.append(_ArrayAgents(e))
            else:
                raise WorkerError(f"several policies need a multi-agent env (PettingZoo's Parallel API or the array "
                                  f"style), got a {style} env")
        if not wrapped:
            raise WorkerError("a group needs at least one env")
        self.envs = wrapped
        e0 = wrapped[0]
        for i, e in enumerate(wrapped[1:], 1):
            if (e.agents, e.observation_spaces, e.action_spaces, e.state_space) != \
                    (e0.agents, e0.observation_spaces, e0.action_spaces, e0.state_space):
                raise WorkerError(f"env {i} has other agents or spaces than env 0")
        self.num_envs = len(wrapped)
        self.num_agents = e0.num_agents
        self.policies = list(policies)
        owned = assign_agents(e0.agents, self.policies)
        self.views = [PolicyView(self, p.name, idx) for p, idx in zip(self.policies, owned)]
        # (policy, its view, the agent's row within an env) of each agent
        self._where = [None] * self.num_agents
        for p, v in enumerate(self.views):
            for j, i in enumerate(v.agent_indices):
                self._where[i] = (p, v, j)
        self._active = np.ones((self.num_envs, self.num_agents), bool)

    def _put_obs(self, e: int, obs, what: str) -> None:
        if len(obs) != self.num_agents:
            raise WorkerError(f"env {e}: {what}: {len(obs)} agents' observations, expected {self.num_agents}")
        for i, (_, v, j) in enumerate(self._where):
            v._put(v.obs[e * v.num_agents + j], obs[i], f"env {e}: {what} of agent {self.envs[e].agents[i]!r}")

    def _put_state(self, e: int, state, what: str) -> None:
        for v in self.views:
            v._put_state(e, state, what)

    def reset(self, seed=None):
        for e, env in enumerate(self.envs):
            obs, state = env.reset(seed=env_reset_seed(seed, e))[:2]
            self._put_obs(e, obs, "reset's observations")
            self._put_state(e, state, f"env {e}: reset's state")
        for v in self.views:
            v._reset_bookkeeping()
        self._active[:] = True

    def step(self, actions: Sequence[np.ndarray]) -> List[dict]:
        """actions[k]: policy k's decoded actions (PythonWorker._decode_actions) -> one info per policy, as
        ArrayGroup.step returns it."""
        acts = [v._actions(a) for v, a in zip(self.views, actions)]
        trunc_envs: List[int] = []
        finals: List[List[np.ndarray]] = [[] for _ in self.views]
        final_states: List[np.ndarray] = []
        ended = np.zeros(self.num_envs, bool)
        for e, env in enumerate(self.envs):
            joint = [acts[p][e * v.num_agents + j] for p, v, j in self._where]
            out = env.step(joint)
            if len(out) != 6:
                raise WorkerError(f"env {e}: step returned {len(out)} values, expected (obs, state, reward, "
                                  "terminated, truncated, info)")
            obs, state, reward, terminated, truncated, _ = out
            term = np.broadcast_to(np.asarray(terminated, bool).reshape(-1), (self.num_agents,)).copy()
            trunc = np.broadcast_to(np.asarray(truncated, bool).reshape(-1), (self.num_agents,)) & ~term
            was_active = self._active[e].copy()
            rewards, team = agent_rewards(reward, was_active, e)
            row_term, row_trunc, active, env_end = step_ends(term, trunc, was_active)
            self._active[e] = active
            if env_end is None:
                for v in self.views:
                    if not active[v.agent_indices].any():
                        # Its learner would see the env end (every row of it flagged) while the env goes on.
                        raise WorkerError(
                            f"env {e}: every agent of policy {v.name!r} has finished while the env goes on (for "
                            f"{[env.agents[i] for i in range(self.num_agents) if active[i]]}): a policy's agents "
                            "finishing before their env is not supported; give them a policy together with agents "
                            "that act on, or end the env with them")
            for v in self.views:
                rows = slice(e * v.num_agents, (e + 1) * v.num_agents)
                idx = v.agent_indices
                v.reward[rows] = rewards[idx]
                v.env_reward[e] = team if team is not None else float(rewards[idx].mean(dtype=np.float64))
                v.terminated[rows] = row_term[idx]
                v.truncated[rows] = row_trunc[idx]
                v.active[rows] = active[idx]
            if env_end is not None:
                ended[e] = True
                if env_end == "truncated":
                    trunc_envs.append(e)
                    for k, v in enumerate(self.views):
                        f = np.empty((v.num_agents,) + v.obs.shape[1:], np.float32)
                        for j, i in enumerate(v.agent_indices):
                            v._put(f[j], obs[i], f"env {e}: step's observation of agent {env.agents[i]!r}")
                        finals[k].append(f)
                    if env.state_space is not None:
                        fs = np.empty(env.state_space.shape, np.float32)
                        self.views[0]._put(fs, state, f"env {e}: step's state")
                        final_states.append(fs)
                obs, state = env.reset()[:2]
            self._put_obs(e, obs, "step's observations")
            self._put_state(e, state, f"env {e}: step's state")
        infos = []
        for k, v in enumerate(self.views):
            episodes = v._finish(ended, np.asarray(trunc_envs, np.int64))
            final_obs = np.concatenate(finals[k]) if finals[k] else np.zeros((0,) + v.obs.shape[1:], np.float32)
            final_state = None
            if v.state is not None:
                final_state = (np.stack(final_states) if final_states else
                               np.zeros((0,) + v.state.shape[1:], np.float32))
            infos.append({"final_obs_index": v.final_rows(trunc_envs), "final_obs": final_obs,
                          "final_state": final_state, "episodes": episodes})
        return infos

    def close(self) -> None:
        for env in self.envs:
            env.close()


class MultiPolicyWorker:
    """Steps multi-agent envs for several farm-learners, one per policy (PolicySpec), over one DEALER each.

    env_fns: one callable per env, split into num_groups groups (double buffering, as PythonWorker). Each policy's
    connection is a PythonWorker over its views (identity "<worker_id>-<policy>-c0", then -cN): its handshake, heartbeats,
    normaliser and statistics are that learner's. normalization and rollout_length are every policy's unless its
    PolicySpec has its own. run() returns {policy name: WorkerStats} when a learner says Stop; it raises as
    PythonWorker.run does, naming the policy."""

    def __init__(self, env_fns: Sequence[Callable[[], Any]], policies: Sequence[PolicySpec], num_groups: int = 2,
                 worker_id: Optional[str] = None, seed: int = 0, give_up_s: float = 60, *,
                 index: Optional[int] = None, env_name: Optional[str] = None, proto_dir: Optional[str] = None,
                 curve_worker_secret_key_file: Optional[str] = None,
                 curve_learner_public_key_file: Optional[str] = None,
                 normalization: Optional[NormalizerOptions] = None, rollout_length: Optional[int] = None,
                 env_source: str = ""):
        env_fns = list(env_fns)
        policies = list(policies)
        if not policies:
            raise WorkerError("several policies: give at least one PolicySpec")
        if num_groups < 1 or not env_fns or len(env_fns) % num_groups != 0:
            raise WorkerError(f"num_envs ({len(env_fns)}) must be a positive multiple of num_groups ({num_groups})")
        size = len(env_fns) // num_groups
        made = [fn() for fn in env_fns]
        self.groups = [MultiPolicyGroup(made[g * size:(g + 1) * size], policies) for g in range(num_groups)]
        self.policies = policies
        self.seed = int(seed)
        self.index = next(_instance_counter) if index is None else int(index)  # one for every connection
        index = self.index
        self.channels: List[PythonWorker] = []
        for k, p in enumerate(policies):
            self.channels.append(PythonWorker(
                [], p.endpoint, worker_id=None if worker_id is None else f"{worker_id}-{p.name}", seed=seed,
                give_up_s=give_up_s, index=index, env_name=env_name, proto_dir=proto_dir,
                curve_worker_secret_key_file=curve_worker_secret_key_file,
                curve_learner_public_key_file=curve_learner_public_key_file,
                normalization=p.normalization if p.normalization is not None else normalization,
                rollout_length=p.rollout_length if p.rollout_length is not None else rollout_length,
                env_source=env_source, groups=[jg.views[k] for jg in self.groups]))
            c = self.channels[-1]
            if worker_id is None:
                c._base_identity = c.identity + f"-{p.name}".encode()
            # The learner reads a connection number from the last "-cN" of an identity: with the policy's name in
            # it, the suffix is there from the start, whatever the name (a policy named "c1" included).
            c.identity = c._base_identity + b"-c0"
        self._pending: List[List[Any]] = [[None] * len(policies) for _ in self.groups]
        self._stop_requested = False
        self._linger_ms = 0
        self._poller = None  # over every channel's socket; made anew after a reconnect (new sockets)

    @property
    def stats(self) -> Dict[str, WorkerStats]:
        return {p.name: c.stats for p, c in zip(self.policies, self.channels)}

    def request_stop(self) -> None:
        self._stop_requested = True
        for c in self.channels:
            c.request_stop()

    def _start_groups(self, seeded: bool) -> None:
        for g, group in enumerate(self.groups):
            if seeded:
                base = mix_seed(self.seed, self.index * 1000 + g)
                group.reset(seed=[env_seed(base, i) for i in range(group.num_envs)])
            else:
                group.reset()
            self._pending[g] = [None] * len(self.channels)
            for c in self.channels:
                c._next_seq[g] = 0
                c._waiting[g] = False
                if c.normalizer is not None:
                    c.normalizer.on_reset(g, c.groups[g])
                c._send_step(g, True)

    def _handshake_all(self) -> bool:
        """Every learner's Hello first, then their Welcomes (within give_up_s), so that the learners build their
        runs together; a learner that has welcomed this worker gets heartbeats while the others build theirs (it
        would drop a worker silent for its heartbeat timeout). False on a Stop or a stop request."""
        for c in self.channels:
            c._connect()
            c._send_hello()
        give_up_s = min(c.give_up_s for c in self.channels)
        deadline = time.monotonic() + give_up_s
        for p, c in zip(self.policies, self.channels):
            while True:
                left = deadline - time.monotonic()
                try:
                    if not c._await_welcome(max(0.001, min(left, c.heartbeat_s))):
                        return False
                    break
                except LearnerTimeout as e:
                    if time.monotonic() >= deadline:
                        raise LearnerTimeout(f"policy {p.name!r}: no answer to Hello: is a farm-learner listening "
                                             f"there? (the learner at {c.endpoint}, {give_up_s:g} s)") from e
                except (ProtocolError, WorkerError) as e:
                    raise type(e)(f"policy {p.name!r}: {e}") from e
                now = time.monotonic()
                for other in self.channels:
                    if other._handshaken and now - other._last_heartbeat >= other.heartbeat_s:
                        beat = other.pb.Envelope()
                        beat.heartbeat.SetInParent()
                        other._send(beat)
                        other._last_heartbeat = now
        return True

    def _reconnect(self, why: str) -> bool:
        """Every policy's connection anew (new identities), then the episodes start over: a learner that lost this
        worker cannot take the others' steps in the middle of an episode."""
        self._poller = None
        for c in self.channels:
            if not c._redial(why):
                return False
        self._start_groups(seeded=False)
        return True

    def _on_action(self, k: int, reply) -> None:
        g, actions = self.channels[k]._take_action(reply)
        pending = self._pending[g]
        pending[k] = actions
        if any(a is None for a in pending):
            return
        self._pending[g] = [None] * len(self.channels)
        infos = self.groups[g].step(pending)
        for c, info in zip(self.channels, infos):
            c._after_step(g, info)

    def _wait(self, timeout_s: float) -> List[int]:
        """The channels with a message, after at most timeout_s; heartbeats to every learner due one."""
        if self._poller is None:
            zmq = self.channels[0].zmq
            self._poller = zmq.Poller()
            for c in self.channels:
                self._poller.register(c._sock, zmq.POLLIN)
        ready = dict(self._poller.poll(int(timeout_s * 1000) + 1))
        now = time.monotonic()
        for c in self.channels:
            if now - c._last_heartbeat >= c.heartbeat_s:
                beat = c.pb.Envelope()
                beat.heartbeat.SetInParent()
                c._send(beat)
                c._last_heartbeat = now
        return [k for k, c in enumerate(self.channels) if c._sock in ready]

    def run(self) -> Dict[str, WorkerStats]:
        start = time.monotonic()
        try:
            if not self._handshake_all():
                return self.stats
            self._start_groups(seeded=True)
            heard = [time.monotonic()] * len(self.channels)
            while not self._stop_requested:
                slice_s = min(0.5, min(c.heartbeat_s for c in self.channels) / 2)
                ready = self._wait(slice_s)
                now = time.monotonic()
                silent = [k for k, c in enumerate(self.channels) if now - heard[k] > c.heartbeat_timeout_s]
                if silent:
                    p = self.policies[silent[0]]
                    if not self._reconnect(f"of policy {p.name!r} stopped answering"):
                        return self.stats
                    heard = [time.monotonic()] * len(self.channels)
                    continue
                for k in ready:
                    c, p = self.channels[k], self.policies[k]
                    msg = c._read()
                    heard[k] = time.monotonic()
                    kind = msg.WhichOneof("body")
                    if kind == "heartbeat":
                        continue
                    if kind == "action":
                        try:
                            self._on_action(k, msg.action)
                        except ProtocolError as e:
                            raise ProtocolError(f"policy {p.name!r}: {e}") from e
                    elif kind == "stop":
                        # The env cannot step without this policy: the worker ends (the launcher stops the others).
                        c.stats.stop_reason = msg.stop.reason
                        for other in self.channels:
                            if other is not c:
                                other.stats.stop_reason = f"policy {p.name!r} stopped: {msg.stop.reason}"
                        # The others still get the requests already queued for them (an evaluation's last episodes).
                        self._linger_ms = 2000
                        return self.stats
                    elif kind == "error" and msg.error.code == c.pb.Error.UNKNOWN_WORKER:
                        if not self._reconnect(f"of policy {p.name!r} does not know this worker "
                                               f"({msg.error.message})"):
                            return self.stats
                        heard = [time.monotonic()] * len(self.channels)
                        break
                    elif kind == "error":
                        raise ProtocolError(f"policy {p.name!r}: learner reported an error: {msg.error.message}"
                                            f" (group {msg.error.group}, seq {msg.error.seq})")
                    else:
                        raise ProtocolError(f"policy {p.name!r}: unexpected message type {kind} from the learner")
            for c in self.channels:
                c.stats.stop_reason = c.stats.stop_reason or "stop requested"
            return self.stats
        except _StopRequested:
            for c in self.channels:
                c.stats.stop_reason = "stop requested"
            return self.stats
        finally:
            elapsed = time.monotonic() - start
            for c in self.channels:
                c.stats.seconds = elapsed
                c._close(self._linger_ms)

    def close(self) -> None:
        for g in self.groups:
            g.close()
