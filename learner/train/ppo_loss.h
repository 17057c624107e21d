// PPO's arithmetic on the ground-floor types (rollout.h), shared by every update path: GAE, the finished agents'
// bootstrap, one minibatch's loss (clipped surrogate, clipped value loss, entropy bonus, as CleanRL's ppo.py), the
// policy's evaluation of rows, and the device-side gradient clip. A new loss term goes in ComputePpoLoss (and, for
// the fused CPU update, its hand-written gradient in ppo_fused_loss.cpp).
//
// Threading: free functions; each uses only its arguments (the policy's autocast regions are the calling thread's).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "common/config.h"
#include "learner/model/amp.h"
#include "learner/model/policy.h"
#include "learner/train/rollout.h"

namespace farm {

// Throws std::invalid_argument "<what> has shape [..], expected [..]" (or "<what> is undefined").
void RequireShape(const torch::Tensor& t, torch::IntArrayRef expected, const char* what);

// GAE(gamma, lambda): delta_t = r_t + gamma * V_{t+1} * (1 - done_t) - V_t,
// A_t = delta_t + gamma * lambda * (1 - done_t) * A_{t+1}, V_T = last_value.
Advantages ComputeGae(const torch::Tensor& rewards, const torch::Tensor& values, const torch::Tensor& dones,
                      const torch::Tensor& last_value, double gamma, double lambda);

// The rollout with every finished agent's last active step made an end of its own (rollout.active): where row n
// acted at step t and not at t + 1 while its env went on, the step gets done set and, with `bootstrap`
// (ppo.bootstrap_truncated, as for the time limit's truncations), gamma * values[t + 1] added to its reward, so
// that GAE and V-trace bootstrap from the value of the observation it finished on and carry nothing back from the
// rows that no longer act. An agent terminated alone already has done set (nothing is added then). The same
// rollout (shallow) when it has no active mask.
Rollout BootstrapFinishedAgents(const Rollout& rollout, double gamma, bool bootstrap = true);

// `mask` (float [B]): 1 for rows that count, 0 for rows left out (finished agents); every term, the statistics and
// the advantage normalisation are means over the rows that count (none counting: 0). Undefined: every row counts
// (the same arithmetic, with a mask of ones).
PpoLoss ComputePpoLoss(const EvalOutput& eval, const torch::Tensor& old_logp, const torch::Tensor& old_values,
                       const torch::Tensor& advantages, const torch::Tensor& returns, const PpoConfig& config,
                       const torch::Tensor& mask = {});

// The rows of units `unit_idx` (unit u: rows u * k .. u * k + k - 1; the units themselves when k is 1);
// `arange_k` is torch::arange(k) on their device.
torch::Tensor UnitRows(const torch::Tensor& unit_idx, int64_t k, const torch::Tensor& arange_k);

// The policy on units `unit_idx` (their rows `row_idx`, from UnitRows): the forward in `precision`
// (AutocastGuard), its outputs cast to float32. Every evaluation of rows (a minibatch's loss, V-trace's
// pass at the update's start) goes through it, so they all see the same numbers.
EvalOutput EvaluateUnits(ActorCriticImpl& policy, const PpoRows& rows, const torch::Tensor& unit_idx,
                         const torch::Tensor& row_idx, Precision precision);

// One minibatch's loss, as both LibTorch-path updates (PpoTrainer's and GraphedPpoStep's) compute it: the
// minibatch is the units `unit_idx`, each `k` consecutive rows sharing one state (k = 1: rows on their own);
// `arange_k` is torch::arange(k) on the device. The forward runs in `precision` (AutocastGuard) and its
// outputs are cast to float32, so that the loss (exp of log-ratios, squares, means) is float32 whatever the
// precision. No host synchronisation: a CUDA graph can record it.
PpoLoss MinibatchLoss(ActorCriticImpl& policy, const PpoRows& rows, const torch::Tensor& unit_idx, int64_t k,
                      const torch::Tensor& arange_k, Precision precision, const PpoConfig& config);

// The policy's log-probs and values on every row of `rows` (no gradient), float32 [B] each, evaluated in
// slices of whole units (k rows sharing a state) as MinibatchLoss evaluates a minibatch.
std::pair<torch::Tensor, torch::Tensor> EvaluateRows(ActorCriticImpl& policy, const PpoRows& rows, int64_t k,
                                                     Precision precision);

// A minibatch's statistics, float64 [6] in the order PpoStats lists them: policy loss, value loss, entropy,
// approx KL, old approx KL, clip fraction.
torch::Tensor LossStats(const PpoLoss& loss);

// clip_grad_norm_ without its host synchronisation (LibTorch's returns the norm as a double, which waits
// for the backward pass): the norm and the clip coefficient stay on the device, so the host can queue the
// optimizer step and the next minibatch meanwhile. Same arithmetic: total = ||(||g_i||)_i||,
// g *= min(max_norm / (total + 1e-6), 1). Returns the total norm (float64 scalar, on the grads' device).
// PpoTrainer uses it on CUDA; on the CPU it keeps LibTorch's (nothing to overlap there).
torch::Tensor ClipGradNormOnDevice(const std::vector<torch::Tensor>& params, double max_norm);

}  // namespace farm
