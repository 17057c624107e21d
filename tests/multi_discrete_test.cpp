// Multi-discrete action spaces in the learner: the policy's per-component categorical heads (log-probs and
// entropies summed, sampling, modes) against an independent reference, the trajectory store, the choice of
// update path, and PPO learning a multi-discrete contextual bandit.
#include <torch/torch.h>

#include <cmath>
#include <memory>
#include <vector>

#include "common/space.h"
#include "learner/model/policy.h"
#include "learner/train/ppo.h"
#include "learner/train/trajectory_store.h"
#include "tests/ppo_test_util.h"
#include "tests/store_test_util.h"

// LibTorch pulls in glog, whose CHECK would replace Catch's: include Catch last.
#undef CHECK
#include <catch2/catch.hpp>

namespace farm {
namespace {

using testing::StepWithoutEnding;

// The actor's raw head [B, sum(nvec)], straight from its MLP (ActorFeatures is the identity for mlp).
torch::Tensor Logits(ActorCritic& net, const torch::Tensor& obs) {
  auto actor = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(net->named_children()["actor"]);
  REQUIRE(actor != nullptr);
  return actor->forward(obs);
}

// Makes the head's logits large and varied, so that components have clearly different distributions.
void Sharpen(ActorCritic& net, double factor) {
  torch::NoGradGuard no_grad;
  auto params = net->named_parameters();
  std::string last;
  for (const auto& item : params)
    if (item.key().rfind("actor.", 0) == 0 && item.key().find(".weight") != std::string::npos) last = item.key();
  params[last].mul_(factor);
}

// Reference: component i's log-softmax over its own slice of the logits, written as a plain loop.
std::vector<torch::Tensor> ComponentLogProbs(const torch::Tensor& logits, const std::vector<int64_t>& nvec) {
  std::vector<torch::Tensor> out;
  int64_t offset = 0;
  for (int64_t n : nvec) {
    const torch::Tensor z = logits.narrow(1, offset, n);
    out.push_back(z - z.exp().sum(1, /*keepdim=*/true).log());
    offset += n;
  }
  return out;
}

}  // namespace

TEST_CASE("Space::MultiDiscrete: shape, numel, head size and its errors", "[multi_discrete]") {
  const Space s = Space::MultiDiscrete({2, 3, 4});
  CHECK(s.is_multi_discrete());
  CHECK(s.is_categorical());
  CHECK_FALSE(s.is_discrete());
  CHECK_FALSE(s.is_box());
  CHECK(s.dtype == DType::kInt64);
  CHECK(s.shape == std::vector<int64_t>{3});
  CHECK(s.numel() == 3);
  CHECK(s.head_size() == 9);
  CHECK(s.categories() == std::vector<int64_t>{2, 3, 4});
  CHECK(s.ToString() == "MultiDiscrete([2, 3, 4])");
  CHECK(s == Space::MultiDiscrete({2, 3, 4}));
  CHECK(s != Space::MultiDiscrete({2, 4, 3}));
  CHECK(Space::MultiDiscrete({5}) != Space::Discrete(5));
  CHECK(Space::Discrete(5).head_size() == 5);
  CHECK(Space::Discrete(5).categories() == std::vector<int64_t>{5});
  CHECK(Space::Box({2, 3}, {0}, {1}).head_size() == 6);
  CHECK(Space::Box({2, 3}, {0}, {1}).categories().empty());
  CHECK_THROWS_WITH(Space::MultiDiscrete({}), Catch::Contains("at least one component"));
  CHECK_THROWS_WITH(Space::MultiDiscrete({3, 0}), Catch::Contains("nvec[1] = 0"));
}

TEST_CASE("multi-discrete policy: log-probs and entropies are sums over the components", "[multi_discrete]") {
  torch::manual_seed(11);
  // {2, 3, 4} takes the per-component path, {3, 3, 3} the one-[B, K, n]-softmax path: both against the loop.
  const std::vector<int64_t> nvec = GENERATE(std::vector<int64_t>{2, 3, 4}, std::vector<int64_t>{3, 3, 3});
  INFO("nvec " << c10::str(nvec));
  const auto k = static_cast<int64_t>(nvec.size());
  ActorCritic net(Space::Box({5}, {-1}, {1}), Space::MultiDiscrete(nvec), std::vector<int>{16});
  Sharpen(net, 200.0);
  const torch::Tensor obs = torch::randn({64, 5});
  torch::NoGradGuard no_grad;
  const std::vector<torch::Tensor> ref = ComponentLogProbs(Logits(net, obs), nvec);

  const ActOutput sampled = net->Act(obs);
  REQUIRE(sampled.action.sizes() == torch::IntArrayRef({64, k}));
  REQUIRE(sampled.action.scalar_type() == torch::kInt64);
  torch::Tensor logp = torch::zeros({64}), entropy = torch::zeros({64});
  for (int64_t i = 0; i < k; ++i) {
    const torch::Tensor a = sampled.action.select(1, i);
    CHECK(a.min().item<int64_t>() >= 0);
    CHECK(a.max().item<int64_t>() < nvec[static_cast<std::size_t>(i)]);
    logp += ref[static_cast<std::size_t>(i)].gather(1, a.unsqueeze(1)).squeeze(1);
    entropy -= (ref[static_cast<std::size_t>(i)].exp() * ref[static_cast<std::size_t>(i)]).sum(1);
  }
  CHECK(testing::RelativeDiff(sampled.logp, logp) < 1e-5);

  const EvalOutput eval = net->Evaluate(obs, sampled.action);
  CHECK(testing::RelativeDiff(eval.logp, logp) < 1e-5);
  CHECK(testing::RelativeDiff(eval.entropy, entropy) < 1e-5);
  CHECK(testing::RelativeDiff(eval.value, sampled.value) < 1e-6);
  // The entropy of independent components is the sum of theirs: at most sum(log n_i), and not near it here.
  double max_entropy = 0;
  for (int64_t n : nvec) max_entropy += std::log(static_cast<double>(n));
  CHECK(eval.entropy.max().item<double>() <= max_entropy + 1e-5);
  CHECK(eval.entropy.mean().item<double>() < 0.9 * max_entropy);

  const ActOutput mode = net->Act(obs, /*deterministic=*/true);
  for (int64_t i = 0; i < k; ++i)
    CHECK(torch::equal(mode.action.select(1, i), ref[static_cast<std::size_t>(i)].argmax(1)));
}

TEST_CASE("multi-discrete policy: each component samples its own distribution", "[multi_discrete]") {
  torch::manual_seed(12);
  const std::vector<int64_t> nvec{2, 3, 4};
  ActorCritic net(Space::Box({5}, {-1}, {1}), Space::MultiDiscrete(nvec), std::vector<int>{16});
  Sharpen(net, 400.0);
  torch::NoGradGuard no_grad;
  constexpr int64_t kDraws = 40000;
  const torch::Tensor obs = torch::randn({1, 5}).expand({kDraws, 5}).contiguous();
  const std::vector<torch::Tensor> ref = ComponentLogProbs(Logits(net, obs.narrow(0, 0, 1)), nvec);
  const torch::Tensor actions = net->Act(obs).action;
  for (std::size_t i = 0; i < nvec.size(); ++i) {
    const torch::Tensor freq =
        torch::bincount(actions.select(1, static_cast<int64_t>(i)), {}, nvec[i]).to(torch::kFloat64) / kDraws;
    const torch::Tensor p = ref[i].exp().squeeze(0).to(torch::kFloat64);
    INFO("component " << i << ": frequencies " << freq << " probabilities " << p);
    // 4 standard errors of a frequency at p = 0.5 over 40000 draws: 0.01.
    CHECK((freq - p).abs().max().item<double>() < 0.01);
    CHECK(p.max().item<double>() - p.min().item<double>() > 0.1);  // a uniform head would prove little
  }
}

TEST_CASE("TrajectoryStore keeps K int64 actions per multi-discrete step", "[multi_discrete]") {
  TrajectoryStore store(/*T=*/2, /*obs_numel=*/1, Space::MultiDiscrete({2, 5}));
  const int a = store.AddGroup(2);
  const int b = store.AddGroup(1);
  const float obs[] = {0, 0}, logp[] = {0, 0}, value[] = {0, 0}, reward[] = {1, 1};
  const int64_t act_a0[] = {1, 4, 0, 3}, act_b0[] = {1, 2}, act_a1[] = {0, 1, 1, 0}, act_b1[] = {0, 4};
  StepWithoutEnding(store, a, obs, act_a0, logp, value, reward, 1);
  StepWithoutEnding(store, b, obs, act_b0, logp, value, reward, 1);
  StepWithoutEnding(store, a, obs, act_a1, logp, value, reward, 1);
  StepWithoutEnding(store, b, obs, act_b1, logp, value, reward, 1);
  REQUIRE(store.all_full());
  LagStats lag;
  const Rollout r = store.Take({1}, 1, &lag);
  REQUIRE(r.actions.scalar_type() == torch::kInt64);
  REQUIRE(r.actions.sizes() == torch::IntArrayRef({2, 3, 2}));
  const torch::Tensor expected =
      torch::tensor({1, 4, 0, 3, 1, 2, 0, 1, 1, 0, 0, 4}, torch::kInt64).reshape({2, 3, 2});
  CHECK(torch::equal(r.actions, expected));
}

TEST_CASE("multi-discrete update: the fused CPU path takes it under auto (tests/ppo_fused_test holds it to LibTorch's)",
          "[multi_discrete]") {
  torch::manual_seed(13);
  ActorCritic net(Space::Box({4}, {-1}, {1}), Space::MultiDiscrete({2, 3}), std::vector<int>{8});
  PpoConfig config;
  PpoTrainer automatic(net, config, 1);
  CHECK(automatic.fused());
  config.fused_update = "off";
  CHECK_FALSE(PpoTrainer(net, config, 1).fused());
}

namespace {

// A contextual bandit with a multi-discrete answer: K cues, cue i uniform in [0, nvec[i]), shown one-hot;
// the reward is the fraction of components answered with their cue (MultiCue-v0's step, without episodes).
struct MultiCueBandit {
  std::vector<int64_t> nvec;
  int64_t obs_dim() const {
    int64_t d = 0;
    for (int64_t n : nvec) d += n;
    return d;
  }
  // cues [B, K] -> one-hot observations [B, sum(nvec)].
  torch::Tensor Observe(const torch::Tensor& cues) const {
    std::vector<torch::Tensor> parts;
    for (std::size_t i = 0; i < nvec.size(); ++i)
      parts.push_back(torch::one_hot(cues.select(1, static_cast<int64_t>(i)), nvec[i]).to(torch::kFloat32));
    return torch::cat(parts, 1);
  }
  torch::Tensor Cues(int64_t rows) const {
    std::vector<torch::Tensor> cols;
    for (int64_t n : nvec) cols.push_back(torch::randint(n, {rows}, torch::kInt64));
    return torch::stack(cols, 1);
  }
  static torch::Tensor Reward(const torch::Tensor& actions, const torch::Tensor& cues) {
    return actions.eq(cues).to(torch::kFloat32).mean(1);
  }
};

double MeanReward(const MultiCueBandit& bandit, ActorCritic& net, bool deterministic) {
  torch::NoGradGuard no_grad;
  const torch::Tensor cues = bandit.Cues(4096);
  return MultiCueBandit::Reward(net->Act(bandit.Observe(cues), deterministic).action, cues).mean().item<double>();
}

}  // namespace

TEST_CASE("PPO learns a basic pattern: multi-discrete contextual bandit", "[multi_discrete][ppo]") {
  torch::manual_seed(44);
  at::set_num_threads(1);
  const MultiCueBandit bandit{{2, 3, 4}};
  ActorCritic net(Space::Box({bandit.obs_dim()}, {0}, {1}), Space::MultiDiscrete(bandit.nvec), std::vector<int>{32});
  PpoConfig config;
  config.lr = 3e-3;
  config.anneal_lr = false;
  config.update_epochs = 4;
  config.num_minibatches = 4;
  PpoTrainer trainer(net, config, /*seed=*/44);

  // A uniform answer matches component i with probability 1 / n_i: (1/2 + 1/3 + 1/4) / 3 = 0.361.
  const double before = MeanReward(bandit, net, false);
  CHECK(before == Approx(13.0 / 36.0).margin(0.05));
  constexpr int64_t kSteps = 16, kEnvs = 16;
  constexpr int kUpdates = 40;
  PpoStats stats;
  for (int u = 0; u < kUpdates; ++u) {
    const torch::Tensor cues = bandit.Cues(kSteps * kEnvs);
    const torch::Tensor obs = bandit.Observe(cues);
    Rollout r = testing::ActedRollout(net, obs, {}, kSteps, kEnvs);
    r.rewards = MultiCueBandit::Reward(r.actions.reshape({kSteps * kEnvs, 3}), cues).reshape({kSteps, kEnvs});
    r.dones = torch::ones({kSteps, kEnvs});  // one step per episode
    stats = trainer.Update(r, static_cast<double>(u) / kUpdates);
    REQUIRE(std::isfinite(stats.policy_loss));
    REQUIRE(std::isfinite(stats.entropy));
  }
  const double after = MeanReward(bandit, net, false);
  const double after_mode = MeanReward(bandit, net, true);
  INFO("mean reward " << before << " -> " << after << " (mode " << after_mode << "), entropy " << stats.entropy);
  CHECK(after > 0.9);
  CHECK(after_mode > 0.97);
  CHECK(stats.entropy < 0.5 * (std::log(2.0) + std::log(3.0) + std::log(4.0)));
}

}  // namespace farm
