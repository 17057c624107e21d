// Mixed precision: the learner.precision setting, an RAII autocast region over LibTorch's (version-dependent)
// autocast API, and a dynamic loss scaler with GradScaler semantics (LibTorch has no C++ GradScaler).
//
//   fp32  no autocast, no loss scaling.
//   bf16  autocast to bfloat16 (CUDA or CPU); bf16 has fp32's exponent range, so no loss scaling.
//   fp16  autocast to float16, CUDA only, with dynamic loss scaling (LossScaler enabled).
//
// Parameters and optimizer state stay float32 in every mode; only the forward's matmuls/convs run in the
// lower precision. Compute losses in float32 (cast the network outputs) and call backward outside the
// autocast region, as PyTorch recommends.
//
// Threading: autocast state (enabled flag, dtype, nesting and the cast cache) is thread-local in LibTorch.
// Each thread that runs a model - the inference thread, the trainer thread - opens its own AutocastGuard
// around its own forward passes; a guard affects only the thread that created it and must be destroyed on
// that thread. Open a guard per forward pass (or per batch), not for a thread's lifetime: the cast cache
// holds low-precision copies of the weights, which are stale once the weights change (optimizer step,
// CopyFrom); it is cleared when the outermost guard closes. A LossScaler is used by one thread at a time.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace farm {

enum class Precision { kFp32, kFp16, kBf16 };

// "fp32" | "fp16" | "bf16" (as learner.precision spells them).
Status ParsePrecision(const std::string& name, Precision* out);
const char* PrecisionName(Precision precision);
// The autocast dtype: kFloat for fp32, kHalf for fp16, kBFloat16 for bf16.
torch::ScalarType PrecisionDtype(Precision precision);

// Whether `precision` can run on `device`: fp16 needs CUDA (CPU autocast is bf16 only); fp16/bf16 need a
// CPU or CUDA device. fp32 runs anywhere.
Status CheckPrecision(Precision precision, torch::Device device);

// The calling thread's autocast state for a device type (CPU or CUDA), whatever the LibTorch version
// (< 2.4: set_enabled/set_cpu_enabled/set_autocast_{gpu,cpu}_dtype; >= 2.4: the *_autocast_* functions
// taking a device type). Prefer AutocastGuard to the setters. Throw std::invalid_argument for other types.
bool AutocastEnabled(torch::DeviceType device_type);
torch::ScalarType AutocastDtype(torch::DeviceType device_type);
void SetAutocastEnabled(torch::DeviceType device_type, bool enabled);
void SetAutocastDtype(torch::DeviceType device_type, torch::ScalarType dtype);

// Autocast region for the calling thread, like Python's `with torch.autocast(device_type, dtype)`.
// fp32: does nothing. Otherwise saves this thread's enabled flag and dtype for the device's type, enables
// autocast with the precision's dtype and increments the nesting count; the destructor decrements it,
// clears the cast cache when the count returns to 0, and restores the saved flag and dtype. Nests.
// Throws std::invalid_argument when CheckPrecision(precision, device) fails.
class AutocastGuard {
 public:
  AutocastGuard(torch::Device device, Precision precision);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

  bool active() const { return active_; }

 private:
  bool active_ = false;
  torch::DeviceType device_type_ = torch::kCPU;
  bool previous_enabled_ = false;
  torch::ScalarType previous_dtype_ = torch::kFloat;
};

struct LossScalerOptions {
  bool enabled = true;          // false: every method is the identity / a plain optimizer step
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;  // consecutive finite steps before the scale grows
};

// Dynamic loss scaling for fp16 training (torch.cuda.amp.GradScaler semantics). Per optimizer step:
//
//   optimizer.zero_grad();
//   scaler.Scale(loss).backward();      // outside the autocast region
//   scaler.Unscale(params);             // before clipping: grads are true gradients afterwards
//   clip_grad_norm_(params, max_norm);
//   scaler.Step(optimizer);             // skipped when some grad is inf/NaN
//   scaler.Update();                    // backoff on overflow, growth after growth_interval good steps
//
// Grads on CUDA use the fused ATen kernels (_amp_foreach_non_finite_check_and_unscale_,
// _amp_update_scale_) with the scale kept in a device tensor; grads elsewhere (CPU) use plain tensor ops.
// Either way the scale and the growth tracker are mirrored on the host, so the accessors never sync.
class LossScaler {
 public:
  using Options = LossScalerOptions;

  explicit LossScaler(Options options = Options());

  // loss * scale (in the loss's dtype); `loss` itself when disabled.
  torch::Tensor Scale(const torch::Tensor& loss);

  // Divides every defined .grad() of `params` in place by the scale and returns whether they are all
  // finite. Pass the parameters the optimizer steps. A second call before Update() does nothing and returns
  // the first call's answer. Disabled: does nothing, returns true.
  bool Unscale(const std::vector<torch::Tensor>& params);

  // optimizer.step() when the grads are finite (unscaling the optimizer's parameters first unless Unscale
  // ran this step); otherwise skips the step and counts it. Returns whether the optimizer stepped.
  // Disabled: a plain optimizer.step(). Throws std::logic_error when called twice before Update().
  bool Step(torch::optim::Optimizer& optimizer);

  // Ends the step: after an overflow scale *= backoff_factor and the growth tracker resets; otherwise the
  // tracker counts the good step and, when it reaches growth_interval, scale *= growth_factor (kept only if
  // finite) and the tracker resets. Throws std::logic_error when neither Unscale nor Step ran this step.
  // Disabled: does nothing.
  void Update();

  bool enabled() const { return options_.enabled; }
  const Options& options() const { return options_; }
  double scale() const { return scale_; }  // the current scale (1 when disabled)
  int64_t skipped_steps() const { return skipped_steps_; }
  int64_t growth_tracker() const { return growth_tracker_; }
  // Whether the last Unscale/Step of this step found an inf/NaN grad (false before either ran).
  bool found_inf() const { return stage_ != Stage::kReady && found_inf_; }

  // The scale, growth tracker and skipped-step count. Options are not stored: they come from the config.
  void Save(torch::serialize::OutputArchive& archive) const;
  // Restores what Save wrote; a step in progress is abandoned. Throws c10::Error on a malformed archive.
  void Load(torch::serialize::InputArchive& archive);

 private:
  enum class Stage { kReady, kUnscaled, kStepped };

  bool UnscaleFused(const std::vector<torch::Tensor>& grads);
  bool UnscalePlain(const std::vector<torch::Tensor>& grads);
  void EnsureDeviceState(const torch::Device& device);

  Options options_;
  double scale_;                // host scale; for the fused path the same float32 value as scale_tensor_
  int64_t growth_tracker_ = 0;  // consecutive finite steps since the last growth or backoff
  int64_t skipped_steps_ = 0;
  Stage stage_ = Stage::kReady;
  bool found_inf_ = false;

  // Fused (CUDA) path, created lazily from the host mirror on the device of the first CUDA loss/grads.
  torch::Tensor scale_tensor_;           // float32 [1]
  torch::Tensor growth_tracker_tensor_;  // int32 [1]
  torch::Tensor found_inf_tensor_;       // float32 [1]
  bool fused_step_ = false;              // this step's grads went through the fused kernels
};

}  // namespace farm
