// ActorCritic: separate actor and critic MLPs (tanh, orthogonal init) as the
// reference PPO implementations build them. The action head is categorical
// for a discrete space and a diagonal Gaussian with a state-independent
// log-std for a box space.
//
// Threading: a module is not thread-safe. The learner acts with one instance
// and trains another (or the same one in sync mode, never concurrently).
#pragma once

#include <torch/torch.h>

#include <vector>

#include "common/space.h"

namespace farm {

struct ActOutput {
  torch::Tensor action;  // int64 [B] (discrete) or float [B, A] (box, unclipped)
  torch::Tensor logp;    // float [B]
  torch::Tensor value;   // float [B]
};

struct EvalOutput {
  torch::Tensor logp;     // float [B]
  torch::Tensor entropy;  // float [B]
  torch::Tensor value;    // float [B]
};

class ActorCriticImpl : public torch::nn::Module {
 public:
  ActorCriticImpl(const Space& observation, const Space& action, const std::vector<int>& hidden_sizes);

  // Samples actions (deterministic=true: mode / mean) with their log-probs and values.
  ActOutput Act(const torch::Tensor& obs, bool deterministic = false);
  // Log-probs, entropies and values of given actions, for the PPO loss.
  EvalOutput Evaluate(const torch::Tensor& obs, const torch::Tensor& actions);
  torch::Tensor Value(const torch::Tensor& obs);

  // Copies every parameter and buffer from `other` (same architecture).
  void CopyFrom(ActorCriticImpl& other);

  const Space& observation_space() const { return observation_; }
  const Space& action_space() const { return action_; }

 private:
  torch::Tensor Flatten(const torch::Tensor& obs) const;

  Space observation_;
  Space action_;
  torch::nn::Sequential actor_{nullptr};
  torch::nn::Sequential critic_{nullptr};
  torch::Tensor log_std_;  // box only
};
TORCH_MODULE(ActorCritic);

}  // namespace farm
