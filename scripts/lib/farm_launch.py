#!/usr/bin/env python3
"""scripts/farm's launcher on this machine: learners (policies x ranks) and N workers, supervised to the end.

  farm_launch.py --learner-bin BIN --worker-bin BIN --config CONFIG [--resume RUN_DIR] [--workers N]
                 [--learners K] [--worker-arg ARG ...] [-- OVERRIDE ...]
  farm_launch.py --mode learners --learner-bin BIN --config CONFIG --port P [-- OVERRIDE ...]
  farm_launch.py --mode workers --worker-bin BIN --config CONFIG --learner L [--workers N] [--index-base B] ...
  farm_launch.py --mode cluster --learner-bin BIN --config CONFIG --port P --announce-host ME --hostfile FILE
                 --ssh SSH --root ROOT --build-dir DIR [--skip-build 1] [-- OVERRIDE ...]
  farm_launch.py --mode slurm --learner-bin BIN --worker-bin BIN --config CONFIG --port P --announce-host HEAD
                 --workers N [--learners L --master-port M] [--policies A,B --run-dir RUN] [-- OVERRIDE ...]

The roles (the plan's mode): run (scripts/farm run|train): learners and workers here. learners (scripts/farm
learners): the learners alone, group g's on tcp://0.0.0.0:P+g with transport.insecure=true; one learner without
policies is exec'd (this process becomes it); the run ends when the learners end, and INT, TERM, HUP give the
learners' own status (0 when each stopped cleanly). workers (scripts/farm worker): workers alone for a learner
elsewhere; the run ends when every worker has exited (the first failure's status). cluster (scripts/farm
cluster): learners here as for learners, announced as tcp://ME:P+g, and per host of FILE one "worker", the ssh
session running `scripts/farm worker` there. slurm (scripts/slurm/farm.sbatch, one task per node of an srun step):
see slurm_main.

OVERRIDEs (--set key=value ...) go to every learner and worker; each --worker-arg ARG (scripts/farm's python_set)
to every worker only. Python's standard library only: python3 is on every machine the farm runs on.

The topology is data, built once (plan()): the learners are policies x ranks. The policies come from
`farm-learner --policies-plan` (none for a config without them: one learner), the ranks from --learners K
(torchrun's contract: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; one rendezvous port per policy's
rank group). Worker i reaches, for every policy, rank i % K.

One start order and one stop rule (Supervisor): every learner starts (PR_SET_PDEATHSIG: TERM when this launcher
dies), every endpoint file is waited for, then the workers start. The run ends when a learner exits or every
worker has. Then the learners still running stop (the ended learner's rank group stops by itself: a rank still
there 10 s after another failed is stopped; the other groups get TERM, a final checkpoint each, KILL after 30 s:
at once after a failure, 5 s after a clean end, since every policy counts the same env steps),
then the workers (a short grace to exit on their learner's Stop, then TERM). INT, TERM, HUP: the same stop,
exit status 130, 143, 129. Otherwise the status is 0 for a clean end, else the first failing learner's (1 when
every worker failed first).
"""

import ctypes
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

STOP_GRACE_S = 30.0      # TERM to a learner, then KILL (as docker-compose's stop_grace_period)
GROUP_FAIL_GRACE_S = 10.0  # a rank still there this long after another of its group failed is stopped
GROUP_CLEAN_GRACE_S = 60.0  # ranks agree to stop together: the others of a clean one get this long
OTHER_GROUPS_GRACE_S = 5.0  # after a clean end, another policy's learners may end on the same step; then TERM
WORKERS_DONE_GRACE_S = 60.0  # every worker exited cleanly: a learner is finishing; then the learners are stopped
WORKER_GRACE_FAILED_S = 2.0  # after a failure no Stop reached the workers: this long, then TERM
WORKER_GRACE_CLEAN_S = 5.0   # after a clean end the workers got Stop: this long, then TERM
WORKER_KILL_S = 10.0         # TERM to a worker, then KILL


def log(message):
    """One line on stderr. Never fails: after a hang-up stderr may be a dead terminal."""
    try:
        sys.stderr.write("farm: %s\n" % message)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


class LaunchError(Exception):
    """A start that cannot go on; the message says why (scripts/farm's `die`)."""


# ----------------------------------------------------------------------------------------------------------------
# The plan


class Learner:
    def __init__(self, name, argv, env, endpoint_file, policy=None, rank=0, group="", announce=None):
        self.name = name                    # for humans: "the learner", "policy talk's rank 1", ...
        self.argv = argv
        self.env = env                      # added to the launcher's environment
        self.endpoint_file = endpoint_file
        self.policy = policy
        self.rank = rank
        self.group = group                  # the policy (or "" without policies): its ranks stop together
        self.announce = announce            # the endpoint workers are given (fixed ports), else the file's

    def __repr__(self):
        return "Learner(%r)" % self.name


class Plan:
    def __init__(self, learners, workers, policies, ranks, run_dir=None, mode="run", worker_logs=None):
        self.learners = learners
        self.workers = workers              # one argv per worker, index i at i
        self.policies = policies            # names, [] without policies
        self.ranks = ranks
        self.run_dir = run_dir
        # run: learners and workers here; learners: learners alone (farm learners); workers: workers alone for a
        # remote learner (farm worker); cluster: learners here, each "worker" a host's ssh session (farm cluster)
        self.mode = mode
        self.worker_logs = worker_logs or [None] * len(workers)  # a line logged as worker i starts ({learner})


def free_ports(n):
    """n distinct free TCP ports on the loopback (held together while chosen, so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def learner_name(policy, rank, ranks):
    if policy is None:
        return "the learner" if ranks == 1 else "learner rank %d" % rank
    return "the learner of policy %s" % policy if ranks == 1 else "policy %s's rank %d" % (policy, rank)


def parse_policies_plan(text):
    """farm-learner --policies-plan's output: (run_dir, [names]); (None, []) without policies."""
    run_dir, names = None, []
    for line in text.splitlines():
        kind, _, value = line.strip().partition(" ")
        if kind == "run_dir":
            run_dir = value
        elif kind == "policy":
            names.append(value)
    if (run_dir is None) != (not names):
        raise LaunchError("farm-learner --policies-plan gave no run directory or no policy")
    return run_dir, names


def remote_worker_argv(ssh, host, i, n, config, overrides, root, build_dir, skip_build):
    """Host i's workers over ssh: `scripts/farm worker --learner {learner:i}` from the checkout's root ROOT, worker
    indices from i * 1000. ssh joins its arguments into one line for the remote shell: each word is quoted for it,
    so that an override such as --set "env.options={size: 7}" arrives as one argument. -tt: closing the connection
    hangs up the remote side, which stops its workers."""
    words = ["scripts/farm", "worker", "--learner", "{learner:%d}" % i, config]
    words += (["--workers", str(n)] if n else []) + list(overrides)
    line = "cd %s && FARM_WORKER_INDEX_BASE=%d FARM_BUILD_DIR=%s" % (shlex.quote(root), i * 1000,
                                                                    shlex.quote(build_dir))
    line += " FARM_SKIP_BUILD=1" if skip_build else ""
    line += "".join(" " + shlex.quote(w) for w in words)
    return ssh.split() + ["-tt", host, line]


def read_hosts(hostfile):
    """HOSTFILE's lines 'HOST [WORKERS]' (# comments, blank lines skipped): [(host, workers or None)]."""
    hosts = []
    with open(hostfile) as f:
        for line in f:
            words = line.split()
            if words and not words[0].startswith("#"):
                hosts.append((words[0], words[1] if len(words) > 1 else None))
    if not hosts:
        raise LaunchError("no hosts in %s" % hostfile)
    return hosts


def plan(learner_bin, worker_bin, config, overrides, workers, ranks, tmp, resume=None, policies=None,
         run_dir=None, worker_args=(), stats_dir=None, ports=None, mode="run", port=None, announce_host=None,
         learner=None, index_base=0, hosts=None, remote=None, rank_base=0, world_size=None,
         master_addr="127.0.0.1"):
    """The processes of a run: learners (policies x ranks) and workers, each with its argv, env, endpoint.

    policies: the names (farm-learner --policies-plan), [] or None without; run_dir: the plan's run directory
    (with policies). ports: one rendezvous port per rank group (chosen here when None).
    The roles (mode, see Plan): port P puts group g's learner on tcp://0.0.0.0:P+g with transport.insecure=true
    (the overrides may say otherwise), announced to workers as tcp://ANNOUNCE_HOST:P+g; learner: every worker's
    --learner (no learners here), indices from index_base; hosts [(HOST, N)] with remote (ssh, root, build_dir,
    skip_build): one ssh session per host as worker i (remote_worker_argv). rank_base, world_size, master_addr:
    this machine's ranks are rank_base .. rank_base + K - 1 of world_size (one node of a Slurm job)."""
    policies = list(policies or [])
    overrides = list(overrides)
    groups = policies or [None]
    if ranks > 1 and ports is None:
        ports = free_ports(len(groups))
    learners = []
    for g, policy in enumerate(groups if mode != "workers" else []):
        if policy is None:
            base = ["--resume", resume] + overrides if resume else ["--config", config] + overrides
        elif resume:
            base = ["--resume", os.path.join(run_dir, policy)] + overrides
        else:
            base = ["--config", config] + overrides + ["--set", "run_dir=" + run_dir, "--policy", policy]
        announce = None
        if port is not None:
            insecure = ["--set", "transport.insecure=true"]
            base = base[:2] + insecure + base[2:] if policy is None else insecure + base
            base += ["--set", "transport.bind=tcp://0.0.0.0:%d" % (port + g)]
            if announce_host:
                announce = "tcp://%s:%d" % (announce_host, port + g)
        for r in range(ranks):
            suffix = "-".join(str(p) for p in (policy, r if ranks > 1 else None) if p is not None)
            endpoint = os.path.join(tmp, "endpoint" + ("-" + suffix if suffix else ""))
            env = {}
            if ranks > 1:
                env = {"RANK": str(rank_base + r), "WORLD_SIZE": str(world_size or ranks), "LOCAL_RANK": str(r),
                       "MASTER_ADDR": master_addr, "MASTER_PORT": str(ports[g])}
            learners.append(Learner(learner_name(policy, r, ranks), [learner_bin] + base + ["--endpoint-file", endpoint],
                                    env, endpoint, policy, r, policy or "", announce))
    worker_argvs, worker_logs = [], []
    if hosts is not None:
        for i, (host, n) in enumerate(hosts):
            worker_argvs.append(remote_worker_argv(remote["ssh"], host, i, n, config, overrides, remote["root"],
                                                   remote["build_dir"], remote["skip_build"]))
            worker_logs.append("workers on %s%s -> {learner}" % (host, " (%s)" % n if n else ""))
        workers = 0
    for i in range(workers if mode != "learners" else 0):
        argv = [worker_bin, "--config", config] + overrides + list(worker_args) + [
            "--learner", learner or "{learner:%d}" % i, "--index", str(index_base + i)]
        if stats_dir:
            argv += ["--stats-file", os.path.join(stats_dir, "worker-%d.json" % i)]
        worker_argvs.append(argv)
        worker_logs.append(None)
    return Plan(learners, worker_argvs, policies, ranks, run_dir, mode, worker_logs)


def worker_endpoints(the_plan, endpoints, i):
    """Worker i's --learner value: rank i % K's endpoint, for each policy (NAME=ENDPOINT,... with policies).
    endpoints: learner index in the plan -> endpoint."""
    k = the_plan.ranks
    if not the_plan.policies:
        return endpoints[i % k]
    parts = []
    for g, name in enumerate(the_plan.policies):
        parts.append("%s=%s" % (name, endpoints[g * k + i % k]))
    return ",".join(parts)


def worker_argv(the_plan, endpoints, i):
    if not the_plan.learners:  # workers alone: their --learner is given
        return list(the_plan.workers[i])
    value = worker_endpoints(the_plan, endpoints, i)
    return [a.replace("{learner:%d}" % i, value) for a in the_plan.workers[i]]


def may_have_policies(config, overrides):
    """Only a config that may have policies is asked (farm-learner's start takes about 2 s)."""
    try:
        with open(config, encoding="utf-8", errors="replace") as f:
            if re.search(r"(^|[{,\s])policies\s*:", f.read(), re.M):
                return True
    except OSError:
        pass
    return any(a.startswith("policies=") for a in overrides)


def policies_plan(learner_bin, config, overrides, resume):
    """(run_dir, names) from farm-learner --policies-plan; (None, []) without policies."""
    sets = list(overrides)
    if resume:  # the run directory as given (its config.yaml records where the run was, which it may have left)
        sets += ["--set", "run_dir=" + os.path.abspath(resume)]
    if not may_have_policies(config, sets):
        return None, []
    out = subprocess.run([learner_bin, "--config", config] + sets + ["--policies-plan"], stdout=subprocess.PIPE)
    if out.returncode != 0:
        raise LaunchError("the config's policies (above)")
    return parse_policies_plan(out.stdout.decode())


# ----------------------------------------------------------------------------------------------------------------
# Supervision


try:
    _LIBC = ctypes.CDLL(None, use_errno=True)
except OSError:
    _LIBC = None


def _pdeathsig(parent=os.getpid()):
    """In the child before exec: TERM when the launcher dies (kill -9, the OOM killer), as `setpriv --pdeathsig
    TERM` did, so that a learner writes its final checkpoint and exits instead of waiting for workers that died
    with the launcher."""
    if _LIBC is not None:
        _LIBC.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the launcher died before the call
        os.kill(os.getpid(), signal.SIGTERM)


class Interrupted(Exception):
    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


class Supervisor:
    """Starts a Plan's processes and stops them by one rule (see the module's doc)."""

    def __init__(self, the_plan, endpoint_timeout_s=120.0, poll_s=0.05):
        self.plan = the_plan
        self.endpoint_timeout_s = endpoint_timeout_s
        self.poll_s = poll_s
        self.learners = []      # Popen per plan learner
        self.workers = []       # Popen per worker
        self.status = {}        # Popen -> exit status, once reaped
        self.signum = None
        self.signals = 0

    # -- processes
    def _start(self, argv, env=None, pdeathsig=False):
        full_env = None
        if env:
            full_env = dict(os.environ)
            full_env.update(env)
        return subprocess.Popen(argv, env=full_env, preexec_fn=_pdeathsig if pdeathsig else None)

    def _poll(self, p):
        if p in self.status:
            return self.status[p]
        rc = p.poll()
        if rc is None:
            return None
        rc = 128 - rc if rc < 0 else rc  # killed by a signal: the shell's 128 + N
        self.status[p] = rc
        return rc

    def _running(self, procs):
        return [p for p in procs if self._poll(p) is None]

    def _on_signal(self, signum, _frame):
        self.signals += 1
        if self.signum is None:
            self.signum = signum
        if self.signals == 1:
            raise Interrupted(signum)
        if self.signals > 2:
            return
        # Again while stopping: give up on the final checkpoints; every child is ended at once.
        for p in self.learners + self.workers:
            if self._poll(p) is None:
                try:
                    p.send_signal(signal.SIGKILL)
                except OSError:
                    pass
        raise Interrupted(signum)

    def _sleep(self):
        time.sleep(self.poll_s)

    @staticmethod
    def _signal(p, sig):
        try:
            p.send_signal(sig)
        except OSError:
            pass

    # -- the run
    def run(self):
        """The run's exit status. Every child has exited when it returns (or raises LaunchError)."""
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            try:
                return self._run()
            except Interrupted:
                self.stop_all(term_learners=True)
                return self._signal_status()
            except LaunchError:
                self.stop_all(term_learners=True)
                raise
        except Interrupted:  # a second signal while stopping: everything was killed
            self.stop_all(term_learners=True, patient=False)
            return self._signal_status()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _signal_status(self):
        """The status after INT, TERM or HUP: 128 + N; for learners alone (a container's main process), the
        learners' own (the first non-zero, 0 when each stopped cleanly), as a single learner's would be."""
        if self.plan.mode == "learners":
            return next((self.status[p] for p in self.learners if self.status.get(p)), 0)
        return 128 + self.signum

    def _run(self):
        for learner in self.plan.learners:
            self.learners.append(self._start(learner.argv, learner.env, pdeathsig=True))
        endpoints = self._wait_endpoints()
        endpoints = [l.announce or e for l, e in zip(self.plan.learners, endpoints)]
        self._log_start(endpoints)
        for i in range(len(self.plan.workers)):
            argv = worker_argv(self.plan, endpoints, i)
            if self.plan.worker_logs[i]:
                log(self.plan.worker_logs[i].replace("{learner}", worker_endpoints(self.plan, endpoints, i)))
            self.workers.append(self._start(argv))
        if not self.learners:
            return self._workers_alone()
        return self._supervise()

    def _workers_alone(self):
        """Workers for a learner elsewhere: until every one has exited; the first failure's status, else 0."""
        rc = 0
        left = list(self.workers)
        while left:
            for w in list(left):
                st = self._poll(w)
                if st is not None:
                    left.remove(w)
                    if st != 0:
                        log("worker (pid %d) exited with status %d" % (w.pid, st))
                        rc = rc or st
            if left:
                self._sleep()
        return rc

    def _wait_endpoints(self):
        deadline = time.monotonic() + self.endpoint_timeout_s
        endpoints = [None] * len(self.learners)
        while True:
            for i, (learner, p) in enumerate(zip(self.plan.learners, self.learners)):
                if endpoints[i] is None:
                    try:
                        with open(learner.endpoint_file) as f:
                            text = f.read().strip()
                        if text:
                            endpoints[i] = text
                            continue
                    except OSError:
                        pass
                    rc = self._poll(p)
                    if rc is not None:
                        raise LaunchError("%s exited (status %d) before listening" % (learner.name, rc))
            if all(e is not None for e in endpoints):
                return endpoints
            if time.monotonic() > deadline:
                late = [l.name for l, e in zip(self.plan.learners, endpoints) if e is None]
                raise LaunchError("%s did not start listening within %g s" % (late[0], self.endpoint_timeout_s))
            self._sleep()

    def _log_start(self, endpoints):
        n, k, pl = len(self.plan.workers), self.plan.ranks, self.plan
        if pl.mode == "learners":
            port = pl.learners[0].announce.rsplit(":", 1)[1]
            log("learners on %s; workers connect with --learner tcp://HOST:%s" % (
                ",".join("%s=%s" % (name, e) for name, e in zip(pl.policies, endpoints)), port))
            return
        if pl.mode != "run":  # cluster: each host's line; workers alone: main's
            return
        if not pl.policies:
            if k == 1:
                log("learner on %s; starting %d workers" % (endpoints[0], n))
            else:
                log("learner ranks on %s; starting %d workers, worker i on rank i %% %d" % (" ".join(endpoints), n, k))
            return
        parts = []
        for g, name in enumerate(pl.policies):
            eps = endpoints[g * k:(g + 1) * k]
            parts.append("%s=%s" % (name, eps[0] if k == 1 else "[" + " ".join(eps) + "]"))
        log("learners on %s; starting %d workers%s" % (",".join(parts), n,
                                                          ", worker i on rank i %% %d" % k if k > 1 else ""))

    def _supervise(self):
        """Until the run ends; then the stop. Returns the run's status."""
        ended = None  # the learner (plan index) whose exit ended the run
        rc = 0
        workers_left = list(self.workers)
        while ended is None:
            for i, p in enumerate(self.learners):
                if self._poll(p) is not None:
                    ended = i
                    break
            if ended is not None:
                break
            for w in list(workers_left):
                st = self._poll(w)
                if st is None:
                    continue
                workers_left.remove(w)
                if st != 0:
                    log("worker (pid %d) exited with status %d" % (w.pid, st))
                if not workers_left:
                    if st != 0:
                        log("every worker has exited; stopping the learners")
                        self.stop_all(term_learners=True, quiet=True)
                        return 1
                    # The workers ended on a learner's Stop: that learner is finishing; its exit ends the run.
                    deadline = time.monotonic() + WORKERS_DONE_GRACE_S
                    while ended is None and time.monotonic() < deadline:
                        for i, p in enumerate(self.learners):
                            if self._poll(p) is not None:
                                ended = i
                                break
                        if ended is None:
                            self._sleep()
                    if ended is None:
                        log("every worker has exited and no learner within %g s; stopping the learners"
                            % WORKERS_DONE_GRACE_S)
                        self.stop_all(term_learners=True, quiet=True)
                        return 1
                    break
            if ended is None:
                self._sleep()
        return self._stop_after(ended)

    def _first_failure(self, first=None):
        """The status of the first learner seen failing (`first`, the one that ended the run, before the others seen
        at the same time), logging each failure once."""
        order = list(range(len(self.learners)))
        if first is not None:
            order.remove(first)
            order.insert(0, first)
        for i in order:
            p = self.learners[i]
            st = self._poll(p)
            if st is not None and st != 0 and i not in self._logged:
                self._logged.add(i)
                self._failures.append((i, st))
                log("%s exited with status %d" % (self.plan.learners[i].name, st))
        return self._failures[0][1] if self._failures else 0

    def _stop_after(self, ended):
        """The run ended with learner `ended`'s exit: the learners, then the workers. The run's status."""
        self._logged, self._failures = set(), []
        group = self.plan.learners[ended].group
        mates = [i for i, l in enumerate(self.plan.learners) if l.group == group]
        others = [i for i in range(len(self.learners)) if i not in mates]
        termed = {}  # learner index -> when it was sent TERM
        now = time.monotonic()
        # Another policy's learners stop by themselves only at their own end (often the same env step: every
        # policy counts the run's steps), else they get TERM and write a final checkpoint: at once after a
        # failure, after OTHER_GROUPS_GRACE_S after a clean end (a TERM while one ends cleanly could kill it in its
        # teardown, after its signal handler is gone).
        term_others_at = now + (OTHER_GROUPS_GRACE_S if self._poll(self.learners[ended]) == 0 else 0.0)
        clean_since = now
        failed_since = None
        said_waiting = False
        self._first_failure(ended)
        while True:
            self._first_failure()
            if failed_since is None and any(i in mates for i, _ in self._failures):
                failed_since = time.monotonic()
            running = [i for i in range(len(self.learners)) if self._poll(self.learners[i]) is None]
            if not running:
                break
            now = time.monotonic()
            if now >= term_others_at:
                for i in others:
                    if i in running and i not in termed:
                        self._signal(self.learners[i], signal.SIGTERM)
                        termed[i] = now
            late = [i for i in running if i in mates and i not in termed and
                    (failed_since is not None and now - failed_since >= GROUP_FAIL_GRACE_S or
                     failed_since is None and now - clean_since >= GROUP_CLEAN_GRACE_S)]
            if late:
                why = "after a rank failed" if failed_since is not None else "after another stopped"
                log("%s (pids %s) still running %g s %s; stopping them" % (
                    ", ".join(self.plan.learners[i].name for i in late),
                    " ".join(str(self.learners[i].pid) for i in late),
                    GROUP_FAIL_GRACE_S if failed_since is not None else GROUP_CLEAN_GRACE_S, why))
                for i in late:
                    self._signal(self.learners[i], signal.SIGCONT)  # a frozen (SIGSTOPped) one, too
                    self._signal(self.learners[i], signal.SIGTERM)
                    termed[i] = now
                if not self._failures:
                    self._failures.append((late[0], 1))
            for i in running:
                if i in termed and now - termed[i] >= STOP_GRACE_S:
                    self._signal(self.learners[i], signal.SIGKILL)
                elif i in termed and now - termed[i] >= 3.0 and not said_waiting:
                    said_waiting = True
                    log("waiting for the learners' final checkpoints (Ctrl-C again to give up on them)")
            self._sleep()
        rc = self._first_failure()
        self._stop_workers(rc)
        return rc

    def _stop_workers(self, rc, quiet=False):
        """The workers got Stop from their learner (or, after a failure, none): a grace, then TERM, then KILL."""
        grace = WORKER_GRACE_FAILED_S if rc != 0 else WORKER_GRACE_CLEAN_S
        deadline = time.monotonic() + grace
        while self._running(self.workers) and time.monotonic() < deadline:
            self._sleep()
        alive = self._running(self.workers)
        if alive and not quiet:
            log("stopping %d workers" % len(alive))
        self._end_workers(WORKER_KILL_S)

    def _end_workers(self, kill_after_s):
        """TERM to every worker still running, KILL to those left after kill_after_s; every worker reaped."""
        for w in self._running(self.workers):
            self._signal(w, signal.SIGTERM)
        deadline = time.monotonic() + kill_after_s
        while self._running(self.workers) and time.monotonic() < deadline:
            self._sleep()
        for w in self._running(self.workers):
            self._signal(w, signal.SIGKILL)
        for w in self.workers:
            w.wait()
            self._poll(w)

    def stop_all(self, term_learners=True, quiet=False, patient=True):
        """Every learner still running gets TERM and is waited for (KILL after STOP_GRACE_S), then the workers
        get TERM. For a signal to the launcher, a start that failed, or every worker gone."""
        running = [p for p in self.learners if self._poll(p) is None]
        if term_learners:
            for p in running:
                self._signal(p, signal.SIGTERM)
        deadline = time.monotonic() + (STOP_GRACE_S if patient else 0)
        said = False
        start = time.monotonic()
        while self._running(self.learners):
            if time.monotonic() >= deadline:
                for p in self._running(self.learners):
                    self._signal(p, signal.SIGKILL)
                break
            if not said and time.monotonic() - start >= 3.0:
                said = True
                log("waiting for the learners' final checkpoints (Ctrl-C again to give up on them)")
            self._sleep()
        for p in self.learners:
            p.wait()
            self._poll(p)
        self._end_workers(WORKER_KILL_S if patient else 0)


# ----------------------------------------------------------------------------------------------------------------
# Command line


def parse_args(argv):
    opts = {"resume": None, "workers": 1, "learners": 1, "worker_args": [], "overrides": [], "mode": "run",
            "port": None, "announce_host": None, "learner": None, "index_base": "0", "hostfile": None,
            "ssh": "ssh", "root": None, "build_dir": None, "skip_build": "", "run_dir": None, "policies": None,
            "master_port": None}
    names = {"--learner-bin": "learner_bin", "--worker-bin": "worker_bin", "--config": "config",
             "--resume": "resume", "--workers": "workers", "--learners": "learners", "--mode": "mode",
             "--port": "port", "--announce-host": "announce_host", "--learner": "learner",
             "--index-base": "index_base", "--hostfile": "hostfile", "--ssh": "ssh", "--root": "root",
             "--build-dir": "build_dir", "--skip-build": "skip_build", "--run-dir": "run_dir",
             "--policies": "policies", "--master-port": "master_port"}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            opts["overrides"] = argv[i + 1:]
            break
        if i + 1 >= len(argv):
            raise LaunchError("farm_launch.py: %s needs a value" % a)
        if a == "--worker-arg":
            opts["worker_args"].append(argv[i + 1])
        elif a in names:
            opts[names[a]] = argv[i + 1]
            opts["given_" + names[a]] = True
        else:
            raise LaunchError("farm_launch.py: unknown argument '%s'" % a)
        i += 2
    mode = opts["mode"]
    if mode not in ("run", "learners", "workers", "cluster", "slurm"):
        raise LaunchError("farm_launch.py: --mode: run, learners, workers, cluster or slurm, not '%s'" % mode)
    need = {"run": ("learner_bin", "worker_bin"), "learners": ("learner_bin", "port"), "cluster":
            ("learner_bin", "port", "announce_host", "hostfile", "root", "build_dir"),
            "workers": ("worker_bin", "learner"), "slurm": ("learner_bin", "worker_bin", "port", "announce_host")}[mode]
    for key in need + ("config",):
        if opts.get(key) is None:
            raise LaunchError("farm_launch.py: --%s is required" % key.replace("_", "-"))
    for key in ("workers", "learners", "index_base") + (("port",) if opts["port"] is not None else ()) + (
            ("master_port",) if opts["master_port"] is not None else ()):
        opts[key] = int(opts[key])
    return opts


def slurm_main(opts):
    """One task per node of an srun step (scripts/slurm/farm.sbatch): SLURM_NODEID, SLURM_STEP_NUM_NODES say which.
    Without ranks (no --learners): node 0 runs the learners, group g's on tcp://0.0.0.0:P+g announced as
    tcp://HEAD:P+g, and its workers; the other nodes workers alone for tcp://HEAD:P (a single endpoint reaches the
    i-th policy's learner on its port + i). With --learners L: every node runs L ranks of each group (global ranks
    node x L + r of nodes x L, rendezvous at HEAD:MASTER_PORT + g) and its workers, worker i on local rank i % L.
    Worker indices: node x N + i. --policies and --run-dir: the batch script's --policies-plan, asked once."""
    node = int(os.environ.get("SLURM_NODEID", "0"))
    nodes = int(os.environ.get("SLURM_STEP_NUM_NODES") or os.environ.get("SLURM_NNODES") or "1")
    for var in ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID"):  # farm-learner would read ranks there
        os.environ.pop(var, None)
    policies = [p for p in (opts["policies"] or "").split(",") if p]
    ranked = opts.get("given_learners", False)
    k, n, head, port = opts["learners"], opts["workers"], opts["announce_host"], opts["port"]
    common = dict(learner_bin=opts["learner_bin"], worker_bin=opts["worker_bin"], config=opts["config"],
                  overrides=opts["overrides"], workers=n, resume=None, policies=policies, run_dir=opts["run_dir"],
                  worker_args=opts["worker_args"], index_base=node * n)
    tmp = tempfile.mkdtemp(prefix="farm.")
    try:
        if ranked:
            mp = opts["master_port"] or port + 1000
            the_plan = plan(ranks=k, tmp=tmp, ports=[mp + g for g in range(max(1, len(policies)))],
                            rank_base=node * k, world_size=nodes * k, master_addr=head, **common)
        elif node == 0:
            the_plan = plan(ranks=1, tmp=tmp, port=port, announce_host=head, **common)
        else:
            the_plan = plan(ranks=1, tmp=tmp, mode="workers", learner="tcp://%s:%d" % (head, port), **common)
            log("node %d: starting %d workers for tcp://%s:%d" % (node, n, head, port))
        sup = Supervisor(the_plan, endpoint_timeout_s=120.0)
        return sup.run()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv):
    tmp = None
    try:
        opts = parse_args(argv)
        if opts["mode"] == "slurm":
            return slurm_main(opts)
        mode, port = opts["mode"], opts["port"]
        run_dir, policies = None, []
        if mode != "workers":
            run_dir, policies = policies_plan(opts["learner_bin"], opts["config"], opts["overrides"],
                                              opts["resume"])
        k = opts["learners"]
        if policies:
            if port is not None and port + len(policies) - 1 > 65535:
                raise LaunchError("--port %d: %d policies need ports %d to %d, past 65535" % (
                    port, len(policies), port, port + len(policies) - 1))
            log("run directory %s; %d policies: %s (%s%s)" % (run_dir, len(policies), " ".join(policies),
                "one learner each" if k == 1 else "%d learner ranks each" % k,
                ", ports %d to %d" % (port, port + len(policies) - 1) if port is not None else ""))
        hosts = read_hosts(opts["hostfile"]) if mode == "cluster" else None
        tmp = tempfile.mkdtemp(prefix="farm.")
        the_plan = plan(opts["learner_bin"] if mode != "workers" else None, opts.get("worker_bin"), opts["config"],
                        opts["overrides"], opts["workers"], k, tmp, resume=opts["resume"], policies=policies,
                        run_dir=run_dir, worker_args=opts["worker_args"],
                        stats_dir=(os.environ.get("FARM_WORKER_STATS_DIR") or None) if mode == "run" else None,
                        mode=mode, port=port, learner=opts["learner"], index_base=opts["index_base"],
                        announce_host="0.0.0.0" if mode == "learners" else opts["announce_host"], hosts=hosts,
                        remote={"ssh": opts["ssh"], "root": opts["root"], "build_dir": opts["build_dir"],
                                "skip_build": bool(opts["skip_build"])})
        if mode == "learners" and not policies:
            # One learner: this process becomes it (its signals, its status), without an endpoint file.
            shutil.rmtree(tmp, ignore_errors=True)
            argv = the_plan.learners[0].argv[:-2]
            os.execv(argv[0], argv)
        if mode == "cluster" and not policies:
            # Plain TCP on every interface (the hosts' network must be trusted) unless the overrides turn on CURVE.
            log("learner on tcp://0.0.0.0:%d (transport.insecure=true unless overridden; see docs/OPERATIONS.md)"
                % port)
        if mode == "workers":
            log("starting %d workers for %s" % (opts["workers"], opts["learner"]))
        if k > 1:
            ports = sorted({l.env["MASTER_PORT"] for l in the_plan.learners})
            log("%d learner ranks%s (rendezvous at 127.0.0.1:%s)" % (
                k, " per policy" if policies else "", ", ".join(ports)))
        sup = Supervisor(the_plan, endpoint_timeout_s=60.0 if len(the_plan.learners) == 1 else 120.0)
        return sup.run()
    except LaunchError as e:
        log("error: %s" % e)
        return 1
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
