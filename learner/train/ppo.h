// PPO update (clipped surrogate, clipped value loss, entropy bonus, GAE) as
// CleanRL's ppo.py does it. The update returns its statistics as data.
//
// Threading: a PpoTrainer is used by one thread at a time (its autocast regions are that thread's).
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <memory>
#include <string>

#include "common/config.h"
#include "learner/model/amp.h"
#include "learner/model/policy.h"
#include "learner/train/gradient_reducer.h"
#include "learner/train/ppo_loss.h"
#include "learner/train/rollout.h"
#include "common/update_paths.h"

namespace farm {

class FusedPpoUpdate;   // learner/train/ppo_fused.h
class GraphedPpoStep;   // learner/train/ppo_graph.h
class ValueNormalizer;  // learner/train/value_norm.h

class PpoTrainer {
 public:
  // `policy` must already be on its device. `precision`: fp32; bf16 (CPU or CUDA autocast); fp16 (CUDA
  // autocast with dynamic loss scaling). Throws std::invalid_argument when CheckPrecision fails for the
  // policy's device (e.g. fp16 on the CPU).
  // The update's path comes from the update paths' table (common/update_paths.h): what the policy, the precision,
  // the device and (SetReducer) the ranks ask, against what each path takes. config.fused_update: "auto" uses
  // FusedPpoUpdate (ppo_fused.h) when the table and its own layout check (CheckFusedUpdate) allow, the LibTorch
  // path otherwise; "on" requires it (std::invalid_argument quoting the table's refusal); "off" never uses it.
  // config.graph_update picks the CUDA-graph step (ppo_graph.h) for the LibTorch path alike: "auto" on CUDA, "on"
  // anywhere the table and GraphedPpoStep::Check allow. Every path takes finished agents' rows (Rollout::active):
  // the trainer makes the mask ones where the rollout has none.
  PpoTrainer(ActorCritic policy, const PpoConfig& config, uint64_t seed, Precision precision = Precision::kFp32);
  ~PpoTrainer();

  // One PPO update on `rollout`. `progress` in [0, 1] is the fraction of the
  // run done before this update (drives linear LR annealing).
  // Per minibatch: forward and loss under AutocastGuard (the loss in float32), backward of the scaled loss,
  // unscale, grad-norm clip, optimizer step (skipped on inf/NaN grads), scale update.
  // `cancel` (optional): when it becomes true the update stops after the minibatch step in progress (at least
  // one runs), with stats.cancelled set; the parameters are those of the steps that ran.
  PpoStats Update(const Rollout& rollout, double progress, const std::atomic<bool>* cancel = nullptr);

  ActorCritic policy() const { return policy_; }
  torch::optim::Adam& optimizer() { return *optimizer_; }
  // Enabled only for fp16; its state belongs in checkpoints (SaveCheckpoint/LoadCheckpoint take it).
  LossScaler& scaler() { return scaler_; }
  // Minibatch shuffling; its state belongs in checkpoints (RunState, learner/run/checkpoint.h).
  torch::Generator& generator() { return generator_; }
  Precision precision() const { return precision_; }
  // Whether Update runs the fused CPU path (it takes finished agents' rollouts too; not the graphed step).
  bool fused() const { return fused_ != nullptr; }
  // The path the last Update took: "fused", "graphed" or "libtorch" (before any: the one it would take for a
  // rollout without an active mask, short of the graphed step, which needs a first LibTorch update).
  const char* last_update_path() const { return last_path_ ? last_path_ : fused_ ? "fused" : "libtorch"; }
  // Updates run by the graphed step (GraphedPpoStep), and graphs it captured.
  int64_t graphed_updates() const { return graphed_updates_; }
  int graph_captures() const;

  // Makes this trainer one rank of a data-parallel group (DD-PPO) when `reducer` is a RankReducer of several ranks
  // (a OneRankReducer, the default, makes it a learner alone again). Rank 0's parameters and Adam state are
  // broadcast at the next Update's start (a collective: every rank's trainer must have its reducer by then); from
  // then on each minibatch's gradient is the per-sample mean over every rank's minibatch, the advantages are
  // normalised once per update with the moments of every rank's rollout (as habitat's DD-PPO does, in place of
  // per-minibatch moments), the share of samples within ppo.max_policy_lag, target_kl's stop and a stop request are
  // decided over all ranks, and every ppo-wide figure stays identical on every rank. The fused update takes ranks
  // (its flat gradient buffer is all-reduced whole); the graphed step does not: auto falls back to the LibTorch
  // update, on throws std::invalid_argument quoting the table. Every rank must call Update as often as the others.
  void SetReducer(std::shared_ptr<GradientReducer> reducer);
  // Never null: a OneRankReducer for a learner alone.
  GradientReducer* reducer() const { return reducer_.get(); }

 private:
  // The update's phases, in order: Plan (the rollout checked, its units, the samples kept and the learning rate),
  // Prepare (GAE or V-trace, the rows and chunks on the device), then one of the three ways to take the epochs.
  struct Plan;
  struct Batch;
  Plan PlanUpdate(const Rollout& rollout, double progress, PpoStats* stats) const;
  Batch Prepare(const Rollout& rollout, const Plan& plan, PpoStats* stats);
  void RunFused(const Batch& batch, const Plan& plan, PpoStats* stats, const std::atomic<bool>* cancel);
  // Whether the graphed step can take this update (and then it has).
  bool RunGraphed(const Batch& batch, const Plan& plan, PpoStats* stats, const std::atomic<bool>* cancel);
  void RunMinibatches(const Batch& batch, const Plan& plan, PpoStats* stats, const std::atomic<bool>* cancel);
  // Ranks: the advantages normalised with the moments of every rank's kept samples.
  void NormaliseAcrossRanks(const Plan& plan, Batch* batch);
  // ppo.value_norm: the update's returns folded into the statistics (every rank's), then the batch's values and
  // returns normalised for the value loss (its explained variance keeps the returns' scale).
  void NormaliseValues(Batch* batch, PpoStats* stats);
  // What the policy, the precision, the device and the ranks ask of the update path (common/update_paths.h).
  UpdateNeeds PolicyNeeds() const;
  // fused_ and use_graph_ from needs_ and ppo.fused_update / ppo.graph_update; throws std::invalid_argument for an
  // "on" the table (or the path's own check) refuses.
  void ChoosePaths();
  // One epoch's order of the units (the minibatch shuffling generator on the CPU).
  torch::Tensor Permutation(int64_t units, const torch::Device& device);

  ActorCritic policy_;
  PpoConfig config_;
  Precision precision_;
  torch::Device device_;
  std::unique_ptr<torch::optim::Adam> optimizer_;
  LossScaler scaler_;
  torch::Generator generator_;  // minibatch shuffling
  std::unique_ptr<FusedPpoUpdate> fused_;  // set when the fused path is used
  bool use_graph_ = false;                 // graph_update chosen (built on the first update that can use it)
  std::unique_ptr<GraphedPpoStep> graphed_;
  std::unique_ptr<ValueNormalizer> value_norm_;  // ppo.value_norm (null: none)
  UpdateNeeds needs_;
  int64_t graphed_updates_ = 0;
  const char* last_path_ = nullptr;  // last_update_path (null: no update yet)
  std::shared_ptr<GradientReducer> reducer_;  // a OneRankReducer, or one rank's of several (SetReducer)
  bool synced_ = false;                       // rank 0's parameters broadcast since the reducer was set
  int64_t updates_ = 0;
};

}  // namespace farm
