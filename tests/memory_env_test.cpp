// Partially observable envs for recurrent policies (issue 27): CartPoleNoVel-v1, CartPole-v1 observed as [x, theta],
// checked against CartPole-v1 itself step by step; and MemoryCue-v0, a cue shown at the first step and answered
// `delay` steps later: where the cue shows, what the answer pays, how long an episode is, what a memoryless policy
// gets, and the errors for bad options.
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
#include "worker/envs/memory_cue.h"

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

// ===========================================================================
// MemoryCue-v0

namespace {

// One env's observation [2 + choices] at step t of an episode whose cue is `cue` (-1: no cue shown), as documented
// in worker/envs/memory_cue.h, written out here.
std::vector<float> ExpectedCueObs(int t, int delay, int choices, int cue) {
  std::vector<float> obs(2 + choices, 0.0f);
  obs[0] = static_cast<float>(std::min(t, delay)) / static_cast<float>(delay);
  if (cue >= 0) {
    obs[1] = 1.0f;
    obs[2 + cue] = 1.0f;
  }
  return obs;
}

// The cue a first observation shows: its hot index, after checking that exactly one element of the cue part is 1.
int CueShown(const float* obs, int choices) {
  int hot = -1, count = 0;
  for (int c = 0; c < choices; ++c) {
    REQUIRE((obs[2 + c] == 0.0f || obs[2 + c] == 1.0f));
    if (obs[2 + c] == 1.0f) hot = c, ++count;
  }
  REQUIRE(count == 1);
  return hot;
}

}  // namespace

TEST_CASE("MemoryCue-v0: spec follows the options", "[env][memory][memory_cue]") {
  const EnvFamily* family = EnvRegistry::Global().Find("MemoryCue-v0");
  REQUIRE(family != nullptr);
  CHECK(family->default_options == EnvOptions{{"delay", 32}, {"choices", 2}});
  auto group = MakeGroup("MemoryCue-v0", {}, 1, 0);
  const EnvSpec& spec = group->spec();
  CHECK(spec.name == "MemoryCue-v0");
  CHECK(spec.action == Space::Discrete(2));
  REQUIRE(spec.observation.shape == std::vector<int64_t>{4});
  CHECK(spec.observation.low == std::vector<float>(4, 0.0f));
  CHECK(spec.observation.high == std::vector<float>(4, 1.0f));
  CHECK(spec.max_episode_steps == 0);
  REQUIRE(spec.reward_threshold.has_value());
  CHECK(*spec.reward_threshold == 0.95);

  auto five = MakeGroup("MemoryCue-v0", {{"delay", 1}, {"choices", 5}}, 1, 0);
  CHECK(five->spec().action == Space::Discrete(5));
  CHECK(five->spec().observation.shape == std::vector<int64_t>{7});
  CHECK(*five->spec().reward_threshold == 0.95);
}

TEST_CASE("MemoryCue-v0: bad options are refused, naming the option, the value and the range",
          "[env][memory][memory_cue]") {
  Status s = CreateStatus("MemoryCue-v0", {{"delay", 0}});
  CHECK(s.code() == Status::Code::kInvalidArgument);
  CHECK(s.message() == "env MemoryCue-v0: option 'delay' must be a whole number in [1, 1048576], got 0");
  s = CreateStatus("MemoryCue-v0", {{"delay", 2.5}});
  CHECK(s.code() == Status::Code::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("'delay'") && Catch::Contains("got 2.5"));
  s = CreateStatus("MemoryCue-v0", {{"delay", -3}});
  CHECK_THAT(s.message(), Catch::Contains("'delay'") && Catch::Contains("got -3"));
  s = CreateStatus("MemoryCue-v0", {{"choices", 1}});
  CHECK(s.code() == Status::Code::kInvalidArgument);
  CHECK(s.message() == "env MemoryCue-v0: option 'choices' must be a whole number in [2, 65536], got 1");
  s = CreateStatus("MemoryCue-v0", {{"choices", 3.5}});
  CHECK_THAT(s.message(), Catch::Contains("'choices'") && Catch::Contains("got 3.5"));
  s = CreateStatus("MemoryCue-v0", {{"choices", std::numeric_limits<double>::quiet_NaN()}});
  CHECK(s.code() == Status::Code::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("'choices'"));
  s = CreateStatus("MemoryCue-v0", {{"length", 4}});
  CHECK(s.code() == Status::Code::kInvalidArgument);
  CHECK(s.message() == "env MemoryCue-v0: unknown option 'length'; known options: choices, delay");
  // The smallest legal values are taken.
  CHECK(CreateStatus("MemoryCue-v0", {{"delay", 1}, {"choices", 2}}).ok());
}

TEST_CASE("MemoryCue-v0: the cue shows only at step 0, the answer at step D pays 1 exactly when it is the cue",
          "[env][memory][memory_cue]") {
  for (const auto& [delay, choices] : std::vector<std::pair<int, int>>{{1, 2}, {4, 3}, {32, 2}}) {
    INFO("delay " << delay << ", choices " << choices);
    MemoryCueEnv env(delay, choices, /*seed=*/3);
    std::vector<float> obs(2 + choices, -1.0f);
    std::mt19937_64 noise(5);
    // Every answer for a few episodes each: right once per cue value, wrong for every other.
    int right = 0, wrong = 0;
    for (int episode = 0; episode < 6 * choices; ++episode) {
      INFO("episode " << episode);
      env.reset(obs.data());
      const int cue = CueShown(obs.data(), choices);
      CHECK(cue == env.cue());
      CHECK(obs == ExpectedCueObs(0, delay, choices, cue));
      // Steps 0 .. D - 1: any action, reward 0, no termination, no cue.
      for (int t = 1; t <= delay; ++t) {
        INFO("step " << t);
        const StepResult r = StepWith(env, static_cast<int64_t>(noise() % choices), obs.data());
        REQUIRE(r.reward == 0.0f);
        REQUIRE_FALSE(r.terminated);
        REQUIRE(obs == ExpectedCueObs(t, delay, choices, -1));
      }
      REQUIRE(obs[0] == 1.0f);  // the answer step
      const int64_t answer = episode % choices;
      const StepResult r = StepWith(env, answer, obs.data());
      CHECK(r.terminated);
      CHECK(r.reward == (answer == cue ? 1.0f : 0.0f));
      CHECK(obs == ExpectedCueObs(delay + 1, delay, choices, -1));  // [1, 0, ..., 0], within the box
      CHECK(env.t() == delay + 1);  // D + 1 steps
      (answer == cue ? right : wrong) += 1;
    }
    CHECK(right > 0);
    CHECK(wrong > 0);
  }
  SECTION("a bad action throws") {
    MemoryCueEnv env(2, 3, 1);
    std::vector<float> obs(5);
    env.reset(obs.data());
    CHECK_THROWS_AS(StepWith(env, 3, obs.data()), std::out_of_range);
    CHECK_THROWS_AS(StepWith(env, -1, obs.data()), std::out_of_range);
  }
}

TEST_CASE("MemoryCue-v0: through EnvGroup, episodes are D + 1 steps, memory wins, a memoryless policy gets 1/choices",
          "[env][memory][memory_cue][group]") {
  constexpr int kN = 16;
  for (const auto& [delay, choices] : std::vector<std::pair<int, int>>{{3, 2}, {5, 4}}) {
    INFO("delay " << delay << ", choices " << choices);
    const int numel = 2 + choices;
    auto always0 = MakeGroup("MemoryCue-v0", {{"delay", delay}, {"choices", choices}}, kN, 21);
    auto remember = MakeGroup("MemoryCue-v0", {{"delay", delay}, {"choices", choices}}, kN, 21);
    std::vector<int> seen_cue(kN, -1);
    std::vector<int> cue_counts(choices, 0);
    std::vector<int64_t> zeros(kN, 0), answers(kN, 0);
    double always0_sum = 0, remember_sum = 0;
    int always0_episodes = 0, remember_episodes = 0;
    for (int step = 0; step < 3000 * (delay + 1) / kN; ++step) {
      // The remembering policy: keeps the cue of each env's first observation, answers it (and 0 before).
      for (int i = 0; i < kN; ++i) {
        const float* o = remember->obs() + i * numel;
        if (o[1] == 1.0f) {
          seen_cue[i] = CueShown(o, choices);
          ++cue_counts[seen_cue[i]];
        }
        answers[i] = o[0] == 1.0f ? seen_cue[i] : 0;
      }
      always0->Step(zeros.data(), nullptr);
      remember->Step(answers.data(), nullptr);
      for (const auto* g : {always0.get(), remember.get()}) {
        CHECK(g->final_obs_index().empty());  // terminations only: nothing to bootstrap
        for (int i = 0; i < kN; ++i) CHECK(g->truncated()[i] == 0);
      }
      for (const EpisodeStat& e : always0->finished()) {
        REQUIRE(e.length == delay + 1);
        REQUIRE((e.episode_return == 0.0f || e.episode_return == 1.0f));
        always0_sum += e.episode_return;
        ++always0_episodes;
      }
      for (const EpisodeStat& e : remember->finished()) {
        REQUIRE(e.length == delay + 1);
        REQUIRE(e.episode_return == 1.0f);
        remember_sum += e.episode_return;
        ++remember_episodes;
      }
    }
    REQUIRE(always0_episodes >= 2500);
    REQUIRE(remember_episodes == always0_episodes);
    CHECK(remember_sum == remember_episodes);
    // Right with probability 1/choices per episode: the mean's standard deviation is below 0.01 for 2,500 episodes.
    const double mean = always0_sum / always0_episodes;
    CHECK(mean == Approx(1.0 / choices).margin(0.04));
    // Every cue value is drawn, each about 1/choices of the time.
    int drawn = 0;
    for (int c : cue_counts) drawn += c;
    for (int c = 0; c < choices; ++c) {
      INFO("cue " << c);
      CHECK(cue_counts[c] == Approx(static_cast<double>(drawn) / choices).epsilon(0.15));
    }
  }
}

}  // namespace farm
