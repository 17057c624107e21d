// CartPole-v1: Gymnasium's Euler-integrated cart-pole, registered as "CartPole-v1"; and
// "CartPoleNoVel-v1", the same env observed without its velocities.
#include "worker/envs/cartpole.h"

#include <cmath>
#include <cstddef>
#include <limits>
#include <utility>
#include <vector>

#include "worker/random.h"

namespace farm {
CartPole::CartPole(uint64_t seed) : rng_(seed) {}

void CartPole::WriteObs(float* obs) const {
  for (int k = 0; k < 4; ++k) obs[k] = static_cast<float>(state_[k]);
}

void CartPole::reset(float* obs) {
  for (double& s : state_) s = UniformReal(rng_, -kResetBound, kResetBound);
  WriteObs(obs);
}

StepResult CartPole::step(const ActionRef& action, float* obs) {
  const auto [x, x_dot, theta, theta_dot] = state_;
  const double force = *action.discrete == 1 ? kForceMag : -kForceMag;
  const double costheta = std::cos(theta);
  const double sintheta = std::sin(theta);
  const double temp = (force + kPoleMassLength * theta_dot * theta_dot * sintheta) / kTotalMass;
  const double thetaacc =
      (kGravity * sintheta - costheta * temp) / (kLength * (4.0 / 3.0 - kMassPole * costheta * costheta / kTotalMass));
  const double xacc = temp - kPoleMassLength * thetaacc * costheta / kTotalMass;
  // Explicit Euler: positions advance with the old velocities.
  state_ = {x + kTau * x_dot, x_dot + kTau * xacc, theta + kTau * theta_dot, theta_dot + kTau * thetaacc};
  WriteObs(obs);

  const double nx = state_[0];
  const double ntheta = state_[2];
  StepResult result;
  result.terminated = nx < -kXThreshold || nx > kXThreshold || ntheta < -kThetaThreshold || ntheta > kThetaThreshold;
  result.reward = 1.0f;  // v1 rewards the terminating step too
  return result;
}

EnvSpec CartPoleSpec(const EnvOptions& /*resolved*/) {
  constexpr float kFloatMax = std::numeric_limits<float>::max();
  const float x_high = static_cast<float>(CartPole::kXThreshold * 2);
  const float theta_high = static_cast<float>(CartPole::kThetaThreshold * 2);
  EnvSpec spec;
  spec.name = "CartPole-v1";
  spec.observation =
      Space::Box({4}, {-x_high, -kFloatMax, -theta_high, -kFloatMax}, {x_high, kFloatMax, theta_high, kFloatMax});
  spec.action = Space::Discrete(2);
  spec.max_episode_steps = CartPole::kMaxEpisodeSteps;
  spec.reward_threshold = CartPole::kRewardThreshold;
  return spec;
}

std::unique_ptr<Env> MakeCartPole(const EnvOptions& /*options*/, uint64_t seed) {
  return std::make_unique<CartPole>(seed);
}

FARM_REGISTER_ENV("CartPole-v1", EnvOptions{}, CartPoleSpec, MakeCartPole);

// ---------------------------------------------------------------------------
// CartPoleNoVel-v1: the wrapped CartPole steps; only the observation differs.

CartPoleNoVel::CartPoleNoVel(uint64_t seed) : cartpole_(seed) {}

void CartPoleNoVel::WriteObs(float* obs) const {
  for (std::size_t k = 0; k < kObserved.size(); ++k) obs[k] = full_obs_[kObserved[k]];
}

void CartPoleNoVel::reset(float* obs) {
  cartpole_.reset(full_obs_.data());
  WriteObs(obs);
}

StepResult CartPoleNoVel::step(const ActionRef& action, float* obs) {
  const StepResult result = cartpole_.step(action, full_obs_.data());
  WriteObs(obs);
  return result;
}

EnvSpec CartPoleNoVelSpec(const EnvOptions& resolved) {
  EnvSpec spec = CartPoleSpec(resolved);  // CartPole-v1's action, time limit and threshold
  spec.name = "CartPoleNoVel-v1";
  std::vector<float> low, high;
  for (int k : CartPoleNoVel::kObserved) {
    low.push_back(spec.observation.low[k]);
    high.push_back(spec.observation.high[k]);
  }
  const int64_t numel = static_cast<int64_t>(low.size());  // before the moves below
  spec.observation = Space::Box({numel}, std::move(low), std::move(high));
  return spec;
}

std::unique_ptr<Env> MakeCartPoleNoVel(const EnvOptions& /*options*/, uint64_t seed) {
  return std::make_unique<CartPoleNoVel>(seed);
}

FARM_REGISTER_ENV("CartPoleNoVel-v1", EnvOptions{}, CartPoleNoVelSpec, MakeCartPoleNoVel);

}  // namespace farm
