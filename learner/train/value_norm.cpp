// Value normalisation (MAPPO's ValueNorm, PopArt): statistics in the policy's buffers.
#include "learner/train/value_norm.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace farm {

Status ValueNormalizer::ParseMode(const std::string& name, Mode* mode) {
  if (name == "running") {
    *mode = Mode::kRunning;
  } else if (name == "popart") {
    *mode = Mode::kPopArt;
  } else {
    return Status::InvalidArgument("ppo.value_norm: expected none, running or popart, got '" + name + "'");
  }
  return Status::Ok();
}

ValueNormalizer::ValueNormalizer(ActorCritic policy, Mode mode) : policy_(std::move(policy)), mode_(mode) {
  if (!policy_->value_normalised())
    throw std::invalid_argument("ValueNormalizer: the policy was built without value_norm (PolicyOptions::value_norm)");
}

std::vector<double> ValueNormalizer::Moments(const torch::Tensor& returns) {
  const torch::Tensor r = returns.detach().to(torch::kFloat64).flatten();
  const torch::Tensor m = torch::stack({r.sum(), r.square().sum()}).cpu();
  return {static_cast<double>(r.numel()), m[0].item<double>(), m[1].item<double>()};
}

double ValueNormalizer::mean() const { return policy_->value_norm_mean().item<double>(); }
double ValueNormalizer::std() const { return policy_->value_norm_std().item<double>(); }

void ValueNormalizer::Update(double count, double sum, double sum_sq) {
  if (count < 1) return;
  torch::NoGradGuard no_grad;
  torch::Tensor moments = policy_->value_norm_moments();
  const torch::Tensor host = moments.cpu();
  const double* m = host.data_ptr<double>();
  const double w = kBeta;
  const double running_mean = m[0] * w + (sum / count) * (1 - w);
  const double running_sq = m[1] * w + (sum_sq / count) * (1 - w);
  const double debias = m[2] * w + (1 - w);
  const double d = std::max(debias, kEpsilon);
  const double new_mean = running_mean / d;
  const double new_var = std::max(running_sq / d - new_mean * new_mean, kMinVariance);
  const double new_std = std::sqrt(new_var);
  moments.copy_(torch::tensor({running_mean, running_sq, debias}, torch::kFloat64));
  const double old_mean = mean();
  const double old_std = std();
  if (mode_ == Mode::kPopArt) {
    // sigma' (W' x + b') + mu' = sigma (W x + b) + mu for every x.
    torch::nn::Linear head = policy_->critic_head();
    head->weight.mul_(old_std / new_std);
    if (head->bias.defined()) head->bias.mul_(old_std).add_(old_mean - new_mean).div_(new_std);
  }
  policy_->value_norm_mean().fill_(new_mean);
  policy_->value_norm_std().fill_(new_std);
}

}  // namespace farm
