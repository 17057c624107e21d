// Recurrent cores (ppo.core): the cells against LibTorch's GRUCell and LSTMCell (values and gradients through a
// chunk with resets), the policy's acting against its update's re-run of a chunk, the learner's per-row states
// (CoreStates through Acting: interleaved batches, episode starts, a worker that leaves and comes back), the store's
// chunk-start states, and one PPO update through chunks.
#include <torch/torch.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/wire.h"
#include "learner/model/policy.h"
#include "learner/model/policy_spec.h"
#include "learner/model/recurrent_core.h"
#include "learner/serve/acting.h"
#include "learner/serve/core_states.h"
#include "learner/serve/work.h"
#include "learner/train/ppo.h"
#include "learner/train/ppo_chunks.h"
#include "learner/train/trajectory_store.h"

#undef CHECK  // glog's, from LibTorch: Catch's must win
#include <catch2/catch.hpp>

#include "tests/cuda_skip.h"

namespace farm {
namespace {

bool Close(const torch::Tensor& a, const torch::Tensor& b, double tol = 1e-5) {
  return a.sizes() == b.sizes() && torch::allclose(a, b, tol, tol);
}

// A random rollout of T steps x N envs of [3] observations and 2 actions, acted with log-prob log(1/2), without
// core states (the caller adds them).
Rollout RandomRollout(int64_t T, int64_t N) {
  Rollout r;
  r.obs = torch::randn({T, N, 3});
  r.actions = torch::randint(2, {T, N}, torch::kLong);
  r.logp = torch::full({T, N}, std::log(0.5f));
  r.values = torch::zeros({T, N});
  r.rewards = torch::randn({T, N});
  r.dones = (torch::rand({T, N}) < 0.2).to(torch::kFloat32);
  r.last_value = torch::zeros({N});
  return r;
}

// LibTorch's cell with `core`'s weights: the reference the written-out cell must match.
struct ReferenceCell {
  torch::nn::GRUCell gru{nullptr};
  torch::nn::LSTMCell lstm{nullptr};
  int64_t size;
  ReferenceCell(RecurrentCoreImpl& core) : size(core.output_size()) {
    torch::NoGradGuard no_grad;
    auto params = core.named_parameters();
    auto copy = [&](torch::nn::Module& m) {
      for (auto& p : m.named_parameters()) p.value().copy_(params[p.key()]);
    };
    if (core.kind() == CoreKind::kGru) {
      gru = torch::nn::GRUCell(core.input_size(), size);
      copy(*gru);
    } else {
      lstm = torch::nn::LSTMCell(core.input_size(), size);
      copy(*lstm);
    }
  }
  // One step on the packed state ([h] or [h, c]).
  torch::Tensor Step(const torch::Tensor& x, const torch::Tensor& state) {
    if (gru) return gru->forward(x, state);
    auto [h, c] = lstm->forward(x, std::make_tuple(state.narrow(1, 0, size), state.narrow(1, size, size)));
    return torch::cat({h, c}, 1);
  }
};

}  // namespace

TEST_CASE("a recurrent core's chunk equals LibTorch's cell stepped with resets, values and gradients", "[core]") {
  for (CoreKind kind : {CoreKind::kGru, CoreKind::kLstm}) {
    INFO(CoreName(kind));
    torch::manual_seed(7);
    RecurrentCore core(kind, 5, 6);
    ReferenceCell ref(*core);
    const int64_t L = 7, B = 3;
    const torch::Tensor x = torch::randn({L, B, 5});
    const torch::Tensor h0 = torch::randn({B, core->state_size()});
    torch::Tensor starts = torch::zeros({L, B});
    starts[2][0] = 1;  // row 0's episode starts at step 2, row 2's at steps 1 and 5
    starts[1][2] = 1;
    starts[5][2] = 1;
    torch::Tensor last;
    const torch::Tensor out = core->Unroll(x, h0, starts, &last);
    std::vector<torch::Tensor> ref_out;
    torch::Tensor state = h0;
    for (int64_t t = 0; t < L; ++t) {
      state = state * (1 - starts[t]).unsqueeze(-1);
      state = ref.Step(x[t], state);
      ref_out.push_back(state.narrow(1, 0, 6));
    }
    CHECK(Close(out, torch::stack(ref_out)));
    CHECK(Close(last, state));
    // A reset really cuts the past off: row 0 from step 2 on is what a zero state gives.
    const torch::Tensor fresh = core->Unroll(x.narrow(0, 2, L - 2), torch::zeros({B, core->state_size()}), {});
    CHECK(Close(out.narrow(0, 2, L - 2).select(1, 0), fresh.select(1, 0)));
    CHECK_FALSE(Close(out.narrow(0, 2, L - 2).select(1, 1), fresh.select(1, 1)));

    // Gradients of the same loss through both, with respect to the weights.
    const torch::Tensor w = torch::randn({L, B, 6});
    core->zero_grad();
    (core->Unroll(x, h0, starts) * w).sum().backward();
    torch::Tensor ref_state = h0;
    torch::Tensor ref_loss = torch::zeros({});
    for (int64_t t = 0; t < L; ++t) {
      ref_state = ref.Step(x[t], ref_state * (1 - starts[t]).unsqueeze(-1));
      ref_loss = ref_loss + (ref_state.narrow(1, 0, 6) * w[t]).sum();
    }
    ref_loss.backward();
    torch::nn::Module& ref_module = ref.gru ? static_cast<torch::nn::Module&>(*ref.gru) : *ref.lstm;
    auto ref_params = ref_module.named_parameters();
    for (const auto& p : core->named_parameters()) {
      INFO(p.key());
      CHECK(Close(p.value().grad(), ref_params[p.key()].grad(), 1e-4));
    }
  }
}

TEST_CASE("the fused GRU unroll gives the stepwise GRU's outputs and every gradient, with and without resets",
          "[core]") {
  torch::manual_seed(11);
  // Odd sizes: the kernels' edge code (rows and columns left over from their tiles).
  const int64_t K = 2, L = 7, B = 5, S = 6, G = 3 * S;
  const auto grad = torch::TensorOptions().requires_grad(true);
  const torch::Tensor gi = torch::randn({K, L, B, G}, grad), state0 = torch::randn({K, B, S}, grad);
  const torch::Tensor weight = (0.5 * torch::randn({K, G, S})).requires_grad_(), bias = torch::randn({K, G}, grad);
  const torch::Tensor loss_w = torch::randn({K, L, B, S});
  torch::Tensor keep = torch::ones({L, B});
  keep[0][1] = 0;  // rows 1 and 3 start episodes inside the chunk, row 1 at its first step
  keep[3][3] = 0;
  keep[4][1] = 0;
  for (const bool resets : {true, false}) {
    INFO("resets " << resets);
    const torch::Tensor k = resets ? keep : torch::Tensor();
    // The reference: the cell's equations, stepped through autograd.
    torch::Tensor h = state0;
    std::vector<torch::Tensor> steps;
    for (int64_t t = 0; t < L; ++t) {
      if (resets) h = h * keep[t].view({1, B, 1});
      const torch::Tensor gh = torch::baddbmm(bias.unsqueeze(1), h, weight.transpose(1, 2));
      const torch::Tensor x = gi.select(1, t);
      const torch::Tensor r = torch::sigmoid(x.narrow(-1, 0, S) + gh.narrow(-1, 0, S));
      const torch::Tensor z = torch::sigmoid(x.narrow(-1, S, S) + gh.narrow(-1, S, S));
      const torch::Tensor n = torch::tanh(x.narrow(-1, 2 * S, S) + r * gh.narrow(-1, 2 * S, S));
      h = (1 - z) * n + z * h;
      steps.push_back(h);
    }
    const torch::Tensor ref = torch::stack(steps, 1);
    const auto ref_grads = torch::autograd::grad({(ref * loss_w).sum()}, {gi, state0, weight, bias});
    const torch::Tensor out = FusedGruUnroll(gi, state0, weight, bias, k);
    CHECK(Close(out, ref));
    const auto grads = torch::autograd::grad({(out * loss_w).sum()}, {gi, state0, weight, bias});
    const char* names[] = {"gi", "state0", "weight_hh", "bias_hh"};
    for (int i = 0; i < 4; ++i) {
      INFO(names[i]);
      CHECK(Close(grads[static_cast<size_t>(i)], ref_grads[static_cast<size_t>(i)], 1e-4));
    }
    // A reset cuts the past off: no gradient reaches row 1's initial state (zeroed before its first step).
    if (resets) CHECK(grads[1].select(1, 1).abs().max().item<float>() == 0.0f);
  }
}

TEST_CASE("two cores unrolled as one batch equal two unrolls, values and gradients", "[core]") {
  for (CoreKind kind : {CoreKind::kGru, CoreKind::kLstm}) {
    INFO(CoreName(kind));
    torch::manual_seed(8);
    RecurrentCore a(kind, 5, 6), b(kind, 5, 6);
    const int64_t L = 5, B = 3;
    const torch::Tensor xa = torch::randn({L, B, 5}), xb = torch::randn({L, B, 5});
    const torch::Tensor sa = torch::randn({B, a->state_size()}), sb = torch::randn({B, a->state_size()});
    torch::Tensor starts = torch::zeros({L, B});
    starts[2][1] = 1;
    const torch::Tensor w = torch::randn({L, B, 6});
    auto [pa, pb] = RecurrentCoreImpl::UnrollPair(*a, *b, xa, xb, sa, sb, starts);
    (pa * w + pb * w * 2).sum().backward();
    std::vector<torch::Tensor> pair_grads;
    for (auto* m : {&a, &b})
      for (const auto& p : (*m)->parameters()) pair_grads.push_back(p.grad().clone());
    a->zero_grad();
    b->zero_grad();
    const torch::Tensor ua = a->Unroll(xa, sa, starts), ub = b->Unroll(xb, sb, starts);
    CHECK(Close(pa, ua));
    CHECK(Close(pb, ub));
    (ua * w + ub * w * 2).sum().backward();
    std::size_t i = 0;
    for (auto* m : {&a, &b})
      for (const auto& p : (*m)->parameters()) CHECK(Close(p.grad(), pair_grads[i++], 1e-4));
  }
}

TEST_CASE("a recurrent policy's update re-runs a chunk to the log-probs and values it acted with", "[core]") {
  const Space obs = Space::Box({4}, {-1}, {1});
  for (bool critic_core : {true, false}) {
    for (int variant = 0; variant < 3; ++variant) {
      // Discrete; box; box with state-dependent exploration (its latent is the core's output).
      const Space action = variant == 0 ? Space::Discrete(3) : Space::Box({2}, {-1}, {1});
      INFO("critic_core " << critic_core << ", action " << action.ToString() << ", variant " << variant);
      torch::manual_seed(11);
      PolicyOptions options;
      options.sde = variant == 2;
      options.core = CoreKind::kGru;
      options.core_size = 8;
      options.critic_core = critic_core;
      ActorCritic policy(obs, action, std::vector<int>{16}, options);
      CHECK(policy->core_state_size() == (critic_core ? 16 : 8));
      const int64_t L = 6, B = 4;
      torch::Tensor starts = torch::zeros({L, B});
      starts[3][1] = 1;
      starts[4][3] = 1;
      const torch::Tensor state0 = torch::randn({B, policy->core_state_size()}) * 0.5;
      std::vector<torch::Tensor> observations, actions, logps, values;
      torch::Tensor state = state0;
      {
        torch::NoGradGuard no_grad;
        for (int64_t t = 0; t < L; ++t) {
          const torch::Tensor o = torch::randn({B, 4});
          state = state * (1 - starts[t]).unsqueeze(-1);
          const ActOutput out = policy->Act(o, {}, false, true, {}, state);
          state = out.core_state;
          observations.push_back(o);
          actions.push_back(out.action);
          logps.push_back(out.logp);
          values.push_back(out.value);
        }
      }
      const EvalOutput eval = policy->EvaluateSequence(torch::cat(observations), {}, torch::cat(actions), state0, starts);
      CHECK(Close(eval.logp, torch::cat(logps)));
      CHECK(Close(eval.value, torch::cat(values)));
      // Without the core's state the acting log-probs are not reproduced: the test can tell.
      const EvalOutput zero = policy->EvaluateSequence(torch::cat(observations), {}, torch::cat(actions),
                                                      torch::zeros_like(state0), starts);
      CHECK_FALSE(Close(zero.logp, torch::cat(logps)));
      CHECK_THROWS_WITH(policy->Evaluate(observations[0], actions[0]), Catch::Contains("EvaluateSequence"));
    }
  }
}

TEST_CASE("a centralised critic's core re-runs once per env, to the values it acted with", "[core]") {
  // 2 envs of 2 agents: the critic reads each env's global state and keeps one state per env.
  const Space obs = Space::Box({4}, {-1}, {1});
  torch::manual_seed(13);
  PolicyOptions options;
  options.core = CoreKind::kGru;
  options.core_size = 8;
  options.global_state = Space::Box({5}, {-1}, {1});
  ActorCritic policy(obs, Space::Discrete(3), std::vector<int>{16}, options);
  const int64_t L = 5, B = 4, k = 2;
  torch::Tensor starts = torch::zeros({L, B});
  starts[2][2] = starts[2][3] = 1;  // env 1's agents start a new episode together
  const torch::Tensor state0 = torch::randn({B, policy->core_state_size()}) * 0.5;
  std::vector<torch::Tensor> observations, global, actions, values;
  torch::Tensor state = state0;
  {
    torch::NoGradGuard no_grad;
    for (int64_t t = 0; t < L; ++t) {
      const torch::Tensor o = torch::randn({B, 4});
      const torch::Tensor g = torch::randn({B / k, 5});
      state = state * (1 - starts[t]).unsqueeze(-1);
      const ActOutput out = policy->Act(o, g, false, true, {}, state);
      state = out.core_state;
      observations.push_back(o);
      global.push_back(g);
      actions.push_back(out.action);
      values.push_back(out.value);
    }
  }
  const EvalOutput eval = policy->EvaluateSequence(torch::cat(observations), torch::cat(global), torch::cat(actions),
                                                  state0, starts);
  CHECK(Close(eval.value, torch::cat(values)));
  const torch::Tensor v = eval.value.view({L, B});
  CHECK(torch::equal(v.select(1, 0), v.select(1, 1)));  // an env's agents share its value
  CHECK_THROWS_WITH(policy->EvaluateSequence(torch::cat(observations).narrow(0, 0, L * 3), torch::cat(global),
                                             torch::cat(actions).narrow(0, 0, L * 3), state0.narrow(0, 0, 3),
                                             starts.narrow(1, 0, 3)),
                    Catch::Contains("rows"));
}

TEST_CASE("policy_spec.json records the core, and the policy is rebuilt with it", "[core]") {
  const Space obs = Space::Box({4}, {-1}, {1});
  PolicyOptions options;
  options.core = CoreKind::kLstm;
  options.core_size = 12;
  options.critic_core = false;
  const std::string text = PolicySpecJson(obs, Space::Discrete(2), {8}, options);
  Space o, a;
  std::vector<int> hidden;
  PolicyOptions parsed;
  REQUIRE(ParsePolicySpecJson(text, "spec", &o, &a, &hidden, &parsed).ok());
  CHECK(parsed.core == CoreKind::kLstm);
  CHECK(parsed.core_size == 12);
  CHECK_FALSE(parsed.critic_core);
  CHECK_FALSE(ParsePolicySpecJson(text, "spec", &o, &a, &hidden, nullptr).ok());
  ActorCritic rebuilt(o, a, hidden, parsed);
  CHECK(rebuilt->core_state_size() == 24);
}

namespace {

const Space kObs = Space::Box({3}, {-10}, {10});
const Space kAction = Space::Discrete(4);

// A step request of `rows` rows: observations `obs`, the previous step's flags (none when first).
std::unique_ptr<Work> Request(const std::string& identity, uint32_t group, uint64_t seq, const std::vector<float>& obs,
                              const std::vector<uint8_t>& ended = {}, const std::vector<int32_t>& truncated = {}) {
  auto w = std::make_unique<Work>();
  w->identity = identity;
  w->rows = static_cast<int64_t>(obs.size() / 3);
  wire::StepRequest* req = w->msg.mutable_step();
  req->set_group(group);
  req->set_seq(seq);
  req->set_first(seq == 0);
  SetTensor(req->mutable_obs(), DType::kFloat32, {w->rows, 3}, obs.data(), obs.size() * sizeof(float));
  if (seq > 0) {
    std::string term(static_cast<std::size_t>(w->rows), '\0'), trunc(term);
    for (std::size_t i = 0; i < ended.size(); ++i) term[i] = static_cast<char>(ended[i]);
    for (int32_t i : truncated) {
      trunc[static_cast<std::size_t>(i)] = 1;
      req->add_final_obs_index(i);
    }
    req->set_terminated(term);
    req->set_truncated(trunc);
    if (!truncated.empty()) {
      const std::vector<float> final(truncated.size() * 3, 0.5f);
      SetTensor(req->mutable_final_obs(), DType::kFloat32, {static_cast<int64_t>(truncated.size()), 3}, final.data(),
                final.size() * sizeof(float));
    }
  }
  return w;
}

// Serves `requests` as one batch and answers every one (its rows' states advance); the log-probs of its rows.
torch::Tensor Serve(Acting& acting, const std::vector<Work*>& steps) {
  const int64_t rows = Acting::Rows(steps);
  acting.Gather(steps, rows);
  const Acting::Output out = acting.Act(rows);
  int64_t row = 0;
  for (Work* w : steps) {
    acting.CommitCoreState(*w, out, row);
    row += w->rows;
  }
  return out.logp.narrow(0, 0, row).clone();
}

}  // namespace

TEST_CASE("the learner keeps each row's state whatever batch its request lands in", "[core]") {
  torch::manual_seed(5);
  FarmConfig config;
  config.learner.deterministic = true;  // the same state and observation give the same log-prob
  config.batcher.max_rows = 64;
  PolicyOptions options;
  options.core = CoreKind::kGru;
  options.core_size = 8;
  ActorCritic policy(kObs, kAction, std::vector<int>{16}, options);
  Acting batched(config, torch::kCPU, Precision::kFp32, kObs, kAction, std::nullopt, 1, policy, nullptr, true);
  Acting alone(config, torch::kCPU, Precision::kFp32, kObs, kAction, std::nullopt, 1, policy, nullptr, true);
  REQUIRE(batched.core_states() != nullptr);

  // Three streams (worker, group) of 2 rows each, 12 steps, with episode ends on some rows; seeded observations.
  struct Stream {
    std::string id;
    uint32_t group;
  };
  const std::vector<Stream> streams{{"w1", 0}, {"w1", 1}, {"w2", 0}};
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  const int kSteps = 12;
  std::vector<std::vector<std::unique_ptr<Work>>> reqs(streams.size());
  for (std::size_t s = 0; s < streams.size(); ++s)
    for (int t = 0; t < kSteps; ++t) {
      std::vector<float> obs(6);
      for (float& v : obs) v = u(rng);
      std::vector<uint8_t> ended(2, 0);
      std::vector<int32_t> truncated;
      if (t == 5 && s == 0) ended[1] = 1;  // terminated
      if (t == 7 && s == 2) truncated.push_back(0);
      reqs[s].push_back(Request(streams[s].id, streams[s].group, static_cast<uint64_t>(t), obs, ended, truncated));
    }
  // Alone: each stream stepped by itself.
  std::vector<std::vector<torch::Tensor>> expected(streams.size());
  for (std::size_t s = 0; s < streams.size(); ++s)
    for (int t = 0; t < kSteps; ++t) expected[s].push_back(Serve(alone, {reqs[s][t].get()}));
  // Serving only (not recording) keeps the actor's part of the state alone, and acts the same.
  Acting serving(config, torch::kCPU, Precision::kFp32, kObs, kAction, std::nullopt, 1, policy, nullptr, false);
  REQUIRE(serving.core_states()->state_size() == policy->actor_core_state_size());
  for (std::size_t s = 0; s < streams.size(); ++s)
    for (int t = 0; t < kSteps; ++t) CHECK(Close(Serve(serving, {reqs[s][t].get()}), expected[s][t]));
  // Batched: every step's requests together, in an order that changes from step to step.
  std::vector<std::size_t> order{0, 1, 2};
  std::mt19937 shuffle(2);
  for (int t = 0; t < kSteps; ++t) {
    std::shuffle(order.begin(), order.end(), shuffle);
    std::vector<Work*> steps;
    for (std::size_t s : order) steps.push_back(reqs[s][t].get());
    const torch::Tensor logp = Serve(batched, steps);
    for (std::size_t i = 0; i < order.size(); ++i) {
      INFO("step " << t << ", stream " << order[i]);
      CHECK(Close(logp.narrow(0, 2 * static_cast<int64_t>(i), 2), expected[order[i]][t]));
    }
  }
  // The states really carry: step 3's log-prob differs from what a zero state gives for the same observation.
  Acting fresh(config, torch::kCPU, Precision::kFp32, kObs, kAction, std::nullopt, 1, policy, nullptr, true);
  auto copy = Request("w1", 0, 0, {0, 0, 0, 0, 0, 0});
  copy->msg.mutable_step()->mutable_obs()->CopyFrom(reqs[0][3]->msg.step().obs());
  CHECK_FALSE(Close(Serve(fresh, {copy.get()}), expected[0][3]));
}

TEST_CASE("states are zero at episode starts, kept for final observations, dropped with their worker", "[core]") {
  CoreStates states(2);
  const std::vector<float> obs(9, 0.1f);  // 3 rows
  auto first = Request("w", 0, 0, obs);
  std::vector<float> dst(6, -1), final_dst;
  states.Gather("w", first->msg.step(), 3, dst.data(), nullptr);
  CHECK(dst == std::vector<float>(6, 0.0f));
  states.Commit("w", 0, 3, std::vector<float>{1, 1, 2, 2, 3, 3}.data());
  // Row 0 terminated, row 2 truncated: both start from zero; row 2's final observation gets its old state.
  auto next = Request("w", 0, 1, obs, {1, 0, 0}, {2});
  final_dst.assign(2, -1);
  states.Gather("w", next->msg.step(), 3, dst.data(), final_dst.data());
  CHECK(dst == std::vector<float>{0, 0, 2, 2, 0, 0});
  CHECK(final_dst == std::vector<float>{3, 3});
  CHECK(states.rows() == 3);
  // A parked request is served again from the same states (nothing committed in between).
  states.Gather("w", next->msg.step(), 3, dst.data(), final_dst.data());
  CHECK(dst == std::vector<float>{0, 0, 2, 2, 0, 0});
  // Another group of the same worker has its own states.
  auto other = Request("w", 1, 1, obs, {0, 0, 0});
  states.Gather("w", other->msg.step(), 3, dst.data(), nullptr);
  CHECK(dst == std::vector<float>(6, 0.0f));
  // The worker leaves and comes back under the same identity, mid-stream: zero states.
  states.Drop("w");
  CHECK(states.rows() == 0);
  auto again = Request("w", 0, 5, obs, {0, 0, 0});
  states.Gather("w", again->msg.step(), 3, dst.data(), nullptr);
  CHECK(dst == std::vector<float>(6, 0.0f));
  // And a group's first request is zero even with states kept.
  states.Commit("w", 0, 3, std::vector<float>{1, 1, 2, 2, 3, 3}.data());
  states.Gather("w", first->msg.step(), 3, dst.data(), nullptr);
  CHECK(dst == std::vector<float>(6, 0.0f));
}

TEST_CASE("the store keeps each row's core state at every chunk's start, through a gathering Take", "[core]") {
  const int64_t T = 4, bptt = 2, S = 3;
  TrajectoryStore store(T, 1, Space::Discrete(2), 0, 1, S, bptt);
  CHECK_THROWS(TrajectoryStore(T, 1, Space::Discrete(2), 0, 1, S, 3));
  const int a = store.AddGroup(2);
  const int b = store.AddGroup(1);
  // RecordStep takes no core state: a chunk start without one is refused.
  std::vector<float> obs(2, 0), logp(2, 0), value(2, 0);
  std::vector<int64_t> act(2, 0);
  CHECK_THROWS_WITH(store.RecordStep(a, obs.data(), act.data(), logp.data(), value.data(), 0),
                    Catch::Contains("no core state"));
  // A third group joins after the first record: it gets an arena of its own, and Take gathers.
  const int c = store.AddGroup(1);
  for (int t = 0; t < T; ++t) {
    for (int g : {a, b, c}) {
      const int rows = g == a ? 2 : 1;
      std::vector<float> o(rows, 0), lp(rows, 0), v(rows, 0), reward(rows, 1), core(static_cast<std::size_t>(rows * S));
      for (int r = 0; r < rows; ++r)
        for (int k = 0; k < S; ++k) core[static_cast<std::size_t>(r * S + k)] = static_cast<float>(100 * g + 10 * t + r);
      std::vector<int64_t> ac(rows, 0);
      std::vector<uint8_t> flags(rows, 0);
      store.RecordInputs(g, o.data());
      store.RecordOutputs(g, ac.data(), lp.data(), v.data(), 0, core.data());
      store.RecordOutcome(g, reward.data(), flags.data(), flags.data());
    }
  }
  for (int g : {a, b, c}) store.SetBootstrap(g, std::vector<float>(2, 0).data());
  REQUIRE(store.all_full());
  const Rollout r = store.Take({1}, 0, nullptr);
  REQUIRE(r.core_states.defined());
  CHECK(r.bptt == bptt);
  CHECK(r.core_states.sizes() == torch::IntArrayRef({T / bptt, 4, S}));
  // Chunk 1 starts at step 2: row 1 of group a has 100 * 0 + 10 * 2 + 1.
  CHECK(r.core_states[1][1][0].item<float>() == 21.0f);
  CHECK(r.core_states[0][2][2].item<float>() == 100.0f);
  CHECK(r.core_states[1][3][1].item<float>() == 220.0f);
  CHECK(store.copy_stats().zero_copy_takes == 0);
}

TEST_CASE("a PPO update through chunks trains a recurrent policy and refuses the fused update by name", "[core]") {
  torch::manual_seed(9);
  const Space obs = Space::Box({3}, {-1}, {1});
  PolicyOptions options;
  options.core = CoreKind::kLstm;
  options.core_size = 8;
  ActorCritic policy(obs, Space::Discrete(2), std::vector<int>{16}, options);
  PpoConfig config;
  config.fused_update = "on";
  CHECK_THROWS_WITH(PpoTrainer(policy, config, 1), Catch::Contains("recurrent core"));
  config.fused_update = "auto";
  config.num_minibatches = 2;
  config.update_epochs = 2;
  PpoTrainer trainer(policy, config, 1);
  CHECK_FALSE(trainer.fused());
  const int64_t T = 8, N = 4, L = 4;
  Rollout r = RandomRollout(T, N);
  // Without core states the update says what is missing.
  CHECK_THROWS_WITH(trainer.Update(r, 0), Catch::Contains("core states"));
  r.core_states = torch::zeros({T / L, N, policy->core_state_size()});
  r.bptt = L;
  const torch::Tensor before = policy->parameters()[0].clone();
  const PpoStats stats = trainer.Update(r, 0);
  CHECK(stats.samples == T * N);
  CHECK(std::isfinite(stats.policy_loss));
  CHECK(std::isfinite(stats.value_loss));
  CHECK_FALSE(torch::equal(before, policy->parameters()[0]));
  // bf16 autocast (the CPU's mixed precision) through the chunks: the state stays float32, the loss finite.
  ActorCritic bf16_policy(obs, Space::Discrete(2), std::vector<int>{16}, options);
  PpoTrainer bf16(bf16_policy, config, 1, Precision::kBf16);
  const PpoStats low = bf16.Update(r, 0);
  CHECK(std::isfinite(low.policy_loss));
  CHECK(std::isfinite(low.value_loss));
  CHECK(std::isfinite(low.grad_norm));
}

#ifdef FARM_WITH_CUDA

// Issue 27 on the GPU: acting with the state, the update's re-run of a chunk, the learner's per-row states served
// from batches in changing orders, and the PPO update through chunks in each precision.
TEST_CASE("CUDA: a recurrent policy acts, re-runs its chunks and keeps each row's state on the GPU as on the CPU",
          "[core][cuda]") {
  FARM_SKIP_WITHOUT_CUDA();
  const torch::Device cuda(torch::kCUDA, 0);
  const Space obs = Space::Box({4}, {-1}, {1});
  for (const CoreKind kind : {CoreKind::kGru, CoreKind::kLstm}) {
    INFO("core " << (kind == CoreKind::kGru ? "gru" : "lstm"));
    torch::manual_seed(21);
    PolicyOptions options;
    options.core = kind;
    options.core_size = 8;
    options.critic_core = true;
    ActorCritic cpu(obs, Space::Discrete(3), std::vector<int>{16}, options);
    ActorCritic gpu(obs, Space::Discrete(3), std::vector<int>{16}, options);
    gpu->CopyFrom(*cpu);
    gpu->to(cuda);
    const int64_t L = 6, B = 4;
    torch::Tensor starts = torch::zeros({L, B});
    starts[3][1] = 1;
    starts[4][3] = 1;
    const torch::Tensor state0 = torch::randn({B, cpu->core_state_size()}) * 0.5;
    std::vector<torch::Tensor> observations, actions, logps, values;
    torch::Tensor host_state = state0, device_state = state0.to(cuda);
    {
      torch::NoGradGuard no_grad;
      for (int64_t t = 0; t < L; ++t) {
        const torch::Tensor o = torch::randn({B, 4});
        host_state = host_state * (1 - starts[t]).unsqueeze(-1);
        device_state = device_state * (1 - starts[t]).to(cuda).unsqueeze(-1);
        const ActOutput h = cpu->Act(o, {}, true, true, {}, host_state);
        const ActOutput d = gpu->Act(o.to(cuda), {}, true, true, {}, device_state);
        CHECK(d.core_state.device() == cuda);
        CHECK(d.core_state.scalar_type() == torch::kFloat32);
        CHECK(torch::equal(d.action.cpu(), h.action));
        CHECK(Close(d.logp.cpu(), h.logp, 1e-3));
        CHECK(Close(d.value.cpu(), h.value, 1e-3));
        CHECK(Close(d.core_state.cpu(), h.core_state, 1e-3));
        host_state = h.core_state;
        device_state = d.core_state;
        observations.push_back(o);
        actions.push_back(h.action);
        logps.push_back(h.logp);
        values.push_back(h.value);
      }
    }
    // The update's re-run of the chunk on the GPU gives the log-probs and values the CPU acted with.
    const EvalOutput eval = gpu->EvaluateSequence(torch::cat(observations).to(cuda), {}, torch::cat(actions).to(cuda),
                                                  state0.to(cuda), starts.to(cuda));
    CHECK(Close(eval.logp.cpu(), torch::cat(logps), 1e-3));
    CHECK(Close(eval.value.cpu(), torch::cat(values), 1e-3));
  }

  // The learner's per-row states on the GPU: two streams served in one batch, in changing orders, against each
  // stream served alone on the CPU.
  torch::manual_seed(5);
  FarmConfig config;
  config.learner.deterministic = true;
  config.batcher.max_rows = 64;
  PolicyOptions options;
  options.core = CoreKind::kGru;
  options.core_size = 8;
  ActorCritic policy(kObs, kAction, std::vector<int>{16}, options);
  ActorCritic on_gpu(kObs, kAction, std::vector<int>{16}, options);
  on_gpu->CopyFrom(*policy);
  on_gpu->to(cuda);
  Acting alone(config, torch::kCPU, Precision::kFp32, kObs, kAction, std::nullopt, 1, policy, nullptr, true);
  Acting batched(config, cuda, Precision::kFp32, kObs, kAction, std::nullopt, 1, on_gpu, nullptr, true);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  const int kSteps = 8;
  std::vector<std::vector<std::unique_ptr<Work>>> reqs(2);
  for (int s = 0; s < 2; ++s)
    for (int t = 0; t < kSteps; ++t) {
      std::vector<float> o(6);
      for (float& v : o) v = u(rng);
      std::vector<uint8_t> ended(2, 0);
      if (t == 4 && s == 1) ended[0] = 1;
      reqs[s].push_back(Request(s == 0 ? "w1" : "w2", 0, static_cast<uint64_t>(t), o, ended));
    }
  std::vector<std::vector<torch::Tensor>> expected(2);
  for (int s = 0; s < 2; ++s)
    for (int t = 0; t < kSteps; ++t) expected[s].push_back(Serve(alone, {reqs[s][t].get()}));
  for (int t = 0; t < kSteps; ++t) {
    const int first = t % 2;
    const torch::Tensor logp = Serve(batched, {reqs[first][t].get(), reqs[1 - first][t].get()}).cpu();
    INFO("step " << t);
    CHECK(Close(logp.narrow(0, 0, 2), expected[first][t], 1e-3));
    CHECK(Close(logp.narrow(0, 2, 2), expected[1 - first][t], 1e-3));
  }
}

TEST_CASE("CUDA: a PPO update through chunks trains a recurrent policy on the GPU in fp32, fp16 and bf16",
          "[core][cuda]") {
  FARM_SKIP_WITHOUT_CUDA();
  const torch::Device cuda(torch::kCUDA, 0);
  const Space obs = Space::Box({3}, {-1}, {1});
  for (const CoreKind kind : {CoreKind::kGru, CoreKind::kLstm}) {
    for (const Precision precision : {Precision::kFp32, Precision::kFp16, Precision::kBf16}) {
      INFO("core " << (kind == CoreKind::kGru ? "gru" : "lstm") << ", " << PrecisionName(precision));
      torch::manual_seed(9);
      PolicyOptions options;
      options.core = kind;
      options.core_size = 8;
      ActorCritic policy(obs, Space::Discrete(2), std::vector<int>{16}, options);
      policy->to(cuda);
      PpoConfig config;
      config.num_minibatches = 2;
      config.update_epochs = 2;
      PpoTrainer trainer(policy, config, 1, precision);
      CHECK_FALSE(trainer.fused());
      const int64_t T = 8, N = 4, L = 4;
      Rollout r = RandomRollout(T, N);
      r.core_states = torch::zeros({T / L, N, policy->core_state_size()});
      r.bptt = L;
      const torch::Tensor before = policy->parameters()[0].detach().cpu().clone();
      // fp16's first step may be skipped (the initial loss scale overflows, as GradScaler's does): two updates.
      PpoStats stats;
      for (int i = 0; i < 2; ++i) stats = trainer.Update(r, 0);
      CHECK(stats.samples == T * N);
      CHECK(std::isfinite(stats.policy_loss));
      CHECK(std::isfinite(stats.value_loss));
      CHECK(std::isfinite(stats.grad_norm));
      CHECK(policy->parameters()[0].device() == cuda);
      CHECK_FALSE(torch::equal(before, policy->parameters()[0].detach().cpu()));
    }
  }
}

#endif  // FARM_WITH_CUDA

}  // namespace farm
