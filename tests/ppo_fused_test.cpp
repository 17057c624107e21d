// The fused CPU update (learner/train/ppo_fused.h) against PpoTrainer's LibTorch path: from identical parameters,
// optimizer state and rollouts, both paths must produce the same parameters, Adam moments and statistics,
// for categorical and Gaussian heads and every loss option. A wrong gradient term moves some parameter by
// far more than the tolerance: each case also checks that every parameter did move by much more.
#include "learner/train/ppo_fused.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/config.h"
#include "learner/model/policy.h"
#include "learner/train/adam_state.h"
#include "learner/model/cpu_kernels.h"
#include "learner/train/ppo.h"
#include "tests/ppo_test_util.h"

// LibTorch includes glog, whose one-argument CHECK would silently replace Catch's: include Catch last.
#undef CHECK
#include <catch2/catch.hpp>

namespace farm {
namespace {

constexpr int64_t kObsDim = 5;

// The action spaces the fused update is held to the LibTorch one on: a categorical head, one per component of
// a multi-discrete space (log-probs and entropies summed), and a Gaussian.
const Space kDiscrete = Space::Discrete(3);
const Space kMultiDiscrete = Space::MultiDiscrete({2, 4, 3});
const Space kBox = Space::Box({2}, {-1}, {1});

ActorCritic MakePolicy(const Space& action, const std::vector<int>& hidden) {
  return ActorCritic(Space::Box({kObsDim}, {-1}, {1}), action, hidden);
}

// A rollout acted by `net` (so the first ratios are 1), with random rewards, dones and bootstrap values.
Rollout MakeRollout(ActorCritic& net, int64_t steps, int64_t envs) {
  return testing::ActedRollout(net, torch::randn({steps * envs, kObsDim}), {}, steps, envs);
}

using testing::RelativeDiff;

const torch::optim::AdamParamState& AdamState(torch::optim::Adam& optimizer, const torch::Tensor& param) {
  const auto& state = optimizer.state();
  const auto it = state.find(AdamStateKey(state, param));
  if (it == state.end()) throw std::logic_error("no Adam state for a parameter");
  return static_cast<const torch::optim::AdamParamState&>(*it->second);
}

constexpr double kTolerance = 1e-5;

// Parameters, Adam moments and step counts of two trainers agree; every parameter moved from `initial` by at
// least 20x the tolerance (so a missing or wrong gradient term cannot hide under it).
void RequireSameTraining(PpoTrainer& libtorch, PpoTrainer& fused,
                         const torch::OrderedDict<std::string, torch::Tensor>& initial,
                         double tolerance = kTolerance) {
  const auto a = libtorch.policy()->named_parameters();
  const auto b = fused.policy()->named_parameters();
  REQUIRE(a.size() == b.size());
  for (const auto& item : a) {
    INFO("parameter " << item.key());
    const torch::Tensor& pa = item.value();
    const torch::Tensor& pb = b[item.key()];
    const double diff = RelativeDiff(pb, pa);
    const double moved = (pa - initial[item.key()]).abs().max().item<double>();
    INFO("relative difference " << diff << ", moved " << moved);
    CHECK(diff < tolerance);
    CHECK(moved > 20 * tolerance);
    const auto& sa = AdamState(libtorch.optimizer(), pa);
    const auto& sb = AdamState(fused.optimizer(), pb);
    CHECK(sa.step() == sb.step());
    CHECK(RelativeDiff(sb.exp_avg(), sa.exp_avg()) < tolerance);
    CHECK(RelativeDiff(sb.exp_avg_sq(), sa.exp_avg_sq()) < tolerance);
  }
}

void RequireSameStats(const PpoStats& a, const PpoStats& b, double epsilon = 1e-4) {
  const auto ia = a.Items(), ib = b.Items();
  REQUIRE(ia.size() == ib.size());
  for (std::size_t i = 0; i < ia.size(); ++i) {
    INFO(ia[i].first << ": libtorch " << ia[i].second << ", fused " << ib[i].second);
    CHECK(ib[i].second == Approx(ia[i].second).epsilon(epsilon).margin(1e-6));
  }
}

torch::OrderedDict<std::string, torch::Tensor> Snapshot(ActorCritic& net) {
  torch::OrderedDict<std::string, torch::Tensor> out;
  for (const auto& item : net->named_parameters()) out.insert(item.key(), item.value().detach().clone());
  return out;
}

}  // namespace

TEST_CASE("The fused update matches the LibTorch update", "[ppo][fused]") {
  const Space action = GENERATE(kDiscrete, kMultiDiscrete, kBox);
  const bool norm_adv = GENERATE(true, false);
  const bool clip_vloss = GENERATE(true, false);
  const double max_grad_norm = GENERATE(0.5, 1e3);  // clipping on every step / never
  INFO("action " << action.ToString() << ", norm_adv " << norm_adv << ", clip_vloss " << clip_vloss << ", max_grad_norm "
                   << max_grad_norm);
  torch::manual_seed(11);
  at::set_num_threads(1);
  // A multi-discrete row's log-prob sums three log-softmaxes, each rounded in its own order by the two paths;
  // over three updates at lr 1e-2 the parameters drift apart by up to 1.35e-5 (measured), so 3x the bound.
  const double scale = action.is_multi_discrete() ? 3.0 : 1.0;

  // Uneven widths and three hidden layers, so that no shape is taken for granted.
  const std::vector<int> hidden = {24, 16, 8};
  ActorCritic a = MakePolicy(action, hidden);
  ActorCritic b = MakePolicy(action, hidden);
  {
    torch::NoGradGuard no_grad;
    // A policy head of gain 0.5 instead of 0.01: a trained policy's scale. With the near-uniform initial head
    // the actor's hidden-layer gradients are ~1e-4 with squares below Adam's eps^2, where Adam's step
    // g / (sqrt(v) + eps) turns float rounding noise of 1e-8 in g into parameter differences of ~5e-6 at this
    // lr (measured); both paths are as right there, and the comparison would test rounding, not gradients.
    a->named_parameters()["actor.6.weight"].mul_(50);
    if (action.is_box()) a->named_parameters()["log_std"].copy_(torch::tensor({-0.3f, 0.2f}));
  }
  b->CopyFrom(*a);
  const auto initial = Snapshot(a);

  PpoConfig config;
  config.lr = 1e-2;  // large, so that the ratios leave the clip range within the update
  config.anneal_lr = true;
  config.update_epochs = 3;
  config.num_minibatches = 3;  // 8 x 5 = 40 rows: minibatches of 13, 13, 14
  config.norm_adv = norm_adv;
  config.clip_vloss = clip_vloss;
  config.clip_coef = 0.05;  // small, so that some ratios leave the clip range and some values are clipped
  config.ent_coef = 0.05;
  config.vf_coef = 0.7;
  config.max_grad_norm = max_grad_norm;
  PpoConfig off = config, on = config;
  off.fused_update = "off";
  on.fused_update = "on";
  PpoTrainer libtorch(a, off, /*seed=*/5);
  PpoTrainer fused(b, on, /*seed=*/5);
  REQUIRE_FALSE(libtorch.fused());
  REQUIRE(fused.fused());

  // Three updates: the Adam moments and step counts carry over, the learning rate anneals.
  double clip_fraction = 0;
  for (int update = 0; update < 3; ++update) {
    INFO("update " << update);
    const Rollout rollout = MakeRollout(a, 8, 5);
    const double progress = 0.2 * update;
    const PpoStats sa = libtorch.Update(rollout, progress);
    const PpoStats sb = fused.Update(rollout, progress);
    RequireSameStats(sa, sb, scale * 1e-4);
    CHECK(sb.epochs == 3);
    if (max_grad_norm < 1) CHECK(sa.grad_norm > max_grad_norm);  // the clip really scaled the gradients
    clip_fraction += sa.clip_fraction;
  }
  CHECK(clip_fraction > 0);  // the clipped branch of the surrogate was exercised
  RequireSameTraining(libtorch, fused, initial, scale * kTolerance);
}

TEST_CASE("The fused update gives the same bits on one thread and on two", "[ppo][fused]") {
  const Space action = GENERATE(kDiscrete, kMultiDiscrete, kBox);
  INFO("action " << action.ToString());
  torch::manual_seed(15);
  ActorCritic one = MakePolicy(action, {32, 32});
  ActorCritic two = MakePolicy(action, {32, 32});
  two->CopyFrom(*one);
  PpoConfig config;
  config.fused_update = "on";
  config.update_epochs = 3;
  config.num_minibatches = 3;
  PpoTrainer t1(one, config, 4), t2(two, config, 4);
  for (int update = 0; update < 2; ++update) {
    const Rollout rollout = MakeRollout(one, 16, 6);
    at::set_num_threads(1);
    const PpoStats s1 = t1.Update(rollout, 0.1 * update);
    at::set_num_threads(2);  // the critic's pass on the helper thread
    const PpoStats s2 = t2.Update(rollout, 0.1 * update);
    at::set_num_threads(1);
    const auto i1 = s1.Items(), i2 = s2.Items();
    for (std::size_t i = 0; i < i1.size(); ++i) {
      INFO(i1[i].first);
      CHECK((i1[i].second == i2[i].second || (std::isnan(i1[i].second) && std::isnan(i2[i].second))));
    }
  }
  const auto p1 = one->named_parameters(), p2 = two->named_parameters();
  for (const auto& item : p1) {
    INFO(item.key());
    CHECK(torch::equal(item.value(), p2[item.key()]));
  }
}

TEST_CASE("The fused update stops at the target KL as the LibTorch update does", "[ppo][fused]") {
  torch::manual_seed(12);
  at::set_num_threads(1);
  bool stopped_midway = false;
  for (double target : {1e-4, 1e-3, 3e-3, 1e-2, 3e-2}) {
    INFO("target_kl " << target);
    ActorCritic a = MakePolicy(kDiscrete, {16, 16});
    ActorCritic b = MakePolicy(kDiscrete, {16, 16});
    b->CopyFrom(*a);
    PpoConfig config;
    config.lr = 1e-2;
    config.update_epochs = 10;
    config.num_minibatches = 2;
    config.target_kl = target;
    PpoConfig off = config, on = config;
    off.fused_update = "off";
    on.fused_update = "on";
    PpoTrainer libtorch(a, off, 3), fused(b, on, 3);
    const Rollout rollout = MakeRollout(a, 16, 4);
    const PpoStats sa = libtorch.Update(rollout, 0.0);
    const PpoStats sb = fused.Update(rollout, 0.0);
    CHECK(sb.epochs == sa.epochs);
    RequireSameStats(sa, sb);
    if (sa.epochs > 1 && sa.epochs < 10) stopped_midway = true;
  }
  CHECK(stopped_midway);  // some target stopped the epochs after the first and before the last
}

TEST_CASE("Adam state moves between the fused and the LibTorch update through a checkpoint", "[ppo][fused]") {
  const Space action = GENERATE(kDiscrete, kBox);
  const bool first_fused = GENERATE(true, false);
  INFO("action " << action.ToString() << ", first update fused " << first_fused);
  torch::manual_seed(13);
  at::set_num_threads(1);
  PpoConfig config;
  config.lr = 3e-3;
  config.update_epochs = 2;
  config.num_minibatches = 2;
  PpoConfig off = config, on = config;
  off.fused_update = "off";
  on.fused_update = "on";

  // One update on one path, then the optimizer saved, as SaveCheckpoint does it.
  ActorCritic first = MakePolicy(action, {16, 16});
  const Rollout rollout1 = MakeRollout(first, 8, 4);
  PpoTrainer trainer1(first, first_fused ? on : off, 1);
  trainer1.Update(rollout1, 0.0);
  std::stringstream saved;
  {
    torch::serialize::OutputArchive archive;
    trainer1.optimizer().save(archive);
    archive.save_to(saved);
  }

  // Both paths continue from it, on copies of the policy.
  ActorCritic a = MakePolicy(action, {16, 16});
  ActorCritic b = MakePolicy(action, {16, 16});
  a->CopyFrom(*first);
  b->CopyFrom(*first);
  const auto initial = Snapshot(a);
  PpoTrainer libtorch(a, off, 2), fused(b, on, 2);
  for (PpoTrainer* t : {&libtorch, &fused}) {
    std::stringstream in(saved.str());
    torch::serialize::InputArchive archive;
    archive.load_from(in);
    t->optimizer().load(archive);
  }
  const Rollout rollout2 = MakeRollout(a, 8, 4);
  RequireSameStats(libtorch.Update(rollout2, 0.5), fused.Update(rollout2, 0.5));
  RequireSameTraining(libtorch, fused, initial);
  for (const auto& p : fused.policy()->parameters()) CHECK(AdamState(fused.optimizer(), p).step() == 2 * 2 + 2 * 2);
}

TEST_CASE("Adam state created by the fused update serves torch::optim::Adam::step", "[ppo][fused]") {
  torch::manual_seed(16);
  ActorCritic net = MakePolicy(kBox, {8});
  PpoConfig config;
  config.fused_update = "on";
  config.update_epochs = 1;
  config.num_minibatches = 1;
  PpoTrainer trainer(net, config, 1);
  const Rollout rollout = MakeRollout(net, 4, 2);
  trainer.Update(rollout, 0.0);  // creates every parameter's AdamParamState (step 1)
  // A LibTorch step on the same optimizer: its in-place moment updates must accept the fused path's tensors
  // (ordinary tensors, not InferenceMode ones).
  // (clone: ordinary copies of the rollout's InferenceMode tensors, which autograd may not save)
  const EvalOutput eval =
      net->Evaluate(rollout.obs.reshape({8, kObsDim}).clone(), rollout.actions.reshape({8, 2}).clone());
  trainer.optimizer().zero_grad();
  (eval.logp.mean() + eval.value.square().mean()).backward();
  REQUIRE_NOTHROW(trainer.optimizer().step());
  for (const auto& p : net->parameters()) CHECK(AdamState(trainer.optimizer(), p).step() == 2);
}

TEST_CASE("ppo.fused_update: auto falls back, on refuses clearly, off is the LibTorch path", "[ppo][fused]") {
  torch::manual_seed(18);
  ActorCritic net = MakePolicy(kDiscrete, {8});
  PpoConfig config;
  SECTION("auto on the CPU in fp32 is fused; bf16 is not") {
    CHECK(PpoTrainer(net, config, 1).fused());
    CHECK_FALSE(PpoTrainer(net, config, 1, Precision::kBf16).fused());
  }
  SECTION("off") {
    config.fused_update = "off";
    CHECK_FALSE(PpoTrainer(net, config, 1).fused());
  }
  SECTION("on with bf16") {
    config.fused_update = "on";
    try {
      PpoTrainer trainer(net, config, 1, Precision::kBf16);
      FAIL("expected std::invalid_argument");
    } catch (const std::invalid_argument& e) {
      CHECK_THAT(e.what(), Catch::Contains("fused_update is on") && Catch::Contains("fp32 only"));
    }
  }
  SECTION("the config rejects bad values and impossible combinations") {
    FarmConfig fc;
    Status s = ParseConfig("ppo: {fused_update: yes}", "test", &fc);
    CHECK_FALSE(s.ok());
    CHECK_THAT(s.message(), Catch::Contains("ppo.fused_update") && Catch::Contains("auto, on, off"));
    REQUIRE(ParseConfig("ppo: {fused_update: on}\nlearner: {device: cpu, precision: bf16}", "test", &fc).ok());
    CHECK(fc.ppo.fused_update == "on");  // a bare YAML `on` is the string, not a boolean
    s = ValidateConfig(fc);
    CHECK_FALSE(s.ok());
    CHECK_THAT(s.message(), Catch::Contains("learner.precision=fp32"));
    fc.learner.precision = "fp32";
    CHECK(ValidateConfig(fc).ok());
    fc.learner.device = "cuda";
    CHECK_FALSE(ValidateConfig(fc).ok());
  }
}

TEST_CASE("The fused update's kernels match LibTorch on odd shapes", "[ppo][fused]") {
  torch::manual_seed(17);
  INFO("instruction set " << kernels::InstructionSet());
  double worst = 0;
  auto track = [&](const torch::Tensor& got, const torch::Tensor& want) {
    worst = std::max(worst, (got - want).abs().max().item<double>() / (1 + want.abs().max().item<double>()));
  };
  // Tile edges: rows and columns around the tile sizes (4 rows; 16-, 8- and 4-float vectors, 4 or 2 per tile).
  for (int64_t rows : {1, 3, 4, 5, 13, 64}) {
    for (int64_t cols : {1, 2, 3, 8, 15, 16, 17, 33, 64, 65}) {
      for (int64_t depth : {1, 2, 4, 7, 64, 130}) {
        const torch::Tensor a = torch::randn({rows, depth}), b = torch::randn({depth, cols});
        const torch::Tensor bias = torch::randn({cols}), w = torch::randn({cols, depth});
        torch::Tensor c = torch::empty({rows, cols});
        kernels::Gemm(rows, cols, depth, a.data_ptr<float>(), depth, 1, b.data_ptr<float>(), cols, c.data_ptr<float>(),
                      cols, bias.data_ptr<float>());
        track(c, torch::addmm(bias, a, b));
        const torch::Tensor a_t = torch::randn({depth, rows});  // read transposed: a_row 1, a_depth rows
        kernels::Gemm(rows, cols, depth, a_t.data_ptr<float>(), 1, rows, b.data_ptr<float>(), cols, c.data_ptr<float>(),
                      cols, nullptr);
        track(c, torch::mm(a_t.t(), b));
        kernels::GemmRowDot(rows, cols, depth, a.data_ptr<float>(), depth, w.data_ptr<float>(), c.data_ptr<float>(),
                            cols, bias.data_ptr<float>());
        track(c, torch::addmm(bias, a, w.t()));
      }
    }
  }
  CHECK(worst < 1e-5);
  const torch::Tensor g = torch::randn({37, 19});
  torch::Tensor sums = torch::empty({19});
  kernels::SumRows(g.data_ptr<float>(), 37, 19, sums.data_ptr<float>());
  CHECK(torch::allclose(sums, g.sum(0), 1e-5, 1e-5));
  CHECK(kernels::SumSquares(g.data_ptr<float>(), g.numel()) == Approx(g.square().sum().item<double>()).epsilon(1e-6));
}

TEST_CASE("kernels::Tanh is within 1.5 ulp of tanh and keeps NaN and infinities", "[ppo][fused]") {
  std::vector<float> x;
  for (double v = -25; v <= 25; v += 1e-4) x.push_back(static_cast<float>(v));
  for (double e = -40; e < 0; e += 0.01) {  // tiny values: tanh(x) = x to float precision
    x.push_back(static_cast<float>(std::pow(10.0, e)));
    x.push_back(-static_cast<float>(std::pow(10.0, e)));
  }
  for (float v : {0.0f, -0.0f, 0.625f, std::nextafter(0.625f, 0.0f), 1e30f, -1e30f}) x.push_back(v);
  std::vector<float> y = x;
  kernels::Tanh(y.data(), static_cast<int64_t>(y.size()));
  double worst = 0;
  float worst_at = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double exact = std::tanh(static_cast<double>(x[i]));
    const auto rounded = static_cast<float>(exact);
    const double ulp = std::max(std::fabs(std::nextafter(rounded, 2.0f) - rounded), 1e-45f);
    const double err = std::fabs(y[i] - exact) / ulp;
    if (err > worst) {
      worst = err;
      worst_at = x[i];
    }
  }
  INFO("worst " << worst << " ulp at " << worst_at);
  CHECK(worst <= 1.5);
  CHECK(std::signbit(y[x.size() - 5]));  // tanh(-0) = -0
  float special[3] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()};
  kernels::Tanh(special, 3);
  CHECK(std::isnan(special[0]));
  CHECK(special[1] == 1.0f);
  CHECK(special[2] == -1.0f);
}

TEST_CASE("The fused update rejects out-of-range actions", "[ppo][fused]") {
  torch::manual_seed(14);
  ActorCritic net = MakePolicy(kDiscrete, {8});
  PpoConfig config;
  config.fused_update = "on";
  PpoTrainer trainer(net, config, 1);
  Rollout r = MakeRollout(net, 4, 2);
  {
    c10::InferenceMode inference;  // the rollout's tensors were made under it
    r.actions[1][1] = 3;           // Discrete(3)
  }
  CHECK_THROWS_AS(trainer.Update(r, 0.0), c10::Error);
}

}  // namespace farm
