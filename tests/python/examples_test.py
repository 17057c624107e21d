"""The Python examples (examples/python), stepped by the Python worker without a learner (run by
tests/python_examples_test.sh; no training):

1. every examples/python/*.yaml: its env.python factory, loaded as farm-worker loads it, builds a PythonWorker with
   the config's num_envs and num_groups (the MPE examples only where PettingZoo is importable; a config with
   policies: a MultiPolicyWorker with its policies' agent patterns, each policy's rows checked); each group is reset
   with the worker's seeds and stepped with random actions: observations of the declared shape, finite and within
   the declared bounds, finite rewards;
2. memory_cue_np.py (a vectorised delayed cue, MemoryCue-v0's rules): through the worker's group, the cue shows at
   step 0 only, episodes are delay + 1 steps, the answer pays 1 exactly when it is the cue, a remembering policy is
   always right and a memoryless one (always 0) about 1 / choices of the time; same seeds, same episodes; bad
   options and actions are refused, naming them.
Usage: python3 examples_test.py REPO_ROOT
"""
import glob
import os
import re
import sys

root = sys.argv[1]
sys.path[:0] = [root + "/worker/python"]

import numpy as np  # noqa: E402

import farm_worker as fw  # noqa: E402
from farm_worker.groups import BatchedGroup  # noqa: E402
from farm_worker.wire import env_seed, mix_seed  # noqa: E402


def config_keys(path):
    """env.python, env.num_envs and env.num_groups of an example's config (flat YAML read by hand: no PyYAML)."""
    text = open(path).read()
    env = re.search(r"^env:\n((?:[ \t]+.*\n|\n)*)", text, re.M)
    assert env, f"{path}: no env section"

    def key(name):
        m = re.search(rf"^\s+{name}:\s*([^\s#]+)", env.group(1), re.M)
        assert m, f"{path}: no env.{name}"
        return m.group(1)

    return key("python"), int(key("num_envs")), int(key("num_groups"))


def config_policies(path):
    """The policies of an example's config as (name, [patterns]) (the flow or block lists these examples use)."""
    text = open(path).read()
    block = re.search(r"^policies:\n((?:[ \t]+.*\n|\n)*)", text, re.M)
    if not block:
        return []
    names = re.findall(r"name:\s*([\w.-]+)", block.group(1))
    agents = [re.findall(r'"([^"]+)"|([\w*?.-]+)', a) for a in re.findall(r"agents:\s*\[([^\]]*)\]", block.group(1))]
    assert names and len(names) == len(agents), (path, names, agents)
    return [(n, [x or y for x, y in a]) for n, a in zip(names, agents)]


def random_actions(space, rows, rng):
    if isinstance(space, fw.Discrete):
        return rng.integers(0, space.n, rows) + space.start
    if isinstance(space, fw.MultiDiscrete):
        return np.stack([rng.integers(s, s + n, rows) for n, s in zip(space.nvec, space.start)], 1).reshape(-1)
    return rng.uniform(space.low, space.high, (rows,) + space.shape).astype(np.float32).reshape(-1)


# 1. Every example config's env through the worker.
configs = sorted(glob.glob(os.path.join(root, "examples", "python", "*.yaml")))
assert len(configs) >= 2, configs
for config in configs:
    module, num_envs, num_groups = config_keys(config)
    path, _, attr = module.partition(":")
    factory = fw.load_factory(os.path.join(root, path) + ":" + attr)
    policies = config_policies(config)
    try:
        if policies:
            from farm_worker.policies import MultiPolicyWorker, PolicySpec
            w = MultiPolicyWorker([factory] * num_envs, [PolicySpec(n, "tcp://127.0.0.1:1", a) for n, a in policies],
                                  num_groups=num_groups, seed=1, index=0)
        else:
            w = fw.PythonWorker([factory] * num_envs, "tcp://127.0.0.1:1", num_groups=num_groups, seed=1, index=0)
    except ModuleNotFoundError as e:
        # PettingZoo's MPE examples need PettingZoo and Gymnasium, which are not Debian packages
        # (scripts/prepare_mpe.sh puts them on PYTHONPATH): stepped when they are there.
        if e.name not in ("pettingzoo", "gymnasium"):
            raise
        print(f"{os.path.relpath(config, root)}: skipped, {e.name} is not importable (scripts/prepare_mpe.sh)")
        continue
    try:
        rng = np.random.default_rng(0)
        episodes = 0
        for g, group in enumerate(w.groups):
            base = mix_seed(1, g)
            group.reset(seed=[env_seed(base, i) for i in range(group.num_envs)])
            views = group.views if policies else [group]  # each policy's rows, or the one group's
            for t in range(40):
                for v in views:
                    box = v.observation_space
                    low = np.asarray(box.low, np.float32).reshape(box.shape)
                    high = np.asarray(box.high, np.float32).reshape(box.shape)
                    assert v.obs.dtype == np.float32 and v.obs.shape == (v.rows,) + box.shape, (config, v.obs.shape)
                    assert np.isfinite(v.obs).all() and (v.obs >= low).all() and (v.obs <= high).all(), (config, t)
                actions = [random_actions(v.action_space, v.rows, rng) for v in views]
                infos = group.step(actions) if policies else [group.step(actions[0])[4]]
                for v, info in zip(views, infos):
                    assert v.reward.shape == (v.rows,) and np.isfinite(v.reward).all(), (config, t)
                episodes += len(infos[0]["episodes"])
        first = w.channels if policies else [w]
        shapes = ", ".join(f"{getattr(c.groups[0], 'name', 'observation')} {list(c.groups[0].observation_space.shape)}"
                           for c in first)
        print(f"{os.path.relpath(config, root)}: {num_envs} envs in {num_groups} groups of "
              f"{first[0].env_name}, {shapes}, {episodes} episodes in 40 steps a group: ok")
    finally:
        w.close()

# 2. memory_cue_np.py's rules, through the worker's vectorised group.
mc = fw.load_factory(os.path.join(root, "examples/python/memory_cue_np.py") + ":make_env")
MemoryCueVec = sys.modules["memory_cue_np"].MemoryCueVec
env = mc()
assert isinstance(env, MemoryCueVec) and (env.num_envs, env.delay, env.choices) == (16, 32, 2)
assert env.single_observation_space.shape == (4,) and env.single_action_space.n == 2


def expected_obs(t, delay, choices, cue):
    """One row as memory_cue_np.py's docstring (and worker/envs/memory_cue.h) describe it, written out again."""
    row = np.zeros(2 + choices, np.float32)
    row[0] = min(t, delay) / delay
    if t == 0:
        row[1] = 1.0
        row[2 + cue] = 1.0
    return row


for delay, choices in ((1, 2), (5, 3), (32, 2)):
    n = 32
    group = BatchedGroup(MemoryCueVec(num_envs=n, delay=delay, choices=choices))
    for policy in ("remember", "always0", "wrong"):
        obs, _ = group.reset(seed=[7 + i for i in range(n)])
        t = np.zeros(n, np.int64)
        cue = np.full(n, -1)
        returns, lengths = [], []
        while len(returns) < 1500:
            for i in range(n):
                if t[i] == 0:
                    hot = np.flatnonzero(obs[i, 2:])
                    assert len(hot) == 1, (delay, choices, obs[i])
                    cue[i] = hot[0]
                assert (obs[i] == expected_obs(t[i], delay, choices, cue[i])).all(), (delay, choices, t[i], obs[i])
            answer = {"remember": cue, "always0": np.zeros(n, np.int64), "wrong": (cue + 1) % choices}[policy]
            acts = np.where(t == delay, answer, np.arange(n) % choices)  # anything before the answer step
            obs, reward, terminated, truncated, info = group.step(acts.astype(np.int64))
            answered = t == delay
            assert (terminated.astype(bool) == answered).all() and not truncated.any()
            assert (reward == np.where(answered & (acts == cue), 1.0, 0.0)).all(), (policy, reward)
            assert info["final_obs_index"] == []  # terminations only: nothing to bootstrap
            for ret, length in info["episodes"]:
                returns.append(ret)
                lengths.append(length)
            t = np.where(answered, 0, t + 1)
        assert set(lengths) == {delay + 1}, (delay, set(lengths))
        mean = float(np.mean(returns))
        if policy == "remember":
            assert mean == 1.0, mean
        elif policy == "wrong":
            assert mean == 0.0, mean
        else:  # right with probability 1 / choices: the mean's standard deviation is below 0.013 for 1,500 episodes
            assert abs(mean - 1.0 / choices) < 0.05, (delay, choices, mean)
        print(f"memory_cue_np delay {delay}, {choices} cues, {policy}: mean return {mean:.3f} over {len(returns)} "
              f"episodes of {delay + 1} steps: ok")

# The same seeds give the same cues; others differ.
a, b, c = (MemoryCueVec(num_envs=64, delay=2) for _ in range(3))
oa, _ = a.reset(seed=list(range(64)))
ob, _ = b.reset(seed=list(range(64)))
oc, _ = c.reset(seed=list(range(1, 65)))
assert (oa == ob).all() and not (oa == oc).all()


def expect_value_error(fn, *words):
    try:
        fn()
    except ValueError as e:
        for word in words:
            assert word in str(e), (word, str(e))
        return
    raise AssertionError(f"no ValueError (expected one naming {words})")


expect_value_error(lambda: MemoryCueVec(delay=0), "delay", "got 0")
expect_value_error(lambda: MemoryCueVec(delay=2.5), "delay", "got 2.5")
expect_value_error(lambda: MemoryCueVec(choices=1), "choices", "got 1")
expect_value_error(lambda: MemoryCueVec(num_envs=0), "num_envs", "got 0")
bad = MemoryCueVec(num_envs=3, delay=2, choices=2)
bad.reset(seed=0)
expect_value_error(lambda: bad.step(np.array([0, 2, 0])), "env 1", "action 2", "[0, 2)")
expect_value_error(lambda: bad.step(np.array([0, 1])), "expected 3 actions")
print("memory_cue_np options and actions: ok")
