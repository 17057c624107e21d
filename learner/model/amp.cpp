// Mixed precision: precision parsing, the autocast version shim and guard, and the dynamic loss scaler.
#include "learner/model/amp.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include <cmath>
#include <map>
#include <stdexcept>
#include <utility>

// LibTorch 2.4 replaced the per-device autocast functions (set_enabled, set_cpu_enabled,
// set_autocast_gpu_dtype, ...) by ones taking a device type; the old names warn there and are gone later.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define FARM_AUTOCAST_BY_DEVICE_TYPE 1
#else
#define FARM_AUTOCAST_BY_DEVICE_TYPE 0
#endif

namespace farm {
namespace {

void RequireAutocastDevice(torch::DeviceType type) {
  if (type != torch::kCPU && type != torch::kCUDA) {
    throw std::invalid_argument("autocast: only CPU and CUDA are supported, got " + c10::DeviceTypeName(type));
  }
}

}  // namespace

// --- Version shim: the only code that names LibTorch's autocast state functions. ---

void SetAutocastEnabled(torch::DeviceType type, bool enabled) {
  RequireAutocastDevice(type);
#if FARM_AUTOCAST_BY_DEVICE_TYPE
  at::autocast::set_autocast_enabled(type, enabled);
#else
  if (type == torch::kCUDA) {
    at::autocast::set_enabled(enabled);
  } else {
    at::autocast::set_cpu_enabled(enabled);
  }
#endif
}

void SetAutocastDtype(torch::DeviceType type, torch::ScalarType dtype) {
  RequireAutocastDevice(type);
#if FARM_AUTOCAST_BY_DEVICE_TYPE
  at::autocast::set_autocast_dtype(type, dtype);
#else
  if (type == torch::kCUDA) {
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
#endif
}

bool AutocastEnabled(torch::DeviceType type) {
  RequireAutocastDevice(type);
#if FARM_AUTOCAST_BY_DEVICE_TYPE
  return at::autocast::is_autocast_enabled(type);
#else
  return type == torch::kCUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
#endif
}

torch::ScalarType AutocastDtype(torch::DeviceType type) {
  RequireAutocastDevice(type);
#if FARM_AUTOCAST_BY_DEVICE_TYPE
  return at::autocast::get_autocast_dtype(type);
#else
  return type == torch::kCUDA ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype();
#endif
}

// --- Precision ---

Status ParsePrecision(const std::string& name, Precision* out) {
  if (name == "fp32") {
    *out = Precision::kFp32;
  } else if (name == "fp16") {
    *out = Precision::kFp16;
  } else if (name == "bf16") {
    *out = Precision::kBf16;
  } else {
    return Status::InvalidArgument("unknown precision '" + name + "', expected one of: fp32, fp16, bf16");
  }
  return Status::Ok();
}

const char* PrecisionName(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kFp16:
      return "fp16";
    case Precision::kBf16:
      return "bf16";
  }
  return "?";
}

torch::ScalarType PrecisionDtype(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return torch::kFloat;
    case Precision::kFp16:
      return torch::kHalf;
    case Precision::kBf16:
      return torch::kBFloat16;
  }
  return torch::kFloat;
}

Status CheckPrecision(Precision precision, torch::Device device) {
  if (precision == Precision::kFp32) return Status::Ok();
  if (precision == Precision::kFp16 && !device.is_cuda()) {
    return Status::InvalidArgument("precision fp16 needs a CUDA device (the learner runs on " + device.str() +
                                   "): CPU autocast supports only bfloat16, so use precision bf16 on the CPU "
                                   "(or fp32)");
  }
  if (!device.is_cpu() && !device.is_cuda()) {
    return Status::InvalidArgument(std::string("precision ") + PrecisionName(precision) +
                                   " needs a CPU or CUDA device, got " + device.str());
  }
  return Status::Ok();
}

// --- AutocastGuard ---

AutocastGuard::AutocastGuard(torch::Device device, Precision precision) {
  if (precision == Precision::kFp32) return;
  if (auto s = CheckPrecision(precision, device); !s.ok()) throw std::invalid_argument(s.message());
  device_type_ = device.type();
  previous_enabled_ = AutocastEnabled(device_type_);
  previous_dtype_ = AutocastDtype(device_type_);
  SetAutocastDtype(device_type_, PrecisionDtype(precision));
  SetAutocastEnabled(device_type_, true);
  at::autocast::increment_nesting();
  active_ = true;
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  // As Python's autocast.__exit__: drop the cached low-precision weight copies when leaving the outermost
  // region, so that no later region sees casts of weights that an optimizer step has since changed.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  SetAutocastEnabled(device_type_, previous_enabled_);
  SetAutocastDtype(device_type_, previous_dtype_);
}

// --- LossScaler ---

LossScaler::LossScaler(Options options) : options_(options), scale_(options.enabled ? options.init_scale : 1.0) {
  if (!options_.enabled) return;
  if (!(options_.init_scale > 0) || !std::isfinite(options_.init_scale)) {
    throw std::invalid_argument("LossScaler: init_scale must be positive and finite");
  }
  if (!(options_.growth_factor > 1.0)) throw std::invalid_argument("LossScaler: growth_factor must be > 1");
  if (!(options_.backoff_factor > 0.0 && options_.backoff_factor < 1.0)) {
    throw std::invalid_argument("LossScaler: backoff_factor must be in (0, 1)");
  }
  if (options_.growth_interval < 1) throw std::invalid_argument("LossScaler: growth_interval must be >= 1");
}

torch::Tensor LossScaler::Scale(const torch::Tensor& loss) {
  if (!options_.enabled) return loss;
  // A host scalar: no device sync, and on the fused path it equals the device scale (both float32 values).
  return loss * scale_;
}

void LossScaler::EnsureDeviceState(const torch::Device& device) {
  if (scale_tensor_.defined() && scale_tensor_.device() == device) return;
  const auto on = [&](torch::ScalarType dtype) { return torch::TensorOptions().dtype(dtype).device(device); };
  // The kernels keep the scale in float32: round the host mirror the same way so the two stay equal.
  scale_ = static_cast<float>(scale_);
  scale_tensor_ = torch::full({1}, scale_, on(torch::kFloat));
  growth_tracker_tensor_ = torch::full({1}, growth_tracker_, on(torch::kInt));
  found_inf_tensor_ = torch::zeros({1}, on(torch::kFloat));
}

bool LossScaler::Unscale(const std::vector<torch::Tensor>& params) {
  if (!options_.enabled) return true;
  if (stage_ == Stage::kUnscaled) return !found_inf_;
  if (stage_ == Stage::kStepped) {
    throw std::logic_error("LossScaler::Unscale: called after Step(); call Update() first");
  }
  std::vector<torch::Tensor> grads;
  grads.reserve(params.size());
  for (const auto& p : params) {
    if (p.defined() && p.grad().defined()) grads.push_back(p.grad());
  }
  bool fused = !grads.empty();
  for (const auto& g : grads) {
    if (!g.is_cuda() || g.device() != grads.front().device() || g.is_sparse()) fused = false;
  }
  fused_step_ = fused;
  found_inf_ = fused ? !UnscaleFused(grads) : !UnscalePlain(grads);
  stage_ = Stage::kUnscaled;
  return !found_inf_;
}

bool LossScaler::UnscalePlain(const std::vector<torch::Tensor>& grads) {
  torch::NoGradGuard no_grad;
  bool finite = true;
  std::vector<torch::Tensor> checks;  // one bool per grad, gathered so that one sync answers for all
  for (const auto& g : grads) {
    // Divide first, then check: dividing keeps inf/NaN and exposes a finite value that the division by a
    // scale < 1 pushed past the float range.
    g.div_(scale_);
    checks.push_back(torch::isfinite(g).all().to(torch::kCPU));
  }
  if (!checks.empty()) finite = torch::stack(checks).all().item<bool>();
  return finite;
}

bool LossScaler::UnscaleFused(const std::vector<torch::Tensor>& grads) {
  torch::NoGradGuard no_grad;
  const torch::Device device = grads.front().device();
  EnsureDeviceState(device);
  found_inf_tensor_.zero_();
  // As GradScaler: 1 / scale in double, then float32.
  const torch::Tensor inv_scale = scale_tensor_.to(torch::kDouble).reciprocal().to(torch::kFloat);
  // The fused kernel wants one dtype per call; found_inf accumulates across calls.
  std::map<torch::ScalarType, std::vector<torch::Tensor>> by_dtype;
  for (const auto& g : grads) by_dtype[g.scalar_type()].push_back(g);
  for (auto& [dtype, group] : by_dtype) {
    at::_amp_foreach_non_finite_check_and_unscale_(group, found_inf_tensor_, inv_scale);
  }
  // The skip decision needs the answer on the host (GradScaler.step syncs here too).
  return found_inf_tensor_.item<float>() == 0.0f;
}

bool LossScaler::Step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  if (stage_ == Stage::kStepped) {
    throw std::logic_error("LossScaler::Step: called twice without Update() in between");
  }
  if (stage_ == Stage::kReady) {
    std::vector<torch::Tensor> params;
    for (auto& group : optimizer.param_groups()) {
      for (const auto& p : group.params()) params.push_back(p);
    }
    Unscale(params);
  }
  stage_ = Stage::kStepped;
  if (found_inf_) {
    ++skipped_steps_;
    return false;
  }
  optimizer.step();
  return true;
}

void LossScaler::Update() {
  if (!options_.enabled) return;
  if (stage_ == Stage::kReady) {
    throw std::logic_error("LossScaler::Update: no Unscale() or Step() since the last Update()");
  }
  if (fused_step_) {
    at::_amp_update_scale_(scale_tensor_, growth_tracker_tensor_, found_inf_tensor_, options_.growth_factor,
                           options_.backoff_factor, options_.growth_interval);
  }
  // The host mirror, with the kernel's arithmetic (double product, stored as float32 on the fused path).
  const auto store = [&](double value) { return fused_step_ ? static_cast<double>(static_cast<float>(value)) : value; };
  if (found_inf_) {
    scale_ = store(scale_ * options_.backoff_factor);
    growth_tracker_ = 0;
  } else if (growth_tracker_ + 1 >= options_.growth_interval) {
    const double grown = store(scale_ * options_.growth_factor);
    if (std::isfinite(grown)) scale_ = grown;
    growth_tracker_ = 0;
  } else {
    ++growth_tracker_;
  }
  if (!fused_step_) {
    // Device state (if any) is stale now; it is rebuilt from the host mirror when next needed.
    scale_tensor_ = growth_tracker_tensor_ = found_inf_tensor_ = torch::Tensor();
  }
  stage_ = Stage::kReady;
  found_inf_ = false;
  fused_step_ = false;
}

void LossScaler::Save(torch::serialize::OutputArchive& archive) const {
  archive.write("scale", torch::tensor({scale_}, torch::kFloat64));
  archive.write("growth_tracker", torch::tensor({growth_tracker_}, torch::kInt64));
  archive.write("skipped_steps", torch::tensor({skipped_steps_}, torch::kInt64));
}

void LossScaler::Load(torch::serialize::InputArchive& archive) {
  torch::Tensor scale, tracker, skipped;
  archive.read("scale", scale);
  archive.read("growth_tracker", tracker);
  archive.read("skipped_steps", skipped);
  TORCH_CHECK(scale.numel() == 1 && tracker.numel() == 1 && skipped.numel() == 1,
              "loss scaler state: every entry must hold one value");
  const double loaded_scale = scale.to(torch::kFloat64).item<double>();
  TORCH_CHECK(std::isfinite(loaded_scale) && loaded_scale > 0, "loss scaler state: bad scale ", loaded_scale);
  const int64_t loaded_tracker = tracker.to(torch::kInt64).item<int64_t>();
  const int64_t loaded_skipped = skipped.to(torch::kInt64).item<int64_t>();
  TORCH_CHECK(loaded_tracker >= 0 && loaded_skipped >= 0, "loss scaler state: negative counters");
  // A disabled scaler keeps scale 1; its counters are restored all the same.
  if (options_.enabled) scale_ = loaded_scale;
  growth_tracker_ = loaded_tracker;
  skipped_steps_ = loaded_skipped;
  stage_ = Stage::kReady;
  found_inf_ = false;
  fused_step_ = false;
  scale_tensor_ = growth_tracker_tensor_ = found_inf_tensor_ = torch::Tensor();
}

}  // namespace farm
