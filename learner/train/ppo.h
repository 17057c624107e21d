// PPO update (clipped surrogate, clipped value loss, entropy bonus, GAE) as
// CleanRL's ppo.py does it. The update returns its statistics as data.
//
// Threading: a PpoTrainer is used by one thread at a time (its autocast regions are that thread's).
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/config.h"
#include "learner/model/amp.h"
#include "learner/model/policy.h"

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

// `mask` (float [B], optional): 1 for rows that count, 0 for rows left out (finished agents); every term, the
// statistics and the advantage normalisation are then means over the rows that count (none counting: 0).
PpoLoss ComputePpoLoss(const EvalOutput& eval, const torch::Tensor& old_logp, const torch::Tensor& old_values,
                       const torch::Tensor& advantages, const torch::Tensor& returns, const PpoConfig& config,
                       const torch::Tensor& mask = {});

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
  torch::Tensor active;  // float [B]: Rollout::active flattened (undefined: every row acted)
};

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

class FusedPpoUpdate;   // learner/train/ppo_fused.h
class GraphedPpoStep;   // learner/train/ppo_graph.h
class GradientReducer;  // learner/train/gradient_reducer.h
class ValueNormalizer;  // learner/train/value_norm.h

class PpoTrainer {
 public:
  // `policy` must already be on its device. `precision`: fp32; bf16 (CPU or CUDA autocast); fp16 (CUDA
  // autocast with dynamic loss scaling). Throws std::invalid_argument when CheckPrecision fails for the
  // policy's device (e.g. fp16 on the CPU).
  // config.fused_update picks the update's implementation: "auto" uses FusedPpoUpdate (ppo_fused.h) when
  // CheckFusedUpdate passes (CPU, fp32, the ActorCritic MLP) and the LibTorch path otherwise; "on" requires
  // it (std::invalid_argument saying why it cannot run); "off" always takes the LibTorch path. A policy with
  // a global state (centralised critic) or the cnn encoder always takes the LibTorch path.
  // config.graph_update picks the CUDA-graph step (ppo_graph.h) for the LibTorch path: "on" throws
  // std::invalid_argument when GraphedPpoStep::Check fails; "auto" uses it on CUDA when Check passes.
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
  // Whether Update runs the fused CPU path (for a rollout without an active mask).
  bool fused() const { return fused_ != nullptr; }
  // The path the last Update took: "fused", "graphed" or "libtorch" (before any: the one it would take for a
  // rollout without an active mask, short of the graphed step, which needs a first LibTorch update).
  const char* last_update_path() const { return last_path_ ? last_path_ : fused_ ? "fused" : "libtorch"; }
  // Updates run by the graphed step (GraphedPpoStep), and graphs it captured.
  int64_t graphed_updates() const { return graphed_updates_; }
  int graph_captures() const;

  // Makes this trainer one rank of a data-parallel group (DD-PPO): rank 0's parameters and Adam state are
  // broadcast at the next Update's start (a collective: every rank's trainer must have its reducer by then); from
  // then on each minibatch's gradient is the per-sample mean over every rank's minibatch, the
  // advantages are normalised once per update with the moments of every rank's rollout (as habitat's DD-PPO
  // does, in place of per-minibatch moments), the share of samples within ppo.max_policy_lag, target_kl's stop
  // and a stop request are decided over all ranks, and every ppo-wide figure stays identical on every rank. The
  // fused and graphed updates do not take ranks: auto falls back to the LibTorch update, on throws
  // std::invalid_argument saying so. Every rank must call Update as often as the others.
  void SetReducer(std::shared_ptr<GradientReducer> reducer);
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
  int64_t graphed_updates_ = 0;
  const char* last_path_ = nullptr;  // last_update_path (null: no update yet)
  std::shared_ptr<GradientReducer> reducer_;  // set when this is one rank of several
  bool synced_ = false;                       // rank 0's parameters broadcast since the reducer was set
  int64_t updates_ = 0;
};

}  // namespace farm
