// MountainCar-v0: Gymnasium's under-powered car in a valley, registered as "MountainCar-v0".
#include "worker/envs/mountain_car.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "worker/random.h"

namespace farm {

MountainCar::MountainCar(uint64_t seed) : rng_(seed) {}

void MountainCar::WriteObs(float* obs) const {
  obs[0] = static_cast<float>(state_[0]);
  obs[1] = static_cast<float>(state_[1]);
}

void MountainCar::reset(float* obs) {
  state_ = {UniformReal(rng_, kResetLow, kResetHigh), 0.0};
  WriteObs(obs);
}

StepResult MountainCar::step(const ActionRef& action, float* obs) {
  const int64_t a = *action.discrete;
  // EnvGroup checks actions against the spec; this catches direct callers.
  if (a < 0 || a > 2) throw std::out_of_range(fmt::format("MountainCar-v0: action {} outside [0, 3)", a));
  auto [position, velocity] = state_;
  // Semi-implicit Euler: the position moves with the new (clipped) velocity.
  velocity += static_cast<double>(a - 1) * kForce + std::cos(3 * position) * (-kGravity);
  velocity = std::clamp(velocity, -kMaxSpeed, kMaxSpeed);
  position += velocity;
  position = std::clamp(position, kMinPosition, kMaxPosition);
  // An inelastic wall on the left; the right edge is past the goal.
  if (position == kMinPosition && velocity < 0) velocity = 0;
  state_ = {position, velocity};
  WriteObs(obs);

  StepResult result;
  result.terminated = position >= kGoalPosition && velocity >= kGoalVelocity;
  result.reward = -1.0f;  // the terminating step too
  return result;
}

EnvSpec MountainCarSpec(const EnvOptions& /*resolved*/) {
  EnvSpec spec;
  spec.name = "MountainCar-v0";
  spec.observation =
      Space::Box({2}, {static_cast<float>(MountainCar::kMinPosition), -static_cast<float>(MountainCar::kMaxSpeed)},
                 {static_cast<float>(MountainCar::kMaxPosition), static_cast<float>(MountainCar::kMaxSpeed)});
  spec.action = Space::Discrete(3);
  spec.max_episode_steps = MountainCar::kMaxEpisodeSteps;
  spec.reward_threshold = MountainCar::kRewardThreshold;
  return spec;
}

std::unique_ptr<Env> MakeMountainCar(const EnvOptions& /*options*/, uint64_t seed) {
  return std::make_unique<MountainCar>(seed);
}

FARM_REGISTER_ENV("MountainCar-v0", EnvOptions{}, MountainCarSpec, MakeMountainCar);

}  // namespace farm
