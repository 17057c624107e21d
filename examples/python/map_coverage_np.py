"""A map-shaped multi-agent env in numpy, the size the farm's users bring: each agent observes the whole 50 x 50
map in 7 feature channels, the input a conv encoder is for (examples/python/map_coverage.yaml trains it with
`ppo.encoder: conv`).

Array style (docs/ENVIRONMENTS.md, "Python environments"):
    num_agents, observation_space, action_space, state_space          attributes
    reset(seed=None)  -> (obs [A, 7, G, G], state [4, G, G])
    step(actions [A]) -> (obs, state, team reward, terminated, truncated, info)

Rules. A G x G grid with `obstacles` blocked cells drawn anew each episode; the agents start in random free cells
and each step stays or moves one cell (0 stay, 1 up, 2 down, 3 left, 4 right), in agent order; a move into an
obstacle, off the grid or onto another agent is blocked. Cells an agent stands on are covered; the team reward is
`cell_reward` per newly covered cell. Episodes end at `max_steps` (truncated).

Observation per agent, float32 [7, G, G]: obstacles, covered cells, this agent, the other agents, how recently
each cell was visited (1 on the step it is visited, decaying by `decay` per step), and the row and column of each
cell / (G - 1) (coordinate planes). Global state, for a centralised critic: [4, G, G], the first two channels,
all the agents, and the recency map.

`python3 map_coverage_np.py` prints the uniform-random team's return and how fast the env alone steps.
"""
from __future__ import annotations

import time

import numpy as np

try:
    from farm_worker import Box, Discrete
except ImportError:  # without the farm on the path: stand-ins with the same fields
    class Discrete:  # type: ignore[no-redef]
        def __init__(self, n):
            self.n = n

    class Box:  # type: ignore[no-redef]
        def __init__(self, low, high, shape):
            self.low, self.high, self.shape = low, high, tuple(shape)

MOVES = np.array([[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1]], np.int64)
CHANNELS = 7


class MapCoverage:
    metadata = {"name": "map_coverage_np"}

    def __init__(self, agents: int = 4, grid: int = 50, obstacles: int = 250, max_steps: int = 100,
                 cell_reward: float = 0.1, decay: float = 0.9, seed: int | None = None):
        if agents + obstacles > grid * grid:
            raise ValueError(f"{agents} agents and {obstacles} obstacles do not fit on a {grid}x{grid} grid")
        self.num_agents, self.grid, self.n_obstacles = agents, grid, obstacles
        self.max_steps, self.cell_reward, self.decay = max_steps, cell_reward, decay
        self.observation_space = Box(0.0, 1.0, (CHANNELS, grid, grid))
        self.action_space = Discrete(len(MOVES))
        self.state_space = Box(0.0, 1.0, (4, grid, grid))
        self.rng = np.random.default_rng(seed)
        self._blocked = np.zeros((grid, grid), np.float32)
        self._covered = np.zeros_like(self._blocked)
        self._agents = np.zeros_like(self._blocked)
        self._recency = np.zeros_like(self._blocked)
        coords = np.arange(grid, dtype=np.float32) / max(grid - 1, 1)
        self._rows = np.repeat(coords[:, None], grid, axis=1)
        self._cols = np.repeat(coords[None, :], grid, axis=0)
        self.pos = np.zeros((agents, 2), np.int64)
        self.t = 0

    def reset(self, seed=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        g = self.grid
        cells = self.rng.permutation(g * g)[: self.num_agents + self.n_obstacles]
        self._blocked[:] = 0.0
        obstacle = cells[self.num_agents:]
        self._blocked[obstacle // g, obstacle % g] = 1.0
        self.pos = np.stack([cells[: self.num_agents] // g, cells[: self.num_agents] % g], axis=1)
        self._covered[:] = 0.0
        self._agents[:] = 0.0
        self._recency[:] = 0.0
        self._agents[self.pos[:, 0], self.pos[:, 1]] = 1.0
        self._covered[self.pos[:, 0], self.pos[:, 1]] = 1.0
        self._recency[self.pos[:, 0], self.pos[:, 1]] = 1.0
        self.t = 0
        return self._obs(), self._state()

    def step(self, actions):
        g, new = self.grid, 0
        self._recency *= self.decay
        for i, a in enumerate(np.asarray(actions, np.int64)):
            target = self.pos[i] + MOVES[a]
            if (a == 0 or target.min() < 0 or target.max() >= g or self._blocked[target[0], target[1]]
                    or self._agents[target[0], target[1]]):
                continue
            self._agents[self.pos[i, 0], self.pos[i, 1]] = 0.0
            self._agents[target[0], target[1]] = 1.0
            self.pos[i] = target
            if not self._covered[target[0], target[1]]:
                self._covered[target[0], target[1]] = 1.0
                new += 1
        self._recency[self.pos[:, 0], self.pos[:, 1]] = 1.0
        self.t += 1
        return self._obs(), self._state(), self.cell_reward * new, False, self.t >= self.max_steps, {}

    def _obs(self):
        out = np.empty((self.num_agents, CHANNELS, self.grid, self.grid), np.float32)
        out[:, 0] = self._blocked
        out[:, 1] = self._covered
        out[:, 2] = 0.0
        out[np.arange(self.num_agents), 2, self.pos[:, 0], self.pos[:, 1]] = 1.0
        out[:, 3] = self._agents - out[:, 2]  # the others
        out[:, 4] = self._recency
        out[:, 5] = self._rows
        out[:, 6] = self._cols
        return out

    def _state(self):
        return np.stack([self._blocked, self._covered, self._agents, self._recency])

    def covered_cells(self) -> int:
        return int(self._covered.sum())


def make_env():
    """The factory the config names (env.python: examples/python/map_coverage_np.py:make_env)."""
    return MapCoverage()


def random_team(episodes: int = 50, seed: int = 0) -> tuple:
    """The uniform-random team's mean and std return, and the env's own env steps per second."""
    env = MapCoverage(seed=seed)
    rng = np.random.default_rng(seed + 1)
    returns, steps = [], 0
    start = time.perf_counter()
    for _ in range(episodes):
        env.reset()
        total, done = 0.0, False
        while not done:
            _, _, reward, terminated, truncated, _ = env.step(rng.integers(0, len(MOVES), env.num_agents))
            total += reward
            steps += 1
            done = terminated or truncated
        returns.append(total)
    return float(np.mean(returns)), float(np.std(returns)), steps / (time.perf_counter() - start)


if __name__ == "__main__":
    mean, std, sps = random_team()
    print(f"uniform-random team: mean return {mean:.2f} +- {std:.2f} over 50 episodes "
          f"({mean / MapCoverage().cell_reward:.0f} cells); the env alone: {sps:.0f} env steps/s on one core")
