// Checkpoints: policy, optimizer, counters and (optionally) the fp16 loss
// scaler's state in one LibTorch archive, written atomically (temp file,
// fsync, rename).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

#include "common/status.h"
#include "learner/amp.h"
#include "learner/policy.h"

namespace farm {

struct TrainingCounters {
  int64_t env_steps = 0;
  int64_t updates = 0;
  int64_t policy_version = 0;
  int64_t episodes = 0;
  double wall_seconds = 0;
};

// Writes dir/ckpt-<updates>.pt and points dir/latest at it. A non-null
// `scaler` is stored under "loss_scaler".
Status SaveCheckpoint(const std::string& dir, ActorCritic& policy, torch::optim::Optimizer& optimizer,
                      const TrainingCounters& counters, std::string* written_path = nullptr,
                      const LossScaler* scaler = nullptr);

// Loads a checkpoint written by SaveCheckpoint into `policy` and `optimizer`
// (same architecture) and `counters`. A non-null `scaler` gets the stored
// "loss_scaler" state; a checkpoint without one (older, or saved without a
// scaler) leaves `scaler` as it is.
Status LoadCheckpoint(const std::string& path, ActorCritic& policy, torch::optim::Optimizer* optimizer,
                      TrainingCounters* counters, LossScaler* scaler = nullptr);

}  // namespace farm
