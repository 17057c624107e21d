// The run's counters and the reports made from them.
#include "learner/run_stats.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "common/resources.h"
#include "common/seconds.h"

namespace farm {
namespace {
nlohmann::json OrNull(const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); }
nlohmann::json OrNull(const std::optional<int64_t>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); }
nlohmann::json Finite(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }
}  // namespace

void RunStats::Start(std::chrono::steady_clock::time_point now, double wall_offset) {
  start_ = now;
  interval_start_ = now;
  wall_offset_ = wall_offset;
  time_ = TimeSplit{};
}

void RunStats::Add(Phase phase, double seconds) {
  switch (phase) {
    case Phase::kWait: time_.wait += seconds; break;
    case Phase::kHeld: time_.held += seconds; break;
    case Phase::kAdmit: time_.admit += seconds; break;
    case Phase::kGather: time_.gather += seconds; break;
    case Phase::kForward: time_.forward += seconds; break;
    case Phase::kServe: time_.serve += seconds; break;
    case Phase::kHandoff: time_.handoff += seconds; break;
    case Phase::kReport: time_.report += seconds; break;
  }
}

double RunStats::ProcessWall() const { return Seconds(std::chrono::steady_clock::now() - start_); }
double RunStats::Wall() const { return wall_offset_ + ProcessWall(); }

TimeSplit RunStats::Split() const {
  TimeSplit t = time_;
  t.other = std::max(0.0, ProcessWall() - t.named());
  return t;
}

std::vector<RunStats::Item> RunStats::Items(const Outside& o) const {
  const double wall = Wall();
  const TimeSplit t = Split();
  const auto rate = [&](double v) { return wall > 0 ? v / wall : 0.0; };
  constexpr unsigned kMT = kMetrics | kTensorBoard;
  constexpr unsigned kMS = kMetrics | kSummary;
  return {
      // env steps (what total_env_steps, sps and solved_at_steps count); agent_steps = env_steps x agents, the
      // transitions PPO trains on. Not TensorBoard scalars: they are its x axis.
      {"env_steps", env_steps, kMS},
      {"agent_steps", env_steps * num_agents_, kMS},
      {"num_agents", num_agents_, kSummary},
      {"wall_seconds", wall},
      {"sps", rate(static_cast<double>(env_steps))},
      {"agent_sps", rate(static_cast<double>(env_steps * num_agents_))},
      {"episodes", window.total_episodes()},
      {"mean_return_100", window.empty() ? nlohmann::json(nullptr) : nlohmann::json(window.mean_return())},
      {"mean_length_100", window.empty() ? nlohmann::json(nullptr) : nlohmann::json(window.mean_length()), kMT},
      {"solved_at_steps", OrNull(solved_at_steps), kSummary},
      {"solved_at_seconds", OrNull(solved_at_seconds), kSummary},
      {"solved_at_unix", OrNull(solved_at_unix), kSummary},
      {"policy_version", version},
      {"update", updates, kMT},
      {"updates", updates, kSummary},
      {"update_seconds", last_update_seconds, kMT},
      // The last rollout's policy lag (updates between acting and training) per update; the run's in summary.json.
      {"policy_lag_min", last_lag.min, kMT},
      {"policy_lag_avg", last_lag.avg, kMT},
      {"policy_lag_p95", last_lag.p95, kMT},
      {"policy_lag_max", last_lag.max, kMT},
      {"policy_lag_mean", run_lag.avg, kSummary},
      {"policy_lag_p95_run", run_lag.p95, kSummary},
      {"policy_lag_max_run", run_lag.max, kSummary},
      {"lag_dropped_samples", lag_dropped_total, kSummary},
      {"masked_agent_rows", masked_rows_total, kSummary},
      {"batch_rows_avg", batches ? static_cast<double>(batch_rows) / static_cast<double>(batches) : 0.0},
      // The inference thread's time split (adds up to its wall time) and the trainer's busy time beside it.
      {"time_wait_seconds", t.wait, kMT},
      {"time_held_for_update_seconds", t.held, kMT},
      {"time_admit_seconds", t.admit, kMT},
      {"time_gather_seconds", t.gather, kMT},
      {"time_forward_seconds", t.forward, kMT},
      {"time_forward_wait_seconds", t.forward_wait, kMT},
      {"time_forward_device_seconds", t.forward_device, kMT},
      {"time_serve_seconds", t.serve, kMT},
      {"time_handoff_seconds", t.handoff, kMT},
      {"time_report_seconds", t.report, kMT},
      {"time_other_seconds", t.other, kMT},
      {"time_update_seconds", o.trainer_busy_seconds, kMT},
      {"rss_mb", CurrentRssMb(), kMT},
      {"max_rss_mb", MaxRssMb(), kSummary},
      {"store_bytes", o.store_bytes},
      {"protocol_errors", errors + o.io_errors},
      {"non_finite_rejected", non_finite_rejected},
      {"non_finite_sanitized", non_finite_sanitized},
      // Workers: every identity that joined and is still here or was dropped (a rejoin under a new identity
      // counts again, as `rejoins` too).
      {"workers", o.workers_active + workers_lost + workers_replaced, kSummary},
      {"workers_active", o.workers_active},
      {"workers_joined", workers_joined},
      {"rejoins", rejoins},
      {"workers_lost", workers_lost},
      {"workers_replaced", workers_replaced},
      {"last_join_seconds", OrNull(last_join_seconds), kMS},
      {"connections_closed", o.connections_closed},
      {"replies_dropped", o.replies_dropped},
      {"auth_refused", o.auth_refused, kSummary},
      {"heartbeats_answered", o.heartbeats_answered, kSummary},
  };
}

nlohmann::json RunStats::MetricsRow(const Outside& outside) const {
  nlohmann::json row = nlohmann::json::object();
  for (const Item& item : Items(outside))
    if (item.where & kMetrics) row[item.key] = item.value;
  for (const auto& [k, v] : last_ppo.Items()) row[k] = Finite(v);
  return row;
}

std::vector<std::pair<std::string, double>> RunStats::TensorBoardScalars(const Outside& outside) const {
  std::vector<std::pair<std::string, double>> out;
  for (const Item& item : Items(outside))
    if ((item.where & kTensorBoard) && item.value.is_number()) out.emplace_back(item.key, item.value.get<double>());
  for (const auto& [k, v] : last_ppo.Items())
    if (std::isfinite(v)) out.emplace_back(k, v);
  return out;
}

nlohmann::json RunStats::SummaryCounters(const Outside& outside) const {
  nlohmann::json s = nlohmann::json::object();
  for (const Item& item : Items(outside))
    if (item.where & kSummary) s[item.key] = item.value;
  const TimeSplit t = Split();
  s["time_seconds"] = {{"wait_for_data", t.wait}, {"held_for_update", t.held}, {"admit", t.admit},
                       {"gather", t.gather}, {"forward", t.forward}, {"serve", t.serve},          {"handoff", t.handoff},
                       {"report", t.report},      {"other", t.other},          {"total", ProcessWall()},
                       {"update", outside.trainer_busy_seconds},
                       // parts of `forward` (CUDA): waiting for the device, and the device's time for the batches
                       {"forward_wait", t.forward_wait}, {"forward_device", t.forward_device}};
  return s;
}

std::string RunStats::StatusLine(const Outside& outside, std::chrono::steady_clock::time_point now) {
  const double interval = Seconds(now - interval_start_);
  const double sps = interval > 0 ? static_cast<double>(interval_steps_) / interval : 0;
  interval_start_ = now;
  interval_steps_ = 0;
  const double wall = ProcessWall();
  const TimeSplit t = Split();
  auto pct = [&](double v) { return 100.0 * v / std::max(wall, 1e-9); };
  std::string workers;
  if (workers_lost > 0 || rejoins > 0)
    workers = fmt::format(" ({} lost, {} rejoins)", workers_lost, rejoins);
  return fmt::format(
      "[{:7.1f}s] steps {:>10} | {:>8.0f} sps | return {:>7} | v{} lag {:.1f} p95 {} max {} | {} workers{} | "
      "batch {:>6.1f} rows | "
      "inference thread: wait {:.0f}% held {:.0f}% admit {:.0f}% gather {:.0f}% infer {:.0f}% serve {:.0f}% "
      "handoff {:.0f}% "
      "report {:.0f}% other {:.0f}% | trainer busy {:.0f}%",
      wall, env_steps, sps, window.empty() ? std::string("-") : fmt::format("{:.1f}", window.mean_return()), version,
      last_lag.avg, last_lag.p95, last_lag.max, outside.workers_active, workers,
      batches ? static_cast<double>(batch_rows) / static_cast<double>(batches) : 0.0, pct(t.wait), pct(t.held),
      pct(t.admit), pct(t.gather), pct(t.forward), pct(t.serve), pct(t.handoff), pct(t.report), pct(t.other),
      pct(outside.trainer_busy_seconds));
}

}  // namespace farm
