// RolloutCollector: the rollout being collected and the requests held back
// from it: the trajectory store; the requests parked (a group whose rollout
// is full, waiting for the hand-off; in sync mode every request while the
// trainer updates; all while fewer than learner.min_workers have joined or
// while stopping) until they can be served; the hold rule that decides it;
// and taking a full rollout for the trainer.
//
// Threading: owned by the inference thread.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "learner/serve/work.h"
#include "learner/train/trajectory_store.h"

namespace farm {

class RolloutCollector {
 public:
  RolloutCollector(const FarmConfig& config, bool recording) : config_(config), recording_(recording) {}

  // The store, once the first Hello has sized it; core_numel: floats of recurrent state per row (0: no core),
  // kept every ppo.bptt steps.
  void CreateStore(int64_t obs_numel, const Space& action, int64_t state_numel, int agents_per_env,
                   int64_t core_numel = 0);
  bool has_store() const { return store_ != nullptr; }
  TrajectoryStore& store() { return *store_; }
  const TrajectoryStore& store() const { return *store_; }
  bool recording() const { return recording_; }

  // Whether a request served now must be held (parked) rather than answered.
  bool Hold(bool trainer_busy, std::size_t workers, bool stopping) const {
    return (recording_ && config_.mode == "sync" && trainer_busy) ||
           static_cast<int>(workers) < config_.learner.min_workers || stopping;
  }
  void Park(Work&& w) {
    w.kind = Work::Kind::kReplay;
    w.inputs_recorded = false;  // replayed after other records: its inputs are copied again when it is served
    parked_.push_back(std::move(w));
  }
  // The parked requests, oldest first; none stay parked.
  std::vector<Work> TakeParked() { return std::move(parked_); }
  // A worker is gone: its parked requests go too.
  void DropParked(const std::string& identity);
  std::size_t parked() const { return parked_.size(); }

  // Every group's rollout is full, and it may be taken now.
  bool CanHandOff(bool trainer_busy, bool stopping) const {
    return store_ && store_->all_full() && !trainer_busy && !stopping;
  }

 private:
  const FarmConfig config_;
  const bool recording_;
  std::unique_ptr<TrajectoryStore> store_;
  std::vector<Work> parked_;  // in arrival order
};

}  // namespace farm
