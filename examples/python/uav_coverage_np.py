"""A multi-UAV coverage env in numpy, written the way a CTDE project writes one: 10 UAVs on a grid with obstacles,
each seeing a local window around it, a global map for a centralised critic, one team reward.

The farm's worker takes it as it is (the "array style" of docs/ENVIRONMENTS.md, "Python environments"):
    num_agents, observation_space, action_space, state_space          attributes
    reset(seed=None)  -> (obs [A, OBS], state [3, G, G])
    step(actions [A]) -> (obs, state, team reward, terminated, truncated, info)

Rules. A G x G grid with `obstacles` blocked cells (drawn anew each episode, never on a start cell). The agents
start in random free cells; each step each agent stays or moves one cell (actions 0 stay, 1 up, 2 down, 3 left,
4 right), in agent order: a move into an obstacle, off the grid or onto another agent is blocked (the agent stays).
Every cell an agent stands on is covered; the team reward is `cell_reward` per newly covered cell, so an episode's
return is cell_reward x the cells covered. Episodes end by the time limit (`max_steps`, truncated).

Observation per agent (flat float32, OBS = 3 * W * W + 2): its W x W window, centred on it, with channels
(blocked: obstacle or off the grid; covered; another agent), then its row and column / (G - 1).
Global state: [3, G, G] (obstacles, covered, agents), for the critic.

Baseline: `python3 uav_coverage_np.py` plays uniformly random teams and prints their mean return (the farm's target
for this env is twice that: examples/python/uav_coverage.yaml).
"""
from __future__ import annotations

import numpy as np

# Gymnasium's spaces work here too; the farm reads any object with n, or shape/low/high.
try:
    from farm_worker import Box, Discrete
except ImportError:  # without the farm on the path: simple stand-ins with the same fields
    class Discrete:  # type: ignore[no-redef]
        def __init__(self, n):
            self.n = n

    class Box:  # type: ignore[no-redef]
        def __init__(self, low, high, shape):
            self.low, self.high, self.shape = low, high, tuple(shape)

MOVES = np.array([[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1]], np.int64)


class UavCoverage:
    metadata = {"name": "uav_coverage_np"}

    def __init__(self, agents: int = 10, grid: int = 24, obstacles: int = 25, window: int = 5, max_steps: int = 60,
                 cell_reward: float = 0.1, seed: int | None = None):
        if window % 2 == 0:
            raise ValueError(f"window must be odd, got {window}")
        if agents + obstacles > grid * grid:
            raise ValueError(f"{agents} agents and {obstacles} obstacles do not fit on a {grid}x{grid} grid")
        self.num_agents, self.grid, self.n_obstacles = agents, grid, obstacles
        self.window, self.max_steps, self.cell_reward = window, max_steps, cell_reward
        obs_size = 3 * window * window + 2
        self.observation_space = Box(0.0, 1.0, (obs_size,))
        self.action_space = Discrete(len(MOVES))
        self.state_space = Box(0.0, 1.0, (3, grid, grid))
        self.rng = np.random.default_rng(seed)
        r = window // 2
        # Padded maps (border r): windows are plain slices.
        self._blocked = np.ones((grid + 2 * r, grid + 2 * r), np.float32)
        self._covered = np.zeros_like(self._blocked)
        self._agents = np.zeros_like(self._blocked)
        self.pos = np.zeros((agents, 2), np.int64)
        self.t = 0

    def reset(self, seed=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        g, r = self.grid, self.window // 2
        cells = self.rng.permutation(g * g)[: self.num_agents + self.n_obstacles]
        inner = (slice(r, r + g), slice(r, r + g))
        self._blocked[:] = 1.0
        self._blocked[inner] = 0.0
        obstacle = cells[self.num_agents:]
        self._blocked[obstacle // g + r, obstacle % g + r] = 1.0
        self.pos = np.stack([cells[: self.num_agents] // g, cells[: self.num_agents] % g], axis=1) + r
        self._covered[:] = 0.0
        self._agents[:] = 0.0
        self._agents[self.pos[:, 0], self.pos[:, 1]] = 1.0
        self._covered[self.pos[:, 0], self.pos[:, 1]] = 1.0
        self.t = 0
        return self._obs(), self._state()

    def step(self, actions):
        new = 0
        for i, a in enumerate(np.asarray(actions, np.int64)):
            target = self.pos[i] + MOVES[a]
            if a == 0 or self._blocked[target[0], target[1]] or self._agents[target[0], target[1]]:
                continue
            self._agents[self.pos[i, 0], self.pos[i, 1]] = 0.0
            self._agents[target[0], target[1]] = 1.0
            self.pos[i] = target
            if not self._covered[target[0], target[1]]:
                self._covered[target[0], target[1]] = 1.0
                new += 1
        self.t += 1
        return self._obs(), self._state(), self.cell_reward * new, False, self.t >= self.max_steps, {}

    def _obs(self):
        w, r, g = self.window, self.window // 2, self.grid
        maps = np.stack([self._blocked, self._covered, self._agents])  # [3, G + 2r, G + 2r]
        out = np.empty((self.num_agents, 3 * w * w + 2), np.float32)
        for i, (row, col) in enumerate(self.pos):
            view = maps[:, row - r: row + r + 1, col - r: col + r + 1].copy()
            view[2, r, r] = 0.0  # the agent itself is not "another agent"
            out[i, :-2] = view.reshape(-1)
        out[:, -2:] = (self.pos - r) / max(g - 1, 1)
        return out

    def _state(self):
        r, g = self.window // 2, self.grid
        inner = (slice(r, r + g), slice(r, r + g))
        return np.stack([self._blocked[inner], self._covered[inner], self._agents[inner]])

    def covered_cells(self) -> int:
        return int(self._covered.sum())


def make_env():
    """The factory the config names (env.python: examples/python/uav_coverage_np.py:make_env)."""
    return UavCoverage()


def random_team_return(episodes: int = 200, seed: int = 0) -> tuple:
    env = UavCoverage(seed=seed)
    rng = np.random.default_rng(seed + 1)
    returns = []
    for _ in range(episodes):
        env.reset()
        total, done = 0.0, False
        while not done:
            _, _, reward, terminated, truncated, _ = env.step(rng.integers(0, len(MOVES), env.num_agents))
            total += reward
            done = terminated or truncated
        returns.append(total)
    return float(np.mean(returns)), float(np.std(returns))


if __name__ == "__main__":
    mean, std = random_team_return()
    print(f"uniform-random team: mean return {mean:.2f} +- {std:.2f} over 200 episodes "
          f"({mean / UavCoverage().cell_reward:.0f} cells covered)")
