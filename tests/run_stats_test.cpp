// RunStats: one list of items for every report, and a time split that adds up to the wall time.
#include "learner/run_stats.h"

#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>

#include "learner/run/eval_episodes.h"

// LibTorch pulls in glog, whose CHECK would replace Catch's: include Catch last.
#undef CHECK
#include <catch2/catch.hpp>

namespace farm {

TEST_CASE("RunStats: the time split adds up to the wall time, with the rest shown as other", "[stats]") {
  RunStats stats;
  stats.Start(std::chrono::steady_clock::now(), 0);
  stats.Add(RunStats::Phase::kWait, 0.010);
  stats.Add(RunStats::Phase::kForward, 0.020);
  {
    PhaseTimer t(stats, RunStats::Phase::kServe);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(60));  // what no phase measured (nothing here)
  const double wall = stats.ProcessWall();
  const TimeSplit t = stats.Split();
  CHECK(t.serve >= 0.030);
  CHECK(t.named() + t.other == Approx(wall).epsilon(0.01));
  CHECK(t.other >= 0.030 - 1e-3);  // the sleeps not measured as a phase, not hidden
  const nlohmann::json s = stats.SummaryCounters({});
  double sum = 0;
  for (const char* k : {"wait_for_data", "held_for_update", "admit", "gather", "forward", "serve", "handoff", "report", "other"})
    sum += s["time_seconds"][k].get<double>();
  CHECK(sum == Approx(s["time_seconds"]["total"].get<double>()).epsilon(0.01));
}

TEST_CASE("RunStats: metrics, TensorBoard, summary and status line come from one list", "[stats]") {
  RunStats stats(10);
  stats.Start(std::chrono::steady_clock::now(), 100.0);  // a resumed run: 100 s before this process
  stats.CountSteps(500);
  stats.window.Add(12.5, 10);
  stats.updates = 3;
  stats.workers_lost = 1;
  stats.rejoins = 2;
  stats.workers_replaced = 2;
  stats.last_ppo.policy_loss = 0.25;
  stats.last_ppo.value_loss = std::nan("");
  // Two rollouts' lags: 100 samples at lag 0..4 (20 each), then 100 at lag 3 (90) and 9 (10).
  LagStats first, second;
  for (int64_t l = 0; l < 5; ++l) first.counts[l] = 20;
  second.counts[3] = 90;
  second.counts[9] = 10;
  SummarizeLag(&first);
  SummarizeLag(&second);
  CHECK(first.min == 0);
  CHECK(first.avg == 2.0);
  CHECK(first.p95 == 4);  // 80 samples are below 4
  CHECK(first.max == 4);
  stats.AddLag(first);
  stats.AddLag(second);
  CHECK(stats.last_lag.p95 == 9);  // 90 of 100 at 3: the 95th percentile is 9
  CHECK(stats.last_lag.avg == Approx(3.6));
  CHECK(stats.run_lag.min == 0);
  CHECK(stats.run_lag.avg == Approx((200.0 + 360.0) / 200.0));
  CHECK(stats.run_lag.p95 == 4);  // 190 of 200 samples at or below 4
  CHECK(stats.run_lag.max == 9);
  RunStats::Outside o;
  o.workers_active = 4;
  o.store_bytes = 1 << 20;
  o.connections_closed = 5;
  const auto items = stats.Items(o);
  const nlohmann::json row = stats.MetricsRow(o);
  const nlohmann::json summary = stats.SummaryCounters(o);
  const auto scalars = stats.TensorBoardScalars(o);
  for (const auto& item : items) {
    INFO(item.key);
    CHECK(static_cast<bool>(item.where & RunStats::kMetrics) == row.contains(item.key));
    CHECK(static_cast<bool>(item.where & RunStats::kSummary) == summary.contains(item.key));
    const bool in_tb = std::any_of(scalars.begin(), scalars.end(), [&](const auto& s) { return s.first == item.key; });
    CHECK(in_tb == (static_cast<bool>(item.where & RunStats::kTensorBoard) && item.value.is_number()));
  }
  CHECK(row["env_steps"] == 500);
  CHECK(row["agent_steps"] == 5000);
  CHECK(row["store_bytes"] == 1 << 20);
  CHECK(row["policy_loss"] == 0.25);
  CHECK(row["value_loss"].is_null());  // not finite: null in JSON, absent from TensorBoard
  CHECK(summary["workers"] == 7);      // active + lost + replaced
  CHECK(summary["workers_replaced"] == 2);
  CHECK(summary["wall_seconds"].get<double>() >= 100.0);
  const std::string line = stats.StatusLine(o, std::chrono::steady_clock::now());
  CHECK_THAT(line, Catch::Contains("steps        500"));
  CHECK_THAT(line, Catch::Contains("4 workers (1 lost, 2 rejoins)"));
  CHECK_THAT(line, Catch::Contains("return    12.5"));
  CHECK_THAT(line, Catch::Contains("lag 3.6 p95 9 max 9"));
  CHECK(row["policy_lag_p95"] == 9);
  CHECK(summary["policy_lag_p95_run"] == 4);
  CHECK(summary["policy_lag_max_run"] == 9);
}

TEST_CASE("EpisodeQuota spreads N episodes evenly over K envs, the first N%K one more", "[stats][eval]") {
  CHECK(EpisodeQuota(20, 6) == std::vector<int>{4, 4, 3, 3, 3, 3});
  CHECK(EpisodeQuota(5, 5) == std::vector<int>{1, 1, 1, 1, 1});
  CHECK(EpisodeQuota(3, 1) == std::vector<int>{3});
}

TEST_CASE("EvalEpisodes: each env's first episodes up to its quota, written, done at N", "[stats][eval]") {
  char dir[] = "/tmp/farm-eval-episodes.XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  const std::string path = std::string(dir) + "/episodes.jsonl";
  std::unique_ptr<EvalEpisodes> eval;
  CHECK_FALSE(EvalEpisodes::Open(0, path, &eval).ok());
  REQUIRE(EvalEpisodes::Open(5, path, &eval).ok());
  CHECK_FALSE(eval->done());
  CHECK_FALSE(eval->counts("w0"));
  REQUIRE(eval->SetWorker("w0", 2));  // quotas 3, 2
  CHECK_FALSE(eval->SetWorker("w1", 4));  // the first worker's envs only
  CHECK(eval->counts("w0"));
  CHECK_FALSE(eval->counts("w1"));
  // env 1 ends three short episodes first: its third is not counted (it would favour short episodes).
  for (int i = 0; i < 3; ++i) REQUIRE(eval->Add(1, 1.0, 2).ok());
  CHECK(eval->counted() == 2);
  REQUIRE(eval->Add(0, 10.0, 20).ok());
  REQUIRE(eval->Add(0, 12.0, 20).ok());
  CHECK_FALSE(eval->done());
  REQUIRE(eval->Add(0, 14.0, 20).ok());
  CHECK(eval->done());
  REQUIRE(eval->Add(0, 99.0, 20).ok());  // past its quota: not counted
  CHECK(eval->counted() == 5);
  CHECK_FALSE(eval->Add(2, 1.0, 1).ok());  // no env 2
  eval.reset();
  std::ifstream in(path);
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
  REQUIRE(rows.size() == 5);
  double sum = 0;
  for (const auto& r : rows) sum += r.at("return").get<double>();
  CHECK(sum == Approx(1 + 1 + 10 + 12 + 14));
  CHECK(rows[2].at("env") == 0);
  CHECK(rows[2].at("length") == 20);
  std::remove(path.c_str());
  ::rmdir(dir);
}

}  // namespace farm
