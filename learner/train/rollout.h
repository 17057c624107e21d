// The ground floor of PPO's update (learner/train): the types every update path, every loss and the trainer share.
// A rollout as the store hands it over, its advantages, its rows on the device, one minibatch's loss terms and an
// update's statistics. Nothing here knows how an update is taken: the update paths (ppo_fused.h, ppo_graph.h,
// ppo_chunks.h), the losses (ppo_loss.h, vtrace.h) and the trainer (ppo.h) include this file, never one another's
// headers upwards.
//
// Threading: plain values; a Rollout's tensors are read, never written, by the update that takes it.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace farm {

// Added to the standard deviation when advantages are normalised per minibatch (every update path).
inline constexpr double kAdvantageEps = 1e-8;

// One rollout, time-major: T steps of N envs.
struct Rollout {
  torch::Tensor obs;       // float [T, N, obs...]
  // float [T, N / k, state...] with k = rows_per_state: the critic's global state, one per run of k rows
  // (an env's agents); undefined without one.
  torch::Tensor states;
  // Rows n * k .. n * k + k - 1 share state n (the k agents of an env): the critic runs once per such run,
  // and minibatches take whole runs. 1: every row on its own.
  int64_t rows_per_state = 1;
  torch::Tensor actions;   // int64 [T, N] (discrete), int64 [T, N, K] (multi-discrete) or float [T, N, A]
  torch::Tensor logp;      // float [T, N] behaviour log-probs
  torch::Tensor values;    // float [T, N] values at acting time
  torch::Tensor rewards;   // float [T, N] (truncation bootstrap already added)
  torch::Tensor dones;     // float [T, N] 1 when the episode ended at this step
  torch::Tensor last_value;  // float [N] value of the observation after step T-1
  // With a recurrent core: float [T / bptt, N, core state], each row's state at the start of each chunk of
  // bptt steps (undefined, and bptt 0, without one).
  torch::Tensor core_states;
  int64_t bptt = 0;
  // int64 [T, N]: updates between the policy that acted on each step and the one this rollout trains
  // (undefined: all 0). ppo.max_policy_lag leaves the older ones out of the loss.
  torch::Tensor lag;
  // float [T, N]: 1 where the row's agent acted, 0 where it had finished before its env ended (a multi-agent env
  // whose agents finish early: StepRequest.active). Such rows are left out of every loss term and of the
  // advantage normalisation, as MAPPO's active masks do. Undefined: every row acted.
  torch::Tensor active;
};

struct Advantages {
  torch::Tensor advantages;  // float [T, N]
  torch::Tensor returns;     // float [T, N] advantages + values
};

struct PpoStats {
  double policy_loss = 0;
  double value_loss = 0;
  double entropy = 0;
  double approx_kl = 0;
  double old_approx_kl = 0;
  double clip_fraction = 0;
  double explained_variance = 0;
  // The spread (population std) over the batch of the values the acting policy predicted, and of the returns
  // they are trained towards. value_std 0 while return_std is not: the critic gives every row one value
  // (CriticWatch, learner/train/critic_watch.h).
  double value_std = 0;
  double return_std = 0;
  double learning_rate = 0;
  double grad_norm = 0;       // mean pre-clip norm over the minibatches whose optimizer step ran
  double loss_scale = 1;      // the loss scaler's scale after the update (1 unless fp16)
  int64_t skipped_steps = 0;  // optimizer steps skipped in this update for inf/NaN grads (fp16 only)
  int epochs = 0;             // epochs begun (target_kl may stop early; a cancelled update counts its last)
  int64_t samples = 0;
  bool cancelled = false;     // cut short by Update's `cancel` (a stop request): fewer minibatch steps ran
  // ppo.advantage=vtrace (learner/train/vtrace.h): means over the epochs of the ratio pi/mu and of the fractions
  // of steps whose ratio the rho and c bars clipped. Listed by Items only when `vtrace`.
  // ppo.max_policy_lag: samples left out of this update's loss for their lag (whole units: an env's agents, a
  // chunk), and the learning rate scaled by the fraction kept (learning_rate is the scaled one).
  int64_t lag_dropped = 0;
  // Rows whose agent had finished before its env ended (Rollout::active), left out of every loss term (0 with
  // ppo.active_masks off).
  int64_t masked_rows = 0;
  bool vtrace = false;
  double vtrace_ratio = 0;
  double vtrace_rho_clipped = 0;
  double vtrace_c_clipped = 0;
  // ppo.value_norm (learner/train/value_norm.h): the statistics after this update's returns were folded in (the
  // critic's head is trained towards (return - mean) / std). Listed by Items only when `value_norm`.
  bool value_norm = false;
  double value_norm_mean = 0;
  double value_norm_std = 1;
  // The share of the critic's tanh outputs at +-1 after the update, on a sample of its rollout
  // (RolloutCriticSaturation, critic_watch.h; set by the trainer thread). Listed by Items only when set: a critic
  // with tanh layers.
  std::optional<double> critic_saturation;

  std::vector<std::pair<std::string, double>> Items() const;
};

// The PPO loss terms for one minibatch (exposed for tests).
struct PpoLoss {
  torch::Tensor total;
  torch::Tensor policy_loss;
  torch::Tensor value_loss;
  torch::Tensor entropy;
  torch::Tensor approx_kl;      // mean((ratio - 1) - log ratio), no grad
  torch::Tensor old_approx_kl;  // mean(-log ratio), no grad
  torch::Tensor clip_fraction;  // mean(|ratio - 1| > clip), no grad
};

// One update's rollout flattened to rows, on the policy's device: the advantages and returns from GAE, the
// states per unit (a run of k rows; undefined without a centralised critic).
struct PpoRows {
  torch::Tensor obs;
  torch::Tensor states;
  torch::Tensor actions;
  torch::Tensor logp;
  torch::Tensor values;
  torch::Tensor advantages;
  torch::Tensor returns;
  torch::Tensor active;  // float [B]: Rollout::active flattened (PpoTrainer always gives it; undefined: every row acted)
};

}  // namespace farm
