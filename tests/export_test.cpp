// Tests for the tools' building blocks: policy_spec.json round trips and errors, LoadPolicy on a hand-made
// run directory, and TorchScript export (discrete and box actions) checked against ActorCritic::Act.
#include "common/files.h"
#include "learner/model/export.h"

#include <stdlib.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "common/config.h"
#include "learner/model/policy.h"
#include "learner/run/checkpoint.h"
#include "learner/run/metrics.h"
#include "tests/temp_dir.h"

// LibTorch includes glog, whose one-argument CHECK would silently replace Catch's (and abort on failure
// instead of reporting): include Catch last and drop glog's macro first.
#undef CHECK
#include <catch2/catch.hpp>

namespace farm {
namespace {

namespace fs = std::filesystem;

// A fresh directory under $TMPDIR, removed at scope exit.
struct TempDir : testing::TempDir {
  TempDir() : testing::TempDir("farm-export-test") {}
};

void WriteText(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// Scales the actor's last layer so outputs are large: argmaxes are clear and box means leave the bounds.
void SharpenActor(ActorCriticImpl& policy, double factor, double bias_std) {
  torch::NoGradGuard no_grad;
  std::string last_weight, last_bias;
  for (const auto& item : policy.named_parameters()) {
    if (item.key().rfind("actor.", 0) != 0) continue;
    if (item.key().size() > 7 && item.key().compare(item.key().size() - 7, 7, ".weight") == 0) last_weight = item.key();
    if (item.key().size() > 5 && item.key().compare(item.key().size() - 5, 5, ".bias") == 0) last_bias = item.key();
  }
  auto params = policy.named_parameters();
  params[last_weight].mul_(factor);
  params[last_bias].normal_(0.0, bias_std);
}

// Exports `policy` to DIR/policy.pt, requires that it worked and left no temporary file; returns the path.
std::string ExportInto(ActorCriticImpl& policy, const TempDir& dir) {
  const std::string path = dir.path + "/policy.pt";
  const Status s = ExportTorchScript(policy, path);
  INFO(s.message());
  REQUIRE(s.ok());
  REQUIRE_FALSE(fs::exists(path + ".tmp"));
  return path;
}

// Act's deterministic actions (the mode, or the unclipped mean) for `obs`.
torch::Tensor ActMode(ActorCriticImpl& policy, const torch::Tensor& obs) {
  c10::InferenceMode guard;
  return policy.Act(obs, /*deterministic=*/true).action;
}

torch::Tensor RunExported(const std::string& path, const torch::Tensor& obs) {
  torch::jit::Module module = torch::jit::load(path);
  c10::InferenceMode guard;
  return module.forward({obs}).toTensor();
}

}  // namespace

TEST_CASE("policy_spec.json round-trips discrete and box spaces, infinite bounds included", "[export]") {
  const float inf = std::numeric_limits<float>::infinity();
  const Space obs = Space::Box({2, 3}, {-1, -inf, 0, -2.5f, -3, 0.125f}, {1, inf, 0.1f, 2.5f, 3, 0.25f});
  for (const Space& action : {Space::Discrete(5), Space::Box({2}, {-1.5f}, {2.0f})}) {
    const std::string text = PolicySpecJson(obs, action, {32, 16});
    Space obs2, action2;
    std::vector<int> hidden;
    const Status s = ParsePolicySpecJson(text, "spec", &obs2, &action2, &hidden);
    INFO(text << "\n" << s.message());
    REQUIRE(s.ok());
    CHECK(obs2 == obs);
    CHECK(action2 == action);
    CHECK(hidden == std::vector<int>{32, 16});
  }
  const nlohmann::json j = nlohmann::json::parse(PolicySpecJson(obs, Space::Discrete(2), {64, 64}));
  CHECK(j["observation"]["kind"] == "box");
  CHECK(j["observation"]["high"][1] == "inf");
  CHECK(j["action"]["kind"] == "discrete");
  CHECK(j["action"]["n"] == 2);
}

TEST_CASE("policy_spec.json errors name the file, the key and what was expected", "[export]") {
  Space obs, action;
  std::vector<int> hidden;
  auto error = [&](const std::string& text) {
    const Status s = ParsePolicySpecJson(text, "run/policy_spec.json", &obs, &action, &hidden);
    REQUIRE_FALSE(s.ok());
    CHECK(s.message().find("run/policy_spec.json") != std::string::npos);
    return s.message();
  };
  const std::string box = R"({"kind": "box", "shape": [2], "n": 0, "low": [-1, -1], "high": [1, 1]})";
  const std::string discrete = R"({"kind": "discrete", "shape": [], "n": 3, "low": [], "high": []})";
  REQUIRE(ParsePolicySpecJson(R"({"observation": )" + box + R"(, "action": )" + discrete + R"(, "hidden_sizes": [8]})",
                              "x", &obs, &action, &hidden)
              .ok());
  CHECK(error("{not json").find("not valid JSON") != std::string::npos);
  CHECK(error(R"({"observation": )" + box + R"(, "action": )" + discrete + "}").find("hidden_sizes") !=
        std::string::npos);
  CHECK(error(R"({"observation": )" + box + R"(, "action": )" + discrete + R"(, "hidden_sizes": [8, 0]})")
            .find("positive integers") != std::string::npos);
  CHECK(error(R"({"observation": )" + box + R"(, "action": {"kind": "multi"}, "hidden_sizes": [8]})")
            .find("action.kind") != std::string::npos);
  CHECK(error(R"({"observation": {"kind": "box", "shape": [3], "low": [0], "high": [1, 1, 1]}, "action": )" + discrete +
              R"(, "hidden_sizes": [8]})")
            .find("3 entries") != std::string::npos);
  CHECK(error(R"({"observation": )" + box + R"(, "action": {"kind": "discrete", "n": 0}, "hidden_sizes": [8]})")
            .find("action.n") != std::string::npos);
  CHECK(error(R"({"observation": )" + box + R"(, "action": )" + discrete + R"(, "hidden_sizes": [8], "x": 1})")
            .find("unknown key 'x'") != std::string::npos);
}

TEST_CASE("LoadPolicy rebuilds the latest checkpoint and reports missing or mismatched files", "[export]") {
  torch::manual_seed(2);
  TempDir tmp;
  const std::string run = tmp.path + "/run";
  fs::create_directories(run);
  const Space obs = Space::Box({3}, {-2.0f}, {2.0f});
  const Space action = Space::Discrete(4);
  FarmConfig config;
  config.env.name = "Debug-v0";
  config.ppo.hidden_sizes = {8, 8};

  ActorCritic policy{nullptr};
  FarmConfig loaded_config;
  TrainingCounters counters;
  std::string ckpt;
  auto load = [&] { return LoadPolicy(run, &policy, &loaded_config, &counters, &ckpt); };

  Status s = load();
  REQUIRE_FALSE(s.ok());
  CHECK(s.message().find("config.yaml") != std::string::npos);

  REQUIRE(WriteFileAtomic(run + "/config.yaml", DumpConfig(config)).ok());
  s = load();
  REQUIRE_FALSE(s.ok());
  CHECK(s.message().find("policy_spec.json") != std::string::npos);

  REQUIRE(WriteFileAtomic(run + "/policy_spec.json", PolicySpecJson(obs, action, {8, 8})).ok());
  s = load();
  REQUIRE_FALSE(s.ok());
  CHECK(s.message().find("checkpoints/latest") != std::string::npos);

  ActorCritic trained(obs, action, std::vector<int>{8, 8});
  torch::optim::Adam optimizer(trained->parameters(), torch::optim::AdamOptions(1e-3));
  TrainingCounters saved;
  saved.env_steps = 12345;
  saved.updates = 7;
  saved.policy_version = 7;
  saved.episodes = 99;
  std::string written;
  REQUIRE(SaveCheckpoint(run + "/checkpoints", trained, optimizer, saved, &written).ok());

  s = load();
  INFO(s.message());
  REQUIRE(s.ok());
  CHECK(ckpt == written);
  CHECK(counters.env_steps == 12345);
  CHECK(counters.updates == 7);
  CHECK(loaded_config.env.name == "Debug-v0");
  CHECK(policy->observation_space() == obs);
  CHECK(policy->action_space() == action);
  auto want = trained->named_parameters();
  for (const auto& item : policy->named_parameters()) CHECK(torch::equal(item.value(), want[item.key()]));

  // A spec that does not describe the checkpoint's policy.
  REQUIRE(WriteFileAtomic(run + "/policy_spec.json", PolicySpecJson(obs, action, {8, 16})).ok());
  s = load();
  REQUIRE_FALSE(s.ok());
  CHECK(s.message().find("shape") != std::string::npos);
  REQUIRE(WriteFileAtomic(run + "/policy_spec.json", PolicySpecJson(obs, action, {8, 8})).ok());

  // latest naming a file that is gone, and a corrupt checkpoint.
  REQUIRE(WriteFileAtomic(run + "/checkpoints/latest", "ckpt-00000999.pt\n").ok());
  s = load();
  REQUIRE_FALSE(s.ok());
  CHECK(s.message().find("ckpt-00000999.pt") != std::string::npos);
  WriteText(run + "/checkpoints/ckpt-00000999.pt", "not a checkpoint");
  s = load();
  REQUIRE_FALSE(s.ok());
  CHECK(s.message().find("cannot read checkpoint") != std::string::npos);
}

TEST_CASE("TorchScript export of a discrete policy gives Act's deterministic actions", "[export]") {
  torch::manual_seed(3);
  ActorCritic policy(Space::Box({3}, {-1.0f}, {1.0f}), Space::Discrete(4), std::vector<int>{16, 16});
  SharpenActor(*policy, 100.0, 0.1);
  TempDir tmp;
  const std::string path = ExportInto(*policy, tmp);

  const torch::Tensor obs = torch::randn({256, 3});
  const torch::Tensor expected = ActMode(*policy, obs);
  const torch::Tensor actual = RunExported(path, obs);
  CHECK(actual.scalar_type() == torch::kInt64);
  REQUIRE(actual.sizes() == expected.sizes());
  CHECK(torch::equal(actual, expected));
  CHECK((expected != expected[0]).any().item<bool>());  // a constant policy would prove little
  // Other input dtypes are converted to float32 as the policy does.
  CHECK(torch::equal(RunExported(path, obs.to(torch::kFloat64)), expected));
}

TEST_CASE("TorchScript export of a Gaussian policy gives the clamped mean", "[export]") {
  torch::manual_seed(4);
  const Space action = Space::Box({2}, {-1.0f}, {1.0f});
  ActorCritic policy(Space::Box({3}, {-5.0f}, {5.0f}), action, std::vector<int>{16, 16});
  SharpenActor(*policy, 200.0, 1.0);
  TempDir tmp;
  const std::string path = ExportInto(*policy, tmp);

  const torch::Tensor obs = torch::randn({256, 3});
  const torch::Tensor mean = ActMode(*policy, obs);
  const torch::Tensor expected = torch::clamp(mean, -1.0, 1.0);
  const torch::Tensor actual = RunExported(path, obs);
  CHECK(actual.scalar_type() == torch::kFloat32);
  REQUIRE(actual.sizes() == expected.sizes());
  INFO("max difference " << (actual - expected).abs().max().item<float>());
  CHECK(torch::allclose(actual, expected, /*rtol=*/0, /*atol=*/1e-6));
  // The test means something only if some means leave the bounds and some stay inside.
  const int64_t clamped = (mean.abs() > 1).sum().item<int64_t>();
  CHECK(clamped > 0);
  CHECK(clamped < mean.numel());
}

}  // namespace farm

namespace farm {

TEST_CASE("TorchScript export of a multi-discrete policy gives each component's argmax", "[export]") {
  torch::manual_seed(5);
  for (const std::vector<int64_t>& nvec : {std::vector<int64_t>{2, 3, 4}, std::vector<int64_t>{3, 3}}) {
    INFO("nvec " << c10::str(nvec));
    ActorCritic policy(Space::Box({3}, {-1.0f}, {1.0f}), Space::MultiDiscrete(nvec), std::vector<int>{16, 16});
    SharpenActor(*policy, 100.0, 0.1);
    TempDir tmp;
    const std::string path = ExportInto(*policy, tmp);
    const torch::Tensor obs = torch::randn({256, 3});
    const torch::Tensor expected = ActMode(*policy, obs);
    REQUIRE(expected.sizes() == torch::IntArrayRef({256, static_cast<int64_t>(nvec.size())}));
    const torch::Tensor actual = RunExported(path, obs);
    CHECK(actual.scalar_type() == torch::kInt64);
    REQUIRE(actual.sizes() == expected.sizes());
    CHECK(torch::equal(actual, expected));
    for (int64_t i = 0; i < static_cast<int64_t>(nvec.size()); ++i) {
      const torch::Tensor column = expected.select(1, i);
      CHECK((column != column[0]).any().item<bool>());  // every component varies with the observation
      CHECK(column.max().item<int64_t>() < nvec[static_cast<std::size_t>(i)]);
    }
  }
}

TEST_CASE("policy_spec.json round-trips a multi-discrete action space and names bad nvec entries", "[export]") {
  const Space obs = Space::Box({3}, {-1.0f}, {1.0f});
  const Space action = Space::MultiDiscrete({2, 5, 3});
  const std::string text = PolicySpecJson(obs, action, {8});
  const auto j = nlohmann::json::parse(text);
  CHECK(j["action"]["kind"] == "multi_discrete");
  CHECK(j["action"]["nvec"] == nlohmann::json::array({2, 5, 3}));
  CHECK(j["action"]["shape"] == nlohmann::json::array({3}));
  Space obs2, action2;
  std::vector<int> hidden;
  REQUIRE(ParsePolicySpecJson(text, "spec", &obs2, &action2, &hidden, nullptr).ok());
  CHECK(action2 == action);
  CHECK(obs2 == obs);
  // Discrete and box specs carry no "nvec" key (files of earlier runs read the same).
  CHECK_FALSE(nlohmann::json::parse(PolicySpecJson(obs, Space::Discrete(3), {8}))["action"].contains("nvec"));

  auto error = [&](const std::string& act) {
    Space o, a;
    std::vector<int> h;
    const std::string spec = R"({"observation": {"kind": "box", "shape": [1], "low": [0], "high": [1]}, "action": )" +
                             act + R"(, "hidden_sizes": [8]})";
    const Status s = ParsePolicySpecJson(spec, "spec", &o, &a, &h, nullptr);
    return s.ok() ? std::string("ok") : s.message();
  };
  CHECK_THAT(error(R"({"kind": "multi_discrete", "nvec": []})"), Catch::Contains("action.nvec"));
  CHECK_THAT(error(R"({"kind": "multi_discrete", "nvec": [2, 0]})"), Catch::Contains("integers > 0"));
  CHECK_THAT(error(R"({"kind": "multi_discrete", "nvec": [2, 2.5]})"), Catch::Contains("action.nvec"));
  CHECK_THAT(error(R"({"kind": "multi_discrete", "shape": [3], "nvec": [2, 2]})"),
             Catch::Contains("action.shape: expected [2]"));
  CHECK_THAT(error(R"({"kind": "multi_discrete", "nvec": [2], "low": [0]})"), Catch::Contains("action.low"));
  CHECK_THAT(error(R"({"kind": "discrete", "n": 2, "nvec": [2]})"), Catch::Contains("only a multi_discrete"));
  CHECK_THAT(error(R"({"kind": "multi", "nvec": [2]})"), Catch::Contains("multi_discrete"));
  CHECK(error(R"({"kind": "multi_discrete", "shape": [2], "n": 0, "nvec": [2, 7], "low": [], "high": []})") == "ok");
}

}  // namespace farm

namespace farm {

// Found in review: the mode taken from the log-softmax rounds near-equal logits together (both become
// -log 2 here) and argmax then picks the lower index, unlike the exported module's argmax of the logits.
TEST_CASE("Act's mode is the argmax of the logits, as the exported module's, on near-ties too", "[export]") {
  torch::manual_seed(6);
  for (const Space& action : {Space::Discrete(2), Space::MultiDiscrete({2, 2})}) {
    INFO(action.ToString());
    ActorCritic policy(Space::Box({3}, {-1.0f}, {1.0f}), action, std::vector<int>{8});
    {
      torch::NoGradGuard no_grad;
      auto params = policy->named_parameters();
      params["actor.2.weight"].zero_();  // logits = the head's bias for every observation
      params["actor.2.bias"].copy_(action.is_discrete() ? torch::tensor({0.0f, 1e-8f})
                                                       : torch::tensor({0.0f, 1e-8f, 1e-8f, 0.0f}));
    }
    TempDir tmp;
    const std::string path = ExportInto(*policy, tmp);
    const torch::Tensor obs = torch::randn({4, 3});
    const torch::Tensor mode = ActMode(*policy, obs);
    const torch::Tensor expected = action.is_discrete() ? torch::ones({4}, torch::kInt64)
                                                        : torch::tensor({1, 0}, torch::kInt64).repeat({4, 1});
    CHECK(torch::equal(mode, expected));
    CHECK(torch::equal(RunExported(path, obs), expected));
  }
}

}  // namespace farm
