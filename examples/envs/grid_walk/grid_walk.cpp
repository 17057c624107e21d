// GridWalk-v0: registered as "GridWalk-v0" by the FARM_REGISTER_ENV line at the end.
#include "examples/envs/grid_walk/grid_walk.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace farm_examples {
namespace {

// Options arrive as doubles (YAML numbers): check the range and wholeness here.
int SizeOption(const farm::EnvOptions& resolved) {
  const double v = resolved.at("size");
  if (!(v >= 2 && v <= 26) || std::floor(v) != v)
    throw std::invalid_argument(fmt::format("option 'size' must be a whole number from 2 to 26, got {}", v));
  return static_cast<int>(v);
}

}  // namespace

GridWalk::GridWalk(int size, uint64_t seed) : size_(size), rng_(seed) {}

void GridWalk::WriteObs(float* obs) const {
  const int cells = size_ * size_;
  std::fill(obs, obs + 2 * cells, 0.0f);
  obs[row_ * size_ + col_] = 1.0f;   // channel 0: the agent
  obs[cells + cells - 1] = 1.0f;     // channel 1: the goal, the last cell
}

void GridWalk::reset(float* obs) {
  // Any cell but the goal (the last one); rng() % n is the same on every standard library.
  const int cell = static_cast<int>(rng_() % static_cast<uint64_t>(size_ * size_ - 1));
  row_ = cell / size_;
  col_ = cell % size_;
  WriteObs(obs);
}

farm::StepResult GridWalk::step(const farm::ActionRef& action, float* obs) {
  switch (*action.discrete) {
    case kUp: row_ = std::max(row_ - 1, 0); break;
    case kRight: col_ = std::min(col_ + 1, size_ - 1); break;
    case kDown: row_ = std::min(row_ + 1, size_ - 1); break;
    case kLeft: col_ = std::max(col_ - 1, 0); break;
    default: throw std::out_of_range("GridWalk-v0: action outside [0, 4)");
  }
  WriteObs(obs);
  farm::StepResult result;
  result.terminated = row_ == size_ - 1 && col_ == size_ - 1;
  result.reward = result.terminated ? kGoalReward : kStepReward;
  return result;
}

void GridWalk::SetAgent(int row, int col, float* obs) {
  row_ = row;
  col_ = col;
  WriteObs(obs);
}

farm::EnvOptions GridWalkDefaultOptions() { return {{"size", GridWalk::kDefaultSize}}; }

farm::EnvSpec GridWalkSpec(const farm::EnvOptions& resolved) {
  const int size = SizeOption(resolved);
  farm::EnvSpec spec;
  spec.name = "GridWalk-v0";
  spec.observation = farm::Space::Box({2, size, size}, {0.0f}, {1.0f});
  spec.action = farm::Space::Discrete(4);
  spec.max_episode_steps = GridWalk::kMaxEpisodeSteps;
  // Solved: on average as good as the shortest walk from the farthest start
  // (the top-left corner, 2 * (size - 1) steps).
  spec.reward_threshold = 1.0 - 0.01 * (2 * (size - 1) - 1);
  return spec;
}

std::unique_ptr<farm::Env> MakeGridWalk(const farm::EnvOptions& resolved, uint64_t seed) {
  return std::make_unique<GridWalk>(SizeOption(resolved), seed);
}

FARM_REGISTER_ENV("GridWalk-v0", GridWalkDefaultOptions(), GridWalkSpec, MakeGridWalk);

}  // namespace farm_examples
