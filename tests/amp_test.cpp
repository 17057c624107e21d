// Tests for mixed precision: precision parsing and checks, the loss scaler on hand-made gradients (overflow,
// growth, unscaling, the disabled identity, state round trips), the autocast guard on the CPU with bf16, and
// PPO trained in bf16 on the CPU. The CUDA tests (fp16, fused kernels) are compiled only with a CUDA
// LibTorch (FARM_WITH_CUDA) and return with a warning when no GPU is present.
#include "common/files.h"
#include "learner/model/amp.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "learner/model/policy.h"
#include "learner/run/checkpoint.h"
#include "learner/train/ppo.h"

// LibTorch includes glog, whose one-argument CHECK would silently replace Catch's (and abort on failure
// instead of reporting): include Catch last and drop glog's macro first.
#undef CHECK
#include <catch2/catch.hpp>

#include "tests/cuda_skip.h"

namespace farm {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// A parameter with a hand-made gradient.
torch::Tensor Param(std::vector<float> values, std::vector<float> grad) {
  torch::Tensor p = torch::tensor(values, torch::kFloat32).requires_grad_(true);
  p.mutable_grad() = torch::tensor(grad, torch::kFloat32);
  return p;
}

LossScaler::Options Opts(double init_scale, int64_t growth_interval = 2000) {
  LossScaler::Options o;
  o.init_scale = init_scale;
  o.growth_interval = growth_interval;
  return o;
}

// One scaler cycle on `params` whose grads are set to `grads` (already scaled, as backward would leave them).
bool Cycle(LossScaler& scaler, torch::optim::Optimizer& optimizer, std::vector<torch::Tensor>& params,
           const std::vector<std::vector<float>>& grads) {
  for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = torch::tensor(grads[i], torch::kFloat32);
  const bool stepped = scaler.Step(optimizer);
  scaler.Update();
  return stepped;
}

std::string TempDir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() /
                   (name + "-" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace

TEST_CASE("ParsePrecision and CheckPrecision", "[amp]") {
  Precision p = Precision::kFp32;
  REQUIRE(ParsePrecision("bf16", &p).ok());
  CHECK(p == Precision::kBf16);
  REQUIRE(ParsePrecision("fp16", &p).ok());
  CHECK(p == Precision::kFp16);
  REQUIRE(ParsePrecision("fp32", &p).ok());
  CHECK(p == Precision::kFp32);
  const Status bad = ParsePrecision("float16", &p);
  CHECK_FALSE(bad.ok());
  CHECK(bad.message().find("fp32, fp16, bf16") != std::string::npos);
  CHECK(std::string(PrecisionName(Precision::kBf16)) == "bf16");
  CHECK(PrecisionDtype(Precision::kFp16) == torch::kHalf);
  CHECK(PrecisionDtype(Precision::kBf16) == torch::kBFloat16);

  CHECK(CheckPrecision(Precision::kFp32, torch::Device(torch::kCPU)).ok());
  CHECK(CheckPrecision(Precision::kBf16, torch::Device(torch::kCPU)).ok());
  CHECK(CheckPrecision(Precision::kFp16, torch::Device(torch::kCUDA, 0)).ok());
  CHECK(CheckPrecision(Precision::kBf16, torch::Device(torch::kCUDA, 0)).ok());
  const Status fp16_cpu = CheckPrecision(Precision::kFp16, torch::Device(torch::kCPU));
  REQUIRE_FALSE(fp16_cpu.ok());
  INFO(fp16_cpu.message());
  CHECK(fp16_cpu.message().find("CUDA") != std::string::npos);
  CHECK(fp16_cpu.message().find("bf16") != std::string::npos);
}

TEST_CASE("LossScaler: an inf or NaN grad skips the step and backs off the scale", "[amp]") {
  for (const double bad : {kInf, -kInf, kNaN}) {
    INFO("bad grad value " << bad);
    LossScaler scaler(Opts(1024));
    torch::Tensor a = Param({1, 2}, {2048, 4096});
    torch::Tensor b = Param({3}, {static_cast<float>(bad)});
    const torch::Tensor a_before = a.detach().clone(), b_before = b.detach().clone();
    torch::optim::SGD sgd({a, b}, torch::optim::SGDOptions(1.0));

    CHECK_FALSE(scaler.Unscale({a, b}));
    CHECK(scaler.found_inf());
    CHECK_FALSE(scaler.Step(sgd));
    CHECK(torch::equal(a.detach(), a_before));  // parameters unchanged
    CHECK(torch::equal(b.detach(), b_before));
    CHECK(scaler.skipped_steps() == 1);
    scaler.Update();
    CHECK(scaler.scale() == 512.0);
    CHECK(scaler.growth_tracker() == 0);
    CHECK_FALSE(scaler.found_inf());

    // The next, finite step runs with the backed-off scale.
    a.mutable_grad() = torch::tensor({512.0f, 1024.0f});
    b.mutable_grad() = torch::tensor({-512.0f});
    CHECK(scaler.Step(sgd));
    scaler.Update();
    CHECK(torch::equal(a.detach(), torch::tensor({0.0f, 0.0f})));  // 1 - 1, 2 - 2
    CHECK(torch::equal(b.detach(), torch::tensor({4.0f})));        // 3 + 1
    CHECK(scaler.skipped_steps() == 1);
    CHECK(scaler.growth_tracker() == 1);
  }
}

TEST_CASE("LossScaler: the scale grows after growth_interval good steps", "[amp]") {
  LossScaler scaler(Opts(8, /*growth_interval=*/3));
  std::vector<torch::Tensor> params = {Param({0, 0}, {0, 0})};
  torch::optim::SGD sgd(params, torch::optim::SGDOptions(0.1));

  CHECK(Cycle(scaler, sgd, params, {{8, 16}}));
  CHECK(scaler.growth_tracker() == 1);
  CHECK(scaler.scale() == 8.0);
  CHECK(Cycle(scaler, sgd, params, {{8, 16}}));
  CHECK(scaler.growth_tracker() == 2);
  CHECK(scaler.scale() == 8.0);
  CHECK(Cycle(scaler, sgd, params, {{8, 16}}));
  CHECK(scaler.scale() == 16.0);  // x2
  CHECK(scaler.growth_tracker() == 0);

  // An overflow in the middle of a run of good steps resets the tracker.
  CHECK(Cycle(scaler, sgd, params, {{1, 1}}));
  CHECK(Cycle(scaler, sgd, params, {{1, 1}}));
  CHECK(scaler.growth_tracker() == 2);
  CHECK_FALSE(Cycle(scaler, sgd, params, {{1, static_cast<float>(kInf)}}));
  CHECK(scaler.scale() == 8.0);
  CHECK(scaler.growth_tracker() == 0);
  CHECK(Cycle(scaler, sgd, params, {{1, 1}}));
  CHECK(Cycle(scaler, sgd, params, {{1, 1}}));
  CHECK(scaler.scale() == 8.0);
  CHECK(Cycle(scaler, sgd, params, {{1, 1}}));
  CHECK(scaler.scale() == 16.0);
  CHECK(scaler.skipped_steps() == 1);
}

TEST_CASE("LossScaler: unscaling divides by the scale exactly, before clipping", "[amp]") {
  const double scale = 65536.0;
  LossScaler scaler(Opts(scale));

  SECTION("hand-made grads; clip sees the true norm; a second Unscale does nothing") {
    // True gradient (3, 4) and (12): global norm 13.
    torch::Tensor a = Param({0, 0}, {3 * 65536.0f, 4 * 65536.0f});
    torch::Tensor b = Param({0}, {12 * 65536.0f});
    REQUIRE(scaler.Unscale({a, b}));
    CHECK(torch::equal(a.grad(), torch::tensor({3.0f, 4.0f})));
    CHECK(torch::equal(b.grad(), torch::tensor({12.0f})));
    CHECK(scaler.Unscale({a, b}));  // idempotent within the step
    CHECK(torch::equal(a.grad(), torch::tensor({3.0f, 4.0f})));
    const double norm = torch::nn::utils::clip_grad_norm_(std::vector<torch::Tensor>{a, b}, 1.0);
    CHECK(norm == Approx(13.0));
    CHECK(torch::allclose(a.grad(), torch::tensor({3.0f / 13, 4.0f / 13})));

    torch::optim::SGD sgd({a, b}, torch::optim::SGDOptions(1.0));
    CHECK(scaler.Step(sgd));  // does not unscale again
    CHECK(torch::allclose(a.detach(), torch::tensor({-3.0f / 13, -4.0f / 13})));
    CHECK(torch::allclose(b.detach(), torch::tensor({-12.0f / 13})));
    REQUIRE_THROWS_AS(scaler.Step(sgd), std::logic_error);  // twice without Update
    scaler.Update();
  }

  SECTION("through backward: Scale, then Step unscales the optimizer's parameters itself") {
    torch::Tensor w = torch::tensor({0.5f, -1.5f, 2.0f}).requires_grad_(true);
    const torch::Tensor x = torch::tensor({1.0f, 2.0f, -3.0f});
    const torch::Tensor loss = (w * x).sum() + w.square().sum();  // grad = x + 2w = (2, -1, 1)
    const torch::Tensor scaled = scaler.Scale(loss);
    CHECK(scaled.item<double>() == Approx(loss.item<double>() * scale));
    scaled.backward();
    CHECK(torch::equal(w.grad(), torch::tensor({2.0f, -1.0f, 1.0f}) * static_cast<float>(scale)));
    torch::optim::SGD sgd({w}, torch::optim::SGDOptions(0.25));
    CHECK(scaler.Step(sgd));
    CHECK(torch::equal(w.grad(), torch::tensor({2.0f, -1.0f, 1.0f})));
    CHECK(torch::equal(w.detach(), torch::tensor({0.0f, -1.25f, 1.75f})));
    scaler.Update();
    CHECK(scaler.growth_tracker() == 1);
  }

  SECTION("Update without Unscale or Step is a logic error") { REQUIRE_THROWS_AS(scaler.Update(), std::logic_error); }
}

TEST_CASE("LossScaler: disabled is the identity", "[amp]") {
  LossScaler::Options o;
  o.enabled = false;
  LossScaler scaler(o);
  CHECK_FALSE(scaler.enabled());
  CHECK(scaler.scale() == 1.0);
  const torch::Tensor loss = torch::tensor(3.5f);
  CHECK(scaler.Scale(loss).is_same(loss));

  torch::Tensor a = Param({1, 1}, {2, 4});
  CHECK(scaler.Unscale({a}));
  CHECK(torch::equal(a.grad(), torch::tensor({2.0f, 4.0f})));
  torch::optim::SGD sgd({a}, torch::optim::SGDOptions(0.5));
  CHECK(scaler.Step(sgd));
  scaler.Update();
  CHECK(torch::equal(a.detach(), torch::tensor({0.0f, -1.0f})));
  CHECK(scaler.scale() == 1.0);
  CHECK(scaler.skipped_steps() == 0);
  CHECK(scaler.growth_tracker() == 0);
}

TEST_CASE("LossScaler: state round trips through an archive and a checkpoint", "[amp]") {
  torch::manual_seed(61);
  LossScaler scaler(Opts(1024, /*growth_interval=*/5));
  std::vector<torch::Tensor> params = {Param({0}, {0})};
  torch::optim::SGD sgd(params, torch::optim::SGDOptions(0.1));
  Cycle(scaler, sgd, params, {{static_cast<float>(kNaN)}});  // scale 512, 1 skipped
  Cycle(scaler, sgd, params, {{1}});
  Cycle(scaler, sgd, params, {{1}});  // tracker 2
  REQUIRE(scaler.scale() == 512.0);
  REQUIRE(scaler.growth_tracker() == 2);
  REQUIRE(scaler.skipped_steps() == 1);

  SECTION("archive") {
    torch::serialize::OutputArchive out;
    scaler.Save(out);
    std::stringstream stream;
    out.save_to(stream);
    torch::serialize::InputArchive in;
    in.load_from(stream);
    LossScaler loaded(Opts(1024, 5));
    loaded.Load(in);
    CHECK(loaded.scale() == 512.0);
    CHECK(loaded.growth_tracker() == 2);
    CHECK(loaded.skipped_steps() == 1);
    // It carries on from there: 3 more good steps reach the interval of 5.
    std::vector<torch::Tensor> ps = {Param({0}, {0})};
    torch::optim::SGD opt(ps, torch::optim::SGDOptions(0.1));
    for (int i = 0; i < 3; ++i) Cycle(loaded, opt, ps, {{1}});
    CHECK(loaded.scale() == 1024.0);
    CHECK(loaded.growth_tracker() == 0);
  }

  SECTION("checkpoint, and a checkpoint without a scaler") {
    const std::string dir = TempDir("amp_test_ckpt");
    ActorCritic policy(Space::Box({4}, {-1}, {1}), Space::Discrete(2), std::vector<int>{8});
    torch::optim::Adam adam(policy->parameters(), torch::optim::AdamOptions(1e-3));
    TrainingCounters counters;
    counters.updates = 3;
    std::string with_scaler, without_scaler;
    REQUIRE(SaveCheckpoint(dir, policy, adam, counters, &with_scaler, &scaler).ok());
    counters.updates = 4;
    REQUIRE(SaveCheckpoint(dir, policy, adam, counters, &without_scaler).ok());

    TrainingCounters read;
    LossScaler loaded(Opts(1024, 5));
    const Status s = LoadCheckpoint(with_scaler, policy, &adam, &read, &loaded);
    INFO(s.ToString());
    REQUIRE(s.ok());
    CHECK(read.updates == 3);
    CHECK(loaded.scale() == 512.0);
    CHECK(loaded.growth_tracker() == 2);
    CHECK(loaded.skipped_steps() == 1);

    LossScaler fresh(Opts(1024, 5));
    REQUIRE(LoadCheckpoint(without_scaler, policy, &adam, &read, &fresh).ok());
    CHECK(read.updates == 4);
    CHECK(fresh.scale() == 1024.0);  // untouched
    CHECK(fresh.skipped_steps() == 0);
    // And the old signature still reads a checkpoint that has one.
    REQUIRE(LoadCheckpoint(with_scaler, policy, &adam, &read).ok());
    (void)RemoveTree(dir);  // not std::filesystem::remove_all: see RemoveTree
  }
}

TEST_CASE("AutocastGuard on the CPU with bf16", "[amp]") {
  torch::manual_seed(62);
  const torch::Device cpu(torch::kCPU);
  const torch::Tensor a = torch::randn({4, 8});
  const torch::Tensor b = torch::randn({8, 3});
  REQUIRE_FALSE(AutocastEnabled(torch::kCPU));
  const torch::ScalarType initial_dtype = AutocastDtype(torch::kCPU);

  CHECK(torch::mm(a, b).scalar_type() == torch::kFloat);
  {
    AutocastGuard guard(cpu, Precision::kBf16);
    CHECK(guard.active());
    CHECK(AutocastEnabled(torch::kCPU));
    CHECK(AutocastDtype(torch::kCPU) == torch::kBFloat16);
    const torch::Tensor c = torch::mm(a, b);
    CHECK(c.scalar_type() == torch::kBFloat16);
    CHECK(torch::allclose(c.to(torch::kFloat), torch::mm(a, b).to(torch::kFloat), 0.05, 0.05));
    torch::nn::Linear linear(8, 3);
    CHECK(linear->forward(a).scalar_type() == torch::kBFloat16);
    // CUDA autocast state is separate and untouched.
    CHECK_FALSE(AutocastEnabled(torch::kCUDA));
  }
  CHECK_FALSE(AutocastEnabled(torch::kCPU));
  CHECK(torch::mm(a, b).scalar_type() == torch::kFloat);

  SECTION("fp32 is a no-op") {
    AutocastGuard guard(cpu, Precision::kFp32);
    CHECK_FALSE(guard.active());
    CHECK_FALSE(AutocastEnabled(torch::kCPU));
    CHECK(torch::mm(a, b).scalar_type() == torch::kFloat);
  }

  SECTION("fp16 on the CPU is refused") {
    REQUIRE_THROWS_AS(AutocastGuard(cpu, Precision::kFp16), std::invalid_argument);
    CHECK_FALSE(AutocastEnabled(torch::kCPU));
  }

  SECTION("nested guards restore the previous state") {
    {
      AutocastGuard outer(cpu, Precision::kBf16);
      {
        AutocastGuard inner(cpu, Precision::kBf16);
        CHECK(torch::mm(a, b).scalar_type() == torch::kBFloat16);
        {
          AutocastGuard no_op(cpu, Precision::kFp32);  // fp32 inside bf16 changes nothing
          CHECK(torch::mm(a, b).scalar_type() == torch::kBFloat16);
        }
      }
      CHECK(AutocastEnabled(torch::kCPU));  // back to the outer guard's state, not off
      CHECK(torch::mm(a, b).scalar_type() == torch::kBFloat16);
    }
    CHECK_FALSE(AutocastEnabled(torch::kCPU));
    CHECK(AutocastDtype(torch::kCPU) == initial_dtype);
    CHECK(torch::mm(a, b).scalar_type() == torch::kFloat);
  }

  SECTION("an enabled flag set by others is restored") {
    SetAutocastEnabled(torch::kCPU, true);
    {
      AutocastGuard guard(cpu, Precision::kBf16);
      CHECK(AutocastEnabled(torch::kCPU));
    }
    CHECK(AutocastEnabled(torch::kCPU));  // still on: the guard restores, it does not switch off
    SetAutocastEnabled(torch::kCPU, false);
  }

  SECTION("a CUDA guard saves and restores the CUDA state only (no GPU needed: the state is per thread)") {
    // LibTorch 1.13's CPU autocast accepts only bf16, so the dtype restore is checked on the CUDA state.
    const torch::ScalarType cuda_initial = AutocastDtype(torch::kCUDA);
    SetAutocastDtype(torch::kCUDA, torch::kBFloat16);
    {
      AutocastGuard guard(torch::Device(torch::kCUDA, 0), Precision::kFp16);
      CHECK(guard.active());
      CHECK(AutocastEnabled(torch::kCUDA));
      CHECK(AutocastDtype(torch::kCUDA) == torch::kHalf);
      CHECK_FALSE(AutocastEnabled(torch::kCPU));
      CHECK(torch::mm(a, b).scalar_type() == torch::kFloat);  // CPU tensors are not cast by CUDA autocast
      {
        AutocastGuard inner(torch::Device(torch::kCUDA, 0), Precision::kBf16);
        CHECK(AutocastDtype(torch::kCUDA) == torch::kBFloat16);
      }
      CHECK(AutocastDtype(torch::kCUDA) == torch::kHalf);
      CHECK(AutocastEnabled(torch::kCUDA));
    }
    CHECK_FALSE(AutocastEnabled(torch::kCUDA));
    CHECK(AutocastDtype(torch::kCUDA) == torch::kBFloat16);
    SetAutocastDtype(torch::kCUDA, cuda_initial);
  }

  SECTION("the weight-cast cache is cleared when the region closes") {
    // Within one region the bf16 copy of a weight is cached; after an in-place weight update and a new
    // region the output must reflect the new weight.
    torch::nn::Linear linear(8, 3);
    torch::Tensor before;
    {
      AutocastGuard guard(cpu, Precision::kBf16);
      before = linear->forward(a).to(torch::kFloat);
    }
    {
      torch::NoGradGuard no_grad;
      linear->weight.mul_(2);
      linear->bias.mul_(2);
    }
    AutocastGuard guard(cpu, Precision::kBf16);
    const torch::Tensor after = linear->forward(a).to(torch::kFloat);
    CHECK(torch::allclose(after, 2 * before, 0.02, 0.02));
  }

  SECTION("autocast state is per thread") {
    AutocastGuard guard(cpu, Precision::kBf16);
    bool other_enabled = true;
    torch::ScalarType other_dtype = torch::kFloat;
    std::thread other([&] {
      other_enabled = AutocastEnabled(torch::kCPU);
      other_dtype = torch::mm(a, b).scalar_type();
    });
    other.join();
    CHECK_FALSE(other_enabled);
    CHECK(other_dtype == torch::kFloat);
  }
}

namespace {

// The contextual bandit of ppo_test.cpp: obs[0] is a +-1 cue, obs[1..3] noise; reward 1 when the action is
// (cue > 0), else 0.
torch::Tensor BanditObserve(int64_t rows) {
  torch::Tensor obs = torch::rand({rows, 4}) * 2 - 1;
  obs.select(1, 0).copy_(torch::randint(0, 2, {rows}, torch::kFloat32) * 2 - 1);
  return obs;
}

torch::Tensor BanditReward(const torch::Tensor& obs, const torch::Tensor& action) {
  return (action.cpu() == (obs.select(1, 0) > 0).to(torch::kLong)).to(torch::kFloat32);
}

// One rollout acted as the learner's inference thread does it: InferenceMode and the run's precision, with
// the outputs stored as float32.
Rollout CollectBandit(ActorCritic& net, int64_t steps, int64_t envs, torch::Device device, Precision precision) {
  c10::InferenceMode inference;
  const torch::Tensor obs = BanditObserve(steps * envs);
  ActOutput act;
  {
    AutocastGuard autocast(device, precision);
    act = net->Act(obs.to(device));
  }
  Rollout r;
  r.obs = obs.reshape({steps, envs, 4});
  r.actions = act.action.cpu().reshape({steps, envs});
  r.logp = act.logp.to(torch::kCPU, torch::kFloat32).reshape({steps, envs});
  r.values = act.value.to(torch::kCPU, torch::kFloat32).reshape({steps, envs});
  r.rewards = BanditReward(obs, act.action).reshape({steps, envs});
  r.dones = torch::ones({steps, envs});
  r.last_value = torch::zeros({envs});
  return r;
}

double MeanReward(ActorCritic& net, torch::Device device, bool deterministic) {
  c10::InferenceMode inference;
  const torch::Tensor obs = BanditObserve(2000);
  return BanditReward(obs, net->Act(obs.to(device), deterministic).action).mean().item<double>();
}

struct BanditResult {
  double before = 0;
  double after = 0;
  double after_mode = 0;
  double seconds_per_update = 0;
  PpoStats last;
};

BanditResult TrainBandit(Precision precision, torch::Device device, int updates) {
  torch::manual_seed(42);
  ActorCritic net(Space::Box({4}, {-1}, {1}), Space::Discrete(2), std::vector<int>{32, 32});
  net->to(device);
  PpoConfig config;
  config.lr = 3e-3;
  config.anneal_lr = false;
  config.update_epochs = 4;
  config.num_minibatches = 4;
  PpoTrainer trainer(net, config, /*seed=*/42, precision);
  BanditResult result;
  result.before = MeanReward(net, device, false);
  double update_seconds = 0;
  for (int i = 0; i < updates; ++i) {
    const Rollout rollout = CollectBandit(net, 16, 16, device, precision);
    const auto start = std::chrono::steady_clock::now();
    result.last = trainer.Update(rollout, static_cast<double>(i) / updates);
    update_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (const auto& [name, value] : result.last.Items()) {
      INFO(name << " = " << value);
      if (name != "explained_variance") CHECK(std::isfinite(value));
    }
  }
  result.after = MeanReward(net, device, false);
  result.after_mode = MeanReward(net, device, true);
  result.seconds_per_update = update_seconds / updates;
  return result;
}

}  // namespace

TEST_CASE("PPO in bf16 on the CPU learns the contextual bandit", "[amp][ppo]") {
  at::set_num_threads(1);
  const torch::Device cpu(torch::kCPU);
  const BanditResult bf16 = TrainBandit(Precision::kBf16, cpu, 30);
  const BanditResult fp32 = TrainBandit(Precision::kFp32, cpu, 30);
  std::printf(
      "bandit PPO update on CPU (256 samples, 4 epochs x 4 minibatches, 1 thread): fp32 %.2f ms, "
      "bf16 %.2f ms\n",
      1e3 * fp32.seconds_per_update, 1e3 * bf16.seconds_per_update);
  INFO("bf16: mean reward " << bf16.before << " -> " << bf16.after << " (mode " << bf16.after_mode << "), "
                            << 1e3 * bf16.seconds_per_update << " ms/update; fp32: " << fp32.before << " -> "
                            << fp32.after << ", " << 1e3 * fp32.seconds_per_update << " ms/update");
  CHECK(bf16.before == Approx(0.5).margin(0.1));
  CHECK(bf16.after > 0.9);
  CHECK(bf16.after_mode > 0.97);
  CHECK(bf16.last.entropy < std::log(2.0) - 0.1);
  CHECK(bf16.last.loss_scale == 1.0);  // no loss scaling in bf16
  CHECK(bf16.last.skipped_steps == 0);
  CHECK(fp32.after > 0.9);
}

TEST_CASE("PPO in bf16 on the CPU: continuous target matching", "[amp][ppo]") {
  // As ppo_test's continuous bandit: obs[0] is a target in [-1, 1]; reward -(a - target)^2.
  at::set_num_threads(1);
  torch::manual_seed(43);
  const torch::Device cpu(torch::kCPU);
  ActorCritic net(Space::Box({4}, {-1}, {1}), Space::Box({1}, {-2}, {2}), std::vector<int>{32, 32});
  PpoConfig config;
  config.lr = 3e-3;
  config.anneal_lr = false;
  config.ent_coef = 0.0;
  PpoTrainer trainer(net, config, 43, Precision::kBf16);
  const auto reward = [](const torch::Tensor& obs, const torch::Tensor& action) {
    return -(action.select(1, 0).to(torch::kFloat32) - obs.select(1, 0)).square();
  };
  const auto mean_reward = [&](bool deterministic) {
    c10::InferenceMode inference;
    const torch::Tensor obs = torch::rand({2000, 4}) * 2 - 1;
    return reward(obs, net->Act(obs, deterministic).action).mean().item<double>();
  };
  const double before = mean_reward(false);
  for (int i = 0; i < 40; ++i) {
    Rollout r;
    {
      c10::InferenceMode inference;
      const torch::Tensor obs = torch::rand({256, 4}) * 2 - 1;
      ActOutput act;
      {
        AutocastGuard autocast(cpu, Precision::kBf16);
        act = net->Act(obs);
      }
      r.obs = obs.reshape({16, 16, 4});
      r.actions = act.action.to(torch::kFloat32).reshape({16, 16, 1});
      r.logp = act.logp.to(torch::kFloat32).reshape({16, 16});
      r.values = act.value.to(torch::kFloat32).reshape({16, 16});
      r.rewards = reward(obs, act.action).reshape({16, 16});
      r.dones = torch::ones({16, 16});
      r.last_value = torch::zeros({16});
    }
    trainer.Update(r, 0.0);
  }
  const double after = mean_reward(false);
  INFO("stochastic " << before << " -> " << after << ", mean action " << mean_reward(true));
  CHECK(after > before + 0.5);
  CHECK(after > -0.2);
}

TEST_CASE("PpoTrainer refuses fp16 on the CPU and reports scaler stats", "[amp][ppo]") {
  torch::manual_seed(63);
  ActorCritic net(Space::Box({4}, {-1}, {1}), Space::Discrete(2), std::vector<int>{8});
  REQUIRE_THROWS_AS(PpoTrainer(net, PpoConfig(), 1, Precision::kFp16), std::invalid_argument);
  PpoTrainer bf16(net, PpoConfig(), 1, Precision::kBf16);
  CHECK(bf16.precision() == Precision::kBf16);
  CHECK_FALSE(bf16.scaler().enabled());
  {
    // What the trainer's region does to the policy: the MLPs run in bf16.
    AutocastGuard guard(torch::Device(torch::kCPU), Precision::kBf16);
    const EvalOutput eval = net->Evaluate(torch::randn({5, 4}), torch::zeros({5}, torch::kLong));
    CHECK(eval.value.scalar_type() == torch::kBFloat16);
  }
  PpoTrainer fp32(net, PpoConfig(), 1);  // the old signature: fp32
  CHECK(fp32.precision() == Precision::kFp32);
  const PpoStats stats = fp32.Update(CollectBandit(net, 4, 4, torch::Device(torch::kCPU), Precision::kFp32), 0.0);
  bool has_scale = false, has_skipped = false;
  for (const auto& [name, value] : stats.Items()) {
    if (name == "loss_scale") has_scale = value == 1.0;
    if (name == "skipped_steps") has_skipped = value == 0.0;
  }
  CHECK(has_scale);
  CHECK(has_skipped);
}

#ifdef FARM_WITH_CUDA

TEST_CASE("CUDA: LossScaler fused path (overflow, unscale, growth)", "[amp][cuda]") {
  FARM_SKIP_WITHOUT_CUDA();
  const torch::Device cuda(torch::kCUDA, 0);
  const auto on_cuda = [&](std::vector<float> values, std::vector<float> grad) {
    torch::Tensor p = torch::tensor(values, torch::kFloat32).to(cuda).requires_grad_(true);
    p.mutable_grad() = torch::tensor(grad, torch::kFloat32).to(cuda);
    return p;
  };
  LossScaler scaler(Opts(1024, /*growth_interval=*/3));
  torch::Tensor a = on_cuda({1, 2}, {1024, 2048});
  torch::Tensor b = on_cuda({3}, {static_cast<float>(kInf)});
  torch::optim::SGD sgd({a, b}, torch::optim::SGDOptions(1.0));

  // Overflow: skipped, parameters unchanged, scale x0.5.
  CHECK_FALSE(scaler.Step(sgd));
  CHECK(torch::equal(a.detach().cpu(), torch::tensor({1.0f, 2.0f})));
  CHECK(torch::equal(b.detach().cpu(), torch::tensor({3.0f})));
  scaler.Update();
  CHECK(scaler.scale() == 512.0);
  CHECK(scaler.skipped_steps() == 1);

  // Exact unscaling through _amp_foreach_non_finite_check_and_unscale_.
  a.mutable_grad() = torch::tensor({512.0f, -1536.0f}).to(cuda);
  b.mutable_grad() = torch::tensor({2048.0f}).to(cuda);
  REQUIRE(scaler.Unscale({a, b}));
  CHECK(torch::equal(a.grad().cpu(), torch::tensor({1.0f, -3.0f})));
  CHECK(torch::equal(b.grad().cpu(), torch::tensor({4.0f})));
  const double norm = torch::nn::utils::clip_grad_norm_(std::vector<torch::Tensor>{a, b}, 100.0);
  CHECK(norm == Approx(std::sqrt(26.0)));
  CHECK(scaler.Step(sgd));
  scaler.Update();
  CHECK(torch::equal(a.detach().cpu(), torch::tensor({0.0f, 5.0f})));
  CHECK(scaler.growth_tracker() == 1);

  // Growth via _amp_update_scale_ after 3 good steps.
  for (int i = 0; i < 2; ++i) {
    a.mutable_grad() = torch::ones({2}, torch::kFloat32).to(cuda);
    b.mutable_grad() = torch::ones({1}, torch::kFloat32).to(cuda);
    CHECK(scaler.Step(sgd));
    scaler.Update();
  }
  CHECK(scaler.scale() == 1024.0);
  CHECK(scaler.growth_tracker() == 0);

  // The scaled loss on the device matches the host scale.
  const torch::Tensor loss = torch::tensor(0.5f).to(cuda);
  CHECK(scaler.Scale(loss).item<double>() == 512.0);

  // Round trip of the state, then the fused path resumes from it.
  torch::serialize::OutputArchive out;
  scaler.Save(out);
  std::stringstream stream;
  out.save_to(stream);
  torch::serialize::InputArchive in;
  in.load_from(stream);
  LossScaler loaded(Opts(1, 3));
  loaded.Load(in);
  CHECK(loaded.scale() == 1024.0);
  a.mutable_grad() = torch::full({2}, kNaN, torch::kFloat32).to(cuda);
  CHECK_FALSE(loaded.Step(sgd));
  loaded.Update();
  CHECK(loaded.scale() == 512.0);
  CHECK(loaded.skipped_steps() == 2);
}

TEST_CASE("CUDA: fp16 autocast and PPO with loss scaling learns the bandit", "[amp][cuda][ppo]") {
  torch::manual_seed(64);
  FARM_SKIP_WITHOUT_CUDA();
  const torch::Device cuda(torch::kCUDA, 0);
  const torch::Tensor a = torch::randn({4, 8}, torch::TensorOptions().device(cuda));
  const torch::Tensor b = torch::randn({8, 3}, torch::TensorOptions().device(cuda));
  {
    AutocastGuard guard(cuda, Precision::kFp16);
    CHECK(torch::mm(a, b).scalar_type() == torch::kHalf);
    CHECK_FALSE(AutocastEnabled(torch::kCPU));
  }
  {
    AutocastGuard guard(cuda, Precision::kBf16);
    CHECK(torch::mm(a, b).scalar_type() == torch::kBFloat16);
  }
  CHECK_FALSE(AutocastEnabled(torch::kCUDA));
  CHECK(torch::mm(a, b).scalar_type() == torch::kFloat);

  const BanditResult fp16 = TrainBandit(Precision::kFp16, cuda, 30);
  const BanditResult fp32 = TrainBandit(Precision::kFp32, cuda, 30);
  std::printf("bandit PPO update on CUDA: fp32 %.2f ms, fp16 %.2f ms\n", 1e3 * fp32.seconds_per_update,
              1e3 * fp16.seconds_per_update);
  INFO("fp16: " << fp16.before << " -> " << fp16.after << ", loss scale " << fp16.last.loss_scale);
  CHECK(fp16.after > 0.9);
  CHECK(fp16.last.loss_scale > 1.0);
  CHECK(fp32.after > 0.9);
  const BanditResult bf16 = TrainBandit(Precision::kBf16, cuda, 30);
  CHECK(bf16.after > 0.9);
}

#endif  // FARM_WITH_CUDA

}  // namespace farm
