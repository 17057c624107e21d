// TrainerThread: the only owner of the training copy of the policy and its
// PpoTrainer (optimizer, loss scaler, minibatch generator). It runs each PPO
// update it is handed on its own thread (on CUDA, on its own stream) and
// makes every checkpoint: the periodic ones after an update, and the final
// one; it serialises them into memory and its CheckpointWriter writes them
// on a thread of its own (a slow disk delays neither updates nor serving).
// The inference thread reaches the training copy only through
// CopyWeightsTo, while no job is in flight.
//
// Threading: Submit, busy, CopyWeightsTo, FinalCheckpoint and the accessors
// are for one thread (the inference thread); Cancel may be called from any
// thread; TakeCheckpointResults and DrainCheckpoints from any. The job runs on the trainer thread; its result goes to `on_done`
// (called on the trainer thread). The destructor closes the job channel and
// joins the thread (a job in flight is cancelled first).
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "common/channel.h"
#include "common/config.h"
#include "common/status.h"
#include "learner/model/policy.h"
#include "learner/run/checkpoint.h"
#include "learner/run/checkpoint_writer.h"
#include "learner/train/gradient_reducer.h"
#include "learner/train/ppo.h"
#include "learner/train/train_job.h"

namespace farm {

class TrainerThread {
 public:
  // `training` is on `device`; `trainer` trains it. Checkpoints go to `checkpoint_dir`; after each periodic
  // write `on_checkpoint_written` is called (on the writer's thread): TakeCheckpointResults has its outcome. FARM_TEST_SLOW_CHECKPOINT_MS (an environment
  // variable, for tests and benchmarks) makes each checkpoint write wait that long first: a slow disk.
  TrainerThread(const FarmConfig& config, torch::Device device, std::string checkpoint_dir, ActorCritic training,
                std::unique_ptr<PpoTrainer> trainer, std::function<void(std::shared_ptr<TrainResult>)> on_done,
                std::function<void()> on_checkpoint_written);
  ~TrainerThread();
  TrainerThread(const TrainerThread&) = delete;
  TrainerThread& operator=(const TrainerThread&) = delete;

  // Hands a rollout to the trainer; it must be idle (!busy()).
  void Submit(TrainJob job);
  // A job was submitted and its result not yet taken (Done).
  bool busy() const { return busy_; }
  // The inference thread took the result of the job in flight.
  void Done() { busy_ = false; }
  // Cuts the update in flight short after its current minibatch step (a stop was requested).
  void Cancel() { cancel_.store(true); }

  // While idle: copies the training weights into `acting` (same architecture, any device).
  void CopyWeightsTo(ActorCriticImpl& acting);
  // While idle, on the calling thread: whether every parameter is finite (a policy that is not must never be
  // saved), and the final checkpoint with `counters` and `state` (the trainer's generator added here).
  bool ParametersFinite();
  Status FinalCheckpoint(const TrainingCounters& counters, RunState state, std::string* path);

  // As the last update ran: "fused", "graphed" (CUDA graphs; the first update is LibTorch's) or "libtorch".
  std::string update_path() const;
  int64_t graphed_updates() const;
  // The checkpoint write in flight, seconds so far (0: none); periodic checkpoints the disk was too slow for.
  double checkpoint_write_seconds() const { return writer_.in_flight_seconds(); }
  int64_t checkpoints_skipped() const { return writer_.skipped(); }
  // The periodic writes' outcomes not yet taken, oldest first (any thread).
  std::vector<CheckpointWriter::Written> TakeCheckpointResults() { return writer_.TakeResults(); }
  // At shutdown: waits for the writes still waiting or in flight, then returns what TakeCheckpointResults would.
  std::vector<CheckpointWriter::Written> DrainCheckpoints() { return writer_.Drain(); }

 private:
  void Loop();
  // Ranks: this job's agreement (learner/train/rank_agreement.h) into `result`. Returns whether the update runs
  // (not for a vote, a stop the ranks agreed on, or a failed collective); sets the job's progress from every rank's.
  bool AgreeWithRanks(RankGroup& group, TrainJob* job, TrainResult* result);

  const FarmConfig config_;
  const torch::Device device_;
  const std::string checkpoint_dir_;
  ActorCritic training_;                 // trainer thread while busy, else the inference thread
  std::unique_ptr<PpoTrainer> trainer_;  // likewise
  std::function<void(std::shared_ptr<TrainResult>)> on_done_;
  Channel<TrainJob> jobs_{1};
  bool busy_ = false;  // the inference thread's view
  std::atomic<bool> cancel_{false};
  CheckpointWriter writer_;  // destroyed after the trainer thread is joined: writes what is waiting
  std::thread thread_;
};

}  // namespace farm
