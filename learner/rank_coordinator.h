// Where this learner stands among the learner ranks of its run (DD-PPO), and everything the ranks decide together:
// who writes checkpoints and shows the progress line, the figures each rank brings to the agreement before every
// update (env steps, stops, throughput, traffic, checksums), the normaliser's deltas merged across ranks, the
// preemption of stragglers (learner.sync_fraction), and what an agreement means for the run (go on, stop together,
// a failed collective). The learner asks it; it never asks back.
//
// Two implementations, chosen once at the root (Learner::Create): SoleLearner for a learner alone (it decides
// everything from its own figures and sends nothing), RankMember for one rank of several (over a RankGroup). The
// learner's code has no branch on which it is.
//
// Threading: the inference thread's (the RankGroup itself is the trainer thread's once the run is built: the
// agreement runs there, TrainerThread::AgreeWithRanks, and comes back in a TrainResult).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "learner/run/run_normalizer.h"
#include "learner/train/gradient_reducer.h"
#include "learner/train/rank_agreement.h"
#include "learner/train/rank_group.h"
#include "learner/train/rollout_preemption.h"
#include "learner/train/train_job.h"
#include "learner/train/trajectory_store.h"

namespace farm {

// This learner's own figures, as the inference thread knows them when it asks.
struct RankLocal {
  int64_t env_steps = 0;
  int64_t handoff_env_steps = 0;  // env steps at the last hand-off
  int64_t workers = 0;
  double wall_seconds = 0;
  const TrajectoryStore* store = nullptr;  // null before the run is built
};

// How the run should end after a result, as the ranks decided it (RankCoordinator::OnResult).
struct RankVerdict {
  bool updated = true;      // the job's update ran (false: a vote, or a stop the ranks agreed on before it)
  bool stop = false;        // stop the run with `reason`
  bool override_reason = false;  // `reason` replaces a reason already set (the agreement says which rank stopped)
  std::string reason;
  Status rank_failure;      // a collective failed: the run stops with this
};

class RankCoordinator {
 public:
  virtual ~RankCoordinator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Rank 0 (or a learner alone) writes checkpoints and the summary's run-wide figures, and shows the progress line.
  bool writes_checkpoints() const { return rank() == 0; }

  // The trainer's gradient reducer: a OneRankReducer alone, a RankReducer over the group otherwise.
  virtual std::shared_ptr<GradientReducer> MakeReducer(int check_every) const = 0;

  // Whether this learner stops at total_env_steps by its own count (alone); ranks stop on the agreement's count.
  virtual bool StopsOnOwnSteps() const = 0;
  // Why this rank stops (kRankStop*), for its vote; a learner alone keeps nothing.
  virtual void NoteStop(int stop_bits) = 0;
  // Whether this rank must take part in one more agreement before it leaves (to tell the others it stops).
  virtual bool NeedsFinalVote(bool has_trainer, bool rank_failure) const = 0;

  // The run's env steps: alone its own; with ranks every rank's as of the last agreement plus its own since.
  virtual int64_t RunEnvSteps(int64_t own_env_steps) const = 0;
  // A resumed run's env steps that are this learner's to count from (its share over the ranks).
  virtual int64_t ResumedEnvSteps(int64_t run_env_steps) const = 0;

  // learner.sync_fraction: a full rollout is counted towards the others' preemption (MarkFull), or, while this
  // rank's rollout is not full, the length to cut it at now (0: not now). `can_cut`: the learner records, has a
  // store, its trainer is idle and it is not stopping. A failure to reach the others is returned.
  virtual void OnFullRollout() = 0;
  virtual Status PreemptedLength(bool can_cut, const TrajectoryStore* store, int chunk_steps, int64_t* length) = 0;

  // A rollout handed to the trainer: this rank's figures and the normaliser's deltas join the job (nothing alone).
  virtual void PrepareJob(const RankLocal& local, RunNormalizer& normalizer, TrainJob* job) = 0;
  // A job that only takes this rank's part in the next agreement, to stop (`failed`: its serving or update failed).
  virtual TrainJob Vote(const RankLocal& local, bool failed, RunNormalizer& normalizer) = 0;
  // What the agreement before `result`'s job decided. `stopping`: the learner is already stopping.
  virtual RankVerdict OnResult(const TrainResult& result, RunNormalizer& normalizer, bool stopping) = 0;

  // " | 2 ranks: ..." for the progress line (empty alone).
  virtual std::string ProgressSuffix() const = 0;
  // The ranks' part of summary.json: world_size always, the rest with ranks.
  virtual void AddToSummary(const TrajectoryStore* store, double sync_fraction, nlohmann::json* summary) const = 0;
};

// `group` null: a SoleLearner. Otherwise a RankMember of `group`, with `preemption` when learner.sync_fraction is set.
std::unique_ptr<RankCoordinator> MakeRankCoordinator(std::shared_ptr<RankGroup> group,
                                                     std::unique_ptr<RolloutPreemption> preemption);

}  // namespace farm
