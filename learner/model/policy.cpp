// ActorCritic: the PPO policy/value network (separate tanh MLPs, orthogonal init, optionally behind conv
// encoders, the critic optionally on a global state) with a categorical or diagonal-Gaussian action head.
// Act is on the inference hot path, so it does only the ops it needs.
#include "learner/model/policy.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "learner/model/scripted_encoder.h"

namespace farm {
namespace {

// 0.5 * log(2 * pi): the constant term of a unit Gaussian's log-density, per dimension.
constexpr double kHalfLog2Pi = 0.91893853320467274178;
constexpr double kPolicyHeadGain = 0.01;  // near-uniform initial policy
constexpr double kValueHeadGain = 1.0;
constexpr double kSdeEpsilon = 1e-6;  // added to gSDE's variance (SB3's StateDependentNoiseDistribution)

torch::nn::Linear OrthogonalLinear(int64_t in, int64_t out, double gain) {
  torch::nn::Linear linear(in, out);
  torch::NoGradGuard no_grad;
  torch::nn::init::orthogonal_(linear->weight, gain);
  torch::nn::init::zeros_(linear->bias);
  return linear;
}

// The trunk (encoder.h's AppendTrunk) and a head Linear, laid out as PyTorch's nn.Sequential would be ("0.weight",
// ...). A recurrent policy's encoder is the trunk alone: the core and the head follow.
torch::nn::Sequential Mlp(int64_t in, const std::vector<int>& hidden_sizes, int64_t out, double head_gain,
                          const EncoderLayout& layout) {
  torch::nn::Sequential mlp;
  const int64_t width = AppendTrunk(mlp, in, hidden_sizes, layout);
  mlp->push_back(OrthogonalLinear(width, out, head_gain));
  return mlp;
}

// Inputs may arrive as uint8/int/double; the networks want float32 [B, numel] (mlp), [B, C, H, W] (an image
// encoder) or [B, shape...] (a scripted encoder). Both reshape and to() are no-ops (views / same tensor) in the
// common case.
torch::Tensor Shaped(const torch::Tensor& x, const Space& space, Encoder encoder, bool scripted) {
  if (scripted) {
    c10::SmallVector<int64_t, 8> shape{x.size(0)};  // on the stack: this runs on every forward
    shape.append(space.shape.begin(), space.shape.end());
    return x.reshape(shape).to(torch::kFloat32);
  }
  if (IsImageEncoder(encoder))
    return x.reshape({x.size(0), space.shape[0], space.shape[1], space.shape[2]}).to(torch::kFloat32);
  return x.reshape({x.size(0), space.numel()}).to(torch::kFloat32);
}

// One categorical draw per row of `logits` ([R, n], and their log-softmax `logp_all`): the mode (the argmax
// of the logits themselves, as the exported module takes it: their log-softmax may round near-ties together),
// or a sample; int64 [R].
torch::Tensor DrawCategorical(const torch::Tensor& logits, const torch::Tensor& logp_all, bool deterministic) {
  if (deterministic) return logits.argmax(-1);
  if (logp_all.is_cuda()) {
    // The exponential race: argmax(p / E) with E ~ Exp(1) i.i.d. is a sample of p (torch.multinomial's
    // one-sample path). Written out on CUDA so that it never synchronises with the host and can be
    // captured in a CUDA graph; the CPU keeps multinomial, and with it the random stream of CPU runs.
    const torch::Tensor probs = logp_all.exp();
    return probs.div(torch::empty_like(probs).exponential_()).argmax(-1);
  }
  return torch::multinomial(logp_all.exp(), /*num_samples=*/1, /*replacement=*/true).view(-1);
}

// A multi-discrete head [B, sum(nvec)] whose components all have n choices is read as one [B, K, n]
// log-softmax (a few kernels instead of a few per component).
bool UniformCategories(const std::vector<int64_t>& nvec) {
  return std::all_of(nvec.begin(), nvec.end(), [&](int64_t c) { return c == nvec.front(); });
}

}  // namespace

ActorCriticImpl::ActorCriticImpl(const Space& observation, const Space& action, const std::vector<int>& hidden_sizes,
                                 const PolicyOptions& options)
    : observation_(observation), action_(action), hidden_sizes_(hidden_sizes), options_(options) {
  const int64_t obs_dim = observation_.numel();
  if (obs_dim <= 0) throw std::invalid_argument("ActorCritic: empty observation space " + observation_.ToString());
  const int64_t head_dim = action_.head_size();
  if (head_dim <= 0) throw std::invalid_argument("ActorCritic: empty action space " + action_.ToString());
  if (options_.global_state &&
      (!options_.global_state->is_box() || options_.global_state->dtype != DType::kFloat32 ||
       options_.global_state->numel() <= 0))
    throw std::invalid_argument("ActorCritic: the global state must be a non-empty float32 box, got " +
                                options_.global_state->ToString());
  const Space& critic_input = options_.global_state ? *options_.global_state : observation_;

  const EncoderLayout& layout = options_.layout;
  const char* critic_what = options_.global_state ? "global state" : "observation";
  // Each network's encoder: a script (ppo.*_encoder_script) with every hidden size in the trunk after it; an image
  // encoder ending in a Linear to hidden_sizes[0], the trunk taking the rest; or none (mlp: the trunk takes the
  // flattened input). With a core the trunk belongs to the encoder (the core and the head follow); without one to
  // the head's Sequential.
  struct Network {
    torch::nn::Sequential encoder;  // empty: none
    int64_t width = 0;              // what the encoder hands on
    std::vector<int> trunk;         // the trunk's widths after it
  };
  const auto network = [&](const Space& input, const std::string& script, const char* what, const char* key) {
    Network n;
    if (!script.empty()) {
      ScriptedEncoder scripted(script, input, key);
      n.width = scripted->features();
      n.encoder->push_back(scripted);
      n.trunk = hidden_sizes;
    } else if (IsImageEncoder(options_.encoder)) {
      if (hidden_sizes.empty() || hidden_sizes.front() <= 0)
        throw std::invalid_argument(std::string("ActorCritic: the ") + EncoderName(options_.encoder) +
                                    " encoder needs hidden_sizes with a positive first width");
      n.encoder = ImageEncoder(options_.encoder, layout, input, hidden_sizes.front(), what);
      n.width = hidden_sizes.front();
      n.trunk.assign(hidden_sizes.begin() + 1, hidden_sizes.end());
    } else {
      n.width = input.numel();
      n.trunk = hidden_sizes;
    }
    return n;
  };
  const auto scripts = EncoderScripts(options_.actor_encoder_script, options_.critic_encoder_script);
  Network actor = network(observation_, scripts[0].path, "observation", scripts[0].key);
  Network critic = network(critic_input, scripts[1].path, critic_what, scripts[1].key);
  if (options_.core != CoreKind::kNone) {
    if (options_.core_size <= 0)
      throw std::invalid_argument("ActorCritic: core_size must be positive, got " + std::to_string(options_.core_size));
    // encoder -> trunk -> core -> head, for each network with a core.
    const int64_t actor_width = AppendTrunk(actor.encoder, actor.width, actor.trunk, layout);
    if (!actor.encoder->is_empty()) actor_encoder_ = register_module("actor_encoder", actor.encoder);
    actor_core_ = register_module(
        "actor_core", RecurrentCore(options_.core, actor_width, options_.core_size, options_.core_timescale));
    actor_ = register_module("actor", Mlp(options_.core_size, {}, head_dim, kPolicyHeadGain, layout));
    if (options_.critic_core) {
      const int64_t critic_width = AppendTrunk(critic.encoder, critic.width, critic.trunk, layout);
      if (!critic.encoder->is_empty()) critic_encoder_ = register_module("critic_encoder", critic.encoder);
      critic_core_ = register_module(
          "critic_core", RecurrentCore(options_.core, critic_width, options_.core_size, options_.core_timescale));
      critic_ = register_module("critic", Mlp(options_.core_size, {}, 1, kValueHeadGain, layout));
    } else {
      if (!critic.encoder->is_empty()) critic_encoder_ = register_module("critic_encoder", critic.encoder);
      critic_ = register_module("critic", Mlp(critic.width, critic.trunk, 1, kValueHeadGain, layout));
    }
  } else {
    if (!actor.encoder->is_empty()) actor_encoder_ = register_module("actor_encoder", actor.encoder);
    if (!critic.encoder->is_empty()) critic_encoder_ = register_module("critic_encoder", critic.encoder);
    actor_ = register_module("actor", Mlp(actor.width, actor.trunk, head_dim, kPolicyHeadGain, layout));
    critic_ = register_module("critic", Mlp(critic.width, critic.trunk, 1, kValueHeadGain, layout));
  }
  if (options_.value_norm) {
    value_mean_ = register_buffer("value_norm_mean", torch::zeros({}));
    value_std_ = register_buffer("value_norm_std", torch::ones({}));
    value_moments_ = register_buffer("value_norm_moments", torch::zeros({3}, torch::kFloat64));
  }
  if (options_.sde && !action_.is_box())
    throw std::invalid_argument("ActorCritic: state-dependent exploration (sde) needs a box action space, got " +
                                action_.ToString());
  if (options_.sde) {
    sde_latent_ = actor_->at<torch::nn::LinearImpl>(actor_->size() - 1).weight.size(1);
    log_std_ = register_parameter(
        "log_std", torch::full({sde_latent_, head_dim}, static_cast<float>(options_.log_std_init)));
  } else if (action_.is_box()) {
    log_std_ = register_parameter("log_std", torch::full({head_dim}, static_cast<float>(options_.log_std_init)));
  }
}

torch::Tensor ActorCriticImpl::ActorLatent(const torch::Tensor& features) {
  torch::Tensor x = features;
  // Mlp's layers: the trunk's, then the head (left out here).
  auto it = actor_->begin();
  for (std::size_t i = 0; i + 1 < actor_->size(); ++i, ++it) x = it->forward(x);
  return x;
}

torch::Tensor ActorCriticImpl::ActorHead(const torch::Tensor& latent) {
  return actor_->at<torch::nn::LinearImpl>(actor_->size() - 1).forward(latent);
}

torch::Tensor ActorCriticImpl::SdeVariance(const torch::Tensor& latent) {
  // Elementwise and a sum rather than a matmul: autocast leaves them in float32.
  const torch::Tensor z2 = latent.detach().to(torch::kFloat32).square().unsqueeze(-1);  // [B, L, 1]
  return (z2 * (2 * log_std_).exp()).sum(1) + kSdeEpsilon;                          // [B, A]
}

torch::Tensor ActorCriticImpl::ActorFeatures(const torch::Tensor& obs) {
  torch::Tensor x = Shaped(obs, observation_, options_.encoder, !options_.actor_encoder_script.empty());
  if (actor_encoder_) x = actor_encoder_->forward(x);
  return x;
}

int64_t ActorCriticImpl::core_state_size() const {
  return (actor_core_ ? actor_core_->state_size() : 0) + (critic_core_ ? critic_core_->state_size() : 0);
}

torch::Tensor ActorCriticImpl::CriticFeatures(const torch::Tensor& obs, const torch::Tensor& state,
                                              const char* caller, int64_t* k) {
  *k = 1;
  torch::Tensor x;
  if (options_.global_state) {
    if (!state.defined())
      throw std::invalid_argument(std::string("ActorCritic::") + caller + ": the critic takes a global state " +
                                  options_.global_state->ToString() + ", but none was given");
    const int64_t rows = obs.size(0);
    if (state.size(0) == 0 || rows % state.size(0) != 0)
      throw std::invalid_argument(std::string("ActorCritic::") + caller + ": " + std::to_string(state.size(0)) +
                                  " global states for " + std::to_string(rows) +
                                  " observations (expected one per row, or one per k consecutive rows)");
    x = Shaped(state, *options_.global_state, options_.encoder, !options_.critic_encoder_script.empty());
    // One state for k consecutive rows (the agents of one env): the critic runs once, its value is theirs.
    *k = rows / state.size(0);
  } else {
    x = Shaped(obs, observation_, options_.encoder, !options_.critic_encoder_script.empty());
  }
  return critic_encoder_ ? critic_encoder_->forward(x) : x;
}

torch::Tensor ActorCriticImpl::Denormalized(const torch::Tensor& head) const {
  if (!value_mean_.defined()) return head;
  return head.to(torch::kFloat32) * value_std_ + value_mean_;
}

torch::Tensor ActorCriticImpl::NormalizedValue(const torch::Tensor& raw) const {
  if (!value_mean_.defined()) return raw;
  return (raw - value_mean_) / value_std_;
}

torch::nn::Linear ActorCriticImpl::critic_head() const {
  return torch::nn::Linear(critic_->ptr<torch::nn::LinearImpl>(critic_->size() - 1));
}

std::optional<double> ActorCriticImpl::CriticSaturation(const torch::Tensor& input) {
  torch::NoGradGuard no_grad;
  const bool scripted = !options_.critic_encoder_script.empty();
  torch::Tensor x = Shaped(input, options_.global_state ? *options_.global_state : observation_, options_.encoder,
                           scripted);
  torch::Tensor saturated = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(x.device()));
  int64_t outputs = 0;
  const auto walk = [&](torch::nn::Sequential& seq) {
    for (auto& module : *seq) {
      x = module.forward(x);
      if (module.ptr()->as<torch::nn::TanhImpl>() == nullptr) continue;
      saturated += (x.abs() > kSaturatedTanh).sum();
      outputs += x.numel();
    }
  };
  if (critic_encoder_) walk(critic_encoder_);
  if (!critic_core_) walk(critic_);  // with a core, critic_ is the head alone, after the core
  if (outputs == 0) return std::nullopt;
  return saturated.item<double>() / static_cast<double>(outputs);
}

torch::Tensor ActorCriticImpl::CriticValue(const torch::Tensor& obs, const torch::Tensor& state, const char* caller) {
  if (critic_core_)
    throw std::invalid_argument(std::string("ActorCritic::") + caller +
                                ": the critic has a recurrent core (use Act or EvaluateSequence with its state)");
  int64_t k = 1;
  const torch::Tensor value = Denormalized(critic_->forward(CriticFeatures(obs, state, caller, &k)).squeeze(-1));
  return k == 1 ? value : value.repeat_interleave(k);
}

ActOutput ActorCriticImpl::Act(const torch::Tensor& obs, const torch::Tensor& state, bool deterministic,
                               bool with_value, const torch::Tensor& sde_noise, const torch::Tensor& core_state) {
  ActOutput out;
  // Acting needs only the actor: a centralised critic without its state leaves the value undefined.
  const bool run_critic = with_value && (!options_.global_state || state.defined());
  torch::Tensor features = ActorFeatures(obs);
  if (actor_core_) {
    const int64_t batch = obs.size(0);
    const int64_t size = core_state_size();
    const int64_t actor_size = actor_core_->state_size();
    torch::Tensor before = core_state.defined()
                               ? core_state
                               : torch::zeros({batch, size}, obs.options().dtype(torch::kFloat32));
    // The actor's part alone is enough when the critic does not run (serving).
    const bool actor_only = critic_core_ && !run_critic && before.dim() == 2 && before.size(1) == actor_size;
    if (before.dim() != 2 || before.size(0) != batch || (before.size(1) != size && !actor_only))
      throw std::invalid_argument("ActorCritic::Act: core_state must be [" + std::to_string(batch) + ", " +
                                  std::to_string(size) + "], got " + c10::str(before.sizes()));
    auto [output, actor_next] = actor_core_->Step(features, before.narrow(1, 0, actor_size));
    features = output;
    out.core_state = actor_next;
    if (critic_core_ && !actor_only) {
      const torch::Tensor critic_before = before.narrow(1, actor_size, critic_core_->state_size());
      torch::Tensor critic_next = critic_before;
      if (run_critic) {
        int64_t k = 1;
        const torch::Tensor critic_in = CriticFeatures(obs, state, "Act", &k);
        // k rows share a global state: the critic's state is the first row's, and its next state is all of theirs.
        const torch::Tensor per_run = k == 1 ? critic_before : critic_before.view({batch / k, k, -1}).select(1, 0);
        auto [critic_out, next] = critic_core_->Step(critic_in, per_run);
        const torch::Tensor value = Denormalized(critic_->forward(critic_out).squeeze(-1));
        out.value = k == 1 ? value : value.repeat_interleave(k);
        critic_next = k == 1 ? next : next.repeat_interleave(k, 0);
      }
      out.core_state = torch::cat({actor_next, critic_next}, 1);
    } else if (run_critic) {
      out.value = CriticValue(obs, state, "Act");
    }
  } else if (run_critic) {
    out.value = CriticValue(obs, state, "Act");
  }
  if (options_.sde) {
    const torch::Tensor latent = ActorLatent(features);
    const torch::Tensor mean = ActorHead(latent).to(torch::kFloat32);
    const torch::Tensor var = SdeVariance(latent);
    const torch::Tensor log_norm = var.log().sum(-1).mul_(0.5).add_(kHalfLog2Pi * static_cast<double>(mean.size(-1)));
    if (deterministic) {
      out.action = mean;
      out.logp = -log_norm;
      return out;
    }
    torch::Tensor eps;
    if (sde_noise.defined()) {
      if (sde_noise.dim() != 3 || sde_noise.size(0) != mean.size(0) || sde_noise.size(1) != sde_latent_ ||
          sde_noise.size(2) != mean.size(1))
        throw std::invalid_argument("ActorCritic::Act: sde_noise must be [" + std::to_string(mean.size(0)) + ", " +
                                    std::to_string(sde_latent_) + ", " + std::to_string(mean.size(1)) + "], got " +
                                    c10::str(sde_noise.sizes()));
      // z . (W * sigma): [B, 1, L] x [B, L, A].
      const torch::Tensor z = latent.detach().to(torch::kFloat32).unsqueeze(-1);  // [B, L, 1]
      const torch::Tensor noise = (z * sde_noise.to(torch::kFloat32) * log_std_.exp()).sum(1);
      out.action = mean + noise;
      eps = noise * var.rsqrt();
    } else {
      eps = torch::randn_like(mean);
      out.action = torch::addcmul(mean, eps, var.sqrt());
    }
    out.logp = eps.square().sum(-1).mul_(-0.5).sub_(log_norm);
    return out;
  }
  const torch::Tensor head = actor_->forward(features);
  if (action_.is_discrete()) {
    const torch::Tensor logp_all = torch::log_softmax(head, -1);
    out.action = DrawCategorical(head, logp_all, deterministic);
    out.logp = logp_all.gather(-1, out.action.unsqueeze(-1)).squeeze(-1);
  } else if (action_.is_multi_discrete()) {
    // One categorical per component; the joint log-prob is their sum. Actions int64 [B, K].
    const int64_t batch = head.size(0);
    const auto& nvec = action_.nvec;
    const auto k = static_cast<int64_t>(nvec.size());
    if (UniformCategories(nvec)) {
      const torch::Tensor logits = head.reshape({batch * k, nvec.front()});
      const torch::Tensor logp_all = torch::log_softmax(logits, -1);
      const torch::Tensor flat = DrawCategorical(logits, logp_all, deterministic);
      out.action = flat.view({batch, k});
      out.logp = logp_all.gather(-1, flat.unsqueeze(-1)).view({batch, k}).sum(-1);
    } else {
      std::vector<torch::Tensor> actions, logps;
      for (const torch::Tensor& part : head.split_with_sizes(nvec, -1)) {
        const torch::Tensor logp_all = torch::log_softmax(part, -1);
        actions.push_back(DrawCategorical(part, logp_all, deterministic));
        logps.push_back(logp_all.gather(-1, actions.back().unsqueeze(-1)));
      }
      out.action = torch::stack(actions, -1);
      out.logp = torch::cat(logps, -1).sum(-1);
    }
  } else {
    // a = mean + std * eps, so log N(a) = sum(-eps^2 / 2 - log_std - log sqrt(2 pi)) without dividing back.
    const torch::Tensor log_norm = log_std_.sum() + kHalfLog2Pi * static_cast<double>(head.size(-1));
    if (deterministic) {
      out.action = head;
      out.logp = (-log_norm).repeat({head.size(0)});
    } else {
      const torch::Tensor eps = torch::randn_like(head);
      out.action = torch::addcmul(head, eps, log_std_.exp());
      out.logp = eps.square().sum(-1).mul_(-0.5).sub_(log_norm);
    }
  }
  return out;
}

EvalOutput ActorCriticImpl::Evaluate(const torch::Tensor& obs, const torch::Tensor& state,
                                     const torch::Tensor& actions) {
  if (actor_core_)
    throw std::invalid_argument("ActorCritic::Evaluate: the policy has a recurrent core (use EvaluateSequence)");
  EvalOutput out = EvaluateActions(ActorFeatures(obs), actions);
  out.value = CriticValue(obs, state, "Evaluate");
  return out;
}

EvalOutput ActorCriticImpl::EvaluateSequence(const torch::Tensor& obs, const torch::Tensor& state,
                                             const torch::Tensor& actions, const torch::Tensor& core_state0,
                                             const torch::Tensor& starts) {
  if (!actor_core_)
    throw std::invalid_argument("ActorCritic::EvaluateSequence: the policy has no recurrent core (use Evaluate)");
  if (!starts.defined() || starts.dim() != 2)
    throw std::invalid_argument("ActorCritic::EvaluateSequence: starts must be [L, B]");
  const int64_t steps = starts.size(0);
  const int64_t batch = starts.size(1);
  if (obs.size(0) != steps * batch)
    throw std::invalid_argument("ActorCritic::EvaluateSequence: " + std::to_string(obs.size(0)) +
                                " observations for " + std::to_string(steps) + " steps of " + std::to_string(batch) +
                                " sequences");
  if (core_state0.dim() != 2 || core_state0.size(0) != batch || core_state0.size(1) != core_state_size())
    throw std::invalid_argument("ActorCritic::EvaluateSequence: core_state0 must be [" + std::to_string(batch) + ", " +
                                std::to_string(core_state_size()) + "], got " + c10::str(core_state0.sizes()));
  const int64_t actor_size = actor_core_->state_size();
  const torch::Tensor actor_in = ActorFeatures(obs).view({steps, batch, -1});
  const torch::Tensor actor0 = core_state0.narrow(1, 0, actor_size);
  int64_t k = 1;
  const torch::Tensor critic_in =
      critic_core_ ? CriticFeatures(obs, state, "EvaluateSequence", &k) : torch::Tensor();
  if (critic_core_ && k == 1) {
    // Actor and critic cores side by side: one batched unroll.
    auto [actor_out, critic_out] = RecurrentCoreImpl::UnrollPair(
        *actor_core_, *critic_core_, actor_in, critic_in.view({steps, batch, -1}), actor0,
        core_state0.narrow(1, actor_size, critic_core_->state_size()), starts);
    EvalOutput out = EvaluateActions(actor_out.reshape({steps * batch, -1}), actions);
    out.value = Denormalized(critic_->forward(critic_out.reshape({steps * batch, -1})).squeeze(-1));
    return out;
  }
  const torch::Tensor features = actor_core_->Unroll(actor_in, actor0, starts).reshape({steps * batch, -1});
  EvalOutput out = EvaluateActions(features, actions);
  if (!critic_core_) {
    out.value = CriticValue(obs, state, "EvaluateSequence");
    return out;
  }
  // A centralised critic (k > 1 rows share each state): its core runs once per run of k rows, from the run's
  // first row's state and starts (an env's agents start and end their episodes together).
  if (batch % k != 0)
    throw std::invalid_argument("ActorCritic::EvaluateSequence: " + std::to_string(batch) +
                                " sequences are not whole runs of " + std::to_string(k) + " rows sharing a state");
  const int64_t runs = batch / k;
  const torch::Tensor run0 =
      core_state0.narrow(1, actor_size, critic_core_->state_size()).view({runs, k, -1}).select(1, 0);
  const torch::Tensor run_starts = starts.view({steps, runs, k}).select(2, 0);
  const torch::Tensor critic_out =
      critic_core_->Unroll(critic_in.view({steps, runs, -1}), run0, run_starts).reshape({steps * runs, -1});
  out.value = Denormalized(critic_->forward(critic_out).squeeze(-1)).repeat_interleave(k);
  return out;
}

EvalOutput ActorCriticImpl::EvaluateActions(const torch::Tensor& features, const torch::Tensor& actions) {
  const int64_t batch = features.size(0);
  EvalOutput out;
  if (options_.sde) {
    // N(mean, sqrt(var)) per dimension; var trains log_std only (z detached), the mean the whole actor.
    const torch::Tensor latent = ActorLatent(features);
    const torch::Tensor mean = ActorHead(latent).to(torch::kFloat32);
    const int64_t dim = mean.size(-1);
    const torch::Tensor var = SdeVariance(latent);
    const torch::Tensor half_log_var = 0.5 * var.log();
    const torch::Tensor diff = actions.reshape({batch, dim}).to(torch::kFloat32) - mean;
    out.logp = -0.5 * (diff.square() / var).sum(-1) - half_log_var.sum(-1) - kHalfLog2Pi * static_cast<double>(dim);
    out.entropy = (half_log_var + (0.5 + kHalfLog2Pi)).sum(-1);
    return out;
  }
  const torch::Tensor head = actor_->forward(features);
  if (action_.is_discrete()) {
    const torch::Tensor logp_all = torch::log_softmax(head, -1);
    const torch::Tensor index = actions.reshape({batch, 1}).to(torch::kLong);
    out.logp = logp_all.gather(-1, index).squeeze(-1);
    out.entropy = -(logp_all.exp() * logp_all).sum(-1);
  } else if (action_.is_multi_discrete()) {
    // Independent components: log-probs and entropies add up.
    const auto& nvec = action_.nvec;
    const auto k = static_cast<int64_t>(nvec.size());
    const torch::Tensor index = actions.reshape({batch, k}).to(torch::kLong);
    if (UniformCategories(nvec)) {
      const torch::Tensor logp_all = torch::log_softmax(head.reshape({batch, k, nvec.front()}), -1);
      out.logp = logp_all.gather(-1, index.unsqueeze(-1)).squeeze(-1).sum(-1);
      out.entropy = -(logp_all.exp() * logp_all).sum({1, 2});
    } else {
      const std::vector<torch::Tensor> parts = head.split_with_sizes(nvec, -1);
      for (int64_t i = 0; i < k; ++i) {
        const torch::Tensor logp_all = torch::log_softmax(parts[static_cast<std::size_t>(i)], -1);
        const torch::Tensor logp = logp_all.gather(-1, index.select(1, i).unsqueeze(-1)).squeeze(-1);
        const torch::Tensor entropy = -(logp_all.exp() * logp_all).sum(-1);
        out.logp = i == 0 ? logp : out.logp + logp;
        out.entropy = i == 0 ? entropy : out.entropy + entropy;
      }
    }
  } else {
    const int64_t dim = head.size(-1);
    const torch::Tensor eps = (actions.reshape({batch, dim}).to(head.scalar_type()) - head) * torch::exp(-log_std_);
    out.logp = -0.5 * eps.square().sum(-1) - log_std_.sum() - kHalfLog2Pi * static_cast<double>(dim);
    // Differential entropy of a diagonal Gaussian: sum(0.5 + 0.5 log(2 pi) + log_std); state-independent.
    out.entropy = (log_std_ + (0.5 + kHalfLog2Pi)).sum().expand({batch});
  }
  return out;
}

torch::Tensor ActorCriticImpl::Value(const torch::Tensor& obs, const torch::Tensor& state) {
  return CriticValue(obs, state, "Value");
}

void ActorCriticImpl::CopyFrom(ActorCriticImpl& other) {
  if (&other == this) return;
  torch::NoGradGuard no_grad;
  auto copy_all = [](const torch::OrderedDict<std::string, torch::Tensor>& dst,
                     const torch::OrderedDict<std::string, torch::Tensor>& src, const char* what) {
    if (dst.size() != src.size()) {
      throw std::invalid_argument(std::string("ActorCritic::CopyFrom: ") + what + " count differs: " +
                                  std::to_string(src.size()) + " vs " + std::to_string(dst.size()));
    }
    // Check everything before writing anything, so a mismatch leaves this module untouched.
    for (const auto& item : dst) {
      const torch::Tensor* from = src.find(item.key());
      if (from == nullptr) {
        throw std::invalid_argument(std::string("ActorCritic::CopyFrom: source lacks ") + what + " " + item.key());
      }
      if (from->sizes() != item.value().sizes()) {
        throw std::invalid_argument(std::string("ActorCritic::CopyFrom: ") + what + " " + item.key() +
                                    " has shape " + c10::str(from->sizes()) + ", expected " +
                                    c10::str(item.value().sizes()));
      }
    }
    for (const auto& item : dst) item.value().copy_(src[item.key()]);
  };
  copy_all(named_parameters(), other.named_parameters(), "parameter");
  copy_all(named_buffers(), other.named_buffers(), "buffer");
}

}  // namespace farm
