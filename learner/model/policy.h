// ActorCritic: separate actor and critic networks (MLPs, tanh by default,
// orthogonal init) as the reference PPO implementations build them, optionally
// behind an image encoder (ppo.encoder: cnn, conv or impala; encoder.h) and
// with a centralised critic that reads an
// env's global state instead of the agent's observation (MAPPO style: the
// actor, all that decentralised execution needs, never sees the state). The
// action head is categorical for a discrete space, one categorical per
// component for a multi-discrete space (log-probs and entropies summed over
// the components, which are independent given the observation), and a
// diagonal Gaussian for a box space: with a state-independent log-std, or with
// generalised state-dependent exploration (PolicyOptions::sde, gSDE as SB3's
// use_sde with full_std): per action dimension k the std is
// sqrt(sum_j z_j^2 sigma_jk^2 + 1e-6), z the actor's last hidden layer
// (detached: the std trains sigma only) and sigma = exp(log_std), a
// [last hidden width, action] matrix; a sample is mean + z . (W * sigma) for
// a standard normal matrix W that the caller may hold for several steps.
//
// Threading: a module is not thread-safe. The learner acts with one instance
// and trains another (or the same one in sync mode, never concurrently).
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

#include "common/space.h"
#include "common/status.h"
#include "learner/model/encoder.h"
#include "learner/model/recurrent_core.h"

namespace farm {

// What ActorCritic's architecture depends on besides the spaces and widths.
struct PolicyOptions {
  Encoder encoder = Encoder::kMlp;
  // Set: the critic takes this float32 box (an env's global state) instead of the observation.
  std::optional<Space> global_state;
  // Box actions: the initial value of every log-std entry (the policy's exploration before any update; rl-zoo's
  // log_std_init). Not part of the architecture: a checkpoint's saved log-std replaces it.
  double log_std_init = 0.0;
  // Box actions: state-dependent exploration (the class comment); log_std is then [latent_size, action numel],
  // latent_size the input width of the actor's head. Part of the architecture (policy_spec.json "sde").
  bool sde = false;
  // A recurrent core (ppo.core) of core_size units after the encoder, before the heads: the actor's, and with
  // critic_core the critic's own (MAPPO style). Part of the architecture (policy_spec.json "core").
  CoreKind core = CoreKind::kNone;
  int64_t core_size = 128;
  bool critic_core = true;
  // The cores' gate biases start ready for dependencies up to this many steps (chrono initialisation,
  // recurrent_core.h; ppo.core_init); 0: zero biases. Not part of the architecture: a checkpoint's weights
  // replace it.
  int64_t core_timescale = 0;
  // The encoder's and trunk's layout besides the kind (learner/model/encoder.h: ppo.conv, ppo.impala_channels,
  // ppo.activation, ppo.layer_norm). Part of the architecture (policy_spec.json).
  EncoderLayout layout;
  // Encoders written in PyTorch (ppo.actor_encoder_script / ppo.critic_encoder_script; scripted_encoder.h): the
  // path of a TorchScript module that maps the actor's observation (the critic's input) [B, shape...] to features
  // [B, F]. Set: it replaces that network's built-in encoder (`encoder` then applies to the other network only),
  // and the trunk of every hidden size follows it. Part of the architecture (policy_spec.json names the run
  // directory's copy).
  std::string actor_encoder_script;
  std::string critic_encoder_script;
  // ppo.value_norm (running or popart): the critic's head learns normalised values, and every value the policy
  // gives (Act, Evaluate, EvaluateSequence, Value) is de-normalised with the statistics it holds as buffers
  // (learner/train/value_norm.h keeps them), so that all but the value loss sees the returns' scale. Part of the
  // architecture (policy_spec.json "value_norm": the buffers are in its checkpoints).
  bool value_norm = false;
  bool has_encoder_script() const { return !actor_encoder_script.empty() || !critic_encoder_script.empty(); }
};

struct ActOutput {
  torch::Tensor action;  // int64 [B] (discrete), int64 [B, K] (multi-discrete) or float [B, A] (box, unclipped)
  torch::Tensor logp;    // float [B]
  torch::Tensor value;   // float [B]
  // With a core: every row's state after this step, float32 [B, core_state_size()] (undefined without one).
  torch::Tensor core_state;
};

struct EvalOutput {
  torch::Tensor logp;     // float [B]
  torch::Tensor entropy;  // float [B]
  torch::Tensor value;    // float [B]
};

class ActorCriticImpl : public torch::nn::Module {
 public:
  // Throws std::invalid_argument for an empty space, a non-positive width, a global state that is not a
  // float32 box, or an image encoder on an input it cannot take (encoder.h, ImageEncoderShapes).
  ActorCriticImpl(const Space& observation, const Space& action, const std::vector<int>& hidden_sizes,
                  const PolicyOptions& options = {});

  // `state` is the critic's input when the policy has a global state (has_global_state()), and is ignored
  // otherwise; `obs` is [B, obs...]. `state` is [B, state...], or [B / k, state...] for rows that come in
  // runs of k sharing one state (the agents of an env): the critic then runs once per run, and each row of
  // a run gets its value.
  // Samples actions (deterministic=true: mode / mean) with their log-probs and values. Acting needs only
  // the actor: with a global state but an undefined `state`, value is left undefined.
  // with_value false: the critic is not run and `value` stays undefined (serving a policy never needs it).
  // sde only: `sde_noise` float32 [B, sde_latent_size(), action numel] holds each row's standard normal
  // matrix W (the noise is z . (W * sigma)); undefined: a fresh draw per row (the same distribution).
  // With a core: `core_state` float32 [B, core_state_size()] is each row's state before this step (undefined:
  // zero, every row at an episode's start); the output's core_state is the state after it. The critic's part of
  // the state advances only when the critic runs (with_value, and its global state given when it takes one);
  // otherwise it is passed through, or, when `core_state` holds the actor's part alone ([B,
  // actor_core_state_size()], for a caller that never runs the critic), left out.
  ActOutput Act(const torch::Tensor& obs, const torch::Tensor& state, bool deterministic = false,
                bool with_value = true, const torch::Tensor& sde_noise = {}, const torch::Tensor& core_state = {});
  ActOutput Act(const torch::Tensor& obs, bool deterministic = false) { return Act(obs, {}, deterministic); }
  // Log-probs, entropies and values of given actions, for the PPO loss. Throws std::invalid_argument when
  // the policy has a global state and `state` is undefined.
  EvalOutput Evaluate(const torch::Tensor& obs, const torch::Tensor& state, const torch::Tensor& actions);
  EvalOutput Evaluate(const torch::Tensor& obs, const torch::Tensor& actions) { return Evaluate(obs, {}, actions); }
  // The critic's value [B]; the same rule for `state` as Evaluate. Feed-forward critics only (throws
  // std::invalid_argument when the critic has a core).
  torch::Tensor Value(const torch::Tensor& obs, const torch::Tensor& state = {});
  // With a core, the update's Evaluate: B sequences of L steps, rows time-major (row t * B + b is step t of
  // sequence b) in `obs` [L * B, obs...], `actions` and `state` (the global state, [L * B / k, state...] as
  // Evaluate takes it); `core_state0` [B, core_state_size()] each sequence's state before its first step;
  // `starts` [L, B] nonzero where an episode starts (its state is zeroed first). Throws std::invalid_argument
  // without a core (use Evaluate).
  EvalOutput EvaluateSequence(const torch::Tensor& obs, const torch::Tensor& state, const torch::Tensor& actions,
                              const torch::Tensor& core_state0, const torch::Tensor& starts);

  bool has_core() const { return options_.core != CoreKind::kNone; }
  // Floats of recurrent state per row: the actor core's, then the critic core's (0 without a core).
  int64_t core_state_size() const;
  // The actor core's part of it (0 without a core).
  int64_t actor_core_state_size() const { return actor_core_ ? actor_core_->state_size() : 0; }

  // Copies every parameter and buffer from `other` (same architecture).
  void CopyFrom(ActorCriticImpl& other);

  const Space& observation_space() const { return observation_; }
  const Space& action_space() const { return action_; }
  const std::vector<int>& hidden_sizes() const { return hidden_sizes_; }
  const PolicyOptions& options() const { return options_; }
  Encoder encoder() const { return options_.encoder; }
  bool has_global_state() const { return options_.global_state.has_value(); }
  // The networks in order, for export (export.cpp walks their modules): the actor's encoder (undefined for a
  // feed-forward mlp policy; a ScriptedEncoder first with ppo.actor_encoder_script), and the actor (its trunk and
  // head; the head alone with a core).
  torch::nn::Sequential actor_encoder() const { return actor_encoder_; }
  // The critic's encoder (undefined for a feed-forward mlp critic).
  torch::nn::Sequential critic_encoder() const { return critic_encoder_; }
  torch::nn::Sequential actor() const { return actor_; }
  // The width of z (the actor head's input) with sde; 0 without.
  int64_t sde_latent_size() const { return sde_latent_; }

  // value_norm: whether the critic's values are de-normalised (PolicyOptions::value_norm); what its head gives for
  // the de-normalised values `raw`, (raw - mean) / std (the value loss's scale); the statistics' buffers: mean and
  // std (float32 scalars) and the running moments (float64 [3]: mean, mean of squares, debiasing weight); the
  // critic's last layer (PopArt rescales it).
  bool value_normalised() const { return value_mean_.defined(); }
  torch::Tensor NormalizedValue(const torch::Tensor& raw) const;
  torch::Tensor value_norm_mean() const { return value_mean_; }
  torch::Tensor value_norm_std() const { return value_std_; }
  torch::Tensor value_norm_moments() const { return value_moments_; }
  torch::nn::Linear critic_head() const;

  // How saturated the critic's tanh units are on `input` (the critic's input rows: [B, global state...] with a
  // global state, else [B, obs...]): the share of the outputs of every tanh layer of its encoder and trunk that are
  // beyond +-kSaturatedTanh, over the B rows. A critic whose tanh units sit at +-1 passes almost no gradient below
  // them (critic_watch.h). nullopt when the critic has no tanh layer (ppo.activation relu, elu or silu); with a
  // core, the layers before it. No gradient; the caller picks the rows (the trainer: a sample of the rollout).
  static constexpr double kSaturatedTanh = 0.99;
  std::optional<double> CriticSaturation(const torch::Tensor& input);

 private:
  // The actor's head input (encoded observation) and the critic's value [B].
  torch::Tensor ActorFeatures(const torch::Tensor& obs);
  torch::Tensor CriticValue(const torch::Tensor& obs, const torch::Tensor& state, const char* caller);
  // The critic's encoded input [B / k, features] (k rows sharing a global state) and k.
  torch::Tensor CriticFeatures(const torch::Tensor& obs, const torch::Tensor& state, const char* caller, int64_t* k);
  // Log-probs and entropies of `actions` from the actor's head input `features` (after the core, if any).
  EvalOutput EvaluateActions(const torch::Tensor& features, const torch::Tensor& actions);
  // sde: the actor's head input z [B, L] for `features`, and the head applied to it.
  torch::Tensor ActorLatent(const torch::Tensor& features);
  torch::Tensor ActorHead(const torch::Tensor& latent);
  // sde: per row and action dimension, the variance z^2 . sigma^2 + eps [B, A] (float32; z detached).
  torch::Tensor SdeVariance(const torch::Tensor& latent);

  Space observation_;
  Space action_;
  std::vector<int> hidden_sizes_;
  PolicyOptions options_;
  // Image encoders only: the conv stacks ("actor_encoder", "critic_encoder"); with mlp the MLPs take flattened
  // input.
  torch::nn::Sequential actor_encoder_{nullptr};
  torch::nn::Sequential critic_encoder_{nullptr};
  torch::nn::Sequential actor_{nullptr};
  torch::nn::Sequential critic_{nullptr};
  // With a core: the mlp encoder's hidden layers move into actor_encoder_ / critic_encoder_ (an image
  // encoder's follow its conv stack there), the core comes next, and actor_ / critic_ are the heads alone.
  RecurrentCore actor_core_{nullptr};
  RecurrentCore critic_core_{nullptr};
  // The critic head's output [B] in the returns' scale (unchanged without value_norm).
  torch::Tensor Denormalized(const torch::Tensor& head) const;
  torch::Tensor value_mean_, value_std_, value_moments_;  // value_norm only
  torch::Tensor log_std_;  // box only: [A], or [sde_latent_, A] with sde
  int64_t sde_latent_ = 0;
};
TORCH_MODULE(ActorCritic);

}  // namespace farm
