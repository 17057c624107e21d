// The fused CPU PPO update: the same update as PpoTrainer's LibTorch path (autograd + torch::optim::Adam),
// written out by hand for the ActorCritic MLP so that one gradient step is a dozen small GEMMs and a few
// loops over preallocated buffers instead of ~200 dispatched ops (dispatcher, autograd, allocator).
//
// Per minibatch, exactly as PpoTrainer::Update's LibTorch path (see docs/PERFORMANCE.md, "The PPO update"):
//   gather the minibatch rows (the trainer's generator draws the same randperm per epoch),
//   forward critic and actor (Linear + tanh, through the register-blocked kernels of learner/model/cpu_kernels.h
//   on preallocated buffers: no autograd, no allocation, no BLAS),
//   the loss terms (normalised advantages if norm_adv, clipped surrogate, clipped or plain value loss,
//   entropy bonus) and their gradients by hand, backward through both MLPs,
//   clip_grad_norm_(max_grad_norm) over all parameters, then Adam with LibTorch's formula.
// Parameters stay the module's own tensors (written in place) and the Adam moments stay in the optimizer's
// AdamParamState (created when missing), so checkpoints, --resume, CopyFrom and export see no difference
// and a run may switch between the two paths.
//
// Threading: a FusedPpoUpdate is used by one thread at a time (the trainer's). Run writes the policy's
// parameters and the optimizer's state in place: nothing else may read or write them while it runs.
// When the calling thread allows LibTorch two or more intra-op threads (at::get_num_threads(), which the
// learner sets from learner.threads), Run passes each minibatch's critic pass (forward, value loss,
// backward: its own buffers and gradient slices) to a helper thread that the object owns, and runs the
// actor's pass meanwhile; the two meet before the gradient clip. The helper waits on a condition variable
// between minibatches and is joined by the destructor.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <atomic>
#include <map>
#include <memory>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "learner/model/amp.h"
#include "learner/model/policy.h"
#include "learner/train/gradient_reducer.h"
#include "learner/train/ppo_loss.h"
#include "learner/train/rollout.h"

namespace farm {

// Whether `policy` is laid out as the fused update's code expects: the ActorCritic's actor and critic Sequentials of
// Linear, Tanh, ..., Linear on the observation, log_std only for a box action space, nothing else, and contiguous
// float32 CPU parameters. The message says what is not. What the fused update takes beyond its layout (no recurrent
// core, fp32 only, ...) is the update paths' table's (common/update_paths.h), which PpoTrainer reads first.
Status CheckFusedUpdate(ActorCriticImpl& policy);

// One update's flattened rollout, on the CPU: obs [B, obs...]; actions [B] (discrete), [B, K] (multi-discrete) or [B, A] (box); logp,
// values, advantages, returns [B]. Run reads them as float32 (int64 discrete actions), contiguous, converting
// only when they are not.
struct PpoBatch {
  torch::Tensor obs;
  torch::Tensor actions;
  torch::Tensor logp;
  torch::Tensor values;
  torch::Tensor advantages;
  torch::Tensor returns;
  // float [B]: 1 where the row's agent acted, 0 where it had finished (Rollout::active; undefined: every row acted).
  // Rows left out count in no loss term, statistic or advantage moment, as ComputePpoLoss's mask.
  torch::Tensor active;
  // True when the advantages were already normalised over the whole update (ranks: over every rank's rollout);
  // otherwise each minibatch normalises its own when ppo.norm_adv is set.
  bool advantages_normalised = false;
};

class FusedPpoUpdate {
 public:
  // Throws std::invalid_argument when CheckFusedUpdate fails.
  FusedPpoUpdate(ActorCritic policy, const PpoConfig& config);
  ~FusedPpoUpdate();
  FusedPpoUpdate(const FusedPpoUpdate&) = delete;
  FusedPpoUpdate& operator=(const FusedPpoUpdate&) = delete;

  // The update's epochs over `batch` (the learning rate already set in `optimizer`'s param groups, as the
  // trainer does it). Fills stats->{policy_loss, value_loss, entropy, approx_kl, old_approx_kl,
  // clip_fraction, grad_norm, epochs}. Throws std::invalid_argument on malformed input or an optimizer that
  // does not hold every parameter; c10::Error on an out-of-range discrete action (as gather would).
  // `reducer` takes each minibatch's flat gradient buffer between the backward passes and the clip: a OneRankReducer
  // leaves it as it is; ranks make it the mean over every rank's minibatch, take ppo.num_minibatches minibatches
  // whatever their batch (a rank's empty ones contribute nothing but still step), and decide target_kl's stop and a
  // stop request together. `cancel`: as PpoTrainer::Update's (stops after the minibatch step in progress, at least
  // one).
  void Run(const PpoBatch& batch, torch::Generator& generator, torch::optim::Adam& optimizer,
           GradientReducer& reducer, PpoStats* stats, const std::atomic<bool>* cancel = nullptr);

 private:
  struct Layer;
  struct Net;
  struct NetBuffers;
  struct Workspace;
  struct Param;
  class Helper;

  void Bind(torch::optim::Adam& optimizer);
  Workspace& WorkspaceFor(int64_t rows);
  void Gather(const PpoBatch& batch, const int64_t* index, Workspace& ws) const;
  void NormalizeAdvantages(Workspace& ws) const;
  void RefreshTransposedWeights();
  void ForwardNet(const Net& net, NetBuffers& buffers, const float* x, int64_t rows) const;
  void BackwardNet(const Net& net, NetBuffers& buffers, const float* x, int64_t rows) const;
  void PolicyLoss(Workspace& ws, double* stats);
  void ValueLoss(Workspace& ws, double* stats) const;
  void CriticPass(Workspace& ws, double* stats);  // forward, value loss, backward
  void ActorPass(Workspace& ws, double* stats);   // forward, policy loss, backward
  double ClipGradients();
  void AdamStep();

  ActorCritic policy_;
  PpoConfig config_;
  bool discrete_;  // categorical heads: discrete or multi-discrete (a discrete space is one component)
  std::vector<int64_t> segments_;  // categorical: choices per component ({n} or nvec); their sum is head_dim_
  int64_t obs_dim_;
  int64_t head_dim_;  // logits (categorical: sum of segments_) or action dimensions (box)
  std::unique_ptr<Net> actor_;
  std::unique_ptr<Net> critic_;
  torch::Tensor log_std_;      // box only: the parameter itself
  std::vector<float> grads_;   // every parameter's gradient, back to back in the module's parameter order
  std::vector<Param> params_;  // in the module's parameter order, each with its slice of grads_
  float* log_std_grad_ = nullptr;
  std::map<int64_t, std::unique_ptr<Workspace>> workspaces_;  // by minibatch size (at most two per update)
  std::unique_ptr<Helper> helper_;                            // started by the first Run allowed two threads
};

}  // namespace farm
