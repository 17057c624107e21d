// What the inference thread and the trainer thread hand each other: a TrainJob (a full rollout, with what a
// checkpoint after it needs) goes to the trainer; a TrainResult comes back inside a Work item (serve/work.h).
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "learner/run/checkpoint.h"
#include "learner/train/ppo.h"

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
};

// A rollout for the trainer thread, with what a checkpoint after it needs.
struct TrainJob {
  Rollout rollout;
  double progress = 0;   // the learning-rate schedule's progress when the rollout began
  int64_t version = 0;   // version of the policy being trained
  bool checkpoint = false;
  TrainingCounters counters;
  RunState state;  // with `checkpoint`: taken at hand-off; the trainer adds its generator's after the update
};

}  // namespace farm
