// Partially observable envs for recurrent policies (issue 27): CartPoleNoVel-v1, CartPole-v1 observed as [x, theta],
// checked against CartPole-v1 itself step by step.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "worker/env.h"
#include "worker/env_group.h"
#include "worker/envs/cartpole.h"

namespace farm {
namespace {

std::unique_ptr<EnvGroup> MakeGroup(const std::string& name, const std::map<std::string, double>& options, int n,
                                    uint64_t seed) {
  std::unique_ptr<EnvGroup> group;
  const Status s = EnvGroup::Create(name, options, n, seed, &group);
  INFO(s.ToString());
  REQUIRE(s.ok());
  REQUIRE(group != nullptr);
  return group;
}

Status CreateStatus(const std::string& name, const std::map<std::string, double>& options) {
  std::unique_ptr<EnvGroup> group;
  return EnvGroup::Create(name, options, 1, 0, &group);
}

StepResult StepWith(Env& env, int64_t action, float* obs) {
  ActionRef a;
  a.discrete = &action;
  return env.step(a, obs);
}

// ===========================================================================
// CartPoleNoVel-v1

// The gymnasium constants restated (cartpole.py), so that the bounds are checked against the published values.
constexpr double kPi = 3.14159265358979323846;
constexpr double kThetaThreshold = 12 * 2 * kPi / 360;

}  // namespace

TEST_CASE("CartPoleNoVel-v1: spec is CartPole-v1's with the observation [x, theta]", "[env][memory][cartpole]") {
  const EnvFamily* family = EnvRegistry::Global().Find("CartPoleNoVel-v1");
  REQUIRE(family != nullptr);  // also proves the whole-archive link kept the registration
  CHECK(family->default_options.empty());
  const EnvSpec spec = family->spec(family->default_options);
  const EnvSpec full = CartPoleSpec({});
  CHECK(spec.name == "CartPoleNoVel-v1");
  CHECK(spec.action == Space::Discrete(2));
  CHECK(spec.max_episode_steps == 500);
  REQUIRE(spec.reward_threshold.has_value());
  CHECK(*spec.reward_threshold == 475.0);
  CHECK(spec.num_agents == 1);
  CHECK_FALSE(spec.global_state.has_value());
  REQUIRE(spec.observation.is_box());
  REQUIRE(spec.observation.shape == std::vector<int64_t>{2});
  const float theta_high = static_cast<float>(2 * kThetaThreshold);
  CHECK(spec.observation.high == std::vector<float>{4.8f, theta_high});
  CHECK(spec.observation.low == std::vector<float>{-4.8f, -theta_high});
  // Elements 0 and 2 of CartPole-v1's bounds (1 and 3 are the velocities' +-float max).
  CHECK(spec.observation.high == std::vector<float>{full.observation.high[0], full.observation.high[2]});
  CHECK(spec.observation.low == std::vector<float>{full.observation.low[0], full.observation.low[2]});

  // No options, like CartPole-v1.
  const Status s = CreateStatus("CartPoleNoVel-v1", {{"delay", 1}});
  CHECK(s.code() == Status::Code::kInvalidArgument);
  CHECK(s.message() == "env CartPoleNoVel-v1: unknown option 'delay'; known options: (none)");
}

TEST_CASE("CartPoleNoVel-v1: observations are CartPole-v1's [x, theta] for the same seed and actions",
          "[env][memory][cartpole]") {
  // Whole episodes of random actions (they fall within tens of steps), env by env: the same reset draws, the same
  // dynamics, rewards and terminations; only the velocities are missing from the observation.
  std::mt19937_64 actions(11);
  int episodes_checked = 0;
  for (uint64_t seed = 0; seed < 40; ++seed) {
    INFO("seed " << seed);
    CartPole full(seed);
    CartPoleNoVel novel(seed);
    std::array<float, 4> f{};
    std::array<float, 2> n{};
    full.reset(f.data());
    novel.reset(n.data());
    REQUIRE(n[0] == f[0]);
    REQUIRE(n[1] == f[2]);
    REQUIRE(novel.cartpole().State() == full.State());
    // A second episode from the same envs: the reset draws advance alike.
    for (int episode = 0; episode < 2; ++episode) {
      if (episode == 1) {
        full.reset(f.data());
        novel.reset(n.data());
        REQUIRE(n == std::array<float, 2>{f[0], f[2]});
      }
      bool ended = false;
      for (int t = 1; t <= 500 && !ended; ++t) {
        INFO("episode " << episode << " step " << t);
        const int64_t a = static_cast<int64_t>(actions() >> 63);
        const StepResult rf = StepWith(full, a, f.data());
        const StepResult rn = StepWith(novel, a, n.data());
        REQUIRE(n[0] == f[0]);
        REQUIRE(n[1] == f[2]);
        REQUIRE(rn.reward == rf.reward);
        REQUIRE(rn.terminated == rf.terminated);
        ended = rf.terminated;
      }
      CHECK(ended);
      episodes_checked += ended ? 1 : 0;
    }
  }
  CHECK(episodes_checked == 80);
}

TEST_CASE("CartPoleNoVel-v1: through EnvGroup, rows are CartPole-v1's [x, theta] up to the 500-step truncation",
          "[env][memory][cartpole][group]") {
  // Both groups from one seed (env seeds do not depend on the env's name), stepped with the same actions, chosen by a
  // PD controller on CartPole-v1's full observation (it needs the velocities), which keeps the pole up past the
  // time limit: the NoVel group must be truncated at 500 like CartPole-v1, with [x, theta] final observations.
  constexpr int kN = 4;
  auto full = MakeGroup("CartPole-v1", {}, kN, 7);
  auto novel = MakeGroup("CartPoleNoVel-v1", {}, kN, 7);
  REQUIRE(novel->obs_numel() == 2);
  auto check_rows = [&](const char* what) {
    for (int i = 0; i < kN; ++i) {
      INFO(what << ", env " << i);
      REQUIRE(novel->obs()[2 * i] == full->obs()[4 * i]);
      REQUIRE(novel->obs()[2 * i + 1] == full->obs()[4 * i + 2]);
    }
  };
  check_rows("reset");
  std::vector<int64_t> actions(kN);
  int truncations = 0;
  for (int t = 1; t <= 500; ++t) {
    INFO("step " << t);
    for (int i = 0; i < kN; ++i) {
      const float* o = full->obs() + 4 * i;
      actions[i] = 0.1 * o[0] + 0.2 * o[1] + o[2] + 0.5 * o[3] > 0 ? 1 : 0;
    }
    full->Step(actions.data(), nullptr);
    novel->Step(actions.data(), nullptr);
    check_rows("step");
    for (int i = 0; i < kN; ++i) {
      REQUIRE(novel->reward()[i] == full->reward()[i]);
      REQUIRE(novel->terminated()[i] == full->terminated()[i]);
      REQUIRE(novel->truncated()[i] == full->truncated()[i]);
      REQUIRE(novel->terminated()[i] == 0);
      truncations += novel->truncated()[i];
    }
    REQUIRE(novel->final_obs_index() == full->final_obs_index());
  }
  CHECK(truncations == kN);
  REQUIRE(novel->final_obs_index() == std::vector<int32_t>{0, 1, 2, 3});
  REQUIRE(novel->final_obs().size() == 2 * kN);
  REQUIRE(novel->finished().size() == kN);
  for (int i = 0; i < kN; ++i) {
    INFO("env " << i);
    CHECK(novel->finished()[i].length == 500);
    CHECK(novel->finished()[i].episode_return == 500.0f);
    CHECK(novel->final_obs()[2 * i] == full->final_obs()[4 * i]);
    CHECK(novel->final_obs()[2 * i + 1] == full->final_obs()[4 * i + 2]);
  }
}

}  // namespace farm
