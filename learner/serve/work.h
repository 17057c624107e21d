// The items the learner's I/O thread, trainer and checkpoint writer hand the inference thread through the
// DynamicBatcher: requests decoded by the I/O thread, results from the trainer (train/train_job.h), checkpoint
// outcomes, stop requests.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "farm.pb.h"
#include "learner/train/train_job.h"

namespace farm {

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

}  // namespace farm
