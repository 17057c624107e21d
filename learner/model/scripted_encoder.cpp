// A TorchScript encoder as an nn::Module (scripted_encoder.h).
#include "learner/model/scripted_encoder.h"

#include "common/files.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/jit/runtime/graph_executor.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <algorithm>
#include <unordered_set>
#include <vector>

namespace farm {
namespace {

std::string Registered(std::string name, std::set<std::string>* taken) {
  for (char& c : name)
    if (c == '.') c = '_';
  std::string unique = name;
  for (int i = 1; taken->count(unique); ++i) unique = fmt::format("{}_{}", name, i);
  taken->insert(unique);
  return unique;
}

// LibTorch's message without its C++ backtrace (c10::Error), or the interpreter's (torch::jit::JITException, a
// std::runtime_error whose message holds the script's traceback).
std::string Reason(const std::exception& e) {
  const auto* error = dynamic_cast<const c10::Error*>(&e);
  return error ? error->what_without_backtrace() : e.what();
}

// Whether a backward node belongs to an operation whose output is a view of its input (no memory of its own).
bool IsViewNode(const std::string& name) {
  for (const char* view : {"ViewBackward", "ReshapeAliasBackward", "ExpandBackward", "TBackward", "TransposeBackward",
                           "PermuteBackward", "SqueezeBackward", "UnsqueezeBackward", "SelectBackward", "SliceBackward",
                           "AsStridedBackward", "AliasBackward", "UnbindBackward", "SplitBackward"})
    if (name.find(view) != std::string::npos) return true;
  return false;
}

// Floats of the outputs of the operations autograd recorded from `out` back to the leaves (a backward node each;
// the leaves' own AccumulateGrad nodes and views left out): an upper bound of what the forward keeps for the
// backward pass (a conv followed by a ReLU counts both outputs, though the ReLU's backward keeps only its own).
int64_t RecordedOutputFloats(const torch::Tensor& out) {
  std::unordered_set<const torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> stack{out.grad_fn().get()};
  int64_t floats = 0;
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    if (const std::string name = node->name(); name != "torch::autograd::AccumulateGrad" && !IsViewNode(name))
      for (uint32_t i = 0; i < node->num_inputs(); ++i) floats += node->input_metadata(i).zeros_like().numel();
    for (const auto& edge : node->next_edges()) stack.push_back(edge.function.get());
  }
  return floats;
}

}  // namespace

Status CheckEncoderScript(const std::string& path, const std::string& key) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    return Status::InvalidArgument(fmt::format(
        "{}: '{}' is not a file (expected a TorchScript module saved by torch.jit.script(module).save(path); a "
        "relative path is taken from the directory the learner starts in)",
        key, path));
  try {
    (void)torch::jit::load(path, torch::kCPU);
  } catch (const std::exception& e) {
    return Status::InvalidArgument(fmt::format("{}: cannot load the TorchScript module {}: {}", key, path, Reason(e)));
  }
  return Status::Ok();
}

Status CopyEncoderScript(const std::string& path, const std::string& dest) {
  std::error_code ec;
  if (std::filesystem::equivalent(path, dest, ec)) return Status::Ok();
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  if (in.is_open()) bytes << in.rdbuf();
  if (!in.is_open() || in.bad() || !bytes)
    return Status::IoError(fmt::format("{}: cannot read the encoder script to copy it to {}", path, dest));
  return WriteFileAtomic(dest, bytes.str());
}

ScriptedEncoderImpl::ScriptedEncoderImpl(const std::string& path, const Space& input, const std::string& key)
    : path_(path) {
  try {
    script_ = torch::jit::load(path, torch::kCPU);
  } catch (const std::exception& e) {
    throw std::invalid_argument(fmt::format("{}: cannot load the TorchScript module {}: {}", key, path, Reason(e)));
  }
  std::set<std::string> taken;
  for (const auto& p : script_.named_parameters(/*recurse=*/true))
    register_parameter(Registered(p.name, &taken), p.value, /*requires_grad=*/true);
  for (const auto& b : script_.named_buffers(/*recurse=*/true)) register_buffer(Registered(b.name, &taken), b.value);

  std::vector<int64_t> shape{2};
  shape.insert(shape.end(), input.shape.begin(), input.shape.end());
  c10::IValue result;
  try {
    script_.eval();  // the probes must not move a batch norm's running statistics
    {
      torch::NoGradGuard no_grad;
      result = script_.forward({torch::zeros(shape)});
    }
    if (result.isTensor()) {
      // What a batch keeps for the backward pass, per row (the memory estimate's activations).
      const auto recorded = [&](int64_t rows) {
        std::vector<int64_t> probe{rows};
        probe.insert(probe.end(), input.shape.begin(), input.shape.end());
        torch::AutoGradMode grad(true);
        // The interpreter as written: the optimiser would fold ops into one DifferentiableGraph node, hiding
        // their outputs from the count (the setting is this thread's; other threads' forwards keep it).
        torch::jit::GraphOptimizerEnabledGuard plain(false);
        const c10::IValue out = script_.forward({torch::zeros(probe)});
        return out.isTensor() ? RecordedOutputFloats(out.toTensor()) : int64_t{0};
      };
      activation_floats_ = (recorded(3) - recorded(1)) / 2;
    }
    script_.train();
  } catch (const std::exception& e) {
    throw std::invalid_argument(fmt::format("{}: {} cannot take inputs [B, {}] (the {} as the workers send it): {}",
                                            key, path, fmt::join(input.shape, ", "), input.ToString(), Reason(e)));
  }
  if (!result.isTensor())
    throw std::invalid_argument(fmt::format("{}: {} returns {}, not a tensor of features", key, path,
                                            result.tagKind()));
  const torch::Tensor out = result.toTensor();
  if (out.dim() != 2 || out.size(0) != 2 || out.size(1) <= 0 || !out.is_floating_point())
    throw std::invalid_argument(fmt::format("{}: {} maps inputs [2, {}] to {} [{}]; expected floating-point features "
                                            "[2, F] with F > 0",
                                            key, path, fmt::join(input.shape, ", "), c10::toString(out.scalar_type()),
                                            fmt::join(out.sizes(), ", ")));
  features_ = out.size(1);
  activation_floats_ = std::max(activation_floats_, features_);
}

torch::Tensor ScriptedEncoderImpl::forward(const torch::Tensor& x) { return script_.forward({x}).toTensor(); }

void ScriptedEncoderImpl::train(bool on) {
  torch::nn::Module::train(on);
  script_.train(on);
}

}  // namespace farm
