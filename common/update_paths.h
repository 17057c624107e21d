// The ways PPO's update can be taken, and what each one takes, in one table. Config validation reads it to refuse
// ppo.fused_update=on or ppo.graph_update=on for a run that path cannot take; the trainer (learner/train/ppo.h)
// reads it to pick a path for its policy and its ranks. A refusal is the table's sentence for that
// path and need, filled in with the setting that asked for it.
//
//   need                                   fused   graphed  libtorch
//   a recurrent core (ppo.core)            -       -        yes
//   a centralised critic (global state)    -       yes      yes
//   value normalisation (ppo.value_norm)   -       yes      yes
//   learner ranks                          yes     -        yes
//   state-dependent exploration (ppo.sde)  -       yes      yes
//   a TorchScript encoder                  -       -        yes
//   an encoder other than the mlp          -       yes      yes
//   an activation other than tanh          -       yes      yes
//   layer norm (ppo.layer_norm)            -       yes      yes
//   bf16                                   -       yes      yes
//   fp16                                   -       -        yes
//   a CUDA device                          -       yes      yes
//
// Beyond the table each path checks its own structure when it is built: the fused update the ActorCritic's layout
// and float32 CPU parameters (CheckFusedUpdate), the graphed step Adam's options (GraphedPpoStep::Check).
// A new update path adds a column here; a new capability adds a row, and the paths that take it say so.
// Finished agents' rows are no row: every path takes the rollout's active mask (ones where every agent acted).
//
// Threading: constant data and pure functions.
#pragma once

#include <array>
#include <string>

#include "common/status.h"

namespace farm {

struct FarmConfig;

enum class UpdatePath : int { kFused, kGraphed, kLibtorch };
inline constexpr int kNumUpdatePaths = 3;

enum class UpdateNeed : int {
  kCore,
  kCentralisedCritic,
  kValueNorm,
  kRanks,
  kSde,
  kEncoderScript,
  kEncoder,
  kActivation,
  kLayerNorm,
  kBf16,
  kFp16,
  kCuda,
};
inline constexpr int kNumUpdateNeeds = 12;

// "the fused update", "the graphed step", "the LibTorch update".
const char* UpdatePathName(UpdatePath path);
// As PpoStats and summary.json's update_path say it: "fused", "graphed", "libtorch".
const char* UpdatePathId(UpdatePath path);
// The key that asks for it: "ppo.fused_update", "ppo.graph_update"; null for the LibTorch update (always there).
const char* UpdatePathKey(UpdatePath path);
// The need as the table's row names it ("a recurrent core (ppo.core)").
const char* UpdateNeedName(UpdateNeed need);
// Whether `path` takes `need`.
bool Takes(UpdatePath path, UpdateNeed need);

// What one run (or one rollout) asks of its update path: for each need, the setting that asks for it
// ("ppo.core=gru", "2 learner ranks"); none asked by default.
class UpdateNeeds {
 public:
  void Ask(UpdateNeed need, std::string setting);
  void Drop(UpdateNeed need);
  bool asks(UpdateNeed need) const { return !settings_[static_cast<int>(need)].empty(); }
  const std::string& setting(UpdateNeed need) const { return settings_[static_cast<int>(need)]; }

 private:
  std::array<std::string, kNumUpdateNeeds> settings_;
};

// The needs a config states. A centralised critic, finished agents and ranks appear only when the run starts (the
// env's spec, its rollouts, torchrun's or Slurm's environment): the trainer asks for them.
UpdateNeeds ConfigNeeds(const FarmConfig& config);

// Ok when `path` takes every need asked; otherwise the table's refusal of the first one it does not take, naming
// the key that asked for the path and the setting that asked for the need, e.g. "ppo.fused_update=on cannot train
// ppo.core=gru (the fused update knows only feed-forward MLPs)".
Status CheckUpdatePath(UpdatePath path, const UpdateNeeds& needs);

// The table above, rendered from the data (one line per need); update_paths_test keeps this header's copy true.
std::string UpdatePathTable();

}  // namespace farm
