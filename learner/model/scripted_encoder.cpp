// A TorchScript encoder as an nn::Module (scripted_encoder.h).
#include "learner/model/scripted_encoder.h"

#include "common/files.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>
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
    torch::NoGradGuard no_grad;
    script_.eval();
    result = script_.forward({torch::zeros(shape)});
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
}

torch::Tensor ScriptedEncoderImpl::forward(const torch::Tensor& x) { return script_.forward({x}).toTensor(); }

void ScriptedEncoderImpl::train(bool on) {
  torch::nn::Module::train(on);
  script_.train(on);
}

}  // namespace farm
