// Learner: the ROUTER endpoint, dynamic batcher, batched inference,
// trajectory store and PPO trainer of one training run.
//
// Data flow:
//   workers --StepRequest--> [I/O thread] --Work--> DynamicBatcher
//     --batch--> [inference thread: validate, record, forward, reply]
//     --full rollout--> [trainer thread: PPO update] --TrainerDone--> batcher
//   replies: inference thread --inproc PUSH--> I/O thread --ROUTER--> workers
//
// Modes: `sync` holds every request while the trainer updates (exact
// on-policy); `async` keeps acting with the current snapshot while the
// trainer updates the next version (policy lag is measured and reported).
//
// Threads: the I/O thread (learner/serve/router_loop.h), the inference thread
// and the trainer thread (learner/train/trainer_thread.h); learner.cpp says who
// owns what.
//
// Threading: Run() is called once, from one thread, which becomes the
// inference thread. RequestStop() may be called from any thread.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>

#include "common/config.h"
#include "common/status.h"

namespace farm {

class Learner {
 public:
  // Binds the socket, creates the run directory and starts the I/O and
  // trainer threads. Nothing is served until Run().
  static Status Create(const FarmConfig& config, std::unique_ptr<Learner>* out);
  ~Learner();  // stops and joins every thread

  const std::string& endpoint() const;
  const std::string& run_dir() const;
  // This learner's rank among several (torchrun's or Slurm's environment; learner/train/rank_group.h); 0 alone.
  int rank() const;

  // Serves and trains until total_env_steps, the target (when
  // stop_at_target), or RequestStop(); then checkpoints, tells the workers
  // to stop and writes summary.json, which is also returned.
  // An exception while serving a batch (a LibTorch or CUDA error) stops the run the same way, final
  // checkpoint included, and Run returns it as an internal error.
  Status Run(nlohmann::json* summary);
  void RequestStop(const std::string& reason);

  // Tests only: the next batch the inference thread takes fails with an exception. Any thread.
  void TEST_FailNextBatch();
  // Tests only: the next batch the inference thread takes first sleeps `seconds` (a stalled serve). Any thread.
  void TEST_StallNextBatch(double seconds);

  struct Impl;

 private:
  explicit Learner(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace farm
