// Tests for the PPO pieces: GAE and the loss against hand-computed numbers, the ActorCritic's contracts,
// and smoke tests that PPO learns a discrete and a continuous bandit.
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <sstream>
#include <vector>

#include "learner/model/policy.h"
#include "learner/train/ppo.h"

// LibTorch includes glog, whose one-argument CHECK would silently replace Catch's (and abort on failure
// instead of reporting): include Catch last and drop glog's macro first.
#undef CHECK
#include <catch2/catch.hpp>

namespace farm {
namespace {

torch::Tensor T1(std::vector<float> values) { return torch::tensor(values, torch::kFloat32); }

// [T, N] from rows given time-major.
torch::Tensor T2(std::vector<std::vector<float>> rows) {
  std::vector<torch::Tensor> ts;
  for (auto& row : rows) ts.push_back(T1(row));
  return torch::stack(ts);
}

void RequireClose(const torch::Tensor& actual, const torch::Tensor& expected, double tol = 1e-5) {
  INFO("actual " << actual << "\nexpected " << expected);
  REQUIRE(actual.sizes() == expected.sizes());
  REQUIRE(torch::allclose(actual.to(torch::kFloat64), expected.to(torch::kFloat64), /*rtol=*/0, /*atol=*/tol));
}

double Item(const torch::Tensor& t) { return t.item<double>(); }

}  // namespace

TEST_CASE("GAE matches a hand-computed case with a done in the middle", "[ppo]") {
  // gamma = 0.5, lambda = 0.5, so gamma * lambda = 0.25. Columns are envs, rows are time steps.
  const torch::Tensor rewards = T2({{1, 0}, {2, 1}, {3, 0}});
  const torch::Tensor values = T2({{0.5f, 1}, {1, 0}, {1.5f, 2}});
  const torch::Tensor dones = T2({{0, 0}, {1, 0}, {0, 1}});
  const torch::Tensor last_value = T1({2, 4});
  const Advantages gae = ComputeGae(rewards, values, dones, last_value, 0.5, 0.5);

  // env 0 (done at t=1, so t=1 does not bootstrap from t=2):
  //   t=2: delta = 3 + 0.5 * 2.0 * 1 - 1.5 = 2.5;     A = 2.5
  //   t=1: delta = 2 + 0.5 * 1.5 * 0 - 1.0 = 1.0;     A = 1.0 + 0.25 * 0 * 2.5 = 1.0
  //   t=0: delta = 1 + 0.5 * 1.0 * 1 - 0.5 = 1.0;     A = 1.0 + 0.25 * 1.0 = 1.25
  // env 1 (done at t=2, so last_value = 4 is ignored):
  //   t=2: delta = 0 + 0.5 * 4.0 * 0 - 2.0 = -2.0;    A = -2.0
  //   t=1: delta = 1 + 0.5 * 2.0 * 1 - 0.0 = 2.0;     A = 2.0 + 0.25 * -2.0 = 1.5
  //   t=0: delta = 0 + 0.5 * 0.0 * 1 - 1.0 = -1.0;    A = -1.0 + 0.25 * 1.5 = -0.625
  RequireClose(gae.advantages, T2({{1.25f, -0.625f}, {1.0f, 1.5f}, {2.5f, -2.0f}}));
  // returns = advantages + values
  RequireClose(gae.returns, T2({{1.75f, 0.375f}, {2.0f, 1.5f}, {4.0f, 0.0f}}));
}

TEST_CASE("GAE with lambda = 1 and no dones is the discounted return minus the value", "[ppo]") {
  // gamma = 0.5: G_0 = 1 + 0.5 * 1 + 0.25 * 1 + 0.125 * V_T(=8) = 2.75; A_0 = 2.75 - V_0(=1) = 1.75.
  const Advantages gae = ComputeGae(T2({{1}, {1}, {1}}), T2({{1}, {2}, {3}}), T2({{0}, {0}, {0}}), T1({8}), 0.5, 1.0);
  // G_1 = 1 + 0.5 * 1 + 0.25 * 8 = 3.5 (A = 1.5); G_2 = 1 + 0.5 * 8 = 5 (A = 2).
  RequireClose(gae.returns, T2({{2.75f}, {3.5f}, {5.0f}}));
  RequireClose(gae.advantages, T2({{1.75f}, {1.5f}, {2.0f}}));
}

TEST_CASE("ClipGradNormOnDevice matches clip_grad_norm_, clipping and not clipping", "[ppo]") {
  torch::manual_seed(3);
  for (double max_norm : {0.5, 1e6}) {
    std::vector<torch::Tensor> a, b;
    for (auto shape : {std::vector<int64_t>{4, 3}, std::vector<int64_t>{3}, std::vector<int64_t>{2, 2, 2}}) {
      auto p = torch::randn(shape).requires_grad_(true);
      p.mutable_grad() = torch::randn(shape) * 3;
      auto q = p.detach().clone().requires_grad_(true);
      q.mutable_grad() = p.grad().clone();
      a.push_back(p);
      b.push_back(q);
    }
    a.push_back(torch::zeros({2}).requires_grad_(true));  // no grad: skipped by both
    b.push_back(torch::zeros({2}).requires_grad_(true));
    const double want = torch::nn::utils::clip_grad_norm_(a, max_norm);
    const torch::Tensor got = ClipGradNormOnDevice(b, max_norm);
    CHECK(got.scalar_type() == torch::kFloat64);
    CHECK(got.item<double>() == Approx(want).epsilon(1e-6));
    for (std::size_t i = 0; i + 1 < a.size(); ++i) CHECK(torch::allclose(a[i].grad(), b[i].grad(), 1e-6, 1e-7));
  }
}

TEST_CASE("GAE rejects mismatched shapes", "[ppo]") {
  const torch::Tensor r = torch::zeros({3, 2});
  REQUIRE_THROWS_AS(ComputeGae(r, torch::zeros({3, 1}), r, torch::zeros({2}), 0.9, 0.9), std::invalid_argument);
  REQUIRE_THROWS_AS(ComputeGae(r, r, r, torch::zeros({3}), 0.9, 0.9), std::invalid_argument);
  REQUIRE_THROWS_AS(ComputeGae(torch::zeros({6}), r, r, torch::zeros({2}), 0.9, 0.9), std::invalid_argument);
}

TEST_CASE("PPO loss matches a hand-computed case", "[ppo]") {
  // ratios r = [1.5, 0.5, 0.5, 1.1] built as new_logp = old_logp + log r; clip 0.2 -> [1.2, 0.8, 0.8, 1.1].
  const std::vector<float> ratios = {1.5f, 0.5f, 0.5f, 1.1f};
  const torch::Tensor old_logp = T1({-1.0f, -2.0f, -0.5f, -1.0f});
  const torch::Tensor new_logp = (old_logp + torch::log(T1(ratios))).requires_grad_(true);
  EvalOutput eval;
  eval.logp = new_logp;
  eval.entropy = T1({1.0f, 2.0f, 0.5f, 0.5f});  // mean 1.0
  eval.value = T1({1.0f, 0.0f, 3.0f, -1.0f});
  const torch::Tensor old_values = T1({0.5f, 0.1f, 2.0f, 0.0f});
  const torch::Tensor returns = T1({2.0f, 0.0f, 2.5f, 1.0f});
  const torch::Tensor advantages = T1({1.0f, 1.0f, -2.0f, 2.0f});

  PpoConfig config;
  config.clip_coef = 0.2;
  config.ent_coef = 0.01;
  config.vf_coef = 0.5;
  config.norm_adv = false;

  SECTION("clipped value loss, raw advantages") {
    config.clip_vloss = true;
    const PpoLoss loss = ComputePpoLoss(eval, old_logp, old_values, advantages, returns, config);
    // max(-A r, -A clip(r)):
    //   s0: A=1,  max(-1.5, -1.2) = -1.2   (clipped branch)
    //   s1: A=1,  max(-0.5, -0.8) = -0.5   (unclipped: ratio fell but advantage is positive)
    //   s2: A=-2, max( 1.0,  1.6) =  1.6   (clipped branch)
    //   s3: A=2,  max(-2.2, -2.2) = -2.2
    // mean = (-1.2 - 0.5 + 1.6 - 2.2) / 4 = -0.575
    CHECK(Item(loss.policy_loss) == Approx(-0.575).margin(1e-6));
    // (v - R)^2 vs (old_v + clamp(v - old_v, +-0.2) - R)^2:
    //   s0: (1-2)^2 = 1     vs (0.7-2)^2 = 1.69   -> 1.69 (clipped larger)
    //   s1: (0-0)^2 = 0     vs (0.0-0)^2 = 0      -> 0
    //   s2: (3-2.5)^2 = .25 vs (2.2-2.5)^2 = .09  -> 0.25 (unclipped larger)
    //   s3: (-1-1)^2 = 4    vs (-0.2-1)^2 = 1.44  -> 4
    // 0.5 * mean = 0.5 * 5.94 / 4 = 0.7425
    CHECK(Item(loss.value_loss) == Approx(0.7425).margin(1e-6));
    CHECK(Item(loss.entropy) == Approx(1.0).margin(1e-6));
    // total = -0.575 - 0.01 * 1.0 + 0.5 * 0.7425 = -0.21375
    CHECK(Item(loss.total) == Approx(-0.21375).margin(1e-6));
    // |r - 1| > 0.2 for s0, s1, s2 -> 3/4.
    CHECK(Item(loss.clip_fraction) == Approx(0.75).margin(1e-7));
    // mean((r - 1) - log r) = (0.0945349 + 0.1931472 + 0.1931472 + 0.0046898) / 4 = 0.1213798
    CHECK(Item(loss.approx_kl) == Approx(0.1213798).margin(1e-6));
    // mean(-log r) = (-0.4054651 + 0.6931472 + 0.6931472 - 0.0953102) / 4 = 0.2213798
    CHECK(Item(loss.old_approx_kl) == Approx(0.2213798).margin(1e-6));

    // Gradient of the policy loss wrt new logp: zero where the clipped branch wins (s0, s2),
    // -A * r / 4 elsewhere: s1 -> -0.125, s3 -> -0.55. (Entropy and value here are constants.)
    loss.total.backward();
    RequireClose(new_logp.grad(), T1({0.0f, -0.125f, 0.0f, -0.55f}), 1e-6);
  }

  SECTION("unclipped value loss") {
    config.clip_vloss = false;
    const PpoLoss loss = ComputePpoLoss(eval, old_logp, old_values, advantages, returns, config);
    // 0.5 * mean(1, 0, 0.25, 4) = 0.5 * 5.25 / 4 = 0.65625
    CHECK(Item(loss.value_loss) == Approx(0.65625).margin(1e-6));
    // total = -0.575 - 0.01 + 0.5 * 0.65625 = -0.256875
    CHECK(Item(loss.total) == Approx(-0.256875).margin(1e-6));
  }

  SECTION("normalised advantages") {
    config.norm_adv = true;
    const PpoLoss loss = ComputePpoLoss(eval, old_logp, old_values, advantages, returns, config);
    // A = [1, 1, -2, 2]: mean 0.5, deviations [0.5, 0.5, -2.5, 1.5], unbiased var = (0.25+0.25+6.25+2.25)/3 = 3,
    // so A' = [0.5, 0.5, -2.5, 1.5] / sqrt(3). In units of 1/sqrt(3) the per-sample maxima are
    //   s0: max(-0.75, -0.6) = -0.6; s1: max(-0.25, -0.4) = -0.25; s2: max(1.25, 2.0) = 2.0; s3: -1.65
    // sum = -0.5, so the loss = -0.5 / sqrt(3) / 4 = -0.0721688.
    CHECK(Item(loss.policy_loss) == Approx(-0.0721688).margin(1e-6));
    // Normalisation touches neither the KL nor the clip fraction.
    CHECK(Item(loss.clip_fraction) == Approx(0.75).margin(1e-7));
    CHECK(Item(loss.approx_kl) == Approx(0.1213798).margin(1e-6));
  }

  SECTION("a [B, 1] input is rejected instead of broadcast") {
    REQUIRE_THROWS_AS(ComputePpoLoss(eval, old_logp, old_values, advantages.unsqueeze(1), returns, config),
                      std::invalid_argument);
  }
}

TEST_CASE("ActorCritic shapes, init, sampling and copying", "[ppo]") {
  torch::manual_seed(0);
  const std::vector<int> hidden = {16, 16};
  const int64_t batch = 5;

  SECTION("discrete") {
    ActorCritic net(Space::Box({4}, {-1}, {1}), Space::Discrete(3), hidden);
    const torch::Tensor obs = torch::randn({batch, 4});
    const ActOutput act = net->Act(obs);
    CHECK(act.action.sizes() == torch::IntArrayRef{batch});
    CHECK(act.action.scalar_type() == torch::kLong);
    CHECK(act.action.min().item<int64_t>() >= 0);
    CHECK(act.action.max().item<int64_t>() < 3);
    CHECK(act.logp.sizes() == torch::IntArrayRef{batch});
    CHECK(act.value.sizes() == torch::IntArrayRef{batch});
    CHECK(net->Value(obs).sizes() == torch::IntArrayRef{batch});

    const EvalOutput eval = net->Evaluate(obs, act.action);
    CHECK(eval.entropy.sizes() == torch::IntArrayRef{batch});
    RequireClose(eval.logp, act.logp, 1e-6);
    RequireClose(eval.value, act.value, 1e-6);
    // Near-uniform initial policy: entropy close to log 3.
    CHECK(eval.entropy.mean().item<double>() == Approx(std::log(3.0)).margin(1e-3));

    // Deterministic = the action with the highest log-prob.
    std::vector<torch::Tensor> per_action;
    for (int64_t a = 0; a < 3; ++a) {
      per_action.push_back(net->Evaluate(obs, torch::full({batch}, a, torch::kLong)).logp);
    }
    const torch::Tensor argmax = torch::stack(per_action, 1).argmax(1);
    CHECK(torch::equal(net->Act(obs, /*deterministic=*/true).action, argmax));

    // Init: orthogonal rows scaled by the gain, zero biases. Layout: actor.{0,2,4} Linear, {1,3} Tanh.
    const auto params = net->named_parameters();
    const torch::Tensor head = params["actor.4.weight"];  // [3, 16]: orthonormal rows * 0.01
    RequireClose(head.matmul(head.t()), 1e-4 * torch::eye(3), 1e-6);
    const torch::Tensor value_head = params["critic.4.weight"];  // [1, 16]: unit row * 1.0
    CHECK(value_head.norm().item<double>() == Approx(1.0).margin(1e-5));
    const torch::Tensor first = params["actor.0.weight"];  // [16, 4]: orthonormal columns * sqrt(2)
    RequireClose(first.t().matmul(first), 2.0 * torch::eye(4), 1e-5);
    const torch::Tensor square = params["critic.2.weight"];  // [16, 16]: W W^T = 2 I
    RequireClose(square.matmul(square.t()), 2.0 * torch::eye(16), 1e-5);
    for (const auto& item : params) {
      if (item.key().find("bias") != std::string::npos) CHECK(item.value().abs().max().item<double>() == 0.0);
    }
    CHECK(params.find("log_std") == nullptr);
  }

  SECTION("box") {
    // A [2, 3] observation is flattened to 6 inputs; a 2-dim action.
    ActorCritic net(Space::Box({2, 3}, {-1}, {1}), Space::Box({2}, {-1}, {1}), hidden);
    const torch::Tensor obs = torch::randn({batch, 2, 3});
    const ActOutput act = net->Act(obs);
    CHECK(act.action.sizes() == torch::IntArrayRef{batch, 2});
    CHECK(act.action.scalar_type() == torch::kFloat32);
    CHECK(act.logp.sizes() == torch::IntArrayRef{batch});
    CHECK(act.value.sizes() == torch::IntArrayRef{batch});

    const EvalOutput eval = net->Evaluate(obs, act.action);
    RequireClose(eval.logp, act.logp, 1e-5);
    // log_std = 0: entropy = 2 * (0.5 + 0.5 log(2 pi)) = 2.8378771 for every row.
    RequireClose(eval.entropy, torch::full({batch}, 2.8378771f), 1e-5);

    const auto params = net->named_parameters();
    REQUIRE(params.find("log_std") != nullptr);
    RequireClose(params["log_std"], torch::zeros({2}), 0);
    const torch::Tensor head = params["actor.4.weight"];  // [2, 16]
    RequireClose(head.matmul(head.t()), 1e-4 * torch::eye(2), 1e-6);

    // Deterministic = the mean, whose log-prob is -2 * 0.5 log(2 pi) = -1.8378771 with log_std = 0.
    const ActOutput mode = net->Act(obs, /*deterministic=*/true);
    RequireClose(mode.logp, torch::full({batch}, -1.8378771f), 1e-5);
    RequireClose(net->Evaluate(obs, mode.action).logp, mode.logp, 1e-5);
    CHECK(torch::equal(net->Act(obs, true).action, mode.action));
    // Sampling is unclipped: with std 1 some of 1000 samples leave [-1, 1].
    CHECK(net->Act(torch::randn({1000, 2, 3})).action.abs().max().item<double>() > 1.0);

    // Logp of non-sampled actions: a = mean + 1 in both dims -> -0.5 * 2 - 1.8378771.
    RequireClose(net->Evaluate(obs, mode.action + 1).logp, torch::full({batch}, -2.8378771f), 1e-5);
  }

  SECTION("box with log_std_init") {
    // ppo.log_std_init -1: every log-std entry starts at -1, so the samples' spread around the mean is e^-1
    // and the entropy 2 * (0.5 + 0.5 log(2 pi) - 1) per row.
    PolicyOptions options;
    options.log_std_init = -1.0;
    ActorCritic net(Space::Box({4}, {-1}, {1}), Space::Box({2}, {-1}, {1}), hidden, options);
    RequireClose(net->named_parameters()["log_std"], torch::full({2}, -1.0f), 0);
    const torch::Tensor obs = torch::randn({1, 4}).expand({20000, 4}).contiguous();
    const torch::Tensor mean = net->Act(obs, /*deterministic=*/true).action;
    const torch::Tensor spread = (net->Act(obs).action - mean).std(/*dim=*/0);
    RequireClose(spread, torch::full({2}, std::exp(-1.0f)), 0.01);
    RequireClose(net->Evaluate(obs.slice(0, 0, batch), mean.slice(0, 0, batch)).entropy,
                 torch::full({batch}, 0.8378771f), 1e-5);
  }

  SECTION("CopyFrom and save/load make outputs equal") {
    const Space obs_space = Space::Box({4}, {-1}, {1});
    const Space act_space = Space::Box({2}, {-1}, {1});
    ActorCritic a(obs_space, act_space, hidden);
    ActorCritic b(obs_space, act_space, hidden);
    {
      torch::NoGradGuard no_grad;
      a->named_parameters()["log_std"].fill_(-0.5);
    }
    const torch::Tensor obs = torch::randn({batch, 4});
    const torch::Tensor actions = torch::randn({batch, 2});
    CHECK_FALSE(torch::allclose(a->Value(obs), b->Value(obs)));

    b->CopyFrom(*a);
    CHECK(torch::equal(a->Value(obs), b->Value(obs)));
    CHECK(torch::equal(a->Act(obs, true).action, b->Act(obs, true).action));
    CHECK(torch::equal(a->Evaluate(obs, actions).logp, b->Evaluate(obs, actions).logp));
    // A copy, not an alias: changing the source leaves the copy alone.
    {
      torch::NoGradGuard no_grad;
      a->named_parameters()["critic.4.bias"].fill_(1.0);
    }
    CHECK_FALSE(torch::allclose(a->Value(obs), b->Value(obs)));

    ActorCritic wider(obs_space, act_space, std::vector<int>{32, 16});
    REQUIRE_THROWS_AS(b->CopyFrom(*wider), std::invalid_argument);
    ActorCritic discrete(obs_space, Space::Discrete(2), hidden);
    REQUIRE_THROWS_AS(b->CopyFrom(*discrete), std::invalid_argument);

    std::stringstream stream;
    torch::save(a, stream);
    ActorCritic loaded(obs_space, act_space, hidden);
    torch::load(loaded, stream);
    CHECK(torch::equal(a->Value(obs), loaded->Value(obs)));
    CHECK(torch::equal(a->Evaluate(obs, actions).logp, loaded->Evaluate(obs, actions).logp));
  }
}

namespace {

// Contextual bandit: obs[0] is a +-1 cue, obs[1..3] noise; reward 1 when the action is (cue > 0), else 0.
struct DiscreteBandit {
  static torch::Tensor Observe(int64_t rows) {
    torch::Tensor obs = torch::rand({rows, 4}) * 2 - 1;
    obs.select(1, 0).copy_(torch::randint(0, 2, {rows}, torch::kFloat32) * 2 - 1);
    return obs;
  }
  static torch::Tensor Reward(const torch::Tensor& obs, const torch::Tensor& action) {
    return (action == (obs.select(1, 0) > 0).to(torch::kLong)).to(torch::kFloat32);
  }
};

// Target matching: obs[0] is a target in [-1, 1], obs[1..3] noise; reward -(a - target)^2.
struct ContinuousBandit {
  static torch::Tensor Observe(int64_t rows) { return torch::rand({rows, 4}) * 2 - 1; }
  static torch::Tensor Reward(const torch::Tensor& obs, const torch::Tensor& action) {
    return -(action.select(1, 0) - obs.select(1, 0)).square();
  }
};

// The PPO settings both continuous-bandit tests train with (a constant, large learning rate: 40 short updates).
PpoConfig ContinuousBanditConfig() {
  PpoConfig config;
  config.lr = 3e-3;
  config.anneal_lr = false;
  config.ent_coef = 0.0;
  config.update_epochs = 4;
  config.num_minibatches = 4;
  return config;
}

// One rollout of a one-step-episode bandit, acted under InferenceMode as the learner's hot path does it.
template <class Bandit>
Rollout CollectBandit(ActorCritic& net, int64_t steps, int64_t envs) {
  c10::InferenceMode inference;
  const torch::Tensor obs = Bandit::Observe(steps * envs);
  const ActOutput act = net->Act(obs);
  Rollout r;
  r.obs = obs.reshape({steps, envs, 4});
  r.actions = act.action.reshape(act.action.dim() == 1 ? std::vector<int64_t>{steps, envs}
                                                       : std::vector<int64_t>{steps, envs, act.action.size(1)});
  r.logp = act.logp.reshape({steps, envs});
  r.values = act.value.reshape({steps, envs});
  r.rewards = Bandit::Reward(obs, act.action).reshape({steps, envs});
  r.dones = torch::ones({steps, envs});
  r.last_value = torch::zeros({envs});
  return r;
}

template <class Bandit>
double MeanReward(ActorCritic& net, bool deterministic) {
  c10::InferenceMode inference;
  const torch::Tensor obs = Bandit::Observe(2000);
  return Item(Bandit::Reward(obs, net->Act(obs, deterministic).action).mean());
}

void RequireFiniteStats(const PpoStats& stats) {
  for (const auto& [name, value] : stats.Items()) {
    INFO(name << " = " << value);
    // Explained variance is NaN by contract when the returns have zero variance.
    if (name == "explained_variance") {
      CHECK((std::isfinite(value) || std::isnan(value)));
    } else {
      CHECK(std::isfinite(value));
    }
  }
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

TEST_CASE("PpoTrainer bookkeeping: annealed LR, epochs, samples, target KL", "[ppo]") {
  torch::manual_seed(1);
  ActorCritic net(Space::Box({4}, {-1}, {1}), Space::Discrete(2), std::vector<int>{8});
  PpoConfig config;
  config.lr = 1e-2;
  config.anneal_lr = true;
  config.update_epochs = 3;
  config.num_minibatches = 3;  // 20 samples: minibatches of 6, 7, 7
  PpoTrainer trainer(net, config, /*seed=*/7);
  const Rollout rollout = CollectBandit<DiscreteBandit>(net, 5, 4);

  const PpoStats stats = trainer.Update(rollout, /*progress=*/0.25);
  CHECK(stats.samples == 20);
  CHECK(stats.epochs == 3);
  CHECK(stats.learning_rate == Approx(7.5e-3));
  for (auto& group : trainer.optimizer().param_groups()) {
    CHECK(static_cast<torch::optim::AdamOptions&>(group.options()).lr() == Approx(7.5e-3));
    CHECK(static_cast<torch::optim::AdamOptions&>(group.options()).eps() == Approx(1e-5));
  }
  CHECK(stats.approx_kl > 0);
  CHECK(stats.grad_norm > 0);
  RequireFiniteStats(stats);
  CHECK(stats.Items().size() == 17);  // 3 more with ppo.advantage=vtrace

  SECTION("target KL stops after the first epoch") {
    PpoConfig strict = config;
    strict.target_kl = 1e-12;
    PpoTrainer stopping(net, strict, 7);
    CHECK(stopping.Update(rollout, 0.0).epochs == 1);
  }
  SECTION("no annealing keeps the base LR") {
    PpoConfig flat = config;
    flat.anneal_lr = false;
    PpoTrainer plain(net, flat, 7);
    CHECK(plain.Update(rollout, 0.9).learning_rate == Approx(1e-2));
  }
  SECTION("the trainer's seed fixes the shuffling") {
    ActorCritic x(Space::Box({4}, {-1}, {1}), Space::Discrete(2), std::vector<int>{8});
    ActorCritic y(Space::Box({4}, {-1}, {1}), Space::Discrete(2), std::vector<int>{8});
    y->CopyFrom(*x);
    PpoTrainer tx(x, config, 3), ty(y, config, 3);
    tx.Update(rollout, 0.0);
    ty.Update(rollout, 0.0);
    const torch::Tensor obs = DiscreteBandit::Observe(8);
    CHECK(torch::equal(x->Value(obs), y->Value(obs)));
  }
}

TEST_CASE("PPO learns a basic pattern: discrete contextual bandit", "[ppo]") {
  torch::manual_seed(42);
  at::set_num_threads(1);
  const auto start = std::chrono::steady_clock::now();
  ActorCritic net(Space::Box({4}, {-1}, {1}), Space::Discrete(2), std::vector<int>{32, 32});
  PpoConfig config;
  config.lr = 3e-3;
  config.anneal_lr = false;
  config.update_epochs = 4;
  config.num_minibatches = 4;
  PpoTrainer trainer(net, config, /*seed=*/42);

  const double before = MeanReward<DiscreteBandit>(net, false);
  CHECK(before == Approx(0.5).margin(0.1));  // near-uniform initial policy
  const int kUpdates = 30;
  PpoStats stats;
  for (int i = 0; i < kUpdates; ++i) {
    stats = trainer.Update(CollectBandit<DiscreteBandit>(net, 16, 16), static_cast<double>(i) / kUpdates);
    RequireFiniteStats(stats);
  }
  const double after = MeanReward<DiscreteBandit>(net, false);
  INFO("mean reward " << before << " -> " << after << " in " << SecondsSince(start) << " s");
  CHECK(after > 0.9);
  CHECK(MeanReward<DiscreteBandit>(net, true) > 0.97);
  CHECK(stats.entropy < std::log(2.0) - 0.1);  // the policy became confident
}

TEST_CASE("PPO learns a basic pattern: continuous target matching", "[ppo]") {
  torch::manual_seed(43);
  at::set_num_threads(1);
  const auto start = std::chrono::steady_clock::now();
  ActorCritic net(Space::Box({4}, {-1}, {1}), Space::Box({1}, {-2}, {2}), std::vector<int>{32, 32});
  PpoConfig config = ContinuousBanditConfig();
  PpoTrainer trainer(net, config, /*seed=*/43);

  // Initially mean ~ 0 and std 1: E[-(a - t)^2] = -(1 + E[t^2]) = -(1 + 1/3).
  const double before = MeanReward<ContinuousBandit>(net, false);
  const double before_mode = MeanReward<ContinuousBandit>(net, true);
  const int kUpdates = 40;
  PpoStats stats;
  for (int i = 0; i < kUpdates; ++i) {
    stats = trainer.Update(CollectBandit<ContinuousBandit>(net, 16, 16), static_cast<double>(i) / kUpdates);
    RequireFiniteStats(stats);
  }
  const double after = MeanReward<ContinuousBandit>(net, false);
  const double after_mode = MeanReward<ContinuousBandit>(net, true);
  INFO("stochastic " << before << " -> " << after << ", mean action " << before_mode << " -> " << after_mode << " in "
                     << SecondsSince(start) << " s");
  CHECK(before == Approx(-4.0 / 3.0).margin(0.15));
  CHECK(after > before + 0.5);           // std shrank and the mean moved to the target
  CHECK(after > -0.2);
  CHECK(after_mode > 0.1 * before_mode);  // the mean action's squared error fell by over 90%
  CHECK(net->named_parameters()["log_std"].item<double>() < -0.2);
}

}  // namespace farm

namespace farm {

TEST_CASE("gSDE: the std depends on the state through the actor's last hidden layer", "[ppo][sde]") {
  torch::manual_seed(7);
  namespace F = torch::nn::functional;
  PolicyOptions options;
  options.sde = true;
  options.log_std_init = -1.0;
  ActorCritic net(Space::Box({4}, {-1}, {1}), Space::Box({2}, {-2}, {2}), std::vector<int>{16, 8}, options);
  CHECK(net->sde_latent_size() == 8);
  const auto params = net->named_parameters();
  RequireClose(params["log_std"], torch::full({8, 2}, -1.0f), 0);  // a [latent, action] matrix

  // By hand: z = the second tanh layer's output, the mean its linear head, var_k = sum_j z_j^2 sigma_jk^2 + 1e-6.
  const torch::Tensor obs = torch::randn({5, 4});
  torch::Tensor z, mean, var;
  {
    torch::NoGradGuard no_grad;
    const torch::Tensor h = torch::tanh(F::linear(obs, params["actor.0.weight"], params["actor.0.bias"]));
    z = torch::tanh(F::linear(h, params["actor.2.weight"], params["actor.2.bias"]));
    mean = F::linear(z, params["actor.4.weight"], params["actor.4.bias"]);
    var = z.square().matmul(params["log_std"].exp().square()) + 1e-6;
  }
  const double kLog2PiHalf = 0.91893853320467274;
  const torch::Tensor log_norm = (0.5 * var.log()).sum(-1) + 2 * kLog2PiHalf;

  const ActOutput mode = net->Act(obs, {}, /*deterministic=*/true);
  RequireClose(mode.action, mean, 1e-6);
  RequireClose(mode.logp, -log_norm, 1e-5);

  // Held matrices W: the noise is z . (W * sigma); the same W gives the same actions.
  const torch::Tensor w = torch::randn({5, 8, 2});
  const ActOutput held = net->Act(obs, {}, false, true, w);
  RequireClose(held.action, mean + (z.unsqueeze(-1) * w * params["log_std"].detach().exp()).sum(1), 1e-5);
  CHECK(torch::equal(net->Act(obs, {}, false, true, w).action, held.action));
  CHECK_FALSE(torch::allclose(net->Act(obs, {}, false, true, torch::randn({5, 8, 2})).action, held.action));
  // Its log-prob is N(mean, sqrt(var))'s, as Evaluate computes it; the entropy is the Gaussian's with that var.
  const EvalOutput eval = net->Evaluate(obs, held.action);
  const torch::Tensor diff = held.action.detach() - mean;
  RequireClose(eval.logp, (-0.5 * diff.square() / var).sum(-1) - log_norm, 1e-4);
  RequireClose(held.logp, eval.logp.detach(), 1e-4);
  RequireClose(eval.entropy, (0.5 * var.log() + 0.5 + kLog2PiHalf).sum(-1), 1e-5);

  // Fresh draws per row (no W given), and fresh W per row: both spread as sqrt(var) around the mean.
  const torch::Tensor one = obs.slice(0, 0, 1).expand({20000, 4}).contiguous();
  RequireClose((net->Act(one).action - mean[0]).std(0), var[0].sqrt(), 0.03 * var[0].sqrt().max().item<double>());
  RequireClose((net->Act(one, {}, false, true, torch::randn({20000, 8, 2})).action - mean[0]).std(0), var[0].sqrt(),
               0.03 * var[0].sqrt().max().item<double>());

  // The std trains sigma only (z detached, as SB3's learn_features=False): at the mean, the log-prob's gradient
  // reaches log_std but no actor weight (the mean's own gradient is zero there).
  net->zero_grad();
  net->Evaluate(obs, mode.action.detach()).logp.sum().backward();
  const torch::Tensor first_grad = params["actor.0.weight"].grad();
  CHECK((!first_grad.defined() || first_grad.abs().max().item<double>() == 0.0));
  CHECK(params["log_std"].grad().abs().max().item<double>() > 0.0);
  // Away from the mean the actor is trained through the mean.
  net->zero_grad();
  net->Evaluate(obs, mode.action.detach() + 0.5).logp.sum().backward();
  CHECK(params["actor.0.weight"].grad().abs().max().item<double>() > 0.0);

  REQUIRE_THROWS_WITH(net->Act(obs, {}, false, true, torch::randn({5, 7, 2})), Catch::Contains("sde_noise must be [5, 8, 2]"));
  REQUIRE_THROWS_WITH(ActorCritic(Space::Box({4}, {-1}, {1}), Space::Discrete(3), std::vector<int>{16}, options),
                      Catch::Contains("needs a box action space"));
  // A CopyFrom between sde and state-independent policies is refused (log_std's shapes differ).
  ActorCritic plain(Space::Box({4}, {-1}, {1}), Space::Box({2}, {-2}, {2}), std::vector<int>{16, 8});
  REQUIRE_THROWS_AS(plain->CopyFrom(*net), std::invalid_argument);
}

TEST_CASE("PPO with gSDE learns the continuous target matching", "[ppo][sde]") {
  torch::manual_seed(43);
  at::set_num_threads(1);
  PolicyOptions options;
  options.sde = true;
  ActorCritic net(Space::Box({4}, {-1}, {1}), Space::Box({1}, {-2}, {2}), std::vector<int>{32, 32}, options);
  PpoConfig config = ContinuousBanditConfig();
  config.sde = true;
  PpoTrainer trainer(net, config, /*seed=*/43);
  CHECK_FALSE(trainer.fused());  // auto: the fused update has no sde, so the LibTorch one runs
  config.fused_update = "on";
  REQUIRE_THROWS_WITH(PpoTrainer(net, config, 43), Catch::Contains("no state-dependent exploration"));

  const double before = MeanReward<ContinuousBandit>(net, false);
  const double log_std_before = net->named_parameters()["log_std"].mean().item<double>();
  const int kUpdates = 40;
  for (int i = 0; i < kUpdates; ++i) {
    const PpoStats stats = trainer.Update(CollectBandit<ContinuousBandit>(net, 16, 16), 0.0);
    RequireFiniteStats(stats);
  }
  const double after = MeanReward<ContinuousBandit>(net, false);
  const double after_mode = MeanReward<ContinuousBandit>(net, true);
  const double log_std_after = net->named_parameters()["log_std"].mean().item<double>();
  INFO("stochastic " << before << " -> " << after << ", mean action " << after_mode << ", log_std mean "
                     << log_std_before << " -> " << log_std_after);
  CHECK(after > before + 0.5);
  CHECK(after > -0.2);
  CHECK(after_mode > -0.1);
  CHECK(log_std_after < log_std_before - 0.2);  // the exploration narrowed
}

}  // namespace farm
