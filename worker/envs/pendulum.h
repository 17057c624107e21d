// Pendulum-v1 with Gymnasium's dynamics, cost, constants and bounds
// (gymnasium/envs/classic_control/pendulum.py).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <random>

#include "worker/env.h"

namespace farm {

class Pendulum : public Env {
 public:
  static constexpr double kMaxSpeed = 8.0;
  static constexpr double kMaxTorque = 2.0;
  static constexpr double kDt = 0.05;
  static constexpr double kGravity = 10.0;
  static constexpr double kMass = 1.0;
  static constexpr double kLength = 1.0;
  static constexpr double kPi = 3.14159265358979323846;
  static constexpr double kResetTheta = kPi;     // reset theta ~ U[-pi, pi]
  static constexpr double kResetThetaDot = 1.0;  // reset theta_dot ~ U[-1, 1]
  static constexpr int kMaxEpisodeSteps = 200;

  explicit Pendulum(uint64_t seed);

  // State is [theta, theta_dot] in double (theta 0 is upright and is never
  // wrapped, as in Gymnasium); the observation is [cos theta, sin theta,
  // theta_dot] cast to float32.
  void reset(float* obs) override;
  // The action is one torque, clipped here to [-2, 2] (the learner sends
  // unclipped samples). Never terminates.
  StepResult step(const ActionRef& action, float* obs) override;

  // For tests: place the pendulum in a known state.
  void SetState(const std::array<double, 2>& state) { state_ = state; }
  const std::array<double, 2>& State() const { return state_; }

 private:
  void WriteObs(float* obs) const;

  std::array<double, 2> state_{};
  std::mt19937_64 rng_;
};

// Pendulum-v1 takes no options: its defaults are empty and its spec is fixed
// (no reward threshold).
EnvSpec PendulumSpec(const EnvOptions& resolved);
std::unique_ptr<Env> MakePendulum(const EnvOptions& resolved, uint64_t seed);

}  // namespace farm
