// What makes K ranks' PPO updates one update (DD-PPO), behind one interface the trainer calls whether it is alone or
// one of several: the same parameters and Adam state at the start (rank 0's), then at every minibatch the per-sample
// mean gradient over all ranks' minibatches (each rank's mean gradient weighted by its sample count, one all-reduce
// of a flat buffer), sums of small per-rank figures (advantage moments, kept samples, KL), and a parameter checksum
// that turns a silent divergence into an error.
//
// PpoTrainer holds one from its construction: a OneRankReducer, which does nothing, until SetReducer hands it a
// RankReducer (learner_join.cpp, for a learner that is one rank of several). Every update path makes the same calls
// in the same places either way; only what the calls do differs.
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
  virtual ~GradientReducer() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // True for a learner that is the only rank: the trainer's minibatches and advantage moments are its own.
  bool alone() const { return size() == 1; }
  // The ranks' group, for the agreement before each update (trainer_thread.h); null when alone.
  virtual RankGroup* group() = 0;

  // Rank 0's parameters and buffers into every rank's `module`, and its Adam state (moments and step counts) into
  // every rank's `optimizer` over `params`: a rank without state gets it, and when rank 0 has none every rank drops
  // its own.
  virtual void Synchronise(torch::nn::Module& module, torch::optim::Adam& optimizer,
                           const std::vector<torch::Tensor>& params) = 0;

  // After each rank's backward of its own minibatch mean loss over `samples` rows: every param's grad becomes
  // sum_r samples_r * grad_r / sum_r samples_r (a param without a grad counts as zero and gets one, so that every
  // rank steps every param alike). `flag` rides along: the result says whether any rank raised it (a stop
  // request). A rank with no samples contributes nothing. Returns the samples over all ranks.
  struct Reduced {
    double samples = 0;
    bool any_flag = false;
  };
  virtual Reduced ReduceGradients(const std::vector<torch::Tensor>& params, int64_t samples, bool flag) = 0;
  // The same over one flat float32 buffer of `n` gradients (the fused update's, every parameter's back to back):
  // one all-reduce, written back in place.
  virtual Reduced ReduceFlat(float* grads, int64_t n, int64_t samples, bool flag) = 0;

  // The element-wise sum over ranks of a few figures (float64 on the host).
  virtual std::vector<double> Sum(const std::vector<double>& values) = 0;
  // sum_r weight_r * value_r / sum_r weight_r (0 when no rank has weight); alone: `value` itself.
  virtual double WeightedMean(double value, double weight) = 0;

  // Called by the trainer after each update (`update` counts from 1): a parameter checksum compared across ranks
  // every so often.
  virtual void AfterUpdate(const std::vector<torch::Tensor>& params, int64_t update) = 0;
  virtual int64_t last_checksum() const = 0;

  virtual ReducerTraffic TakeTraffic() = 0;
};

// The only rank: every call returns its input (gradients untouched, sums of one), nothing is sent.
class OneRankReducer final : public GradientReducer {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  RankGroup* group() override { return nullptr; }
  void Synchronise(torch::nn::Module&, torch::optim::Adam&, const std::vector<torch::Tensor>&) override {}
  Reduced ReduceGradients(const std::vector<torch::Tensor>&, int64_t samples, bool flag) override {
    return {static_cast<double>(samples), flag};
  }
  Reduced ReduceFlat(float*, int64_t, int64_t samples, bool flag) override {
    return {static_cast<double>(samples), flag};
  }
  std::vector<double> Sum(const std::vector<double>& values) override { return values; }
  double WeightedMean(double value, double) override { return value; }
  void AfterUpdate(const std::vector<torch::Tensor>&, int64_t) override {}
  int64_t last_checksum() const override { return 0; }
  ReducerTraffic TakeTraffic() override { return {}; }
};

// One rank of several over a RankGroup (c10d).
class RankReducer final : public GradientReducer {
 public:
  // `check_every`: CheckParameters runs after every that many updates (AfterUpdate); 0: never.
  explicit RankReducer(std::shared_ptr<RankGroup> group, int check_every = 10);

  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }
  RankGroup* group() override { return group_.get(); }

  void Synchronise(torch::nn::Module& module, torch::optim::Adam& optimizer,
                   const std::vector<torch::Tensor>& params) override;
  // Its two halves.
  void BroadcastModule(torch::nn::Module& module);
  void BroadcastAdam(torch::optim::Adam& optimizer, const std::vector<torch::Tensor>& params);

  Reduced ReduceGradients(const std::vector<torch::Tensor>& params, int64_t samples, bool flag) override;
  Reduced ReduceFlat(float* grads, int64_t n, int64_t samples, bool flag) override;
  std::vector<double> Sum(const std::vector<double>& values) override;
  double WeightedMean(double value, double weight) override;

  // A checksum of `params` (their bytes), compared across ranks: throws RankError naming `update` and the ranks'
  // checksums' spread when they differ.
  void CheckParameters(const std::vector<torch::Tensor>& params, int64_t update);
  // The checksum CheckParameters compares: CRC-32C of the parameters' bytes, in order.
  static int64_t Checksum(const std::vector<torch::Tensor>& params);

  void AfterUpdate(const std::vector<torch::Tensor>& params, int64_t update) override;
  int64_t last_checksum() const override { return last_checksum_; }

  ReducerTraffic TakeTraffic() override;

 private:
  void Count(int64_t bytes, double seconds);
  // Every rank's `weight` and `flag` summed over the tail of buffer_ (its last two entries), after the all-reduce.
  Reduced Tail(int64_t at);

  std::shared_ptr<RankGroup> group_;
  int check_every_;
  int64_t last_checksum_ = 0;
  torch::Tensor buffer_;  // the flat gradient buffer, reused while the sizes stay
  ReducerTraffic traffic_;
};

}  // namespace farm
