// ValueNormalizer: ppo.value_norm, value normalisation as MAPPO trains with it. The critic's head learns
// normalised values, (return - mean) / std; the policy de-normalises every value it gives (ActorCritic's
// value_norm buffers), so that GAE, V-trace, the bootstrap of a truncated episode or of a rollout's end (a cut one
// too), the explained variance and the critic watch all read values at the returns' scale, and only the value
// loss sees normalised ones. The statistics are MAPPO's ValueNorm: running mean and mean of squares, each batch
// weighted by 1 - beta (beta 0.99999) with a debiasing weight, variance at least 1e-2; folded in once per update
// from all of the update's returns (MAPPO folds in each minibatch's), over every rank's with ranks.
//   running  the statistics alone: when they move, the critic's de-normalised outputs move with them.
//   popart   PopArt (van Hasselt et al., 2016): the critic's last layer is rescaled as the statistics move
//            (W <- W sigma / sigma', b <- (sigma b + mu - mu') / sigma'), so its de-normalised outputs do not change.
// The statistics live in the policy's buffers: they go to the acting copy with the weights, and into checkpoints.
//
// Threading: used by the trainer's thread alone (the acting copy gets the buffers through CopyFrom).
#pragma once

#include <torch/torch.h>

#include <string>

#include "common/status.h"
#include "learner/model/policy.h"

namespace farm {

class ValueNormalizer {
 public:
  enum class Mode { kRunning, kPopArt };
  static constexpr double kBeta = 0.99999;
  static constexpr double kEpsilon = 1e-5;   // the debiasing weight's floor
  static constexpr double kMinVariance = 1e-2;

  // ppo.value_norm: "running" or "popart" (an error names the key otherwise; "none" is no normaliser).
  static Status ParseMode(const std::string& name, Mode* mode);

  // `policy` must have been built with PolicyOptions::value_norm (throws std::invalid_argument otherwise).
  ValueNormalizer(ActorCritic policy, Mode mode);

  // The (count, sum, sum of squares) of `returns`, in float64: what Update takes (summed over ranks first).
  static std::vector<double> Moments(const torch::Tensor& returns);
  // Folds a batch of `count` returns with these sums into the statistics and sets the policy's mean and std;
  // popart: rescales the critic's last layer so that its de-normalised outputs are unchanged. No-op when count < 1.
  void Update(double count, double sum, double sum_sq);

  double mean() const;
  double std() const;
  Mode mode() const { return mode_; }

 private:
  ActorCritic policy_;
  Mode mode_;
};

}  // namespace farm
