// A critic stuck on one value (learner/train/critic_watch.h): PpoStats' value_std and return_std from a real
// update, a critic whose ReLUs are all dead reporting value_std 0 and explained variance 0, and the watch's
// warning after CriticWatch::kUpdates such updates, said once, and its note when the values vary again.
#include "learner/train/critic_watch.h"

#include <torch/torch.h>

#include <cmath>
#include <string>

#include "learner/model/policy.h"
#include "learner/train/ppo.h"
#include "tests/ppo_test_util.h"

// LibTorch includes glog, whose one-argument CHECK would silently replace Catch's: include Catch last.
#undef CHECK
#include <catch2/catch.hpp>

namespace farm {
namespace {

PpoStats Fit(double value_std, double return_std) {
  PpoStats s;
  s.value_std = value_std;
  s.return_std = return_std;
  s.explained_variance = value_std == 0 ? 0 : 0.5;
  return s;
}

}  // namespace

TEST_CASE("a PPO update reports the spread of the values and returns, and a dead critic's is 0", "[critic_watch]") {
  const Space space = Space::Box({6}, {-1.f}, {1.f});
  PolicyOptions relu;
  relu.layout.activation = Activation::kRelu;
  for (const bool dead : {false, true}) {
    INFO((dead ? "dead critic" : "healthy critic"));
    torch::manual_seed(11);
    ActorCritic policy(space, Space::Discrete(3), std::vector<int>{16}, relu);
    if (dead) {
      // The critic's first Linear far below zero: every ReLU is 0 for every input, as after a step too far.
      bool killed = false;
      for (auto& p : policy->named_parameters()) {
        if (killed || p.key().rfind("critic.", 0) != 0 || p.key().find("bias") == std::string::npos) continue;
        torch::NoGradGuard no_grad;
        p.value().fill_(-1e4);
        killed = true;
      }
      REQUIRE(killed);
    }
    const Rollout r = testing::ActedRollout(policy, torch::rand({8 * 4, 6}) * 2 - 1, {}, 8, 4);
    PpoConfig config;
    config.num_minibatches = 2;
    config.update_epochs = 2;
    const PpoStats stats = PpoTrainer(policy, config, 1).Update(r, 0);
    const Advantages gae =
        ComputeGae(r.rewards, r.values, r.dones, r.last_value, config.gamma, config.gae_lambda);
    CHECK(stats.return_std > 0);
    CHECK(stats.return_std == Approx(gae.returns.std(/*unbiased=*/false).item<double>()).epsilon(1e-5));
    CHECK(stats.value_std == Approx(r.values.std(/*unbiased=*/false).item<double>()).epsilon(1e-5).margin(1e-12));
    if (dead) {
      CHECK(stats.value_std == 0);
      CHECK(stats.explained_variance == Approx(0).margin(1e-6));
    } else {
      CHECK(stats.value_std > CriticWatch::kConstantSpread * stats.return_std);
    }
    bool listed = false;
    for (const auto& [name, value] : stats.Items()) listed |= name == "value_std" && value == stats.value_std;
    CHECK(listed);  // in metrics.jsonl and TensorBoard
  }
}

TEST_CASE("the watch warns once after kUpdates constant updates, and notes when the values vary again",
          "[critic_watch]") {
  CriticWatch watch;
  int64_t update = 0;
  // A varying critic, then a constant one: nothing until the kUpdates-th constant update.
  CHECK_FALSE(watch.Observe(++update, Fit(1.0, 2.0)));
  for (int i = 1; i < CriticWatch::kUpdates; ++i) CHECK_FALSE(watch.Observe(++update, Fit(0.0, 2.0)));
  const auto warning = watch.Observe(++update, Fit(0.0, 2.0));
  REQUIRE(warning);
  CHECK(warning->warning);
  CHECK_THAT(warning->text, Catch::Contains("same value for 5 updates") && Catch::Contains("update 6") &&
                           Catch::Contains("ppo.lr"));
  CHECK(watch.constant_updates() == CriticWatch::kUpdates);
  // Said once: further constant updates, and updates whose returns do not vary, say nothing.
  for (int i = 0; i < 20; ++i) CHECK_FALSE(watch.Observe(++update, Fit(0.0, 2.0)));
  CHECK_FALSE(watch.Observe(++update, Fit(0.0, 0.0)));
  // A spread below kConstantSpread of the returns' is still constant; one between that and kVaryingSpread is not
  // yet varying again (a dying critic's wanders there), nor does it start a new count of constant updates.
  CHECK_FALSE(watch.Observe(++update, Fit(1e-5, 2.0)));
  CHECK_FALSE(watch.Observe(++update, Fit(1e-3, 2.0)));
  CHECK(watch.constant_updates() == 0);
  for (int i = 0; i < CriticWatch::kUpdates; ++i) CHECK_FALSE(watch.Observe(++update, Fit(0.0, 2.0)));
  const auto back = watch.Observe(++update, Fit(0.3, 2.0));
  REQUIRE(back);
  CHECK_FALSE(back->warning);
  CHECK_THAT(back->text, Catch::Contains("vary again at update 35") && Catch::Contains("constant at update 6"));
  CHECK(watch.constant_updates() == 0);
  CHECK_FALSE(watch.Observe(++update, Fit(0.3, 2.0)));
  // Dying again later is said again.
  std::optional<CriticWatch::Report> again;
  for (int i = 0; i < CriticWatch::kUpdates; ++i) again = watch.Observe(++update, Fit(0.0, 2.0));
  REQUIRE(again);
  CHECK(again->warning);
}

TEST_CASE("the watch warns once when the values' spread exceeds any return the rewards allow, kUpdates in a row",
          "[critic_watch]") {
  // Rewards of at most 2 with gamma 0.9: no return exceeds 2 / (1 - 0.9) = 20.
  CriticWatch watch;
  int64_t update = 0;
  // At the bound itself, and without one (no rewards yet, gamma 1): nothing, however long.
  constexpr int kMany = 2 * CriticWatch::kUpdates;
  for (int i = 0; i < kMany; ++i) CHECK_FALSE(watch.ObserveScale(++update, Fit(20.0, 25.0), 2.0, 0.9));
  for (int i = 0; i < kMany; ++i) CHECK_FALSE(watch.ObserveScale(++update, Fit(1e6, 1e6), 0.0, 0.9));
  for (int i = 0; i < kMany; ++i) CHECK_FALSE(watch.ObserveScale(++update, Fit(1e6, 1e6), 2.0, 1.0));
  // Beyond it for kUpdates - 1 updates, then within: the count starts again.
  for (int i = 1; i < CriticWatch::kUpdates; ++i) CHECK_FALSE(watch.ObserveScale(++update, Fit(21, 25), 2.0, 0.9));
  CHECK_FALSE(watch.ObserveScale(++update, Fit(10, 25), 2.0, 0.9));
  for (int i = 1; i < CriticWatch::kUpdates; ++i) CHECK_FALSE(watch.ObserveScale(++update, Fit(30, 35), 2.0, 0.9));
  // A cancelled update neither counts nor breaks the count.
  PpoStats cancelled = Fit(10, 25);
  cancelled.cancelled = true;
  CHECK_FALSE(watch.ObserveScale(++update, cancelled, 2.0, 0.9));
  const auto warning = watch.ObserveScale(++update, Fit(std::nan(""), 35), 2.0, 0.9);  // NaN: beyond too
  REQUIRE(warning);
  CHECK(warning->warning);
  CHECK_THAT(warning->text, Catch::Contains("diverging") && Catch::Contains("update " + std::to_string(update)) &&
                                Catch::Contains("= 20") && Catch::Contains("ppo.bootstrap_truncated"));
  // Said once.
  for (int i = 0; i < 2 * CriticWatch::kUpdates; ++i)
    CHECK_FALSE(watch.ObserveScale(++update, Fit(1e9, 1e9), 2.0, 0.9));
  // The constant-critic watch is a count of its own.
  CHECK(watch.constant_updates() == 0);
}

TEST_CASE("the watch counts only consecutive constant updates", "[critic_watch]") {
  CriticWatch watch;
  int64_t update = 0;
  for (int round = 0; round < 3; ++round) {
    for (int i = 1; i < CriticWatch::kUpdates; ++i) CHECK_FALSE(watch.Observe(++update, Fit(0.0, 1.0)));
    CHECK_FALSE(watch.Observe(++update, Fit(0.2, 1.0)));  // varies before the count is reached
  }
  CHECK(watch.constant_updates() == 0);
}

TEST_CASE("the watch's state restored (a resumed run) goes on counting and does not warn twice", "[critic_watch]") {
  int64_t update = 0;
  CriticWatch before;
  for (int i = 1; i < CriticWatch::kUpdates; ++i) CHECK_FALSE(before.Observe(++update, Fit(0.0, 2.0)));
  // A collapse under way when the checkpoint was taken: one more constant update warns.
  CriticWatch resumed;
  REQUIRE(resumed.Restore(before.state()).ok());
  CHECK(resumed.constant_updates() == CriticWatch::kUpdates - 1);
  const auto warning = resumed.Observe(++update, Fit(0.0, 2.0));
  REQUIRE(warning);
  CHECK(warning->warning);
  // A warning already given: the resumed watch stays silent while the critic stays constant, and notes it varying.
  CriticWatch again;
  REQUIRE(again.Restore(resumed.state()).ok());
  for (int i = 0; i < 10; ++i) CHECK_FALSE(again.Observe(++update, Fit(0.0, 2.0)));
  const auto back = again.Observe(++update, Fit(0.5, 2.0));
  REQUIRE(back);
  CHECK_FALSE(back->warning);
  CHECK_THAT(back->text, Catch::Contains("reported constant at update 5"));
  // A state that cannot be is refused, and changes nothing.
  const Status bad = again.Restore({-1, std::nullopt});
  CHECK_FALSE(bad.ok());
  CHECK_THAT(bad.message(), Catch::Contains("critic_watch"));
  CHECK(again.constant_updates() == 0);
}

TEST_CASE("the critic's tanh saturation is measured on the rollout's critic inputs, sampled evenly",
          "[critic_watch]") {
  const Space obs = Space::Box({6}, {-1.f}, {1.f});
  torch::manual_seed(5);
  ActorCritic policy(obs, Space::Discrete(3), std::vector<int>{16, 16});
  Rollout r;
  r.obs = torch::rand({8, 4, 6}) * 2 - 1;
  // A fresh critic (orthogonal init) on inputs of its scale: few units at +-1.
  const std::optional<double> fresh = RolloutCriticSaturation(*policy, r);
  REQUIRE(fresh);
  CHECK(*fresh >= 0);
  CHECK(*fresh < 0.05);
  {
    // The critic's first Linear 1000 times larger: on zero rows its tanh outputs are 0, on the others most of them
    // are at +-1.
    torch::NoGradGuard no_grad;
    policy->named_parameters()["critic.0.weight"].mul_(1000);
  }
  r.obs = torch::zeros({8, 4, 6});
  const torch::Tensor flat = r.obs.view({32, 6});
  for (const int64_t row : {0, 10, 20, 31}) flat[row].fill_(0.5);  // the rows linspace(0, 31, 4) picks
  const std::optional<double> picked = RolloutCriticSaturation(*policy, r, 4);
  const std::optional<double> all = RolloutCriticSaturation(*policy, r);
  REQUIRE(picked);
  REQUIRE(all);
  CHECK(*picked >= 0.5);  // every unit of the first layer (half of the tanh outputs) at +-1
  CHECK(*all == Approx(*picked * 4 / 32));  // the same 4 rows, among 28 unsaturated ones
  CHECK(*policy->CriticSaturation(torch::zeros({5, 6})) == 0);

  // A centralised critic reads the global states (4 numbers per env of 2 agents), not the observations.
  PolicyOptions central;
  central.global_state = Space::Box({4}, {-1.f}, {1.f});
  ActorCritic ctde(obs, Space::Discrete(3), std::vector<int>{16}, central);
  Rollout c;
  c.obs = torch::rand({8, 4, 6});
  c.states = torch::rand({8, 2, 4});
  c.rows_per_state = 2;
  CHECK(RolloutCriticSaturation(*ctde, c));
  CHECK_THROWS(ctde->CriticSaturation(c.obs.flatten(0, 1)));  // observations are not the critic's input

  // No tanh layer (ReLU trunk): nothing to report, and Items lists nothing.
  PolicyOptions relu;
  relu.layout.activation = Activation::kRelu;
  ActorCritic r_policy(obs, Space::Discrete(3), std::vector<int>{16}, relu);
  CHECK_FALSE(RolloutCriticSaturation(*r_policy, r));
  PpoStats stats;
  const auto listed = [](const PpoStats& s) {
    for (const auto& [name, value] : s.Items())
      if (name == "critic_saturation") return value;
    return -1.0;
  };
  CHECK(listed(stats) == -1.0);
  stats.critic_saturation = 0.25;
  CHECK(listed(stats) == 0.25);  // in metrics.jsonl and TensorBoard (not summary.json)
}

}  // namespace farm
