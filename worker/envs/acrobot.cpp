// Acrobot-v1: Gymnasium's two-link swing-up task, registered as "Acrobot-v1".
#include "worker/envs/acrobot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "worker/random.h"

namespace farm {
namespace {

// The state with the torque appended: Gymnasium integrates the torque as a
// fifth component whose derivative is 0, so it stays constant over the step.
using Augmented = std::array<double, 5>;

// Gymnasium's _dsdt with book_or_nips == "book", term for term in its order
// (x**2 written as (x * x), grouped as Python evaluates it).
Augmented Derivatives(const Augmented& s) {
  constexpr double m1 = Acrobot::kLinkMass1;
  constexpr double m2 = Acrobot::kLinkMass2;
  constexpr double l1 = Acrobot::kLinkLength1;
  constexpr double lc1 = Acrobot::kLinkComPos1;
  constexpr double lc2 = Acrobot::kLinkComPos2;
  constexpr double I1 = Acrobot::kLinkMoi;
  constexpr double I2 = Acrobot::kLinkMoi;
  constexpr double g = Acrobot::kGravity;
  constexpr double pi = Acrobot::kPi;
  const double theta1 = s[0];
  const double theta2 = s[1];
  const double dtheta1 = s[2];
  const double dtheta2 = s[3];
  const double a = s[4];
  const double d1 = m1 * (lc1 * lc1) + m2 * (l1 * l1 + lc2 * lc2 + 2 * l1 * lc2 * std::cos(theta2)) + I1 + I2;
  const double d2 = m2 * (lc2 * lc2 + l1 * lc2 * std::cos(theta2)) + I2;
  const double phi2 = m2 * lc2 * g * std::cos(theta1 + theta2 - pi / 2.0);
  const double phi1 = -m2 * l1 * lc2 * (dtheta2 * dtheta2) * std::sin(theta2) -
                      2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * std::sin(theta2) +
                      (m1 * lc1 + m2 * l1) * g * std::cos(theta1 - pi / 2) + phi2;
  // "book" (and the Java implementation): includes the -m2 l1 lc2 dtheta1^2 sin(theta2) term.
  const double ddtheta2 = (a + d2 / d1 * phi1 - m2 * l1 * lc2 * (dtheta1 * dtheta1) * std::sin(theta2) - phi2) /
                          (m2 * (lc2 * lc2) + I2 - d2 * d2 / d1);
  const double ddtheta1 = -(d2 * ddtheta2 + phi1) / d1;
  return {dtheta1, dtheta2, ddtheta1, ddtheta2, 0.0};
}

// y + h * k, componentwise.
Augmented Axpy(const Augmented& y, double h, const Augmented& k) {
  Augmented out;
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = y[i] + h * k[i];
  return out;
}

// Gymnasium's rk4(derivs, y0, [0, dt]): one classic Runge-Kutta step.
Augmented Rk4(const Augmented& y0, double dt) {
  const double dt2 = dt / 2.0;
  const Augmented k1 = Derivatives(y0);
  const Augmented k2 = Derivatives(Axpy(y0, dt2, k1));
  const Augmented k3 = Derivatives(Axpy(y0, dt2, k2));
  const Augmented k4 = Derivatives(Axpy(y0, dt, k3));
  Augmented out;
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = y0[i] + dt / 6.0 * (k1[i] + 2 * k2[i] + 2 * k3[i] + k4[i]);
  return out;
}

// Gymnasium's wrap(x, m, M): shifts by whole periods until m <= x <= M (both
// ends kept as they are). The velocity bounds keep x within a few periods.
double Wrap(double x, double m, double M) {
  const double diff = M - m;
  while (x > M) x = x - diff;
  while (x < m) x = x + diff;
  return x;
}

}  // namespace

Acrobot::Acrobot(uint64_t seed) : rng_(seed) {}

void Acrobot::WriteObs(float* obs) const {
  obs[0] = static_cast<float>(std::cos(state_[0]));
  obs[1] = static_cast<float>(std::sin(state_[0]));
  obs[2] = static_cast<float>(std::cos(state_[1]));
  obs[3] = static_cast<float>(std::sin(state_[1]));
  obs[4] = static_cast<float>(state_[2]);
  obs[5] = static_cast<float>(state_[3]);
}

void Acrobot::reset(float* obs) {
  // Gymnasium draws in float64 and stores the reset state as float32
  // (.astype(np.float32)); the steps after it run in float64.
  for (double& s : state_) s = static_cast<float>(UniformReal(rng_, -kResetBound, kResetBound));
  WriteObs(obs);
}

StepResult Acrobot::step(const ActionRef& action, float* obs) {
  const int64_t a = *action.discrete;
  // EnvGroup checks actions against the spec; this catches direct callers.
  if (a < 0 || a >= static_cast<int64_t>(kTorques.size()))
    throw std::out_of_range(fmt::format("Acrobot-v1: action {} outside [0, {})", a, kTorques.size()));
  const Augmented next = Rk4({state_[0], state_[1], state_[2], state_[3], kTorques[a]}, kDt);
  state_[0] = Wrap(next[0], -kPi, kPi);
  state_[1] = Wrap(next[1], -kPi, kPi);
  state_[2] = std::min(std::max(next[2], -kMaxVel1), kMaxVel1);
  state_[3] = std::min(std::max(next[3], -kMaxVel2), kMaxVel2);
  WriteObs(obs);

  StepResult result;
  // The free end is more than one link length above the pivot.
  result.terminated = -std::cos(state_[0]) - std::cos(state_[1] + state_[0]) > 1.0;
  result.reward = result.terminated ? 0.0f : -1.0f;
  return result;
}

EnvSpec AcrobotSpec(const EnvOptions& /*resolved*/) {
  const float v1 = static_cast<float>(Acrobot::kMaxVel1);
  const float v2 = static_cast<float>(Acrobot::kMaxVel2);
  EnvSpec spec;
  spec.name = "Acrobot-v1";
  spec.observation = Space::Box({6}, {-1, -1, -1, -1, -v1, -v2}, {1, 1, 1, 1, v1, v2});
  spec.action = Space::Discrete(3);
  spec.max_episode_steps = Acrobot::kMaxEpisodeSteps;
  spec.reward_threshold = Acrobot::kRewardThreshold;
  return spec;
}

std::unique_ptr<Env> MakeAcrobot(const EnvOptions& /*options*/, uint64_t seed) {
  return std::make_unique<Acrobot>(seed);
}

FARM_REGISTER_ENV("Acrobot-v1", EnvOptions{}, AcrobotSpec, MakeAcrobot);

}  // namespace farm
