// Encoders from the config (learner/model/encoder.h): ppo.encoder conv and impala, ppo.activation,
// ppo.layer_norm. The config keys and their refusals, the shapes and their refusals, the networks they build,
// policy_spec.json, TorchScript export against Act, the fused update's refusal, and a PPO update through each.
#include "learner/model/encoder.h"

#include <nlohmann/json.hpp>
#include <torch/script.h>
#include <torch/torch.h>

#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include "common/config.h"
#include "learner/model/export.h"
#include "learner/model/policy.h"
#include "learner/model/policy_spec.h"
#include "learner/train/ppo.h"
#include "tests/ppo_test_util.h"
#include "tests/temp_dir.h"

// LibTorch includes glog, whose one-argument CHECK would silently replace Catch's: include Catch last.
#undef CHECK
#include <catch2/catch.hpp>

namespace farm {

// For Catch's messages.
std::ostream& operator<<(std::ostream& out, const ConvLayerSpec& c) {
  return out << "{" << c.channels << ", " << c.kernel << ", " << c.stride << ", " << c.padding << "}";
}

namespace {

const Space kImage = Space::Box({3, 9, 9}, {0.f}, {1.f});

PolicyOptions ConvOptions() {
  PolicyOptions o;
  o.encoder = Encoder::kConv;
  o.layout.conv = {{8, 3, 1, 1}, {16, 3, 2, 0}};
  o.layout.activation = Activation::kElu;
  return o;
}

PolicyOptions ImpalaOptions(std::vector<int64_t> channels = {4, 8}) {
  PolicyOptions o;
  o.encoder = Encoder::kImpala;
  o.layout.impala_channels = std::move(channels);
  return o;
}

int Count(const torch::nn::Module& m, const std::string& name) {
  int n = 0;
  for (const auto& child : m.modules(/*include_self=*/false))
    if (child->name() == name) ++n;
  return n;
}

}  // namespace

TEST_CASE("the config takes the encoder keys and refuses bad ones by name", "[encoder]") {
  FarmConfig c;
  REQUIRE(ParseConfig("ppo:\n  encoder: conv\n  conv:\n    - {channels: 32, kernel: 5, stride: 2, padding: 2}\n"
                      "    - {channels: 64}\n  activation: relu\n  layer_norm: true\n  impala_channels: [8, 16]\n",
                      "t", &c)
              .ok());
  REQUIRE(c.ppo.conv.size() == 2);
  CHECK(c.ppo.conv[0].channels == 32);
  CHECK(c.ppo.conv[0].kernel == 5);
  CHECK(c.ppo.conv[0].stride == 2);
  CHECK(c.ppo.conv[0].padding == 2);
  CHECK(c.ppo.conv[1].kernel == 3);  // the defaults: kernel 3, stride 1, padding 0
  CHECK(c.ppo.conv[1].stride == 1);
  CHECK(c.ppo.conv[1].padding == 0);
  CHECK(c.ppo.activation == "relu");
  CHECK(c.ppo.layer_norm);
  CHECK(c.ppo.impala_channels == std::vector<int>{8, 16});
  CHECK(ValidateConfig(c).ok());
  // The dump reads back to the same layers.
  FarmConfig again;
  REQUIRE(ParseConfig(DumpConfig(c), "dump", &again).ok());
  REQUIRE(again.ppo.conv.size() == 2);
  CHECK(again.ppo.conv[0].kernel == 5);
  CHECK(again.ppo.conv[1].channels == 64);

  FarmConfig bad;
  CHECK_THAT(ParseConfig("ppo:\n  activation: gelu\n", "t", &bad).message(), Catch::Contains("ppo.activation"));
  CHECK_THAT(ParseConfig("ppo:\n  conv: [{channels: 0}]\n", "t", &bad).message(),
             Catch::Contains("ppo.conv[0].channels"));
  CHECK_THAT(ParseConfig("ppo:\n  conv: [{channels: 8, size: 3}]\n", "t", &bad).message(),
             Catch::Contains("ppo.conv[0].size: unknown key"));
  CHECK_THAT(ParseConfig("ppo:\n  encoder: resnet\n", "t", &bad).message(), Catch::Contains("ppo.encoder"));
  FarmConfig empty;
  empty.ppo.encoder = "conv";
  CHECK_THAT(ValidateConfig(empty).message(), Catch::Contains("ppo.encoder=conv needs ppo.conv"));
  FarmConfig fused;
  fused.learner.device = "cpu";
  fused.ppo.fused_update = "on";
  fused.ppo.activation = "silu";
  CHECK_THAT(ValidateConfig(fused).message(), Catch::Contains("ppo.activation=tanh"));
}

TEST_CASE("image encoders' shapes, and the inputs and layers they refuse by key, shape and why", "[encoder]") {
  std::vector<std::vector<int64_t>> shapes;
  // The seeds' maps: [7, 50, 50] through conv 8x8 stride 4, 4x4 stride 2, 3x3 stride 1 (the Nature DQN stack).
  EncoderLayout nature;
  nature.conv = {{32, 8, 4, 0}, {64, 4, 2, 0}, {64, 3, 1, 0}};
  const Space maps = Space::Box({7, 50, 50}, {0.f}, {1.f});
  REQUIRE(ImageEncoderShapes(Encoder::kConv, nature, maps, "observation", &shapes).ok());
  CHECK(shapes == std::vector<std::vector<int64_t>>{{32, 11, 11}, {64, 4, 4}, {64, 2, 2}});
  REQUIRE(ImageEncoderShapes(Encoder::kImpala, EncoderLayout{}, maps, "observation", &shapes).ok());
  CHECK(shapes.back() == std::vector<int64_t>{32, 7, 7});  // 50 -> 25 -> 13 -> 7
  REQUIRE(ImageEncoderShapes(Encoder::kCnn, EncoderLayout{}, maps, "observation", &shapes).ok());
  CHECK(shapes.back() == std::vector<int64_t>{64, 25, 25});

  // A stack that leaves nothing: named by its layer, with the shape it got.
  EncoderLayout deep = nature;
  deep.conv.push_back({64, 3, 1, 0});
  const Status s = ImageEncoderShapes(Encoder::kConv, deep, maps, "observation", &shapes);
  CHECK_THAT(s.message(), Catch::Contains("ppo.conv[3]") && Catch::Contains("[64, 2, 2]") &&
                              Catch::Contains("nothing would be left"));
  // A flat input.
  CHECK_THAT(ImageEncoderShapes(Encoder::kImpala, EncoderLayout{}, Space::Box({4}, {0.f}, {1.f}), "global state",
                                &shapes)
                 .message(),
             Catch::Contains("ppo.encoder impala needs a [C, H, W] global state"));
  EncoderLayout none;
  CHECK_THAT(ImageEncoderShapes(Encoder::kConv, none, maps, "observation", &shapes).message(),
             Catch::Contains("ppo.conv: the conv encoder needs at least one layer"));
  // ActorCritic refuses the same with the same words.
  PolicyOptions o = ConvOptions();
  o.layout.conv = deep.conv;
  CHECK_THROWS_WITH(ActorCritic(maps, Space::Discrete(3), std::vector<int>{32}, o), Catch::Contains("ppo.conv[3]"));
}

TEST_CASE("impala starts with its residual stream at the input's scale and its tanh trunk unsaturated", "[encoder]") {
  // uav_coverage's global state and view, sparse 0/1 maps as its are; the trunk is the default one (tanh). With
  // orthogonal gain sqrt(2) on every conv (before 2026-11-29) the features' mean was 10.4, 4.7 and 1.5 in these
  // three cases and 91%, 84% and 44% of the trunk's outputs were saturated (|tanh| > 0.99); now 0.29-0.41 and
  // under 1%.
  torch::manual_seed(3);
  struct Case {
    std::vector<int64_t> shape;
    std::vector<int64_t> stages;
  };
  for (const Case& c : {Case{{3, 32, 32}, {16, 32, 32}}, Case{{3, 32, 32}, {16, 32}}, Case{{5, 7, 7}, {16, 32}}}) {
    INFO("input [" << c.shape[0] << ", " << c.shape[1] << ", " << c.shape[2] << "], " << c.stages.size()
                   << " stages");
    EncoderLayout layout;
    layout.impala_channels = c.stages;
    const Space input = Space::Box(c.shape, {0.f}, {1.f});
    torch::nn::Sequential encoder = ImageEncoder(Encoder::kImpala, layout, input, 128, "global state");
    torch::nn::Sequential trunk;
    AppendTrunk(trunk, 128, {128}, layout);
    std::vector<int64_t> batch{512};
    batch.insert(batch.end(), c.shape.begin(), c.shape.end());
    torch::NoGradGuard no_grad;
    const torch::Tensor x = (torch::rand(batch) < 0.2).to(torch::kFloat32);
    const torch::Tensor features = encoder->forward(x);
    const torch::Tensor out = trunk->forward(features);
    CHECK(features.mean().item<double>() < 1.0);
    CHECK(features.std(0).mean().item<double>() > 0.02);  // the rows still differ
    CHECK((out.abs() > 0.99).to(torch::kFloat32).mean().item<double>() < 0.05);
    for (const auto& child : encoder->children()) {
      if (auto* block = child->as<ImpalaResidualImpl>()) {
        const torch::Tensor y = torch::randn({4, block->conv0->options.in_channels(), 5, 5});
        CHECK(torch::equal(block->forward(y), y));  // every block starts as the identity
      }
    }
  }
}

TEST_CASE("conv and impala encoders and the trunk's activation and layer norm build the networks they say",
          "[encoder]") {
  torch::manual_seed(1);
  PolicyOptions conv = ConvOptions();
  conv.layout.layer_norm = true;
  ActorCritic a(kImage, Space::Discrete(4), std::vector<int>{32, 16}, conv);
  auto params = a->named_parameters();
  CHECK(params["actor_encoder.0.weight"].sizes() == torch::IntArrayRef({8, 3, 3, 3}));
  CHECK(params["actor_encoder.2.weight"].sizes() == torch::IntArrayRef({16, 8, 3, 3}));
  CHECK(params["actor_encoder.5.weight"].sizes() == torch::IntArrayRef({32, 16 * 4 * 4}));  // 9 -> 9 -> 4
  CHECK(Count(*a, "torch::nn::ELUImpl") == 2 * 4);  // per network: two convs, the encoder's Linear, one hidden
  CHECK(Count(*a, "torch::nn::LayerNormImpl") == 2);  // the trunk's one hidden Linear, in each network
  CHECK(Count(*a, "torch::nn::TanhImpl") == 0);

  ActorCritic b(kImage, Space::Discrete(4), std::vector<int>{32}, ImpalaOptions());
  CHECK(Count(*b, "farm::ImpalaResidualImpl") == 2 * 4);  // two stages of two blocks, in each network
  CHECK(Count(*b, "torch::nn::MaxPool2dImpl") == 2 * 2);
  // 9 -> 5 -> 3: the Linear reads 8 x 3 x 3.
  CHECK(b->named_parameters()["actor_encoder.10.weight"].sizes() == torch::IntArrayRef({32, 8 * 3 * 3}));

  PolicyOptions relu;
  relu.layout.activation = Activation::kRelu;
  ActorCritic c(Space::Box({5}, {-1.f}, {1.f}), Space::Discrete(2), std::vector<int>{16, 16}, relu);
  CHECK(Count(*c, "torch::nn::ReLUImpl") == 4);
  CHECK(Count(*c, "torch::nn::TanhImpl") == 0);

  // Every one acts and evaluates, and gradients reach the encoder's first layer.
  for (ActorCritic* p : {&a, &b}) {
    const torch::Tensor obs = torch::rand({6, 3, 9, 9});
    const ActOutput out = (*p)->Act(obs);
    CHECK(out.action.sizes() == torch::IntArrayRef({6}));
    CHECK(out.value.sizes() == torch::IntArrayRef({6}));
    const EvalOutput eval = (*p)->Evaluate(obs, out.action);
    (eval.logp.sum() + eval.value.sum()).backward();
    CHECK((*p)->named_parameters()["actor_encoder.0.weight"].grad().abs().sum().item<double>() > 0);
    CHECK((*p)->named_parameters()["critic_encoder.0.weight"].grad().abs().sum().item<double>() > 0);
  }
}

TEST_CASE("policy_spec.json carries the encoder's layout, and refuses a broken one by key", "[encoder]") {
  PolicyOptions o = ConvOptions();
  o.layout.layer_norm = true;
  const std::string text = PolicySpecJson(kImage, Space::Discrete(4), {32}, o);
  Space obs, action;
  std::vector<int> hidden;
  PolicyOptions back;
  REQUIRE(ParsePolicySpecJson(text, "spec", &obs, &action, &hidden, &back).ok());
  CHECK(back.encoder == Encoder::kConv);
  CHECK(back.layout.conv == o.layout.conv);
  CHECK(back.layout.activation == Activation::kElu);
  CHECK(back.layout.layer_norm);

  const PolicyOptions impala = ImpalaOptions({16, 32});
  REQUIRE(ParsePolicySpecJson(PolicySpecJson(kImage, Space::Discrete(4), {32}, impala), "spec", &obs, &action,
                              &hidden, &back)
              .ok());
  CHECK(back.encoder == Encoder::kImpala);
  CHECK(back.layout.impala_channels == std::vector<int64_t>{16, 32});
  CHECK(back.layout.activation == Activation::kTanh);
  CHECK_FALSE(back.layout.layer_norm);

  nlohmann::json j = nlohmann::json::parse(text);
  j.erase("conv");
  CHECK_THAT(ParsePolicySpecJson(j.dump(), "spec", &obs, &action, &hidden, &back).message(),
             Catch::Contains("spec: conv: the conv encoder needs its layers"));
  j["conv"] = nlohmann::json::parse(R"([{"channels": 8, "kernel": 3}])");
  CHECK_THAT(ParsePolicySpecJson(j.dump(), "spec", &obs, &action, &hidden, &back).message(),
             Catch::Contains("spec: conv: expected an array of"));
  j = nlohmann::json::parse(text);
  j["activation"] = "gelu";
  CHECK_THAT(ParsePolicySpecJson(j.dump(), "spec", &obs, &action, &hidden, &back).message(),
             Catch::Contains("expected tanh, relu, elu or silu, got 'gelu'"));
  // A caller that can rebuild only the tanh mlp says why it cannot.
  PolicyOptions relu;
  relu.layout.activation = Activation::kRelu;
  CHECK_THAT(ParsePolicySpecJson(PolicySpecJson(Space::Box({3}, {0.f}, {1.f}), Space::Discrete(2), {8}, relu), "s",
                                 &obs, &action, &hidden)
                 .message(),
             Catch::Contains("a relu trunk"));
}

TEST_CASE("the exported module acts as the policy does, whatever the encoder, activation and core", "[encoder]") {
  testing::TempDir dir("farm-encoder-test");
  struct Case {
    const char* name;
    Space obs;
    PolicyOptions options;
  };
  PolicyOptions silu_gru;
  silu_gru.layout.activation = Activation::kSilu;
  silu_gru.layout.layer_norm = true;
  silu_gru.core = CoreKind::kGru;
  silu_gru.core_size = 8;
  PolicyOptions impala_lstm = ImpalaOptions();
  impala_lstm.core = CoreKind::kLstm;
  impala_lstm.core_size = 8;
  PolicyOptions conv_ln = ConvOptions();
  conv_ln.layout.layer_norm = true;
  PolicyOptions cnn_gru;
  cnn_gru.encoder = Encoder::kCnn;
  cnn_gru.core = CoreKind::kGru;
  cnn_gru.core_size = 8;
  const std::vector<Case> cases{{"conv elu layer norm", kImage, conv_ln},
                                {"impala", kImage, ImpalaOptions()},
                                {"impala lstm", kImage, impala_lstm},
                                {"cnn gru (refused before)", kImage, cnn_gru},
                                {"silu layer norm gru", Space::Box({6}, {-1.f}, {1.f}), silu_gru}};
  for (const Case& c : cases) {
    INFO(c.name);
    torch::manual_seed(3);
    ActorCritic policy(c.obs, Space::Discrete(5), std::vector<int>{16, 16}, c.options);
    {  // large logits: argmaxes well apart
      torch::NoGradGuard no_grad;
      for (auto& p : policy->named_parameters())
        if (p.key().rfind("actor.", 0) == 0) p.value().mul_(50);
    }
    const std::string path = dir.path + "/policy.pt";
    const Status s = ExportTorchScript(*policy, path);
    INFO(s.message());
    REQUIRE(s.ok());
    torch::jit::Module module = torch::jit::load(path);
    std::vector<int64_t> shape{12};
    shape.insert(shape.end(), c.obs.shape.begin(), c.obs.shape.end());
    c10::InferenceMode guard;
    torch::Tensor state = policy->has_core() ? torch::zeros({12, policy->core_state_size()}) : torch::Tensor();
    torch::Tensor exported_state =
        policy->has_core() ? module.run_method("initial_state", 12).toTensor() : torch::Tensor();
    for (int step = 0; step < 3; ++step) {  // with a core, the state carries over the steps
      const torch::Tensor obs = torch::rand(shape) * 2 - 0.5;
      const ActOutput act = policy->Act(obs, {}, /*deterministic=*/true, /*with_value=*/false, {}, state);
      torch::Tensor action;
      if (policy->has_core()) {
        const auto out = module.forward({obs, exported_state}).toTuple();
        action = out->elements()[0].toTensor();
        exported_state = out->elements()[1].toTensor();
        state = act.core_state;
        CHECK(testing::RelativeDiff(exported_state, state.narrow(1, 0, exported_state.size(1))) < 1e-4);
      } else {
        action = module.forward({obs}).toTensor();
      }
      CHECK(torch::equal(action, act.action));
    }
  }
}

TEST_CASE("the fused update refuses another activation or layer norm by name, and auto falls back", "[encoder]") {
  const Space obs = Space::Box({4}, {-1.f}, {1.f});
  for (bool layer_norm : {false, true}) {
    PolicyOptions o;
    o.layout.activation = layer_norm ? Activation::kTanh : Activation::kRelu;
    o.layout.layer_norm = layer_norm;
    ActorCritic policy(obs, Space::Discrete(2), std::vector<int>{8}, o);
    PpoConfig config;
    config.fused_update = "on";
    CHECK_THROWS_WITH(PpoTrainer(policy, config, 1),
                      Catch::Contains(layer_norm ? "no layer norm (ppo.layer_norm is true)"
                                                 : "only tanh (ppo.activation is relu)"));
    config.fused_update = "auto";
    CHECK_FALSE(PpoTrainer(policy, config, 1).fused());
  }
}

TEST_CASE("a PPO update trains through conv, impala and a layer-normed relu trunk", "[encoder]") {
  PolicyOptions relu_ln;
  relu_ln.layout.activation = Activation::kRelu;
  relu_ln.layout.layer_norm = true;
  for (const PolicyOptions& o : {ConvOptions(), ImpalaOptions(), relu_ln}) {
    INFO(EncoderName(o.encoder));
    torch::manual_seed(5);
    const Space space = IsImageEncoder(o.encoder) ? kImage : Space::Box({6}, {-1.f}, {1.f});
    ActorCritic policy(space, Space::Discrete(3), std::vector<int>{16}, o);
    std::vector<int64_t> shape{8 * 4};
    shape.insert(shape.end(), space.shape.begin(), space.shape.end());
    const Rollout r = testing::ActedRollout(policy, torch::rand(shape), {}, 8, 4);
    const torch::Tensor before = testing::FlatParameters(policy);
    PpoConfig config;
    config.num_minibatches = 2;
    config.update_epochs = 2;
    PpoTrainer trainer(policy, config, 1);
    const PpoStats stats = trainer.Update(r, 0);
    CHECK(std::isfinite(stats.policy_loss));
    CHECK(std::isfinite(stats.value_loss));
    CHECK(stats.approx_kl > 0);
    CHECK((testing::FlatParameters(policy) - before).abs().max().item<double>() > 0);
  }
}

}  // namespace farm
