// Centralised training, decentralised execution on the learner side: the critic on a global state, the cnn
// encoder, the trajectory store and the PPO update with states, and policy_spec.json / LoadPolicy / TorchScript
// export of such policies. Seeded throughout.
#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>
#include <stdlib.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/files.h"
#include "common/wire.h"
#include "learner/model/export.h"
#include "learner/model/policy.h"
#include "learner/run/checkpoint.h"
#include "learner/train/ppo.h"
#include "learner/train/trajectory_store.h"
#include "tests/temp_dir.h"

// LibTorch pulls in glog, whose CHECK would replace Catch's: include Catch last.
#undef CHECK
#include <catch2/catch.hpp>

namespace farm {
namespace {

namespace fs = std::filesystem;

// Each test's own directory, removed at scope exit.
struct TempDir : testing::TempDir {
  TempDir() : testing::TempDir("farm-ctde-test") {}
};

const Space kObs = Space::Box({3}, {-5.f}, {5.f});
const Space kState = Space::Box({2, 2}, {-1.f}, {1.f});

PolicyOptions WithState(const Space& state, Encoder encoder = Encoder::kMlp) {
  PolicyOptions o;
  o.encoder = encoder;
  o.global_state = state;
  return o;
}

// The cnn encoder on both networks, the critic reading the observation (no global state).
PolicyOptions CnnWithoutState() {
  PolicyOptions o;
  o.encoder = Encoder::kCnn;
  return o;
}

// A one-step-episode rollout where the return is +1 or -1 by the global state (all +0.5 or all -0.5) and the
// observation is noise that says nothing about it.
Rollout StateDecidesReturn(int64_t T, int64_t N, uint64_t seed) {
  torch::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  Rollout r;
  const torch::Tensor sign = torch::randint(0, 2, {T, N}, gen, torch::kInt64).to(torch::kFloat32) * 2 - 1;
  r.obs = torch::randn({T, N, 3}, gen, torch::kFloat32);
  r.states = (0.5 * sign).view({T, N, 1, 1}).expand({T, N, 2, 2}).contiguous();
  r.actions = torch::randint(0, 2, {T, N}, gen, torch::kInt64);
  r.logp = torch::full({T, N}, std::log(0.5f));
  r.values = torch::zeros({T, N});
  r.rewards = sign;
  r.dones = torch::ones({T, N});
  r.last_value = torch::zeros({N});
  return r;
}

}  // namespace

TEST_CASE("the centralised critic reads the global state, never the observation", "[ctde][policy]") {
  torch::manual_seed(1);
  ActorCritic policy(kObs, Space::Discrete(2), std::vector<int>{16, 16}, WithState(kState));
  REQUIRE(policy->has_global_state());
  // The critic's first layer takes the state's 4 numbers, the actor's the observation's 3.
  auto params = policy->named_parameters();
  CHECK(params["critic.0.weight"].sizes() == torch::IntArrayRef({16, 4}));
  CHECK(params["actor.0.weight"].sizes() == torch::IntArrayRef({16, 3}));

  const torch::Tensor obs_a = torch::randn({5, 3});
  const torch::Tensor obs_b = torch::randn({5, 3});
  const torch::Tensor state_x = torch::rand({5, 2, 2});
  const torch::Tensor state_y = -torch::rand({5, 2, 2});
  torch::NoGradGuard no_grad;
  CHECK(torch::equal(policy->Value(obs_a, state_x), policy->Value(obs_b, state_x)));
  CHECK_FALSE(torch::allclose(policy->Value(obs_a, state_x), policy->Value(obs_a, state_y)));
  const ActOutput out = policy->Act(obs_a, state_x);
  CHECK(torch::equal(out.value, policy->Value(obs_a, state_x)));
  CHECK(out.action.sizes() == torch::IntArrayRef({5}));

  // One state per run of k rows (an env's agents) is the same as that state on each of them.
  const torch::Tensor per_env = torch::rand({2, 2, 2});
  const torch::Tensor obs6 = torch::randn({6, 3});
  CHECK(torch::allclose(policy->Value(obs6, per_env), policy->Value(obs6, per_env.repeat_interleave(3, 0))));
  CHECK(torch::allclose(policy->Act(obs6, per_env).value, policy->Value(obs6, per_env.repeat_interleave(3, 0))));

  // Acting needs only the actor: no state, no value, the same deterministic actions.
  const ActOutput actor_only = policy->Act(obs_a, /*deterministic=*/true);
  CHECK_FALSE(actor_only.value.defined());
  CHECK(torch::equal(actor_only.action, policy->Act(obs_a, state_y, true).action));
  // Training does need it.
  CHECK_THROWS_WITH(policy->Evaluate(obs_a, out.action), Catch::Contains("global state") && Catch::Contains("none"));
  CHECK_THROWS_WITH(policy->Value(obs_a, state_x.narrow(0, 0, 2)), Catch::Contains("2 global states for 5"));
}

TEST_CASE("PPO trains a centralised critic on states, where a critic on the observation cannot learn",
          "[ctde][ppo]") {
  torch::manual_seed(2);
  PpoConfig config;
  config.lr = 3e-3;
  config.anneal_lr = false;
  config.update_epochs = 8;
  config.num_minibatches = 2;
  config.ent_coef = 0;
  config.clip_vloss = false;  // the rollouts' stored values are 0: clipping around them would stall the critic
  ActorCritic central(kObs, Space::Discrete(2), std::vector<int>{32, 32}, WithState(kState));
  PpoTrainer trainer(central, config, /*seed=*/5);
  CHECK_FALSE(trainer.fused());  // the fused update has no centralised critic, even with fused_update auto
  ActorCritic local(kObs, Space::Discrete(2), std::vector<int>{32, 32});
  PpoTrainer local_trainer(local, config, 5);

  PpoStats stats, local_stats;
  for (int i = 0; i < 20; ++i) {
    Rollout r = StateDecidesReturn(16, 16, 100 + i);
    stats = trainer.Update(r, 0.0);
    r.states = torch::Tensor();  // the same data without states, for the critic on the observation
    local_stats = local_trainer.Update(r, 0.0);
  }
  {
    torch::NoGradGuard no_grad;
    const torch::Tensor obs = torch::randn({4, 3});
    const torch::Tensor plus = torch::full({4, 2, 2}, 0.5f);
    CHECK(central->Value(obs, plus).min().item<float>() > 0.7f);
    CHECK(central->Value(obs, -plus).max().item<float>() < -0.7f);
  }
  CHECK(stats.value_loss < 0.05);
  CHECK(local_stats.value_loss > 0.3);  // the noise observation explains nothing: about Var(return) / 2 = 0.5

  // States missing for a centralised critic, or given to a critic without one, are refused by name.
  Rollout r = StateDecidesReturn(4, 3, 9);
  Rollout no_states = r;
  no_states.states = torch::Tensor();
  CHECK_THROWS_WITH(trainer.Update(no_states, 0.0), Catch::Contains("states must be [T, N / rows_per_state, state...]"));
  CHECK_THROWS_WITH(local_trainer.Update(r, 0.0), Catch::Contains("the policy has no global state"));

  // Rows in runs of k sharing a state (an env's agents) train on one state per run, minibatches of whole runs.
  Rollout runs = StateDecidesReturn(4, 6, 11);
  for (int64_t n = 0; n < 6; ++n) {  // make rows 3e..3e+2 one env: its first row's return
    const int64_t first = n - n % 3;
    runs.rewards.select(1, n).copy_(runs.rewards.select(1, first));
  }
  runs.states = runs.states.index_select(1, torch::tensor({0, 3})).contiguous();  // [T, N / 3, ...]: one per env
  runs.rows_per_state = 3;
  const PpoStats run_stats = trainer.Update(runs, 0.0);
  CHECK(run_stats.samples == 24);
  CHECK(std::isfinite(run_stats.value_loss));
  runs.rows_per_state = 4;  // does not divide N = 6
  CHECK_THROWS_WITH(trainer.Update(runs, 0.0), Catch::Contains("rows_per_state 4 must divide N=6"));
  runs.rows_per_state = 2;  // divides N, but the states are one per 3 rows
  CHECK_THROWS_WITH(trainer.Update(runs, 0.0), Catch::Contains("states must be [T, N / rows_per_state, state...]"));

  // ppo.fused_update on cannot train it, and says why.
  PpoConfig on = config;
  on.fused_update = "on";
  CHECK_THROWS_WITH(PpoTrainer(central, on, 1), Catch::Contains("centralised critic"));
}

TEST_CASE("the cnn encoder: conv shapes, forward and backward, refused for non-image inputs", "[ctde][cnn]") {
  torch::manual_seed(3);
  const Space obs = Space::Box({5, 7, 7}, {0.f}, {1.f});
  const Space state = Space::Box({3, 9, 9}, {0.f}, {1.f});
  ActorCritic policy(obs, Space::Discrete(5), std::vector<int>{24, 16}, WithState(state, Encoder::kCnn));
  auto p = policy->named_parameters();
  CHECK(p["actor_encoder.0.weight"].sizes() == torch::IntArrayRef({kCnnChannels1, 5, 3, 3}));
  CHECK(p["actor_encoder.2.weight"].sizes() == torch::IntArrayRef({kCnnChannels2, kCnnChannels1, 3, 3}));
  CHECK(p["actor_encoder.5.weight"].sizes() == torch::IntArrayRef({24, kCnnChannels2 * 4 * 4}));  // 7 -> 4
  CHECK(p["critic_encoder.0.weight"].sizes() == torch::IntArrayRef({kCnnChannels1, 3, 3, 3}));
  CHECK(p["critic_encoder.5.weight"].sizes() == torch::IntArrayRef({24, kCnnChannels2 * 5 * 5}));  // 9 -> 5
  CHECK(p["actor.0.weight"].sizes() == torch::IntArrayRef({16, 24}));
  CHECK(p["actor.2.weight"].sizes() == torch::IntArrayRef({5, 16}));
  CHECK(p["critic.2.weight"].sizes() == torch::IntArrayRef({1, 16}));

  const torch::Tensor o = torch::rand({6, 5, 7, 7});
  const torch::Tensor s = torch::rand({6, 3, 9, 9});
  const ActOutput act = policy->Act(o, s);
  CHECK(act.action.sizes() == torch::IntArrayRef({6}));
  CHECK(act.value.sizes() == torch::IntArrayRef({6}));
  // Flattened rows are read as [C, H, W] too (the learner's batches arrive flat).
  {
    torch::NoGradGuard no_grad;
    CHECK(torch::allclose(policy->Value(o.reshape({6, -1}), s.reshape({6, -1})), policy->Value(o, s)));
  }
  const EvalOutput eval = policy->Evaluate(o, s, act.action);
  (eval.logp.sum() + eval.value.sum() + eval.entropy.sum()).backward();
  for (const auto& item : policy->named_parameters()) {
    INFO(item.key());
    REQUIRE(item.value().grad().defined());
    CHECK(torch::isfinite(item.value().grad()).all().item<bool>());
    CHECK(item.value().grad().abs().sum().item<double>() > 0);
  }

  // Without a state the cnn critic reads the observation.
  ActorCritic local(obs, Space::Discrete(5), std::vector<int>{24}, CnnWithoutState());
  CHECK(local->named_parameters()["critic_encoder.0.weight"].size(1) == 5);
  CHECK(local->Act(o).value.sizes() == torch::IntArrayRef({6}));

  CHECK_THROWS_WITH(ActorCritic(kObs, Space::Discrete(2), std::vector<int>{8}, CnnWithoutState()),
                    Catch::Contains("needs a [C, H, W] observation") && Catch::Contains("[3]"));
  CHECK_THROWS_WITH(ActorCritic(obs, Space::Discrete(2), std::vector<int>{8}, WithState(kState, Encoder::kCnn)),
                    Catch::Contains("needs a [C, H, W] global state"));

  Encoder e;
  CHECK(ParseEncoder("cnn", &e).ok());
  CHECK(e == Encoder::kCnn);
  CHECK_THAT(ParseEncoder("resnet", &e).message(), Catch::Contains("expected mlp, cnn, conv or impala, got 'resnet'"));
}

TEST_CASE("a cnn policy trains with the LibTorch update on [T, N, C, H, W] rollouts", "[ctde][cnn][ppo]") {
  torch::manual_seed(4);
  const Space obs = Space::Box({2, 5, 5}, {0.f}, {1.f});
  const Space state = Space::Box({1, 6, 6}, {0.f}, {1.f});
  ActorCritic policy(obs, Space::Discrete(3), std::vector<int>{16}, WithState(state, Encoder::kCnn));
  PpoConfig config;
  config.num_minibatches = 2;
  config.update_epochs = 2;
  PpoTrainer trainer(policy, config, 7);
  CHECK_FALSE(trainer.fused());
  const int64_t T = 4, N = 6;
  Rollout r;
  r.obs = torch::rand({T, N, 2, 5, 5});
  r.states = torch::rand({T, N, 1, 6, 6});
  r.actions = torch::randint(0, 3, {T, N}, torch::kInt64);
  r.logp = torch::full({T, N}, std::log(1.0f / 3));
  r.values = torch::zeros({T, N});
  r.rewards = torch::rand({T, N});
  r.dones = torch::zeros({T, N});
  r.last_value = torch::zeros({N});
  const auto before = policy->named_parameters()["critic_encoder.0.weight"].clone();
  const PpoStats stats = trainer.Update(r, 0.0);
  CHECK(stats.samples == T * N);
  CHECK(std::isfinite(stats.policy_loss));
  CHECK(std::isfinite(stats.value_loss));
  CHECK_FALSE(torch::equal(before, policy->named_parameters()["critic_encoder.0.weight"]));

  PpoConfig on = config;
  on.fused_update = "on";
  ActorCritic local(obs, Space::Discrete(3), std::vector<int>{16}, CnnWithoutState());
  CHECK_THROWS_WITH(PpoTrainer(local, on, 1), Catch::Contains("cnn"));
}

TEST_CASE("the trajectory store keeps a global state per env, by group, and leaves dropped groups out",
          "[ctde][store]") {
  // Envs of 2 agents: group a is 2 envs (4 rows), group b 1 env (2 rows).
  TrajectoryStore store(/*T=*/2, /*obs_numel=*/1, Space::Discrete(2), /*state_numel=*/4, /*agents_per_env=*/2);
  const int a = store.AddGroup(4);
  const int b = store.AddGroup(2);
  const int64_t act4[] = {0, 1, 1, 0}, act2[] = {1, 1};
  const float obs4[] = {1, 2, 3, 4}, obs2[] = {5, 6}, f4[] = {0, 0, 0, 0}, f2[] = {0, 0};
  const uint8_t no4[] = {0, 0, 0, 0}, no2[] = {0, 0};
  for (int t = 0; t < 2; ++t) {
    // Env e of step t holds 100 t + 10 e + element (e counts the envs of both groups).
    float sa[8], sb[4];
    for (int i = 0; i < 4; ++i) {
      sa[i] = 100.f * t + i;
      sa[4 + i] = 100.f * t + 10 + i;
      sb[i] = 100.f * t + 20 + i;
    }
    store.RecordStep(a, obs4, act4, f4, f4, 0, sa);
    store.RecordOutcome(a, f4, no4, no4);
    store.RecordStep(b, obs2, act2, f2, f2, 0, sb);
    store.RecordOutcome(b, f2, no2, no2);
  }
  store.SetBootstrap(a, f4);
  store.SetBootstrap(b, f2);
  REQUIRE(store.all_full());
  Rollout r = store.Take({1}, 0, nullptr, {2, 2});
  CHECK(r.rows_per_state == 2);
  REQUIRE(r.obs.sizes() == torch::IntArrayRef({2, 6, 1}));
  REQUIRE(r.states.sizes() == torch::IntArrayRef({2, 3, 2, 2}));  // one state per env, not per row
  for (int t = 0; t < 2; ++t)
    for (int env = 0; env < 3; ++env)
      for (int i = 0; i < 4; ++i)
        CHECK(r.states[t][env].flatten()[i].item<float>() == 100.f * t + 10.f * env + i);

  // Group a's worker is gone: its envs leave the states too.
  store.RemoveGroup(a);
  float sb[4] = {7, 7, 7, 7};
  for (int t = 0; t < 2; ++t) {
    store.RecordStep(b, obs2, act2, f2, f2, 0, sb);
    store.RecordOutcome(b, f2, no2, no2);
  }
  store.SetBootstrap(b, f2);
  r = store.Take({1}, 0, nullptr, {2, 2});
  REQUIRE(r.states.sizes() == torch::IntArrayRef({2, 1, 2, 2}));
  CHECK(torch::equal(r.states, torch::full({2, 1, 2, 2}, 7.f)));
  CHECK_THROWS_WITH(store.Take({1}, 0, nullptr, {3}), Catch::Contains("3 elements") && Catch::Contains("4 per env"));
  CHECK_THROWS_WITH(store.AddGroup(3), Catch::Contains("3 rows are not whole envs of 2 agents"));

  // Without states nothing is stored and Rollout::states stays undefined.
  TrajectoryStore plain(1, 1, Space::Discrete(2));
  const int g = plain.AddGroup(1);
  const int64_t act1[] = {1};
  const float obs1[] = {3}, f1[] = {0};
  const uint8_t no1[] = {0};
  plain.RecordStep(g, obs1, act1, f1, f1, 0);
  plain.RecordOutcome(g, f1, no1, no1);
  plain.SetBootstrap(g, f1);
  CHECK_FALSE(plain.Take({1}, 0, nullptr).states.defined());
}

TEST_CASE("policy_spec.json and LoadPolicy rebuild a cnn policy with a centralised critic", "[ctde][checkpoint]") {
  torch::manual_seed(5);
  const Space obs = Space::Box({5, 7, 7}, {0.f}, {1.f});
  const Space state = Space::Box({3, 8, 8}, {0.f}, {1.f});
  const Space action = Space::Discrete(5);
  const PolicyOptions options = WithState(state, Encoder::kCnn);

  // The spec round trip.
  const std::string text = PolicySpecJson(obs, action, {32, 16}, options);
  Space obs2, action2;
  std::vector<int> hidden;
  PolicyOptions options2;
  REQUIRE(ParsePolicySpecJson(text, "spec", &obs2, &action2, &hidden, &options2).ok());
  CHECK(obs2 == obs);
  CHECK(hidden == std::vector<int>{32, 16});
  CHECK(options2.encoder == Encoder::kCnn);
  REQUIRE(options2.global_state);
  CHECK(*options2.global_state == state);
  // A caller that cannot rebuild it is told; an old spec (no encoder, no state) means mlp on the observation.
  CHECK_THAT(ParsePolicySpecJson(text, "spec", &obs2, &action2, &hidden).message(),
             Catch::Contains("encoder cnn and a global state"));
  const std::string old = PolicySpecJson(obs, action, {8});
  nlohmann::json j = nlohmann::json::parse(old);
  j.erase("encoder");
  j.erase("global_state");
  REQUIRE(ParsePolicySpecJson(j.dump(), "old", &obs2, &action2, &hidden, &options2).ok());
  CHECK(options2.encoder == Encoder::kMlp);
  CHECK_FALSE(options2.global_state);
  j["encoder"] = "rnn";
  CHECK_THAT(ParsePolicySpecJson(j.dump(), "bad", &obs2, &action2, &hidden, &options2).message(),
             Catch::Contains("bad: encoder: expected mlp, cnn, conv or impala, got 'rnn'"));
  j["encoder"] = "mlp";
  j["global_state"] = nlohmann::json::parse(R"({"kind": "discrete", "n": 3})");
  CHECK_THAT(ParsePolicySpecJson(j.dump(), "bad", &obs2, &action2, &hidden, &options2).message(),
             Catch::Contains("global_state: expected a box"));

  // LoadPolicy on a run directory written the way the learner writes it.
  TempDir tmp;
  const std::string run = tmp.path + "/run";
  fs::create_directories(run);
  FarmConfig config;
  config.env.name = "uav_coverage";
  config.ppo.hidden_sizes = {32, 16};
  config.ppo.encoder = "cnn";
  REQUIRE(WriteFileAtomic(run + "/config.yaml", DumpConfig(config)).ok());
  REQUIRE(WriteFileAtomic(run + "/policy_spec.json", text).ok());
  ActorCritic trained(obs, action, std::vector<int>{32, 16}, options);
  torch::optim::Adam optimizer(trained->parameters(), torch::optim::AdamOptions(1e-3));
  TrainingCounters counters;
  counters.env_steps = 4000;
  counters.updates = 3;
  REQUIRE(SaveCheckpoint(run + "/checkpoints", trained, optimizer, counters).ok());

  ActorCritic loaded{nullptr};
  FarmConfig loaded_config;
  TrainingCounters loaded_counters;
  const Status s = LoadPolicy(run, &loaded, &loaded_config, &loaded_counters);
  INFO(s.message());
  REQUIRE(s.ok());
  CHECK(loaded->encoder() == Encoder::kCnn);
  REQUIRE(loaded->has_global_state());
  CHECK(*loaded->options().global_state == state);
  CHECK(loaded_config.ppo.encoder == "cnn");
  auto want = trained->named_parameters();
  REQUIRE(loaded->named_parameters().size() == want.size());
  for (const auto& item : loaded->named_parameters()) CHECK(torch::equal(item.value(), want[item.key()]));
  torch::NoGradGuard no_grad;
  const torch::Tensor o = torch::rand({3, 5, 7, 7});
  const torch::Tensor st = torch::rand({3, 3, 8, 8});
  CHECK(torch::equal(loaded->Value(o, st), trained->Value(o, st)));

  // A spec that says mlp for a cnn checkpoint does not load silently.
  REQUIRE(WriteFileAtomic(run + "/policy_spec.json", PolicySpecJson(obs, action, {32, 16}, WithState(state))).ok());
  CHECK_FALSE(LoadPolicy(run, &loaded, &loaded_config, &loaded_counters).ok());
}

TEST_CASE("TorchScript export of a cnn actor with a centralised critic matches Act's deterministic actions",
          "[ctde][export]") {
  torch::manual_seed(6);
  const Space obs = Space::Box({5, 7, 7}, {0.f}, {1.f});
  ActorCritic policy(obs, Space::Discrete(5), std::vector<int>{32, 16},
                     WithState(Space::Box({3, 8, 8}, {0.f}, {1.f}), Encoder::kCnn));
  {
    torch::NoGradGuard no_grad;  // sharpen the head so that argmaxes are clear
    auto p = policy->named_parameters();
    p["actor.2.weight"].mul_(100.0);
  }
  TempDir tmp;
  const std::string path = tmp.path + "/policy.pt";
  const Status s = ExportTorchScript(*policy, path);
  INFO(s.message());
  REQUIRE(s.ok());
  torch::jit::Module module = torch::jit::load(path);
  // Only the actor travels: the module holds every parameter of the actor and its encoder, and nothing else
  // (the module names its parameters w0, conv0_w, ..., so a name says nothing of where one came from).
  std::vector<torch::Tensor> actor;
  for (const auto& item : policy->named_parameters())
    if (item.key().rfind("actor.", 0) == 0 || item.key().rfind("actor_encoder.", 0) == 0) actor.push_back(item.value());
  // conv, conv, linear (to the first hidden size); linear, linear; a weight and a bias each.
  REQUIRE(actor.size() == 5 * 2);
  std::size_t exported = 0;
  for (const auto& p : module.named_parameters(/*recurse=*/false)) {
    INFO("exported parameter " << p.name);
    ++exported;
    CHECK(std::any_of(actor.begin(), actor.end(), [&](const torch::Tensor& a) {
      return a.sizes() == p.value.sizes() && torch::equal(a, p.value);
    }));
  }
  CHECK(exported == actor.size());
  const torch::Tensor o = torch::rand({64, 5, 7, 7});
  c10::InferenceMode guard;
  const torch::Tensor expected = policy->Act(o, /*deterministic=*/true).action;
  const torch::Tensor got = module.forward({o}).toTensor();
  CHECK(torch::equal(got, expected));
  // Flat rows work too, as for the MLP.
  CHECK(torch::equal(module.forward({o.reshape({64, -1})}).toTensor(), expected));
}

}  // namespace farm

namespace farm {

TEST_CASE("CheckStepWholeEnvs: final_obs_index lists whole envs, none on a first request", "[ctde][wire]") {
  // 2 envs of 3 agents: rows 0-2 and 3-5.
  auto request = [](const std::vector<int>& finals) {
    wire::StepRequest req;
    req.set_seq(1);
    for (int i : finals) req.add_final_obs_index(i);
    return req;
  };
  CHECK(CheckStepWholeEnvs(request({}), 3).ok());
  CHECK(CheckStepWholeEnvs(request({3, 4, 5}), 3).ok());
  CHECK(CheckStepWholeEnvs(request({0, 1, 2, 3, 4, 5}), 3).ok());
  CHECK_THAT(CheckStepWholeEnvs(request({1, 2, 3}), 3).message(),
             Catch::Contains("final_obs_index: entry 0 (1) breaks the runs of whole envs"));
  CHECK_THAT(CheckStepWholeEnvs(request({3, 4}), 3).message(), Catch::Contains("final_obs_index: entry 0 (3)"));
  CHECK_THAT(CheckStepWholeEnvs(request({3, 5, 4}), 3).message(), Catch::Contains("entry 1 (5)"));
  // Single-agent envs: any rows; a first request never has final observations.
  CHECK(CheckStepWholeEnvs(request({1, 2}), 1).ok());
  wire::StepRequest first = request({3, 4, 5});
  first.set_seq(0);
  first.set_first(true);
  CHECK_THAT(CheckStepWholeEnvs(first, 3).message(), Catch::Contains("3 entries on a first request"));
}

}  // namespace farm

namespace farm {

TEST_CASE("CheckStepRequest refuses final observations on a first request", "[ctde][wire]") {
  // The learner would copy and bootstrap them before any step result exists (and unchecked in size).
  wire::StepRequest req;
  req.set_first(true);
  const std::vector<float> obs(2 * 3, 0.f), big(64, 0.f);
  SetTensor(req.mutable_obs(), DType::kFloat32, {2, 3}, obs.data(), obs.size() * 4);
  CHECK(CheckStepRequest(req, 2, {3}, {0}).ok());
  req.add_final_obs_index(0);
  SetTensor(req.mutable_final_obs(), DType::kFloat32, {64}, big.data(), big.size() * 4);
  CHECK_THAT(CheckStepRequest(req, 2, {3}, {0}).message(),
             Catch::Contains("StepRequest.final_obs_index: 1 entries on a first request"));
}

}  // namespace farm
