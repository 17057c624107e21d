#include "learner/rank_coordinator.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

namespace farm {
namespace {

// A learner alone: it decides from its own figures and sends nothing.
class SoleLearner final : public RankCoordinator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::shared_ptr<GradientReducer> MakeReducer(int) const override { return std::make_shared<OneRankReducer>(); }
  bool StopsOnOwnSteps() const override { return true; }
  void NoteStop(int) override {}
  bool NeedsFinalVote(bool, bool) const override { return false; }
  int64_t RunEnvSteps(int64_t own) const override { return own; }
  int64_t ResumedEnvSteps(int64_t run) const override { return run; }
  void OnFullRollout() override {}
  Status PreemptedLength(bool, const TrajectoryStore*, int, int64_t* length) override {
    *length = 0;
    return Status::Ok();
  }
  void PrepareJob(const RankLocal&, RunNormalizer&, TrainJob*) override {}
  TrainJob Vote(const RankLocal&, bool, RunNormalizer&) override {
    throw std::logic_error("RankCoordinator::Vote: a learner alone has no ranks to vote with");
  }
  RankVerdict OnResult(const TrainResult& result, RunNormalizer&, bool) override {
    (void)result;
    return RankVerdict{};  // the update ran: nothing to agree on
  }
  std::string ProgressSuffix() const override { return {}; }
  void AddToSummary(const TrajectoryStore*, double, nlohmann::json* s) const override { (*s)["world_size"] = 1; }
};

// One rank of several.
class RankMember final : public RankCoordinator {
 public:
  RankMember(std::shared_ptr<RankGroup> group, std::unique_ptr<RolloutPreemption> preemption)
      : group_(std::move(group)), preemption_(std::move(preemption)) {}

  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }
  std::shared_ptr<GradientReducer> MakeReducer(int check_every) const override {
    return std::make_shared<RankReducer>(group_, check_every);
  }
  bool StopsOnOwnSteps() const override { return false; }
  void NoteStop(int stop_bits) override { stop_bits_ = stop_bits; }
  bool NeedsFinalVote(bool has_trainer, bool rank_failure) const override {
    return has_trainer && !agreed_stop_ && !rank_failure;
  }
  int64_t RunEnvSteps(int64_t own) const override {
    if (last_.ranks.empty()) return own;
    const double mine_then = last_.ranks[static_cast<size_t>(rank())].env_steps;
    return static_cast<int64_t>(last_.env_steps - mine_then) + own;
  }
  int64_t ResumedEnvSteps(int64_t run) const override { return RankShare(run, rank(), size()); }

  void OnFullRollout() override {
    if (!preemption_) return;
    if (auto s = preemption_->MarkFull(rollouts_); !s.ok())
      spdlog::warn("{} (this rank's rollout is not counted; others may wait for it)", s.message());
  }

  Status PreemptedLength(bool can_cut, const TrajectoryStore* store, int chunk_steps, int64_t* length) override {
    *length = 0;
    if (!preemption_ || !can_cut || store == nullptr || store->all_full()) return Status::Ok();
    const int64_t T = store->rollout_length();
    const int64_t cut = store->CutLength(chunk_steps);
    // DD-PPO's floor: at least a quarter of the rollout, so that a slow rank still brings its share of samples.
    if (cut >= T || 4 * cut < T) return Status::Ok();
    bool ready = false;
    if (auto s = preemption_->OthersReady(rollouts_, &ready); !s.ok()) return s;
    if (ready) *length = cut;
    return Status::Ok();
  }

  void PrepareJob(const RankLocal& local, RunNormalizer& normalizer, TrainJob* job) override {
    ++rollouts_;
    job->figures = Figures(local, kRankStopNone);
    TakeNormalizer(normalizer, job);
  }

  TrainJob Vote(const RankLocal& local, bool failed, RunNormalizer& normalizer) override {
    TrainJob job;
    job.vote_only = true;
    // Why this rank stops; none when it stops only because another rank cut the update short (that rank's vote
    // says why).
    job.figures = Figures(local, failed                          ? kRankStopFailed
                                 : stop_bits_ != kRankStopNone   ? stop_bits_
                                 : stop_from_cancel_             ? kRankStopNone
                                                                 : kRankStopRequested);
    TakeNormalizer(normalizer, &job);
    return job;
  }

  RankVerdict OnResult(const TrainResult& r, RunNormalizer& normalizer, bool stopping) override {
    RankVerdict v;
    v.updated = r.updated;
    if (r.updated && !r.rank_failed) {  // the updates' collectives (a vote's wait for the others is not an update's)
      traffic_.calls += r.traffic.calls;
      traffic_.bytes += r.traffic.bytes;
      traffic_.seconds += r.traffic.seconds;
      ++updates_;
      update_seconds_ += r.update_seconds;
    }
    last_checksum_ = r.checksum;
    if (r.agreed) {
      last_ = r.agreement;
      normalizer.ApplyRanks(r.norm_obs, r.norm_ret);
    }
    if (r.rank_failed) {
      spdlog::error("{}", r.error);
      v.rank_failure = Status::IoError(r.error);
      v.stop = true;
      v.reason = r.error;
    } else if (!r.agreed_stop.empty()) {
      v.stop = true;
      v.reason = r.agreed_stop;
      v.override_reason = stop_from_cancel_;  // the agreement says which rank stopped, and why
      agreed_stop_ = true;
    } else if (r.cancelled && !stopping) {
      // Another rank's stop cut the update short on every rank: this one stops with them (the vote that follows
      // says which rank, and why).
      v.stop = true;
      v.reason = "another rank is stopping (it cut the update short)";
      stop_from_cancel_ = true;
    }
    return v;
  }

  std::string ProgressSuffix() const override {
    if (last_.ranks.empty()) return {};
    // The run's steps over every rank as of their last agreement, and the all-reduce's share of the last update.
    double allreduce = 0, update = 0;
    for (const RankFigures& f : last_.ranks) {
      allreduce += f.allreduce_seconds;
      update += f.update_seconds;
    }
    return fmt::format(" | {} ranks: {:.0f} steps, all-reduce {:.0f}% of the updates", last_.ranks.size(),
                       last_.env_steps, update > 0 ? 100.0 * allreduce / update : 0.0);
  }

  void AddToSummary(const TrajectoryStore* store, double sync_fraction, nlohmann::json* out) const override {
    nlohmann::json& s = *out;
    s["world_size"] = size();
    // The run's totals and every rank's figures as of the ranks' last agreement (this rank's own are above).
    s["rank"] = rank();
    s["dist_backend"] = group_->backend();
    s["env_steps_all_ranks"] = last_.env_steps;
    nlohmann::json per = nlohmann::json::array();
    for (size_t r = 0; r < last_.ranks.size(); ++r) {
      const RankFigures& f = last_.ranks[r];
      // Per update of this session: the update's seconds, and the seconds and bytes of its collectives (the
      // agreement's and the gradients'; the seconds include waiting for slower ranks), and their share.
      const double n = std::max(1.0, f.updates);
      per.push_back({{"rank", r},
                     {"env_steps", f.env_steps},
                     {"sps", f.env_steps_per_s},
                     {"workers", f.workers},
                     {"updates", f.updates},
                     {"update_seconds_per_update", f.update_seconds / n},
                     {"allreduce_seconds_per_update", f.allreduce_seconds / n},
                     {"allreduce_bytes_per_update", f.allreduce_bytes / n},
                     {"allreduce_share_of_update", f.update_seconds > 0 ? f.allreduce_seconds / f.update_seconds : 0.0},
                     {"checksum", f.checksum},
                     // learner.sync_fraction: rollouts this rank ended early, and their mean length.
                     {"rollouts", f.rollouts},
                     {"cut_rollouts", f.cut_rollouts},
                     {"cut_mean_length", f.cut_rollouts > 0 ? f.cut_steps / f.cut_rollouts : 0.0}});
    }
    s["ranks"] = per;
    if (preemption_) {
      const TrajectoryStore::CopyStats c = store ? store->copy_stats() : TrajectoryStore::CopyStats{};
      s["sync_fraction"] = {{"fraction", sync_fraction},
                            {"ranks_needed", preemption_->needed()},
                            {"cut_rollouts", c.cut_takes},
                            {"cut_dropped_row_steps", c.cut_dropped_rows}};
    }
  }

 private:
  RankFigures Figures(const RankLocal& local, int stop_bits) const {
    RankFigures f;
    f.env_steps = static_cast<double>(local.env_steps);
    f.handoff_env_steps = static_cast<double>(local.handoff_env_steps);
    f.workers = static_cast<double>(local.workers);
    f.env_steps_per_s = local.wall_seconds > 0 ? static_cast<double>(local.env_steps) / local.wall_seconds : 0.0;
    f.updates = static_cast<double>(updates_);
    f.update_seconds = update_seconds_;
    f.allreduce_seconds = traffic_.seconds;
    f.allreduce_bytes = static_cast<double>(traffic_.bytes);
    f.checksum = static_cast<double>(last_checksum_ & ((int64_t{1} << 48) - 1));
    f.rollouts = static_cast<double>(rollouts_);
    if (local.store != nullptr) {
      f.cut_rollouts = static_cast<double>(local.store->copy_stats().cut_takes);
      f.cut_steps = static_cast<double>(local.store->copy_stats().cut_steps);
    }
    f.stop = stop_bits;
    return f;
  }

  static void TakeNormalizer(RunNormalizer& normalizer, TrainJob* job) {
    normalizer.TakeForRanks(&job->norm_obs, &job->norm_ret);
    job->norm_obs_dim = normalizer.obs_dim();
    job->norm_ret_dim = normalizer.ret_dim();
  }

  std::shared_ptr<RankGroup> group_;
  std::unique_ptr<RolloutPreemption> preemption_;  // learner.sync_fraction (null: off)
  RankAgreement last_;               // the last agreement (rank 0 reports every rank's figures from it)
  bool agreed_stop_ = false;         // the ranks agreed to stop: no collective follows
  ReducerTraffic traffic_;           // the collectives of this session's jobs, added up
  int64_t updates_ = 0;              // this session's updates, and their seconds
  double update_seconds_ = 0;
  int64_t last_checksum_ = 0;        // this rank's parameter checksum at the last check
  int stop_bits_ = kRankStopNone;    // why this rank stops, for its vote (a stop request when none is set)
  bool stop_from_cancel_ = false;    // stopping because another rank cut the update short: its reason comes later
  int64_t rollouts_ = 0;             // rollouts handed to the trainer this session: the preemption's index
};

}  // namespace

std::unique_ptr<RankCoordinator> MakeRankCoordinator(std::shared_ptr<RankGroup> group,
                                                     std::unique_ptr<RolloutPreemption> preemption) {
  if (!group) return std::make_unique<SoleLearner>();
  return std::make_unique<RankMember>(std::move(group), std::move(preemption));
}

}  // namespace farm
