// Pendulum-v1: Gymnasium's torque-limited pendulum swing-up, registered as "Pendulum-v1".
#include "worker/envs/pendulum.h"

#include <algorithm>
#include <cmath>

#include "worker/random.h"

namespace farm {
namespace {

// Python's float x % m for m > 0: the remainder takes the sign of m (fmod
// takes the sign of x), as numpy's and CPython's float remainder compute it.
double PyMod(double x, double m) {
  double r = std::fmod(x, m);
  if (r != 0) {
    if (r < 0) r += m;
  } else {
    r = 0.0;  // +0, the sign of m
  }
  return r;
}

// Gymnasium's angle_normalize: ((x + pi) % (2 pi)) - pi, into [-pi, pi).
double AngleNormalize(double x) { return PyMod(x + Pendulum::kPi, 2 * Pendulum::kPi) - Pendulum::kPi; }

}  // namespace

Pendulum::Pendulum(uint64_t seed) : rng_(seed) {}

void Pendulum::WriteObs(float* obs) const {
  obs[0] = static_cast<float>(std::cos(state_[0]));
  obs[1] = static_cast<float>(std::sin(state_[0]));
  obs[2] = static_cast<float>(state_[1]);
}

void Pendulum::reset(float* obs) {
  const double theta = UniformReal(rng_, -kResetTheta, kResetTheta);
  const double theta_dot = UniformReal(rng_, -kResetThetaDot, kResetThetaDot);
  state_ = {theta, theta_dot};
  WriteObs(obs);
}

StepResult Pendulum::step(const ActionRef& action, float* obs) {
  const auto [th, thdot] = state_;
  constexpr double g = kGravity;
  constexpr double m = kMass;
  constexpr double l = kLength;
  constexpr double dt = kDt;
  const double u = std::clamp(static_cast<double>(action.continuous[0]), -kMaxTorque, kMaxTorque);
  // The cost is of the state before the step (and the clipped torque).
  const double normalized = AngleNormalize(th);
  const double cost = normalized * normalized + 0.1 * (thdot * thdot) + 0.001 * (u * u);

  double newthdot = thdot + (3 * g / (2 * l) * std::sin(th) + 3.0 / (m * (l * l)) * u) * dt;
  newthdot = std::clamp(newthdot, -kMaxSpeed, kMaxSpeed);
  const double newth = th + newthdot * dt;  // with the new, clipped velocity
  state_ = {newth, newthdot};
  WriteObs(obs);

  StepResult result;
  result.reward = static_cast<float>(-cost);
  result.terminated = false;  // only the time limit ends an episode
  return result;
}

EnvSpec PendulumSpec(const EnvOptions& /*resolved*/) {
  const float speed = static_cast<float>(Pendulum::kMaxSpeed);
  const float torque = static_cast<float>(Pendulum::kMaxTorque);
  EnvSpec spec;
  spec.name = "Pendulum-v1";
  spec.observation = Space::Box({3}, {-1, -1, -speed}, {1, 1, speed});
  spec.action = Space::Box({1}, {-torque}, {torque});
  spec.max_episode_steps = Pendulum::kMaxEpisodeSteps;
  spec.reward_threshold = std::nullopt;  // Gymnasium registers none
  return spec;
}

std::unique_ptr<Env> MakePendulum(const EnvOptions& /*options*/, uint64_t seed) {
  return std::make_unique<Pendulum>(seed);
}

FARM_REGISTER_ENV("Pendulum-v1", EnvOptions{}, PendulumSpec, MakePendulum);

}  // namespace farm
