// GraphedActor (learner.cuda_graphs) against the eager ActorCritic::Act, and ScopedCudaStream. The CUDA
// cases return with a warning unless the build has CUDA (FARM_WITH_CUDA) and a GPU is present; the CPU
// case (the refusal) runs everywhere.
#include <torch/torch.h>
#undef CHECK

#include <catch2/catch.hpp>

#include "tests/cuda_skip.h"

#include <cmath>
#include <memory>
#include <vector>

#include "learner/model/cuda_graph.h"
#include "learner/model/policy.h"

namespace farm {
namespace {

// The cnn encoder on both networks, the critic on `state` (a centralised critic).
PolicyOptions CnnWithState(const Space& state) {
  PolicyOptions o;
  o.encoder = Encoder::kCnn;
  o.global_state = state;
  return o;
}


ActorCritic MakePolicy(const Space& action, torch::Device device, uint64_t seed) {
  torch::manual_seed(seed);
  ActorCritic policy(Space::Box({3, 2}, {-1.f}, {1.f}), action, std::vector<int>{32, 32});
  {
    // Larger head weights than the 0.01 init, so that actions depend visibly on the observation.
    torch::NoGradGuard no_grad;
    for (auto& p : policy->parameters()) p.normal_(0.0, 0.5);
  }
  policy->to(device);
  policy->eval();
  return policy;
}

}  // namespace

TEST_CASE("GraphedActor refuses a CPU device", "[cuda_graph]") {
  auto policy = MakePolicy(Space::Discrete(3), torch::kCPU, 1);
  std::unique_ptr<GraphedActor> graphed;
  const Status s = GraphedActor::Create(policy, torch::kCPU, Precision::kFp32, {3, 2}, false, &graphed);
  REQUIRE_FALSE(s.ok());
  CHECK(s.message().find("learner.cuda_graphs") != std::string::npos);
  CHECK(GraphedActor::BucketRows(1) == 16);
  CHECK(GraphedActor::BucketRows(16) == 16);
  CHECK(GraphedActor::BucketRows(17) == 32);
  CHECK(GraphedActor::BucketRows(1000) == 1024);
}

TEST_CASE("GraphedActor: deterministic replay equals the eager forward, and sees weight updates", "[cuda_graph]") {
  FARM_SKIP_UNLESS(BuiltWithCuda() && torch::cuda::is_available());
  const torch::Device cuda(torch::kCUDA, 0);
  auto policy = MakePolicy(Space::Discrete(5), cuda, 2);
  std::unique_ptr<GraphedActor> graphed;
  REQUIRE(GraphedActor::Create(policy, cuda, Precision::kFp32, {3, 2}, /*deterministic=*/true, &graphed).ok());
  c10::InferenceMode guard;
  for (int64_t rows : {1, 10, 16, 100, 1000, 70}) {
    auto obs = torch::randn({rows, 3, 2}).pin_memory();
    auto got = graphed->Act(obs);
    auto want = policy->Act(obs.to(cuda), true);
    REQUIRE(got.action.size(0) == rows);
    CHECK(torch::equal(got.action.cpu(), want.action.cpu()));
    CHECK(torch::allclose(got.value.cpu(), want.value.cpu(), 1e-4, 1e-5));
    CHECK(torch::allclose(got.logp.cpu(), want.logp.cpu(), 1e-4, 1e-5));
  }
  CHECK(graphed->captured_graphs() == 3);  // buckets 16 (1, 10, 16 rows), 128 (100, 70) and 1024

  // New weights copied in place (as the learner does after an update) reach the next replay.
  auto other = MakePolicy(Space::Discrete(5), cuda, 3);
  policy->CopyFrom(*other);
  auto obs = torch::randn({100, 3, 2}).pin_memory();
  auto got = graphed->Act(obs);
  auto want = other->Act(obs.to(cuda), true);
  CHECK(torch::equal(got.action.cpu(), want.action.cpu()));
  CHECK(torch::allclose(got.value.cpu(), want.value.cpu(), 1e-4, 1e-5));
}

TEST_CASE("GraphedActor with a centralised critic on cnn encoders: one state per env, as the eager forward",
          "[cuda_graph]") {
  // The shapes of uav_coverage's views and map, scaled down: 4 agents per env, [2, 5, 5] views, a [3, 8, 8] state.
  const Space state_space = Space::Box({3, 8, 8}, {-1.f}, {1.f});
  const int64_t agents = 4;
  std::unique_ptr<GraphedActor> graphed;
  {
    ActorCritic cpu(Space::Box({2, 5, 5}, {-1.f}, {1.f}), Space::MultiDiscrete({5, 5}), std::vector<int>{32, 16},
                    CnnWithState(state_space));
    // Refused: rows per state without a state, and no rows.
    CHECK_FALSE(GraphedActor::Create(cpu, torch::kCPU, Precision::kFp32, {2, 5, 5}, true, &graphed, {3, 8, 8}, 0).ok());
  }
  FARM_SKIP_UNLESS(BuiltWithCuda() && torch::cuda::is_available());
  const torch::Device cuda(torch::kCUDA, 0);
  // Full fp32 convolutions: the graphs run a bucket's batch size, the eager forward the batch's own, and TF32's
  // rounding may differ between the algorithms cuDNN picks for each.
  const bool tf32 = at::globalContext().allowTF32CuDNN();
  at::globalContext().setAllowTF32CuDNN(false);
  struct Restore {
    bool tf32;
    ~Restore() { at::globalContext().setAllowTF32CuDNN(tf32); }
  } restore{tf32};
  torch::manual_seed(7);
  ActorCritic policy(Space::Box({2, 5, 5}, {-1.f}, {1.f}), Space::MultiDiscrete({5, 5}), std::vector<int>{32, 16},
                     CnnWithState(state_space));
  {
    torch::NoGradGuard no_grad;
    for (auto& p : policy->parameters()) p.normal_(0.0, 0.3);
  }
  policy->to(cuda);
  policy->eval();
  REQUIRE(GraphedActor::Create(policy, cuda, Precision::kFp32, {2, 5, 5}, /*deterministic=*/true, &graphed,
                               {3, 8, 8}, agents)
              .ok());
  c10::InferenceMode guard;
  for (int64_t envs : {1, 3, 16, 17, 40}) {
    auto obs = torch::randn({envs * agents, 2, 5, 5}).pin_memory();
    auto state = torch::randn({envs, 3, 8, 8}).pin_memory();
    auto got = graphed->Act(obs, state);
    auto want = policy->Act(obs.to(cuda), state.to(cuda), true);
    REQUIRE(got.action.size(0) == envs * agents);
    CHECK(torch::equal(got.action.cpu(), want.action.cpu()));
    CHECK(torch::allclose(got.value.cpu(), want.value.cpu(), 1e-3, 1e-4));
    CHECK(torch::allclose(got.logp.cpu(), want.logp.cpu(), 1e-3, 1e-4));
    // Every agent of an env has its env's value.
    auto v = got.value.cpu().view({envs, agents});
    CHECK(torch::equal(v, v.select(1, 0).unsqueeze(1).expand({envs, agents})));
  }
  CHECK(graphed->captured_graphs() == 3);  // buckets of 16 envs (1, 3, 16), 32 (17) and 64 (40)
  // A batch that is not whole envs, or a state count that does not match, is refused.
  CHECK_THROWS_AS(graphed->Act(torch::zeros({6, 2, 5, 5}), torch::zeros({1, 3, 8, 8})), std::invalid_argument);
  CHECK_THROWS_AS(graphed->Act(torch::zeros({8, 2, 5, 5}), torch::zeros({1, 3, 8, 8})), std::invalid_argument);
}

TEST_CASE("GraphedActor: sampled actions follow the policy and differ between replays", "[cuda_graph]") {
  FARM_SKIP_UNLESS(BuiltWithCuda() && torch::cuda::is_available());
  const torch::Device cuda(torch::kCUDA, 0);
  auto policy = MakePolicy(Space::Discrete(4), cuda, 4);
  std::unique_ptr<GraphedActor> graphed;
  REQUIRE(GraphedActor::Create(policy, cuda, Precision::kFp32, {3, 2}, false, &graphed).ok());
  c10::InferenceMode guard;
  // One observation repeated: every row samples the same distribution.
  const int64_t rows = 4096;
  auto obs = torch::randn({1, 3, 2}).expand({rows, 3, 2}).contiguous().pin_memory();
  auto first = graphed->Act(obs).action.cpu().clone();
  auto second = graphed->Act(obs).action.cpu().clone();
  CHECK_FALSE(torch::equal(first, second));
  // Empirical frequencies against the policy's probabilities (from the log-probs the replay returns).
  auto out = graphed->Act(obs);
  auto actions = out.action.cpu();
  auto logp = out.logp.cpu();
  for (int a = 0; a < 4; ++a) {
    auto mask = actions == a;
    const int64_t count = mask.sum().item<int64_t>();
    if (count == 0) continue;
    const double p = std::exp(logp.masked_select(mask)[0].item<double>());
    const double freq = static_cast<double>(count) / rows;
    const double sd = std::sqrt(p * (1 - p) / rows);
    INFO("action " << a << " p " << p << " freq " << freq);
    CHECK(std::abs(freq - p) < 5 * sd + 1e-3);
  }
}

TEST_CASE("GraphedActor: bf16 and fp16 replays stay close to fp32, Gaussian head", "[cuda_graph]") {
  FARM_SKIP_UNLESS(BuiltWithCuda() && torch::cuda::is_available());
  const torch::Device cuda(torch::kCUDA, 0);
  auto policy = MakePolicy(Space::Box({2}, {-2.f}, {2.f}), cuda, 5);
  auto obs = torch::randn({300, 3, 2}).pin_memory();
  c10::InferenceMode guard;
  auto want = policy->Act(obs.to(cuda), true);
  for (Precision precision : {Precision::kBf16, Precision::kFp16}) {
    std::unique_ptr<GraphedActor> graphed;
    REQUIRE(GraphedActor::Create(policy, cuda, precision, {3, 2}, true, &graphed).ok());
    auto got = graphed->Act(obs);
    CHECK(got.value.scalar_type() == torch::kFloat32);
    const double rel = (got.value.cpu() - want.value.cpu()).norm().item<double>() /
                       want.value.cpu().norm().item<double>();
    INFO(PrecisionName(precision) << " relative error " << rel);
    CHECK(rel < 3e-2);
    const double rel_a = (got.action.cpu().to(torch::kFloat32) - want.action.cpu()).norm().item<double>() /
                         want.action.cpu().norm().item<double>();
    CHECK(rel_a < 3e-2);
  }
  // Stochastic Gaussian actions: mean and spread of many samples of one observation.
  std::unique_ptr<GraphedActor> graphed;
  REQUIRE(GraphedActor::Create(policy, cuda, Precision::kFp32, {3, 2}, false, &graphed).ok());
  auto one = torch::randn({1, 3, 2});
  auto many = one.expand({8192, 3, 2}).contiguous().pin_memory();
  auto mean = policy->Act(one.to(cuda), true).action.cpu().view({2});
  auto samples = graphed->Act(many).action.cpu();
  auto std = policy->named_parameters()["log_std"].detach().exp().cpu();
  // Five standard errors of the mean (std / sqrt(n)) and of the standard deviation (~std / sqrt(2n)).
  CHECK(((samples.mean(0) - mean).abs() < 5 * std / std::sqrt(8192.0)).all().item<bool>());
  CHECK(((samples.std(0) - std).abs() < 5 * std / std::sqrt(2 * 8192.0)).all().item<bool>());
}

TEST_CASE("ScopedCudaStream: work on the trainer's stream is visible after Synchronize", "[cuda_graph]") {
  FARM_SKIP_UNLESS(BuiltWithCuda() && torch::cuda::is_available());
  const torch::Device cuda(torch::kCUDA, 0);
  torch::Tensor x = torch::zeros({1 << 20}, torch::TensorOptions().device(cuda));
  {
    ScopedCudaStream stream(cuda);
    x.add_(1.0);
    for (int i = 0; i < 10; ++i) x.mul_(2.0);
    stream.Synchronize();
  }
  CHECK(x.min().item<double>() == 1024.0);
  CHECK(x.max().item<double>() == 1024.0);
}

}  // namespace farm
