// A policy of a run with several policies is trained by a learner of its own (farm-learner --policy NAME) with the
// config PolicyRunConfig makes from the run's keys and the policy's `set`. Its updates must be the updates the same
// policy gets when trained alone, from a config that has those keys at the top: the same network, optimiser,
// normaliser and parameters after the same updates on the same data, bit for bit. A policy's `set` that were lost
// or applied to the wrong policy (another policy's lr, the run's network) fails the comparison, as the control
// below shows.
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/wire.h"
#include "learner/run/run_normalizer.h"
#include "learner/run_builder.h"
#include "tests/ppo_test_util.h"

// LibTorch includes glog, whose one-argument CHECK would silently replace Catch's: include Catch last.
#undef CHECK
#include <catch2/catch.hpp>

namespace farm {
namespace {

// The run: two policies of different spaces (tests/python/signals_env.py's speaker and listeners), the run's own
// PPO keys, and the listeners' policy with a network, learning rate, clipping and value normaliser of its own.
constexpr const char* kRun = R"(
name: signals
seed: 4
run_dir: runs/signals
env: {python: signals_env.py:make, num_envs: 8, num_groups: 2}
ppo: {rollout_length: 10, lr: 0.003, value_norm: running, update_epochs: 3, num_minibatches: 2, ent_coef: 0.02}
policies:
  - {name: talk, agents: [speaker]}
  - name: hear
    agents: ["listener_*"]
    set: ["ppo.hidden_sizes=[32]", "ppo.lr=0.001", "ppo.clip_coef=0.1", "ppo.value_norm=popart"]
)";

// The listeners' policy as a user would train it alone: the run's keys with the policy's at the top.
constexpr const char* kAlone = R"(
name: signals-hear
seed: 4
run_dir: runs/signals/hear
env: {python: signals_env.py:make, num_envs: 8, num_groups: 2}
ppo: {rollout_length: 10, lr: 0.001, value_norm: popart, update_epochs: 3, num_minibatches: 2, ent_coef: 0.02,
      hidden_sizes: [32], clip_coef: 0.1}
)";

// Loaded as farm-learner loads a config file (LoadConfig: parsed, then the core's defaults).
FarmConfig Loaded(const std::string& yaml, const std::string& file) {
  const std::filesystem::path path = std::filesystem::temp_directory_path() / file;
  std::ofstream(path) << yaml;
  FarmConfig c;
  const Status s = LoadConfig(path.string(), {}, &c);
  std::filesystem::remove(path);
  INFO(s.message());
  REQUIRE(s.ok());
  return c;
}

// The listeners' Hello: observation [2, 5], 5 actions, 2 agents per env, 8 envs in 2 groups.
wire::Hello ListenersHello() {
  wire::Hello h;
  h.set_protocol_version(kProtocolVersion);
  h.set_worker_id("worker-test");
  h.set_env_name("python:signals_env.py:make");
  h.set_num_envs(8);
  h.set_num_groups(2);
  h.set_num_agents(2);
  ToWire(Space::Box({2, 5}, {-1.f}, {1.f}), h.mutable_observation());
  ToWire(Space::Discrete(5), h.mutable_action());
  return h;
}

// The learner's run for `config` (its parameters drawn from seed 11), then three updates on the same three
// rollouts (their rewards and dones from seed 21): the parameters after them.
torch::Tensor TrainedParameters(const FarmConfig& config) {
  const wire::Hello hello = ListenersHello();
  Handshake hs;
  REQUIRE(CheckHello(hello, &hs).ok());
  RunNormalizer normalizer(config, /*recording=*/true);
  RunParts parts;
  bool fatal = false;
  torch::manual_seed(11);
  const Status s = BuildRun(config, torch::kCPU, Precision::kFp32, Precision::kFp32, hello, hs, &normalizer, &parts,
                            &fatal);
  INFO(s.message());
  REQUIRE(s.ok());
  torch::manual_seed(21);
  for (int u = 0; u < 3; ++u) {
    const torch::Tensor obs = torch::rand({10 * 16, 2, 5}) * 2 - 1;  // 10 steps x (8 envs x 2 agents)
    Rollout r = testing::ActedRollout(parts.training, obs, {}, 10, 16);
    r.rewards = r.rewards + 5;  // returns far from zero: the normaliser's statistics matter
    parts.trainer->Update(r, u / 3.0);
  }
  return testing::FlatParameters(parts.training);
}

TEST_CASE("a policy's updates in a run with several policies equal its updates alone on the same data",
          "[policies]") {
  const FarmConfig run = Loaded(kRun, "policy_update_test_run.yaml");
  REQUIRE(ValidateConfig(run).ok());
  FarmConfig hear;
  const Status s = PolicyRunConfig(run, "hear", &hear);
  INFO(s.message());
  REQUIRE(s.ok());
  const FarmConfig alone = Loaded(kAlone, "policy_update_test_alone.yaml");
  // The whole config the policy's learner runs with is the one a user would write for it alone.
  CHECK(DumpConfig(hear) == DumpConfig(alone));
  const torch::Tensor with_others = TrainedParameters(hear);
  const torch::Tensor by_itself = TrainedParameters(alone);
  REQUIRE(with_others.numel() == by_itself.numel());
  CHECK(with_others.equal(by_itself));

  // The control: with the run's keys alone (the policy's `set` lost), or the other policy's config, the same
  // updates come out different, so the comparison above can fail.
  FarmConfig lost = run;
  lost.policies.clear();
  lost.run_dir = "runs/signals/hear";
  lost.name = "signals-hear";
  const torch::Tensor without_set = TrainedParameters(lost);
  CHECK(without_set.numel() != by_itself.numel());  // the run's [64, 64] network, not the policy's [32]
  FarmConfig lr_only = alone;
  lr_only.ppo.lr = 0.003;  // the run's learning rate: same network, other updates
  const torch::Tensor other_lr = TrainedParameters(lr_only);
  REQUIRE(other_lr.numel() == by_itself.numel());
  CHECK_FALSE(other_lr.equal(by_itself));
  FarmConfig talk;
  REQUIRE(PolicyRunConfig(run, "talk", &talk).ok());
  CHECK(talk.ppo.lr == 0.003);
  CHECK(talk.ppo.value_norm == "running");
  CHECK(DumpConfig(talk) != DumpConfig(alone));
}

}  // namespace
}  // namespace farm
