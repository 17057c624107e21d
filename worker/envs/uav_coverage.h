// uav_coverage: a team of UAVs covering a grid with obstacles, a multi-agent
// env with a global state (centralised training, decentralised execution).
//
// The map: a grid x grid square (row 0 at the top, column 0 at the left) with
// `obstacles` obstacle cells, distinct and uniformly drawn at every reset from
// the env's seeded engine; the `agents` UAVs start on distinct free cells,
// also drawn at reset. A cell is covered once a UAV has been within
// `cover_radius` of it (Chebyshev distance; 0: the cell it is on); obstacle
// cells are never covered. Start cells count as covered (no reward for them).
//
// Actions, per agent: Discrete(5): 0 stay, 1 up (row - 1), 2 down (row + 1),
// 3 left (column - 1), 4 right (column + 1). All agents move at once:
//   - a move off the grid or onto an obstacle is blocked;
//   - two agents moving onto the same cell are both blocked, and so are two
//     agents swapping cells;
//   - a move onto a cell whose agent ends the step there (it stayed or was
//     blocked) is blocked, repeatedly until nothing changes (a chain behind
//     a blocked agent is blocked too). Moving into a cell its agent leaves is
//     fine, so no two agents ever share a cell.
// A blocked agent stays where it is and counts one collision. Staying still
// is never a collision.
//
// Reward, shared by the team (every agent row gets the same number):
//   cell_reward * (cells newly covered this step) - collision_penalty * collisions.
// With cell_reward 1 and collision_penalty 0 an episode's return is the number
// of cells the team covered beyond its start cells (what farm-random reports
// as the coverage baseline).
// Terminated when every free cell is covered (or, with a battery, when every
// UAV is done); otherwise truncated at max_steps by EnvGroup.
//
// Battery (option `battery` > 0; 0, the default, is unlimited and changes
// nothing): each UAV starts an episode with `battery` units and every step
// whose action is a move (1 to 4), blocked or not, uses one; staying does not.
// A UAV whose battery is empty is done (EnvSpec::agents_finish_early): it
// stays on its cell, still blocking it, covers nothing more, and its actions
// are ignored (no moves, no collisions); the team goes on without it. With a
// battery, observations get channel 5 (the UAV's remaining battery as a
// fraction of `battery`, constant over the window) and the global state
// channel 3 (each UAV's remaining fraction on its cell), so that policy and
// critic can see who is about to drop out.
//
// Observation, per agent: [5, window, window] in [0, 1], a window centred on
// the agent: channel 0 is 1 on obstacles and outside the grid, channel 1 on
// covered cells, channel 2 on the other agents; channels 3 and 4 are constant,
// the agent's column and row divided by (grid - 1).
// Global state: [3, grid, grid]: obstacles, covered cells, agents (and the
// battery channel above).
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "worker/env.h"

namespace farm {

struct UavCoverageOptions {
  int agents = 10;
  int grid = 32;
  int obstacles = 40;
  int window = 7;
  int max_steps = 200;
  int cover_radius = 0;
  double cell_reward = 0.1;
  double collision_penalty = 0.05;
  int battery = 0;  // moves per UAV and episode; 0: unlimited (no UAV finishes early)
};

class UavCoverage : public Env {
 public:
  static constexpr int kObsChannels = 5;    // without a battery; with one, kObsChannels + 1
  static constexpr int kStateChannels = 3;  // likewise kStateChannels + 1 with a battery
  enum Action : int64_t { kStay = 0, kUp = 1, kDown = 2, kLeft = 3, kRight = 4 };
  static constexpr int kNumActions = 5;

  UavCoverage(const UavCoverageOptions& options, uint64_t seed);

  void reset(float* obs) override;
  StepResult step(const ActionRef& action, float* obs) override;
  void state(float* out) const override;
  // With a battery: 1 for each UAV whose battery is empty.
  void agents_done(uint8_t* out) const override;

  // For tests: replace the map with these obstacle cells and agent cells
  // ({row, column} each; agents on distinct free cells, one per agent),
  // coverage restarted from the agents' cells; writes the observations.
  // Throws std::invalid_argument for a layout that breaks those rules.
  void SetLayout(const std::vector<std::pair<int, int>>& obstacles, const std::vector<std::pair<int, int>>& agents,
                 float* obs);
  std::pair<int, int> AgentCell(int agent) const;
  bool IsObstacle(int row, int col) const { return obstacle_[Cell(row, col)] != 0; }
  bool IsCovered(int row, int col) const { return covered_[Cell(row, col)] != 0; }
  int covered_cells() const { return covered_count_; }
  int free_cells() const { return free_cells_; }
  int last_collisions() const { return last_collisions_; }
  int last_new_cells() const { return last_new_cells_; }
  int battery_left(int agent) const { return battery_left_.at(agent); }  // the option's value when unlimited
  bool done(int agent) const { return o_.battery > 0 && battery_left_.at(agent) == 0; }
  int obs_channels() const { return kObsChannels + (o_.battery > 0 ? 1 : 0); }

 private:
  int Cell(int row, int col) const { return row * o_.grid + col; }
  bool Inside(int row, int col) const { return row >= 0 && row < o_.grid && col >= 0 && col < o_.grid; }
  // Covers the cells around `cell`; returns how many were new.
  int CoverAround(int cell);
  void StartCoverage();
  void WriteObs(float* obs) const;

  UavCoverageOptions o_;
  std::mt19937_64 rng_;
  std::vector<uint8_t> obstacle_;  // [grid * grid]
  std::vector<uint8_t> covered_;   // [grid * grid]
  std::vector<int> occupant_;      // [grid * grid]: agent index, or -1
  std::vector<int> pos_;           // [agents]: cell
  std::vector<int> cells_;         // [grid * grid]: scratch for drawing cells
  std::vector<int> target_;        // [agents]: scratch for a step
  std::vector<uint8_t> moving_;    // [agents]
  std::vector<uint8_t> revert_;    // [agents]
  std::vector<int> claims_;        // [grid * grid]: movers per target cell
  std::vector<int> battery_left_;  // [agents]: moves left (battery > 0 only)
  int free_cells_ = 0;
  int covered_count_ = 0;
  int last_collisions_ = 0;
  int last_new_cells_ = 0;
};

// Options (every one a number; defaults in UavCoverageOptions): agents, grid,
// obstacles, window (odd), max_steps, cover_radius, cell_reward,
// collision_penalty, battery. Throws std::invalid_argument naming a bad option.
EnvOptions UavCoverageDefaultOptions();
UavCoverageOptions ParseUavCoverageOptions(const EnvOptions& resolved);
// Box [5, window, window] in [0, 1] per agent, Discrete(5), num_agents =
// agents, global state Box [3, grid, grid] in [0, 1], time limit max_steps;
// with a battery 6 and 4 channels, and agents_finish_early.
EnvSpec UavCoverageSpec(const EnvOptions& resolved);
std::unique_ptr<Env> MakeUavCoverage(const EnvOptions& resolved, uint64_t seed);

}  // namespace farm
