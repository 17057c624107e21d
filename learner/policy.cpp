// ActorCritic: the PPO policy/value network (separate tanh MLPs, orthogonal init) with a categorical or
// diagonal-Gaussian action head. Act is on the inference hot path, so it does only the ops it needs.
#include "learner/policy.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace farm {
namespace {

// 0.5 * log(2 * pi): the constant term of a unit Gaussian's log-density, per dimension.
constexpr double kHalfLog2Pi = 0.91893853320467274178;
constexpr double kHiddenGain = 1.41421356237309504880;  // sqrt(2), for tanh hidden layers
constexpr double kPolicyHeadGain = 0.01;  // near-uniform initial policy
constexpr double kValueHeadGain = 1.0;

torch::nn::Linear OrthogonalLinear(int64_t in, int64_t out, double gain) {
  torch::nn::Linear linear(in, out);
  torch::NoGradGuard no_grad;
  torch::nn::init::orthogonal_(linear->weight, gain);
  torch::nn::init::zeros_(linear->bias);
  return linear;
}

// Linear-tanh-...-Linear, laid out as PyTorch's nn.Sequential would be ("0.weight", "2.weight", ...).
torch::nn::Sequential Mlp(int64_t in, const std::vector<int>& hidden_sizes, int64_t out, double head_gain) {
  torch::nn::Sequential mlp;
  int64_t width = in;
  for (int hidden : hidden_sizes) {
    if (hidden <= 0) throw std::invalid_argument("ActorCritic: hidden sizes must be positive, got " +
                                                 std::to_string(hidden));
    mlp->push_back(OrthogonalLinear(width, hidden, kHiddenGain));
    mlp->push_back(torch::nn::Tanh());
    width = hidden;
  }
  mlp->push_back(OrthogonalLinear(width, out, head_gain));
  return mlp;
}

}  // namespace

ActorCriticImpl::ActorCriticImpl(const Space& observation, const Space& action, const std::vector<int>& hidden_sizes)
    : observation_(observation), action_(action) {
  const int64_t obs_dim = observation_.numel();
  if (obs_dim <= 0) throw std::invalid_argument("ActorCritic: empty observation space " + observation_.ToString());
  const int64_t head_dim = action_.is_discrete() ? action_.n : action_.numel();
  if (head_dim <= 0) throw std::invalid_argument("ActorCritic: empty action space " + action_.ToString());

  actor_ = register_module("actor", Mlp(obs_dim, hidden_sizes, head_dim, kPolicyHeadGain));
  critic_ = register_module("critic", Mlp(obs_dim, hidden_sizes, 1, kValueHeadGain));
  if (!action_.is_discrete()) log_std_ = register_parameter("log_std", torch::zeros({head_dim}));
}

torch::Tensor ActorCriticImpl::Flatten(const torch::Tensor& obs) const {
  // Observations may arrive as uint8/int/double from the wire; the MLP wants float32 [B, obs_dim].
  // Both reshape and to() are no-ops (views / same tensor) in the common case.
  return obs.reshape({obs.size(0), observation_.numel()}).to(torch::kFloat32);
}

ActOutput ActorCriticImpl::Act(const torch::Tensor& obs, bool deterministic) {
  const torch::Tensor x = Flatten(obs);
  ActOutput out;
  out.value = critic_->forward(x).squeeze(-1);
  const torch::Tensor head = actor_->forward(x);
  if (action_.is_discrete()) {
    const torch::Tensor logp_all = torch::log_softmax(head, -1);
    out.action = deterministic ? head.argmax(-1)
                               : torch::multinomial(logp_all.exp(), /*num_samples=*/1, /*replacement=*/true).view(-1);
    out.logp = logp_all.gather(-1, out.action.unsqueeze(-1)).squeeze(-1);
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

EvalOutput ActorCriticImpl::Evaluate(const torch::Tensor& obs, const torch::Tensor& actions) {
  const torch::Tensor x = Flatten(obs);
  const int64_t batch = x.size(0);
  EvalOutput out;
  out.value = critic_->forward(x).squeeze(-1);
  const torch::Tensor head = actor_->forward(x);
  if (action_.is_discrete()) {
    const torch::Tensor logp_all = torch::log_softmax(head, -1);
    const torch::Tensor index = actions.reshape({batch, 1}).to(torch::kLong);
    out.logp = logp_all.gather(-1, index).squeeze(-1);
    out.entropy = -(logp_all.exp() * logp_all).sum(-1);
  } else {
    const int64_t dim = head.size(-1);
    const torch::Tensor eps = (actions.reshape({batch, dim}).to(head.scalar_type()) - head) * torch::exp(-log_std_);
    out.logp = -0.5 * eps.square().sum(-1) - log_std_.sum() - kHalfLog2Pi * static_cast<double>(dim);
    // Differential entropy of a diagonal Gaussian: sum(0.5 + 0.5 log(2 pi) + log_std); state-independent.
    out.entropy = (log_std_ + (0.5 + kHalfLog2Pi)).sum().expand({batch});
  }
  return out;
}

torch::Tensor ActorCriticImpl::Value(const torch::Tensor& obs) { return critic_->forward(Flatten(obs)).squeeze(-1); }

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
