// What the inference thread and the trainer thread hand each other: a TrainJob (a full rollout, with what a
// checkpoint after it needs) goes to the trainer; a TrainResult comes back inside a Work item (serve/work.h).
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "learner/run/checkpoint.h"
#include "learner/train/ppo.h"
#include "learner/train/gradient_reducer.h"
#include "learner/train/rank_agreement.h"

namespace farm {

// What the trainer thread reports after a job.
struct TrainResult {
  PpoStats stats;
  double update_seconds = 0;
  int64_t version = 0;     // version the update produced
  bool cancelled = false;  // cut short by a stop request: fewer epochs than configured ran
  bool failed = false;     // non-finite loss or parameters, or an exception: the run stops, nothing saved after it
  std::string error;       // the exception's text when one ended the update (out of memory, say); empty otherwise
  std::string update_path;  // fused | graphed | libtorch
  int64_t graphed_updates = 0;
  bool checkpoint_due = false;   // the update was to be checkpointed
  // When due: how serialising it went; its bytes went to the CheckpointWriter, which announces its
  // outcome with Work kCheckpointDone (TrainerThread::TakeCheckpointResults).
  Status checkpoint;
  // Ranks: what they agreed before the update (`agreed` false without ranks). A stop (any rank's, or the run's
  // total_env_steps reached over all ranks) skips the update: `updated` false. `vote_only` jobs never update.
  bool agreed = false;
  RankAgreement agreement;
  bool updated = true;
  std::string agreed_stop;  // why the ranks stop; empty: they go on
  bool rank_failed = false;  // a collective failed (a rank died or hung): `error` says which call
  ReducerTraffic traffic;    // the collectives of this job
  int64_t checksum = 0;      // the parameters' checksum at the ranks' last comparison
  // Ranks: every rank's normaliser deltas of this exchange, merged (RunNormalizer::ApplyRanks takes them).
  RunningMoments norm_obs, norm_ret;
};

// A rollout for the trainer thread, with what a checkpoint after it needs. Ranks: a `vote_only` job has no rollout:
// it takes this rank's part in the next agreement (to stop), and nothing else.
struct TrainJob {
  bool vote_only = false;
  RankFigures figures;  // ranks: this rank's part in the agreement
  // Ranks: this rank's normaliser deltas since the last exchange (RunNormalizer::TakeForRanks), and the sizes
  // every rank's have.
  RunningMoments norm_obs, norm_ret;
  int64_t norm_obs_dim = 0, norm_ret_dim = 0;
  Rollout rollout;
  double progress = 0;   // the learning-rate schedule's progress when the rollout began
  int64_t version = 0;   // version of the policy being trained
  bool checkpoint = false;
  TrainingCounters counters;
  RunState state;  // with `checkpoint`: taken at hand-off; the trainer adds its generator's after the update
};

}  // namespace farm
