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
  if (policy.has_core())
    return Status::InvalidArgument(fmt::format(
        "ExportTorchScript: the policy has a {} core, and the exported module has no recurrent state yet; serve it "
        "with farm-learner --serve (each client row keeps its state there) or evaluate it with scripts/farm eval",
        CoreName(policy.options().core)));
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
  const int64_t in_dim = cnn ? encoder[2].weight.size(0) : obs_dim;
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
  src << "def forward(self, obs):\n";
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
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const bool last = i + 1 == layers.size();
    const std::string affine = fmt::format("torch.addmm(self.b{0}, x, self.w{0}.t())", i);
    src << "    x = " << (last ? affine : "torch.tanh(" + affine + ")") << "\n";
  }
  if (action.is_discrete()) {
    src << "    return torch.argmax(x, -1)\n";
  } else if (action.is_multi_discrete()) {
    // The argmax of each component's slice of the logits, stacked: int64 [B, K].
    src << "    parts = torch.split(x, [" << fmt::format("{}", fmt::join(action.nvec, ", ")) << "], 1)\n";
    src << "    return torch.stack([torch.argmax(p, -1) for p in parts], 1)\n";
  } else {
    src << "    x = torch.minimum(torch.maximum(x, self.low), self.high)\n";
    src << "    return x.reshape([x.size(0)" << (action.shape.empty() ? "" : ", ")
        << fmt::format("{}", fmt::join(action.shape, ", ")) << "])\n";
  }

  const std::string tmp = path + ".tmp";
  try {
    torch::jit::Module module("FarmPolicy");
    for (std::size_t i = 0; i < layers.size(); ++i) {
      module.register_parameter(fmt::format("w{}", i), layers[i].weight, /*is_buffer=*/false);
      module.register_parameter(fmt::format("b{}", i), layers[i].bias, /*is_buffer=*/false);
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
