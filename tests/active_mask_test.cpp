// Agents that finish before their env ends (MAPPO's active masks): the loss over the rows that count, the last
// active step's bootstrap, the store's record of which rows acted, and an update on which the finished rows'
// data has no effect.
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "learner/model/policy.h"
#include "learner/train/ppo.h"
#include "learner/train/trajectory_store.h"

#undef CHECK  // glog's, from LibTorch: Catch's must win
#include <catch2/catch.hpp>

#include "tests/ppo_test_util.h"

namespace farm {
namespace {

using testing::FlatParameters;

TEST_CASE("the masked PPO loss is the loss of the rows that count, gradients included", "[active]") {
  torch::manual_seed(3);
  const int64_t B = 12;
  const torch::Tensor mask = torch::tensor({1, 1, 0, 1, 0, 0, 1, 1, 1, 0, 1, 1}, torch::kFloat32);
  const torch::Tensor keep = mask.nonzero().flatten();
  PpoConfig config;
  config.clip_coef = 0.2;
  config.ent_coef = 0.01;
  config.vf_coef = 0.5;
  for (const bool norm_adv : {true, false})
    for (const bool clip_vloss : {true, false}) {
      INFO("norm_adv " << norm_adv << ", clip_vloss " << clip_vloss);
      config.norm_adv = norm_adv;
      config.clip_vloss = clip_vloss;
      const torch::Tensor logp = torch::randn({B}).requires_grad_();
      const torch::Tensor value = torch::randn({B}).requires_grad_();
      const torch::Tensor entropy = torch::rand({B}).requires_grad_();
      const torch::Tensor old_logp = logp.detach() + 0.3 * torch::randn({B});
      const torch::Tensor old_values = torch::randn({B}), adv = torch::randn({B}) * 3 + 1, ret = torch::randn({B});

      const PpoLoss masked = ComputePpoLoss(EvalOutput{logp, entropy, value}, old_logp, old_values,
                                            adv, ret, config, mask);
      masked.total.backward();
      const torch::Tensor g_logp = logp.grad().clone(), g_value = value.grad().clone(), g_ent = entropy.grad().clone();
      for (const auto& t : {logp, value, entropy}) t.grad().zero_();

      const auto sub = [&](const torch::Tensor& t) { return t.index_select(0, keep); };
      const PpoLoss alone = ComputePpoLoss(EvalOutput{sub(logp), sub(entropy), sub(value)},
                                           sub(old_logp), sub(old_values), sub(adv), sub(ret), config);
      alone.total.backward();
      for (const auto& [a, b] : std::vector<std::pair<torch::Tensor, torch::Tensor>>{
               {masked.total, alone.total}, {masked.policy_loss, alone.policy_loss},
               {masked.value_loss, alone.value_loss}, {masked.entropy, alone.entropy},
               {masked.approx_kl, alone.approx_kl}, {masked.clip_fraction, alone.clip_fraction}})
        CHECK(a.item<double>() == Approx(b.item<double>()).margin(1e-6));
      // The rows left out get no gradient; the others get the gradient of the loss over them alone.
      for (const auto& [g, t] : std::vector<std::pair<torch::Tensor, torch::Tensor>>{
               {g_logp, logp}, {g_value, value}, {g_ent, entropy}}) {
        CHECK(g.masked_select(mask == 0).abs().max().item<float>() == 0.0f);
        CHECK(torch::allclose(g, t.grad(), 1e-5, 1e-6));  // the subset's backward reaches the same leaves
        t.grad().zero_();
      }
      // A left-out row's overflow (a log-ratio of 1e30, an infinite advantage and value) reaches neither the loss
      // nor any gradient.
      const torch::Tensor wild_logp = logp.detach().clone(), wild_value = value.detach().clone(), wild_adv = adv.clone();
      wild_logp[2] = 1e30f;
      wild_value[4] = std::numeric_limits<float>::infinity();
      wild_adv[5] = std::numeric_limits<float>::infinity();
      wild_logp.requires_grad_();
      wild_value.requires_grad_();
      const PpoLoss wild = ComputePpoLoss(EvalOutput{wild_logp, entropy, wild_value}, old_logp, old_values, wild_adv,
                                          ret, config, mask);
      wild.total.backward();
      CHECK(wild.total.item<double>() == Approx(alone.total.item<double>()).margin(1e-6));
      CHECK(torch::isfinite(wild_logp.grad()).all().item<bool>());
      CHECK(torch::isfinite(wild_value.grad()).all().item<bool>());
      CHECK(torch::allclose(wild_logp.grad(), g_logp, 1e-5, 1e-6));
      entropy.grad().zero_();
    }
}

TEST_CASE("a finished agent's last active step bootstraps, and nothing after it flows back", "[active]") {
  // Row 0: acts at steps 0-1, finished (truncated alone) from step 2 on. Row 1: terminated alone at step 1 (done),
  // so nothing is added. Row 2: acts throughout.
  Rollout r;
  r.rewards = torch::tensor({1.f, 1.f, 1.f, 2.f, 2.f, 2.f, 0.f, 0.f, 3.f, 0.f, 0.f, 3.f}).view({4, 3});
  r.values = torch::tensor({0.5f, 0.5f, 0.5f, 1.f, 1.f, 1.f, 4.f, 9.f, 2.f, 7.f, 9.f, 2.f}).view({4, 3});
  r.dones = torch::zeros({4, 3});
  r.dones[1][1] = 1;
  r.active = torch::ones({4, 3});
  r.active.narrow(0, 2, 2).narrow(1, 0, 2).zero_();
  r.last_value = torch::tensor({5.f, 5.f, 5.f});
  const double gamma = 0.5;
  const Rollout cut = BootstrapFinishedAgents(r, gamma);
  CHECK(cut.rewards[1][0].item<float>() == Approx(2 + 0.5 * 4));  // + gamma * V(the observation it finished on)
  CHECK(cut.dones[1][0].item<float>() == 1);
  CHECK(cut.rewards[1][1].item<float>() == 2);  // terminated: nothing to bootstrap
  CHECK(torch::equal(cut.rewards.select(1, 2), r.rewards.select(1, 2)));
  CHECK(torch::equal(cut.dones.select(1, 2), r.dones.select(1, 2)));
  CHECK(r.rewards[1][0].item<float>() == 2);  // the rollout itself is left as it was

  const Advantages gae = ComputeGae(cut.rewards, cut.values, cut.dones, cut.last_value, gamma, 1.0);
  // Row 0 at step 1: r + gamma V(s_2) - V(s_1), whatever the finished steps after it hold.
  CHECK(gae.advantages[1][0].item<float>() == Approx(2 + 0.5 * 4 - 1));
  CHECK(gae.advantages[0][0].item<float>() == Approx(1 - 0.5 + 0.5 * (2 + 0.5 * 4)));

  // ppo.bootstrap_truncated off: the end without the bonus, as for the time limit's truncations.
  const Rollout plain = BootstrapFinishedAgents(r, gamma, /*bootstrap=*/false);
  CHECK(plain.rewards[1][0].item<float>() == 2);
  CHECK(plain.dones[1][0].item<float>() == 1);
  CHECK(!BootstrapFinishedAgents(Rollout{}, gamma).active.defined());
  Rollout bad = r;
  bad.active = torch::ones({4, 2});
  CHECK_THROWS_AS(BootstrapFinishedAgents(bad, gamma), std::invalid_argument);
}

// A rollout of T x N (N = 4 rows, discrete actions) where row 1 finished at step 3 and its env ended at step 5, and
// row 2 terminated alone at step 4 and acts no more; and a copy whose finished rows hold other data (other than the
// value of row 1's first finished step, which its last active step bootstraps from).
struct MaskedRollouts {
  Rollout clean, scrambled;
};

MaskedRollouts MakeMaskedRollouts(int64_t T, torch::Tensor core_states = {}, int64_t bptt = 0) {
  const int64_t N = 4;
  Rollout r;
  r.obs = torch::randn({T, N, 3});
  r.actions = torch::randint(2, {T, N}, torch::kLong);
  r.logp = std::log(0.5f) + 0.1 * torch::randn({T, N});
  r.values = torch::randn({T, N});
  r.rewards = torch::randn({T, N});
  r.last_value = torch::randn({N});
  r.dones = torch::zeros({T, N});
  r.dones[T - 3][0] = 1;
  r.active = torch::ones({T, N});
  r.active.narrow(0, 3, 3).select(1, 1).zero_();
  r.dones[5].select(0, 1).fill_(1);  // row 1's env ends at step 5
  r.dones[4][2] = 1;
  r.active.narrow(0, 5, T - 5).select(1, 2).zero_();
  r.core_states = core_states;
  r.bptt = bptt;
  Rollout s = r;
  const torch::Tensor off = r.active == 0;
  torch::Tensor keep_value = off.clone();
  keep_value[3][1] = false;  // row 1's last active step bootstraps from it
  s.obs = torch::where(off.unsqueeze(-1), torch::randn_like(r.obs) * 50, r.obs);
  s.actions = torch::where(off, 1 - r.actions, r.actions);
  s.logp = torch::where(off, torch::randn_like(r.logp) * 3, r.logp);
  s.rewards = torch::where(off, torch::randn_like(r.rewards) * 100, r.rewards);
  s.values = torch::where(keep_value, torch::randn_like(r.values) * 100, r.values);
  return {r, s};
}

TEST_CASE("an update is the same whatever the finished agents' rows hold", "[active]") {
  for (const bool core : {false, true}) {
    INFO((core ? "a GRU (chunks of 4 steps)" : "an MLP"));
    torch::manual_seed(11);
    PolicyOptions options;
    if (core) {
      options.core = CoreKind::kGru;
      options.core_size = 8;
    }
    const Space obs = Space::Box({3}, {-1}, {1});
    ActorCritic a(obs, Space::Discrete(2), std::vector<int>{16}, options);
    ActorCritic b(obs, Space::Discrete(2), std::vector<int>{16}, options);
    ActorCritic c(obs, Space::Discrete(2), std::vector<int>{16}, options);
    b->CopyFrom(*a);
    c->CopyFrom(*a);
    const int64_t T = 8;
    const torch::Tensor states = core ? torch::zeros({T / 4, 4, a->core_state_size()}) : torch::Tensor();
    MaskedRollouts m = core ? MakeMaskedRollouts(T, states, 4) : MakeMaskedRollouts(T);
    PpoConfig config;
    config.update_epochs = 2;
    config.num_minibatches = 2;
    config.fused_update = "auto";  // the fused update takes the MLP's rollout, mask and all; the GRU's takes LibTorch's
    PpoTrainer ta(a, config, 5), tb(b, config, 5), tc(c, config, 5);
    const PpoStats sa = ta.Update(m.clean, 0.0);
    const PpoStats sb = tb.Update(m.scrambled, 0.0);
    CHECK(sa.masked_rows == 3 + 3);
    CHECK(sb.masked_rows == 6);
    CHECK(sa.samples == T * 4);
    // The fused update takes the mask in its arithmetic: the same update as the LibTorch one (fused_update=off), to
    // float rounding.
    CHECK(ta.fused() == !core);
    CHECK(std::string(ta.last_update_path()) == (core ? "libtorch" : "fused"));
    ActorCritic d(obs, Space::Discrete(2), std::vector<int>{16}, options);
    d->CopyFrom(*c);
    PpoConfig off = config;
    off.fused_update = "off";
    PpoTrainer(d, off, 5).Update(m.clean, 0.0);
    if (core) {
      CHECK(torch::equal(FlatParameters(a), FlatParameters(d)));
    } else {
      CHECK(torch::allclose(FlatParameters(a), FlatParameters(d), 1e-5, 1e-6));
      CHECK(!torch::allclose(FlatParameters(a), FlatParameters(c), 1e-4, 1e-4));  // and it moved
    }
    CHECK(torch::allclose(FlatParameters(a), FlatParameters(b), 1e-6, 1e-6));
    CHECK(sa.policy_loss == Approx(sb.policy_loss).margin(1e-6));
    CHECK(sa.explained_variance == Approx(sb.explained_variance).margin(1e-6));
    // Without the mask the scrambled rows train: the check above can fail.
    Rollout unmasked = m.scrambled;
    unmasked.active = torch::Tensor();
    const PpoStats sc = tc.Update(unmasked, 0.0);
    CHECK(sc.masked_rows == 0);
    CHECK(std::string(tc.last_update_path()) == (core ? "libtorch" : "fused"));
    // ppo.active_masks off: the finished rows train (and the fused update may take the rollout).
    torch::manual_seed(11);  // f starts where a did
    ActorCritic f(obs, Space::Discrete(2), std::vector<int>{16}, options);
    PpoConfig unmasked_config = config;
    unmasked_config.active_masks = false;
    PpoTrainer tf(f, unmasked_config, 5);
    const PpoStats sf = tf.Update(m.scrambled, 0.0);
    CHECK(sf.masked_rows == 0);
    CHECK(std::string(tf.last_update_path()) == (core ? "libtorch" : "fused"));
    CHECK(!torch::allclose(FlatParameters(a), FlatParameters(f), 1e-4, 1e-4));
    CHECK(!torch::allclose(FlatParameters(a), FlatParameters(c), 1e-4, 1e-4));
  }
}

TEST_CASE("a rollout in which no row acts moves no parameter", "[active]") {
  torch::manual_seed(2);
  ActorCritic net(Space::Box({3}, {-1}, {1}), Space::Discrete(2), std::vector<int>{16});
  const torch::Tensor before = FlatParameters(net);
  MaskedRollouts m = MakeMaskedRollouts(8);
  m.clean.active = torch::zeros({8, 4});
  PpoConfig config;
  config.num_minibatches = 4;
  PpoTrainer trainer(net, config, 1);
  const PpoStats stats = trainer.Update(m.clean, 0.0);
  CHECK(stats.masked_rows == 32);
  // No minibatch had a row to learn from: no optimizer step (Adam's first step would move every parameter).
  CHECK(torch::equal(FlatParameters(net), before));
  CHECK(stats.grad_norm == 0);
}

// Two policies with the same parameters, a box or a discrete head on a 3-dim box observation.
std::pair<ActorCritic, ActorCritic> TwinPolicies(bool box) {
  const Space obs = Space::Box({3}, {-1}, {1});
  const Space act = box ? Space::Box({2}, {-1}, {1}) : Space::Discrete(3);
  ActorCritic a(obs, act, std::vector<int>{16, 16});
  ActorCritic b(obs, act, std::vector<int>{16, 16});
  b->CopyFrom(*a);
  return {a, b};
}

// A T x N rollout acted by `policy` in which about a quarter of the rows acted (row 0 of step 0 always). A left-out
// row's log-prob may be anything, an inf included: it must reach neither loss nor gradient.
Rollout QuarterActingRollout(ActorCritic& policy, int64_t T, int64_t N) {
  Rollout r = testing::ActedRollout(policy, torch::randn({T * N, 3}), {}, T, N);
  r.active = (torch::rand({T, N}) < 0.25).to(torch::kFloat32);
  r.active[0][0] = 1;
  r.logp = torch::where(r.active > 0, r.logp, torch::full_like(r.logp, -std::numeric_limits<float>::infinity()));
  return r;
}

TEST_CASE("the fused update with finished agents is the LibTorch update, minibatches with no acting row included",
          "[active][fused]") {
  // Box and discrete heads; 8 minibatches of 4 rows of which three quarters finished, so that some minibatches have
  // no row that acted (no step on either path) and the others a few: the two paths draw the same minibatches.
  // Seeds whose minibatches are well conditioned: the LibTorch path normalises a minibatch's advantages in float32,
  // the fused one in double, so two acting rows whose advantages agree to four digits (seed 23's first discrete
  // minibatch: 0.7961 and 0.7958) come out as 0.7073 / -0.7069 on one and +-0.7071 on the other, a 1e-4 difference
  // that is the reference's rounding, not the fused path's.
  const int seed = GENERATE(24, 25, 26, 27, 28);
  for (const bool box : {false, true}) {
    INFO((box ? "box actions" : "discrete actions") << ", seed " << seed);
    torch::manual_seed(seed);
    const int64_t T = 8, N = 4;
    const auto twins = TwinPolicies(box);
    ActorCritic a = twins.first, b = twins.second;
    const Rollout r = QuarterActingRollout(a, T, N);
    PpoConfig config;
    config.update_epochs = 3;
    config.num_minibatches = 8;
    config.fused_update = "on";
    PpoTrainer fused(a, config, 9);
    config.fused_update = "off";
    PpoTrainer libtorch(b, config, 9);
    const torch::Tensor before = FlatParameters(a);
    const PpoStats sf = fused.Update(r, 0.0);
    const PpoStats sl = libtorch.Update(r, 0.0);
    CHECK(std::string(fused.last_update_path()) == "fused");
    CHECK(std::string(libtorch.last_update_path()) == "libtorch");
    CHECK(sf.masked_rows == sl.masked_rows);
    CHECK(sf.masked_rows > 16);
    CHECK((FlatParameters(a) - before).abs().max().item<double>() > 1e-3);
    CHECK(testing::RelativeDiff(FlatParameters(a), FlatParameters(b)) < 1e-5);
    CHECK(std::isfinite(sf.policy_loss));
    CHECK(sf.policy_loss == Approx(sl.policy_loss).margin(1e-5));
    CHECK(sf.value_loss == Approx(sl.value_loss).epsilon(1e-4));
    CHECK(sf.entropy == Approx(sl.entropy).epsilon(1e-4));
    CHECK(sf.grad_norm == Approx(sl.grad_norm).epsilon(1e-4));
  }
}

TEST_CASE("the graphed step with finished agents is the LibTorch update, minibatches with no acting row included",
          "[active][graph]") {
  // The graphed step's program run eagerly (ppo.graph_update=on on the CPU: what a CUDA graph records and replays),
  // against the LibTorch update on the same rollouts: 8 minibatches of 4 rows, three quarters of the rows finished,
  // so that some minibatches have no acting row (no step on either path, decided on the device by the graphed one).
  // The first update of each run takes the LibTorch path (it makes Adam's state); the second the graphed step; the
  // third a rollout where nothing acts, which must move nothing.
  const int seed = GENERATE(24, 25, 26);
  for (const bool box : {false, true}) {
    INFO((box ? "box actions" : "discrete actions") << ", seed " << seed);
    torch::manual_seed(seed);
    const int64_t T = 8, N = 4;
    const auto twins = TwinPolicies(box);
    ActorCritic a = twins.first, b = twins.second;
    const auto masked_rollout = [&] { return QuarterActingRollout(a, T, N); };
    const Rollout first = masked_rollout(), second = masked_rollout();
    PpoConfig config;
    config.update_epochs = 3;
    config.num_minibatches = 8;
    config.fused_update = "off";
    config.graph_update = "on";
    PpoTrainer graphed(a, config, 9);
    config.graph_update = "off";
    PpoTrainer libtorch(b, config, 9);
    graphed.Update(first, 0.0);
    libtorch.Update(first, 0.0);
    CHECK(std::string(graphed.last_update_path()) == "libtorch");  // Adam's state comes from a LibTorch update
    const torch::Tensor before = FlatParameters(a);
    const PpoStats sg = graphed.Update(second, 0.0);
    const PpoStats sl = libtorch.Update(second, 0.0);
    CHECK(std::string(graphed.last_update_path()) == "graphed");
    CHECK(std::string(libtorch.last_update_path()) == "libtorch");
    CHECK(graphed.graph_captures() == 0);  // eager on the CPU
    CHECK(sg.masked_rows == sl.masked_rows);
    CHECK(sg.masked_rows > 16);
    CHECK((FlatParameters(a) - before).abs().max().item<double>() > 1e-3);
    CHECK(testing::RelativeDiff(FlatParameters(a), FlatParameters(b)) < 1e-5);
    CHECK(std::isfinite(sg.policy_loss));
    CHECK(sg.policy_loss == Approx(sl.policy_loss).margin(1e-5));
    CHECK(sg.value_loss == Approx(sl.value_loss).epsilon(1e-4));
    CHECK(sg.entropy == Approx(sl.entropy).epsilon(1e-4));
    CHECK(sg.grad_norm == Approx(sl.grad_norm).epsilon(1e-4));
    // Nothing acts: no step, Adam's moments and step count untouched, so the next update still equals LibTorch's.
    Rollout idle = masked_rollout();
    idle.active.zero_();
    const torch::Tensor settled = FlatParameters(a);
    const PpoStats si = graphed.Update(idle, 0.0);
    libtorch.Update(idle, 0.0);
    CHECK(std::string(graphed.last_update_path()) == "graphed");
    CHECK(torch::equal(FlatParameters(a), settled));
    CHECK(si.grad_norm == 0);
    const Rollout third = masked_rollout();
    graphed.Update(third, 0.0);
    libtorch.Update(third, 0.0);
    CHECK(testing::RelativeDiff(FlatParameters(a), FlatParameters(b)) < 1e-5);
  }
}

TEST_CASE("the store records which rows acted, and a rollout where all did has no mask", "[active][store]") {
  TrajectoryStore store(/*T=*/3, /*obs_numel=*/1, Space::Discrete(2), /*state_numel=*/0, /*agents_per_env=*/2);
  const int a = store.AddGroup(2);
  const float obs[2] = {0, 0}, f[2] = {0, 0}, reward[2] = {1, 1};
  const int64_t act[2] = {0, 1};
  const uint8_t none[2] = {0, 0}, both[2] = {1, 1}, second_off[2] = {1, 0};
  auto run = [&](const std::vector<const uint8_t*>& active) {
    for (int t = 0; t < 3; ++t) {
      store.RecordStep(a, obs, act, f, f, 0, nullptr, false, active[t]);
      store.RecordOutcome(a, reward, none, none);
    }
    store.SetBootstrap(a, f);
    return store.Take({1}, 0, nullptr);
  };
  const Rollout all = run({nullptr, both, nullptr});
  CHECK(!all.active.defined());
  const Rollout some = run({both, second_off, second_off});
  REQUIRE(some.active.defined());
  CHECK(torch::equal(some.active, torch::tensor({1.f, 1.f, 1.f, 0.f, 1.f, 0.f}).view({3, 2})));
  // A group that joins while the other has recorded gets an arena of its own: the rollout is gathered from two
  // arenas, and the mask with it.
  store.RecordStep(a, obs, act, f, f, 0);
  store.RecordOutcome(a, reward, none, none);
  const int b = store.AddGroup(2);
  for (int t = 1; t < 3; ++t) {
    store.RecordStep(a, obs, act, f, f, 0, nullptr, false, t == 2 ? second_off : nullptr);
    store.RecordOutcome(a, reward, none, none);
  }
  store.SetBootstrap(a, f);
  for (int t = 0; t < 3; ++t) {
    store.RecordStep(b, obs, act, f, f, 0, nullptr, false, t == 1 ? second_off : nullptr);
    store.RecordOutcome(b, reward, none, none);
  }
  store.SetBootstrap(b, f);
  const int64_t gathers = store.copy_stats().takes - store.copy_stats().zero_copy_takes;
  const Rollout gathered = store.Take({1}, 0, nullptr);
  CHECK(store.copy_stats().takes - store.copy_stats().zero_copy_takes == gathers + 1);
  REQUIRE(gathered.active.defined());
  CHECK(torch::equal(gathered.active,
                     torch::tensor({1.f, 1.f, 1.f, 1.f, 1.f, 1.f, 1.f, 0.f, 1.f, 0.f, 1.f, 1.f}).view({3, 4})));
  // The next rollout starts with every row acting again.
  for (int g : {a, b})
    for (int t = 0; t < 3; ++t) {
      store.RecordStep(g, obs, act, f, f, 0);
      store.RecordOutcome(g, reward, none, none);
    }
  store.SetBootstrap(a, f);
  store.SetBootstrap(b, f);
  CHECK(!store.Take({1}, 0, nullptr).active.defined());
}

}  // namespace
}  // namespace farm
