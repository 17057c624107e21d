"""farm-worker-py (python -m farm_worker): the Python worker's command line.

    farm-worker-py --learner tcp://HOST:PORT --env-module MODULE:FACTORY --num-envs N
    farm-worker-py --policy NAME tcp://HOST:PORT PATTERNS [--policy ...] --env-module MODULE:FACTORY ...
                   [--groups 2] [--seed S] [--index I] [--proto-dir DIR] [--no-numpy]
                   [--curve-worker-secret-key-file NAME.key --curve-learner-public-key-file LEARNER.pub]
                   [--normalize-obs] [--normalize-reward] [--obs-clip C] [--reward-clip C]
                   [--gamma G] [--rollout-length T] [--frame-stack K]

MODULE is an importable module name or a path to a .py file; FACTORY() returns one env (a vectorised env: one per
group). The two CURVE options match the learner's transport.curve (docs/OPERATIONS.md, "Security: CURVE keys"):
this worker's secret key and the learner's public key. The normalisation options and --frame-stack match the
learner's env.normalize_obs, env.normalize_reward, env.obs_clip, env.reward_clip, ppo.gamma, ppo.rollout_length
and env.frame_stack; a learner whose settings differ refuses the worker at the handshake, naming each key.
farm-worker starts this command itself for a config with env.python (docs/ENVIRONMENTS.md, "Python environments").
With --policy (repeated, instead of --learner), each policy's agents (PATTERNS: comma-separated agent names or
fnmatch patterns such as 'adversary_*'; agent indices for an env in the array style) are acted for and trained by
the learner at its endpoint (farm_worker.policies, docs/ENVIRONMENTS.md, "Several policies").
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import signal
import sys
import traceback
from typing import Any, Callable, Optional, Sequence

from .errors import WorkerError
from .normalizer import NormalizerOptions
from .worker import PythonWorker


def load_factory(spec: str) -> Callable[[], Any]:
    """MODULE:FACTORY (a module name or a .py file, then an attribute path) as a callable."""
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


def env_source(spec: str) -> str:
    """Where load_factory(spec) found the env's code: the .py file's absolute path, or the sys.path folder that
    holds a module name (for a.b: the folder with a/b.py, a/b/__init__.py or the namespace folder a/b); "" when
    it cannot be told (a built-in or frozen module). The learner records it (env.python_found)."""
    module_name = spec.rpartition(":")[0]
    if module_name.endswith(".py") or os.sep in module_name:
        return os.path.abspath(module_name)
    module = sys.modules.get(module_name)
    if module is None:
        return ""
    parts = module_name.split(".")
    file = getattr(module, "__file__", None)
    if file:
        base = os.path.abspath(file)
        up = len(parts) + 1 if os.path.basename(base).startswith("__init__.") else len(parts)
    else:
        paths = list(getattr(module, "__path__", None) or [])  # a namespace package
        if not paths:
            return ""
        base = os.path.join(os.path.abspath(paths[0]), "__init__")
        up = len(parts) + 1
    for _ in range(up):
        base = os.path.dirname(base)
    return base


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


def main(argv: Optional[Sequence[str]] = None) -> int:
    launcher = os.getppid()  # before anything can delay us: see _die_with_parent
    p = argparse.ArgumentParser(prog="farm-worker-py", description="Rollout Farm worker for Python (Gymnasium-style) environments")
    learner = p.add_mutually_exclusive_group(required=True)
    learner.add_argument("--learner", help="learner endpoint, e.g. tcp://127.0.0.1:5555")
    learner.add_argument("--policy", nargs=3, action="append", metavar=("NAME", "ENDPOINT", "PATTERNS"),
                         help="several policies: the agents PATTERNS (comma-separated names or patterns) are the "
                              "policy NAME's, served by the learner at ENDPOINT (repeat for each policy)")
    p.add_argument("--env-module", required=True, metavar="MODULE:FACTORY",
                   help="FACTORY() returns one env; MODULE is a module name or a .py file")
    p.add_argument("--num-envs", type=int, default=8, help="envs in this worker (default 8)")
    p.add_argument("--groups", type=int, default=2, help="groups for double buffering (default 2)")
    p.add_argument("--seed", type=int, default=0, help="seeds every env (mixed with index and group)")
    p.add_argument("--index", type=int, default=0, help="this worker's index (seeds and identity)")
    p.add_argument("--worker-id", default=None, help="ZeroMQ identity (default worker-HOST-INDEX-PID)")
    p.add_argument("--env-name", default=None, help="env name in Hello (default: env.spec.id or the class name)")
    p.add_argument("--sys-path", default=None, metavar="DIR",
                   help="put DIR first on sys.path before importing MODULE (farm-worker passes the folder a run "
                        "recorded for a module name: env.python_found)")
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
    p.add_argument("--no-numpy", action="store_true",
                   help="step single-agent envs through the pure-Python path even when numpy is there")
    p.add_argument("--frame-stack", type=int, default=1, metavar="K",
                   help="env.frame_stack: observations are each env's last K, stacked along the first axis "
                        "(default 1: off; must match the learner's config)")
    args = p.parse_args(argv)
    prog = f"farm-worker-py {args.index}"
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
        if args.sys_path:
            sys.path.insert(0, os.path.abspath(args.sys_path))
        factory = load_factory(args.env_module)
        if args.policy:
            from .policies import MultiPolicyWorker, PolicySpec  # numpy: imported only for several policies
            if args.frame_stack != 1 or args.no_numpy:
                raise WorkerError("--policy: several policies step their envs on the numpy path without frame "
                                  "stacking (drop --frame-stack and --no-numpy)")
            specs = [PolicySpec(name, endpoint, patterns.split(",")) for name, endpoint, patterns in args.policy]
            worker = MultiPolicyWorker([factory] * args.num_envs, specs, num_groups=args.groups,
                                       worker_id=args.worker_id, seed=args.seed, give_up_s=args.give_up_s,
                                       index=args.index, env_name=args.env_name, proto_dir=args.proto_dir,
                                       curve_worker_secret_key_file=args.curve_worker_secret_key_file,
                                       curve_learner_public_key_file=args.curve_learner_public_key_file,
                                       normalization=normalization, rollout_length=args.rollout_length,
                                       env_source=env_source(args.env_module))
        else:
                worker = PythonWorker([factory] * args.num_envs, args.learner, num_groups=args.groups,
                                  worker_id=args.worker_id, seed=args.seed, give_up_s=args.give_up_s,
                                  index=args.index, env_name=args.env_name, proto_dir=args.proto_dir,
                                  curve_worker_secret_key_file=args.curve_worker_secret_key_file,
                                  curve_learner_public_key_file=args.curve_learner_public_key_file,
                                  normalization=normalization, rollout_length=args.rollout_length,
                                  frame_stack=args.frame_stack, use_numpy=False if args.no_numpy else None,
                                  env_source=env_source(args.env_module))
    except WorkerError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # importing the module or making an env raised
        traceback.print_exc()
        print(f"{prog}: cannot make the envs of --env-module {args.env_module}: {type(e).__name__}: {e}",
              file=sys.stderr)
        return 2
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: worker.request_stop())
    rc = 0
    try:
        stats = worker.run()
        if args.policy:
            for c, (name, st) in zip(worker.channels, stats.items()):
                print(f"{prog}: policy {name}: {c.identity.decode(errors='replace')} done: {st.env_steps} env steps, "
                      f"{st.episodes} episodes ({st.stop_reason})", file=sys.stderr)
        else:
            print(f"{prog}: {worker.identity.decode(errors='replace')} done: {stats.env_steps} env steps, "
                  f"{stats.episodes} episodes ({stats.stop_reason})", file=sys.stderr)
    except WorkerError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        rc = 1
    except Exception as e:  # the env's own code (or a bug here): its traceback, then one line that says so
        traceback.print_exc()
        print(f"{prog}: stopped by {type(e).__name__} raised while stepping the envs: {e}", file=sys.stderr)
        rc = 1
    finally:
        worker.close()
    if args.stats_file:
        with open(args.stats_file, "w") as f:
            if args.policy:
                out = {"index": args.index, "policies": {}}
                for spec, c in zip(worker.policies, worker.channels):
                    out["policies"][spec.name] = dict(c.stats.as_dict(), identity=c.identity.decode(errors="replace"))
                    if c.normalizer is not None:
                        out["policies"][spec.name]["normalizer"] = c.normalizer.view_dict()
            else:
                out = dict(worker.stats.as_dict(), index=args.index)
                if worker.normalizer is not None:
                    out["normalizer"] = worker.normalizer.view_dict()  # the statistics it normalised with last
            json.dump(out, f)
            f.write("\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())