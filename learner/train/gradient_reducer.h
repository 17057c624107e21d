// What makes K ranks' PPO updates one update (DD-PPO): the same parameters and Adam state at the start (rank 0's),
// then at every minibatch the per-sample mean gradient over all ranks' minibatches (each rank's mean gradient
// weighted by its sample count, one all-reduce of a flat buffer), sums of small per-rank figures (advantage
// moments, kept samples, KL), and a parameter checksum that turns a silent divergence into an error.
//
// PpoTrainer takes one (SetReducer); without one nothing of this runs.
//
// Threading: used by one thread at a time (the trainer's); every rank makes the same calls in the same order.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "learner/train/rank_group.h"

namespace farm {

// Collective traffic since the last TakeTraffic: calls, bytes each rank sent into them, and time spent in them.
struct ReducerTraffic {
  int64_t calls = 0;
  int64_t bytes = 0;
  double seconds = 0;
};

class GradientReducer {
 public:
  // `check_every`: CheckParameters runs after every that many updates (AfterUpdate); 0: never.
  explicit GradientReducer(std::shared_ptr<RankGroup> group, int check_every = 10);

  int rank() const { return group_->rank(); }
  int size() const { return group_->size(); }
  RankGroup& group() { return *group_; }

  // Rank 0's parameters and buffers into every rank's `module`.
  void BroadcastModule(torch::nn::Module& module);
  // Rank 0's Adam state (moments and step count) into every rank's `optimizer` over `params`: a rank without state
  // gets it, and when rank 0 has none every rank drops its own.
  void BroadcastAdam(torch::optim::Adam& optimizer, const std::vector<torch::Tensor>& params);

  // After each rank's backward of its own minibatch mean loss over `samples` rows: every param's grad becomes
  // sum_r samples_r * grad_r / sum_r samples_r (a param without a grad counts as zero and gets one, so that every
  // rank steps every param alike). `flag` rides along: the result says whether any rank raised it (a stop
  // request). A rank with no samples contributes nothing. Returns the samples over all ranks.
  struct Reduced {
    double samples = 0;
    bool any_flag = false;
  };
  Reduced ReduceGradients(const std::vector<torch::Tensor>& params, int64_t samples, bool flag);

  // The element-wise sum over ranks of a few figures (float64 on the host).
  std::vector<double> Sum(const std::vector<double>& values);

  // A checksum of `params` (their bytes), compared across ranks: throws RankError naming `update` and the ranks'
  // checksums' spread when they differ.
  void CheckParameters(const std::vector<torch::Tensor>& params, int64_t update);
  // The checksum CheckParameters compares: CRC-32C of the parameters' bytes, in order.
  static int64_t Checksum(const std::vector<torch::Tensor>& params);

  // Called by the trainer after each update (`update` counts from 1): the checksum every check_every updates.
  void AfterUpdate(const std::vector<torch::Tensor>& params, int64_t update);
  int64_t last_checksum() const { return last_checksum_; }

  ReducerTraffic TakeTraffic();

 private:
  void Count(int64_t bytes, double seconds);

  std::shared_ptr<RankGroup> group_;
  int check_every_;
  int64_t last_checksum_ = 0;
  torch::Tensor buffer_;  // the flat gradient buffer, reused while the sizes stay
  ReducerTraffic traffic_;
};

}  // namespace farm
