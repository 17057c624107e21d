// RunStats: the run's counters, the inference thread's time split and the
// 100-episode window, and the one list of items (Items) that metrics.jsonl,
// TensorBoard, the status line and summary.json are all made from.
//
// The time split covers the inference thread's whole wall time since Run
// began: every phase it spends time in is measured (Phase), and `other` is
// what is left, shown as it is so that a gap cannot hide. The trainer thread's
// busy time is reported beside it (it overlaps the inference thread's).
//
// Threading: owned by the inference thread. What other threads count (the I/O
// thread's errors and closed connections, the trainer's update time) comes in
// as values: Outside, filled by the caller when items are made.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "learner/run/metrics.h"
#include "learner/train/ppo.h"
#include "learner/train/trajectory_store.h"

namespace farm {

// Where the inference thread's time goes (seconds).
struct TimeSplit {
  double wait = 0;     // waiting for requests (nothing queued)
  double held = 0;     // waiting while the trainer updates (sync mode: requests held for the update)
  double admit = 0;    // Hellos (the first one builds the policy), checking requests, recording step results
  double gather = 0;   // copying the requests' observations (and states) into the batch buffers
  double forward = 0;  // the forward pass: to the device, the policy, the actions back (or random actions)
  double serve = 0;    // recording the step into the store, encoding and sending replies
  double handoff = 0;  // taking a full rollout for the trainer, copying the new weights into the acting policy
  double report = 0;   // metrics.jsonl, TensorBoard, the status line, dropping silent workers
  double other = 0;    // the rest of the wall time since Run began (set by Close)
  // Inside `forward`, not added to the rest (CUDA only, 0 on the CPU): the part spent waiting for the device's
  // results, and the device's own time for the batches (CUDA events around each batch's copies and forward;
  // time its kernels waited there for the trainer's counts too). forward - forward_wait is the host's time
  // launching the work.
  double forward_wait = 0;
  double forward_device = 0;

  double named() const { return wait + held + admit + gather + forward + serve + handoff + report; }
};

class RunStats {
 public:
  enum class Phase { kWait, kHeld, kAdmit, kGather, kForward, kServe, kHandoff, kReport };

  // Counters kept elsewhere, read when items are made.
  struct Outside {
    int64_t workers_active = 0;
    int64_t store_bytes = 0;         // the trajectory store's arenas (pool included)
    int64_t io_errors = 0;           // answered by the I/O thread
    int64_t connections_closed = 0;  // seen by the I/O thread's monitor
    int64_t replies_dropped = 0;
    int64_t auth_refused = 0;
    int64_t heartbeats_answered = 0;  // by the I/O thread, while the inference thread was busy or not
    double trainer_busy_seconds = 0;  // updates, including the one in flight
  };

  // Where an item goes.
  enum Where : unsigned { kMetrics = 1, kTensorBoard = 2, kSummary = 4, kAll = 7 };
  struct Item {
    std::string key;
    nlohmann::json value;  // a number, or null when not known yet
    unsigned where = kAll;
  };

  explicit RunStats(int64_t num_agents = 1) : num_agents_(num_agents) {}
  void set_num_agents(int64_t n) { num_agents_ = n; }

  // The clock of the time split starts here (Learner::Run).
  void Start(std::chrono::steady_clock::time_point now, double wall_offset);
  void Add(Phase phase, double seconds);
  // The forward's detail (TimeSplit::forward_wait and forward_device), for one batch.
  void AddForwardDetail(double wait_seconds, double device_seconds) {
    time_.forward_wait += wait_seconds;
    time_.forward_device += device_seconds;
  }
  // Wall seconds of earlier sessions of this run (--resume), added to Wall().
  void set_wall_offset(double seconds) { wall_offset_ = seconds; }
  double wall_offset() const { return wall_offset_; }
  // Wall seconds of the run: this process's since Start, plus earlier sessions' (--resume).
  double Wall() const;
  double ProcessWall() const;
  // The split with `other` filled in: the wall time since Start less the measured phases.
  TimeSplit Split() const;

  // ---- counters (the inference thread updates them directly) ----
  int64_t env_steps = 0;  // env steps; a multi-agent env's step is num_agents agent rows
  int64_t updates = 0;
  int64_t version = 0;    // policy version of the acting policy
  int64_t batches = 0, batch_rows = 0;
  int64_t errors = 0;  // answered by the inference thread
  int64_t non_finite_rejected = 0;
  int64_t non_finite_sanitized = 0;
  int64_t workers_joined = 0;  // Hellos accepted, rejoins included
  int64_t rejoins = 0;         // of those, workers reconnecting under a new identity (NAME-cN)
  int64_t workers_lost = 0;    // dropped as silent
  int64_t workers_replaced = 0;  // dropped because the same worker process connected again (a newer -cN)
  std::optional<double> last_join_seconds;  // process wall seconds when the last worker joined
  double update_seconds_total = 0;  // finished updates
  double last_update_seconds = 0;
  EpisodeWindow window{100};
  std::optional<int64_t> solved_at_steps;
  std::optional<double> solved_at_seconds;
  std::optional<double> solved_at_unix;
  LagStats last_lag;  // the last rollout's
  LagStats run_lag;   // every rollout's samples so far
  int64_t lag_dropped_total = 0;  // samples ppo.max_policy_lag left out of updates
  int64_t masked_rows_total = 0;  // rows of agents finished before their env ended, left out of updates
  PpoStats last_ppo;

  // A rollout's lag: the last one's, and added to the run's.
  void AddLag(const LagStats& lag) {
    last_lag = lag;
    for (const auto& [l, n] : lag.counts) run_lag.counts[l] += n;
    SummarizeLag(&run_lag);
  }

  // Env steps counted since the last status line (for its steps/s).
  void CountSteps(int64_t env_steps_delta) {
    env_steps += env_steps_delta;
    interval_steps_ += env_steps_delta;
  }

  // Every item, in one order: metrics rows, TensorBoard scalars and summary.json take those marked for them.
  std::vector<Item> Items(const Outside& outside) const;
  // One metrics.jsonl row: the items for metrics plus the update's PPO statistics.
  nlohmann::json MetricsRow(const Outside& outside) const;
  // TensorBoard scalars (numbers only).
  std::vector<std::pair<std::string, double>> TensorBoardScalars(const Outside& outside) const;
  // summary.json's counters and time split (the caller adds what describes the run: env, device, ...).
  nlohmann::json SummaryCounters(const Outside& outside) const;
  // The status line, from the same items; restarts the steps/s interval.
  std::string StatusLine(const Outside& outside, std::chrono::steady_clock::time_point now);

 private:
  int64_t num_agents_;
  std::chrono::steady_clock::time_point start_{};
  double wall_offset_ = 0;
  TimeSplit time_;
  int64_t interval_steps_ = 0;
  std::chrono::steady_clock::time_point interval_start_{};
};

// Measures one phase of the inference thread into a RunStats (RAII): from construction to destruction.
// Phases never nest: each moment of the thread's time is counted once.
class PhaseTimer {
 public:
  PhaseTimer(RunStats& stats, RunStats::Phase phase)
      : stats_(stats), phase_(phase), t0_(std::chrono::steady_clock::now()) {}
  ~PhaseTimer() {
    stats_.Add(phase_, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count());
  }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

 private:
  RunStats& stats_;
  const RunStats::Phase phase_;
  const std::chrono::steady_clock::time_point t0_;
};

}  // namespace farm
