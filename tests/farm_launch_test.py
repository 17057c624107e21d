#!/usr/bin/env python3
"""scripts/lib/farm_launch.py: the plan (which processes, their argv, env, endpoints, worker i's learners) for one
learner, K ranks, P policies, P policies x K ranks and --resume; and the stop rule, with fake learner and worker
programs (small Python scripts that write their endpoint, sleep, exit with a given status or record a TERM): a
failing learner stops the rest and the status names it; workers that all exit 0 wait for the learners; a worker's
crash alone does not end the run; INT stops the learners before the workers; no process is left.

Usage: farm_launch_test.py [SOURCE_DIR] (default: this checkout). Standard library only.
"""

import json
import os
import shlex
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

ROOT = os.path.abspath(sys.argv.pop(1)) if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else \
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts", "lib"))
import farm_launch as fl  # noqa: E402

LAUNCHER = os.path.join(ROOT, "scripts", "lib", "farm_launch.py")

# A fake farm-learner. Its key: POLICY/RANK (policy "-" without policies, rank 0 without RANK). FAKE_SPEC (JSON)
# maps a key to {"exit_after": S, "status": N, "listen": false, "term_delay": S}; FAKE_EVENTS gets a line per
# event: "learner KEY start PID", "learner KEY term", "learner KEY exit N".
FAKE_LEARNER = r'''#!/usr/bin/env python3
import json, os, signal, sys, time
argv = sys.argv[1:]
def opt(name):
    return argv[argv.index(name) + 1] if name in argv else None
if "--policies-plan" in argv:
    print("run_dir " + os.environ["FAKE_RUN_DIR"])
    for p in os.environ["FAKE_POLICIES"].split(","):
        print("policy " + p)
    sys.exit(0)
policy = opt("--policy") or (os.path.basename(opt("--resume")) if opt("--resume") and os.environ.get("FAKE_POLICIES") else "-")
key = "%s/%s" % (policy, os.environ.get("RANK", "0"))
spec = json.loads(os.environ.get("FAKE_SPEC", "{}")).get(key, {})
def event(text):
    with open(os.environ["FAKE_EVENTS"], "a") as f:
        f.write("learner %s %s\n" % (key, text))
event("start %d" % os.getpid())
def on_term(sig, frame):
    event("term")
    time.sleep(spec.get("term_delay", 0.3))  # the final checkpoint
    event("exit 0")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C reaches the launcher's group; the launcher decides
if spec.get("listen", True):
    path = opt("--endpoint-file")
    with open(path + ".tmp", "w") as f:
        f.write("tcp://127.0.0.1:%d\n" % (20000 + os.getpid() % 20000))
    os.rename(path + ".tmp", path)
deadline = time.time() + spec.get("exit_after", 3600)
while time.time() < deadline:
    time.sleep(0.02)
event("exit %d" % spec.get("status", 0))
sys.exit(spec.get("status", 0))
'''

# A fake farm-worker: FAKE_WORKER_SPEC maps its --index to {"exit_after": S, "status": N}; events "worker I start
# PID LEARNER", "worker I term".
FAKE_WORKER = r'''#!/usr/bin/env python3
import json, os, signal, sys, time
argv = sys.argv[1:]
index = argv[argv.index("--index") + 1]
spec = json.loads(os.environ.get("FAKE_WORKER_SPEC", "{}")).get(index, {})
def event(text):
    with open(os.environ["FAKE_EVENTS"], "a") as f:
        f.write("worker %s %s\n" % (index, text))
event("start %d %s" % (os.getpid(), argv[argv.index("--learner") + 1]))
def on_term(sig, frame):
    event("term")
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
signal.signal(signal.SIGINT, signal.SIG_IGN)
deadline = time.time() + spec.get("exit_after", 3600)
while time.time() < deadline:
    time.sleep(0.02)
event("exit %d" % spec.get("status", 0))
sys.exit(spec.get("status", 0))
'''


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def overrides(*kv):
    out = []
    for x in kv:
        out += ["--set", x]
    return out


class PlanTest(unittest.TestCase):
    OV = overrides("total_env_steps=10")

    def make(self, **kw):
        args = dict(learner_bin="L", worker_bin="W", config="c.yaml", overrides=self.OV, workers=3, ranks=1,
                    tmp="/t")
        args.update(kw)
        return fl.plan(**args)

    def test_one_learner(self):
        p = self.make()
        self.assertEqual(len(p.learners), 1)
        l = p.learners[0]
        self.assertEqual(l.name, "the learner")
        self.assertEqual(l.argv, ["L", "--config", "c.yaml"] + self.OV + ["--endpoint-file", "/t/endpoint"])
        self.assertEqual(l.env, {})
        self.assertEqual(len(p.workers), 3)
        self.assertEqual(fl.worker_argv(p, ["tcp://x:1"], 2),
                         ["W", "--config", "c.yaml"] + self.OV + ["--learner", "tcp://x:1", "--index", "2"])

    def test_ranks(self):
        p = self.make(ranks=2, ports=[4242])
        self.assertEqual([l.name for l in p.learners], ["learner rank 0", "learner rank 1"])
        for r, l in enumerate(p.learners):
            self.assertEqual(l.env, {"RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r),
                                     "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "4242"})
            self.assertEqual(l.endpoint_file, "/t/endpoint-%d" % r)
            self.assertEqual(l.argv[-2:], ["--endpoint-file", "/t/endpoint-%d" % r])
        eps = ["tcp://a:1", "tcp://b:2"]
        self.assertEqual([fl.worker_endpoints(p, eps, i) for i in range(3)], ["tcp://a:1", "tcp://b:2", "tcp://a:1"])

    def test_ranks_choose_a_free_port(self):
        p = self.make(ranks=3)
        ports = {l.env["MASTER_PORT"] for l in p.learners}
        self.assertEqual(len(ports), 1)
        self.assertGreater(int(ports.pop()), 0)

    def test_policies(self):
        p = self.make(policies=["talk", "hear"], run_dir="/runs/r")
        self.assertEqual([l.name for l in p.learners], ["the learner of policy talk", "the learner of policy hear"])
        self.assertEqual(p.learners[0].argv, ["L", "--config", "c.yaml"] + self.OV +
                         ["--set", "run_dir=/runs/r", "--policy", "talk", "--endpoint-file", "/t/endpoint-talk"])
        self.assertEqual(p.learners[1].env, {})
        self.assertEqual(fl.worker_endpoints(p, ["tcp://a:1", "tcp://b:2"], 1), "talk=tcp://a:1,hear=tcp://b:2")

    def test_policies_by_ranks(self):
        p = self.make(policies=["talk", "hear"], run_dir="/runs/r", ranks=2, ports=[5000, 6000])
        self.assertEqual([l.name for l in p.learners], ["policy talk's rank 0", "policy talk's rank 1",
                                                        "policy hear's rank 0", "policy hear's rank 1"])
        self.assertEqual([l.env["MASTER_PORT"] for l in p.learners], ["5000", "5000", "6000", "6000"])
        self.assertEqual([l.env["RANK"] for l in p.learners], ["0", "1", "0", "1"])
        self.assertEqual({l.env["WORLD_SIZE"] for l in p.learners}, {"2"})
        self.assertEqual([l.endpoint_file for l in p.learners],
                         ["/t/endpoint-talk-0", "/t/endpoint-talk-1", "/t/endpoint-hear-0", "/t/endpoint-hear-1"])
        self.assertEqual({l.group for l in p.learners[:2]}, {"talk"})
        for l in p.learners:
            self.assertIn("--policy", l.argv)
            self.assertIn("run_dir=/runs/r", l.argv)
        eps = ["t0", "t1", "h0", "h1"]
        self.assertEqual([fl.worker_endpoints(p, eps, i) for i in range(3)],
                         ["talk=t0,hear=h0", "talk=t1,hear=h1", "talk=t0,hear=h0"])
        # Each group's own rendezvous port when chosen here.
        q = self.make(policies=["a", "b", "c"], run_dir="/r", ranks=2)
        self.assertEqual(len({l.env["MASTER_PORT"] for l in q.learners}), 3)

    def test_resume(self):
        p = self.make(resume="/runs/r", config="/runs/r/config.yaml")
        self.assertEqual(p.learners[0].argv, ["L", "--resume", "/runs/r"] + self.OV +
                         ["--endpoint-file", "/t/endpoint"])
        self.assertEqual(p.workers[0][:3], ["W", "--config", "/runs/r/config.yaml"])
        q = self.make(resume="/runs/r", config="/runs/r/config.yaml", policies=["a", "b"], run_dir="/runs/r", ranks=2,
                      ports=[1, 2])
        self.assertEqual(q.learners[3].argv, ["L", "--resume", "/runs/r/b"] + self.OV +
                         ["--endpoint-file", "/t/endpoint-b-1"])

    def test_worker_extras(self):
        p = self.make(worker_args=["--set", "env.python_interpreter=/py", "--python-checked"], stats_dir="/s")
        argv = fl.worker_argv(p, ["e"], 1)
        self.assertEqual(argv[argv.index("--python-checked") - 1], "env.python_interpreter=/py")
        self.assertLess(argv.index("--python-checked"), argv.index("--learner"))
        self.assertEqual(argv[-2:], ["--stats-file", "/s/worker-1.json"])

    def test_learners_alone_on_fixed_ports(self):  # scripts/farm learners
        p = self.make(mode="learners", port=5555, announce_host="0.0.0.0", policies=["a", "b"], run_dir="/r")
        self.assertEqual(p.workers, [])
        self.assertEqual([l.argv for l in p.learners], [
            ["L", "--set", "transport.insecure=true", "--config", "c.yaml"] + self.OV +
            ["--set", "run_dir=/r", "--policy", n, "--set", "transport.bind=tcp://0.0.0.0:%d" % port,
             "--endpoint-file", "/t/endpoint-" + n] for n, port in (("a", 5555), ("b", 5556))])
        self.assertEqual([l.announce for l in p.learners], ["tcp://0.0.0.0:5555", "tcp://0.0.0.0:5556"])
        one = self.make(mode="learners", port=7000).learners[0]
        self.assertEqual(one.argv, ["L", "--config", "c.yaml", "--set", "transport.insecure=true"] + self.OV +
                         ["--set", "transport.bind=tcp://0.0.0.0:7000", "--endpoint-file", "/t/endpoint"])

    def test_workers_alone(self):  # scripts/farm worker
        p = self.make(mode="workers", learner="tcp://h:1", index_base=1000, workers=2, worker_args=["--set", "py"])
        self.assertEqual(p.learners, [])
        self.assertEqual(fl.worker_argv(p, [], 1), ["W", "--config", "c.yaml"] + self.OV +
                         ["--set", "py", "--learner", "tcp://h:1", "--index", "1001"])

    def test_cluster_hosts_over_ssh(self):  # scripts/farm cluster
        ov = overrides("env.options={ }", "name=x 'q' $HOME;y")
        p = self.make(mode="cluster", overrides=ov, port=5555, announce_host="10.0.0.1", policies=["a", "b"],
                      run_dir="/r", hosts=[("alpha", "1"), ("beta", None)],
                      remote={"ssh": "ssh -p 22", "root": "/src dir", "build_dir": "/b", "skip_build": True})
        self.assertEqual(len(p.workers), 2)
        eps = [l.announce for l in p.learners]
        self.assertEqual(eps, ["tcp://10.0.0.1:5555", "tcp://10.0.0.1:5556"])
        argv = fl.worker_argv(p, eps, 1)
        self.assertEqual(argv[:5], ["ssh", "-p", "22", "-tt", "beta"])
        self.assertTrue(argv[5].startswith("cd '/src dir' && FARM_WORKER_INDEX_BASE=1000 FARM_BUILD_DIR=/b "
                                           "FARM_SKIP_BUILD=1 scripts/farm worker --learner "), argv[5])
        remote = shlex.split(argv[5].split(" && ", 1)[1])[3:]  # the remote shell's words, past FARM_*=...
        self.assertEqual(remote, ["scripts/farm", "worker", "--learner",
                                       "a=tcp://10.0.0.1:5555,b=tcp://10.0.0.1:5556", "c.yaml"] + ov)
        self.assertIn("--workers", fl.worker_argv(p, eps, 0)[5])
        self.assertEqual(p.worker_logs, ["workers on alpha (1) -> {learner}", "workers on beta -> {learner}"])

    def test_ranks_of_one_slurm_node(self):  # scripts/slurm/farm.sbatch: node 1 of 2, 2 ranks per policy each
        p = self.make(ranks=2, ports=[7000, 7001], rank_base=2, world_size=4, master_addr="head",
                      policies=["a", "b"], run_dir="/r", workers=2, index_base=2)
        self.assertEqual([(l.env["RANK"], l.env["LOCAL_RANK"], l.env["WORLD_SIZE"], l.env["MASTER_ADDR"],
                           l.env["MASTER_PORT"]) for l in p.learners],
                         [("2", "0", "4", "head", "7000"), ("3", "1", "4", "head", "7000"),
                          ("2", "0", "4", "head", "7001"), ("3", "1", "4", "head", "7001")])
        self.assertEqual(fl.worker_argv(p, ["e0", "e1", "e2", "e3"], 1)[-4:], ["--learner", "a=e1,b=e3", "--index", "3"])

    def test_policies_plan_output(self):
        self.assertEqual(fl.parse_policies_plan("run_dir /r\npolicy a\npolicy b\n"), ("/r", ["a", "b"]))
        self.assertEqual(fl.parse_policies_plan(""), (None, []))
        with self.assertRaises(fl.LaunchError):
            fl.parse_policies_plan("run_dir /r\n")


class SupervisionTest(unittest.TestCase):
    """The stop rule, with fake programs, the launcher run as scripts/farm runs it (its own process)."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="farm_launch_test.")
        for name, text in (("learner", FAKE_LEARNER), ("worker", FAKE_WORKER)):
            path = os.path.join(cls.dir, name)
            with open(path, "w") as f:
                f.write(text)
            os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
        cls.config = os.path.join(cls.dir, "config.yaml")
        with open(cls.config, "w") as f:
            f.write("name: fake\n")
        cls.policy_config = os.path.join(cls.dir, "policies.yaml")
        with open(cls.policy_config, "w") as f:
            f.write("name: fake\npolicies:\n  - {name: a}\n  - {name: b}\n")

    def setUp(self):
        self.events = os.path.join(self.dir, "events-%s" % self._testMethodName)
        open(self.events, "w").close()

    def launch(self, learner_spec=None, worker_spec=None, workers=2, ranks=1, policies=None, grace=None, extra=()):
        env = dict(os.environ, FAKE_EVENTS=self.events, FAKE_SPEC=json.dumps(learner_spec or {}),
                   FAKE_WORKER_SPEC=json.dumps(worker_spec or {}), TMPDIR=self.dir)
        config = self.config
        if policies:
            env.update(FAKE_POLICIES=",".join(policies), FAKE_RUN_DIR=os.path.join(self.dir, "run"))
            config = self.policy_config
        code = "import sys; sys.path.insert(0, %r); import farm_launch as fl; " % os.path.join(ROOT, "scripts", "lib")
        for k, v in (grace or {}).items():
            code += "fl.%s = %r; " % (k, v)
        code += "sys.exit(fl.main(sys.argv[1:]))"
        argv = [sys.executable, "-c", code, "--learner-bin", os.path.join(self.dir, "learner"),
                "--worker-bin", os.path.join(self.dir, "worker"), "--config", config, "--workers", str(workers),
                "--learners", str(ranks)] + list(extra) + ["--", "--set", "total_env_steps=10"]
        return subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)

    def finish(self, proc, timeout=60):
        _, err = proc.communicate(timeout=timeout)
        return proc.returncode, err

    def read_events(self):
        with open(self.events) as f:
            return [line.split() for line in f if line.strip()]

    def wait_for(self, pred, timeout=20):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if pred(self.read_events()):
                return True
            time.sleep(0.05)
        return False

    def assert_nothing_left(self):
        pids = [int(e[3]) for e in self.read_events() if e[2] == "start"]
        self.assertTrue(pids)
        deadline = time.time() + 5  # an orphan (after the launcher's kill -9) is reaped by init a moment later
        for pid in pids:
            while time.time() < deadline and alive(pid):
                time.sleep(0.05)
            with self.assertRaises(ProcessLookupError, msg="pid %d is still running" % pid):
                os.kill(pid, 0)

    def test_failing_rank_stops_the_rest_and_is_named(self):
        p = self.launch({"-/1": {"exit_after": 1.0, "status": 137}}, ranks=2,
                        grace={"GROUP_FAIL_GRACE_S": 1.0, "WORKER_GRACE_FAILED_S": 0.5})
        rc, err = self.finish(p)
        self.assertEqual(rc, 137, err)
        self.assertIn("farm: learner rank 1 exited with status 137", err)
        self.assertIn("still running 1 s after a rank failed; stopping them", err)
        self.assertIn("stopping 2 workers", err)
        ev = self.read_events()
        self.assertIn(["learner", "-/0", "term"], ev)  # rank 0 (which did not stop by itself) got TERM
        self.assertIn(["worker", "0", "term"], ev)
        self.assert_nothing_left()

    def test_failing_policy_learner_stops_the_other_policies(self):
        p = self.launch({"b/0": {"exit_after": 1.0, "status": 3}}, policies=["a", "b"],
                        grace={"WORKER_GRACE_FAILED_S": 0.5})
        rc, err = self.finish(p)
        self.assertEqual(rc, 3, err)
        self.assertIn("farm: the learner of policy b exited with status 3", err)
        ev = self.read_events()
        self.assertIn(["learner", "a/0", "term"], ev)
        self.assertNotIn(["learner", "b/0", "term"], ev)
        workers = {e[1]: e[4] for e in ev if e[0] == "worker" and e[2] == "start"}
        self.assertEqual(set(workers), {"0", "1"})
        self.assertTrue(workers["0"].startswith("a=tcp://") and ",b=tcp://" in workers["0"], workers)
        self.assert_nothing_left()

    def test_policies_by_ranks(self):
        p = self.launch({"a/1": {"exit_after": 1.0, "status": 0}, "a/0": {"exit_after": 1.0, "status": 0}},
                        policies=["a", "b"], ranks=2, workers=3, grace={"OTHER_GROUPS_GRACE_S": 0.5})
        rc, err = self.finish(p)
        self.assertEqual(rc, 0, err)
        ev = self.read_events()
        starts = {e[1] for e in ev if e[0] == "learner" and e[2] == "start"}
        self.assertEqual(starts, {"a/0", "a/1", "b/0", "b/1"})
        # Policy a's group ended cleanly by itself; policy b's ranks were stopped with TERM (a final checkpoint each).
        self.assertIn(["learner", "b/0", "term"], ev)
        self.assertIn(["learner", "b/1", "term"], ev)
        self.assertNotIn(["learner", "a/0", "term"], ev)
        workers = {e[1]: e[4] for e in ev if e[0] == "worker" and e[2] == "start"}
        eps = [w.split(",") for w in (workers["0"], workers["1"], workers["2"])]
        self.assertEqual(eps[0], eps[2])       # worker 2 on rank 0 of each policy
        self.assertNotEqual(eps[0][0], eps[1][0])  # worker 1 on rank 1
        self.assertIn("2 learner ranks per policy", err)
        self.assert_nothing_left()

    def test_workers_exiting_cleanly_wait_for_the_learner(self):
        p = self.launch({"-/0": {"exit_after": 2.0, "status": 0}},
                        {"0": {"exit_after": 0.5}, "1": {"exit_after": 0.5}})
        rc, err = self.finish(p)
        self.assertEqual(rc, 0, err)
        ev = self.read_events()
        self.assertIn(["learner", "-/0", "exit", "0"], ev)
        self.assertNotIn(["learner", "-/0", "term"], ev)
        self.assert_nothing_left()

    def test_every_worker_failing_ends_the_run(self):
        p = self.launch({}, {"0": {"exit_after": 0.3, "status": 2}, "1": {"exit_after": 0.5, "status": 2}})
        rc, err = self.finish(p)
        self.assertEqual(rc, 1, err)
        self.assertIn("every worker has exited; stopping the learners", err)
        self.assertIn(["learner", "-/0", "term"], self.read_events())
        self.assert_nothing_left()

    def test_a_worker_crash_alone_does_not_end_the_run(self):
        p = self.launch({"-/0": {"exit_after": 2.0, "status": 0}}, {"0": {"exit_after": 0.3, "status": 9}},
                        grace={"WORKER_GRACE_CLEAN_S": 0.5})
        rc, err = self.finish(p)
        self.assertEqual(rc, 0, err)
        self.assertIn("worker (pid", err)
        ev = self.read_events()
        self.assertIn(["learner", "-/0", "exit", "0"], ev)
        self.assertNotIn(["learner", "-/0", "term"], ev)
        self.assertIn(["worker", "1", "term"], ev)  # no real Stop from a fake learner: TERM after the grace
        self.assert_nothing_left()

    def test_learner_exiting_before_listening(self):
        p = self.launch({"-/1": {"listen": False, "exit_after": 0.3, "status": 2}}, ranks=2)
        rc, err = self.finish(p)
        self.assertEqual(rc, 1, err)
        self.assertIn("farm: error: learner rank 1 exited (status 2) before listening", err)
        ev = self.read_events()
        self.assertIn(["learner", "-/0", "term"], ev)
        self.assertFalse([e for e in ev if e[0] == "worker"])
        self.assert_nothing_left()

    def interrupt(self, sig, expected):
        p = self.launch({}, ranks=2, workers=2)
        self.assertTrue(self.wait_for(lambda ev: sum(e[0] == "worker" and e[2] == "start" for e in ev) == 2))
        p.send_signal(sig)
        rc, err = self.finish(p)
        self.assertEqual(rc, expected, err)
        ev = self.read_events()
        order = [(e[0], e[2]) for e in ev if e[2] in ("term", "exit")]
        learner_exits = [i for i, o in enumerate(order) if o[0] == "learner" and o[1] == "exit"]
        worker_terms = [i for i, o in enumerate(order) if o[0] == "worker" and o[1] == "term"]
        self.assertEqual(len(learner_exits), 2, ev)
        self.assertEqual(len(worker_terms), 2, ev)
        self.assertLess(max(learner_exits), min(worker_terms), order)  # learners checkpointed before workers stopped
        self.assert_nothing_left()
        self.assertEqual([f for f in os.listdir(self.dir) if f.startswith("farm.")], [])  # temporary files removed

    def test_int_stops_learners_before_workers(self):
        self.interrupt(signal.SIGINT, 130)

    def test_hup(self):
        self.interrupt(signal.SIGHUP, 129)

    def test_second_int_gives_up_on_the_checkpoints(self):
        p = self.launch({"-/0": {"term_delay": 60}}, workers=1)
        self.assertTrue(self.wait_for(lambda ev: any(e[0] == "worker" and e[2] == "start" for e in ev)))
        p.send_signal(signal.SIGINT)
        self.assertTrue(self.wait_for(lambda ev: ["learner", "-/0", "term"] in ev))
        start = time.time()
        p.send_signal(signal.SIGINT)
        rc, err = self.finish(p, timeout=20)
        self.assertEqual(rc, 130, err)
        self.assertLess(time.time() - start, 10)
        self.assert_nothing_left()

    def test_learners_alone_term_exits_with_their_status(self):  # scripts/farm learners in a container
        p = self.launch({}, policies=["a", "b"], extra=["--mode", "learners", "--port", "5555"])
        self.assertTrue(self.wait_for(lambda ev: sum(e[2] == "start" for e in ev) == 2))
        time.sleep(0.5)
        p.send_signal(signal.SIGTERM)
        rc, err = self.finish(p)
        self.assertEqual(rc, 0, err)
        self.assertIn("farm: learners on a=tcp://0.0.0.0:5555,b=tcp://0.0.0.0:5556; workers connect with "
                      "--learner tcp://HOST:5555", err)
        self.assertIn("(one learner each, ports 5555 to 5556)", err)
        self.assertFalse([e for e in self.read_events() if e[0] == "worker"])
        self.assert_nothing_left()

    def test_workers_alone_end_when_every_worker_has(self):  # scripts/farm worker
        p = self.launch(worker_spec={"7": {"exit_after": 0.3, "status": 3}, "8": {"exit_after": 0.6}},
                        extra=["--mode", "workers", "--learner", "tcp://h:1", "--index-base", "7"])
        rc, err = self.finish(p)
        self.assertEqual(rc, 3, err)
        self.assertIn("farm: starting 2 workers for tcp://h:1", err)
        ev = self.read_events()
        self.assertEqual(sorted(e[1] for e in ev if e[2] == "start"), ["7", "8"])
        self.assertFalse([e for e in ev if e[0] == "learner"])
        self.assertTrue(all(e[4] == "tcp://h:1" for e in ev if e[2] == "start"))

    def test_launcher_killed_learners_get_term(self):
        p = self.launch({}, ranks=1, workers=1)
        self.assertTrue(self.wait_for(lambda ev: any(e[0] == "worker" and e[2] == "start" for e in ev)))
        p.kill()
        p.wait()
        self.assertTrue(self.wait_for(lambda ev: ["learner", "-/0", "exit", "0"] in ev, timeout=10))
        # The fake worker has no PR_SET_PDEATHSIG of its own (farm-worker has): stop it here.
        for e in self.read_events():
            if e[0] == "worker" and e[2] == "start":
                try:
                    os.kill(int(e[3]), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        p.stderr.close()
        self.assert_nothing_left()


if __name__ == "__main__":
    unittest.main(verbosity=2)
