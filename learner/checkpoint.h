// Checkpoints: policy, optimizer, counters and (optionally) the fp16 loss
// scaler's state in one LibTorch archive, written atomically (temp file,
// fsync, rename). Also the run's policy_spec.json (the spaces and widths that
// rebuild the ActorCritic) and LoadPolicy, which rebuilds a run's latest policy
// for the tools (farm-eval, farm-export).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/space.h"
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

// Writes dir/ckpt-<updates>.pt (temp file, fsync, rename), its CRC32C in
// ckpt-<updates>.pt.crc32c, and points dir/latest at it. A non-null `scaler`
// is stored under "loss_scaler". keep > 0: only the newest `keep` remain.
Status SaveCheckpoint(const std::string& dir, ActorCritic& policy, torch::optim::Optimizer& optimizer,
                      const TrainingCounters& counters, std::string* written_path = nullptr,
                      const LossScaler* scaler = nullptr, int keep = 0);

// Loads a checkpoint written by SaveCheckpoint into `policy` and `optimizer`
// (same architecture) and `counters`. A non-null `scaler` gets the stored
// "loss_scaler" state; a checkpoint without one (older, or saved without a
// scaler) leaves `scaler` as it is.
Status LoadCheckpoint(const std::string& path, ActorCritic& policy, torch::optim::Optimizer* optimizer,
                      TrainingCounters* counters, LossScaler* scaler = nullptr);

// Checkpoint files in `dir` (ckpt-*.pt), newest first.
std::vector<std::string> ListCheckpoints(const std::string& dir);

// CRC32C of a whole file (SaveCheckpoint records it in <checkpoint>.crc32c).
Status FileCrc32c(const std::string& path, uint32_t* crc);

// The newest checkpoint whose checksum matches its .crc32c file. Checkpoints
// passed over (truncated, corrupt, unchecked) are described in `skipped`.
Status FindLatestValidCheckpoint(const std::string& dir, std::string* path, std::vector<std::string>* skipped);

// policy_spec.json: what ActorCritic's constructor needs, written by the
// learner when it creates the policy:
//   {"observation": SPACE, "action": SPACE, "hidden_sizes": [64, 64]}
//   SPACE = {"kind": "discrete"|"box", "shape": [..], "n": N, "low": [..], "high": [..]}
// A box's low/high hold numel() numbers each (n is 0); a discrete space has
// shape/low/high empty and n > 0. JSON has no infinities: a non-finite bound is
// written as the string "inf", "-inf" or "nan".
std::string PolicySpecJson(const Space& obs, const Space& action, const std::vector<int>& hidden);

// Parses PolicySpecJson's text; `source` (a file name) prefixes every error,
// which names the offending key and what was expected.
Status ParsePolicySpecJson(const std::string& text, const std::string& source, Space* obs, Space* action,
                           std::vector<int>* hidden);

// Rebuilds a run's latest policy on the CPU: reads run_dir/config.yaml into
// `config`, run_dir/policy_spec.json, and the checkpoint named by
// run_dir/checkpoints/latest (its counters into `counters`, its weights into a
// new `policy`; the optimizer state is skipped). Errors name the missing or
// corrupt file and what was expected. `checkpoint_path` (optional) receives the
// checkpoint's path. `counters` may be null.
Status LoadPolicy(const std::string& run_dir, ActorCritic* policy, FarmConfig* config, TrainingCounters* counters,
                  std::string* checkpoint_path = nullptr);

}  // namespace farm
