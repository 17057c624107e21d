// TorchScript export: the actor's weights become parameters of a scripted module whose forward is written in
// TorchScript source, so the saved file needs nothing from this code base to run.
#include "learner/model/export.h"

#include "common/files.h"
#include "learner/model/scripted_encoder.h"

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
#include <type_traits>

namespace farm {
namespace {

torch::Tensor HostCopy(const torch::Tensor& t) { return t.detach().to(torch::kCPU, torch::kFloat32).clone(); }

// A Conv2d's symmetric integer padding, or -1 for 'same' / 'valid' (never made by encoder.h). The options hold a
// c10::variant in LibTorch 1.x and a std::variant in 2.x: the unqualified visit finds either by ADL.
int64_t ConvPadding(const torch::nn::Conv2dImpl& conv) {
  int64_t padding = -1;
  visit(
      [&](const auto& p) {
        if constexpr (std::is_same_v<std::decay_t<decltype(p)>, torch::ExpandingArray<2>>) {
          if ((*p)[0] == (*p)[1]) padding = (*p)[0];
        }
      },
      conv.options.padding());
  return padding;
}

// Writes TorchScript statements that apply the modules of Sequentials, in order, to `x`, and collects their
// parameters (registered on the module as <prefix><index>_<name>).
class ScriptWriter {
 public:
  explicit ScriptWriter(std::ostringstream& src) : src_(src) {}

  Status Apply(const torch::nn::Sequential& seq, const std::string& prefix) {
    std::size_t i = 0;
    for (auto it = seq->begin(); it != seq->end(); ++it, ++i) {
      const std::string name = fmt::format("{}{}", prefix, i);
      const std::shared_ptr<torch::nn::Module> m = it->ptr();
      if (auto* linear = m->as<torch::nn::LinearImpl>()) {
        src_ << fmt::format("    x = torch.addmm(self.{0}_b, x, self.{0}_w.t())\n", name);
        Add(name + "_w", linear->weight);
        Add(name + "_b", linear->bias);
      } else if (auto* conv = m->as<torch::nn::Conv2dImpl>()) {
        if (auto s = Conv(*conv, name, "x"); !s.ok()) return s;
        src_ << "    x = " << last_ << "\n";
      } else if (auto* pool = m->as<torch::nn::MaxPool2dImpl>()) {
        const auto& o = pool->options;
        src_ << fmt::format("    x = torch.max_pool2d(x, [{}, {}], [{}, {}], [{}, {}])\n", (*o.kernel_size())[0],
                            (*o.kernel_size())[1], (*o.stride())[0], (*o.stride())[1], (*o.padding())[0],
                            (*o.padding())[1]);
      } else if (auto* block = m->as<ImpalaResidualImpl>()) {
        if (auto s = Conv(*block->conv0, name + "_c0", "torch.relu(x)"); !s.ok()) return s;
        const std::string inner = last_;
        if (auto s = Conv(*block->conv1, name + "_c1", "torch.relu(" + inner + ")"); !s.ok()) return s;
        src_ << "    x = x + " << last_ << "\n";
      } else if (auto* scripted = m->as<ScriptedEncoderImpl>()) {
        // The user's TorchScript encoder, a CPU float32 copy as a submodule: its own code, not rewritten.
        torch::jit::Module copy = scripted->script().deepcopy();
        copy.to(torch::kCPU, torch::kFloat32);
        src_ << fmt::format("    x = self.{}.forward(x)\n", name);
        submodules_.emplace_back(name, std::move(copy));
      } else if (auto* norm = m->as<torch::nn::LayerNormImpl>()) {
        src_ << fmt::format("    x = torch.layer_norm(x, [{}], self.{}_w, self.{}_b, {:.9g})\n",
                            fmt::join(norm->options.normalized_shape(), ", "), name, name, norm->options.eps());
        Add(name + "_w", norm->weight);
        Add(name + "_b", norm->bias);
      } else if (m->as<torch::nn::FlattenImpl>()) {
        src_ << "    x = x.reshape([x.size(0), -1])\n";
      } else if (m->as<torch::nn::TanhImpl>()) {
        src_ << "    x = torch.tanh(x)\n";
      } else if (m->as<torch::nn::ReLUImpl>()) {
        src_ << "    x = torch.relu(x)\n";
      } else if (auto* elu = m->as<torch::nn::ELUImpl>()) {
        src_ << fmt::format("    x = torch.elu(x, {:.9g})\n", elu->options.alpha());
      } else if (m->as<torch::nn::SiLUImpl>()) {
        src_ << "    x = torch.silu(x)\n";
      } else {
        return Status::InvalidArgument(fmt::format("ExportTorchScript: {} (module {}) has no TorchScript form here",
                                                   m->name(), name));
      }
    }
    return Status::Ok();
  }

  const std::vector<std::pair<std::string, torch::Tensor>>& parameters() const { return parameters_; }
  const std::vector<std::pair<std::string, torch::jit::Module>>& submodules() const { return submodules_; }

 private:
  void Add(const std::string& name, const torch::Tensor& t) { parameters_.emplace_back(name, HostCopy(t)); }

  // Sets last_ to the expression of `conv` applied to `input`.
  Status Conv(const torch::nn::Conv2dImpl& conv, const std::string& name, const std::string& input) {
    const int64_t padding = ConvPadding(conv);
    const auto& stride = *conv.options.stride();
    if (padding < 0 || stride[0] != stride[1] || (*conv.options.dilation())[0] != 1 || conv.options.groups() != 1)
      return Status::InvalidArgument(fmt::format("ExportTorchScript: conv {} is not a plain square-strided one", name));
    last_ = fmt::format("torch.conv2d({}, self.{}_w, self.{}_b, [{}, {}], [{}, {}])", input, name, name, stride[0],
                        stride[0], padding, padding);
    Add(name + "_w", conv.weight);
    Add(name + "_b", conv.bias);
    return Status::Ok();
  }

  std::ostringstream& src_;
  std::vector<std::pair<std::string, torch::Tensor>> parameters_;
  std::vector<std::pair<std::string, torch::jit::Module>> submodules_;
  std::string last_;
};

}  // namespace

Status ExportTorchScript(ActorCriticImpl& policy, const std::string& path, const ObsTransform* normalize) {
  const Space& obs = policy.observation_space();
  const Space& action = policy.action_space();
  const bool core = policy.has_core();
  // With a core: the encoder (an image encoder and the trunk), the core's weights, then the head ("actor.").
  std::map<std::string, torch::Tensor> core_params;
  int64_t core_size = 0;
  if (core) {
    for (const auto& item : policy.named_parameters()) {
      const std::string& key = item.key();
      if (key.rfind("actor_core.", 0) == 0) core_params[key.substr(11)] = HostCopy(item.value());
    }
    for (const char* name : {"weight_ih", "weight_hh", "bias_ih", "bias_hh"})
      if (!core_params.count(name))
        return Status::InvalidArgument(std::string("ExportTorchScript: the actor's core has no ") + name);
    core_size = policy.options().core_size;
  }
  const torch::nn::Sequential head = policy.actor();
  if (!head || head->is_empty()) return Status::InvalidArgument("ExportTorchScript: the policy has no actor layers");
  const int64_t obs_dim = obs.numel();
  const int64_t head_dim = action.head_size();
  const auto* last = head->ptr(head->size() - 1)->as<torch::nn::LinearImpl>();
  if (last == nullptr || last->weight.size(0) != head_dim)
    return Status::InvalidArgument(fmt::format("ExportTorchScript: the actor's last layer is not a Linear to the {} "
                                               "values the action space needs",
                                               head_dim));
  const bool image = IsImageEncoder(policy.encoder()) && policy.options().actor_encoder_script.empty();
  if (image && obs.shape.size() != 3)
    return Status::InvalidArgument(fmt::format("ExportTorchScript: the {} encoder needs a [C, H, W] observation, got {}",
                                               EncoderName(policy.encoder()), obs.ToString()));
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
  if (image || !policy.options().actor_encoder_script.empty()) {  // [B, C, H, W], or the script's [B, shape...]
    src << fmt::format("    x = obs.reshape([obs.size(0), {}]).float()\n", fmt::join(obs.shape, ", "));
  } else {
    src << "    x = obs.reshape([obs.size(0), " << obs_dim << "]).float()\n";
  }
  ScriptWriter writer(src);
  if (const torch::nn::Sequential encoder = policy.actor_encoder())
    if (auto s = writer.Apply(encoder, "enc"); !s.ok()) return s;
  if (core) {
    // One step of the core from `state` (the same arithmetic as learner/model/recurrent_core.cpp); the head reads
    // the core's output, and the next state is returned.
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
  if (auto s = writer.Apply(head, "actor"); !s.ok()) return s;
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
    for (const auto& [name, tensor] : writer.parameters()) module.register_parameter(name, tensor, /*is_buffer=*/false);
    for (const auto& [name, submodule] : writer.submodules()) module.register_module(name, submodule);
    if (core) {
      module.register_parameter("core_wih", core_params["weight_ih"], /*is_buffer=*/false);
      module.register_parameter("core_whh", core_params["weight_hh"], /*is_buffer=*/false);
      module.register_parameter("core_bih", core_params["bias_ih"], /*is_buffer=*/false);
      module.register_parameter("core_bhh", core_params["bias_hh"], /*is_buffer=*/false);
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
