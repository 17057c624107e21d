// Tests for the env API: CartPole-v1 against Gymnasium's published equations,
// Debug-v0, the registry and option resolution, and EnvGroup's vector-env semantics.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "worker/env.h"
#include "worker/env_group.h"
#include "worker/envs/cartpole.h"
#include "worker/envs/debug_env.h"

namespace farm {
namespace {

// ---------------------------------------------------------------------------
// A test-only env with full control from the action, to drive EnvGroup's
// bookkeeping: obs = [steps since reset, episodes started]; action is a box of
// 2 floats: action[0] > 0.5 terminates, action[1] is the reward. Time limit 5.
constexpr int kTestTimeLimit = 5;

class ControlledEnv : public Env {
 public:
  void reset(float* obs) override {
    t_ = 0;
    ++episodes_;
    Write(obs);
  }
  StepResult step(const ActionRef& action, float* obs) override {
    ++t_;
    Write(obs);
    StepResult r;
    r.terminated = action.continuous[0] > 0.5f;
    r.reward = action.continuous[1];
    return r;
  }

 private:
  void Write(float* obs) const {
    obs[0] = static_cast<float>(t_);
    obs[1] = static_cast<float>(episodes_);
  }
  int t_ = 0;
  int episodes_ = 0;
};

EnvSpec ControlledSpec(const EnvOptions& /*resolved*/) {
  EnvSpec spec;
  spec.name = "TestControlled-v0";
  spec.observation = Space::Box({2}, {0.0f}, {1e6f});
  spec.action = Space::Box({2}, {-10.0f}, {10.0f});
  spec.max_episode_steps = kTestTimeLimit;
  return spec;
}

FARM_REGISTER_ENV("TestControlled-v0", EnvOptions{}, ControlledSpec,
                  [](const EnvOptions&, uint64_t) { return std::make_unique<ControlledEnv>(); });

// ---------------------------------------------------------------------------
// CartPole-v1 constants as published (Gymnasium cartpole.py), restated here so
// the tests check the implementation's constants rather than reuse them.
constexpr double kG = 9.8;
constexpr double kMassCart = 1.0;
constexpr double kMassPole = 0.1;
constexpr double kTotalMass = kMassCart + kMassPole;
constexpr double kHalfLength = 0.5;
constexpr double kPoleMassLength = kMassPole * kHalfLength;
constexpr double kForce = 10.0;
constexpr double kTau = 0.02;
constexpr double kXThreshold = 2.4;
constexpr double kPi = 3.14159265358979323846;
constexpr double kThetaThreshold = 12 * 2 * kPi / 360;

// One Euler step written out from the published equations.
std::array<double, 4> HandStep(const std::array<double, 4>& s, int action) {
  const double x = s[0], x_dot = s[1], theta = s[2], theta_dot = s[3];
  const double force = action == 1 ? kForce : -kForce;
  const double temp = (force + kPoleMassLength * theta_dot * theta_dot * std::sin(theta)) / kTotalMass;
  const double thetaacc = (kG * std::sin(theta) - std::cos(theta) * temp) /
                          (kHalfLength * (4.0 / 3.0 - kMassPole * std::cos(theta) * std::cos(theta) / kTotalMass));
  const double xacc = temp - kPoleMassLength * thetaacc * std::cos(theta) / kTotalMass;
  return {x + kTau * x_dot, x_dot + kTau * xacc, theta + kTau * theta_dot, theta_dot + kTau * thetaacc};
}

struct CartStep {
  std::array<double, 4> state;
  std::array<float, 4> obs;
  StepResult result;
};

CartStep StepFrom(const std::array<double, 4>& state, int64_t action) {
  CartPole env(/*seed=*/1);
  env.SetState(state);
  CartStep out;
  ActionRef a;
  a.discrete = &action;
  out.result = env.step(a, out.obs.data());
  out.state = env.State();
  return out;
}

void CheckState(const std::array<double, 4>& got, const std::array<double, 4>& want) {
  for (int k = 0; k < 4; ++k) {
    INFO("state component " << k);
    CHECK(got[k] == Approx(want[k]).margin(1e-12).epsilon(1e-12));
  }
}

std::unique_ptr<EnvGroup> MakeGroup(const std::string& name, const std::map<std::string, double>& options, int n,
                                    uint64_t seed) {
  std::unique_ptr<EnvGroup> group;
  const Status s = EnvGroup::Create(name, options, n, seed, &group);
  INFO(s.ToString());
  REQUIRE(s.ok());
  REQUIRE(group != nullptr);
  return group;
}

std::vector<float> Row(const float* data, int64_t numel, int i) {
  return std::vector<float>(data + i * numel, data + (i + 1) * numel);
}

}  // namespace

// ===========================================================================
// CartPole-v1

TEST_CASE("CartPole: one step from rest, worked out as fractions", "[env][cartpole]") {
  // theta = theta_dot = 0, push right: temp = F/M = 100/11; the denominator is
  // l(4/3 - m_p/M) = 0.5 * 41/33 = 41/66, so thetaacc = -(100/11)(66/41) = -600/41
  // and xacc = 100/11 + 0.05 * (600/41) / 1.1 = 400/41. Euler: x_dot = 0.02 * 400/41 = 8/41,
  // theta_dot = 0.02 * -600/41 = -12/41; positions move with the old (zero) velocities.
  const CartStep right = StepFrom({0, 0, 0, 0}, 1);
  CheckState(right.state, {0.0, 8.0 / 41.0, 0.0, -12.0 / 41.0});
  CHECK(right.obs[1] == static_cast<float>(8.0 / 41.0));
  CHECK(right.obs[3] == static_cast<float>(-12.0 / 41.0));
  CHECK_FALSE(right.result.terminated);
  CHECK(right.result.reward == 1.0f);

  const CartStep left = StepFrom({0, 0, 0, 0}, 0);
  CheckState(left.state, {0.0, -8.0 / 41.0, 0.0, 12.0 / 41.0});
}

TEST_CASE("CartPole: step from a non-trivial state matches the published equations", "[env][cartpole]") {
  const std::array<double, 4> s0 = {0.1, -0.3, 0.05, 0.4};

  SECTION("push right") {
    const CartStep got = StepFrom(s0, 1);
    // temp     = (10 + 0.05 * 0.4^2 * sin 0.05) / 1.1
    // thetaacc = (9.8 sin 0.05 - cos 0.05 * temp) / (0.5 (4/3 - 0.1 cos^2 0.05 / 1.1))
    // xacc     = temp - 0.05 thetaacc cos 0.05 / 1.1
    const double temp = (10.0 + 0.05 * 0.4 * 0.4 * std::sin(0.05)) / 1.1;
    const double thetaacc =
        (9.8 * std::sin(0.05) - std::cos(0.05) * temp) / (0.5 * (4.0 / 3.0 - 0.1 * std::pow(std::cos(0.05), 2) / 1.1));
    const double xacc = temp - 0.05 * thetaacc * std::cos(0.05) / 1.1;
    CheckState(got.state, {0.1 + 0.02 * -0.3, -0.3 + 0.02 * xacc, 0.05 + 0.02 * 0.4, 0.4 + 0.02 * thetaacc});
    // The same numbers evaluated independently (Python, float64).
    CheckState(got.state, {0.094, -0.10562165319395353, 0.058, 0.1234907390340565});
    CheckState(got.state, HandStep(s0, 1));
    for (int k = 0; k < 4; ++k) CHECK(got.obs[k] == static_cast<float>(got.state[k]));
    CHECK_FALSE(got.result.terminated);
    CHECK(got.result.reward == 1.0f);
  }

  SECTION("push left") {
    const CartStep got = StepFrom(s0, 0);
    const double temp = (-10.0 + 0.05 * 0.4 * 0.4 * std::sin(0.05)) / 1.1;
    const double thetaacc =
        (9.8 * std::sin(0.05) - std::cos(0.05) * temp) / (0.5 * (4.0 / 3.0 - 0.1 * std::pow(std::cos(0.05), 2) / 1.1));
    const double xacc = temp - 0.05 * thetaacc * std::cos(0.05) / 1.1;
    CheckState(got.state, {0.1 + 0.02 * -0.3, -0.3 + 0.02 * xacc, 0.05 + 0.02 * 0.4, 0.4 + 0.02 * thetaacc});
    CheckState(got.state, {0.094, -0.49579424205613642, 0.058, 0.70801820112168157});
  }

  SECTION("leaning left, moving right, push left") {
    const std::array<double, 4> s1 = {-0.5, 1.2, -0.15, -0.9};
    const CartStep got = StepFrom(s1, 0);
    CheckState(got.state, HandStep(s1, 0));
    CheckState(got.state, {-0.476, 1.0071941031140148, -0.168, -0.65797346920266686});
  }
}

TEST_CASE("CartPole: terminates just outside the x and theta thresholds", "[env][cartpole]") {
  // x and theta advance with the old velocities, so a zero velocity keeps them
  // exactly where they are: on the threshold is still inside (the test is |.| > limit).
  SECTION("x") {
    for (double sign : {1.0, -1.0}) {
      INFO("sign " << sign);
      CHECK_FALSE(StepFrom({sign * kXThreshold, 0, 0, 0}, 1).result.terminated);
      CHECK_FALSE(StepFrom({sign * (kXThreshold - 1e-9), 0, 0, 0}, 0).result.terminated);
      const CartStep out = StepFrom({sign * kXThreshold, sign * 1e-3, 0, 0}, 1);  // x' = 2.4 + 2e-5
      CHECK(out.result.terminated);
      CHECK(out.result.reward == 1.0f);  // v1 rewards the terminating step
    }
  }
  SECTION("theta") {
    REQUIRE(kThetaThreshold == Approx(0.20943951023931953).epsilon(1e-15));
    for (double sign : {1.0, -1.0}) {
      INFO("sign " << sign);
      CHECK_FALSE(StepFrom({0, 0, sign * kThetaThreshold, 0}, 1).result.terminated);
      CHECK_FALSE(StepFrom({0, 0, sign * (kThetaThreshold - 1e-9), 0}, 0).result.terminated);
      const CartStep out = StepFrom({0, 0, sign * kThetaThreshold, sign * 1e-3}, 0);
      CHECK(out.result.terminated);
      CHECK(out.result.reward == 1.0f);
    }
  }
}

TEST_CASE("CartPole: reset draws every state in [-0.05, 0.05], reproducibly per seed", "[env][cartpole]") {
  auto reset_obs = [](uint64_t seed) {
    CartPole env(seed);
    std::array<float, 4> obs{};
    env.reset(obs.data());
    for (int k = 0; k < 4; ++k) CHECK(obs[k] == static_cast<float>(env.State()[k]));
    return obs;
  };
  for (uint64_t seed = 0; seed < 200; ++seed) {
    const auto obs = reset_obs(seed);
    for (float v : obs) {
      INFO("seed " << seed);
      REQUIRE(v >= -0.05f);
      REQUIRE(v <= 0.05f);
    }
  }
  CHECK(reset_obs(42) == reset_obs(42));
  CHECK(reset_obs(42) != reset_obs(43));

  // Successive resets of one env differ too (the RNG advances).
  CartPole env(5);
  std::array<float, 4> a{}, b{};
  env.reset(a.data());
  env.reset(b.data());
  CHECK(a != b);
}

TEST_CASE("CartPole: spec has Gymnasium's spaces and limits", "[env][cartpole]") {
  const EnvFamily* family = EnvRegistry::Global().Find("CartPole-v1");
  REQUIRE(family != nullptr);  // also proves the whole-archive link kept the registration
  CHECK(family->default_options.empty());
  const EnvSpec spec = family->spec(family->default_options);
  CHECK(spec.name == "CartPole-v1");
  CHECK(spec.action == Space::Discrete(2));
  CHECK(spec.max_episode_steps == 500);
  REQUIRE(spec.reward_threshold.has_value());
  CHECK(*spec.reward_threshold == 475.0);
  REQUIRE(spec.observation.shape == std::vector<int64_t>{4});
  const float fmax = std::numeric_limits<float>::max();
  CHECK(spec.observation.high == std::vector<float>{4.8f, fmax, static_cast<float>(2 * kThetaThreshold), fmax});
  CHECK(spec.observation.low == std::vector<float>{-4.8f, -fmax, -static_cast<float>(2 * kThetaThreshold), -fmax});
}

// ===========================================================================
// Registry and options

TEST_CASE("Registry: built-in envs are registered and duplicates are refused", "[env][registry]") {
  const auto names = EnvRegistry::Global().Names();
  CHECK(std::find(names.begin(), names.end(), "CartPole-v1") != names.end());
  CHECK(std::find(names.begin(), names.end(), "Debug-v0") != names.end());
  CHECK(EnvRegistry::Global().Find("NoSuchEnv-v9") == nullptr);

  EnvRegistry local;
  const EnvFamily family{EnvOptions{}, CartPoleSpec, MakeCartPole};
  CHECK(local.Add("A-v0", family));
  CHECK_THROWS_AS(local.Add("A-v0", family), std::logic_error);
  CHECK(local.Names() == std::vector<std::string>{"A-v0"});
}

TEST_CASE("Registry: unknown env name is NotFound and names it", "[env][registry]") {
  std::unique_ptr<EnvGroup> group;
  const Status s = EnvGroup::Create("CartPole-v9", {}, 2, 0, &group);
  REQUIRE_FALSE(s.ok());
  CHECK(s.code() == Status::Code::kNotFound);
  CHECK_THAT(s.message(), Catch::Contains("CartPole-v9"));
  CHECK_THAT(s.message(), Catch::Contains("CartPole-v1"));  // lists what exists
  CHECK(group == nullptr);
}

TEST_CASE("Registry: unknown option is InvalidArgument naming env, option and known options", "[env][registry]") {
  std::unique_ptr<EnvGroup> group;
  Status s = EnvGroup::Create("CartPole-v1", {{"foo", 1}}, 2, 0, &group);
  REQUIRE_FALSE(s.ok());
  CHECK(s.code() == Status::Code::kInvalidArgument);
  CHECK(s.message() == "env CartPole-v1: unknown option 'foo'; known options: (none)");

  s = EnvGroup::Create("Debug-v0", {{"lenght", 5}}, 2, 0, &group);
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains("Debug-v0") && Catch::Contains("'lenght'") && Catch::Contains("length") &&
                              Catch::Contains("obs_dim") && Catch::Contains("num_actions"));
}

TEST_CASE("Registry: ResolveEnvOptions overrides defaults and keeps the rest", "[env][registry]") {
  const EnvFamily* family = EnvRegistry::Global().Find("Debug-v0");
  REQUIRE(family != nullptr);
  CHECK(family->default_options == EnvOptions{{"length", 10}, {"obs_dim", 4}, {"num_actions", 2}});
  EnvOptions out;
  REQUIRE(ResolveEnvOptions("Debug-v0", family->default_options, {{"length", 3}}, &out).ok());
  CHECK(out == EnvOptions{{"length", 3}, {"obs_dim", 4}, {"num_actions", 2}});
  REQUIRE(ResolveEnvOptions("Debug-v0", family->default_options, {}, &out).ok());
  CHECK(out == EnvOptions{{"length", 10}, {"obs_dim", 4}, {"num_actions", 2}});

  // An unknown key leaves *out alone and names the env, the key and the known keys.
  const Status s = ResolveEnvOptions("Some-v0", {{"a", 1}, {"b", 2}}, {{"c", 3}}, &out);
  REQUIRE_FALSE(s.ok());
  CHECK(s.code() == Status::Code::kInvalidArgument);
  CHECK(s.message() == "env Some-v0: unknown option 'c'; known options: a, b");
  CHECK(out == EnvOptions{{"length", 10}, {"obs_dim", 4}, {"num_actions", 2}});
}

TEST_CASE("Registry: bad option values and group sizes are InvalidArgument", "[env][registry]") {
  std::unique_ptr<EnvGroup> group;
  Status s = EnvGroup::Create("Debug-v0", {{"length", 0}}, 1, 0, &group);
  CHECK(s.code() == Status::Code::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("Debug-v0") && Catch::Contains("length"));
  s = EnvGroup::Create("Debug-v0", {{"length", 2.5}}, 1, 0, &group);
  CHECK(s.code() == Status::Code::kInvalidArgument);
  // Below-minimum obs_dim / num_actions are refused by the spec (no room for the cue / both answers).
  s = EnvGroup::Create("Debug-v0", {{"obs_dim", 1}}, 1, 0, &group);
  CHECK(s.code() == Status::Code::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("Debug-v0") && Catch::Contains("obs_dim"));
  s = EnvGroup::Create("Debug-v0", {{"num_actions", 1}}, 1, 0, &group);
  CHECK(s.code() == Status::Code::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("Debug-v0") && Catch::Contains("num_actions"));
  s = EnvGroup::Create("CartPole-v1", {}, 0, 0, &group);
  CHECK(s.code() == Status::Code::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("num_envs"));
  CHECK(group == nullptr);
}

// ===========================================================================
// Debug-v0

TEST_CASE("Debug-v0: cue, reward, termination and options through EnvGroup", "[env][debug]") {
  constexpr int kLength = 3;
  constexpr int kN = 4;
  auto group = MakeGroup("Debug-v0", {{"length", kLength}}, kN, 11);
  REQUIRE(group->obs_numel() == 4);
  REQUIRE(group->spec().max_episode_steps == 0);
  CHECK(group->spec().observation == Space::Box({4}, {-1.0f}, {1.0f}));
  CHECK(group->spec().action == Space::Discrete(2));
  // The threshold follows the resolved length: the optimal return.
  REQUIRE(group->spec().reward_threshold.has_value());
  CHECK(*group->spec().reward_threshold == kLength);

  std::vector<int64_t> actions(kN);
  for (int episode = 0; episode < 3; ++episode) {
    for (int t = 0; t < kLength; ++t) {
      for (int i = 0; i < kN; ++i) {
        const float* row = group->obs() + i * 4;
        CHECK(row[0] == Approx(static_cast<float>(t) / kLength));
        CHECK((row[1] == 1.0f || row[1] == -1.0f));
        CHECK(row[2] == 0.0f);
        CHECK(row[3] == 0.0f);
        // Envs 0 and 1 follow the cue; 2 and 3 go against it.
        const int64_t right = row[1] > 0 ? 1 : 0;
        actions[i] = i < 2 ? right : 1 - right;
      }
      group->Step(actions.data(), nullptr);
      const bool last = t == kLength - 1;
      for (int i = 0; i < kN; ++i) {
        INFO("episode " << episode << " t " << t << " env " << i);
        CHECK(group->reward()[i] == (i < 2 ? 1.0f : 0.0f));
        CHECK(group->terminated()[i] == (last ? 1 : 0));
        CHECK(group->truncated()[i] == 0);
      }
      CHECK(group->final_obs_index().empty());  // terminations carry no final obs
      if (last) {
        REQUIRE(group->finished().size() == kN);
        for (int i = 0; i < kN; ++i) {
          CHECK(group->finished()[i].length == kLength);
          CHECK(group->finished()[i].episode_return == (i < 2 ? kLength : 0));
          CHECK(group->obs()[i * 4] == 0.0f);  // reset already happened
        }
      } else {
        CHECK(group->finished().empty());
      }
    }
  }
}

TEST_CASE("Debug-v0: spec and env follow obs_dim and num_actions", "[env][debug]") {
  const EnvFamily* family = EnvRegistry::Global().Find("Debug-v0");
  REQUIRE(family != nullptr);
  const EnvSpec defaults = family->spec(family->default_options);
  CHECK(defaults.observation.shape == std::vector<int64_t>{4});
  CHECK(defaults.action == Space::Discrete(2));
  REQUIRE(defaults.reward_threshold.has_value());
  CHECK(*defaults.reward_threshold == 10.0);

  constexpr int kObsDim = 6;
  constexpr int kLength = 4;
  constexpr int kN = 3;
  auto group = MakeGroup("Debug-v0", {{"obs_dim", kObsDim}, {"num_actions", 3}, {"length", kLength}}, kN, 5);
  const EnvSpec& spec = group->spec();
  CHECK(spec.observation.shape == std::vector<int64_t>{kObsDim});
  CHECK(spec.observation == Space::Box({kObsDim}, {-1.0f}, {1.0f}));
  CHECK(spec.action == Space::Discrete(3));
  REQUIRE(spec.reward_threshold.has_value());
  CHECK(*spec.reward_threshold == kLength);
  REQUIRE(group->obs_numel() == kObsDim);

  // Env 0 follows the cue (1 for a positive cue, 0 for a negative one), env 1
  // plays the other of {0, 1}, env 2 always plays the third action, which never pays.
  std::vector<int64_t> actions(kN);
  int positive = 0;
  for (int episode = 0; episode < 2; ++episode) {
    for (int t = 0; t < kLength; ++t) {
      for (int i = 0; i < kN; ++i) {
        INFO("episode " << episode << " t " << t << " env " << i);
        const std::vector<float> row = Row(group->obs(), kObsDim, i);
        REQUIRE(row.size() == kObsDim);
        CHECK(row[0] == Approx(static_cast<float>(t) / kLength));
        CHECK((row[1] == 1.0f || row[1] == -1.0f));
        for (int k = 2; k < kObsDim; ++k) CHECK(row[k] == 0.0f);
        const int64_t right = row[1] > 0 ? 1 : 0;
        positive += row[1] > 0;
        actions[i] = i == 0 ? right : i == 1 ? 1 - right : 2;
      }
      group->Step(actions.data(), nullptr);
      for (int i = 0; i < kN; ++i) {
        INFO("episode " << episode << " t " << t << " env " << i);
        CHECK(group->reward()[i] == (i == 0 ? 1.0f : 0.0f));
        CHECK(group->terminated()[i] == (t == kLength - 1 ? 1 : 0));
      }
    }
    REQUIRE(group->finished().size() == kN);
    CHECK(group->finished()[0].episode_return == kLength);  // reaches the threshold
    CHECK(group->finished()[1].episode_return == 0);
    CHECK(group->finished()[2].episode_return == 0);
  }
  CHECK(positive > 0);                 // both cue signs were seen, so both
  CHECK(positive < 2 * kLength * kN);  // branches of the rule were checked

  // An action outside Discrete(3) is refused by EnvGroup and by the env itself.
  const std::vector<int64_t> bad = {0, 3, 0};
  CHECK_THROWS_AS(group->Step(bad.data(), nullptr), std::out_of_range);
  DebugEnv env(/*length=*/5, kObsDim, /*num_actions=*/3, /*seed=*/1);
  std::vector<float> obs(kObsDim);
  env.reset(obs.data());
  const int64_t three = 3;
  ActionRef a;
  a.discrete = &three;
  CHECK_THROWS_AS(env.step(a, obs.data()), std::out_of_range);
}

TEST_CASE("Debug-v0: cues look random (both signs, not all equal)", "[env][debug]") {
  DebugEnv env(/*length=*/1000, /*obs_dim=*/4, /*num_actions=*/2, /*seed=*/3);
  std::array<float, 4> obs{};
  env.reset(obs.data());
  int positive = 0;
  const int64_t action = 1;
  ActionRef a;
  a.discrete = &action;
  double total = 0;
  for (int t = 0; t < 1000; ++t) {
    const bool cue_positive = obs[1] > 0;
    positive += cue_positive;
    const StepResult r = env.step(a, obs.data());
    CHECK(r.reward == (cue_positive ? 1.0f : 0.0f));
    total += r.reward;
    CHECK(r.terminated == (t == 999));
  }
  CHECK(positive > 400);
  CHECK(positive < 600);
  CHECK(total == positive);
}

// ===========================================================================
// EnvGroup

TEST_CASE("EnvGroup: time limit truncates, keeps final obs, resets and counts", "[env][group]") {
  constexpr int kN = 3;
  auto group = MakeGroup("TestControlled-v0", {}, kN, 0);
  REQUIRE(group->obs_numel() == 2);
  // After Create every env has been reset once: obs = [0, 1].
  for (int i = 0; i < kN; ++i) CHECK(Row(group->obs(), 2, i) == std::vector<float>{0, 1});

  // Per env: [terminate?, reward]. Env 1 terminates on step 2; env 2 terminates on
  // step 5, the time-limit step, so it counts as terminated, not truncated.
  std::vector<float> actions(kN * 2);
  for (int t = 1; t <= kTestTimeLimit; ++t) {
    for (int i = 0; i < kN; ++i) {
      const bool terminate = (i == 1 && t == 2) || (i == 2 && t == kTestTimeLimit);
      actions[i * 2] = terminate ? 1.0f : 0.0f;
      actions[i * 2 + 1] = 0.5f * (i + 1);  // distinct per env: checks the action slices
    }
    group->Step(nullptr, actions.data());
    INFO("step " << t);
    for (int i = 0; i < kN; ++i) CHECK(group->reward()[i] == 0.5f * (i + 1));

    if (t == 2) {
      CHECK(group->terminated()[1] == 1);
      CHECK(group->truncated()[1] == 0);
      REQUIRE(group->finished().size() == 1);
      CHECK(group->finished()[0].length == 2);
      CHECK(group->finished()[0].episode_return == 2.0f);
      CHECK(group->final_obs_index().empty());
      CHECK(Row(group->obs(), 2, 1) == std::vector<float>{0, 2});  // second episode's first obs
    } else if (t < kTestTimeLimit) {
      CHECK(group->finished().empty());
      for (int i = 0; i < kN; ++i) CHECK((group->terminated()[i] == 0 && group->truncated()[i] == 0));
    }
  }

  // Step 5: env 0 truncated (5 steps), env 1 mid-episode (3 steps), env 2 terminated.
  CHECK(group->terminated()[0] == 0);
  CHECK(group->truncated()[0] == 1);
  CHECK(group->terminated()[1] == 0);
  CHECK(group->truncated()[1] == 0);
  CHECK(group->terminated()[2] == 1);
  CHECK(group->truncated()[2] == 0);
  REQUIRE(group->final_obs_index() == std::vector<int32_t>{0});
  CHECK(group->final_obs() == std::vector<float>{5, 1});       // pre-reset obs of env 0
  CHECK(Row(group->obs(), 2, 0) == std::vector<float>{0, 2});  // its reset obs
  CHECK(Row(group->obs(), 2, 1) == std::vector<float>{3, 2});
  CHECK(Row(group->obs(), 2, 2) == std::vector<float>{0, 2});
  REQUIRE(group->finished().size() == 2);  // in env order
  CHECK(group->finished()[0].length == 5);
  CHECK(group->finished()[0].episode_return == 2.5f);
  CHECK(group->finished()[1].length == 5);
  CHECK(group->finished()[1].episode_return == 7.5f);

  // Counters were reset: env 0 runs a full 5 steps again, env 1 truncates after
  // its own 5th step (two steps later).
  std::fill(actions.begin(), actions.end(), 0.0f);
  group->Step(nullptr, actions.data());
  CHECK(group->final_obs_index().empty());  // cleared at the start of each Step
  CHECK(group->finished().empty());
  group->Step(nullptr, actions.data());
  REQUIRE(group->final_obs_index() == std::vector<int32_t>{1});
  CHECK(group->final_obs() == std::vector<float>{5, 2});
  REQUIRE(group->finished().size() == 1);
  CHECK(group->finished()[0].length == 5);
  CHECK(group->finished()[0].episode_return == 3.0f);  // 3 steps at 1.0, then 2 at 0
  for (int k = 0; k < 2; ++k) group->Step(nullptr, actions.data());
  CHECK(group->final_obs_index().empty());
  group->Step(nullptr, actions.data());
  CHECK(group->final_obs_index() == std::vector<int32_t>{0, 2});
  CHECK(group->final_obs() == std::vector<float>{5, 2, 5, 2});

  // Reset() clears flags and restarts every episode.
  group->Reset();
  CHECK(group->final_obs_index().empty());
  CHECK(group->finished().empty());
  for (int i = 0; i < kN; ++i) {
    CHECK(group->truncated()[i] == 0);
    CHECK(group->terminated()[i] == 0);
    CHECK(group->obs()[i * 2] == 0.0f);
  }
}

TEST_CASE("EnvGroup: DecorrelateEpisodes cuts each first episode at a seeded random length", "[env][group]") {
  constexpr int kN = 64;
  auto group = MakeGroup("TestControlled-v0", {}, kN, 0);
  std::vector<float> actions(kN * 2, 0.0f);  // no env terminates, reward 0
  // Steps until every env has ended one episode: each one's length, truncation and cut flag.
  const auto first_episodes = [&](int terminate_env = -1) {
    std::vector<EpisodeStat> first(kN);
    std::vector<uint8_t> seen(kN, 0), truncated(kN, 0);
    for (int t = 1; t <= kTestTimeLimit; ++t) {
      for (int i = 0; i < kN; ++i) actions[i * 2] = (i == terminate_env && t == 1) ? 1.0f : 0.0f;
      group->Step(nullptr, actions.data());
      std::size_t next = 0;
      for (int i = 0; i < kN; ++i) {
        if (!(group->terminated()[i] || group->truncated()[i])) continue;
        const EpisodeStat ep = group->finished().at(next++);
        if (seen[i]) continue;
        seen[i] = 1;
        first[i] = ep;
        truncated[i] = group->truncated()[i];
      }
      CHECK(next == group->finished().size());
    }
    for (int i = 0; i < kN; ++i) REQUIRE(seen[i]);
    return std::make_pair(first, truncated);
  };
  REQUIRE(group->DecorrelateEpisodes(11));
  const auto [cut, cut_truncated] = first_episodes();
  std::set<int32_t> lengths;
  for (int i = 0; i < kN; ++i) {
    INFO("env " << i << " length " << cut[i].length);
    CHECK(cut[i].length >= 1);
    CHECK(cut[i].length <= kTestTimeLimit);
    CHECK(cut_truncated[i] == 1);                             // a cut is a truncation, as the time limit's
    CHECK(cut[i].cut == (cut[i].length < kTestTimeLimit));  // a draw of the limit itself is no cut
    lengths.insert(cut[i].length);
  }
  CHECK(lengths.size() == static_cast<std::size_t>(kTestTimeLimit));  // 64 draws reach every length of 1..5
  // The episodes after the cut run to the limit.
  group->Reset();
  const auto [full, full_truncated] = first_episodes();
  for (int i = 0; i < kN; ++i) CHECK((full[i].length == kTestTimeLimit && !full[i].cut && full_truncated[i]));
  // The same seed draws the same cuts; an env that terminates before its cut ends a whole episode (not cut).
  group->Reset();
  REQUIRE(group->DecorrelateEpisodes(11));
  const auto [again, again_truncated] = first_episodes(/*terminate_env=*/0);
  CHECK((again[0].length == 1 && !again[0].cut && !again_truncated[0]));
  for (int i = 1; i < kN; ++i) CHECK((again[i].length == cut[i].length && again[i].cut == cut[i].cut));
  group->Reset();
  REQUIRE(group->DecorrelateEpisodes(12));
  const auto other = first_episodes().first;
  int differ = 0;
  for (int i = 0; i < kN; ++i) differ += other[i].length != cut[i].length ? 1 : 0;
  CHECK(differ > 0);
  // An env without a time limit has nothing to cut.
  auto unlimited = MakeGroup("Debug-v0", {}, 2, 0);
  CHECK_FALSE(unlimited->DecorrelateEpisodes(11));
}

TEST_CASE("EnvGroup: balanced CartPole-v1 is truncated at 500 steps", "[env][group][cartpole]") {
  constexpr int kN = 4;
  auto group = MakeGroup("CartPole-v1", {}, kN, 7);
  std::vector<int64_t> actions(kN);
  // A PD controller on the observation keeps the pole up well past 500 steps.
  auto control = [&] {
    for (int i = 0; i < kN; ++i) {
      const float* o = group->obs() + i * 4;
      actions[i] = 0.1 * o[0] + 0.2 * o[1] + o[2] + 0.5 * o[3] > 0 ? 1 : 0;
    }
  };
  for (int t = 1; t < 500; ++t) {
    control();
    group->Step(actions.data(), nullptr);
    for (int i = 0; i < kN; ++i) {
      INFO("step " << t << " env " << i);
      REQUIRE(group->terminated()[i] == 0);
      REQUIRE(group->truncated()[i] == 0);
      REQUIRE(group->reward()[i] == 1.0f);
    }
  }
  control();
  group->Step(actions.data(), nullptr);
  REQUIRE(group->final_obs_index() == std::vector<int32_t>{0, 1, 2, 3});
  REQUIRE(group->final_obs().size() == kN * 4);
  REQUIRE(group->finished().size() == kN);
  for (int i = 0; i < kN; ++i) {
    INFO("env " << i);
    CHECK(group->truncated()[i] == 1);
    CHECK(group->terminated()[i] == 0);
    CHECK(group->finished()[i].length == 500);
    CHECK(group->finished()[i].episode_return == 500.0f);
    const std::vector<float> final_row = Row(group->final_obs().data(), 4, i);
    const std::vector<float> new_row = Row(group->obs(), 4, i);
    CHECK(final_row != new_row);
    CHECK(std::abs(final_row[0]) <= 2.4f);                // a live, balanced state
    for (float v : new_row) CHECK(std::abs(v) <= 0.05f);  // a fresh reset
  }
}

TEST_CASE("EnvGroup: same seed gives the same trajectories, different seeds differ", "[env][group]") {
  constexpr int kN = 5;
  auto run = [](const std::string& name, uint64_t seed) {
    auto group = MakeGroup(name, {}, kN, seed);
    std::mt19937 action_rng(123);  // the same actions for every run
    std::vector<int64_t> actions(kN);
    std::vector<float> trace(group->obs(), group->obs() + kN * group->obs_numel());
    for (int t = 0; t < 300; ++t) {
      for (auto& a : actions) a = static_cast<int64_t>(action_rng() & 1);
      group->Step(actions.data(), nullptr);
      trace.insert(trace.end(), group->obs(), group->obs() + kN * group->obs_numel());
      trace.insert(trace.end(), group->final_obs().begin(), group->final_obs().end());
      for (int i = 0; i < kN; ++i) trace.push_back(group->reward()[i] + 2 * group->terminated()[i]);
    }
    return trace;
  };
  for (const char* name : {"CartPole-v1", "Debug-v0"}) {
    INFO(name);
    const auto a = run(name, 1);
    CHECK(a == run(name, 1));
    CHECK(a != run(name, 2));
  }
  // Within a group, envs get distinct seeds.
  auto group = MakeGroup("CartPole-v1", {}, kN, 1);
  for (int i = 1; i < kN; ++i) CHECK(Row(group->obs(), 4, 0) != Row(group->obs(), 4, i));
}

TEST_CASE("EnvGroup: out-of-range discrete action and missing actions throw", "[env][group]") {
  auto group = MakeGroup("CartPole-v1", {}, 2, 0);
  const std::vector<int64_t> bad = {0, 2};
  CHECK_THROWS_AS(group->Step(bad.data(), nullptr), std::out_of_range);
  CHECK_THROWS_AS(group->Step(nullptr, nullptr), std::invalid_argument);
}

}  // namespace farm
