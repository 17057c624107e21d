// Encoders written in PyTorch (learner/model/scripted_encoder.h, ppo.actor_encoder_script and
// ppo.critic_encoder_script): TorchScript modules made here as torch.jit.script would make them (a module with
// parameters and a compiled forward). Where the script sits in the policy, the shapes it is refused for, training
// its parameters (PPO, bf16 autocast), CopyFrom, checkpoints, policy_spec.json, LoadPolicy, export, and the
// refusals of the fused and graphed updates and of the config.
#include "learner/model/scripted_encoder.h"

#include <torch/script.h>
#include <torch/torch.h>

#include <filesystem>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/files.h"
#include "learner/model/export.h"
#include "learner/model/policy.h"
#include "learner/model/policy_spec.h"
#include "learner/run/checkpoint.h"
#include "learner/train/ppo.h"
#include "tests/ppo_test_util.h"
#include "tests/temp_dir.h"

// LibTorch includes glog, whose one-argument CHECK would silently replace Catch's: include Catch last.
#undef CHECK
#include <catch2/catch.hpp>

#include "tests/cuda_skip.h"

namespace farm {
namespace {

// Linear(in, out) then tanh on the flattened input, its weight in a submodule ("inner.weight": registered on the
// policy as "inner_weight").
std::string SaveLinearTanh(const std::string& path, int64_t in, int64_t out) {
  torch::jit::Module inner("Inner");
  inner.register_parameter("weight", torch::randn({out, in}) * 0.4, /*is_buffer=*/false);
  inner.define("def forward(self, x):\n    return x\n");
  torch::jit::Module m("LinearTanh");
  m.register_module("inner", inner);
  m.register_parameter("bias", torch::randn({out}) * 0.1, /*is_buffer=*/false);
  m.define(R"(
def forward(self, x):
    x = x.reshape([x.size(0), -1])
    return torch.tanh(torch.addmm(self.bias, x, self.inner.weight.t()))
)");
  m.save(path);
  return path;
}

// A conv on [C, H, W] (3x3, padding 1, `channels` wide), ReLU, flatten: features channels * H * W.
std::string SaveConv(const std::string& path, int64_t in_channels, int64_t channels) {
  torch::jit::Module m("Conv");
  m.register_parameter("weight", torch::randn({channels, in_channels, 3, 3}) * 0.3, false);
  m.register_parameter("bias", torch::zeros({channels}), false);
  m.register_buffer("scale", torch::full({1}, 0.5));
  m.define(R"(
def forward(self, x):
    y = torch.relu(torch.conv2d(x * self.scale, self.weight, self.bias, [1, 1], [1, 1]))
    return y.reshape([y.size(0), -1])
)");
  m.save(path);
  return path;
}

std::string SaveSource(const std::string& path, const std::string& source) {
  torch::jit::Module m("Other");
  m.define(source);
  m.save(path);
  return path;
}

torch::Tensor Named(ActorCritic& policy, const std::string& key) { return policy->named_parameters()[key]; }

}  // namespace

TEST_CASE("a scripted encoder takes the built-in encoder's place: the trunk, heads and critic follow it", "[scripted]") {
  testing::TempDir dir("farm-scripted-test");
  torch::manual_seed(1);
  const Space obs = Space::Box({6}, {-1.f}, {1.f});
  const Space action = Space::Discrete(3);
  PolicyOptions scripted;
  scripted.actor_encoder_script = SaveLinearTanh(dir.path + "/actor.pt", 6, 16);
  scripted.critic_encoder_script = SaveLinearTanh(dir.path + "/critic.pt", 6, 16);
  ActorCritic mlp(obs, action, std::vector<int>{16, 8});
  ActorCritic script(obs, action, std::vector<int>{8}, scripted);
  // The script's parameters and buffers are the policy's, by their names with '.' made '_'.
  const auto params = script->named_parameters();
  REQUIRE(params.contains("actor_encoder.0.inner_weight"));
  REQUIRE(params.contains("critic_encoder.0.bias"));
  CHECK(params["actor_encoder.0.inner_weight"].sizes() == torch::IntArrayRef({16, 6}));
  CHECK(params["actor_encoder.0.inner_weight"].requires_grad());
  // The same network as the mlp policy's first Linear and tanh moved into the script.
  {
    torch::NoGradGuard no_grad;
    for (const std::string net : {"actor", "critic"}) {
      Named(script, net + "_encoder.0.inner_weight").copy_(Named(mlp, net + ".0.weight"));
      Named(script, net + "_encoder.0.bias").copy_(Named(mlp, net + ".0.bias"));
      Named(script, net + ".0.weight").copy_(Named(mlp, net + ".2.weight"));
      Named(script, net + ".0.bias").copy_(Named(mlp, net + ".2.bias"));
      Named(script, net + ".2.weight").copy_(Named(mlp, net + ".4.weight"));
      Named(script, net + ".2.bias").copy_(Named(mlp, net + ".4.bias"));
    }
  }
  const torch::Tensor x = torch::rand({10, 6}) * 2 - 1;
  const torch::Tensor actions = torch::randint(3, {10});
  const EvalOutput a = mlp->Evaluate(x, actions);
  const EvalOutput b = script->Evaluate(x, actions);
  CHECK(testing::RelativeDiff(a.logp, b.logp) < 1e-6);
  CHECK(testing::RelativeDiff(a.value, b.value) < 1e-6);
  // One network scripted, the other built in: the critic keeps the cnn on a global state.
  PolicyOptions mixed;
  mixed.encoder = Encoder::kCnn;
  mixed.global_state = Space::Box({2, 5, 5}, {0.f}, {1.f});
  mixed.actor_encoder_script = scripted.actor_encoder_script;
  ActorCritic m(obs, action, std::vector<int>{8}, mixed);
  CHECK(m->named_parameters().contains("critic_encoder.0.weight"));  // the cnn's first conv
  const ActOutput out = m->Act(x, torch::rand({10, 2, 5, 5}));
  CHECK(out.value.sizes() == torch::IntArrayRef({10}));
}

TEST_CASE("a script whose file, input or output does not fit is refused, naming the key, the file and the shapes",
          "[scripted]") {
  testing::TempDir dir("farm-scripted-test");
  const Space image = Space::Box({3, 4, 4}, {0.f}, {1.f});
  const std::string missing = dir.path + "/missing.pt";
  Status s = CheckEncoderScript(missing, "ppo.actor_encoder_script");
  CHECK_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains("ppo.actor_encoder_script") && Catch::Contains(missing) &&
                              Catch::Contains("not a file"));
  REQUIRE(WriteFileAtomic(dir.path + "/junk.pt", "not a TorchScript archive").ok());
  s = CheckEncoderScript(dir.path + "/junk.pt", "ppo.critic_encoder_script");
  CHECK_THAT(s.message(), Catch::Contains("ppo.critic_encoder_script: cannot load the TorchScript module"));
  const std::string linear = SaveLinearTanh(dir.path + "/linear.pt", 6, 4);
  CHECK(CheckEncoderScript(linear, "k").ok());

  PolicyOptions o;
  o.actor_encoder_script = linear;  // 6 inputs, the observation has 48
  CHECK_THROWS_WITH(ActorCritic(image, Space::Discrete(2), std::vector<int>{8}, o),
                    Catch::Contains("ppo.actor_encoder_script") && Catch::Contains(linear) &&
                        Catch::Contains("cannot take inputs [B, 3, 4, 4]"));
  o.actor_encoder_script = SaveSource(dir.path + "/identity.pt", "def forward(self, x):\n    return x\n");
  CHECK_THROWS_WITH(ActorCritic(image, Space::Discrete(2), std::vector<int>{8}, o),
                    Catch::Contains("maps inputs [2, 3, 4, 4] to Float [2, 3, 4, 4]") &&
                        Catch::Contains("expected floating-point features [2, F]"));
  o.actor_encoder_script =
      SaveSource(dir.path + "/tuple.pt", "def forward(self, x):\n    return x.flatten(1), x.flatten(1)\n");
  CHECK_THROWS_WITH(ActorCritic(image, Space::Discrete(2), std::vector<int>{8}, o),
                    Catch::Contains("returns Tuple, not a tensor of features"));
  o.actor_encoder_script = missing;
  CHECK_THROWS_WITH(ActorCritic(image, Space::Discrete(2), std::vector<int>{8}, o),
                    Catch::Contains("ppo.actor_encoder_script: cannot load"));
  o.actor_encoder_script.clear();
  o.critic_encoder_script = linear;
  CHECK_THROWS_WITH(ActorCritic(image, Space::Discrete(2), std::vector<int>{8}, o),
                    Catch::Contains("ppo.critic_encoder_script") && Catch::Contains("[B, 3, 4, 4]"));
}

TEST_CASE("PPO trains a script's parameters (fp32 and bf16), and CopyFrom and checkpoints carry them", "[scripted]") {
  testing::TempDir dir("farm-scripted-test");
  const Space image = Space::Box({2, 5, 5}, {0.f}, {1.f});
  PolicyOptions o;
  o.actor_encoder_script = SaveConv(dir.path + "/actor.pt", 2, 4);
  o.critic_encoder_script = SaveConv(dir.path + "/critic.pt", 2, 3);
  for (const Precision precision : {Precision::kFp32, Precision::kBf16}) {
    INFO(PrecisionName(precision));
    torch::manual_seed(4);
    ActorCritic policy(image, Space::Discrete(3), std::vector<int>{16}, o);
    const torch::Tensor before = Named(policy, "actor_encoder.0.weight").detach().clone();
    const Rollout r = testing::ActedRollout(policy, torch::rand({8 * 4, 2, 5, 5}), {}, 8, 4);
    PpoConfig config;
    config.num_minibatches = 2;
    config.update_epochs = 2;
    config.fused_update = "auto";  // falls back: the fused update runs no script
    PpoTrainer trainer(policy, config, 1, precision);
    CHECK_FALSE(trainer.fused());
    const PpoStats stats = trainer.Update(r, 0);
    CHECK(std::isfinite(stats.policy_loss));
    CHECK(stats.approx_kl > 0);
    const torch::Tensor after = Named(policy, "actor_encoder.0.weight");
    CHECK((after - before).abs().max().item<double>() > 0);
    ActorCritic fresh(image, Space::Discrete(3), std::vector<int>{16}, o);  // the critic's script as loaded
    CHECK((Named(policy, "critic_encoder.0.weight") - Named(fresh, "critic_encoder.0.weight")).abs().max().item<double>() >
          0);
    // The script runs on the trained tensors themselves.
    auto* scripted = policy->actor_encoder()->ptr(0)->as<ScriptedEncoderImpl>();
    REQUIRE(scripted != nullptr);
    CHECK(scripted->script().attr("weight").toTensor().is_same(after));
    CHECK(policy->named_buffers().contains("actor_encoder.0.scale"));

    // CopyFrom into a policy built from the same files, and a checkpoint into a third.
    ActorCritic copy(image, Space::Discrete(3), std::vector<int>{16}, o);
    copy->CopyFrom(*policy);
    CHECK(torch::equal(testing::FlatParameters(copy), testing::FlatParameters(policy)));
    const torch::Tensor x = torch::rand({6, 2, 5, 5});
    CHECK(torch::equal(copy->Act(x, true).action, policy->Act(x, true).action));
    torch::optim::Adam optimizer(policy->parameters(), torch::optim::AdamOptions(1e-3));
    TrainingCounters counters;
    std::string written;
    REQUIRE(SaveCheckpoint(dir.path + "/ckpt", policy, optimizer, counters, &written).ok());
    ActorCritic restored(image, Space::Discrete(3), std::vector<int>{16}, o);
    CHECK_FALSE(torch::equal(testing::FlatParameters(restored), testing::FlatParameters(policy)));
    TrainingCounters loaded;
    REQUIRE(LoadCheckpoint(written, restored, nullptr, &loaded).ok());
    CHECK(torch::equal(testing::FlatParameters(restored), testing::FlatParameters(policy)));
    CHECK(torch::equal(restored->Act(x, true).action, policy->Act(x, true).action));
  }
}

TEST_CASE("policy_spec.json names the run's copies of the scripts, from which LoadPolicy and export rebuild the policy",
          "[scripted]") {
  testing::TempDir dir("farm-scripted-test");
  const std::string run = dir.path + "/run";
  std::filesystem::create_directories(run);
  const Space image = Space::Box({2, 5, 5}, {0.f}, {1.f});
  const Space action = Space::Discrete(4);
  for (const CoreKind core : {CoreKind::kNone, CoreKind::kGru}) {
    INFO(CoreName(core));
    PolicyOptions o;
    o.actor_encoder_script = SaveConv(dir.path + "/actor.pt", 2, 4);
    o.critic_encoder_script = SaveConv(dir.path + "/critic.pt", 2, 3);
    o.core = core;
    o.core_size = 8;
    torch::manual_seed(6);
    ActorCritic policy(image, action, std::vector<int>{16}, o);
    {  // large logits: argmaxes well apart
      torch::NoGradGuard no_grad;
      for (auto& p : policy->named_parameters())
        if (p.key().rfind("actor.", 0) == 0) p.value().mul_(50);
    }
    const std::string spec = PolicySpecJson(image, action, {16}, o);
    CHECK_THAT(spec, Catch::Contains("\"actor_encoder_script\": \"actor_encoder.pt\"") &&
                         Catch::Contains("\"critic_encoder_script\": \"critic_encoder.pt\""));
    Space parsed_obs, parsed_action;
    std::vector<int> hidden;
    PolicyOptions parsed;
    REQUIRE(ParsePolicySpecJson(spec, "spec.json", &parsed_obs, &parsed_action, &hidden, &parsed).ok());
    CHECK(parsed.actor_encoder_script == "actor_encoder.pt");
    CHECK_THAT(ParsePolicySpecJson(spec, "spec.json", &parsed_obs, &parsed_action, &hidden).message(),
               Catch::Contains("a TorchScript encoder"));
    CHECK_THAT(ParsePolicySpecJson(R"({"observation": {"kind": "box", "shape": [1], "low": [0], "high": [1]},
                                       "action": {"kind": "discrete", "n": 2}, "hidden_sizes": [4],
                                       "actor_encoder_script": 3})",
                                   "spec.json", &parsed_obs, &parsed_action, &hidden, &parsed)
                   .message(),
               Catch::Contains("spec.json: actor_encoder_script: expected the file name of a TorchScript encoder"));

    FarmConfig config;
    REQUIRE(WriteFileAtomic(run + "/config.yaml", DumpConfig(config)).ok());
    REQUIRE(WriteFileAtomic(run + "/policy_spec.json", spec).ok());
    REQUIRE(CopyEncoderScript(o.actor_encoder_script, run + "/" + kActorEncoderScriptFile).ok());
    REQUIRE(CopyEncoderScript(o.critic_encoder_script, run + "/" + kCriticEncoderScriptFile).ok());
    torch::optim::Adam optimizer(policy->parameters(), torch::optim::AdamOptions(1e-3));
    TrainingCounters counters;
    REQUIRE(SaveCheckpoint(run + "/checkpoints", policy, optimizer, counters).ok());
    // The originals gone: the run directory's copies are what rebuilds the policy.
    std::filesystem::remove(o.actor_encoder_script);
    std::filesystem::remove(o.critic_encoder_script);
    ActorCritic loaded{nullptr};
    FarmConfig loaded_config;
    const Status s = LoadPolicy(run, &loaded, &loaded_config, nullptr, nullptr);
    INFO(s.message());
    REQUIRE(s.ok());
    CHECK(loaded->options().actor_encoder_script == run + "/actor_encoder.pt");
    CHECK(torch::equal(testing::FlatParameters(loaded), testing::FlatParameters(policy)));

    // Export: the script is a submodule of the module, which acts as the policy does.
    const std::string path = dir.path + "/policy.pt";
    const Status e = ExportTorchScript(*loaded, path);
    INFO(e.message());
    REQUIRE(e.ok());
    torch::jit::Module module = torch::jit::load(path);
    c10::InferenceMode guard;
    const torch::Tensor x = torch::rand({12, 2, 5, 5});
    if (core == CoreKind::kNone) {
      CHECK(torch::equal(module.forward({x}).toTensor(), policy->Act(x, true).action));
    } else {
      const torch::Tensor state = torch::zeros({12, policy->core_state_size()});
      const auto out = module.forward({x, module.run_method("initial_state", 12)}).toTuple();
      const ActOutput act = policy->Act(x, {}, true, false, {}, state);
      CHECK(torch::equal(out->elements()[0].toTensor(), act.action));
    }
    // Not std::filesystem::remove_all: PyTorch 2.11's wheel exports a broken one from libtorch.so (see RemoveTree).
    REQUIRE(RemoveTree(run + "/checkpoints").ok());
  }
}

TEST_CASE("the fused and graphed updates and CUDA-graph acting refuse a script by name, and the config takes the keys",
          "[scripted]") {
  testing::TempDir dir("farm-scripted-test");
  const Space obs = Space::Box({4}, {-1.f}, {1.f});
  PolicyOptions o;
  o.critic_encoder_script = SaveLinearTanh(dir.path + "/critic.pt", 4, 8);
  ActorCritic policy(obs, Space::Discrete(2), std::vector<int>{8}, o);
  PpoConfig config;
  config.fused_update = "on";
  CHECK_THROWS_WITH(PpoTrainer(policy, config, 1), Catch::Contains("cannot run a TorchScript encoder"));
  config.fused_update = "off";
  config.graph_update = "on";
  CHECK_THROWS_WITH(PpoTrainer(policy, config, 1), Catch::Contains("does not capture a TorchScript encoder"));

  FarmConfig c;
  REQUIRE(ParseConfig("ppo:\n  actor_encoder_script: a.pt\n  critic_encoder_script: b.pt\n", "t", &c).ok());
  CHECK(c.ppo.actor_encoder_script == "a.pt");
  CHECK(c.ppo.critic_encoder_script == "b.pt");
  CHECK(ValidateConfig(c).ok());  // the files are the learner's to check (workers elsewhere have none)
  FarmConfig fused = c;
  fused.ppo.fused_update = "on";
  fused.learner.device = "cpu";
  CHECK_THAT(ValidateConfig(fused).message(), Catch::Contains("ppo.fused_update=on cannot run a TorchScript encoder"));
  FarmConfig graphs = c;
  graphs.learner.cuda_graphs = true;
  CHECK_THAT(ValidateConfig(graphs).message(),
             Catch::Contains("learner.cuda_graphs does not capture a TorchScript encoder (ppo.actor_encoder_script is "
                             "'a.pt')"));
}

TEST_CASE("a script's activations per row are what autograd records of its forward, for the memory estimate",
          "[scripted]") {
  testing::TempDir dir("farm-scripted-test");
  // A conv of 4 channels on [2, 5, 5]: the conv's and the ReLU's outputs, 100 floats each per row (the reshape is
  // a view; the input's scaling records nothing; the weight's transpose is the same for any batch).
  ScriptedEncoder conv(SaveConv(dir.path + "/conv.pt", 2, 4), Space::Box({2, 5, 5}, {0.f}, {1.f}), "key");
  CHECK(conv->features() == 100);
  CHECK(conv->activation_floats() == 200);
  // Linear to 8 then tanh: addmm's and tanh's outputs (the bias broadcast to the batch is a view).
  ScriptedEncoder linear(SaveLinearTanh(dir.path + "/linear.pt", 4, 8), Space::Box({4}, {-1.f}, {1.f}), "key");
  CHECK(linear->activation_floats() == 16);
  // A script that records nothing (no parameters) still counts its output.
  ScriptedEncoder none(SaveSource(dir.path + "/none.pt", "def forward(self, x):\n    return x * 2.0\n"),
                       Space::Box({3}, {-1.f}, {1.f}), "key");
  CHECK(none->activation_floats() == 3);
  // Probing left the script's mode as training.
  CHECK(conv->script().is_training());
}

#ifdef FARM_WITH_CUDA

// Issue 31 on the GPU: the script's parameters move with the policy, it acts as on the CPU, PPO trains it in each
// precision, and its checkpoint loads into a CPU policy.
TEST_CASE("CUDA: a scripted encoder acts on the GPU as on the CPU, trains in fp32, fp16 and bf16, and checkpoints",
          "[scripted][cuda]") {
  FARM_SKIP_WITHOUT_CUDA();
  const torch::Device cuda(torch::kCUDA, 0);
  // Exact fp32 on both sides (no TF32 in the convolution or the matrix products) for the comparison.
  auto& context = at::globalContext();
  const bool tf32_cudnn = context.allowTF32CuDNN(), tf32_cublas = context.allowTF32CuBLAS();
  context.setAllowTF32CuDNN(false);
  context.setAllowTF32CuBLAS(false);
  testing::TempDir dir("farm-scripted-cuda-test");
  const Space image = Space::Box({2, 5, 5}, {0.f}, {1.f});
  PolicyOptions o;
  o.actor_encoder_script = SaveConv(dir.path + "/actor.pt", 2, 4);
  o.critic_encoder_script = SaveConv(dir.path + "/critic.pt", 2, 3);
  torch::manual_seed(4);
  ActorCritic cpu(image, Space::Discrete(3), std::vector<int>{16}, o);
  ActorCritic gpu(image, Space::Discrete(3), std::vector<int>{16}, o);
  gpu->CopyFrom(*cpu);
  gpu->to(cuda);
  auto* scripted = gpu->actor_encoder()->ptr(0)->as<ScriptedEncoderImpl>();
  REQUIRE(scripted != nullptr);
  CHECK(scripted->script().attr("weight").toTensor().device() == cuda);
  CHECK(gpu->named_buffers()["actor_encoder.0.scale"].device() == cuda);
  const torch::Tensor x = torch::rand({6, 2, 5, 5});
  {
    torch::NoGradGuard no_grad;
    const ActOutput h = cpu->Act(x, true);
    const ActOutput d = gpu->Act(x.to(cuda), true);
    CHECK(torch::equal(d.action.cpu(), h.action));
    CHECK(torch::allclose(d.logp.cpu(), h.logp, 1e-4, 1e-4));
    CHECK(torch::allclose(d.value.cpu(), h.value, 1e-4, 1e-4));
  }
  context.setAllowTF32CuDNN(tf32_cudnn);
  context.setAllowTF32CuBLAS(tf32_cublas);

  for (const Precision precision : {Precision::kFp32, Precision::kFp16, Precision::kBf16}) {
    INFO(PrecisionName(precision));
    torch::manual_seed(4);
    ActorCritic policy(image, Space::Discrete(3), std::vector<int>{16}, o);
    policy->to(cuda);
    const torch::Tensor before = Named(policy, "actor_encoder.0.weight").detach().cpu().clone();
    const Rollout r = testing::ActedRollout(policy, torch::rand({8 * 4, 2, 5, 5}), {}, 8, 4, cuda);
    PpoConfig config;
    config.num_minibatches = 2;
    config.update_epochs = 2;
    PpoTrainer trainer(policy, config, 1, precision);
    // fp16's first step may be skipped (the initial loss scale overflows, as GradScaler's does): two updates.
    PpoStats stats;
    for (int i = 0; i < 2; ++i) stats = trainer.Update(r, 0);
    CHECK(std::isfinite(stats.policy_loss));
    CHECK(std::isfinite(stats.value_loss));
    CHECK(stats.approx_kl > 0);
    const torch::Tensor after = Named(policy, "actor_encoder.0.weight");
    CHECK(after.device() == cuda);
    CHECK((after.detach().cpu() - before).abs().max().item<double>() > 0);
    auto* trained = policy->actor_encoder()->ptr(0)->as<ScriptedEncoderImpl>();
    REQUIRE(trained != nullptr);
    CHECK(trained->script().attr("weight").toTensor().is_same(after));

    // Its checkpoint, written from the GPU, loads into a policy built from the same files (farm-eval's LoadPolicy
    // maps it to the CPU; a resume keeps the device it was written on).
    torch::optim::Adam optimizer(policy->parameters(), torch::optim::AdamOptions(1e-3));
    TrainingCounters counters;
    std::string written;
    REQUIRE(SaveCheckpoint(dir.path + "/ckpt-" + PrecisionName(precision), policy, optimizer, counters, &written).ok());
    ActorCritic restored(image, Space::Discrete(3), std::vector<int>{16}, o);
    TrainingCounters loaded;
    REQUIRE(LoadCheckpoint(written, restored, nullptr, &loaded).ok());
    CHECK(torch::equal(testing::FlatParameters(restored).cpu(), testing::FlatParameters(policy).cpu()));
  }
}

#endif  // FARM_WITH_CUDA

}  // namespace farm
