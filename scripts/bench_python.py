#!/usr/bin/env python3
"""Helpers of `scripts/farm bench --cases python` (scripts/bench.py), run with the interpreter the Python worker
uses. Each prints one JSON line.

  paths SECONDS     the Python worker's own cost per env step, no learner: a PythonWorker whose sends only
                    serialise the message, fed ActionReplies in memory, for two envs (a 4-float observation, and a
                    [3, 32, 32] one) through the pure-Python path and the numpy path
  env SECONDS       env steps/s of examples/python/uav_coverage_np.py alone (random actions): the env-only limit of
                    one core
"""
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "worker", "python"), os.path.join(ROOT, "tests", "python"),
                os.path.join(ROOT, "examples", "python")]


class ImageEnv:
    """Single-agent, observation [3, 32, 32] (3,072 floats, as numpy), 2 actions, 100-step episodes."""

    def __init__(self):
        import numpy as np
        self.np = np
        self.observation_space = {"shape": (3, 32, 32), "low": 0.0, "high": 1.0}
        self.action_space = {"n": 2}
        self.obs = np.random.default_rng(0).random((3, 32, 32), dtype=np.float32)
        self.t = 0

    def reset(self, seed=None):
        self.t = 0
        return self.obs, {}

    def step(self, action):
        self.t += 1
        return self.obs, 1.0, False, self.t >= 100, {}


def worker_cost(make, use_numpy, seconds, num_envs=8, groups=2):
    import farm_worker as fw
    w = fw.PythonWorker([make] * num_envs, "tcp://127.0.0.1:1", num_groups=groups, use_numpy=use_numpy)
    pb = w.pb
    sent = [0]

    def send(envelope):
        sent[0] += len(envelope.SerializeToString())

    w._send = send
    w._start_groups(seeded=True)
    rows = w.groups[0].num_envs
    replies = []
    for g in range(groups):
        r = pb.ActionReply()
        r.group = g
        r.action.dtype = pb.INT64
        r.action.shape.append(rows)
        r.action.data = bytes(8 * rows)
        replies.append(r)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for g in range(groups):
            replies[g].seq = w._next_seq[g] - 1
            w._on_action(replies[g])
        steps += num_envs
    dt = time.perf_counter() - start
    w.close()
    return {"env_steps_per_second": steps / dt, "us_per_env_step": dt / steps * 1e6, "bytes_per_env_step": sent[0] / steps}


def main():
    mode, seconds = sys.argv[1], float(sys.argv[2])
    if mode == "paths":
        import cue_env
        out = {}
        for name, make in (("cue_4_floats", cue_env.make), ("image_3x32x32", ImageEnv)):
            for path, use_numpy in (("pure", False), ("numpy", True)):
                out[f"{name}_{path}"] = worker_cost(make, use_numpy, seconds)
            out[f"{name}_numpy_speedup"] = (out[f"{name}_numpy"]["env_steps_per_second"] /
                                            out[f"{name}_pure"]["env_steps_per_second"])
        print(json.dumps(out))
    elif mode == "env":
        import numpy as np
        import uav_coverage_np as u
        env, rng = u.UavCoverage(seed=1), np.random.default_rng(0)
        env.reset()
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            _, _, _, _, truncated, _ = env.step(rng.integers(0, 5, env.num_agents))
            if truncated:
                env.reset()
            steps += 1
        print(json.dumps({"env_steps_per_second": steps / (time.perf_counter() - start)}))
    else:
        sys.exit(f"unknown mode {mode!r} (paths or env)")


if __name__ == "__main__":
    main()
