// V-trace (Espeholt et al. 2018, IMPALA, section 4.1): value targets and policy-gradient advantages for data
// that an older policy (the behaviour policy mu, whose log-probs the rollout stores) collected, corrected by
// clipped importance ratios of the policy being trained (pi) to it. `ppo.advantage: vtrace` replaces GAE with
// it and keeps the PPO clipped loss, as Sample Factory's APPO does.
//
// With rho_t = min(rho_bar, pi/mu) and c_t = lambda min(c_bar, pi/mu) at step t,
//   delta_t = rho_t (r_t + gamma V(x_{t+1}) - V(x_t)),
//   v_t - V(x_t) = delta_t + gamma c_t (v_{t+1} - V(x_{t+1})),  v_T = V(x_T) (the bootstrap value),
//   A_t = r_t + gamma V(x_{t+1}) - V(x_t) + gamma lambda (v_{t+1} - V(x_{t+1}))   (the advantage of a_t),
// where a step that ended its episode (done_t = 1) takes nothing from t + 1 (its reward already holds a
// truncated step's bootstrap, as for GAE). With pi = mu the targets v_t are GAE's lambda-returns and A_t is GAE's
// advantage, for any lambda.
//
// A_t is the advantage of the action taken, a_t: it needs no correction for a_t itself, only for the actions
// after it, which v_{t+1} carries (their rho and c). IMPALA's policy-gradient advantage, rho_t (r_t + gamma
// v_{t+1} - V(x_t)), puts rho_t in front because plain policy gradient has no other importance weight; PPO's
// loss already weights each sample by its ratio pi/mu (clipped), so with rho_t in front every sample is weighted
// by its own ratio twice. On uav_coverage (10 agents, async, 16 workers) that double weight moved the policy 2-3x
// as far per update as GAE and covered about half the cells (records/performance-history.md, "Async correction").
//
// Threading: plain functions and a value type, used by the trainer thread.
#pragma once

#include <torch/torch.h>

#include "common/config.h"
#include "learner/train/ppo_loss.h"
#include "learner/train/rollout.h"

namespace farm {

struct VtraceParams {
  double gamma = 0.99;
  double lambda = 1.0;
  double rho_bar = 1.0;  // clips rho in the TD terms and in the policy-gradient advantage (IMPALA's default)
  double c_bar = 1.0;    // clips the trace coefficients c
};

// What the ratios pi/mu of one computation looked like.
struct VtraceStats {
  double ratio_mean = 0;     // mean pi/mu over the rollout
  double rho_clipped = 0;    // fraction of steps with pi/mu > rho_bar
  double c_clipped = 0;      // fraction of steps with pi/mu > c_bar
};

// log_rhos = log pi(a_t | x_t) - log mu(a_t | x_t), rewards, values V(x_t) and dones: [T, N]; last_value V(x_T): [N].
// Returns the advantages A_t and the targets v_t (`returns`), float32 [T, N] on the inputs' device. Throws
// std::invalid_argument on mismatched shapes or a negative bar.
Advantages ComputeVtrace(const torch::Tensor& log_rhos, const torch::Tensor& rewards, const torch::Tensor& values,
                         const torch::Tensor& dones, const torch::Tensor& last_value, const VtraceParams& params,
                         VtraceStats* stats = nullptr);

// The update's V-trace over one rollout, computed once, at the update's start, from the log-probs and values of
// the policy as it is then: its ratios to the behaviour policy are the policy lag's drift (exactly 1 for data of
// the policy being trained: sync mode, or an async sample of lag 0, where V-trace is GAE), and the advantages and
// targets hold for every epoch, as GAE's do. The update's own epochs move the policy further; PPO's clipped ratio
// bounds that, as it does for GAE. Recomputed every epoch, the ratios would count the update's own drift as lag
// (records/performance-history.md, "Async correction", compares the two); per minibatch is not possible: the
// farm's minibatches are shuffled rows or chunks, not whole trajectories, so a minibatch cannot run the backward
// recursion. The bootstrap V(x_T) is the critic's value at acting time (the rollout keeps no observation past its
// last step).
class VtraceCorrection {
 public:
  // Keeps the rollout's behaviour log-probs, rewards, dones and bootstrap values (host copies).
  VtraceCorrection(const Rollout& rollout, const PpoConfig& config);

  // target_logp, values: [T, N], the policy's at the update's start on the rollout's steps. Adds to the stats.
  Advantages Compute(const torch::Tensor& target_logp, const torch::Tensor& values);

  // Means over the Compute calls so far (one per update).
  VtraceStats stats() const;

 private:
  VtraceParams params_;
  torch::Tensor behaviour_logp_, rewards_, dones_, last_value_;
  VtraceStats sums_;
  int calls_ = 0;
};

}  // namespace farm
