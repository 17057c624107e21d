// CartPole-v1 with Gymnasium's dynamics, constants and bounds (Barto, Sutton &
// Anderson 1983; gymnasium/envs/classic_control/cartpole.py).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <random>

#include "worker/env.h"

namespace farm {

class CartPole : public Env {
 public:
  static constexpr double kGravity = 9.8;
  static constexpr double kMassCart = 1.0;
  static constexpr double kMassPole = 0.1;
  static constexpr double kTotalMass = kMassCart + kMassPole;
  static constexpr double kLength = 0.5;  // half the pole's length
  static constexpr double kPoleMassLength = kMassPole * kLength;
  static constexpr double kForceMag = 10.0;
  static constexpr double kTau = 0.02;  // seconds per step
  static constexpr double kPi = 3.14159265358979323846;
  static constexpr double kThetaThreshold = 12 * 2 * kPi / 360;  // 12 degrees
  static constexpr double kXThreshold = 2.4;
  static constexpr double kResetBound = 0.05;
  static constexpr int kMaxEpisodeSteps = 500;
  static constexpr double kRewardThreshold = 475.0;

  explicit CartPole(uint64_t seed);

  // State is [x, x_dot, theta, theta_dot], kept in double as Gymnasium does;
  // observations are its float32 cast.
  void reset(float* obs) override;
  // Action 0 pushes the cart left, 1 pushes it right.
  StepResult step(const ActionRef& action, float* obs) override;

  // For tests: place the system in a known state.
  void SetState(const std::array<double, 4>& state) { state_ = state; }
  const std::array<double, 4>& State() const { return state_; }

 private:
  void WriteObs(float* obs) const;

  std::array<double, 4> state_{};
  std::mt19937_64 rng_;
};

// CartPole-v1 takes no options: its defaults are empty and its spec is fixed.
EnvSpec CartPoleSpec(const EnvOptions& resolved);
std::unique_ptr<Env> MakeCartPole(const EnvOptions& resolved, uint64_t seed);

}  // namespace farm
