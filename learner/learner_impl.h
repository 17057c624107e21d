// The learner's private parts: Learner::Impl, which learner.cpp, learner_join.cpp and learner_serve.cpp
// implement between them. Not for other code: the public face is learner/learner.h.
#pragma once

#include "learner/learner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <thread>
#include <yaml-cpp/yaml.h>
#include <zmq.hpp>

#include "common/curve.h"
#include "common/files.h"
#include "common/log_limit.h"
#include "common/protobuf_log.h"
#include "common/seconds.h"
#include "common/tensorboard.h"
#include "common/transport.h"
#include "common/wire.h"
#include "learner/model/cuda_graph.h"
#include "learner/model/device.h"
#include "learner/model/scripted_encoder.h"
#include "learner/run/checkpoint.h"
#include "learner/run/error_text.h"
#include "learner/run/eval_episodes.h"
#include "learner/run/memory_budget.h"
#include "learner/run/metrics.h"
#include "learner/run/run_dir.h"
#include "learner/run/run_normalizer.h"
#include "learner/rank_coordinator.h"
#include "learner/run_builder.h"
#include "learner/run_stats.h"
#include "learner/serve/acting.h"
#include "learner/serve/batcher.h"
#include "learner/serve/liveness.h"
#include "learner/serve/rollout_collector.h"
#include "learner/serve/router_loop.h"
#include "learner/serve/work.h"
#include "learner/train/rollout_preemption.h"
#include "learner/serve/worker_registry.h"
#include "learner/train/critic_watch.h"
#include "learner/train/gradient_reducer.h"
#include "learner/train/rank_agreement.h"
#include "learner/train/rank_group.h"
#include "learner/train/trainer_thread.h"

namespace farm {
namespace learner_internal {

using Clock = std::chrono::steady_clock;
using Phase = RunStats::Phase;

inline double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}


}  // namespace learner_internal


// How the run ends: why it stops, and what went wrong if anything.
struct Outcome {
  bool stopping = false;
  std::string stop_reason;
  // The run could not start (policy, trainer or --resume): nothing is checkpointed and no summary written, so a
  // run directory being resumed stays as it was; Run returns this.
  Status start_failure;
  // An update produced a non-finite loss or parameters: no checkpoint is written after it (`latest` stays on the
  // last good one); Run returns an error.
  bool update_failed = false;
  std::string update_error;  // set when an exception (not a divergence) ended the update: out of memory, say
  // An exception escaped the serving of a batch (a LibTorch or CUDA error, say): the run stops, with its final
  // checkpoint (the trainer's policy is not touched by serving), and Run returns this.
  Status serve_failure;
  // Ranks: a collective failed (another rank died or hung): the run stops, rank 0 with its final checkpoint, and
  // Run returns this.
  Status rank_failure;
};

// The update in flight and how updates run (inference thread).
struct UpdateTrack {
  int64_t handoff_env_steps = 0;  // env_steps at the last hand-off: the learning-rate schedule's progress
  std::chrono::steady_clock::time_point submitted_at;  // when the update in flight was handed over
  std::string path = "none";      // summary.json's update_path
  int64_t graphed = 0;            // summary.json's graphed_updates
};

// Where the run reports: metrics.jsonl, TensorBoard, the status line, rate-limited warnings (inference thread).
struct Reporting {
  double start_unix = learner_internal::UnixNow();
  MetricsWriter metrics;
  std::unique_ptr<TensorBoardWriter> tensorboard;
  ProgressLine progress;
  std::chrono::steady_clock::time_point last_progress = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_worker_check = std::chrono::steady_clock::now();
  // The inference thread's warnings about errors it answers, at most one per client and kLogRateInterval.
  LogRateLimiter error_log{kLogRateInterval, {}, 1024};
  // Rows of metrics.jsonl or TensorBoard events that could not be written (summary.json's write_errors), and
  // checkpoints that could not be (checkpoints_failed; the last ones in a row: failed_checkpoints_in_a_row).
  int64_t write_errors = 0;
  int64_t checkpoints_failed = 0;
  int64_t failed_checkpoints_in_a_row = 0;
  bool stopped_for_checkpoints = false;  // the run asked to stop after learner.max_failed_checkpoints in a row
};

// A request to stop, from any thread (a signal watcher, Learner::Stop, the run itself).
struct StopRequest {
  std::atomic<bool> requested{false};
  std::mutex mutex;
  std::string reason;  // GUARDED_BY(mutex): the first request's reason, set before `requested`
};

// Learner::TEST_FailNextBatch and TEST_StallNextBatch (any thread).
struct TestHooks {
  std::atomic<bool> fail_next_batch{false};
  std::atomic<int64_t> stall_next_batch_ms{0};
};

// Threading: the inference thread owns everything here but what is marked otherwise. Its own fields are few;
// the collaborators (each with its contract in its header) own the rest.
struct Learner::Impl {
  explicit Impl(const FarmConfig& c)
      : config(c),
        batcher(c.batcher.max_rows, std::chrono::microseconds(c.batcher.max_wait_us),
                static_cast<std::size_t>(c.batcher.queue_capacity), [](const Work& w) { return w.rows; }),
        registry(c),
        normalizer(c, recording),
        collector(c, recording) {}

  Status Init();
  // ---- inference thread ----
  void ProcessBatch(std::vector<Work>& batch);
  void OnHello(Work& w);
  bool BuildRunFrom(const wire::Hello& h, const Handshake& hs, const std::function<void(const std::string&)>& refuse);
  void ApplyResume(const RunParts::Resumed& r, PpoTrainer& trainer);
  // A checkpoint's counters, wall time, episode window, target and policy lag into the run's figures (at the start
  // of a resumed run, so that a learner stopped before any worker joins reports them; again by ApplyResume).
  void RestoreProgress(const TrainingCounters& counters, const RunState& state);
  void OnStep(Work& w, std::vector<Work*>* steps);
  void OnTrainerDone(const TrainResult& r);
  void ConsumeOutcome(const WorkerState& ws, const wire::StepRequest& req);
  void CountEvalEpisodes(const WorkerState& ws, const wire::StepRequest& req);
  void ServeSteps(std::vector<Work*>& steps);
  // `hold`: requests are held for an update (decided once per batch, before the forward's results).
  void RecordInputs(const std::vector<Work*>& steps, bool hold);
  void Respond(std::vector<Work*>& steps, const Acting::Output& out, bool hold);
  void MaybeHandOff();
  // learner.sync_fraction: the length to cut this rank's rollout at now (0: not now).
  int64_t PreemptedLength();
  // This learner's own figures, for the ranks' agreement.
  RankLocal Local() const;
  void ReleaseParked();
  void CheckStop();
  void CheckWorkers();
  // kLost: silent for too long (summary.json workers_lost); kReplaced: the same worker process connected again
  // (workers_replaced).
  enum class Departure { kLost, kReplaced };
  void RemoveWorker(const std::string& identity, const std::string& why, Departure departure);
  void UpdateReadyHint();
  void ShowProgress(bool force);
  void NoteWriteError(const Status& s);
  // `which`: the checkpoint's file name, or "of update N" when it could not even be serialised.
  void NoteCheckpoint(const Status& s, const std::string& which);
  void Reply(const std::string& identity, const wire::Envelope& env) { reply->Send(identity, env); }
  void ReplyError(const std::string& identity, const std::string& message, const wire::StepRequest* req,
                  wire::Error::Code code = wire::Error::FATAL);
  void FailStart(const std::string& why);
  void ResolveMemoryBudgets();
  Status CheckMemoryWith(int64_t added_rows, const std::string& what);
  void FailServing(const std::string& what);
  RunState CaptureRunState();
  RunStats::Outside Outside() const;
  nlohmann::json Summary() const;
  bool trainer_busy() const { return trainer && trainer->busy(); }
  // Ranks: only rank 0 writes checkpoints; every rank must take part in one last agreement before it leaves
  // (unless the ranks already agreed to stop, or a collective failed).
  bool writes_checkpoints() const { return ranks->writes_checkpoints(); }
  bool NeedsFinalVote() const { return ranks->NeedsFinalVote(trainer != nullptr, !outcome.rank_failure.ok()); }
  // The run's env steps: with ranks, every rank's as of the last agreement plus this rank's since (checkpoints
  // count these; a resumed rank starts from its share).
  int64_t RunEnvSteps() const { return ranks->RunEnvSteps(stats.env_steps); }
  void SubmitVote();
  // What the agreement before a job decided (RankCoordinator::OnResult) applied to the outcome; whether it updated.
  bool OnAgreement(const TrainResult& r);
  // Any thread.
  void RequestStop(const std::string& reason);
  std::string RequestedStopReason();

  // Declared first, destroyed last: every socket (the router's, the reply sink's, ZAP's) closes before it.
  zmq::context_t ctx{1};
  const FarmConfig config;
  const bool recording = config.learner.train && !config.learner.random_actions;
  torch::Device device{torch::kCPU};
  Precision precision = Precision::kFp32;         // training (learner.precision)
  Precision acting_precision = Precision::kFp32;  // the acting forward (learner.acting_precision)
  std::unique_ptr<RunDir> run_dir;
  std::string endpoint;
  std::unique_ptr<ZapAuthenticator> zap;  // with transport.curve: admits the listed workers

  DynamicBatcher<Work> batcher;    // any thread
  Liveness liveness;               // any thread
  ThreadActivity inference;        // written by the inference thread, read by the I/O thread
  std::unique_ptr<RouterLoop> router;  // the I/O thread
  std::unique_ptr<ReplySink> reply;

  WorkerRegistry registry;
  RunNormalizer normalizer;
  RolloutCollector collector;
  RunStats stats;
  CriticWatch critic_watch;                // a critic stuck on one value, said once
  std::unique_ptr<Acting> acting;          // built by the first Hello
  std::unique_ptr<TrainerThread> trainer;  // likewise
  Outcome outcome;
  // Where this learner stands among the ranks (a SoleLearner alone): set once by Learner::Create.
  std::unique_ptr<RankCoordinator> ranks = MakeRankCoordinator(nullptr, nullptr);
  std::unique_ptr<EvalEpisodes> eval;  // learner.eval_episodes > 0: the evaluation's episodes
  std::optional<MemoryBudget> memory_budget;  // resolved at the first Hello (learner.memory_budget_mb)
  std::optional<MemoryBudget> gpu_budget;     // on CUDA: the device's free memory at the first Hello
  double rss_before_run_mb = 0;               // resident set at the first Hello, before the run (not estimated)
  RunMemoryInputs memory_inputs;              // the run's sizes, from the first Hello
  UpdateTrack update;
  Reporting reporting;
  StopRequest stop_request;  // any thread
  TestHooks test_hooks;      // any thread
};

}  // namespace farm
