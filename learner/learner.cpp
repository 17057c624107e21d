// The learner: wiring of its owners, the inference thread's dispatch, the
// run's outcome and shutdown.
//
// Threads and what each owns (docs/ARCHITECTURE.md draws them):
//   I/O thread      RouterLoop: the ROUTER socket, liveness, heartbeat answers
//   inference       this file's Impl and its collaborators: WorkerRegistry,
//                   RunNormalizer, RolloutCollector (the trajectory store and
//                   parked requests), Acting (the acting policy), RunStats
//   trainer         TrainerThread: the training copy, the PPO trainer, checkpoints
// They meet through the DynamicBatcher (I/O and trainer -> inference), the
// ReplySink (inference -> I/O), the TrainerThread's job channel (inference ->
// trainer) and Liveness; no lock guards model state.
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
#include <regex>
#include <thread>
#include <yaml-cpp/yaml.h>
#include <zmq.hpp>

#include "common/curve.h"
#include "common/files.h"
#include "common/log_limit.h"
#include "common/protobuf_log.h"
#include "common/tensorboard.h"
#include "common/transport.h"
#include "common/wire.h"
#include "learner/acting.h"
#include "learner/batcher.h"
#include "learner/checkpoint.h"
#include "learner/cuda_graph.h"
#include "learner/device.h"
#include "learner/liveness.h"
#include "learner/metrics.h"
#include "learner/rollout_collector.h"
#include "learner/router_loop.h"
#include "learner/run_builder.h"
#include "learner/run_dir.h"
#include "learner/run_normalizer.h"
#include "learner/run_stats.h"
#include "learner/trainer_thread.h"
#include "learner/work.h"
#include "learner/worker_registry.h"

namespace farm {
namespace {

using Clock = std::chrono::steady_clock;
using Phase = RunStats::Phase;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string ErrorText(const std::exception& e) {
  const auto* torch_error = dynamic_cast<const c10::Error*>(&e);
  return torch_error ? torch_error->what_without_backtrace() : e.what();
}

// A worker reconnecting says Hello under its first identity plus "-cN" (WorkerClient, farm_worker.py).
bool IsRejoin(const std::string& identity) {
  static const std::regex kRejoin(".*-c[0-9]+$");
  return std::regex_match(identity, kRejoin);
}

}  // namespace

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
  // An exception escaped the serving of a batch (a LibTorch or CUDA error, say): the run stops, with its final
  // checkpoint (the trainer's policy is not touched by serving), and Run returns this.
  Status serve_failure;
};

// Threading: the inference thread owns everything here but what is marked otherwise.
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
  void OnStep(Work& w, std::vector<Work*>* steps);
  void OnTrainerDone(const TrainResult& r);
  void ConsumeOutcome(const WorkerState& ws, const wire::StepRequest& req);
  void ServeSteps(std::vector<Work*>& steps);
  void Respond(std::vector<Work*>& steps, const Acting::Output& out);
  void MaybeHandOff();
  void ReleaseParked();
  void CheckStop();
  void CheckWorkers();
  void RemoveWorker(const std::string& identity, const std::string& why);
  void UpdateReadyHint();
  void ShowProgress(bool force);
  void Reply(const std::string& identity, const wire::Envelope& env) { reply->Send(identity, env); }
  void ReplyError(const std::string& identity, const std::string& message, const wire::StepRequest* req,
                  wire::Error::Code code = wire::Error::FATAL);
  void FailStart(const std::string& why);
  void FailServing(const std::string& what);
  RunState CaptureRunState();
  RunStats::Outside Outside() const;
  nlohmann::json Summary() const;
  bool trainer_busy() const { return trainer && trainer->busy(); }
  // Any thread.
  void RequestStop(const std::string& reason);
  std::string RequestedStopReason();

  // Declared first, destroyed last: every socket (the router's, the reply sink's, ZAP's) closes before it.
  zmq::context_t ctx{1};
  const FarmConfig config;
  const bool recording = config.learner.train && !config.learner.random_actions;
  torch::Device device{torch::kCPU};
  Precision precision = Precision::kFp32;
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
  std::unique_ptr<Acting> acting;          // built by the first Hello
  std::unique_ptr<TrainerThread> trainer;  // likewise
  Outcome outcome;
  int64_t handoff_env_steps = 0;  // env_steps at the last hand-off: the learning-rate schedule's progress
  Clock::time_point submitted_at;  // when the update in flight was handed over
  std::string update_path = "none";
  int64_t graphed_updates = 0;
  double start_unix = UnixNow();
  MetricsWriter metrics;
  std::unique_ptr<TensorBoardWriter> tensorboard;
  ProgressLine progress;
  Clock::time_point last_progress = Clock::now();
  Clock::time_point last_worker_check = Clock::now();
  // The inference thread's warnings about errors it answers, at most one per client and kLogRateInterval.
  LogRateLimiter error_log{kLogRateInterval, {}, 1024};

  std::atomic<bool> fail_next_batch{false};       // Learner::TEST_FailNextBatch; any thread
  std::atomic<int64_t> stall_next_batch_ms{0};    // Learner::TEST_StallNextBatch; any thread
  std::atomic<bool> stop_requested{false};   // any thread
  std::mutex stop_request_mutex;
  std::string stop_request_reason;  // GUARDED_BY(stop_request_mutex): RequestStop's reason, set before stop_requested
};

Learner::Learner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Learner::~Learner() {
  if (!impl_) return;
  impl_->batcher.Close();
  impl_->trainer.reset();  // cancels an update in flight, joins the trainer thread
  impl_->ctx.shutdown();   // the I/O thread's poll throws ETERM and it leaves
  impl_->router.reset();   // joins it
  impl_->reply.reset();
}

const std::string& Learner::endpoint() const { return impl_->endpoint; }
const std::string& Learner::run_dir() const { return impl_->run_dir->path(); }

void Learner::RequestStop(const std::string& reason) { impl_->RequestStop(reason); }

void Learner::TEST_FailNextBatch() { impl_->fail_next_batch.store(true); }
void Learner::TEST_StallNextBatch(double seconds) { impl_->stall_next_batch_ms.store(static_cast<int64_t>(seconds * 1e3)); }

void Learner::Impl::RequestStop(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(stop_request_mutex);
    if (stop_requested.load()) return;
    stop_request_reason = reason;
    stop_requested.store(true);
  }
  Work w;
  w.kind = Work::Kind::kStop;
  (void)batcher.PushFront(std::move(w));  // Closed only when already shutting down
}

std::string Learner::Impl::RequestedStopReason() {
  std::lock_guard<std::mutex> lock(stop_request_mutex);
  return stop_request_reason;
}

Status Learner::Create(const FarmConfig& config, std::unique_ptr<Learner>* out) {
  InstallProtobufLogHandler();  // before any thread parses a message
  auto impl = std::make_unique<Impl>(config);
  if (auto s = impl->Init(); !s.ok()) return s;
  std::unique_ptr<Learner> learner(new Learner(std::move(impl)));
  learner->impl_->router->Start();
  *out = std::move(learner);
  return Status::Ok();
}

Status Learner::Impl::Init() {
  if (auto s = ResolveDevice(config.learner.device, &device); !s.ok()) return s;
  if (auto s = ParsePrecision(config.learner.precision, &precision); !s.ok()) return s;
  if (auto s = CheckPrecision(precision, device); !s.ok()) return s;
  if (config.learner.cuda_graphs && !config.learner.random_actions) {
    if (!BuiltWithCuda())
      return Status::InvalidArgument("learner.cuda_graphs: this build's LibTorch has no CUDA (Debian's LibTorch is "
                                     "CPU-only); set learner.cuda_graphs to false, or build against a CUDA LibTorch");
    if (!device.is_cuda())
      return Status::InvalidArgument(fmt::format("learner.cuda_graphs: CUDA graphs need a CUDA device, but "
                                                 "learner.device '{}' resolved to {}; set learner.cuda_graphs to false",
                                                 config.learner.device, device.str()));
  }
  SetCpuThreads(config.learner.threads);  // LibTorch and OpenBLAS (learner/device.h)
  if (device.is_cuda()) {
    // fp32 matmuls may use TF32 tensor cores; convolutions pick their fastest algorithm.
    at::globalContext().setAllowTF32CuBLAS(true);
    at::globalContext().setAllowTF32CuDNN(true);
    at::globalContext().setBenchmarkCuDNN(true);
  }
  torch::manual_seed(config.seed);

  // Transport security first: a learner that may not bind leaves no run directory behind.
  if (auto s = CheckBindPolicy(config.transport); !s.ok()) return s;
  std::unique_ptr<CurveServerKeys> curve;  // null without transport.curve
  if (auto s = LoadCurveServerKeys(config.transport, &curve); !s.ok()) return s;
  if (auto s = RunDir::CheckUsable(config); !s.ok()) return s;
  if (!config.learner.init_from.empty()) {
    // Checked now rather than at the first worker's Hello (where it is matched against the env's spaces).
    ActorCritic probe{nullptr};
    FarmConfig saved;
    std::string path;
    if (auto s = LoadPolicy(config.learner.init_from, &probe, &saved, nullptr, &path); !s.ok())
      return Status::InvalidArgument("learner.init_from: " + s.message());
  }
  if (curve) {
    // The ZAP handler must be bound before the router: libzmq admits every CURVE client while none is.
    if (auto s = ZapAuthenticator::Start(ctx, curve->authorized, &zap); !s.ok()) return s;
    spdlog::info("CURVE on: worker keys authorized: {}; the learner's public key: {}", curve->authorized.size(),
                 curve->own.public_key);
  } else if (!IsLoopbackEndpoint(config.transport.bind)) {
    spdlog::warn("transport.insecure: {} admits any worker, unencrypted", config.transport.bind);
  }
  // Bound before the run directory is touched: a learner that cannot bind (the port in use) leaves nothing behind.
  zmq::socket_t socket;
  try {
    socket = MakeRouter(ctx, config.transport, &endpoint, curve ? &curve->own : nullptr);
  } catch (const zmq::error_t& e) {
    return Status::IoError(fmt::format("transport.bind: cannot bind {}: {}", config.transport.bind, e.what()));
  }
  if (auto s = RunDir::Open(config, &run_dir); !s.ok()) return s;
  if (auto s = metrics.Open(run_dir->file("metrics.jsonl")); !s.ok()) return s;
  if (auto s = TensorBoardWriter::Open(run_dir->file("tb"), &tensorboard); !s.ok()) return s;
  if (auto s = RouterLoop::Create(ctx, std::move(socket), config, &batcher, &liveness, &inference,
                                  [this](const std::string& why) { RequestStop(why); }, &router);
      !s.ok())
    return s;
  reply = router->MakeReplySink();
  return WriteFileAtomic(run_dir->file("learner.endpoint"), endpoint + "\n");
}

// ---------------------------------------------------------------- replies and failures

void Learner::Impl::ReplyError(const std::string& identity, const std::string& message,
                               const wire::StepRequest* req, wire::Error::Code code) {
  ++stats.errors;
  if (const auto d = error_log.Allow("error " + identity); d.log)
    spdlog::warn("{}: {}{}", identity, message, LogRateLimiter::Suffix(d));
  wire::Envelope e;
  e.mutable_error()->set_message(message);
  e.mutable_error()->set_code(code);
  if (req) {
    e.mutable_error()->set_seq(req->seq());
    e.mutable_error()->set_group(req->group());
  }
  Reply(identity, e);
}

void Learner::Impl::FailStart(const std::string& why) {
  outcome.stopping = true;
  outcome.stop_reason = why;
  if (outcome.start_failure.ok()) outcome.start_failure = Status::InvalidArgument(why);
}

void Learner::Impl::FailServing(const std::string& what) {
  if (!collector.has_store()) {
    // Still setting up from the first Hello (building the policy, resuming): as any failure to start, it leaves the
    // run directory as it was, with no checkpoint of a policy that may be half loaded.
    FailStart("internal error while starting: " + what);
    return;
  }
  spdlog::error("learner: {} while serving a batch; stopping", what);
  if (outcome.serve_failure.ok()) outcome.serve_failure = Status::Internal(what + " (while serving a batch)");
  if (!outcome.stopping || outcome.stop_reason.empty()) outcome.stop_reason = "internal error: " + what;
  outcome.stopping = true;
}

// ---------------------------------------------------------------- Hellos

void Learner::Impl::OnHello(Work& w) {
  PhaseTimer timer(stats, Phase::kAdmit);
  const wire::Hello& h = w.msg.hello();
  wire::Envelope reply_msg;
  auto* welcome = reply_msg.mutable_welcome();
  auto refuse = [&](const std::string& why) {
    ++stats.errors;
    if (const auto d = error_log.Allow("refused " + w.identity); d.log)
      spdlog::warn("refused {}: {}{}", w.identity, why, LogRateLimiter::Suffix(d));
    welcome->set_accepted(false);
    welcome->set_error(why);
    Reply(w.identity, reply_msg);
  };
  Handshake hs;
  if (auto s = registry.CheckHello(w.identity, h, normalizer.options(), &hs); !s.ok()) return refuse(s.message());
  if (outcome.stopping) return refuse("the learner is stopping");
  if (!registry.has_run()) {
    ActivityScope busy(inference, "building the run from the first Hello (policy, CUDA graphs, warm-up, resume)");
    if (!BuildRunFrom(h, hs, refuse)) return;
  }
  std::vector<int> groups;
  for (uint32_t g = 0; g < hs.num_groups; ++g) groups.push_back(collector.store().AddGroup(static_cast<int>(hs.group_rows)));
  registry.Add(w.identity, hs, std::move(groups));
  liveness.Admit(w.identity, Clock::now());
  ++stats.workers_joined;
  if (IsRejoin(w.identity)) ++stats.rejoins;
  stats.last_join_seconds = stats.ProcessWall();
  welcome->set_accepted(true);
  welcome->set_policy_version(static_cast<uint64_t>(stats.version));
  welcome->set_heartbeat_interval_s(config.transport.heartbeat_interval_s);
  welcome->set_heartbeat_timeout_s(config.transport.heartbeat_timeout_s);
  if (normalizer.any()) normalizer.Fill(welcome->mutable_normalizer());  // a rejoin, a resume, a served policy
  Reply(w.identity, reply_msg);
  spdlog::info("worker {} joined: {} envs in {} groups ({} workers, {} agent rows)", w.identity, h.num_envs(),
               h.num_groups(), registry.size(), collector.store().num_rows());
  if (static_cast<int>(registry.size()) == config.learner.min_workers) ReleaseParked();
}

bool Learner::Impl::BuildRunFrom(const wire::Hello& h, const Handshake& hs,
                                 const std::function<void(const std::string&)>& refuse) {
  RunParts parts;
  bool fatal = false;
  if (auto s = BuildRun(config, device, precision, h, hs, &normalizer, &parts, &fatal); !s.ok()) {
    if (fatal) FailStart(s.message());
    refuse(config.learner.resume && fatal && s.message().rfind("resume failed: ", 0) == 0
               ? "the learner could not resume: " + s.message().substr(15)
               : s.message());
    return false;
  }
  const RunSpec spec = parts.spec;
  const bool use_state = parts.options.global_state.has_value();
  acting = std::make_unique<Acting>(config, device, precision, spec.observation, spec.action, parts.options.global_state,
                                    spec.num_agents, parts.acting, std::move(parts.graphed), recording);
  acting->WarmUp();
  if (parts.resumed) ApplyResume(*parts.resumed, *parts.trainer);
  if (auto s = WriteFileAtomic(run_dir->file("policy_spec.json"),
                               PolicySpecJson(spec.observation, spec.action, parts.hidden, parts.options));
      !s.ok())
    spdlog::error("{}", s.message());  // eval/export will say the file is missing; training goes on
  collector.CreateStore(spec.observation.numel(), spec.action, use_state ? parts.options.global_state->numel() : 0,
                        static_cast<int>(spec.num_agents));
  trainer = std::make_unique<TrainerThread>(config, device, run_dir->checkpoints(), parts.training,
                                            std::move(parts.trainer), [this](std::shared_ptr<TrainResult> r) {
                                              Work done;
                                              done.kind = Work::Kind::kTrainerDone;
                                              done.result = std::move(r);
                                              (void)batcher.PushFront(std::move(done));  // closed: shutting down
                                            });
  update_path = trainer->update_path();
  registry.SetRun(spec);
  stats.set_num_agents(spec.num_agents);
  spdlog::info("env {}: observation {}, action {}, {} agent(s) per env, global state {}; policy on {} (encoder {}, "
               "critic on {})",
               spec.env_name, spec.observation.ToString(), spec.action.ToString(), spec.num_agents,
               spec.global_state ? spec.global_state->ToString() : std::string("none"), device.str(),
               EncoderName(parts.options.encoder), use_state ? "the global state" : "the observation");
  return true;
}

// Continues run_dir from the checkpoint BuildRun loaded: counters (env steps, updates, policy version, episodes,
// wall time) and run state (random generators, episode window, when the target was reached, the normaliser).
// What an older checkpoint lacks starts afresh, with a warning.
void Learner::Impl::ApplyResume(const RunParts::Resumed& r, PpoTrainer& ppo) {
  const TrainingCounters& c = r.counters;
  const RunState& state = r.state;
  stats.env_steps = c.env_steps;
  handoff_env_steps = c.env_steps;  // the schedule goes on from here
  stats.updates = c.updates;
  stats.version = c.policy_version;
  stats.set_wall_offset(c.wall_seconds);
  stats.window.Restore(state.episode_returns, state.episode_lengths, c.episodes);
  stats.solved_at_steps = state.solved_at_steps;
  stats.solved_at_seconds = state.solved_at_seconds;
  stats.solved_at_unix = state.solved_at_unix;
  normalizer.Restore(state, r.path);
  std::vector<std::string> missing = state.missing;
  auto restore = [&](const char* name, torch::Generator generator) {
    const auto it = state.rng.find(name);
    if (it == state.rng.end()) {
      if (!state.missing.empty() && state.missing.front().rfind("rng", 0) == 0) return;  // all of rng is missing
      missing.push_back(fmt::format("rng.{}", name));
      return;
    }
    if (auto s = SetGeneratorState(generator, it->second, name); !s.ok())
      spdlog::warn("resume: {}; it continues from the seed instead", s.message());
  };
  restore(kRngTrainer, ppo.generator());
  restore(kRngRandomActions, acting->random_generator());
  restore(kRngTorchCpu, at::detail::getDefaultCPUGenerator());
#ifdef FARM_WITH_CUDA
  if (device.is_cuda()) restore(kRngTorchCuda, at::globalContext().defaultGenerator(device));
#endif
  if (!missing.empty())
    spdlog::warn("resume: {} has no {} (written by an older version): {}", r.path, fmt::join(missing, ", "),
                 "those start afresh (generators from the seed, an empty window)");
  if (!state.config_yaml.empty()) {
    try {
      const auto changes = ConfigChanges(state.config_yaml, DumpConfig(config));
      if (!changes.empty())
        spdlog::info("resume: config keys changed since the checkpoint: {}", fmt::join(changes, "; "));
    } catch (const YAML::Exception& e) {
      spdlog::warn("resume: {}: the stored config is not valid YAML ({}); not compared", r.path, e.what());
    }
  }
  spdlog::info("resumed {}: {} env steps, {} updates, policy version {}, {} episodes (window of {}, mean return "
               "{}), {:.1f} s of wall time before",
               r.path, stats.env_steps, stats.updates, stats.version, stats.window.total_episodes(),
               stats.window.count(),
               stats.window.empty() ? std::string("-") : fmt::format("{:.2f}", stats.window.mean_return()),
               c.wall_seconds);
  // Only now that the checkpoint has loaded: the run's config with this session's overrides.
  if (auto s = run_dir->WriteConfig(config); !s.ok()) spdlog::error("{}", s.message());
}

// Everything but weights, optimizer and counters that a checkpoint needs to continue exactly (the trainer adds
// its generator's state).
RunState Learner::Impl::CaptureRunState() {
  RunState s;
  s.rng[kRngRandomActions] = GeneratorState(acting->random_generator());
  torch::Generator cpu = at::detail::getDefaultCPUGenerator();
  s.rng[kRngTorchCpu] = GeneratorState(cpu);
#ifdef FARM_WITH_CUDA
  if (device.is_cuda()) {
    torch::Generator cuda = at::globalContext().defaultGenerator(device);
    s.rng[kRngTorchCuda] = GeneratorState(cuda);
  }
#endif
  s.has_episode_window = true;
  s.episode_returns = stats.window.returns();
  s.episode_lengths = stats.window.lengths();
  s.solved_at_steps = stats.solved_at_steps;
  s.solved_at_seconds = stats.solved_at_seconds;
  s.solved_at_unix = stats.solved_at_unix;
  s.config_yaml = DumpConfig(config);
  normalizer.Capture(&s);
  return s;
}

// ---------------------------------------------------------------- requests

void Learner::Impl::OnStep(Work& w, std::vector<Work*>* steps) {
  PhaseTimer timer(stats, Phase::kAdmit);
  WorkerState* ws = registry.Find(w.identity);
  if (ws == nullptr) {
    ReplyError(w.identity, "StepRequest from a worker that never said hello (or was dropped as silent)",
               &w.msg.step(), wire::Error::UNKNOWN_WORKER);
    return;
  }
  const auto& req = w.msg.step();
  if (auto s = registry.CheckStep(*ws, req); !s.ok()) return ReplyError(w.identity, s.message(), &req);
  if (req.has_stats_delta())
    if (auto s = normalizer.Merge(req.stats_delta()); !s.ok()) return ReplyError(w.identity, s.message(), &req);
  int64_t sanitized = 0;
  if (auto s = registry.AdmitNonFinite(*ws, w.msg.mutable_step(), &sanitized); !s.ok()) {
    ++stats.non_finite_rejected;
    return ReplyError(w.identity, s.message(), &req);
  }
  stats.non_finite_sanitized += sanitized;
  WorkerRegistry::Accept(*ws, req);
  if (!req.first()) ConsumeOutcome(*ws, req);
  steps->push_back(&w);
}

void Learner::Impl::ConsumeOutcome(const WorkerState& ws, const wire::StepRequest& req) {
  if (recording)
    collector.store().RecordOutcome(ws.store_group[req.group()],
                                    reinterpret_cast<const float*>(req.reward().data().data()),
                                    reinterpret_cast<const uint8_t*>(req.terminated().data()),
                                    reinterpret_cast<const uint8_t*>(req.truncated().data()));
  // Env steps, not agent rows: what users compare (agent_steps = env_steps x agents).
  stats.CountSteps(ws.group_envs);
  for (const auto& ep : req.episodes()) stats.window.Add(ep.episode_return(), ep.length());
  if (!stats.solved_at_steps && config.target_return && stats.window.full() &&
      stats.window.mean_return() >= *config.target_return) {
    stats.solved_at_steps = stats.env_steps;
    stats.solved_at_seconds = stats.Wall();
    stats.solved_at_unix = UnixNow();
    spdlog::info("target {} reached: mean return {:.1f} over 100 episodes at {} steps, {:.1f} s",
                 *config.target_return, stats.window.mean_return(), stats.env_steps, *stats.solved_at_seconds);
  }
}

// One forward pass over every request's observations (and the final observations of truncated envs), then
// record, park or reply.
void Learner::Impl::ServeSteps(std::vector<Work*>& steps) {
  const int64_t rows = Acting::Rows(steps);
  Acting::Output out;
  {
    PhaseTimer timer(stats, Phase::kGather);
    ActivityScope busy(inference, "gathering the batch");
    acting->Gather(steps, rows);
  }
  {
    PhaseTimer timer(stats, Phase::kForward);
    ActivityScope busy(inference, "the forward pass");
    out = acting->Act(rows);
  }
  ++stats.batches;
  stats.batch_rows += rows;
  PhaseTimer timer(stats, Phase::kServe);
  ActivityScope busy(inference, "recording steps and replying");
  Respond(steps, out);
}

void Learner::Impl::Respond(std::vector<Work*>& steps, const Acting::Output& out) {
  const Space& action = registry.run().action;
  const int64_t action_numel = action.numel();
  const std::size_t action_bytes = action.is_categorical() ? sizeof(int64_t) : sizeof(float);
  const auto* act_ptr = static_cast<const uint8_t*>(out.action.data_ptr());
  const float* logp_ptr = out.logp.data_ptr<float>();
  const float* value_ptr = out.value.data_ptr<float>();
  const bool hold = collector.Hold(trainer_busy(), registry.size(), outcome.stopping);
  TrajectoryStore* store = collector.has_store() ? &collector.store() : nullptr;

  int64_t row = 0;
  int64_t final_row = 0;
  for (const Work* w : steps) final_row += w->rows;
  wire::Envelope reply_msg;
  for (Work* w : steps) {
    const int64_t rows = w->rows;
    WorkerState& ws = *registry.Find(w->identity);  // steps come from admitted workers only
    const auto& req = w->msg.step();
    const int g = ws.store_group[req.group()];
    // Truncated envs: add gamma * V(final obs) (V(final global state) for a centralised critic) to the reward of
    // their last step.
    for (int32_t i : req.final_obs_index()) {
      if (recording && config.ppo.bootstrap_truncated && w->kind == Work::Kind::kStep)
        store->AddReward(g, i, static_cast<float>(config.ppo.gamma) * value_ptr[final_row]);
      ++final_row;
    }
    if (recording && store->full(g)) {
      store->SetBootstrap(g, value_ptr + row);
      collector.Park(std::move(*w));
    } else if (hold) {
      collector.Park(std::move(*w));
    } else {
      if (recording)
        store->RecordStep(g, reinterpret_cast<const float*>(req.obs().data().data()),
                          act_ptr + row * action_numel * static_cast<int64_t>(action_bytes), logp_ptr + row,
                          value_ptr + row, stats.version,
                          req.has_global_state() ? reinterpret_cast<const float*>(req.global_state().data().data())
                                                 : nullptr);
      WorkerRegistry::MarkActed(ws, req.group());
      auto* a = reply_msg.mutable_action();
      acting->EncodeReply(req, out, row, rows, stats.version, a);
      // A request that brought a statistics delta gets the merged statistics back (about once per rollout).
      if (req.has_stats_delta() && normalizer.any()) {
        normalizer.Fill(a->mutable_normalizer());
      } else {
        a->clear_normalizer();
      }
      Reply(w->identity, reply_msg);
    }
    row += rows;
  }
}

// ---------------------------------------------------------------- the batch loop

void Learner::Impl::ProcessBatch(std::vector<Work>& batch) {
  std::vector<Work*> steps;
  steps.reserve(batch.size());
  for (Work& w : batch) {
    switch (w.kind) {
      case Work::Kind::kHello:
        OnHello(w);
        break;
      case Work::Kind::kStop:
        if (!outcome.stopping) {
          outcome.stopping = true;
          outcome.stop_reason = RequestedStopReason();
        }
        break;
      case Work::Kind::kTrainerDone:
        OnTrainerDone(*w.result);
        break;
      case Work::Kind::kHeartbeat: {
        // The I/O thread answers admitted workers' heartbeats itself; this one's worker was not admitted when it
        // arrived (it may have been since, in this batch).
        PhaseTimer timer(stats, Phase::kAdmit);
        if (!registry.Find(w.identity)) {
          ReplyError(w.identity, "Heartbeat from a worker that never said hello (or was dropped as silent)", nullptr,
                     wire::Error::UNKNOWN_WORKER);
          break;
        }
        wire::Envelope beat;
        beat.mutable_heartbeat();
        Reply(w.identity, beat);
        break;
      }
      case Work::Kind::kStep:
        OnStep(w, &steps);
        break;
      case Work::Kind::kReplay:
        if (registry.Find(w.identity)) steps.push_back(&w);  // else its worker was dropped meanwhile
        break;
    }
  }
  if (!steps.empty()) ServeSteps(steps);
  {
    PhaseTimer timer(stats, Phase::kHandoff);
    MaybeHandOff();
  }
  CheckStop();
  PhaseTimer timer(stats, Phase::kReport);
  UpdateReadyHint();
  ShowProgress(false);
}

void Learner::Impl::MaybeHandOff() {
  if (!collector.CanHandOff(trainer_busy(), outcome.stopping)) return;
  ActivityScope busy(inference, "taking a rollout for the trainer");
  const RunSpec& spec = registry.run();
  TrainJob job;
  LagStats lag;
  const std::vector<int64_t> state_shape =
      spec.global_state && acting->policy()->has_global_state() ? spec.global_state->shape : std::vector<int64_t>{};
  job.rollout = collector.store().Take(spec.observation.shape, stats.version, &lag, state_shape);
  if (state_shape.empty()) {
    job.rollout.states = torch::Tensor();  // a critic on the observation (init_from) trains without states
    job.rollout.rows_per_state = 1;        // units of one row: minibatches need not keep an env's agents
  }
  stats.last_lag = lag;
  // The schedule's progress when this rollout began (CleanRL: frac = 1 - (update - 1) / updates): the first update
  // runs at the full learning rate and the last one at lr / updates, not at 0.
  job.progress = std::min(1.0, static_cast<double>(handoff_env_steps) / static_cast<double>(config.total_env_steps));
  handoff_env_steps = stats.env_steps;
  job.version = stats.version;
  job.checkpoint =
      config.learner.checkpoint_every > 0 && (stats.updates + 1) % config.learner.checkpoint_every == 0;
  job.counters =
      TrainingCounters{stats.env_steps, stats.updates + 1, stats.version + 1, stats.window.total_episodes(), stats.Wall()};
  if (job.checkpoint) job.state = CaptureRunState();
  submitted_at = Clock::now();
  trainer->Submit(std::move(job));
  // async: keep acting with the current snapshot while the trainer works.
  if (config.mode == "async") ReleaseParked();
}

void Learner::Impl::ReleaseParked() {
  std::vector<Work> parked = collector.TakeParked();
  for (auto it = parked.rbegin(); it != parked.rend(); ++it)
    if (!batcher.PushFront(std::move(*it)).ok()) break;
}

void Learner::Impl::OnTrainerDone(const TrainResult& r) {
  trainer->Done();
  ++stats.updates;
  stats.update_seconds_total += r.update_seconds;
  stats.last_update_seconds = r.update_seconds;
  stats.last_ppo = r.stats;
  update_path = r.update_path;
  graphed_updates = r.graphed_updates;
  {
    PhaseTimer timer(stats, Phase::kHandoff);
    ActivityScope busy(inference, "copying the new weights into the acting policy");
    trainer->CopyWeightsTo(*acting->policy());
  }
  stats.version = r.version;
  if (r.cancelled)
    spdlog::info("update {} cut short by the stop ({} epoch(s) begun of {})", stats.updates, r.stats.epochs,
                 config.ppo.update_epochs);
  {
    PhaseTimer timer(stats, Phase::kReport);
    ActivityScope busy(inference, "writing metrics");
    const RunStats::Outside o = Outside();
    metrics.Write(stats.MetricsRow(o));
    tensorboard->AddScalars(stats.TensorBoardScalars(o), stats.env_steps, UnixNow());
  }
  if (r.failed) {
    outcome.stopping = true;
    outcome.update_failed = true;
    outcome.stop_reason = "the PPO update failed (non-finite loss or parameters)";
  }
  PhaseTimer timer(stats, Phase::kHandoff);
  // Requests held for this update (sync), or a full rollout waiting for the trainer (async).
  if (collector.store().all_full()) {
    MaybeHandOff();
  } else if (config.mode == "sync") {
    ReleaseParked();
  }
}

void Learner::Impl::CheckStop() {
  if (outcome.stopping) return;
  if (stats.env_steps >= config.total_env_steps) {
    outcome.stopping = true;
    outcome.stop_reason = fmt::format("reached total_env_steps ({})", config.total_env_steps);
  } else if (config.stop_at_target && stats.solved_at_steps) {
    outcome.stopping = true;
    outcome.stop_reason = fmt::format("reached target_return ({})", *config.target_return);
  } else if (config.max_wall_seconds > 0 && stats.ProcessWall() >= config.max_wall_seconds) {
    outcome.stopping = true;
    outcome.stop_reason = fmt::format("reached max_wall_seconds ({})", config.max_wall_seconds);
  } else if (stop_requested.load()) {
    // Seen before the kStop item that RequestStop queued (a busy learner checks after every batch).
    outcome.stopping = true;
    outcome.stop_reason = RequestedStopReason();
  }
}

// Drops workers the I/O thread has not heard from for longer than transport.heartbeat_timeout_s.
void Learner::Impl::CheckWorkers() {
  const auto now = Clock::now();
  if (Seconds(now - last_worker_check) < 0.5 * config.transport.heartbeat_interval_s) return;
  last_worker_check = now;
  PhaseTimer timer(stats, Phase::kReport);
  for (const auto& id : liveness.SilentFor(config.transport.heartbeat_timeout_s, now))
    RemoveWorker(id, fmt::format("silent for more than {} s (transport.heartbeat_timeout_s: no message of it reached "
                                 "the learner)",
                                 config.transport.heartbeat_timeout_s));
}

// Forgets a worker: its partial trajectories leave the rollout, its held requests are dropped, and the others go
// on (the rollout may now be full).
void Learner::Impl::RemoveWorker(const std::string& identity, const std::string& why) {
  liveness.Forget(identity);
  const std::optional<WorkerState> ws = registry.Remove(identity);
  if (!ws) return;
  for (int g : ws->store_group) collector.store().RemoveGroup(g);
  collector.DropParked(identity);
  ++stats.workers_lost;
  spdlog::warn("dropped worker {}: {}; {} workers left", identity, why, registry.size());
  MaybeHandOff();
  UpdateReadyHint();
}

void Learner::Impl::UpdateReadyHint() {
  // Every group not parked may be waiting in the queue: once all of them are, nobody else can arrive, so the
  // batch goes at once.
  const int active = registry.total_groups() - static_cast<int>(collector.parked());
  batcher.SetReadyItems(static_cast<std::size_t>(std::max(active, 1)));
}

RunStats::Outside Learner::Impl::Outside() const {
  RunStats::Outside o;
  o.workers_active = static_cast<int64_t>(registry.size());
  o.store_bytes = collector.has_store() ? collector.store().bytes() : 0;
  const RouterCounters& c = router->counters();
  o.io_errors = c.io_errors.load();
  o.connections_closed = c.connections_closed.load();
  o.replies_dropped = c.replies_dropped.load();
  o.heartbeats_answered = c.heartbeats_answered.load();
  o.auth_refused = zap ? zap->refused() : 0;
  o.trainer_busy_seconds = stats.update_seconds_total + (trainer_busy() ? Seconds(Clock::now() - submitted_at) : 0.0);
  return o;
}

void Learner::Impl::ShowProgress(bool force) {
  const auto now = Clock::now();
  if (!force && Seconds(now - last_progress) < config.learner.progress_interval_s) return;
  progress.Show(stats.StatusLine(Outside(), now));
  last_progress = now;
}

nlohmann::json Learner::Impl::Summary() const {
  nlohmann::json s = stats.SummaryCounters(Outside());
  s["env"] = registry.has_run() ? registry.run().env_name : std::string();
  s["mode"] = config.mode;
  s["target_return"] = config.target_return ? nlohmann::json(*config.target_return) : nlohmann::json(nullptr);
  // The update's implementation: fused (CPU), graphed (CUDA graphs; its first update is LibTorch's) or libtorch.
  s["update_path"] = update_path;
  s["graphed_updates"] = graphed_updates;
  const int64_t agents = registry.has_run() ? registry.run().num_agents : 1;
  s["num_envs"] = collector.has_store() ? collector.store().num_rows() / agents : 0;
  s["stop_reason"] = outcome.stop_reason;
  s["device"] = device.str();
  s["precision"] = config.learner.precision;
  s["torch_version"] = TORCH_VERSION;
  s["start_unix"] = start_unix;
  return s;
}

Status Learner::Run(nlohmann::json* summary) {
  Impl& m = *impl_;
  m.stats.Start(Clock::now(), 0);
  m.start_unix = UnixNow();
  spdlog::info("learner listening on {}; run directory {}", m.endpoint, m.run_dir->path());
  std::vector<Work> batch;
  bool cancelled = false;
  while (true) {
    const auto t0 = Clock::now();
    const bool during_update = m.trainer_busy();
    const auto idle = std::chrono::milliseconds(
        std::max<int64_t>(1, static_cast<int64_t>(500 * m.config.transport.heartbeat_interval_s)));
    if (!m.batcher.NextBatch(&batch, idle).ok()) break;
    // Waiting while the trainer runs is the update's cost (sync mode), not a lack of data.
    m.stats.Add(during_update ? Phase::kHeld : Phase::kWait, Seconds(Clock::now() - t0));
    if (!m.outcome.serve_failure.ok()) {
      // Serving failed: nothing more is served (it would likely fail again); only the update in flight is awaited.
      batch.erase(std::remove_if(batch.begin(), batch.end(),
                                 [](const Work& w) { return w.kind != Work::Kind::kTrainerDone; }),
                  batch.end());
    }
    m.inference.Begin("a batch of requests");
    try {
      if (!batch.empty() && m.fail_next_batch.load() && m.fail_next_batch.exchange(false))
        throw std::runtime_error("injected fault (TEST_FailNextBatch)");
      if (!batch.empty() && m.stall_next_batch_ms.load() > 0) {
        ActivityScope busy(m.inference, "an injected stall (TEST_StallNextBatch)");
        std::this_thread::sleep_for(std::chrono::milliseconds(m.stall_next_batch_ms.exchange(0)));
      }
      m.CheckWorkers();
      m.ProcessBatch(batch);
    } catch (const std::exception& e) {
      m.FailServing(ErrorText(e));
    }
    m.inference.End();
    if (m.outcome.stopping && !m.trainer_busy()) break;
    // Stopping with an update in flight: it is cut short after its current minibatch step, so that the final
    // checkpoint and summary come within the launcher's grace period however long updates are.
    if (m.outcome.stopping && !cancelled) {
      m.trainer->Cancel();
      cancelled = true;
    }
  }
  m.progress.Finish();
  spdlog::info("stopping: {}", m.outcome.stop_reason);
  // Nothing more is served: the I/O thread drops what arrives, and the batcher takes nothing more.
  m.router->SetShuttingDown();
  m.batcher.Close();

  // Final checkpoint, unless the run never started or its last update diverged; then tell every worker to stop.
  // (Updates check their parameters only when they checkpoint: the last one is checked here.)
  m.inference.Begin("the final checkpoint");
  try {  // after a LibTorch or CUDA error these may throw too: the workers must still hear Stop
    Outcome& o = m.outcome;
    if (!o.update_failed && m.trainer && o.start_failure.ok() && !m.trainer->ParametersFinite()) {
      o.update_failed = true;
      o.stop_reason = "the PPO update failed (non-finite parameters)";
    }
    if (o.update_failed) {
      spdlog::error("no final checkpoint: the last update diverged; the newest checkpoint is the last good one");
    } else if (m.trainer && o.start_failure.ok()) {
      const TrainingCounters c{m.stats.env_steps, m.stats.updates, m.stats.version, m.stats.window.total_episodes(),
                               m.stats.Wall()};
      std::string path;
      if (auto s = m.trainer->FinalCheckpoint(c, m.CaptureRunState(), &path); !s.ok())
        spdlog::error("final checkpoint: {}", s.message());
      else
        spdlog::info("checkpoint written: {}", path);
    }
  } catch (const std::exception& e) {
    spdlog::error("no final checkpoint: {}", ErrorText(e));
  }
  m.inference.End();
  const nlohmann::json s = m.Summary();
  wire::Envelope stop;
  stop.mutable_stop()->set_reason(m.outcome.stop_reason);
  for (const auto& [identity, ws] : m.registry.workers()) m.Reply(identity, stop);
  m.reply->Quit();   // the I/O thread sends what came before, then finishes
  m.router.reset();  // joins it
  if (!m.outcome.start_failure.ok()) return m.outcome.start_failure;  // the run directory stays as it was

  if (auto st = WriteFileAtomic(m.run_dir->file("summary.json"), s.dump(2) + "\n"); !st.ok()) return st;
  if (summary) *summary = s;
  if (m.outcome.update_failed)
    return Status::InvalidArgument(m.outcome.stop_reason + " (see metrics.jsonl; lower ppo.lr?)");
  return m.outcome.serve_failure;
}

}  // namespace farm
