// Value normalisation (learner/train/value_norm.h, ppo.value_norm): MAPPO's ValueNorm statistics against values
// worked by hand, PopArt keeping the critic's de-normalised outputs when the statistics move, the policy
// de-normalising on every path that gives a value (acting, evaluating, unrolling a core), the trainer's advantages
// and V-trace targets from de-normalised values, and the statistics in the policy's saved state.
#include <torch/torch.h>

#include <cmath>
#include <sstream>
#include <vector>

#include "common/config.h"
#include "learner/model/policy.h"
#include "learner/train/ppo.h"
#include "learner/train/value_norm.h"
#include "tests/ppo_test_util.h"

// LibTorch includes glog, whose one-argument CHECK would silently replace Catch's: include Catch last.
#undef CHECK
#include <catch2/catch.hpp>

namespace farm {
namespace {

constexpr double kBeta = ValueNormalizer::kBeta;

ActorCritic Policy(uint64_t seed, bool value_norm, CoreKind core = CoreKind::kNone) {
  torch::manual_seed(seed);
  PolicyOptions o;
  o.value_norm = value_norm;
  o.core = core;
  o.core_size = 8;
  return ActorCritic(Space::Box({5}, {-1}, {1}), Space::Discrete(3), std::vector<int>{16, 16}, o);
}

void SetStats(ActorCritic& p, double mean, double std) {
  torch::NoGradGuard no_grad;
  p->value_norm_mean().fill_(mean);
  p->value_norm_std().fill_(std);
}

TEST_CASE("ValueNorm's statistics are MAPPO's, worked by hand", "[value_norm]") {
  ActorCritic p = Policy(1, true);
  ValueNormalizer norm(p, ValueNormalizer::Mode::kRunning);
  CHECK(norm.mean() == 0);
  CHECK(norm.std() == 1);
  // Returns 1, 2, 3, 4: the debiased running mean is the batch's, 2.5; mean of squares 7.5; variance 1.25.
  std::vector<double> m = ValueNormalizer::Moments(torch::tensor({1.0f, 2.0f, 3.0f, 4.0f}));
  CHECK(m == std::vector<double>{4, 10, 30});
  norm.Update(m[0], m[1], m[2]);
  CHECK(norm.mean() == Approx(2.5).epsilon(1e-6));
  CHECK(norm.std() == Approx(std::sqrt(1.25)).epsilon(1e-6));
  // Then 10, 10: each batch weighs (1 - beta), the older one once more by beta, the debiasing weight divides.
  norm.Update(2, 20, 200);
  const double mean = (2.5 * kBeta + 10) / (1 + kBeta);
  const double sq = (7.5 * kBeta + 100) / (1 + kBeta);
  CHECK(norm.mean() == Approx(mean).epsilon(1e-6));
  CHECK(norm.std() == Approx(std::sqrt(sq - mean * mean)).epsilon(1e-6));
  // The moments are in the policy's buffers.
  const torch::Tensor moments = p->value_norm_moments();
  CHECK(moments[2].item<double>() == Approx((1 - kBeta) * kBeta + (1 - kBeta)).epsilon(1e-9));
  // Constant returns: the variance's floor, 1e-2.
  ActorCritic q = Policy(1, true);
  ValueNormalizer flat(q, ValueNormalizer::Mode::kRunning);
  flat.Update(3, 9, 27);
  CHECK(flat.mean() == Approx(3));
  CHECK(flat.std() == Approx(0.1));
  // An empty batch changes nothing.
  flat.Update(0, 0, 0);
  CHECK(flat.mean() == Approx(3));
}

TEST_CASE("PopArt keeps the critic's de-normalised outputs as the statistics move, running does not", "[value_norm]") {
  const torch::Tensor obs = torch::rand({32, 5}) * 2 - 1;
  for (const auto mode : {ValueNormalizer::Mode::kPopArt, ValueNormalizer::Mode::kRunning}) {
    ActorCritic p = Policy(2, true);
    ValueNormalizer norm(p, mode);
    torch::NoGradGuard no_grad;
    norm.Update(4, 10, 30);  // mean 2.5, std 1.118
    const torch::Tensor before = p->Value(obs).clone();
    const double m0 = norm.mean(), s0 = norm.std();
    norm.Update(3, 300, 30500);  // returns around 100: the statistics move far
    REQUIRE(std::abs(norm.mean() - m0) > 1e-3);
    const torch::Tensor after = p->Value(obs);
    if (mode == ValueNormalizer::Mode::kPopArt) {
      CHECK(testing::RelativeDiff(after, before) < 1e-5);
    } else {
      // The head's outputs are unchanged: the de-normalised ones follow the statistics.
      const torch::Tensor head = (before - m0) / s0;
      CHECK(testing::RelativeDiff(after, head * norm.std() + norm.mean()) < 1e-5);
      CHECK(testing::RelativeDiff(after, before) > 1e-2);
    }
  }
}

TEST_CASE("every path that gives a value de-normalises it", "[value_norm]") {
  torch::NoGradGuard no_grad;
  const torch::Tensor obs = torch::rand({6, 5}) * 2 - 1;
  const torch::Tensor actions = torch::tensor({0, 1, 2, 0, 1, 2}, torch::kLong);
  const double mean = 7.0, std = 3.0;
  SECTION("feed-forward: Act, Evaluate, Value") {
    ActorCritic p = Policy(3, true);
    const torch::Tensor act0 = p->Act(obs).value.clone(), eval0 = p->Evaluate(obs, actions).value.clone(),
                        value0 = p->Value(obs).clone();
    SetStats(p, mean, std);
    CHECK(testing::RelativeDiff(p->Act(obs).value, act0 * std + mean) < 1e-6);
    CHECK(testing::RelativeDiff(p->Evaluate(obs, actions).value, eval0 * std + mean) < 1e-6);
    CHECK(testing::RelativeDiff(p->Value(obs), value0 * std + mean) < 1e-6);
    CHECK(testing::RelativeDiff(p->NormalizedValue(p->Value(obs)), value0) < 1e-6);
  }
  SECTION("a GRU core: Act and EvaluateSequence") {
    ActorCritic p = Policy(4, true, CoreKind::kGru);
    const torch::Tensor starts = torch::zeros({3, 2});
    const torch::Tensor state0 = torch::zeros({2, p->core_state_size()});
    const torch::Tensor act0 = p->Act(obs).value.clone();
    const torch::Tensor seq0 = p->EvaluateSequence(obs, {}, actions, state0, starts).value.clone();
    SetStats(p, mean, std);
    CHECK(testing::RelativeDiff(p->Act(obs).value, act0 * std + mean) < 1e-6);
    CHECK(testing::RelativeDiff(p->EvaluateSequence(obs, {}, actions, state0, starts).value, seq0 * std + mean) <
          1e-6);
  }
  SECTION("without value_norm nothing changes") {
    ActorCritic p = Policy(3, false);
    CHECK_FALSE(p->value_normalised());
    CHECK(p->named_buffers().size() == 0);
    CHECK(p->NormalizedValue(obs).equal(obs));
  }
}

PpoConfig Config(const std::string& value_norm, const std::string& advantage) {
  PpoConfig c;
  c.num_minibatches = 1;
  c.update_epochs = 1;
  c.fused_update = "off";
  c.graph_update = "off";
  c.anneal_lr = false;
  c.value_norm = value_norm;
  c.advantage = advantage;
  return c;
}

// Two policies whose critics give the same de-normalised values: one with value_norm (statistics mean 40, std 9),
// one without whose head is scaled to match. The returns the critic is trained towards (their spread), and how well
// the values explain them, are the same for both when GAE and V-trace read de-normalised values, and differ when a
// path forgets. (The policy loss of one epoch and one minibatch is the mean of normalised advantages, zero but for
// rounding: it is held to a margin only.)
TEST_CASE("the update's advantages and V-trace targets come from de-normalised values", "[value_norm]") {
  for (const std::string advantage : {"gae", "vtrace"}) {
    ActorCritic normed = Policy(5, true);
    ActorCritic plain = Policy(5, false);
    {
      torch::NoGradGuard no_grad;
      SetStats(normed, 40, 9);
      auto src = normed->named_parameters();
      for (auto& item : plain->named_parameters()) item.value().copy_(src[item.key()]);
      torch::nn::Linear head = plain->critic_head();
      head->weight.mul_(9);
      head->bias.mul_(9).add_(40);
    }
    torch::manual_seed(11);
    const torch::Tensor obs = torch::rand({16 * 4, 5}) * 2 - 1;
    Rollout r = testing::ActedRollout(normed, obs, {}, 16, 4);
    r.rewards = r.rewards * 5 + 40 * (1 - 0.99);  // returns near the statistics' scale
    r.last_value = r.last_value + 40;
    CHECK(testing::RelativeDiff(plain->Value(obs).detach(), normed->Value(obs).detach()) < 1e-5);
    PpoTrainer a(normed, Config("running", advantage), 1);
    PpoTrainer b(plain, Config("none", advantage), 1);
    const PpoStats sa = a.Update(r, 0.0);
    const PpoStats sb = b.Update(r, 0.0);
    INFO(advantage);
    CHECK(sa.policy_loss == Approx(sb.policy_loss).margin(1e-5));
    CHECK(sa.return_std == Approx(sb.return_std).epsilon(1e-4));
    CHECK(sa.return_std > 1.0);  // the returns' own scale (rewards x 5), which a forgotten de-normalisation would move
    CHECK(sa.explained_variance == Approx(sb.explained_variance).epsilon(1e-4));
    CHECK(sa.value_norm);
    CHECK_FALSE(sb.value_norm);
    // The value loss is in the normalised scale: far below the plain critic's.
    CHECK(sa.value_loss < sb.value_loss / 10);
  }
}

TEST_CASE("a critic trained with value_norm fits returns far from zero, and the statistics are in the saved state",
          "[value_norm]") {
  for (const std::string mode : {"running", "popart"}) {
    ActorCritic p = Policy(6, true);
    torch::manual_seed(12);
    // The first feature says the step (the return depends on it), the others are noise.
    torch::Tensor obs = torch::rand({32, 8, 5}) * 2 - 1;
    obs.select(2, 0).copy_((torch::arange(32, torch::kFloat32) / 16 - 1).unsqueeze(1).expand({32, 8}));
    obs = obs.reshape({32 * 8, 5});
    PpoConfig c = Config(mode, "gae");
    c.update_epochs = 4;
    c.num_minibatches = 4;
    c.lr = 3e-3;
    PpoTrainer trainer(p, c, 1);
    PpoStats last;
    for (int i = 0; i < 30; ++i) {
      Rollout r = testing::ActedRollout(p, obs, {}, 32, 8);
      // A reward of 200 at every step with gamma 0.99 and no dones: returns in the thousands.
      r.rewards = torch::full({32, 8}, 200.0f);
      r.dones = torch::zeros({32, 8});
      r.last_value = p->Value(obs.view({32, 8, 5})[31]).detach();
      last = trainer.Update(r, 0.0);
    }
    INFO(mode);
    CHECK(last.value_norm_mean > 1000);
    CHECK(last.explained_variance > 0.5);
    // Saved and loaded: the statistics come back with the weights.
    std::stringstream stream;
    {
      torch::serialize::OutputArchive out;
      p->save(out);
      out.save_to(stream);
    }
    ActorCritic q = Policy(7, true);
    torch::serialize::InputArchive in;
    in.load_from(stream);
    q->load(in);
    CHECK(q->value_norm_mean().item<double>() == p->value_norm_mean().item<double>());
    CHECK(q->value_norm_moments().equal(p->value_norm_moments()));
  }
}

TEST_CASE("value_norm is refused where it cannot run, naming the keys", "[value_norm]") {
  FarmConfig c;
  c.ppo.value_norm = "popart";
  CHECK(ValidateConfig(c).ok());
  c.ppo.fused_update = "on";
  c.learner.device = "cpu";
  CHECK_THAT(ValidateConfig(c).message(), Catch::Contains("ppo.value_norm=popart cannot run with ppo.fused_update=on"));
  c.ppo.fused_update = "auto";
  c.ppo.graph_update = "on";  // the graphed step takes it (ppo_graph_test holds it to the LibTorch update)
  CHECK(ValidateConfig(c).ok());
  FarmConfig bad;
  CHECK_THAT(ParseConfig("ppo:\n  value_norm: popular\n", "test", &bad).message(), Catch::Contains("ppo.value_norm"));
  // A policy built without value normalisation cannot be trained with it, and the other way round.
  CHECK_THROWS_WITH(PpoTrainer(Policy(8, false), Config("running", "gae"), 1), Catch::Contains("ppo.value_norm is running"));
  CHECK_THROWS_WITH(PpoTrainer(Policy(8, true), Config("none", "gae"), 1), Catch::Contains("ppo.value_norm: expected"));
  // The fused update falls back (auto) rather than train without it.
  PpoConfig fused = Config("running", "gae");
  fused.fused_update = "auto";
  CHECK_FALSE(PpoTrainer(Policy(8, true), fused, 1).fused());
}

}  // namespace
}  // namespace farm
