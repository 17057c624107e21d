// Acrobot-v1 with Gymnasium's "book" dynamics, RK4 integration, constants and
// bounds (Sutton 1996; gymnasium/envs/classic_control/acrobot.py).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <random>

#include "worker/env.h"

namespace farm {

class Acrobot : public Env {
 public:
  static constexpr double kDt = 0.2;  // seconds per step, one RK4 step
  static constexpr double kLinkLength1 = 1.0;
  static constexpr double kLinkMass1 = 1.0;
  static constexpr double kLinkMass2 = 1.0;
  static constexpr double kLinkComPos1 = 0.5;  // centre of mass of link 1
  static constexpr double kLinkComPos2 = 0.5;
  static constexpr double kLinkMoi = 1.0;  // moment of inertia of either link
  static constexpr double kGravity = 9.8;
  static constexpr double kPi = 3.14159265358979323846;
  static constexpr double kMaxVel1 = 4 * kPi;
  static constexpr double kMaxVel2 = 9 * kPi;
  static constexpr std::array<double, 3> kTorques = {-1.0, 0.0, 1.0};  // per action
  static constexpr double kResetBound = 0.1;
  static constexpr int kMaxEpisodeSteps = 500;
  static constexpr double kRewardThreshold = -100.0;

  explicit Acrobot(uint64_t seed);

  // State is [theta1, theta2, theta1_dot, theta2_dot] in double; the
  // observation is [cos theta1, sin theta1, cos theta2, sin theta2,
  // theta1_dot, theta2_dot] cast to float32.
  void reset(float* obs) override;
  // Action 0, 1, 2 applies torque -1, 0, +1 to the joint between the links.
  // Throws std::out_of_range for another action.
  StepResult step(const ActionRef& action, float* obs) override;

  // For tests: place the system in a known state.
  void SetState(const std::array<double, 4>& state) { state_ = state; }
  const std::array<double, 4>& State() const { return state_; }

 private:
  void WriteObs(float* obs) const;

  std::array<double, 4> state_{};
  std::mt19937_64 rng_;
};

// Acrobot-v1 takes no options: its defaults are empty and its spec is fixed.
EnvSpec AcrobotSpec(const EnvOptions& resolved);
std::unique_ptr<Env> MakeAcrobot(const EnvOptions& resolved, uint64_t seed);

}  // namespace farm
