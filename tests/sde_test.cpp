// State-dependent exploration (ppo.sde) outside the policy's own maths (ppo_test): the acting side holds each
// env's noise for ppo.sde_sample_freq steps, and policy_spec.json records the architecture.
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "common/wire.h"
#include "learner/model/policy_spec.h"
#include "learner/serve/acting.h"
#include "learner/serve/work.h"

#undef CHECK  // glog's, from LibTorch: Catch's must win
#include <catch2/catch.hpp>

namespace farm {
namespace {

const Space kObs = Space::Box({3}, {-1}, {1});
const Space kAction = Space::Box({1}, {-2}, {2});

// A step request of `rows` envs of one group, every row the same observation.
std::unique_ptr<Work> Request(const std::string& identity, uint32_t group, uint64_t seq, int64_t rows) {
  auto w = std::make_unique<Work>();
  w->identity = identity;
  w->rows = rows;
  wire::StepRequest* req = w->msg.mutable_step();
  req->set_group(group);
  req->set_seq(seq);
  const std::vector<float> obs(static_cast<std::size_t>(rows) * 3, 0.25f);
  SetTensor(req->mutable_obs(), DType::kFloat32, {rows, 3}, obs.data(), obs.size() * sizeof(float));
  return w;
}

// The actions Acting chooses for `requests`, batched together as the inference thread batches them.
torch::Tensor ActOn(Acting& acting, const std::vector<std::unique_ptr<Work>>& requests, torch::Tensor* logp = nullptr) {
  std::vector<Work*> steps;
  for (const auto& w : requests) steps.push_back(w.get());
  const int64_t rows = Acting::Rows(steps);
  acting.Gather(steps, rows);
  const Acting::Output out = acting.Act(rows);
  if (logp) *logp = out.logp;
  return out.action.view({rows});
}

}  // namespace

TEST_CASE("gSDE acting holds each env's noise matrix for sde_sample_freq of its steps", "[sde]") {
  torch::manual_seed(3);
  FarmConfig config;
  config.ppo.sde = true;
  config.ppo.sde_sample_freq = 4;
  config.batcher.max_rows = 64;
  PolicyOptions options;
  options.sde = true;
  ActorCritic policy(kObs, kAction, std::vector<int>{16, 8}, options);
  Acting acting(config, torch::kCPU, Precision::kFp32, kObs, kAction, std::nullopt, 1, policy, nullptr, true);

  auto one = [&](const std::string& id, uint32_t group, uint64_t seq, int64_t rows = 2) {
    std::vector<std::unique_ptr<Work>> r;
    r.push_back(Request(id, group, seq, rows));
    return ActOn(acting, r);
  };
  const torch::Tensor first = one("a", 0, 0);
  // Every row of a request has its own matrix: the same observation, different actions.
  CHECK(first[0].item<float>() != first[1].item<float>());
  // Steps 1-3 of the period: the same matrices (and here the same observations), the same actions.
  for (uint64_t seq = 1; seq < 4; ++seq) CHECK(torch::equal(one("a", 0, seq), first));
  // Step 4 starts a new period; another group or worker has other matrices.
  CHECK_FALSE(torch::equal(one("a", 0, 4), first));
  CHECK_FALSE(torch::equal(one("a", 1, 0), first));
  CHECK_FALSE(torch::equal(one("b", 0, 0), first));
  // Batched with other requests, a request's rows keep their own noise.
  std::vector<std::unique_ptr<Work>> batch;
  batch.push_back(Request("b", 0, 0, 3));
  batch.push_back(Request("a", 0, 2, 2));
  torch::Tensor logp;
  const torch::Tensor both = ActOn(acting, batch, &logp);
  // Close, not equal: BLAS may round a batch of 5 rows otherwise than one of 2 (OpenBLAS's Haswell kernels, as
  // OPENBLAS_CORETYPE=Haswell forces on some AMD machines, do); another noise matrix would differ by O(1).
  CHECK(torch::allclose(both.slice(0, 3, 5), first, /*rtol=*/0, /*atol=*/1e-5));

  // The log-probs are the policy's for those actions (what the PPO ratio starts from).
  const torch::Tensor obs = torch::full({5, 3}, 0.25f);
  const EvalOutput eval = policy->Evaluate(obs, both.view({5, 1}));
  CHECK(torch::allclose(eval.logp.detach(), logp, /*rtol=*/0, /*atol=*/1e-5));

  // Over many periods the noise has the Gaussian's spread: std of the actions ~ sqrt(var).
  std::vector<torch::Tensor> samples;
  for (uint64_t period = 0; period < 400; ++period) samples.push_back(one("c", 0, period * 4, 32));
  const torch::Tensor all = torch::cat(samples);
  const torch::Tensor mean = policy->Act(obs.slice(0, 0, 1), {}, /*deterministic=*/true).action.squeeze();
  const double expected = std::exp(-policy->Act(obs.slice(0, 0, 1), {}, true).logp.item<double>() -
                                   0.91893853320467274);  // -logp(mean) = log std + 0.5 log(2 pi)
  INFO("mean " << all.mean().item<double>() << " vs " << mean.item<double>() << ", std " << all.std().item<double>()
               << " vs " << expected);
  CHECK(all.mean().item<double>() == Approx(mean.item<double>()).margin(0.05 * expected));
  CHECK(all.std().item<double>() == Approx(expected).epsilon(0.03));

  // Deterministic acting takes the mean, whatever the period.
  config.learner.deterministic = true;
  Acting mode(config, torch::kCPU, Precision::kFp32, kObs, kAction, std::nullopt, 1, policy, nullptr, true);
  std::vector<std::unique_ptr<Work>> r;
  r.push_back(Request("a", 0, 0, 2));
  CHECK(torch::allclose(ActOn(mode, r), mean.expand({2})));
}

TEST_CASE("policy_spec.json records sde, and refuses it on a discrete action", "[sde]") {
  PolicyOptions options;
  options.sde = true;
  const std::string text = PolicySpecJson(kObs, kAction, {16, 8}, options);
  CHECK_THAT(text, Catch::Contains("\"sde\": true"));
  Space obs, action;
  std::vector<int> hidden;
  PolicyOptions parsed;
  REQUIRE(ParsePolicySpecJson(text, "spec", &obs, &action, &hidden, &parsed).ok());
  CHECK(parsed.sde);
  // Rebuilt from the spec, the policy has the [latent, action] log-std a checkpoint of it holds.
  ActorCritic rebuilt(obs, action, hidden, parsed);
  CHECK(rebuilt->named_parameters()["log_std"].sizes() == torch::IntArrayRef{8, 1});
  // Without sde nothing is written (older readers know no "sde" key), and absent means false.
  const std::string plain = PolicySpecJson(kObs, kAction, {16, 8});
  CHECK_THAT(plain, !Catch::Contains("sde"));
  REQUIRE(ParsePolicySpecJson(plain, "spec", &obs, &action, &hidden, &parsed).ok());
  CHECK_FALSE(parsed.sde);
  // A caller that cannot rebuild it is told.
  CHECK_THAT(ParsePolicySpecJson(text, "spec", &obs, &action, &hidden).message(), Catch::Contains("with sde"));
  const std::string discrete = PolicySpecJson(kObs, Space::Discrete(3), {16});
  std::string bad = discrete;
  bad.insert(bad.rfind('}'), ", \"sde\": true");
  CHECK_THAT(ParsePolicySpecJson(bad, "spec", &obs, &action, &hidden, &parsed).message(),
             Catch::Contains("spec: sde: state-dependent exploration needs a box action"));
  std::string wrong = text;
  wrong.replace(wrong.find("true"), 4, "1");
  CHECK_THAT(ParsePolicySpecJson(wrong, "spec", &obs, &action, &hidden, &parsed).message(),
             Catch::Contains("spec: sde: expected true or false, got 1"));
}

}  // namespace farm
