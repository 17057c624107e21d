"""PettingZoo's MPE envs, unmodified, for the Python worker (docs/ENVIRONMENTS.md, "Python environments").

PettingZoo 1.24.3 and Gymnasium 0.29.1 are not Debian packages: scripts/prepare_mpe.sh clones them outside the
source tree and prints the PYTHONPATH that makes `pettingzoo.mpe` importable here, e.g.

    export PYTHONPATH=$(scripts/prepare_mpe.sh ~/mpe | tail -n 1)
    scripts/farm train examples/python/mpe_spread.yaml

Each factory returns the env's Parallel API as PettingZoo builds it, with the settings of MAPPO's MPE runs (3 agents,
25 steps, discrete actions); the worker's ParallelEnvAdapter turns it into rows, one per agent, and its state()
(the agents' observations side by side) becomes the centralised critic's global state. simple_spread_v3's agents
share their spaces; simple_speaker_listener_v4's do not, and farm_worker.pad_agents pads them for one shared policy
(observations zero-padded with a one-hot agent id, the speaker's missing actions taken as its no-op).
"""
from farm_worker import pad_agents



def make_spread():
    """simple_spread_v3: 3 agents cover 3 landmarks; the team reward is minus the landmarks' distances to their
    nearest agent, minus 1 per collision (local_ratio 0.5 mixes in each agent's own collisions)."""
    from pettingzoo.mpe import simple_spread_v3

    return simple_spread_v3.parallel_env(N=3, local_ratio=0.5, max_cycles=25, continuous_actions=False)


def make_speaker_listener():
    """simple_speaker_listener_v4: a speaker that sees the goal's colour (observation 3, 3 actions: what to say) and
    a listener that hears it and moves (observation 11, 5 actions); both get minus the listener's squared distance to
    the goal. One shared policy for both: pad_agents makes their observations 11 + a 2-entry agent id and their
    actions 5 (the speaker's actions 3 and 4 are its action 0)."""
    from pettingzoo.mpe import simple_speaker_listener_v4

    return pad_agents(simple_speaker_listener_v4.parallel_env(max_cycles=25, continuous_actions=False))
