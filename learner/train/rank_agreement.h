// What the ranks of a data-parallel run agree on before each update (one all-reduce, on the trainer thread): the
// env steps of the whole run (the schedule's progress and total_env_steps are the run's, not a rank's), whether
// any rank is stopping and why, and every rank's figures (rank 0 reports them: summary.json's `ranks`).
//
// Threading: plain data and a free function; Agree is a collective (every rank calls it once per update, and once
// more to stop).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/running_stats.h"
#include "learner/train/rank_group.h"

namespace farm {

// Why a rank is stopping (bits; a rank may have several).
enum RankStop : int {
  kRankStopNone = 0,
  kRankStopRequested = 1,  // a signal, a stop request, checkpoints that cannot be written
  kRankStopTarget = 2,     // stop_at_target: this rank's episodes reached target_return
  kRankStopWall = 4,       // max_wall_seconds
  kRankStopEval = 8,       // learner.eval_episodes counted
  kRankStopFailed = 16,    // a failure on this rank (serving, an update)
};
// "a stop request, target_return" for the bits set.
std::string RankStopText(int bits);

// What one rank reports at each agreement.
struct RankFigures {
  double env_steps = 0;          // its env steps so far
  double handoff_env_steps = 0;  // its env steps when the rollout being handed off began (the schedule's progress)
  double workers = 0;
  double env_steps_per_s = 0;
  // This session's updates, the seconds they took, and the seconds and bytes of its collectives (agreements
  // included; the seconds include waiting for slower ranks).
  double updates = 0;
  double update_seconds = 0;
  double allreduce_seconds = 0;
  double allreduce_bytes = 0;
  double checksum = 0;           // its parameters' checksum after the last check (GradientReducer), low 48 bits
  // learner.sync_fraction: its rollouts handed off this session, those it ended early, and their steps added up.
  double rollouts = 0;
  double cut_rollouts = 0;
  double cut_steps = 0;
  int stop = kRankStopNone;
};

struct RankAgreement {
  double env_steps = 0;          // over every rank
  double handoff_env_steps = 0;  // over every rank
  int stop = kRankStopNone;      // every rank's bits
  int first_stopping_rank = -1;  // the lowest rank with a stop bit
  std::vector<RankFigures> ranks;
};

// Rank `rank`'s share of `total` over `world` ranks: total / world, the remainder one each to the first ranks
// (the shares add up to total). A resumed rank's env steps: checkpoints count the run's.
inline int64_t RankShare(int64_t total, int rank, int world) {
  if (world <= 1) return total;
  return total / world + (rank < total % world ? 1 : 0);
}

// The agreement over the ranks of `group` (a collective).
RankAgreement Agree(RankGroup& group, const RankFigures& mine);

// The moments of the union of every rank's samples (a collective): each rank's (count, mean, M2) gathered, then
// merged in rank order, so that every rank gets the same bits. Every rank's `mine` has the same dim (or is
// empty); the result has that dim. The normaliser's statistics stay one set for the run this way.
RunningMoments MergeAcrossRanks(RankGroup& group, const RunningMoments& mine, int64_t dim);

}  // namespace farm
