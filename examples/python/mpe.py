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
In simple_adversary_v3 and simple_tag_v3 two teams compete: farm_worker.play_against trains one team while the other
acts inside the env, uniformly at random, or, with MPE_OPPONENT=OUT.pt in the environment, by a policy that
`scripts/farm export RUN_DIR OUT.pt` wrote from a run of the other team (a frozen opponent), e.g.

    scripts/farm train examples/python/mpe_tag_predators.yaml              # the predators against random prey
    scripts/farm export runs/mpe_tag_predators-... /tmp/predators.pt
    MPE_OPPONENT=/tmp/predators.pt scripts/farm train examples/python/mpe_tag_predators.yaml \
        --set env.python=examples/python/mpe.py:make_tag_prey             # the prey against those predators
"""
import os

from farm_worker import pad_agents, play_against



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


def make_speaker_listener_apart():
    """simple_speaker_listener_v4 as PettingZoo builds it, each agent with its own spaces (speaker: observation 3,
    3 actions; listener: observation 11, 5 actions), for a policy of its own per agent (farm_worker.policies:
    `--policy speaker ... speaker_0 --policy listener ... listener_0`)."""
    from pettingzoo.mpe import simple_speaker_listener_v4

    return simple_speaker_listener_v4.parallel_env(max_cycles=25, continuous_actions=False)


def _opponent():
    """The other team's policy: MPE_OPPONENT (an exported policy's path), else uniformly random."""
    return os.environ.get("MPE_OPPONENT") or "random"


def _adversary():
    from pettingzoo.mpe import simple_adversary_v3

    return simple_adversary_v3.parallel_env(N=2, max_cycles=25, continuous_actions=False)


def _tag():
    from pettingzoo.mpe import simple_tag_v3

    return simple_tag_v3.parallel_env(num_good=1, num_adversaries=3, num_obstacles=2, max_cycles=25,
                                      continuous_actions=False)


def make_adversary():
    """simple_adversary_v3 with both teams, for a policy per team (mpe_adversary_policies.yaml)."""
    return _adversary()


def make_tag():
    """simple_tag_v3 with both teams, for a policy per team (mpe_tag_policies.yaml)."""
    return _tag()


def make_adversary_good():
    """simple_adversary_v3's good team (agent_0, agent_1: observation 10, 5 actions), trained against its adversary:
    they are rewarded for one of them being near the goal landmark and for the adversary being far from it."""
    return play_against(_adversary(), "adversary_*", _opponent())


def make_adversary_adversary():
    """simple_adversary_v3's adversary (observation 8: it does not see which landmark is the goal), trained against
    the good team: rewarded for being near the goal."""
    return play_against(_adversary(), "agent_*", _opponent())


def make_tag_predators():
    """simple_tag_v3's three predators (adversary_0..2: observation 16, 5 actions), trained against the prey: +10 to
    each for every collision of a predator with the prey."""
    return play_against(_tag(), "agent_*", _opponent())


def make_tag_prey():
    """simple_tag_v3's prey (agent_0: observation 14, faster), trained against the predators: -10 per collision and
    a penalty for leaving the area."""
    return play_against(_tag(), "adversary_*", _opponent())
