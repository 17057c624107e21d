// TorchScript export: the actor's weights become parameters of a scripted module whose forward is written in
// TorchScript source, so the saved file needs nothing from this code base to run.
#include "learner/model/export.h"

#include "common/files.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/script.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>

namespace farm {
namespace {

struct Layer {
  torch::Tensor weight;  // [out, in]
  torch::Tensor bias;    // [out]
};

// The layers with weights of one Sequential in order, from parameter names "<prefix><index>.weight|bias"
// (prefix "actor." for the MLP, "actor_encoder." for the cnn encoder).
Status SequentialLayers(ActorCriticImpl& policy, const std::string& prefix, std::vector<Layer>* out) {
  std::map<int, Layer> by_index;
  for (const auto& item : policy.named_parameters()) {
    const std::string& key = item.key();
    if (key.rfind(prefix, 0) != 0) continue;
    const auto dot = key.find('.', prefix.size());
    if (dot == std::string::npos) return Status::InvalidArgument("ExportTorchScript: unexpected parameter " + key);
    int index = 0;
    try {
      index = std::stoi(key.substr(prefix.size(), dot - prefix.size()));
    } catch (const std::exception&) {
      return Status::InvalidArgument("ExportTorchScript: unexpected parameter " + key);
    }
    const std::string field = key.substr(dot + 1);
    torch::Tensor t = item.value().detach().to(torch::kCPU, torch::kFloat32).clone();
    if (field == "weight") {
      by_index[index].weight = t;
    } else if (field == "bias") {
      by_index[index].bias = t;
    } else {
      return Status::InvalidArgument("ExportTorchScript: unexpected parameter " + key);
    }
  }
  out->clear();
  if (prefix != "actor.") {
    for (auto& [index, layer] : by_index) out->push_back(layer);
    return Status::Ok();
  }
  for (auto& [index, layer] : by_index) {
    if (!layer.weight.defined() || !layer.bias.defined() || layer.weight.dim() != 2 || layer.bias.dim() != 1 ||
        layer.bias.size(0) != layer.weight.size(0))
      return Status::InvalidArgument(fmt::format("ExportTorchScript: actor layer {} is not a Linear layer", index));
    if (!out->empty() && out->back().weight.size(0) != layer.weight.size(1))
      return Status::InvalidArgument(fmt::format("ExportTorchScript: actor layer {} takes {} inputs, previous gives {}",
                                                 index, layer.weight.size(1), out->back().weight.size(0)));
    out->push_back(layer);
  }
  if (out->empty()) return Status::InvalidArgument("ExportTorchScript: the policy has no actor layers");
  return Status::Ok();
}

}  // namespace

Status ExportTorchScript(ActorCriticImpl& policy, const std::string& path, const ObsTransform* normalize) {
  const Space& obs = policy.observation_space();
  const Space& action = policy.action_space();
  const bool core = policy.has_core();
  if (core && policy.encoder() == Encoder::kCnn)
    return Status::InvalidArgument(fmt::format(
        "ExportTorchScript: a cnn policy with a {} core is not exported (only the mlp encoder's); serve it with "
        "farm-learner --serve (each client row keeps its state there) or evaluate it with scripts/farm eval",
        CoreName(policy.options().core)));
  // With a core: the mlp encoder's hidden layers ("actor_encoder."), the core's weights, then the head ("actor.").
  std::vector<Layer> trunk;
  std::map<std::string, torch::Tensor> core_params;
  int64_t core_size = 0;
  if (core) {
    if (auto s = SequentialLayers(policy, "actor_encoder.", &trunk); !s.ok()) return s;
    for (const auto& item : policy.named_parameters()) {
      const std::string& key = item.key();
      if (key.rfind("actor_core.", 0) == 0)
        core_params[key.substr(11)] = item.value().detach().to(torch::kCPU, torch::kFloat32).clone();
    }
    for (const char* name : {"weight_ih", "weight_hh", "bias_ih", "bias_hh"})
      if (!core_params.count(name))
        return Status::InvalidArgument(std::string("ExportTorchScript: the actor's core has no ") + name);
    core_size = policy.options().core_size;
  }
  std::vector<Layer> layers;
  if (auto s = SequentialLayers(policy, "actor.", &layers); !s.ok()) return s;
  const bool cnn = policy.encoder() == Encoder::kCnn;
  std::vector<Layer> encoder;  // cnn: conv, conv, linear
  if (cnn) {
    if (auto s = SequentialLayers(policy, "actor_encoder.", &encoder); !s.ok()) return s;
    if (encoder.size() != 3 || encoder[0].weight.dim() != 4 || encoder[1].weight.dim() != 4 ||
        encoder[2].weight.dim() != 2 || obs.shape.size() != 3)
      return Status::InvalidArgument("ExportTorchScript: the actor's cnn encoder is not conv, conv, linear on a "
                                     "[C, H, W] observation");
  }
  const int64_t obs_dim = obs.numel();
  const int64_t in_dim = core ? core_size : cnn ? encoder[2].weight.size(0) : obs_dim;
  const int64_t head_dim = action.head_size();
  if (layers.front().weight.size(1) != in_dim || layers.back().weight.size(0) != head_dim)
    return Status::InvalidArgument(
        fmt::format("ExportTorchScript: the actor maps {} to {} values, but the spaces need {} to {}",
                    layers.front().weight.size(1), layers.back().weight.size(0), in_dim, head_dim));

  if (normalize && (static_cast<int64_t>(normalize->mean.size()) != obs_dim ||
                    static_cast<int64_t>(normalize->std.size()) != obs_dim))
    return Status::InvalidArgument(fmt::format("ExportTorchScript: the observation normaliser has {} elements, the "
                                               "observation {}",
                                               normalize->mean.size(), obs_dim));

  std::ostringstream src;
  src << (core ? "def forward(self, obs, state):\n" : "def forward(self, obs):\n");
  if (normalize)  // the workers' transform (common/running_stats.h), in float32
    src << fmt::format(
        "    obs = torch.clamp((obs.reshape([obs.size(0), {0}]).float() - self.obs_mean) / self.obs_std, -{1:.9g}, "
        "{1:.9g})\n",
                       obs_dim, static_cast<double>(normalize->clip));
  if (cnn) {
    src << fmt::format("    x = obs.reshape([obs.size(0), {}]).float()\n", fmt::join(obs.shape, ", "));
    src << "    x = torch.relu(torch.conv2d(x, self.conv0_w, self.conv0_b, [1, 1], [1, 1]))\n";
    src << "    x = torch.relu(torch.conv2d(x, self.conv1_w, self.conv1_b, [2, 2], [1, 1]))\n";
    src << "    x = torch.relu(torch.addmm(self.enc_b, x.reshape([x.size(0), -1]), self.enc_w.t()))\n";
  } else {
    src << "    x = obs.reshape([obs.size(0), " << obs_dim << "]).float()\n";
  }
  if (core) {
    // The encoder's tanh layers, then one step of the core from `state` (the same arithmetic as
    // learner/model/recurrent_core.cpp); the head reads the core's output, and the next state is returned.
    for (std::size_t i = 0; i < trunk.size(); ++i)
      src << fmt::format("    x = torch.tanh(torch.addmm(self.t{0}_b, x, self.t{0}_w.t()))\n", i);
    const int64_t n = core_size;
    src << "    gi = torch.addmm(self.core_bih, x, self.core_wih.t())\n";
    if (policy.options().core == CoreKind::kGru) {
      src << "    h = state.float()\n";
      src << "    gh = torch.addmm(self.core_bhh, h, self.core_whh.t())\n";
      src << fmt::format("    rz = torch.sigmoid(gi.narrow(1, 0, {0}) + gh.narrow(1, 0, {0}))\n", 2 * n);
      src << fmt::format("    n = torch.tanh(gi.narrow(1, {0}, {1}) + rz.narrow(1, 0, {1}) * gh.narrow(1, {0}, {1}))\n",
                         2 * n, n);
      src << fmt::format("    h = n + rz.narrow(1, {0}, {0}) * (h - n)\n", n);
      src << "    next_state = h\n";
    } else {
      src << fmt::format("    h = state.float().narrow(1, 0, {0})\n    c = state.float().narrow(1, {0}, {0})\n", n);
      src << "    g = gi + torch.addmm(self.core_bhh, h, self.core_whh.t())\n";
      src << fmt::format("    fi = torch.sigmoid(g.narrow(1, 0, {0}))\n", 2 * n);
      src << fmt::format("    c = fi.narrow(1, {0}, {0}) * c + fi.narrow(1, 0, {0}) * torch.tanh(g.narrow(1, {1}, {0}))\n",
                         n, 2 * n);
      src << fmt::format("    h = torch.sigmoid(g.narrow(1, {0}, {1})) * torch.tanh(c)\n", 3 * n, n);
      src << "    next_state = torch.cat([h, c], 1)\n";
    }
    src << "    x = h\n";
  }
  // The return statement: the action, and with a core the next state.
  const auto ret = [&](const std::string& value) { return core ? "(" + value + ", next_state)" : value; };
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const bool last = i + 1 == layers.size();
    const std::string affine = fmt::format("torch.addmm(self.b{0}, x, self.w{0}.t())", i);
    src << "    x = " << (last ? affine : "torch.tanh(" + affine + ")") << "\n";
  }
  if (action.is_discrete()) {
    src << "    return " << ret("torch.argmax(x, -1)") << "\n";
  } else if (action.is_multi_discrete()) {
    // The argmax of each component's slice of the logits, stacked: int64 [B, K].
    src << "    parts = torch.split(x, [" << fmt::format("{}", fmt::join(action.nvec, ", ")) << "], 1)\n";
    src << "    return " << ret("torch.stack([torch.argmax(p, -1) for p in parts], 1)") << "\n";
  } else {
    src << "    x = torch.minimum(torch.maximum(x, self.low), self.high)\n";
    src << "    return "
        << ret("x.reshape([x.size(0)" + std::string(action.shape.empty() ? "" : ", ") +
               fmt::format("{}", fmt::join(action.shape, ", ")) + "])")
        << "\n";
  }
  if (core) {
    // The state before an episode's first step, for `batch` rows.
    const int64_t width = policy.options().core == CoreKind::kLstm ? 2 * core_size : core_size;
    src << "def initial_state(self, batch: int):\n";
    src << "    return torch.zeros([batch, " << width << "])\n";
  }

  const std::string tmp = path + ".tmp";
  try {
    torch::jit::Module module("FarmPolicy");
    for (std::size_t i = 0; i < layers.size(); ++i) {
      module.register_parameter(fmt::format("w{}", i), layers[i].weight, /*is_buffer=*/false);
      module.register_parameter(fmt::format("b{}", i), layers[i].bias, /*is_buffer=*/false);
    }
    for (std::size_t i = 0; i < trunk.size(); ++i) {
      module.register_parameter(fmt::format("t{}_w", i), trunk[i].weight, /*is_buffer=*/false);
      module.register_parameter(fmt::format("t{}_b", i), trunk[i].bias, /*is_buffer=*/false);
    }
    if (core) {
      module.register_parameter("core_wih", core_params["weight_ih"], /*is_buffer=*/false);
      module.register_parameter("core_whh", core_params["weight_hh"], /*is_buffer=*/false);
      module.register_parameter("core_bih", core_params["bias_ih"], /*is_buffer=*/false);
      module.register_parameter("core_bhh", core_params["bias_hh"], /*is_buffer=*/false);
    }
    for (std::size_t i = 0; i < encoder.size(); ++i) {
      const std::string name = i < 2 ? fmt::format("conv{}", i) : std::string("enc");
      module.register_parameter(name + "_w", encoder[i].weight, /*is_buffer=*/false);
      module.register_parameter(name + "_b", encoder[i].bias, /*is_buffer=*/false);
    }
    if (normalize) {
      module.register_buffer("obs_mean", torch::tensor(normalize->mean, torch::kFloat32));
      module.register_buffer("obs_std", torch::tensor(normalize->std, torch::kFloat32));
    }
    if (action.is_box()) {
      module.register_buffer("low", torch::tensor(action.low, torch::kFloat32));
      module.register_buffer("high", torch::tensor(action.high, torch::kFloat32));
    }
    module.define(src.str());
    module.eval();
    module.save(tmp);
  } catch (const c10::Error& e) {
    std::remove(tmp.c_str());
    return Status::IoError(fmt::format("{}: cannot export the policy: {}", path, e.what_without_backtrace()));
  }
  return CommitFile(tmp, path);
}

}  // namespace farm
