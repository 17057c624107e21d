// CartPole-v1 with Gymnasium's dynamics, constants and bounds (Barto, Sutton &
// Anderson 1983; gymnasium/envs/classic_control/cartpole.py), and
// CartPoleNoVel-v1, the same env with the velocities hidden.
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

// CartPoleNoVel-v1: CartPole-v1 with the two velocities removed from the
// observation, a partially observable task for recurrent policies (ppo.core),
// as rl-baselines3-zoo's CartPoleNoVel-v1 (CartPole-v1 behind a velocity
// mask) that SB3-contrib's RecurrentPPO is benchmarked on. The observation is
// [x, theta]: elements 0 and 2 of CartPole-v1's. Everything else is
// CartPole-v1's, by construction: it wraps a CartPole (the same dynamics, reset
// draws for a seed, reward of 1 per step, termination) and its spec is
// CartPoleSpec's with the observation cut down (Discrete(2), the 500-step time
// limit, reward_threshold 475). One observation holds no velocity, so a
// memoryless policy sees only where the pole is, not where it is going.
class CartPoleNoVel : public Env {
 public:
  // The elements of CartPole-v1's observation that this one keeps, in order.
  static constexpr std::array<int, 2> kObserved = {0, 2};  // x, theta

  explicit CartPoleNoVel(uint64_t seed);

  void reset(float* obs) override;
  StepResult step(const ActionRef& action, float* obs) override;

  // For tests: the wrapped CartPole-v1 (its full state, SetState).
  CartPole& cartpole() { return cartpole_; }

 private:
  void WriteObs(float* obs) const;

  CartPole cartpole_;
  std::array<float, 4> full_obs_{};  // the wrapped env's observation
};

// No options, like CartPole-v1. The spec is CartPoleSpec's with the
// observation Box [2] of CartPole-v1's bounds for x and theta.
EnvSpec CartPoleNoVelSpec(const EnvOptions& resolved);
std::unique_ptr<Env> MakeCartPoleNoVel(const EnvOptions& resolved, uint64_t seed);

}  // namespace farm
