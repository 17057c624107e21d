// The learner: wiring of its owners, the inference thread's dispatch, the
// run's outcome and shutdown.
//
// Threads and what each owns (docs/ARCHITECTURE.md draws them):
//   I/O thread      RouterLoop: the ROUTER socket, liveness, heartbeat answers
//   inference       this file's Impl and its collaborators: WorkerRegistry,
//                   RunNormalizer, RolloutCollector (the trajectory store and
//                   parked requests), Acting (the acting policy), RunStats
//   trainer         TrainerThread: the training copy, the PPO trainer, the
//                   periodic checkpoints' serialisation (the final one is
//                   serialised here, on the inference thread, while it is idle)
//   writer          CheckpointWriter (owned by TrainerThread): checkpoint files
// They meet through the DynamicBatcher (I/O, trainer and writer -> inference),
// the ReplySink (inference -> I/O), the TrainerThread's job channel (inference
// -> trainer), the writer's slot and outcomes, and Liveness; no lock guards
// model state.
#include "learner/learner_impl.h"
#include "common/config_files.h"
#include "learner/model/blas_kernel.h"

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>

namespace farm {
using namespace learner_internal;
namespace {

// How long a resumed learner tries to bind its previous learner's port while something else holds it.
constexpr std::chrono::seconds kRebindPatience{3};

// For a resumed run whose transport.bind is tcp://HOST:* (the port left to the system, as by default): that bind
// with the port its previous learner listened on (run_dir/learner.endpoint). Empty when the bind names a port, or
// the run has no such file.
std::string PreviousLearnerBind(const FarmConfig& config) {
  const std::string& bind = config.transport.bind;
  if (bind.rfind("tcp://", 0) != 0 || bind.size() < 2 || bind.compare(bind.size() - 2, 2, ":*") != 0) return "";
  std::ifstream in(config.run_dir + "/learner.endpoint");
  std::string previous;
  // A tcp:// endpoint that can be connected to has a port from 1 to 65535 (CheckEndpoint's rule for workers).
  if (!(in >> previous) || previous.rfind("tcp://", 0) != 0 || !CheckEndpoint(previous, /*bind=*/false).ok()) return "";
  return bind.substr(0, bind.size() - 1) + previous.substr(previous.rfind(':') + 1);
}

// torchrun's or Slurm's environment (learner/train/rank_group.h): with more than one rank, the rendezvous, and this
// rank's device (cuda:LOCAL_RANK for a CUDA learner.device without an index), port (a fixed transport.bind port
// plus LOCAL_RANK) and run directory (rank 0's; the other ranks write their logs under its ranks/rankR).
Status JoinRanks(FarmConfig* config, std::shared_ptr<RankGroup>* out,
                 std::unique_ptr<RolloutPreemption>* preemption) {
  RankPlace place;
  if (auto s = ReadRankPlace(&place); !s.ok()) return Status::InvalidArgument("learner ranks: " + s.message());
  if (place.world_size <= 1) return Status::Ok();
  torch::Device device{torch::kCPU};
  if (auto s = ResolveDevice(config->learner.device, &device); !s.ok()) return s;
  if (device.is_cuda() && config->learner.device.find(':') == std::string::npos) {
    // One device per local rank; fewer devices than ranks (Slurm's --gpus-per-task shows each task its own one
    // as cuda:0; ranks sharing a GPU) wrap around.
    const auto devices = static_cast<int>(std::max<size_t>(1, torch::cuda::device_count()));
    device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(place.local_rank % devices));
    config->learner.device = device.str();
  }
  const std::string& bind = config->transport.bind;
  const size_t colon = bind.rfind(':');
  if (colon != std::string::npos && bind.find_first_not_of("0123456789", colon + 1) == std::string::npos &&
      colon + 1 < bind.size())
    config->transport.bind = bind.substr(0, colon + 1) + std::to_string(std::stoi(bind.substr(colon + 1)) + place.local_rank);
  RankGroupOptions options;
  options.backend = config->learner.dist_backend;
  options.timeout_s = config->learner.collective_timeout_s;
  options.device = device;
  spdlog::info("rank {} of {} ({}'s environment): rendezvous at {}:{}, device {}", place.rank, place.world_size,
               place.source, place.master_addr, place.master_port, device.str());
  std::unique_ptr<RankGroup> group;
  if (auto s = RankGroup::Create(place, options, &group); !s.ok()) return s;
  spdlog::info("rank {} of {}: every rank joined; collectives over {}", place.rank, place.world_size, group->backend());
  if (config->learner.sync_fraction > 0) {
    if (auto s = RolloutPreemption::Create(place, config->learner.sync_fraction, config->learner.collective_timeout_s,
                                           preemption);
        !s.ok())
      return s;
    spdlog::info("rank {}: once {} of {} ranks have a full rollout the others end theirs (learner.sync_fraction {})",
                 place.rank, (*preemption)->needed(), place.world_size, config->learner.sync_fraction);
  }
  std::shared_ptr<RankGroup> shared(std::move(group));
  if (place.rank > 0) {
    std::string root;
    try {
      root = shared->ShareFromRankZero("run_dir", "");
    } catch (const RankError& e) {
      return Status::IoError(std::string("waiting for rank 0's run directory: ") + e.what());
    }
    if (root.empty()) return Status::InvalidArgument("rank 0 could not start (its log says why); neither can this rank");
    // Rank 0's checkpoints are the run's: --resume loads them on every rank.
    config->resume_checkpoints = root + "/checkpoints";
    config->run_dir = root + "/ranks/rank" + std::to_string(place.rank);
  }
  *out = std::move(shared);
  return Status::Ok();
}

}  // namespace

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
int Learner::rank() const { return impl_->ranks->rank(); }

void Learner::RequestStop(const std::string& reason) { impl_->RequestStop(reason); }

void Learner::TEST_FailNextBatch() { impl_->test_hooks.fail_next_batch.store(true); }
void Learner::TEST_StallNextBatch(double seconds) { impl_->test_hooks.stall_next_batch_ms.store(static_cast<int64_t>(seconds * 1e3)); }

void Learner::Impl::RequestStop(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(stop_request.mutex);
    if (stop_request.requested.load()) return;
    stop_request.reason = reason;
    stop_request.requested.store(true);
  }
  Work w;
  w.kind = Work::Kind::kStop;
  (void)batcher.PushFront(std::move(w));  // Closed only when already shutting down
}

std::string Learner::Impl::RequestedStopReason() {
  std::lock_guard<std::mutex> lock(stop_request.mutex);
  return stop_request.reason;
}

Status Learner::Create(const FarmConfig& config, std::unique_ptr<Learner>* out) {
  InstallProtobufLogHandler();  // before any thread parses a message
  // The files the config names, found (beside the config, or where a run directory recorded them) and made
  // absolute: this run's config.yaml records where each was found (common/config_files.h).
  FarmConfig resolved = config;
  if (auto s = ResolveLearnerFiles(&resolved, kActorEncoderScriptFile, kCriticEncoderScriptFile); !s.ok()) return s;
  // Several ranks (torchrun's or Slurm's environment): the rendezvous first, then each rank's own device, port and
  // run directory (rank 0's; the others' under it).
  std::shared_ptr<RankGroup> group;
  std::unique_ptr<RolloutPreemption> preemption;
  if (auto s = JoinRanks(&resolved, &group, &preemption); !s.ok()) return s;
  auto impl = std::make_unique<Impl>(resolved);
  impl->ranks = MakeRankCoordinator(group, std::move(preemption));
  Status init = impl->Init();
  if (group && group->rank() == 0) {
    // The other ranks wait for rank 0's run directory (empty: rank 0 could not start, and neither can they).
    std::error_code ec;
    const std::string shared =
        init.ok() ? std::filesystem::absolute(impl->run_dir->path(), ec).lexically_normal().string() : std::string();
    try {
      group->ShareFromRankZero("run_dir", shared);
    } catch (const RankError& e) {
      if (init.ok()) init = Status::IoError(e.what());
    }
  }
  if (!init.ok()) return init;
  std::unique_ptr<Learner> learner(new Learner(std::move(impl)));
  learner->impl_->router->Start();
  *out = std::move(learner);
  return Status::Ok();
}

Status Learner::Impl::Init() {
  if (auto s = ResolveDevice(config.learner.device, &device); !s.ok()) return s;
  if (auto s = ParsePrecision(config.learner.precision, &precision); !s.ok()) return s;
  if (auto s = CheckPrecision(precision, device); !s.ok()) return s;
  acting_precision = precision;
  if (config.learner.acting_precision != "auto") {
    if (auto s = ParsePrecision(config.learner.acting_precision, &acting_precision); !s.ok())
      return Status::InvalidArgument("learner.acting_precision: " + s.message());
    if (auto s = CheckPrecision(acting_precision, device); !s.ok())
      return Status::InvalidArgument("learner.acting_precision: " + s.message());
  }
  if (config.learner.cuda_graphs && !config.learner.random_actions) {
    if (!BuiltWithCuda())
      return Status::InvalidArgument("learner.cuda_graphs: this build's LibTorch has no CUDA (Debian's LibTorch is "
                                     "CPU-only); set learner.cuda_graphs to false, or build against a CUDA LibTorch");
    if (!device.is_cuda())
      return Status::InvalidArgument(fmt::format("learner.cuda_graphs: CUDA graphs need a CUDA device, but "
                                                 "learner.device '{}' resolved to {}; set learner.cuda_graphs to false",
                                                 config.learner.device, device.str()));
  }
  SetCpuThreads(config.learner.threads);  // LibTorch and OpenBLAS (learner/model/device.h)
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
  // Encoders written in PyTorch: a file that does not load stops the start here (its shapes are checked against
  // the env's at the first worker's Hello).
  for (const EncoderScript& script : EncoderScripts(config.ppo.actor_encoder_script, config.ppo.critic_encoder_script))
    if (!script.path.empty())
      if (auto s = CheckEncoderScript(script.path, script.key); !s.ok()) return s;
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
  // A resumed run whose bind leaves the port to the system listens where its previous learner did, so that the
  // workers still running for it (reconnecting to that endpoint) find it again.
  if (const std::string again = config.learner.resume ? PreviousLearnerBind(config) : std::string(); !again.empty()) {
    TransportConfig transport = config.transport;
    transport.bind = again;
    // The port is in the system's ephemeral range, so a client socket may hold it for a moment (EADDRINUSE):
    // tried for a few seconds.
    const auto deadline = Clock::now() + kRebindPatience;
    while (!socket) {
      try {
        socket = MakeRouter(ctx, transport, &endpoint, curve ? &curve->own : nullptr);
        spdlog::info("resume: listening on {} again, where the run's previous learner listened", endpoint);
      } catch (const zmq::error_t& e) {
        if (e.num() == EADDRINUSE && Clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          continue;
        }
        spdlog::warn("resume: cannot listen on {} again, where the run's previous learner listened ({}); listening "
                     "on a new port instead: workers still running for the previous learner will not find this one "
                     "(give transport.bind a fixed port to avoid this)",
                     again, e.what());
        break;
      }
    }
  }
  if (!socket) {
    try {
      socket = MakeRouter(ctx, config.transport, &endpoint, curve ? &curve->own : nullptr);
    } catch (const zmq::error_t& e) {
      return Status::IoError(fmt::format("transport.bind: cannot bind {}: {}", config.transport.bind, e.what()));
    }
  }
  if (auto s = RunDir::Open(config, &run_dir); !s.ok()) return s;
  if (config.learner.resume) {
    // The checkpoint's figures from now on, so that a learner stopped before any worker joins (and builds the
    // policy, which loads the whole checkpoint) still reports the run's counters.
    std::string path;
    TrainingCounters counters;
    RunState state;
    Status s = FindLatestValidCheckpoint(config.ResumeCheckpoints(), &path, nullptr);
    if (s.ok()) s = ReadCheckpointProgress(path, &counters, &state);
    if (!s.ok()) return Status::InvalidArgument("learner.resume: " + s.message());
    RestoreProgress(counters, state);
    spdlog::info("resuming {}: {} env steps, {} updates; the policy loads when the first worker joins", path,
                 counters.env_steps, counters.updates);
  }
  if (auto s = reporting.metrics.Open(run_dir->file("metrics.jsonl")); !s.ok()) return s;
  if (config.learner.eval_episodes > 0)
    if (auto s = EvalEpisodes::Open(config.learner.eval_episodes, run_dir->file("episodes.jsonl"), &eval); !s.ok())
      return s;
  if (auto s = TensorBoardWriter::Open(run_dir->file("tb"), &reporting.tensorboard); !s.ok()) return s;
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
  if (const auto d = reporting.error_log.Allow("error " + identity); d.log)
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
  if (!registry.has_run()) {
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

void Learner::Impl::CheckStop() {
  if (outcome.stopping) return;
  // Ranks: total_env_steps counts every rank's steps; the ranks check it together before each update.
  if (ranks->StopsOnOwnSteps() && stats.env_steps >= config.total_env_steps) {
    outcome.stopping = true;
    outcome.stop_reason = fmt::format("reached total_env_steps ({})", config.total_env_steps);
  } else if (config.stop_at_target && stats.solved_at_steps) {
    outcome.stopping = true;
    outcome.stop_reason = fmt::format("reached target_return ({})", *config.target_return);
    ranks->NoteStop(kRankStopTarget);
  } else if (eval && eval->done()) {
    outcome.stopping = true;
    outcome.stop_reason = fmt::format("evaluated learner.eval_episodes ({})", eval->episodes());
    ranks->NoteStop(kRankStopEval);
  } else if (config.max_wall_seconds > 0 && stats.ProcessWall() >= config.max_wall_seconds) {
    outcome.stopping = true;
    outcome.stop_reason = fmt::format("reached max_wall_seconds ({})", config.max_wall_seconds);
    ranks->NoteStop(kRankStopWall);
  } else if (stop_request.requested.load()) {
    // Seen before the kStop item that RequestStop queued (a busy learner checks after every batch).
    outcome.stopping = true;
    outcome.stop_reason = RequestedStopReason();
  }
}

// Drops workers the I/O thread has not heard from for longer than transport.heartbeat_timeout_s.
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
  o.trainer_busy_seconds = stats.update_seconds_total + (trainer_busy() ? Seconds(Clock::now() - update.submitted_at) : 0.0);
  return o;
}

void Learner::Impl::ShowProgress(bool force) {
  if (!ranks->writes_checkpoints()) return;  // rank 0 shows the run's line; the others log only
  const auto now = Clock::now();
  if (!force && Seconds(now - reporting.last_progress) < config.learner.progress_interval_s) return;
  std::string line = stats.StatusLine(Outside(), now);
  line += ranks->ProgressSuffix();  // the ranks' figures as of their last agreement (nothing alone)
  // A checkpoint write that is taking long (a slow disk): shown while it lasts; updates and serving go on.
  if (const double behind = trainer ? trainer->checkpoint_write_seconds() : 0; behind >= 1.0)
    line += fmt::format(" | checkpoint write {:.0f} s", behind);
  reporting.progress.Show(line);
  reporting.last_progress = now;
}

nlohmann::json Learner::Impl::Summary() const {
  nlohmann::json s = stats.SummaryCounters(Outside());
  s["env"] = registry.has_run() ? registry.run().env_name : std::string();
  s["mode"] = config.mode;
  s["target_return"] = config.target_return ? nlohmann::json(*config.target_return) : nlohmann::json(nullptr);
  // The update's implementation: fused (CPU), graphed (CUDA graphs; its first update is LibTorch's) or libtorch.
  s["update_path"] = update.path;
  s["checkpoints_failed"] = reporting.checkpoints_failed;
  // Periodic checkpoints replaced by a newer one while the disk was still writing an older one.
  s["checkpoints_skipped"] = trainer ? trainer->checkpoints_skipped() : 0;
  s["write_errors"] = reporting.write_errors;
  s["graphed_updates"] = update.graphed;
  const int64_t agents = registry.has_run() ? registry.run().num_agents : 1;
  s["num_envs"] = collector.has_store() ? collector.store().num_rows() / agents : 0;
  // What the learner expected to need for the rows it ended with (learner/run/memory_budget.h), and what it held
  // before the run, which the estimate leaves out: max_rss_mb should stay within their sum.
  s["rss_before_run_mb"] = rss_before_run_mb;
  if (collector.has_store()) {
    RunMemoryInputs in = memory_inputs;
    in.rows = collector.store().num_rows();
    s["memory_estimate_mb"] =
        static_cast<double>(EstimateRunMemory(in, config.ppo, config.mode == "async", device.is_cuda()).total()) /
        (1024.0 * 1024.0);
  }
  s["stop_reason"] = outcome.stop_reason;
  if (eval) s["eval_episodes_counted"] = eval->counted();
  s["device"] = device.str();
  s["precision"] = config.learner.precision;
  s["acting_precision"] = PrecisionName(acting_precision);
  s["torch_version"] = TORCH_VERSION;
  // The library and kernel of every CPU matrix product of the run (learner/model/blas_kernel.h).
  const BlasInfo blas = LoadedBlasInfo();
  s["blas"] = {{"library", blas.library}, {"kernel", blas.kernel}};
  s["start_unix"] = reporting.start_unix;
  // Observations in the normaliser's statistics (env.normalize_obs): with ranks, every rank's as of their last
  // exchange plus this rank's since.
  if (normalizer.options().obs) s["normalizer_observations"] = normalizer.obs_count();
  ranks->AddToSummary(collector.has_store() ? &collector.store() : nullptr, config.learner.sync_fraction, &s);
  return s;
}

Status Learner::Run(nlohmann::json* summary) {
  Impl& m = *impl_;
  m.stats.Start(Clock::now(), m.stats.wall_offset());  // a resumed run's earlier wall time (RestoreProgress)
  m.reporting.start_unix = UnixNow();
  spdlog::info("learner listening on {}; run directory {}", m.endpoint, m.run_dir->path());
  std::vector<Work> batch;
  bool cancelled = false;
  // On CUDA, everything this thread queues (the policy's building and warm-up, the acting forwards, the weight
  // copies after updates) goes on a stream of its own, high-priority unless learner.acting_high_priority is off.
  ScopedCudaStream acting_stream(m.device, m.config.learner.acting_high_priority);
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
                                 [](const Work& w) {
                                   return w.kind != Work::Kind::kTrainerDone && w.kind != Work::Kind::kCheckpointDone;
                                 }),
                  batch.end());
    }
    m.inference.Begin("a batch of requests");
    try {
      if (!batch.empty() && m.test_hooks.fail_next_batch.load() && m.test_hooks.fail_next_batch.exchange(false))
        throw std::runtime_error("injected fault (TEST_FailNextBatch)");
      if (!batch.empty() && m.test_hooks.stall_next_batch_ms.load() > 0) {
        ActivityScope busy(m.inference, "an injected stall (TEST_StallNextBatch)");
        std::this_thread::sleep_for(std::chrono::milliseconds(m.test_hooks.stall_next_batch_ms.exchange(0)));
      }
      m.CheckWorkers();
      m.ProcessBatch(batch);
    } catch (const std::exception& e) {
      m.FailServing(ErrorText(e));
    }
    m.inference.End();
    if (m.outcome.stopping && !m.trainer_busy()) {
      // Ranks: this rank's stop reaches the others through one last agreement (they stop at their next one).
      if (m.NeedsFinalVote()) {
        spdlog::info("stopping ({}): telling the other ranks", m.outcome.stop_reason);
        m.SubmitVote();
        continue;
      }
      break;
    }
    // Stopping with an update in flight: it is cut short after its current minibatch step, so that the final
    // checkpoint and summary come within the launcher's grace period however long updates are.
    if (m.outcome.stopping && !cancelled) {
      m.trainer->Cancel();
      cancelled = true;
    }
  }
  m.reporting.progress.Finish();
  spdlog::info("stopping: {}", m.outcome.stop_reason);
  // Nothing more is served: the I/O thread drops what arrives, and the batcher takes nothing more.
  m.router->SetShuttingDown();
  m.batcher.Close();

  // Final checkpoint, unless the run never started or its last update diverged; then tell every worker to stop.
  // (Updates check their parameters only when they checkpoint: the last one is checked here.)
  m.inference.Begin("the final checkpoint");
  Status final_checkpoint;
  bool final_attempted = false;
  try {  // after a LibTorch or CUDA error these may throw too: the workers must still hear Stop
    Outcome& o = m.outcome;
    if (!o.update_failed && m.trainer && o.start_failure.ok() && !m.trainer->ParametersFinite()) {
      o.update_failed = true;
      o.stop_reason = "the PPO update failed (non-finite parameters)";
    }
    if (o.update_failed) {
      spdlog::error("no final checkpoint: the last update {}; the newest checkpoint is the last good one",
                    o.update_error.empty() ? "diverged" : "failed (" + o.update_error + ")");
    } else if (m.trainer && o.start_failure.ok() && !m.writes_checkpoints()) {
      spdlog::info("no final checkpoint from rank {}: rank 0 writes the run's checkpoints", m.ranks->rank());
    } else if (m.trainer && o.start_failure.ok()) {
      const TrainingCounters c{m.RunEnvSteps(), m.stats.updates, m.stats.version, m.stats.window.total_episodes(),
                               m.stats.Wall()};
      std::string path;
      final_attempted = true;
      if (auto s = m.trainer->FinalCheckpoint(c, m.CaptureRunState(), &path); !s.ok()) {
        spdlog::error("final checkpoint: {} (the previous checkpoints are kept)", s.message());
        ++m.reporting.checkpoints_failed;
        final_checkpoint = s;
      } else {
        spdlog::info("checkpoint written: {}", path);
      }
    }
  } catch (const std::exception& e) {
    spdlog::error("no final checkpoint: {}", ErrorText(e));
  }
  // Periodic writes that ended after the batcher closed (their kCheckpointDone was dropped): counted before the
  // summary is made. After a final checkpoint nothing is left to wait for; without one (a failed update, a
  // failed start) a write still in flight is not waited for, so that the workers hear Stop at once: it finishes
  // when the trainer is destroyed, uncounted.
  if (m.trainer)
    for (const auto& r : final_attempted ? m.trainer->DrainCheckpoints() : m.trainer->TakeCheckpointResults())
      m.NoteCheckpoint(r.status, r.name);
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
    return Status::InvalidArgument(m.outcome.stop_reason + (m.outcome.update_error.empty()
                                                                ? " (see metrics.jsonl; lower ppo.lr?)"
                                                                : " (the previous checkpoints are kept)"));
  if (!m.outcome.serve_failure.ok()) return m.outcome.serve_failure;
  if (!m.outcome.rank_failure.ok()) return m.outcome.rank_failure;
  // Stopped for want of checkpoints, or the final one failed: the run's state is not all on disk; say so in the
  // exit status too (summary.json, written above, has checkpoints_failed).
  const int limit = m.config.learner.max_failed_checkpoints;
  if (limit > 0 && m.reporting.stopped_for_checkpoints)
    return Status::IoError(m.outcome.stop_reason + " (free space under " + m.run_dir->path() + ", then --resume)");
  if (!final_checkpoint.ok()) return Status::IoError("the final checkpoint was not written: " + final_checkpoint.message());
  return Status::Ok();
}

}  // namespace farm
