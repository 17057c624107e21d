// Tests for Acrobot-v1, MountainCar-v0 and Pendulum-v1 against Gymnasium's
// published equations: single steps from known states, termination on both
// sides of each threshold, angle wrapping and velocity clipping, reset ranges,
// spaces, and time-limit truncation through EnvGroup.
//
// Expected values come from two places, both independent of the env code:
//  - the equations written out again in this file (for Acrobot, a separate RK4
//    and "book" dynamics with the constants folded in, see AcrobotReference);
//  - literal values printed by a plain-Python float64 transcription of
//    Gymnasium's acrobot.py / mountain_car.py / pendulum.py step functions
//    (python3 with the math module only, no numpy), marked "Python" below.
#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "worker/env.h"
#include "worker/env_group.h"
#include "worker/envs/acrobot.h"
#include "worker/envs/mountain_car.h"
#include "worker/envs/pendulum.h"

namespace farm {
namespace {

constexpr double kPi = 3.14159265358979323846;

template <std::size_t N>
void CheckState(const std::array<double, N>& got, const std::array<double, N>& want, double tol = 1e-12) {
  for (std::size_t k = 0; k < N; ++k) {
    INFO("state component " << k << ": got " << got[k] << ", want " << want[k]);
    CHECK(got[k] == Approx(want[k]).margin(tol).epsilon(tol));
  }
}

std::unique_ptr<EnvGroup> MakeGroup(const std::string& name, int n, uint64_t seed) {
  std::unique_ptr<EnvGroup> group;
  const Status s = EnvGroup::Create(name, {}, n, seed, &group);
  INFO(s.ToString());
  REQUIRE(s.ok());
  REQUIRE(group != nullptr);
  return group;
}

std::vector<float> Row(const float* data, int64_t numel, int i) {
  return std::vector<float>(data + i * numel, data + (i + 1) * numel);
}

// The result of one step of a fresh env placed in `state`.
template <std::size_t N, std::size_t M>
struct StepOut {
  std::array<double, N> state;
  std::array<float, M> obs;
  StepResult result;
};

// ===========================================================================
// Acrobot-v1 reference: the "book" equations of Sutton & Barto with
// Gymnasium's constants (m1 = m2 = 1, l1 = 1, lc1 = lc2 = 0.5, I1 = I2 = 1,
// g = 9.8) folded in by hand, cos(x - pi/2) written as sin(x), and a generic
// RK4 that keeps the torque outside the state. Structured differently from the
// env on purpose, so a shared mistake is unlikely.
//   d1   = 0.25 + (1 + 0.25 + cos t2) + 2          = 3.5 + cos t2
//   d2   = (0.25 + 0.5 cos t2) + 1                 = 1.25 + 0.5 cos t2
//   phi2 = 0.5 * 9.8 * sin(t1 + t2)                = 4.9 sin(t1 + t2)
//   phi1 = -0.5 w2^2 sin t2 - w2 w1 sin t2 + 1.5 * 9.8 sin t1 + phi2
//   a2   = (tau + d2/d1 phi1 - 0.5 w1^2 sin t2 - phi2) / (0.25 + 1 - d2^2/d1)
//   a1   = -(d2 a2 + phi1) / d1
using State4 = std::array<double, 4>;

State4 AcrobotDerivs(const State4& s, double tau) {
  const double t1 = s[0], t2 = s[1], w1 = s[2], w2 = s[3];
  const double d1 = 3.5 + std::cos(t2);
  const double d2 = 1.25 + 0.5 * std::cos(t2);
  const double phi2 = 4.9 * std::sin(t1 + t2);
  const double phi1 = -0.5 * std::sin(t2) * w2 * (w2 + 2 * w1) + 14.7 * std::sin(t1) + phi2;
  const double a2 = (tau + d2 / d1 * phi1 - 0.5 * w1 * w1 * std::sin(t2) - phi2) / (1.25 - d2 * d2 / d1);
  const double a1 = -(d2 * a2 + phi1) / d1;
  return {w1, w2, a1, a2};
}

template <class F>
State4 Rk4Step(F f, const State4& y, double h) {
  auto shifted = [&](const State4& k, double c) {
    State4 out;
    for (int i = 0; i < 4; ++i) out[i] = y[i] + c * k[i];
    return out;
  };
  const State4 k1 = f(y);
  const State4 k2 = f(shifted(k1, h / 2));
  const State4 k3 = f(shifted(k2, h / 2));
  const State4 k4 = f(shifted(k3, h));
  State4 out;
  for (int i = 0; i < 4; ++i) out[i] = y[i] + h * (k1[i] + 2 * k2[i] + 2 * k3[i] + k4[i]) / 6;
  return out;
}

// One step before wrapping and clipping.
State4 AcrobotUnwrapped(const State4& s, int action) {
  const double tau = action - 1.0;  // actions 0, 1, 2 -> torques -1, 0, +1
  return Rk4Step([tau](const State4& y) { return AcrobotDerivs(y, tau); }, s, 0.2);
}

// One full step: angles into [-pi, pi] (IEEE remainder), velocities clipped.
State4 AcrobotReference(const State4& s, int action) {
  State4 n = AcrobotUnwrapped(s, action);
  n[0] = std::remainder(n[0], 2 * kPi);
  n[1] = std::remainder(n[1], 2 * kPi);
  n[2] = std::clamp(n[2], -4 * kPi, 4 * kPi);
  n[3] = std::clamp(n[3], -9 * kPi, 9 * kPi);
  return n;
}

double AcrobotHeight(const State4& s) { return -std::cos(s[0]) - std::cos(s[0] + s[1]); }

StepOut<4, 6> AcrobotStep(const State4& state, int64_t action) {
  Acrobot env(/*seed=*/1);
  env.SetState(state);
  StepOut<4, 6> out;
  ActionRef a;
  a.discrete = &action;
  out.result = env.step(a, out.obs.data());
  out.state = env.State();
  return out;
}

void CheckAcrobotObs(const std::array<float, 6>& obs, const State4& s) {
  CHECK(obs[0] == static_cast<float>(std::cos(s[0])));
  CHECK(obs[1] == static_cast<float>(std::sin(s[0])));
  CHECK(obs[2] == static_cast<float>(std::cos(s[1])));
  CHECK(obs[3] == static_cast<float>(std::sin(s[1])));
  CHECK(obs[4] == static_cast<float>(s[2]));
  CHECK(obs[5] == static_cast<float>(s[3]));
}

// ===========================================================================
// MountainCar-v0 and Pendulum-v1 written out from the published equations.
using State2 = std::array<double, 2>;

State2 MountainCarHand(const State2& s, int action) {
  double v = s[1] + (action - 1) * 0.001 - 0.0025 * std::cos(3 * s[0]);
  v = std::min(std::max(v, -0.07), 0.07);
  double p = std::min(std::max(s[0] + v, -1.2), 0.6);
  if (p == -1.2 && v < 0) v = 0;
  return {p, v};
}

StepOut<2, 2> MountainCarStep(const State2& state, int64_t action) {
  MountainCar env(/*seed=*/1);
  env.SetState(state);
  StepOut<2, 2> out;
  ActionRef a;
  a.discrete = &action;
  out.result = env.step(a, out.obs.data());
  out.state = env.State();
  return out;
}

// Angle into [-pi, pi) as ((x + pi) mod 2 pi) - pi with a non-negative modulus.
double NormalizeAngle(double x) { return x - 2 * kPi * std::floor((x + kPi) / (2 * kPi)); }

struct PendulumHand {
  State2 next;
  double reward;
};

// theta_dot' = clip(theta_dot + (3 g / (2 l) sin theta + 3 / (m l^2) u) dt, +-8),
// theta' = theta + theta_dot' dt, with g = 10, m = l = 1, dt = 0.05, u clipped to +-2;
// cost on the pre-step state.
PendulumHand PendulumStepHand(const State2& s, double u_raw) {
  const double u = std::min(std::max(u_raw, -2.0), 2.0);
  const double th = s[0], thdot = s[1];
  const double cost = std::pow(NormalizeAngle(th), 2) + 0.1 * thdot * thdot + 0.001 * u * u;
  const double newthdot = std::min(std::max(thdot + (15.0 * std::sin(th) + 3.0 * u) * 0.05, -8.0), 8.0);
  return {{th + newthdot * 0.05, newthdot}, -cost};
}

StepOut<2, 3> PendulumStep(const State2& state, float u) {
  Pendulum env(/*seed=*/1);
  env.SetState(state);
  StepOut<2, 3> out;
  ActionRef a;
  a.continuous = &u;
  out.result = env.step(a, out.obs.data());
  out.state = env.State();
  return out;
}

void CheckPendulumObs(const std::array<float, 3>& obs, const State2& s) {
  CHECK(obs[0] == static_cast<float>(std::cos(s[0])));
  CHECK(obs[1] == static_cast<float>(std::sin(s[0])));
  CHECK(obs[2] == static_cast<float>(s[1]));
}

}  // namespace

// ===========================================================================
// Registry

TEST_CASE("Classic control: the three envs are registered without options", "[env][classic]") {
  for (const char* name : {"Acrobot-v1", "MountainCar-v0", "Pendulum-v1"}) {
    INFO(name);
    const EnvFamily* family = EnvRegistry::Global().Find(name);
    REQUIRE(family != nullptr);  // also proves the whole-archive link kept the registration
    CHECK(family->default_options.empty());
    CHECK(family->spec(family->default_options).name == name);
    std::unique_ptr<EnvGroup> group;
    const Status s = EnvGroup::Create(name, {{"gravity", 1}}, 1, 0, &group);
    CHECK(s.code() == Status::Code::kInvalidArgument);
  }
}

// ===========================================================================
// Acrobot-v1

TEST_CASE("Acrobot: spec has Gymnasium's spaces and limits", "[env][acrobot]") {
  const EnvFamily* family = EnvRegistry::Global().Find("Acrobot-v1");
  REQUIRE(family != nullptr);
  const EnvSpec spec = family->spec({});
  CHECK(spec.action == Space::Discrete(3));
  CHECK(spec.max_episode_steps == 500);
  REQUIRE(spec.reward_threshold.has_value());
  CHECK(*spec.reward_threshold == -100.0);
  REQUIRE(spec.observation.shape == std::vector<int64_t>{6});
  const float v1 = static_cast<float>(4 * kPi), v2 = static_cast<float>(9 * kPi);
  CHECK(spec.observation.high == std::vector<float>{1, 1, 1, 1, v1, v2});
  CHECK(spec.observation.low == std::vector<float>{-1, -1, -1, -1, -v1, -v2});
}

TEST_CASE("Acrobot: one RK4 step matches the book dynamics", "[env][acrobot]") {
  SECTION("each torque from a small state (Python values)") {
    const State4 s0 = {0.1, -0.2, 0.3, -0.4};
    const std::array<State4, 3> python = {{
        {0.1544280535176176, -0.2796784625217692, 0.23102745634235644, -0.37533176739803126},
        {0.14133727125464293, -0.24579623350293564, 0.10409525473601286, -0.044953761560451166},
        {0.1282116312891261, -0.211840321026976, -0.023484731535001357, 0.28679521459777013},
    }};
    for (int action = 0; action < 3; ++action) {
      INFO("action " << action);
      const auto got = AcrobotStep(s0, action);
      CheckState(got.state, python[action]);
      CheckState(got.state, AcrobotReference(s0, action));
      CheckAcrobotObs(got.obs, got.state);
      CHECK_FALSE(got.result.terminated);
      CHECK(got.result.reward == -1.0f);
    }
    // The torque matters: the three results differ well beyond rounding.
    CHECK(std::abs(python[0][3] - python[2][3]) > 0.5);
  }

  SECTION("from rest, positive torque: the joint turns one way, link 1 the other") {
    const auto got = AcrobotStep({0, 0, 0, 0}, 2);
    // Python: rk4 over [0, 0.2] with torque +1 appended.
    CheckState(got.state, {-0.013262967177227795, 0.03428722934738544, -0.12866185280996106, 0.33450108998660194});
    CheckState(got.state, AcrobotReference({0, 0, 0, 0}, 2));
    CHECK(got.state[1] > 0);
    CHECK(got.state[0] < 0);
  }

  SECTION("large angles and velocities") {
    struct Case {
      State4 s;
      int action;
      State4 python;
    };
    const std::vector<Case> cases = {
        {{1.0, 2.0, -3.0, 5.0}, 2, {0.2993650507740271, 3.0272342744176823, -3.901882403673358, 5.295454690453669}},
        {{-2.5, 0.7, 6.0, -12.0}, 0, {-1.2196002801768155, -1.6983484701267877, 6.52645030331797, -10.832688464738743}},
    };
    for (const Case& c : cases) {
      INFO("from " << c.s[0] << ", " << c.s[1] << ", " << c.s[2] << ", " << c.s[3] << " action " << c.action);
      const auto got = AcrobotStep(c.s, c.action);
      CheckState(got.state, c.python);
      CheckState(got.state, AcrobotReference(c.s, c.action));
      CheckAcrobotObs(got.obs, got.state);
      CHECK(got.result.terminated == (AcrobotHeight(c.python) > 1.0));
    }
  }

  SECTION("a sweep of states agrees with the reference") {
    std::mt19937_64 rng(17);
    std::uniform_real_distribution<double> angle(-kPi, kPi), w1(-4 * kPi, 4 * kPi), w2(-9 * kPi, 9 * kPi);
    for (int i = 0; i < 300; ++i) {
      const State4 s = {angle(rng), angle(rng), w1(rng), w2(rng)};
      const int action = i % 3;
      INFO("case " << i);
      const auto got = AcrobotStep(s, action);
      const State4 want = AcrobotReference(s, action);
      // Angles compared on the circle: a result right at +-pi may wrap either way.
      for (int k = 0; k < 2; ++k) CHECK(std::remainder(got.state[k] - want[k], 2 * kPi) == Approx(0).margin(1e-10));
      CHECK(got.state[2] == Approx(want[2]).margin(1e-10).epsilon(1e-12));
      CHECK(got.state[3] == Approx(want[3]).margin(1e-10).epsilon(1e-12));
      CHECK(got.result.terminated == (AcrobotHeight(want) > 1.0));
      CHECK(got.result.reward == (got.result.terminated ? 0.0f : -1.0f));
    }
  }

  SECTION("a bad action throws") {
    Acrobot env(1);
    std::array<float, 6> obs{};
    env.reset(obs.data());
    for (int64_t bad : {-1, 3}) {
      ActionRef a;
      a.discrete = &bad;
      CHECK_THROWS_AS(env.step(a, obs.data()), std::out_of_range);
    }
  }
}

TEST_CASE("Acrobot: terminates just above height 1, not just below", "[env][acrobot]") {
  // Start at rest with link 1 at angle x (link 2 straight) and apply no torque;
  // the height after the step, f(x), is below 1 at x = pi/2 (horizontal,
  // falling) and 2 at x = pi (upright, at rest). Bisect for f(x) = 1 on the
  // reference, then step the env from either side of the crossing.
  auto height_after = [](double x) { return AcrobotHeight(AcrobotReference({x, 0, 0, 0}, 1)); };
  double lo = kPi / 2, hi = kPi;
  REQUIRE(height_after(lo) < 1.0);
  REQUIRE(height_after(hi) > 1.0);
  for (int i = 0; i < 60; ++i) {
    const double mid = 0.5 * (lo + hi);
    (height_after(mid) > 1.0 ? hi : lo) = mid;
  }
  const double below = lo - 1e-8, above = hi + 1e-8;
  // Both within 1e-6 of the threshold, on opposite sides with room for rounding.
  REQUIRE(height_after(below) < 1.0 - 1e-12);
  REQUIRE(height_after(below) > 1.0 - 1e-6);
  REQUIRE(height_after(above) > 1.0 + 1e-12);
  REQUIRE(height_after(above) < 1.0 + 1e-6);

  const auto out_below = AcrobotStep({below, 0, 0, 0}, 1);
  CHECK_FALSE(out_below.result.terminated);
  CHECK(out_below.result.reward == -1.0f);
  const auto out_above = AcrobotStep({above, 0, 0, 0}, 1);
  CHECK(out_above.result.terminated);
  CHECK(out_above.result.reward == 0.0f);  // the terminal step pays 0
  CheckState(out_above.state, AcrobotReference({above, 0, 0, 0}, 1));

  // Mirror image: the same on the other side.
  CHECK_FALSE(AcrobotStep({-below, 0, 0, 0}, 1).result.terminated);
  CHECK(AcrobotStep({-above, 0, 0, 0}, 1).result.terminated);

  // The height is of the post-step state: starting upright but swinging down fast ends below.
  const auto swung = AcrobotStep({kPi, 0, 4 * kPi, 0}, 1);
  CHECK(AcrobotHeight(swung.state) < 1.0);
  CHECK_FALSE(swung.result.terminated);
}

TEST_CASE("Acrobot: angles wrap into [-pi, pi], velocities clip to 4 pi and 9 pi", "[env][acrobot]") {
  SECTION("theta1 past +pi and past -pi") {
    // Python: unwrapped theta1 3.8151891608955495 -> -2.4679961462840367 (one period).
    const auto up = AcrobotStep({3.0, 0.0, 4.0, 0.0}, 1);
    REQUIRE(AcrobotUnwrapped({3.0, 0.0, 4.0, 0.0}, 1)[0] > kPi);
    CheckState(up.state, {-2.4679961462840367, -0.011958678794136583, 4.3088604408178295, -0.2341228857416052});
    CHECK(up.state[0] == Approx(AcrobotUnwrapped({3.0, 0.0, 4.0, 0.0}, 1)[0] - 2 * kPi).epsilon(1e-12));
    CheckAcrobotObs(up.obs, up.state);

    const auto down = AcrobotStep({-3.0, 0.3, -4.0, 0.0}, 1);
    REQUIRE(AcrobotUnwrapped({-3.0, 0.3, -4.0, 0.0}, 1)[0] < -kPi);
    CheckState(down.state, {2.4947825228644107, 0.2617479334573198, -4.037269362999792, -0.27204263192562383});
  }
  SECTION("theta2 past +pi and past -pi") {
    const auto up = AcrobotStep({0.5, 3.0, 0.0, 6.0}, 2);
    REQUIRE(AcrobotUnwrapped({0.5, 3.0, 0.0, 6.0}, 2)[1] > kPi);
    CheckState(up.state, {0.39169563321798834, -1.9451631199105144, -1.371817076689632, 7.759244022600344});
    const auto down = AcrobotStep({0.5, -3.0, 0.0, -6.0}, 0);
    REQUIRE(AcrobotUnwrapped({0.5, -3.0, 0.0, -6.0}, 0)[1] < -kPi);
    CheckState(down.state, {0.48484369716869125, 2.093637072635344, 0.11651995575451408, -6.235324017925664});
  }
  SECTION("velocities beyond the limits are clipped, a long turn wraps twice") {
    // From theta2_dot = -40 the joint turns by -11.75 rad in one step (two
    // periods) and both velocities leave their ranges (Python: 49.1 and -109.9).
    const State4 s = {0.0, 0.0, 0.0, -40.0};
    const State4 raw = AcrobotUnwrapped(s, 1);
    REQUIRE(raw[1] < -3 * kPi);
    REQUIRE(raw[2] > 4 * kPi);
    REQUIRE(raw[3] < -9 * kPi);
    const auto got = AcrobotStep(s, 1);
    CheckState(got.state, {2.8899178258548774, 0.8186171602435106, 12.566370614359172, -28.274333882308138});
    CHECK(got.state[2] == 4 * kPi);  // exactly the bound
    CHECK(got.state[3] == -9 * kPi);
    CHECK(got.obs[4] == static_cast<float>(4 * kPi));
    CHECK(got.obs[5] == static_cast<float>(-9 * kPi));

    const auto fast = AcrobotStep({0.0, 0.0, 20.0, 0.0}, 1);
    CHECK(fast.state[2] == 4 * kPi);
    CheckState(fast.state, {-2.358531318352004, 0.05795847013262883, 12.566370614359172, -0.4541067858788524});
    CHECK(fast.result.terminated);  // swung over the top
    CHECK(fast.result.reward == 0.0f);

    // At both bounds already, pushed further out: stays on them.
    const auto at_max = AcrobotStep({0.0, 0.0, 4 * kPi, 9 * kPi}, 2);
    CHECK(at_max.state[2] == 4 * kPi);
    CHECK(at_max.state[3] == 9 * kPi);
  }
  SECTION("every wrapped angle lies in [-pi, pi]") {
    std::mt19937_64 rng(3);
    std::uniform_real_distribution<double> angle(-kPi, kPi), w(-40, 40);
    for (int i = 0; i < 200; ++i) {
      const auto got = AcrobotStep({angle(rng), angle(rng), w(rng), w(rng)}, i % 3);
      for (int k = 0; k < 2; ++k) {
        CHECK(got.state[k] >= -kPi);
        CHECK(got.state[k] <= kPi);
      }
      CHECK(std::abs(got.state[2]) <= 4 * kPi);
      CHECK(std::abs(got.state[3]) <= 9 * kPi);
    }
  }
}

TEST_CASE("Acrobot: reset draws every state in [-0.1, 0.1], as float32, reproducibly", "[env][acrobot]") {
  double lowest = 1, highest = -1;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    Acrobot env(seed);
    std::array<float, 6> obs{};
    env.reset(obs.data());
    const State4 s = env.State();
    INFO("seed " << seed);
    for (double v : s) {
      REQUIRE(v >= -static_cast<double>(0.1f));
      REQUIRE(v <= static_cast<double>(0.1f));
      CHECK(static_cast<double>(static_cast<float>(v)) == v);  // Gymnasium stores the reset state as float32
      lowest = std::min(lowest, v);
      highest = std::max(highest, v);
    }
    CheckAcrobotObs(obs, s);
  }
  CHECK(lowest < -0.095);  // the draws cover the whole range
  CHECK(highest > 0.095);

  auto first = [](uint64_t seed) {
    Acrobot env(seed);
    std::array<float, 6> obs{};
    env.reset(obs.data());
    return obs;
  };
  CHECK(first(42) == first(42));
  CHECK(first(42) != first(43));
}

TEST_CASE("Acrobot: through EnvGroup, no torque is truncated at 500, pumping terminates", "[env][acrobot][group]") {
  constexpr int kN = 3;
  SECTION("no torque: 500 steps of -1, truncated with a final observation") {
    auto group = MakeGroup("Acrobot-v1", kN, 5);
    const std::vector<int64_t> idle(kN, 1);
    for (int t = 1; t < 500; ++t) {
      group->Step(idle.data(), nullptr);
      for (int i = 0; i < kN; ++i) {
        INFO("step " << t << " env " << i);
        REQUIRE(group->terminated()[i] == 0);
        REQUIRE(group->truncated()[i] == 0);
        REQUIRE(group->reward()[i] == -1.0f);
      }
    }
    const std::vector<float> before(group->obs(), group->obs() + kN * 6);
    group->Step(idle.data(), nullptr);
    REQUIRE(group->final_obs_index() == std::vector<int32_t>{0, 1, 2});
    REQUIRE(group->finished().size() == kN);
    for (int i = 0; i < kN; ++i) {
      INFO("env " << i);
      CHECK(group->truncated()[i] == 1);
      CHECK(group->terminated()[i] == 0);
      CHECK(group->finished()[i].length == 500);
      CHECK(group->finished()[i].episode_return == -500.0f);
      const auto final_row = Row(group->final_obs().data(), 6, i);
      CHECK(final_row != Row(before.data(), 6, i));  // the step happened
      const auto new_row = Row(group->obs(), 6, i);
      CHECK(final_row != new_row);
      CHECK(new_row[0] >= 0.99f);  // a fresh reset: |theta1| <= 0.1
      CHECK(std::abs(new_row[4]) <= 0.1f);
    }
  }
  SECTION("torque along the joint velocity swings up before the limit") {
    auto group = MakeGroup("Acrobot-v1", kN, 5);
    std::vector<int64_t> actions(kN);
    std::vector<int> done_at(kN, 0);
    for (int t = 1; t <= 500; ++t) {
      for (int i = 0; i < kN; ++i) actions[i] = group->obs()[i * 6 + 5] > 0 ? 2 : 0;
      group->Step(actions.data(), nullptr);
      CHECK(group->final_obs_index().empty());  // terminations carry no final obs
      for (int i = 0; i < kN; ++i) {
        CHECK(group->truncated()[i] == 0);
        if (group->terminated()[i] && done_at[i] == 0) done_at[i] = t;
        CHECK(group->reward()[i] == (group->terminated()[i] ? 0.0f : -1.0f));
      }
      for (const EpisodeStat& e : group->finished()) CHECK(e.episode_return == -(e.length - 1.0f));
      if (std::all_of(done_at.begin(), done_at.end(), [](int d) { return d > 0; })) break;
    }
    for (int i = 0; i < kN; ++i) {
      INFO("env " << i);
      CHECK(done_at[i] > 1);
      CHECK(done_at[i] < 500);
    }
  }
}

// ===========================================================================
// MountainCar-v0

TEST_CASE("MountainCar: spec has Gymnasium's spaces and limits", "[env][mountain_car]") {
  const EnvFamily* family = EnvRegistry::Global().Find("MountainCar-v0");
  REQUIRE(family != nullptr);
  const EnvSpec spec = family->spec({});
  CHECK(spec.action == Space::Discrete(3));
  CHECK(spec.max_episode_steps == 200);
  REQUIRE(spec.reward_threshold.has_value());
  CHECK(*spec.reward_threshold == -110.0);
  CHECK(spec.observation == Space::Box({2}, {-1.2f, -0.07f}, {0.6f, 0.07f}));
}

TEST_CASE("MountainCar: one step matches the published equations", "[env][mountain_car]") {
  SECTION("each action from the valley floor (Python values)") {
    // v' = 0 + (a - 1) 0.001 - 0.0025 cos(-1.5); p' = -0.5 + v'.
    const std::array<State2, 3> python = {{
        {-0.5011768430041692, -0.0011768430041692573},
        {-0.5001768430041692, -0.00017684300416925727},
        {-0.49917684300416926, 0.0008231569958307428},
    }};
    for (int action = 0; action < 3; ++action) {
      INFO("action " << action);
      const auto got = MountainCarStep({-0.5, 0.0}, action);
      const double v = (action - 1) * 0.001 - 0.0025 * std::cos(-1.5);
      CheckState(got.state, {-0.5 + v, v});
      CheckState(got.state, python[action]);
      CHECK(got.obs[0] == static_cast<float>(got.state[0]));
      CHECK(got.obs[1] == static_cast<float>(got.state[1]));
      CHECK_FALSE(got.result.terminated);
      CHECK(got.result.reward == -1.0f);
    }
  }
  SECTION("moving states") {
    CheckState(MountainCarStep({0.3, 0.04}, 2).state, {0.33944597507932334, 0.03944597507932334});
    CheckState(MountainCarStep({-1.0, -0.03}, 0).state, {-1.0285250187584989, -0.028525018758498884});
    for (const State2 s : {State2{0.3, 0.04}, State2{-1.0, -0.03}, State2{0.1, -0.05}}) {
      for (int action = 0; action < 3; ++action)
        CheckState(MountainCarStep(s, action).state, MountainCarHand(s, action));
    }
  }
  SECTION("a bad action throws") {
    MountainCar env(1);
    std::array<float, 2> obs{};
    env.reset(obs.data());
    for (int64_t bad : {-1, 3}) {
      ActionRef a;
      a.discrete = &bad;
      CHECK_THROWS_AS(env.step(a, obs.data()), std::out_of_range);
    }
  }
}

TEST_CASE("MountainCar: speed clipped to 0.07, position to [-1.2, 0.6], inelastic left wall", "[env][mountain_car]") {
  SECTION("speed") {
    // v' = 0.0695 + 0.001 - 0.0025 cos(-1.5) = 0.07032 > 0.07, clipped before the position moves.
    const auto fast = MountainCarStep({-0.5, 0.0695}, 2);
    CHECK(fast.state[1] == 0.07);
    CHECK(fast.state[0] == -0.5 + 0.07);
    const auto fast_left = MountainCarStep({-0.5, -0.0695}, 0);
    CHECK(fast_left.state[1] == -0.07);
    CHECK(fast_left.state[0] == -0.5 - 0.07);
  }
  SECTION("left wall stops the car") {
    // v' = -0.02 - 0.001 - 0.0025 cos(-3.57) = -0.01873; p' = -1.2087 -> -1.2, v -> 0.
    const auto hit = MountainCarStep({-1.19, -0.02}, 0);
    CHECK(hit.state[0] == -1.2);
    CHECK(hit.state[1] == 0.0);
    CHECK(hit.obs[0] == -1.2f);
    CHECK(hit.obs[1] == 0.0f);
    CHECK_FALSE(hit.result.terminated);
    // Short of the wall the speed is kept.
    const auto near = MountainCarStep({-1.15, -0.02}, 0);
    CHECK(near.state[0] > -1.2);
    CheckState(near.state, MountainCarHand({-1.15, -0.02}, 0));
    CHECK(near.state[1] < 0);
    // At the wall moving away, the speed is kept too.
    const auto leave = MountainCarStep({-1.2, 0.0}, 2);
    CheckState(leave.state, MountainCarHand({-1.2, 0.0}, 2));
    CHECK(leave.state[1] > 0);
  }
  SECTION("right edge clips the position, keeps the speed, and is past the goal") {
    const auto out = MountainCarStep({0.59, 0.05}, 2);
    CHECK(out.state[0] == 0.6);
    CHECK(out.state[1] == Approx(0.05 + 0.001 - 0.0025 * std::cos(1.77)).epsilon(1e-12));
    CHECK(out.result.terminated);
  }
}

TEST_CASE("MountainCar: terminates at position >= 0.5 with velocity >= 0", "[env][mountain_car]") {
  // From p = 0.49 with no push, v' = v - 0.0025 cos(1.47) and p' = 0.49 + v'.
  // Pick v so p' lands just below or just above 0.5 (1e-9 and 1e-4 away).
  const double drift = -0.0025 * std::cos(3 * 0.49);
  for (double offset : {-1e-9, 1e-9, 1e-4, -1e-4}) {
    const State2 s = {0.49, 0.01 - drift + offset};
    const State2 want = MountainCarHand(s, 1);
    INFO("offset " << offset << ": p' - 0.5 = " << want[0] - 0.5);
    REQUIRE(std::abs(want[0] - 0.5) < 2e-4);
    REQUIRE((want[0] >= 0.5) == (offset > 0));
    const auto got = MountainCarStep(s, 1);
    CheckState(got.state, want);
    CHECK(got.result.terminated == (offset > 0));
    CHECK(got.result.reward == -1.0f);  // the terminating step too
  }
  // Exactly at the goal counts (>=): nudge v until p' rounds to 0.5 exactly.
  {
    const double p0 = 0.45;
    double v0 = (0.5 - p0) - (0.001 - 0.0025 * std::cos(3 * p0));
    for (int i = 0; i < 1000 && MountainCarHand({p0, v0}, 2)[0] != 0.5; ++i)
      v0 = std::nextafter(v0, MountainCarHand({p0, v0}, 2)[0] < 0.5 ? 1.0 : -1.0);
    REQUIRE(MountainCarHand({p0, v0}, 2)[0] == 0.5);
    const auto got = MountainCarStep({p0, v0}, 2);
    CHECK(got.state[0] == 0.5);
    CHECK(got.result.terminated);
    // A little less speed (a few ulps may still round to 0.5) stops short.
    double v = v0;
    while (MountainCarHand({p0, v}, 2)[0] >= 0.5) v = std::nextafter(v, -1.0);
    CHECK(MountainCarHand({p0, v}, 2)[0] < 0.5);
    CHECK_FALSE(MountainCarStep({p0, v}, 2).result.terminated);
  }
  // Past the goal but rolling back: Gymnasium also requires velocity >= goal_velocity (0).
  const auto back = MountainCarStep({0.55, -0.01}, 0);
  REQUIRE(back.state[0] >= 0.5);
  REQUIRE(back.state[1] < 0);
  CHECK_FALSE(back.result.terminated);
  // ... and moving forward from there terminates.
  CHECK(MountainCarStep({0.55, 0.001}, 2).result.terminated);
}

TEST_CASE("MountainCar: reset draws position from -0.6 up to -0.4 at rest, reproducibly", "[env][mountain_car]") {
  double lowest = 0, highest = -1;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    MountainCar env(seed);
    std::array<float, 2> obs{};
    env.reset(obs.data());
    INFO("seed " << seed);
    REQUIRE(env.State()[0] >= -0.6);
    REQUIRE(env.State()[0] < -0.4);
    REQUIRE(env.State()[1] == 0.0);
    CHECK(obs[0] == static_cast<float>(env.State()[0]));
    CHECK(obs[1] == 0.0f);
    lowest = std::min(lowest, env.State()[0]);
    highest = std::max(highest, env.State()[0]);
  }
  CHECK(lowest < -0.59);
  CHECK(highest > -0.41);
  auto first = [](uint64_t seed) {
    MountainCar env(seed);
    std::array<float, 2> obs{};
    env.reset(obs.data());
    return obs;
  };
  CHECK(first(7) == first(7));
  CHECK(first(7) != first(8));
}

TEST_CASE("MountainCar: through EnvGroup, idling is truncated at 200, pumping reaches the goal",
          "[env][mountain_car][group]") {
  constexpr int kN = 4;
  SECTION("no push: truncated at 200 with a final observation") {
    auto group = MakeGroup("MountainCar-v0", kN, 9);
    const std::vector<int64_t> idle(kN, 1);
    for (int t = 1; t < 200; ++t) {
      group->Step(idle.data(), nullptr);
      for (int i = 0; i < kN; ++i) {
        INFO("step " << t << " env " << i);
        REQUIRE(group->terminated()[i] == 0);
        REQUIRE(group->truncated()[i] == 0);
      }
    }
    group->Step(idle.data(), nullptr);
    REQUIRE(group->final_obs_index() == std::vector<int32_t>{0, 1, 2, 3});
    REQUIRE(group->finished().size() == kN);
    for (int i = 0; i < kN; ++i) {
      INFO("env " << i);
      CHECK(group->truncated()[i] == 1);
      CHECK(group->terminated()[i] == 0);
      CHECK(group->finished()[i].length == 200);
      CHECK(group->finished()[i].episode_return == -200.0f);
      const auto final_row = Row(group->final_obs().data(), 2, i);
      CHECK(final_row[0] < 0.5f);
      CHECK(final_row[1] != 0.0f);             // still rocking in the valley
      CHECK(group->obs()[i * 2 + 1] == 0.0f);  // a fresh reset is at rest
    }
  }
  SECTION("pushing along the velocity terminates before the limit") {
    auto group = MakeGroup("MountainCar-v0", kN, 9);
    std::vector<int64_t> actions(kN);
    int episodes = 0;
    for (int t = 1; t <= 200; ++t) {
      for (int i = 0; i < kN; ++i) actions[i] = group->obs()[i * 2 + 1] >= 0 ? 2 : 0;
      group->Step(actions.data(), nullptr);
      CHECK(group->final_obs_index().empty());
      for (int i = 0; i < kN; ++i) CHECK(group->truncated()[i] == 0);
      for (const EpisodeStat& e : group->finished()) {
        CHECK(e.length < 200);
        CHECK(e.episode_return == -static_cast<float>(e.length));
        ++episodes;
      }
    }
    CHECK(episodes >= kN);
  }
}

// ===========================================================================
// Pendulum-v1

TEST_CASE("Pendulum: spec has Gymnasium's spaces and limits, no threshold", "[env][pendulum]") {
  const EnvFamily* family = EnvRegistry::Global().Find("Pendulum-v1");
  REQUIRE(family != nullptr);
  const EnvSpec spec = family->spec({});
  CHECK(spec.action == Space::Box({1}, {-2.0f}, {2.0f}));
  CHECK(spec.observation == Space::Box({3}, {-1.0f, -1.0f, -8.0f}, {1.0f, 1.0f, 8.0f}));
  CHECK(spec.max_episode_steps == 200);
  CHECK_FALSE(spec.reward_threshold.has_value());
}

TEST_CASE("Pendulum: one step matches the published equations", "[env][pendulum]") {
  SECTION("worked by hand") {
    // theta = 1, theta_dot = -2, u = 0.5: cost = 1 + 0.1 * 4 + 0.001 * 0.25 = 1.40025;
    // theta_dot' = -2 + (15 sin 1 + 1.5) 0.05; theta' = 1 + 0.05 theta_dot'.
    const auto got = PendulumStep({1.0, -2.0}, 0.5f);
    const double thdot = -2 + (15 * std::sin(1.0) + 1.5) * 0.05;
    CheckState(got.state, {1 + 0.05 * thdot, thdot});
    CheckState(got.state, {0.9353051619302961, -1.2938967613940777});  // Python
    CHECK(got.result.reward == static_cast<float>(-1.40025));
    CheckPendulumObs(got.obs, got.state);
    CHECK_FALSE(got.result.terminated);
  }
  SECTION("other states (Python values)") {
    auto a = PendulumStep({-2.5, 3.0}, -1.5f);
    CheckState(a.state, {-2.3836927054038983, 2.3261458919220326});
    CHECK(a.result.reward == static_cast<float>(-7.15225));
    a = PendulumStep({5.0, 0.5}, 1.0f);
    CheckState(a.state, {4.9965403397001324, -0.0691932059973539});
    CHECK(a.result.reward == static_cast<float>(-1.6725645325615688));
  }
  SECTION("a sweep of states agrees with the hand formula") {
    std::mt19937_64 rng(11);
    std::uniform_real_distribution<double> th(-20, 20), thdot(-8, 8), u(-4, 4);
    for (int i = 0; i < 300; ++i) {
      const State2 s = {th(rng), thdot(rng)};
      const float action = static_cast<float>(u(rng));
      INFO("case " << i);
      const auto got = PendulumStep(s, action);
      const PendulumHand want = PendulumStepHand(s, action);
      CheckState(got.state, want.next);
      CHECK(got.result.reward == Approx(want.reward).epsilon(1e-6));
      CheckPendulumObs(got.obs, got.state);
    }
  }
}

TEST_CASE("Pendulum: torque clipped to 2, speed to 8, cost on the normalised pre-step angle", "[env][pendulum]") {
  SECTION("torque") {
    for (float big : {2.0f, 2.5f, 100.0f}) {
      INFO("u " << big);
      const auto pos = PendulumStep({0.3, 0.2}, big);
      CheckState(pos.state, PendulumStepHand({0.3, 0.2}, 2.0).next);
      CHECK(pos.result.reward == static_cast<float>(PendulumStepHand({0.3, 0.2}, 2.0).reward));
      const auto neg = PendulumStep({0.3, 0.2}, -big);
      CheckState(neg.state, PendulumStepHand({0.3, 0.2}, -2.0).next);
      CHECK(neg.result.reward == static_cast<float>(PendulumStepHand({0.3, 0.2}, -2.0).reward));
    }
    // Clipping changes the result: 1.9 is not 2.
    CHECK(PendulumStep({0.3, 0.2}, 1.9f).state[1] < PendulumStep({0.3, 0.2}, 100.0f).state[1]);
  }
  SECTION("speed, clipped before it moves the angle") {
    // theta_dot' = 7.9 + (15 sin 3 + 6) 0.05 = 8.306 -> 8; theta' = 3 + 8 * 0.05 = 3.4.
    const auto up = PendulumStep({3.0, 7.9}, 5.0f);
    CHECK(up.state[1] == 8.0);
    CHECK(up.state[0] == Approx(3.4).epsilon(1e-15));
    // Cost of the pre-step state: 3^2 + 0.1 * 7.9^2 + 0.001 * 2^2 = 15.245 (u clipped).
    CHECK(up.result.reward == static_cast<float>(-15.245));
    CHECK(up.obs[2] == 8.0f);
    const auto down = PendulumStep({-3.0, -7.9}, -5.0f);
    CHECK(down.state[1] == -8.0);
    CHECK(down.state[0] == Approx(-3.4).epsilon(1e-15));
  }
  SECTION("angle normalisation in the cost; the state angle itself is not wrapped") {
    struct Case {
      double theta;
      double normalized;
    };
    // normalize(x) = ((x + pi) mod 2 pi) - pi.
    for (const Case& c : {Case{5.0, 5.0 - 2 * kPi}, Case{-4.0, -4.0 + 2 * kPi}, Case{7 * kPi + 0.3, 0.3 - kPi},
                          Case{-7 * kPi + 0.3, 0.3 - kPi}, Case{0.7, 0.7}, Case{-0.7, -0.7}}) {
      INFO("theta " << c.theta);
      const auto got = PendulumStep({c.theta, 0.0}, 0.0f);
      CHECK(got.result.reward == Approx(-c.normalized * c.normalized).epsilon(1e-6));
      CHECK(got.state[0] == Approx(c.theta + 0.05 * 0.05 * 15 * std::sin(c.theta)).epsilon(1e-12));
    }
    // Upright and still, no torque: no cost, stays put.
    const auto top = PendulumStep({0.0, 0.0}, 0.0f);
    CHECK(top.result.reward == 0.0f);
    CHECK(top.state == State2{0.0, 0.0});
    // Hanging down is the worst angle: cost pi^2.
    CHECK(PendulumStep({kPi, 0.0}, 0.0f).result.reward == Approx(-kPi * kPi).epsilon(1e-6));
  }
}

TEST_CASE("Pendulum: never terminates, and reset draws |theta| <= pi and |theta_dot| <= 1", "[env][pendulum]") {
  Pendulum env(3);
  std::array<float, 3> obs{};
  env.reset(obs.data());
  std::mt19937_64 rng(4);
  std::normal_distribution<float> sample(0.0f, 3.0f);  // unclipped, like the learner's Gaussian
  for (int t = 0; t < 2000; ++t) {
    const float u = sample(rng);
    ActionRef a;
    a.continuous = &u;
    const StepResult r = env.step(a, obs.data());
    REQUIRE_FALSE(r.terminated);
    REQUIRE(r.reward <= 0.0f);
    REQUIRE(r.reward >= -static_cast<float>(kPi * kPi + 0.1 * 64 + 0.004) - 1e-4f);  // Gymnasium's minimum reward
    REQUIRE(std::abs(obs[2]) <= 8.0f);
  }

  double th_lo = 0, th_hi = 0, w_lo = 0, w_hi = 0;
  for (uint64_t seed = 0; seed < 300; ++seed) {
    Pendulum p(seed);
    p.reset(obs.data());
    const State2 s = p.State();
    INFO("seed " << seed);
    REQUIRE(s[0] >= -kPi);
    REQUIRE(s[0] < kPi);
    REQUIRE(s[1] >= -1.0);
    REQUIRE(s[1] < 1.0);
    CheckPendulumObs(obs, s);
    th_lo = std::min(th_lo, s[0]);
    th_hi = std::max(th_hi, s[0]);
    w_lo = std::min(w_lo, s[1]);
    w_hi = std::max(w_hi, s[1]);
  }
  CHECK(th_lo < -3.0);
  CHECK(th_hi > 3.0);
  CHECK(w_lo < -0.95);
  CHECK(w_hi > 0.95);

  auto first = [](uint64_t seed) {
    Pendulum p(seed);
    std::array<float, 3> o{};
    p.reset(o.data());
    return o;
  };
  CHECK(first(9) == first(9));
  CHECK(first(9) != first(10));
}

TEST_CASE("Pendulum: through EnvGroup, truncated (not terminated) at 200 with final obs", "[env][pendulum][group]") {
  constexpr int kN = 3;
  auto group = MakeGroup("Pendulum-v1", kN, 21);
  REQUIRE(group->obs_numel() == 3);
  // Distinct torques per env, some outside [-2, 2]: the env clips them.
  const std::vector<float> actions = {0.0f, 3.0f, -1.0f};
  std::vector<double> returns(kN, 0.0);
  for (int t = 1; t < 200; ++t) {
    group->Step(nullptr, actions.data());
    for (int i = 0; i < kN; ++i) {
      INFO("step " << t << " env " << i);
      REQUIRE(group->terminated()[i] == 0);
      REQUIRE(group->truncated()[i] == 0);
      REQUIRE(group->reward()[i] <= 0.0f);
      returns[i] += group->reward()[i];
    }
    REQUIRE(group->final_obs_index().empty());
  }
  group->Step(nullptr, actions.data());
  REQUIRE(group->final_obs_index() == std::vector<int32_t>{0, 1, 2});
  REQUIRE(group->final_obs().size() == kN * 3);
  REQUIRE(group->finished().size() == kN);
  for (int i = 0; i < kN; ++i) {
    INFO("env " << i);
    returns[i] += group->reward()[i];
    CHECK(group->truncated()[i] == 1);
    CHECK(group->terminated()[i] == 0);
    CHECK(group->finished()[i].length == 200);
    CHECK(group->finished()[i].episode_return == static_cast<float>(returns[i]));
    const auto final_row = Row(group->final_obs().data(), 3, i);
    const auto new_row = Row(group->obs(), 3, i);
    CHECK(final_row != new_row);
    CHECK(final_row[0] * final_row[0] + final_row[1] * final_row[1] == Approx(1.0f).epsilon(1e-6));
    CHECK(std::abs(final_row[2]) <= 8.0f);
    CHECK(std::abs(new_row[2]) <= 1.0f);  // a fresh reset
  }
  // The next episode runs its full 200 steps again.
  for (int t = 1; t < 200; ++t) {
    group->Step(nullptr, actions.data());
    REQUIRE(group->final_obs_index().empty());
  }
  group->Step(nullptr, actions.data());
  CHECK(group->final_obs_index() == std::vector<int32_t>{0, 1, 2});
}

TEST_CASE("Classic control: same seed gives the same trajectories, different seeds differ", "[env][classic][group]") {
  constexpr int kN = 4;
  auto run = [](const std::string& name, uint64_t seed) {
    auto group = MakeGroup(name, kN, seed);
    const bool discrete = group->spec().action.is_discrete();
    std::mt19937 action_rng(123);
    std::vector<int64_t> d(kN);
    std::vector<float> c(kN);
    std::vector<float> trace(group->obs(), group->obs() + kN * group->obs_numel());
    for (int t = 0; t < 250; ++t) {
      for (int i = 0; i < kN; ++i) {
        d[i] = static_cast<int64_t>(action_rng() % 3);
        c[i] = static_cast<float>(action_rng() % 9) - 4.0f;
      }
      group->Step(discrete ? d.data() : nullptr, discrete ? nullptr : c.data());
      trace.insert(trace.end(), group->obs(), group->obs() + kN * group->obs_numel());
      trace.insert(trace.end(), group->final_obs().begin(), group->final_obs().end());
      for (int i = 0; i < kN; ++i) trace.push_back(group->reward()[i] + 2 * group->terminated()[i]);
    }
    return trace;
  };
  for (const char* name : {"Acrobot-v1", "MountainCar-v0", "Pendulum-v1"}) {
    INFO(name);
    const auto a = run(name, 1);
    CHECK(a == run(name, 1));
    CHECK(a != run(name, 2));
  }
}

}  // namespace farm
