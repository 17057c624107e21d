// V-trace (learner/train/vtrace.h): hand-worked targets and advantages, the IMPALA paper's sum written out
// independently of the recursion, lambda-returns and GAE's advantages when the policies agree, and the PPO
// update's correction at its start on the fused, LibTorch, graphed and recurrent paths.
#include "learner/train/vtrace.h"

#include <torch/torch.h>

#include <cmath>
#include <optional>
#include <vector>

#include "common/config.h"
#include "learner/model/policy.h"
#include "learner/train/ppo.h"
#include "learner/train/ppo_chunks.h"
#include "tests/ppo_test_util.h"

// LibTorch includes glog, whose one-argument CHECK would silently replace Catch's: include Catch last.
#undef CHECK
#include <catch2/catch.hpp>

namespace farm {
namespace {

torch::Tensor Col(std::vector<float> v) { return torch::tensor(v).unsqueeze(1); }  // [T] -> [T, 1]

// The paper's definition for one row, as a sum (not the recursion vtrace.cpp runs), in double:
// v_s = V(x_s) + sum_{t >= s} gamma^{t-s} (prod_{i=s}^{t-1} c_i) delta_t, the sum and product stopping at the
// first step that ended an episode (included: its own delta counts, nothing after it).
std::vector<double> PaperTargets(const std::vector<double>& ratio, const std::vector<double>& r,
                                 const std::vector<double>& v, const std::vector<double>& done, double last_v,
                                 double gamma, double lambda, double rho_bar, double c_bar) {
  const std::size_t T = r.size();
  std::vector<double> vs(T);
  for (std::size_t s = 0; s < T; ++s) {
    double sum = 0, discount = 1, traces = 1;
    for (std::size_t t = s; t < T; ++t) {
      const double next_v = done[t] > 0 ? 0.0 : (t + 1 < T ? v[t + 1] : last_v);
      const double delta = std::min(rho_bar, ratio[t]) * (r[t] + gamma * next_v - v[t]);
      sum += discount * traces * delta;
      if (done[t] > 0) break;
      discount *= gamma;
      traces *= lambda * std::min(c_bar, ratio[t]);
    }
    vs[s] = v[s] + sum;
  }
  return vs;
}

TEST_CASE("V-trace on a hand-worked trajectory", "[vtrace]") {
  // gamma 0.9, lambda 1, bars 1; ratios 2, 0.5, 1 (rho = c = 1, 0.5, 1).
  const torch::Tensor log_rhos = Col({std::log(2.0f), std::log(0.5f), 0.0f});
  const torch::Tensor rewards = Col({1.0f, 0.0f, 2.0f});
  const torch::Tensor values = Col({0.5f, 1.0f, 0.2f});
  const torch::Tensor last = torch::tensor({0.4f});
  VtraceParams p;
  p.gamma = 0.9;
  p.lambda = 1.0;
  SECTION("no episode end: every step bootstraps through to V(x_T)") {
    VtraceStats stats;
    const Advantages a = ComputeVtrace(log_rhos, rewards, values, torch::zeros({3, 1}), last, p, &stats);
    // delta_2 = 2 + 0.9 * 0.4 - 0.2 = 2.16; v_2 = 2.36.
    // delta_1 = 0.5 * (0 + 0.9 * 0.2 - 1) = -0.41; v_1 = 1 + (-0.41 + 0.9 * 0.5 * 2.16) = 1.562.
    // delta_0 = 1 + 0.9 * 1 - 0.5 = 1.4; v_0 = 0.5 + (1.4 + 0.9 * 1 * 0.562) = 2.4058.
    CHECK(a.returns[2][0].item<float>() == Approx(2.36).epsilon(1e-5));
    CHECK(a.returns[1][0].item<float>() == Approx(1.562).epsilon(1e-5));
    CHECK(a.returns[0][0].item<float>() == Approx(2.4058).epsilon(1e-5));
    // A_t = r_t + gamma V(x_{t+1}) - V(x_t) + gamma lambda (v_{t+1} - V(x_{t+1})), no ratio of a_t's own:
    // 1.4 + 0.9 * (1.562 - 1) = 1.9058; (0.18 - 1) + 0.9 * (2.36 - 0.2) = 1.124; 2.16 + 0.9 * 0 = 2.16.
    CHECK(a.advantages[0][0].item<float>() == Approx(1.9058).epsilon(1e-5));
    CHECK(a.advantages[1][0].item<float>() == Approx(1.124).epsilon(1e-5));
    CHECK(a.advantages[2][0].item<float>() == Approx(2.16).epsilon(1e-5));
    CHECK(stats.ratio_mean == Approx(3.5 / 3).epsilon(1e-6));
    CHECK(stats.rho_clipped == Approx(1.0 / 3));
    CHECK(stats.c_clipped == Approx(1.0 / 3));
  }
  SECTION("an episode ends at step 1: nothing after it reaches steps 0 and 1") {
    const Advantages a = ComputeVtrace(log_rhos, rewards, values, Col({0.0f, 1.0f, 0.0f}), last, p);
    // v_2 = 2.36 as before; delta_1 = 0.5 * (0 - 1) = -0.5 and no trace: v_1 = 0.5;
    // v_0 = 0.5 + 1.4 + 0.9 * (-0.5) = 1.45.
    CHECK(a.returns[2][0].item<float>() == Approx(2.36).epsilon(1e-5));
    CHECK(a.returns[1][0].item<float>() == Approx(0.5).epsilon(1e-5));
    CHECK(a.returns[0][0].item<float>() == Approx(1.45).epsilon(1e-5));
    // A_1 = 0 - 1 (its episode ended: nothing after it); A_0 = 1.4 + 0.9 * (0.5 - 1) = 0.95.
    CHECK(a.advantages[1][0].item<float>() == Approx(-1.0).epsilon(1e-5));
    CHECK(a.advantages[0][0].item<float>() == Approx(0.95).epsilon(1e-5));
  }
}

TEST_CASE("V-trace's recursion equals the paper's sum, with lambda, both bars and episode ends", "[vtrace]") {
  torch::manual_seed(3);
  const int64_t T = 13, N = 7;
  const torch::Tensor log_rhos = torch::randn({T, N}) * 0.7;
  const torch::Tensor rewards = torch::randn({T, N});
  const torch::Tensor values = torch::randn({T, N});
  const torch::Tensor dones = (torch::rand({T, N}) < 0.15).to(torch::kFloat32);
  const torch::Tensor last = torch::randn({N});
  VtraceParams p;
  p.gamma = 0.97;
  p.lambda = 0.9;
  p.rho_bar = 1.3;
  p.c_bar = 0.8;
  const Advantages a = ComputeVtrace(log_rhos, rewards, values, dones, last, p);
  for (int64_t n = 0; n < N; ++n) {
    std::vector<double> ratio, r, v, d;
    for (int64_t t = 0; t < T; ++t) {
      ratio.push_back(std::exp(log_rhos[t][n].item<double>()));
      r.push_back(rewards[t][n].item<double>());
      v.push_back(values[t][n].item<double>());
      d.push_back(dones[t][n].item<double>());
    }
    const std::vector<double> vs =
        PaperTargets(ratio, r, v, d, last[n].item<double>(), p.gamma, p.lambda, p.rho_bar, p.c_bar);
    for (int64_t t = 0; t < T; ++t) {
      INFO("row " << n << " step " << t);
      CHECK(a.returns[t][n].item<double>() == Approx(vs[static_cast<std::size_t>(t)]).margin(1e-4));
      const auto u = static_cast<std::size_t>(t);
      const bool ended = d[u] > 0;
      const double next_v = ended ? 0.0 : t + 1 < T ? v[u + 1] : last[n].item<double>();
      const double next_vs = ended ? 0.0 : t + 1 < T ? vs[u + 1] : last[n].item<double>();
      // The advantage of a_t: its TD error, then lambda times the correction from t + 1 on; no ratio of its own.
      const double adv = r[u] + p.gamma * next_v - v[u] + p.gamma * p.lambda * (next_vs - next_v);
      CHECK(a.advantages[t][n].item<double>() == Approx(adv).margin(1e-4));
    }
  }
  CHECK_THROWS_WITH(ComputeVtrace(log_rhos, rewards, values.narrow(0, 0, 3), dones, last, p),
                    Catch::Contains("values"));
}

TEST_CASE("with the behaviour policy equal to the target, V-trace's targets are the lambda-returns and its advantages GAE's",
          "[vtrace]") {
  torch::manual_seed(4);
  const int64_t T = 16, N = 9;
  const torch::Tensor rewards = torch::randn({T, N});
  const torch::Tensor values = torch::randn({T, N});
  const torch::Tensor dones = (torch::rand({T, N}) < 0.1).to(torch::kFloat32);
  const torch::Tensor last = torch::randn({N});
  for (double lambda : {0.0, 0.8, 0.95, 1.0}) {
    VtraceParams p;
    p.gamma = 0.99;
    p.lambda = lambda;
    const Advantages vt = ComputeVtrace(torch::zeros({T, N}), rewards, values, dones, last, p);
    const Advantages gae = ComputeGae(rewards, values, dones, last, p.gamma, lambda);
    INFO("lambda " << lambda);
    CHECK(testing::RelativeDiff(vt.returns, gae.returns) < 1e-5);
    CHECK(testing::RelativeDiff(vt.advantages, gae.advantages) < 1e-5);  // GAE's advantages, whatever lambda
  }
}

// A rollout whose behaviour log-probs and values are the policy's own on its data (what the policy being
// trained computes at the update's start): V-trace then gives GAE's targets and advantages.
Rollout OnPolicyRollout(ActorCritic& policy, int64_t T, int64_t N, int64_t bptt) {
  Rollout r;
  r.obs = torch::randn({T, N, 3});
  r.actions = torch::randint(2, {T, N}, torch::kLong);
  r.rewards = torch::randn({T, N});
  r.dones = (torch::rand({T, N}) < 0.15).to(torch::kFloat32);
  r.last_value = torch::randn({N});
  r.logp = torch::zeros({T, N});
  r.values = torch::zeros({T, N});
  if (bptt > 0) {
    r.core_states = torch::zeros({T / bptt, N, policy->core_state_size()});
    r.bptt = bptt;
    const PpoChunks chunks = MakeChunks(r, Advantages{r.values, r.values}, torch::kCPU);
    const auto [logp, value] = EvaluateChunks(*policy, chunks, 1, Precision::kFp32);
    r.logp = FromChunks(logp, T).clone();
    r.values = FromChunks(value, T).clone();
  } else {
    const PpoRows rows{r.obs.flatten(0, 1), {}, r.actions.flatten(0, 1), r.logp.flatten(), r.values.flatten(),
                       r.values.flatten(), r.values.flatten(), {}};
    const auto [logp, value] = EvaluateRows(*policy, rows, 1, Precision::kFp32);
    r.logp = logp.view({T, N}).clone();
    r.values = value.view({T, N}).clone();
  }
  return r;
}

// A copy of `rollout` whose behaviour log-probs are moved off the policy's (as an older policy's would be).
Rollout OffPolicy(const Rollout& rollout, uint64_t seed, double scale = 0.3) {
  torch::manual_seed(seed);
  Rollout off = rollout;
  off.logp = rollout.logp + scale * torch::randn(rollout.logp.sizes());
  return off;
}

void CheckUpdateAgainstGae(const std::string& fused_update, CoreKind core) {
  const Space obs = Space::Box({3}, {-1}, {1});
  PolicyOptions options;
  options.core = core;
  options.core_size = 8;
  const auto make = [&] {
    torch::manual_seed(11);
    return ActorCritic(obs, Space::Discrete(2), std::vector<int>{16}, options);
  };
  ActorCritic probe = make();
  torch::manual_seed(12);
  const int64_t bptt = core == CoreKind::kNone ? 0 : 4;
  const Rollout rollout = OnPolicyRollout(probe, 8, 6, bptt);
  PpoConfig config;
  config.gae_lambda = 0.9;
  config.lr = 0.03;  // large steps: by the second epoch the policy is far from the behaviour policy
  config.anneal_lr = false;
  config.num_minibatches = 2;
  config.update_epochs = 3;
  config.fused_update = fused_update;
  const auto train = [&](const Rollout& r, const std::string& advantage, PpoStats* stats) {
    ActorCritic policy = make();
    PpoConfig c = config;
    c.advantage = advantage;
    PpoTrainer trainer(policy, c, 5);
    CHECK(trainer.fused() == (fused_update == "on"));
    *stats = trainer.Update(r, 0);
    return testing::FlatParameters(policy);
  };
  PpoStats gae_stats, vtrace_stats;
  // On-policy data: the policy at the update's start is the behaviour policy, so V-trace is GAE (lambda 0.9) for
  // the whole update, however far the later epochs move the policy: it is computed once, at the start.
  const torch::Tensor gae = train(rollout, "gae", &gae_stats);
  const torch::Tensor vtrace = train(rollout, "vtrace", &vtrace_stats);
  CHECK_FALSE(gae_stats.vtrace);
  CHECK(vtrace_stats.vtrace);
  CHECK(vtrace_stats.vtrace_ratio == Approx(1.0).margin(1e-6));
  CHECK(vtrace_stats.vtrace_rho_clipped == 0.0);
  CHECK(gae_stats.approx_kl > 1e-3);  // the epochs did move the policy
  CHECK(testing::RelativeDiff(vtrace, gae) < 1e-5);
  // Off-policy data: the ratios are those of the policy at the update's start to the behaviour policy, and
  // V-trace's targets differ from GAE's.
  const Rollout off = OffPolicy(rollout, 13);
  const torch::Tensor gae_off = train(off, "gae", &gae_stats);
  const torch::Tensor vtrace_off = train(off, "vtrace", &vtrace_stats);
  const torch::Tensor ratios = (rollout.logp - off.logp).exp();
  CHECK(vtrace_stats.vtrace_ratio == Approx(ratios.mean().item<double>()).epsilon(1e-4));
  CHECK(vtrace_stats.vtrace_rho_clipped == Approx((ratios > 1).to(torch::kFloat64).mean().item<double>()).margin(1e-6));
  CHECK(testing::RelativeDiff(vtrace_off, gae_off) > 1e-3);
  CHECK(std::isfinite(vtrace_stats.policy_loss));
}

TEST_CASE("V-trace with a centralised critic: each agent row its own ratio, its env's value", "[vtrace]") {
  // 3 envs of 2 agents: the critic values each env's global state once; every agent row takes that value.
  const Space obs = Space::Box({3}, {-1}, {1});
  PolicyOptions options;
  options.global_state = Space::Box({4}, {-1}, {1});
  const int64_t T = 8, N = 6, k = 2;
  const auto make = [&] {
    torch::manual_seed(31);
    return ActorCritic(obs, Space::Discrete(2), std::vector<int>{16}, options);
  };
  ActorCritic probe = make();
  torch::manual_seed(32);
  Rollout r;
  r.obs = torch::randn({T, N, 3});
  r.states = torch::randn({T, N / k, 4});
  r.rows_per_state = k;
  r.actions = torch::randint(2, {T, N}, torch::kLong);
  r.rewards = torch::randn({T, N});
  r.dones = (torch::rand({T, N / k, 1}) < 0.15).to(torch::kFloat32).expand({T, N / k, k}).reshape({T, N});
  r.last_value = torch::randn({N / k}).repeat_interleave(k);
  const PpoRows rows{r.obs.flatten(0, 1), r.states.flatten(0, 1), r.actions.flatten(0, 1), torch::zeros({T * N}),
                     torch::zeros({T * N}), torch::zeros({T * N}), torch::zeros({T * N}), {}};
  const auto [logp, value] = EvaluateRows(*probe, rows, k, Precision::kFp32);
  r.logp = logp.view({T, N}).clone();
  r.values = value.view({T, N}).clone();
  // The agents of an env share its value: the critic ran once per state.
  CHECK(torch::equal(r.values.select(1, 0), r.values.select(1, 1)));
  CHECK_FALSE(torch::equal(r.logp.select(1, 0), r.logp.select(1, 1)));
  PpoConfig config;
  config.gae_lambda = 0.95;
  config.num_minibatches = 3;
  config.update_epochs = 2;
  const auto train = [&](const std::string& advantage) {
    ActorCritic policy = make();
    PpoConfig c = config;
    c.advantage = advantage;
    PpoTrainer trainer(policy, c, 5);
    const PpoStats stats = trainer.Update(r, 0);
    CHECK(stats.vtrace == (advantage == "vtrace"));
    return testing::FlatParameters(policy);
  };
  CHECK(testing::RelativeDiff(train("vtrace"), train("gae")) < 1e-5);
}

TEST_CASE("the update computes V-trace once, from the policy at its start: the fused path", "[vtrace]") {
  CheckUpdateAgainstGae("on", CoreKind::kNone);
}

TEST_CASE("the update computes V-trace once, from the policy at its start: the LibTorch path", "[vtrace]") {
  CheckUpdateAgainstGae("off", CoreKind::kNone);
}

TEST_CASE("the update computes V-trace once, from the policy at its start: through a GRU's chunks", "[vtrace]") {
  CheckUpdateAgainstGae("auto", CoreKind::kGru);
}

TEST_CASE("the graphed step trains on V-trace's targets as the LibTorch path does", "[vtrace]") {
  // On the CPU, graph_update=on runs the graphed step's static code without a graph (the same arithmetic); it takes
  // over from the second update, once Adam has state.
  const Space obs = Space::Box({3}, {-1}, {1});
  torch::manual_seed(61);
  ActorCritic probe(obs, Space::Discrete(2), std::vector<int>{16});
  const Rollout off = OffPolicy(OnPolicyRollout(probe, 8, 6, 0), 62);
  PpoConfig config;
  config.advantage = "vtrace";
  config.fused_update = "off";
  config.num_minibatches = 2;
  config.update_epochs = 2;
  const auto train = [&](const std::string& graph, PpoStats* stats) {
    torch::manual_seed(61);
    ActorCritic policy(obs, Space::Discrete(2), std::vector<int>{16});
    PpoConfig c = config;
    c.graph_update = graph;
    PpoTrainer trainer(policy, c, 5);
    trainer.Update(off, 0);
    *stats = trainer.Update(off, 0.5);
    CHECK(trainer.graphed_updates() == (graph == "on" ? 1 : 0));
    return testing::FlatParameters(policy);
  };
  PpoStats graphed, libtorch;
  const torch::Tensor a = train("on", &graphed);
  const torch::Tensor b = train("off", &libtorch);
  CHECK(testing::RelativeDiff(a, b) < 1e-4);
  CHECK(graphed.vtrace);
  CHECK(graphed.vtrace_ratio == Approx(libtorch.vtrace_ratio).epsilon(1e-5));
  CHECK(graphed.explained_variance == Approx(libtorch.explained_variance).epsilon(1e-4));
}

TEST_CASE("the fused and LibTorch updates take the same V-trace steps and report the same explained variance",
          "[vtrace]") {
  // Off-policy data: V-trace's targets are far from GAE's, so an explained variance measured against GAE's
  // returns (as the fused path once did) differs from the one against V-trace's.
  const Space obs = Space::Box({3}, {-1}, {1});
  const auto make = [&] {
    torch::manual_seed(41);
    return ActorCritic(obs, Space::Discrete(2), std::vector<int>{16});
  };
  ActorCritic probe = make();
  torch::manual_seed(42);
  Rollout rollout = OffPolicy(OnPolicyRollout(probe, 8, 6, 0), 43, 2.0);
  // Some samples too old for max_policy_lag: the fused update then trains on its own copy of the kept rows.
  rollout.lag = (torch::rand({8, 6}) < 0.2).to(torch::kLong) * 2;
  PpoConfig config;
  config.max_policy_lag = 1;
  config.advantage = "vtrace";
  config.lr = 0.03;
  config.anneal_lr = false;
  config.num_minibatches = 2;
  config.update_epochs = 3;
  const auto train = [&](const std::string& fused_update, PpoStats* stats) {
    ActorCritic policy = make();
    PpoConfig c = config;
    c.fused_update = fused_update;
    PpoTrainer trainer(policy, c, 5);
    REQUIRE(trainer.fused() == (fused_update == "on"));
    *stats = trainer.Update(rollout, 0);
    return testing::FlatParameters(policy);
  };
  PpoStats fused, libtorch, gae;
  CHECK(testing::RelativeDiff(train("on", &fused), train("off", &libtorch)) < 1e-4);
  CHECK(fused.vtrace_ratio == Approx(libtorch.vtrace_ratio).epsilon(1e-4));
  CHECK(fused.lag_dropped == libtorch.lag_dropped);
  CHECK(fused.lag_dropped > 0);
  CHECK(fused.explained_variance == Approx(libtorch.explained_variance).epsilon(1e-4));
  config.advantage = "gae";
  (void)train("off", &gae);
  CHECK(std::abs(gae.explained_variance - libtorch.explained_variance) > 1e-3);
}

int64_t bptt_or_one(int64_t bptt) { return bptt > 0 ? bptt : 1; }

// ppo.max_policy_lag on one update path: the samples past the limit are counted and never reach the loss (their
// observations and actions can be anything), the learning rate is scaled by the share kept.
void CheckLagFilter(const std::string& fused_update, CoreKind core) {
  const Space obs = Space::Box({3}, {-1}, {1});
  PolicyOptions options;
  options.core = core;
  options.core_size = 8;
  const int64_t T = 8, N = 6, bptt = core == CoreKind::kNone ? 0 : 4;
  torch::manual_seed(21);
  ActorCritic probe(obs, Space::Discrete(2), std::vector<int>{16}, options);
  Rollout rollout = OnPolicyRollout(probe, T, N, bptt);
  // Rows 0 and 1 acted 3 updates ago in their first 2 steps, 1 update ago after; the rest 0 or 1.
  rollout.lag = torch::randint(2, {T, N}, torch::kLong);
  rollout.lag.index_put_({torch::indexing::Slice(0, 2), torch::indexing::Slice(0, 2)}, 3);
  // Rows: 4 samples too old; chunks of 4 steps: the first chunk of rows 0 and 1, 8 samples.
  const int64_t dropped = bptt == 0 ? 4 : 8;
  PpoConfig config;
  config.fused_update = fused_update;
  config.anneal_lr = false;
  config.lr = 0.01;
  config.num_minibatches = 2;
  config.update_epochs = 2;
  const auto train = [&](const Rollout& r, std::optional<int> max_lag, PpoStats* stats) {
    torch::manual_seed(22);
    ActorCritic policy(obs, Space::Discrete(2), std::vector<int>{16}, options);
    PpoConfig c = config;
    c.max_policy_lag = max_lag;
    PpoTrainer trainer(policy, c, 7);
    CHECK(trainer.fused() == (fused_update == "on"));
    *stats = trainer.Update(r, 0);
    return testing::FlatParameters(policy);
  };
  // The same rollout with the too-old samples' observations and actions replaced.
  Rollout scrambled = rollout;
  scrambled.obs = rollout.obs.clone();
  scrambled.actions = rollout.actions.clone();
  const torch::Tensor old = (rollout.lag > 2).unsqueeze(-1).expand_as(scrambled.obs);
  scrambled.obs.masked_fill_(old, 7.0f);
  scrambled.actions.masked_fill_(rollout.lag > 2, 1);
  scrambled.actions.masked_fill_(rollout.lag > 2 & rollout.actions == 1, 0);
  PpoStats a, b, off;
  const torch::Tensor kept_a = train(rollout, 2, &a);
  const torch::Tensor kept_b = train(scrambled, 2, &b);
  CHECK(a.lag_dropped == dropped);
  CHECK(a.samples == T * N - dropped);
  CHECK(a.learning_rate == Approx(0.01 * static_cast<double>(T * N - dropped) / static_cast<double>(T * N)));
  // What was dropped never reached the loss (a kept chunk after a dropped one starts from its stored state).
  CHECK(testing::RelativeDiff(kept_a, kept_b) < 1e-6);
  // Off: everything trains, and the scrambled samples change the result.
  const torch::Tensor all_a = train(rollout, std::nullopt, &off);
  const torch::Tensor all_b = train(scrambled, std::nullopt, &b);
  CHECK(off.lag_dropped == 0);
  CHECK(off.samples == T * N);
  CHECK(testing::RelativeDiff(all_a, all_b) > 1e-4);
  // A limit no sample is within: no step at all.
  const torch::Tensor before = [&] {
    torch::manual_seed(22);
    ActorCritic policy(obs, Space::Discrete(2), std::vector<int>{16}, options);
    return testing::FlatParameters(policy);
  }();
  Rollout stale = rollout;
  stale.lag = torch::full({T, N}, 5, torch::kLong);
  PpoStats none;
  CHECK(torch::equal(train(stale, 2, &none), before));
  CHECK(none.lag_dropped == T * N);
  CHECK(none.samples == 0);
  // 0: the current policy's samples alone.
  Rollout fresh = rollout;
  fresh.lag = torch::zeros({T, N}, torch::kLong);
  fresh.lag.index_put_({torch::indexing::Slice(T - bptt_or_one(bptt), T), 0}, 1);
  PpoStats zero;
  (void)train(fresh, 0, &zero);
  CHECK(zero.lag_dropped == bptt_or_one(bptt));
}

TEST_CASE("max_policy_lag leaves old samples out of the loss and counts them: the fused path", "[vtrace][lag]") {
  CheckLagFilter("on", CoreKind::kNone);
}

TEST_CASE("max_policy_lag leaves old samples out of the loss and counts them: the LibTorch path", "[vtrace][lag]") {
  CheckLagFilter("off", CoreKind::kNone);
}

TEST_CASE("max_policy_lag leaves whole chunks out when any of their steps is too old", "[vtrace][lag]") {
  CheckLagFilter("auto", CoreKind::kGru);
}

TEST_CASE("the config takes ppo.advantage and the V-trace bars (with the graphed update too), and refuses bad ones",
          "[vtrace]") {
  FarmConfig config;
  REQUIRE(LoadConfig("", {"ppo.advantage=vtrace", "ppo.vtrace_rho_bar=2", "ppo.vtrace_c_bar=0.5"}, &config).ok());
  CHECK(config.ppo.advantage == "vtrace");
  CHECK(config.ppo.vtrace_rho_bar == 2.0);
  CHECK(config.ppo.vtrace_c_bar == 0.5);
  Status s = LoadConfig("", {"ppo.advantage=retrace"}, &config);
  CHECK_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains("ppo.advantage"));
  s = LoadConfig("", {"ppo.vtrace_c_bar=0"}, &config);
  CHECK_THAT(s.message(), Catch::Contains("ppo.vtrace_c_bar"));
  CHECK(LoadConfig("", {"ppo.advantage=vtrace", "ppo.graph_update=on"}, &config).ok());
  s = LoadConfig("", {"ppo.max_policy_lag=-1"}, &config);
  CHECK_THAT(s.message(), Catch::Contains("ppo.max_policy_lag"));
  FarmConfig defaults;
  REQUIRE(LoadConfig("", {}, &defaults).ok());
  CHECK_FALSE(defaults.ppo.max_policy_lag.has_value());  // off unless set
  FarmConfig zero;
  REQUIRE(LoadConfig("", {"ppo.max_policy_lag=0"}, &zero).ok());
  CHECK(zero.ppo.max_policy_lag == 0);
}

}  // namespace
}  // namespace farm
