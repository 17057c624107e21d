// GridWalk-v0: the worked example of docs/ENVIRONMENTS.md, an env written
// outside the worker's tree. The agent walks on a size x size grid from a
// random cell to the goal in the bottom-right corner.
#pragma once

#include <cstdint>
#include <memory>
#include <random>

#include "worker/env.h"

namespace farm_examples {

// Observation: [2, size, size] floats, channel 0 one-hot on the agent's cell,
// channel 1 one-hot on the goal cell (size - 1, size - 1).
// Action: Discrete(4): 0 up, 1 right, 2 down, 3 left; a move into a wall
// leaves the agent where it is.
// Reward: -0.01 per step, +1 on the step that reaches the goal (terminated).
class GridWalk : public farm::Env {
 public:
  static constexpr int kDefaultSize = 5;
  static constexpr int kMaxEpisodeSteps = 50;
  static constexpr float kStepReward = -0.01f;
  static constexpr float kGoalReward = 1.0f;
  enum Action : int64_t { kUp = 0, kRight = 1, kDown = 2, kLeft = 3 };

  GridWalk(int size, uint64_t seed);

  // Starts on a uniformly drawn cell other than the goal.
  void reset(float* obs) override;
  farm::StepResult step(const farm::ActionRef& action, float* obs) override;

  // For tests: put the agent on a cell and write the observation.
  void SetAgent(int row, int col, float* obs);

 private:
  void WriteObs(float* obs) const;

  int size_;
  int row_ = 0;
  int col_ = 0;
  std::mt19937_64 rng_;
};

// Options: "size" (5): the grid's side, a whole number from 2 to 26 (so the
// goal is reachable from every cell within the 50-step limit).
farm::EnvOptions GridWalkDefaultOptions();
// Box [2, size, size] in [0, 1], Discrete(4), 50 steps; throws
// std::invalid_argument for a bad size.
farm::EnvSpec GridWalkSpec(const farm::EnvOptions& resolved);
std::unique_ptr<farm::Env> MakeGridWalk(const farm::EnvOptions& resolved, uint64_t seed);

}  // namespace farm_examples
