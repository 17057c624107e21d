// The PPO minibatch step as one fixed-shape program over preallocated buffers, so that on CUDA it is
// captured once into a CUDA graph and replayed: gather of the minibatch, forward, loss, backward, grad-norm
// clip and Adam, with no host work per minibatch but one copy and one graph launch. A small MLP's update
// is otherwise bound by the host launching several hundred tiny kernels per minibatch
// (records/performance-history.md, "GPU: one NVIDIA H200": the trainer thread busy ~90% of wall time while the
// GPU idled).
//
// Same arithmetic as PpoTrainer's LibTorch path (ComputePpoLoss, ClipGradNormOnDevice, torch::optim::Adam
// without weight decay or amsgrad). Adam runs on the device with its step count in a device tensor (a
// host step count would be frozen into the graph); its moments are torch::optim::Adam's own state tensors,
// updated in place, and the host step count is written back after each update, so checkpoints and the
// LibTorch path see one optimizer.
//
// Threading: an instance belongs to the trainer's thread; Step replays on that thread's current CUDA
// stream. Captures use CUDA's thread-local capture mode, so that the inference thread's copies and
// synchronisations stay legal meanwhile.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>

#include "common/config.h"
#include "common/status.h"
#include "learner/model/amp.h"
#include "learner/model/policy.h"
#include "learner/train/ppo_loss.h"
#include "learner/train/rollout.h"

namespace farm {

class GraphedPpoStep {
 public:
  // One update's batch, flattened to rows and on the policy's device (states: per row, or undefined).
  using Batch = PpoRows;
  // Sums over the steps of one update (device tensors).
  struct Sums {
    torch::Tensor stats;      // float64 [6]: policy loss, value loss, entropy, approx KL, old approx KL, clip frac
    torch::Tensor grad_norm;  // float64 scalar: pre-clip grad norms
    int64_t steps = 0;        // optimizer steps taken (a minibatch with no acting row takes none)
  };

  // Whether the step can run with this optimizer: Adam without weight decay or amsgrad, one set of betas and eps.
  // What else it takes (no fp16: dynamic loss scaling decides each step on the host; no recurrent core, ...) is the
  // update paths' table's (common/update_paths.h), which PpoTrainer reads first.
  static Status Check(torch::optim::Adam& optimizer);
  // Whether Adam's state (moments, and one step count shared by all parameters) exists for every
  // parameter: the first update of a run takes the LibTorch path, which creates it.
  static bool HasOptimizerState(torch::optim::Adam& optimizer);

  // capture: record the step into a CUDA graph (a CUDA device and a CUDA build are required; otherwise
  // std::invalid_argument). false: run the same program eagerly, step by step (the reference the graph
  // is tested against, and what the CPU tests exercise).
  GraphedPpoStep(ActorCritic policy, const PpoConfig& config, Precision precision, torch::optim::Adam* optimizer,
                 bool capture);
  ~GraphedPpoStep();
  GraphedPpoStep(const GraphedPpoStep&) = delete;
  GraphedPpoStep& operator=(const GraphedPpoStep&) = delete;

  // Starts an update: copies `batch` into the static buffers (batch.active undefined: every row acted; a new shape
  // reallocates them and drops the graph), sets the learning rate and reads the step count from the optimizer. Each
  // minibatch holds `units_per_minibatch` runs of `rows_per_state` consecutive rows (PpoTrainer's units).
  void Begin(const Batch& batch, int64_t rows_per_state, int64_t units_per_minibatch, double lr);
  // One optimizer step on the units `unit_idx` (int64 [units_per_minibatch], on the device). The first
  // steps after a new shape run eagerly on a side stream (warm-up), then one capture; replays after.
  void Step(const torch::Tensor& unit_idx);
  // The last step's approx KL (float32 device scalar; valid until the next Step).
  torch::Tensor last_approx_kl() const;
  // Ends the update: the sums over its steps. Writes the step count back into the optimizer's state.
  Sums End();

  // Graphs captured so far (one per batch shape; 0 when running eagerly).
  int captures() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace farm
