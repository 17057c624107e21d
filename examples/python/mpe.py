"""PettingZoo's MPE envs, unmodified, for the Python worker (docs/ENVIRONMENTS.md, "Python environments").

PettingZoo 1.24.3 and Gymnasium 0.29.1 are not Debian packages: scripts/prepare_mpe.sh clones them outside the
source tree and prints the PYTHONPATH that makes `pettingzoo.mpe` importable here, e.g.

    export PYTHONPATH=$(scripts/prepare_mpe.sh ~/mpe | tail -n 1)
    scripts/farm train examples/python/mpe_spread.yaml

Each factory returns the env's Parallel API as PettingZoo builds it, with the settings of MAPPO's MPE runs (3 agents,
25 steps, discrete actions); the worker's ParallelEnvAdapter turns it into rows, one per agent, and its state()
(the agents' observations side by side) becomes the centralised critic's global state. Only envs whose agents share
their spaces train with one policy: simple_spread_v3 here.
"""


def make_spread():
    """simple_spread_v3: 3 agents cover 3 landmarks; the team reward is minus the landmarks' distances to their
    nearest agent, minus 1 per collision (local_ratio 0.5 mixes in each agent's own collisions)."""
    from pettingzoo.mpe import simple_spread_v3

    return simple_spread_v3.parallel_env(N=3, local_ratio=0.5, max_cycles=25, continuous_actions=False)
