// MountainCar-v0 with Gymnasium's dynamics, constants and bounds (Moore 1990;
// gymnasium/envs/classic_control/mountain_car.py).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <random>

#include "worker/env.h"

namespace farm {

class MountainCar : public Env {
 public:
  static constexpr double kMinPosition = -1.2;
  static constexpr double kMaxPosition = 0.6;
  static constexpr double kMaxSpeed = 0.07;
  static constexpr double kGoalPosition = 0.5;
  static constexpr double kGoalVelocity = 0.0;
  static constexpr double kForce = 0.001;
  static constexpr double kGravity = 0.0025;
  static constexpr double kResetLow = -0.6;  // reset position range; velocity starts at 0
  static constexpr double kResetHigh = -0.4;
  static constexpr int kMaxEpisodeSteps = 200;
  static constexpr double kRewardThreshold = -110.0;

  explicit MountainCar(uint64_t seed);

  // State is [position, velocity] in double; observations are its float32 cast.
  void reset(float* obs) override;
  // Action 0 accelerates left, 1 not at all, 2 right. Throws std::out_of_range
  // for another action.
  StepResult step(const ActionRef& action, float* obs) override;

  // For tests: place the car in a known state.
  void SetState(const std::array<double, 2>& state) { state_ = state; }
  const std::array<double, 2>& State() const { return state_; }

 private:
  void WriteObs(float* obs) const;

  std::array<double, 2> state_{};
  std::mt19937_64 rng_;
};

// MountainCar-v0 takes no options: its defaults are empty and its spec is fixed.
EnvSpec MountainCarSpec(const EnvOptions& resolved);
std::unique_ptr<Env> MakeMountainCar(const EnvOptions& resolved, uint64_t seed);

}  // namespace farm
