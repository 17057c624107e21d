// RolloutPreemption: DD-PPO's preemption of stragglers between learner ranks (learner.sync_fraction). In sync mode
// the ranks update together, so the slowest rank's rollout sets everyone's pace. Each rank counts its full
// rollouts in the rendezvous store (rank 0's TCPStore), one counter per rollout index; a rank still collecting
// asks whether at least sync_fraction of the ranks have a full one, and when they have, it ends its own rollout
// at the step it has reached (TrajectoryStore::CutLength; the learner asks only once that is at least a quarter of
// ppo.rollout_length). The update that follows makes the same collective calls on every rank whatever their sample
// counts (PpoTrainer plans its minibatches over all ranks), so a cut changes no rank's sequence of collectives.
//
// Rollout indices: the rollouts this session of the rank has handed to its trainer, 0, 1, ...; every rank hands
// them over in the same order (one per agreement), so index i names the same update on every rank.
//
// Threading: used by one thread (the learner's inference thread), over a store connection of its own (the
// trainer's collectives use the group's).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "learner/train/rank_group.h"

namespace farm {

class RolloutPreemption {
 public:
  // Connects to rank 0's store at place.master_addr:master_port (RankGroup::Create has started it). sync_fraction
  // in (0, 1]: the share of place.world_size ranks whose full rollouts end the others' (at least one rank).
  static Status Create(const RankPlace& place, double sync_fraction, double timeout_s,
                       std::unique_ptr<RolloutPreemption>* out);
  ~RolloutPreemption();
  RolloutPreemption(const RolloutPreemption&) = delete;
  RolloutPreemption& operator=(const RolloutPreemption&) = delete;

  // This rank's rollout `index` is full (once per index). Rank 0 also drops the counter of index - 1, which no
  // rank reads any more (every rank handed that rollout over before rank 0's agreement on it completed).
  Status MarkFull(int64_t index);
  // Whether at least needed() ranks have marked rollout `index` full. Asks the store at most once per
  // kPollInterval (false in between); once true for an index, true without asking.
  Status OthersReady(int64_t index, bool* ready);
  int needed() const { return needed_; }
  // How many of `world_size` ranks sync_fraction asks for: ceil(sync_fraction x world_size), at least 1 and at
  // most world_size (0.6 of 5 is 3, 0.5 of 2 is 1).
  static int NeededRanks(double sync_fraction, int world_size);

  static constexpr std::chrono::milliseconds kPollInterval{2};

 private:
  struct Impl;
  RolloutPreemption(std::unique_ptr<Impl> impl, int rank, int needed);
  std::string Key(int64_t index) const { return "farm/sync/" + std::to_string(index); }

  std::unique_ptr<Impl> impl_;
  const int rank_;
  const int needed_;
  int64_t ready_index_ = -1;  // the last index found ready
  std::chrono::steady_clock::time_point last_poll_{};
};

}  // namespace farm
