// TorchScript export: the actor's weights become parameters of a scripted module whose forward is written in
// TorchScript source, so the saved file needs nothing from this code base to run.
#include "learner/export.h"

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

// The actor's Linear layers in order, from parameter names "actor.<index>.weight|bias".
Status ActorLayers(ActorCriticImpl& policy, std::vector<Layer>* out) {
  std::map<int, Layer> by_index;
  for (const auto& item : policy.named_parameters()) {
    const std::string& key = item.key();
    if (key.rfind("actor.", 0) != 0) continue;
    const auto dot = key.find('.', 6);
    if (dot == std::string::npos) return Status::InvalidArgument("ExportTorchScript: unexpected parameter " + key);
    int index = 0;
    try {
      index = std::stoi(key.substr(6, dot - 6));
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

Status ExportTorchScript(ActorCriticImpl& policy, const std::string& path) {
  const Space& obs = policy.observation_space();
  const Space& action = policy.action_space();
  std::vector<Layer> layers;
  if (auto s = ActorLayers(policy, &layers); !s.ok()) return s;
  const int64_t obs_dim = obs.numel();
  const int64_t head_dim = action.is_discrete() ? action.n : action.numel();
  if (layers.front().weight.size(1) != obs_dim || layers.back().weight.size(0) != head_dim)
    return Status::InvalidArgument(
        fmt::format("ExportTorchScript: the actor maps {} to {} values, but the spaces need {} to {}",
                    layers.front().weight.size(1), layers.back().weight.size(0), obs_dim, head_dim));

  std::ostringstream src;
  src << "def forward(self, obs):\n";
  src << "    x = obs.reshape([obs.size(0), " << obs_dim << "]).float()\n";
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const bool last = i + 1 == layers.size();
    const std::string affine = fmt::format("torch.addmm(self.b{0}, x, self.w{0}.t())", i);
    src << "    x = " << (last ? affine : "torch.tanh(" + affine + ")") << "\n";
  }
  if (action.is_discrete()) {
    src << "    return torch.argmax(x, -1)\n";
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
    if (!action.is_discrete()) {
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
