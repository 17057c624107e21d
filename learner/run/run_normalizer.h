// RunNormalizer: the run's observation and return statistics
// (env.normalize_obs / normalize_reward). The workers normalise; this merges
// the deltas they send (a few per rollout), hands the merged statistics back
// in replies and Welcomes, and keeps them in checkpoints: from init_from's
// checkpoint, restored on --resume, captured for a checkpoint. Frozen (the
// workers only use them) unless the run records (trains).
//
// Threading: owned by the inference thread.
#pragma once

#include <string>

#include "common/config.h"
#include "common/running_stats.h"
#include "common/status.h"
#include "farm.pb.h"
#include "learner/run/checkpoint.h"

namespace farm {

class RunNormalizer {
 public:
  RunNormalizer(const FarmConfig& config, bool recording);

  const NormalizerOptions& options() const { return options_; }
  bool any() const { return options_.any(); }
  bool frozen() const { return !recording_; }

  // Sizes the statistics for observations of `obs_numel` elements (the first Hello), empty.
  void Reset(int64_t obs_numel);
  // learner.init_from: the statistics the policy in `checkpoint` was trained with (its run's config `saved`).
  // A policy trained on normalised observations needs them, and a run that normalises needs a policy trained so;
  // return statistics start afresh when absent.
  Status InitFrom(const FarmConfig& saved, const std::string& checkpoint);
  // A worker's StepRequest.stats_delta: checked, then merged (unless frozen).
  Status Merge(const wire::NormalizerStats& delta);
  // The merged statistics, for a Welcome or an ActionReply.
  void Fill(wire::NormalizerStats* out) const;
  // --resume: what the checkpoint at `path` held of them (restored where the sizes agree; warnings otherwise).
  void Restore(const RunState& state, const std::string& path);
  // Into a checkpoint's run state.
  void Capture(RunState* state) const;

  // Learner ranks (learner/train/rank_agreement.h): the run's statistics are the ranks' agreed ones plus each
  // rank's own deltas since the last exchange. TakeForRanks hands those deltas (merged since the last take) to an
  // exchange; ApplyRanks adds every rank's deltas of that exchange (merged across the ranks, the same on each) to
  // the agreed statistics, and serves them with this rank's deltas since the take.
  void TakeForRanks(RunningMoments* obs, RunningMoments* ret);
  void ApplyRanks(const RunningMoments& obs, const RunningMoments& ret);
  int64_t obs_dim() const { return obs_.dim(); }
  int64_t obs_count() const { return obs_.count(); }  // observations in the statistics served
  int64_t ret_dim() const { return ret_.dim(); }

 private:
  // The statistics as they are now become the agreed ones, with no delta of this rank's own.
  void Rebase();

  const FarmConfig config_;
  const NormalizerOptions options_;
  const bool recording_;
  RunningMoments obs_, ret_;                  // served: agreed + local
  RunningMoments agreed_obs_, agreed_ret_;    // ranks: the run's, as of the last exchange
  RunningMoments local_obs_, local_ret_;      // ranks: this rank's workers' deltas since the last take
};

}  // namespace farm
