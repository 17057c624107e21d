// The items the learner's threads hand each other: Work goes through the
// DynamicBatcher to the inference thread (requests decoded by the I/O thread,
// results from the trainer, stop requests); TrainJob goes to the trainer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "farm.pb.h"
#include "learner/checkpoint.h"
#include "learner/ppo.h"

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

// An item for the inference thread.
struct Work {
  enum class Kind { kHello, kStep, kReplay, kHeartbeat, kTrainerDone, kCheckpointDone, kStop };
  Kind kind = Kind::kStep;
  std::string identity;
  wire::Envelope msg;  // Hello, StepRequest or Heartbeat
  int64_t rows = 0;    // the batcher's row count (a StepRequest's observations)
  // A StepRequest admitted while recording whose observations and global states were copied into the store at
  // admission (TrajectoryStore::NextStepInputs): RecordStep copies the rest. Cleared when it is parked.
  bool inputs_recorded = false;
  std::shared_ptr<TrainResult> result;  // kTrainerDone
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
