// The learner's three threads and the state machine of a rollout.
//
// All mutable training state (workers, trajectory store, counters, the
// acting policy) belongs to the inference thread; the I/O thread only
// decodes and forwards bytes, and the trainer thread only runs updates on
// rollouts it is handed. They meet through the batcher and channels, so no
// lock guards model state.
#include "learner/learner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <arpa/inet.h>
#include <sys/socket.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <zmq.hpp>
#include <zmq_addon.hpp>
#include <torch/version.h>
#include <unistd.h>
#include <ATen/CPUGeneratorImpl.h>

#include "common/channel.h"
#include "common/curve.h"
#include "common/files.h"
#include "common/log_limit.h"
#include "common/protobuf_log.h"
#include "common/resources.h"
#include "common/running_stats.h"
#include "common/transport.h"
#include "common/wire.h"
#include "common/tensorboard.h"
#include "learner/amp.h"
#include "learner/batcher.h"
#include "learner/checkpoint.h"
#include "learner/cuda_graph.h"
#include "learner/device.h"
#include "learner/metrics.h"
#include "learner/policy.h"
#include "learner/ppo.h"
#include "learner/trajectory_store.h"

namespace farm {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string Timestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  return buf;
}

// Every parameter finite: a policy that is not must never become a checkpoint.
bool ParametersFinite(ActorCritic& policy) {
  torch::NoGradGuard no_grad;
  for (const auto& p : policy->parameters())
    if (!torch::isfinite(p).all().item<bool>()) return false;
  return true;
}

struct TrainResult {
  PpoStats stats;
  double update_seconds = 0;
  int64_t version = 0;  // version the update produced
};

// An item for the inference thread.
struct Work {
  enum class Kind { kHello, kStep, kReplay, kHeartbeat, kTrainerDone, kStop };
  Kind kind = Kind::kStep;
  std::string identity;
  wire::Envelope msg;  // Hello or StepRequest
  int64_t rows = 0;
  std::shared_ptr<TrainResult> result;
};

struct TrainJob {
  Rollout rollout;
  double progress = 0;
  int64_t version = 0;  // version of the policy being trained
  bool checkpoint = false;
  TrainingCounters counters;
  RunState state;  // with `checkpoint`: taken at hand-off; the trainer adds its generator's after the update
};

// How often sanitize mode may warn about one worker's non-finite values.
constexpr std::chrono::seconds kNonFiniteWarnInterval{10};

struct WorkerState {
  std::string identity;
  int group_size = 0;  // rows per group: envs x agents (Hello.num_agents); each row is an agent's transition
  int group_envs = 0;  // envs per group (what env_steps counts)
  std::vector<int> store_group;     // per worker group: group id in the store
  std::vector<uint64_t> next_seq;   // per worker group: expected seq
  std::vector<uint8_t> acted;       // per worker group: actions sent, results not yet received
  std::chrono::steady_clock::time_point last_seen;  // any message from it
  // learner.non_finite: sanitize: values replaced since the last warning, and when that was.
  int64_t non_finite_unreported = 0;
  std::optional<std::chrono::steady_clock::time_point> last_non_finite_warning;
};

// "a.b: value" for every leaf of a YAML mapping (the dumped config), in order.
void FlattenYaml(const YAML::Node& node, const std::string& prefix, std::map<std::string, std::string>* out) {
  if (node.IsMap()) {
    for (const auto& kv : node) {
      const std::string key = kv.first.as<std::string>();
      FlattenYaml(kv.second, prefix.empty() ? key : prefix + "." + key, out);
    }
    return;
  }
  YAML::Emitter e;
  e << YAML::Flow << node;
  (*out)[prefix] = e.c_str();
}

// The keys whose values differ between two dumped configs, as "key: before -> after".
std::vector<std::string> ConfigChanges(const std::string& before, const std::string& after) {
  std::map<std::string, std::string> a, b;
  FlattenYaml(YAML::Load(before), "", &a);
  FlattenYaml(YAML::Load(after), "", &b);
  std::vector<std::string> out;
  for (const auto& [key, value] : b) {
    if (key == "run_dir" || key == "learner.resume") continue;  // what resuming itself sets
    auto it = a.find(key);
    const std::string old = it == a.end() ? std::string("(absent)") : it->second;
    if (old != value) out.push_back(fmt::format("{}: {} -> {}", key, old, value));
  }
  return out;
}

}  // namespace

struct Learner::Impl {
  explicit Impl(const FarmConfig& c)
      : config(c),
        batcher(c.batcher.max_rows, std::chrono::microseconds(c.batcher.max_wait_us),
                static_cast<std::size_t>(c.batcher.queue_capacity), [](const Work& w) { return w.rows; }),
        jobs(1) {}

  // ---- set up (Create) ----
  Status Init();
  // ---- I/O thread ----
  void IoLoop();
  // ---- trainer thread ----
  void TrainerLoop();
  // ---- inference thread ----
  void ProcessBatch(std::vector<Work>& batch);
  void OnHello(Work& w);
  void OnTrainerDone(const TrainResult& r);
  Status ValidateStep(const WorkerState& ws, const wire::StepRequest& req) const;
  void ConsumeOutcome(WorkerState& ws, const wire::StepRequest& req);
  void ServeSteps(std::vector<Work*>& steps);
  void Forward(const std::vector<Work*>& steps, int64_t rows, torch::Tensor* action, torch::Tensor* logp,
               torch::Tensor* value);
  void RandomActions(int64_t rows, torch::Tensor* action, torch::Tensor* logp, torch::Tensor* value);
  void Respond(std::vector<Work*>& steps, const torch::Tensor& action, const torch::Tensor& logp,
               const torch::Tensor& value);
  void MaybeHandOff();
  void ReleaseParked();
  void CheckStop();
  void Reply(const std::string& identity, const wire::Envelope& env);
  void RequestStop(const std::string& reason);
  std::string RequestedStopReason();  // RequestStop's reason (any thread may have set it)
  void FailStart(const std::string& why);
  void FailServing(const std::string& what);
  void ReplyError(const std::string& identity, const std::string& message, const wire::StepRequest* req,
                  wire::Error::Code code = wire::Error::FATAL);
  void ShowProgress(bool force);
  nlohmann::json Summary() const;
  void UpdateReadyHint();
  void WarmUp();
  void CheckWorkers();
  Status Resume();
  Status InitNormalizerFrom(const FarmConfig& saved, const std::string& checkpoint);
  Status MergeStatsDelta(const wire::NormalizerStats& delta);
  void FillNormalizer(wire::NormalizerStats* out) const;
  RunState CaptureRunState();
  bool AdmitNonFinite(WorkerState& ws, Work& w);
  double Wall() const;
  void RemoveWorker(const std::string& identity, const std::string& why);

  FarmConfig config;
  std::string run_dir;
  std::unique_ptr<DirectoryLock> run_dir_lock;  // run_dir/learner.lock, held for this learner's life
  std::string endpoint;
  torch::Device device{torch::kCPU};
  Precision precision = Precision::kFp32;
  std::unique_ptr<TensorBoardWriter> tensorboard;

  zmq::context_t ctx{1};
  std::unique_ptr<ZapAuthenticator> zap;  // with transport.curve: admits the listed workers (before ctx ends)
  zmq::socket_t router;       // I/O thread only (after Create)
  zmq::socket_t reply_pull;   // I/O thread only
  zmq::socket_t reply_push;   // inference thread only
  zmq::socket_t router_events;  // I/O thread only: the ROUTER's closed connections (zmq_socket_monitor)
  std::string reply_endpoint;

  DynamicBatcher<Work> batcher;
  Channel<TrainJob> jobs;
  std::thread io_thread;
  std::thread trainer_thread;
  std::atomic<bool> stop_requested{false};
  std::mutex stop_request_mutex;
  std::string stop_request_reason;  // GUARDED_BY(stop_request_mutex): RequestStop's reason, set before stop_requested
  // Set when Run stops serving: the I/O thread then drops what arrives and no longer counts or reports the
  // connections that close as workers leave.
  std::atomic<bool> shutting_down{false};

  // ---- inference-thread state ----
  const bool recording = config.learner.train && !config.learner.random_actions;
  // env.normalize_obs / normalize_reward: the workers normalise; the learner merges their deltas into the run's
  // statistics (a few per rollout), sends them back, checkpoints them. Frozen (workers only use them) unless recording.
  const NormalizerOptions normalization = NormalizerOptions::FromConfig(config);
  RunningMoments norm_obs, norm_ret;
  torch::Generator random_gen = at::make_generator<at::CPUGeneratorImpl>(config.seed);
  std::unordered_map<std::string, WorkerState> workers;
  std::optional<Space> obs_space;
  std::optional<Space> action_space;
  std::optional<Space> state_space;  // the run's global state (every worker's Hello declares the same, or none)
  uint32_t num_agents = 1;           // agents per env, the same for every worker
  bool use_state = false;            // the policy's critic reads the global state (acting->has_global_state())
  std::string env_name;
  int total_groups = 0;
  ActorCritic acting{nullptr};    // the policy that answers requests
  std::unique_ptr<GraphedActor> graphed;  // learner.cuda_graphs: replays `acting`'s forward
  ActorCritic training{nullptr};  // trained by the trainer thread (shared with it by handing jobs)
  std::unique_ptr<PpoTrainer> trainer;
  std::unique_ptr<TrajectoryStore> store;
  std::vector<Work> parked;  // requests held until a handoff or an update ends
  bool trainer_busy = false;
  bool stopping = false;
  std::string stop_reason;
  // The run could not start (policy, trainer or --resume): nothing is checkpointed and no summary written,
  // so a run directory being resumed stays as it was; Run returns this.
  Status start_failure;
  // An update produced a non-finite loss or parameters: no checkpoint is written after it (`latest` stays
  // on the last good one); Run returns an error.
  bool update_failed = false;
  // An exception escaped the serving of a batch (a LibTorch or CUDA error, say): the run stops, with its final
  // checkpoint (the trainer's policy is not touched by serving), and Run returns this.
  Status serve_failure;
  std::atomic<bool> fail_next_batch{false};  // Learner::TEST_FailNextBatch
  int64_t handoff_env_steps = 0;  // env_steps at the last hand-off: the learning-rate schedule's progress
  int64_t version = 0;  // policy version of `acting`
  int64_t updates = 0;
  int64_t env_steps = 0;  // env steps; a multi-agent env's step is num_agents agent rows (agent steps)
  EpisodeWindow window{100};
  std::optional<int64_t> solved_at_steps;
  std::optional<double> solved_at_seconds;
  std::optional<double> solved_at_unix;
  double wall_offset = 0;  // wall seconds of the run before this process (--resume)
  LagStats last_lag;
  PpoStats last_stats;
  Clock::time_point start = Clock::now();
  double start_unix = UnixNow();
  torch::Tensor batch_obs;  // preallocated, grown as needed
  torch::Tensor batch_state;  // the same for global states (use_state)
  std::vector<int64_t> obs_shape;
  std::vector<int64_t> state_shape;
  std::string scratch;
  MetricsWriter metrics;
  ProgressLine progress;
  Clock::time_point last_progress = Clock::now();
  // Time accounting (seconds) for the breakdown.
  double wait_s = 0, held_s = 0, forward_s = 0, serve_s = 0, update_s = 0;
  int64_t batches = 0, batch_rows = 0;
  int64_t interval_steps = 0;
  Clock::time_point interval_start = Clock::now();
  int64_t workers_lost = 0;
  Clock::time_point last_worker_check = Clock::now();
  int64_t errors = 0;                 // answered by the inference thread
  // Its warnings about them, at most one per client and kLogRateInterval: a client decides their rate.
  LogRateLimiter error_log{kLogRateInterval, {}, 1024};
  std::atomic<int64_t> io_errors{0};  // answered by the I/O thread (undecodable, unexpected type)
  int64_t non_finite_rejected = 0;    // requests refused for NaN/Inf (learner.non_finite: reject; also in errors)
  int64_t non_finite_sanitized = 0;   // values replaced by 0 (learner.non_finite: sanitize)
  std::atomic<int64_t> connections_closed{0};  // seen by the I/O thread's monitor
  std::atomic<int64_t> replies_dropped{0};     // messages to peers whose queue was full (they do not read)
};

Learner::Learner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Learner::~Learner() {
  if (!impl_) return;
  impl_->batcher.Close();
  impl_->jobs.Close();
  impl_->ctx.shutdown();  // the I/O thread's poll throws ETERM and it leaves
  if (impl_->io_thread.joinable()) impl_->io_thread.join();
  if (impl_->trainer_thread.joinable()) impl_->trainer_thread.join();
}

const std::string& Learner::endpoint() const { return impl_->endpoint; }
const std::string& Learner::run_dir() const { return impl_->run_dir; }

void Learner::RequestStop(const std::string& reason) { impl_->RequestStop(reason); }

void Learner::TEST_FailNextBatch() { impl_->fail_next_batch.store(true); }

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

Status Learner::Create(const FarmConfig& config, std::unique_ptr<Learner>* out) {
  InstallProtobufLogHandler();  // before any thread parses a message
  auto impl = std::make_unique<Impl>(config);
  if (auto s = impl->Init(); !s.ok()) return s;
  Impl* p = impl.get();
  std::unique_ptr<Learner> learner(new Learner(std::move(impl)));
  p->io_thread = std::thread([p] { p->IoLoop(); });
  p->trainer_thread = std::thread([p] { p->TrainerLoop(); });
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

  run_dir = config.run_dir.empty() ? fmt::format("runs/{}-{}", config.name, Timestamp()) : config.run_dir;
  if (config.learner.resume) {
    // Checked now rather than at the first worker's Hello: a run that cannot resume should not start.
    std::string latest;
    std::vector<std::string> skipped;
    if (auto s = FindLatestValidCheckpoint(run_dir + "/checkpoints", &latest, &skipped); !s.ok())
      return Status::NotFound(fmt::format("learner.resume: nothing to resume in run_dir '{}': {}{}", run_dir,
                                          s.message(), skipped.empty() ? "" : " (" + skipped.front() + ")"));
  } else if (!config.run_dir.empty() && !ListCheckpoints(run_dir + "/checkpoints").empty()) {
    // A new run would write checkpoints with low update counts next to the old run's, which the keep-newest
    // pruning would then delete at once.
    return Status::InvalidArgument(fmt::format(
        "run_dir '{}' already holds another run's checkpoints: continue it with --resume (learner.resume: true) once "
        "no learner is using it, or choose another run_dir",
        run_dir));
  }
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
  try {
    router = MakeRouter(ctx, config.transport, &endpoint, curve ? &curve->own : nullptr);
  } catch (const zmq::error_t& e) {
    return Status::IoError(fmt::format("transport.bind: cannot bind {}: {}", config.transport.bind, e.what()));
  }
  std::error_code ec;
  if (config.run_dir.empty() && !config.learner.resume) {
    // The default directory is named to the second: a second run started within it gets "-2", "-3", ... rather
    // than the same directory. mkdir decides, so two learners starting at once cannot both take one name.
    const std::string parent = std::filesystem::path(run_dir).parent_path().string();
    std::filesystem::create_directories(parent, ec);
    if (ec) return Status::IoError(fmt::format("{}: cannot create directory: {}", parent, ec.message()));
    const std::string base = run_dir;
    for (int n = 2; !std::filesystem::create_directory(run_dir, ec); ++n) {
      if (ec) return Status::IoError(fmt::format("{}: cannot create run directory: {}", run_dir, ec.message()));
      run_dir = fmt::format("{}-{}", base, n);
    }
  }
  std::filesystem::create_directories(run_dir + "/checkpoints", ec);
  if (ec) return Status::IoError(fmt::format("{}: cannot create run directory: {}", run_dir, ec.message()));
  // One learner per run directory, held until this process ends: a second one (the same run_dir, or --resume of
  // a run that is still going) would interleave checkpoints, metrics and config.yaml with this one's.
  if (auto s = DirectoryLock::Acquire(run_dir, "learner.lock", &run_dir_lock); !s.ok())
    return Status::InvalidArgument(fmt::format(
        "run_dir '{}' is in use by another farm-learner ({}): wait for it to stop, or choose another run_dir",
        run_dir, s.message()));
  // Resuming, config.yaml is rewritten once the checkpoint has loaded (OnHello): a failed resume leaves it.
  if (!config.learner.resume)
    if (auto s = WriteFileAtomic(run_dir + "/config.yaml", DumpConfig(config)); !s.ok()) return s;
  if (auto s = metrics.Open(run_dir + "/metrics.jsonl"); !s.ok()) return s;
  if (auto s = TensorBoardWriter::Open(run_dir + "/tb", &tensorboard); !s.ok()) return s;

  // Connections the ROUTER closes: a worker that left, or one that sent more than transport.max_message_bytes
  // (ZeroMQ drops such a peer rather than deliver part of a message).
  const std::string events_endpoint = fmt::format("inproc://farm-router-events-{}", static_cast<const void*>(this));
  if (zmq_socket_monitor(router.handle(), events_endpoint.c_str(), ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) != 0)
    return Status::IoError(fmt::format("zmq_socket_monitor: {}", zmq_strerror(zmq_errno())));
  router_events = zmq::socket_t(ctx, zmq::socket_type::pair);
  router_events.set(zmq::sockopt::linger, 0);
  router_events.connect(events_endpoint);
  reply_endpoint = fmt::format("inproc://farm-replies-{}", static_cast<const void*>(this));
  reply_pull = zmq::socket_t(ctx, zmq::socket_type::pull);
  reply_pull.set(zmq::sockopt::rcvhwm, 0);
  reply_pull.bind(reply_endpoint);
  reply_push = zmq::socket_t(ctx, zmq::socket_type::push);
  reply_push.set(zmq::sockopt::sndhwm, 0);
  reply_push.connect(reply_endpoint);
  if (auto s = WriteFileAtomic(run_dir + "/learner.endpoint", endpoint + "\n"); !s.ok()) return s;
  return Status::Ok();
}

// ---------------------------------------------------------------- I/O thread

// The address of the peer on a connection's socket, while it is open ("" when it is already gone).
std::string PeerAddress(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "";
  char host[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    return fmt::format("{}:{}", host, ntohs(a->sin_port));
  }
  if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    return fmt::format("[{}]:{}", host, ntohs(a->sin6_port));
  }
  return "";
}

void Learner::Impl::IoLoop() {
  zmq::pollitem_t items[] = {{router.handle(), 0, ZMQ_POLLIN, 0},
                             {reply_pull.handle(), 0, ZMQ_POLLIN, 0},
                             {router_events.handle(), 0, ZMQ_POLLIN, 0}};
  std::vector<zmq::message_t> frames;
  std::unordered_map<int, std::string> peers;  // open connections' descriptors -> peer address
  std::string err_scratch;
  // Undecodable messages arrive at whatever rate a client sends them: each gets its Error and is counted,
  // but the log says so at most once per kLogRateInterval, with the count in between.
  LogRateLimiter bad_message_log;
  LogRateLimiter dropped_log;
  // Sends one message to a peer without ever blocking this thread: a peer that is gone (router_mandatory:
  // EHOSTUNREACH) or that does not read what it is sent (its queue at transport's send high-water mark)
  // loses the message, and every other peer is still served.
  auto send_to = [&](zmq::const_buffer identity, zmq::const_buffer payload) {
    // Only for the log lines: the common case (sent) builds no string.
    const auto name = [&] { return std::string(static_cast<const char*>(identity.data()), identity.size()); };
    try {
      if (!router.send(identity, zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
        replies_dropped.fetch_add(1);
        const std::string who = name();
        if (const auto d = dropped_log.Allow("full " + who); d.log && !shutting_down.load())
          spdlog::warn("message to {} dropped: it does not read what it is sent (its queue is full){}", who,
                       LogRateLimiter::Suffix(d));
        return;
      }
      router.send(payload, zmq::send_flags::dontwait);  // the rest of a message the first frame got in
    } catch (const zmq::error_t& ex) {
      if (ex.num() != EHOSTUNREACH) throw;
      if (!shutting_down.load()) spdlog::warn("message to {} dropped: the worker is gone", name());
    }
  };
  auto send_error = [&](const std::string& identity, const std::string& message) {
    io_errors.fetch_add(1);
    wire::Envelope e;
    e.mutable_error()->set_message(message);
    e.SerializeToString(&err_scratch);
    send_to(zmq::buffer(identity), zmq::buffer(err_scratch));
  };
  try {
    while (true) {
      zmq::poll(items, 3, std::chrono::milliseconds(-1));
      if (items[2].revents & ZMQ_POLLIN) {
        // A monitor event: 16-bit event and 32-bit value (the descriptor), then the endpoint.
        frames.clear();
        if (zmq::recv_multipart(router_events, std::back_inserter(frames), zmq::recv_flags::dontwait) &&
            frames[0].size() >= 6) {
          uint16_t event = 0;
          int32_t fd = -1;
          std::memcpy(&event, frames[0].data(), sizeof event);
          std::memcpy(&fd, static_cast<const char*>(frames[0].data()) + sizeof event, sizeof fd);
          if (event == ZMQ_EVENT_ACCEPTED) {
            peers[fd] = PeerAddress(fd);
          } else if (event == ZMQ_EVENT_DISCONNECTED) {
            const auto it = peers.find(fd);
            const std::string peer = it == peers.end() || it->second.empty() ? "a peer" : it->second;
            if (it != peers.end()) peers.erase(it);
            if (shutting_down.load()) continue;  // the workers leaving on Stop
            const int64_t n = connections_closed.fetch_add(1) + 1;
            spdlog::info("connection from {} closed ({} so far): the worker left, or sent a message over "
                         "transport.max_message_bytes ({}), which ZeroMQ answers by disconnecting",
                         peer, n, config.transport.max_message_bytes);
          }
        }
      }
      if (items[0].revents & ZMQ_POLLIN) {
        frames.clear();
        if (!zmq::recv_multipart(router, std::back_inserter(frames), zmq::recv_flags::dontwait)) continue;
        std::string identity = frames[0].to_string();
        if (frames.size() != 2) {
          send_error(identity, fmt::format("expected one frame per message, got {}", frames.size() - 1));
          continue;
        }
        Work w;
        if (auto s = Decode(frames[1].data(), frames[1].size(), &w.msg); !s.ok()) {
          if (const auto d = bad_message_log.Allow("undecodable"); d.log)
            spdlog::warn("bad message from {}: {}{}", identity, s.message(), LogRateLimiter::Suffix(d));
          send_error(identity, s.message());
          continue;
        }
        w.identity = std::move(identity);
        if (w.msg.has_hello()) {
          w.kind = Work::Kind::kHello;
        } else if (w.msg.has_heartbeat()) {
          w.kind = Work::Kind::kHeartbeat;
        } else if (w.msg.has_step()) {
          w.kind = Work::Kind::kStep;
          const auto& shape = w.msg.step().obs().shape();
          // The batcher's row count until ValidateStep checks the shape: clamped, so that a bad request
          // cannot overflow the batcher's sums.
          w.rows = shape.empty() ? 0 : std::clamp<int64_t>(shape[0], 0, kMaxEnvsPerWorker);
        } else {
          send_error(w.identity, fmt::format("unexpected message type {} (expected Hello, StepRequest or Heartbeat)",
                                             static_cast<int>(w.msg.body_case())));
          continue;
        }
        // Closed: the learner is stopping and serves nothing more; its Stop replies and the quit message
        // still come through reply_pull.
        (void)batcher.Push(std::move(w));
      }
      if (items[1].revents & ZMQ_POLLIN) {
        frames.clear();
        if (!zmq::recv_multipart(reply_pull, std::back_inserter(frames), zmq::recv_flags::dontwait)) continue;
        if (frames.size() == 1 && frames[0].size() == 0) return;  // quit
        send_to(zmq::buffer(frames[0].data(), frames[0].size()), zmq::buffer(frames[1].data(), frames[1].size()));
      }
    }
  } catch (const zmq::error_t& e) {
    if (e.num() == ETERM) return;  // the context is shutting down (Learner's destructor)
    // Without this thread nothing is received or answered: stop the run (final checkpoint) rather than hang.
    spdlog::error("learner I/O thread: {}; stopping", e.what());
    RequestStop(fmt::format("the learner's I/O thread failed: {}", e.what()));
  }
}

// ---------------------------------------------------------------- trainer

void Learner::Impl::TrainerLoop() {
  // OpenMP's thread count is a per-thread setting: set it here too, not only on the thread that ran Init.
  SetCpuThreads(config.learner.threads);  // LibTorch and OpenBLAS (learner/device.h)
  // On CUDA the update runs on its own stream, so that inference kernels need not queue behind it.
  ScopedCudaStream stream(device);
  TrainJob job;
  while (jobs.Receive(&job).ok()) {
    auto result = std::make_shared<TrainResult>();
    const auto t0 = Clock::now();
    try {
      if (device.is_cuda()) {
        for (auto* t : {&job.rollout.obs, &job.rollout.actions, &job.rollout.logp, &job.rollout.values,
                        &job.rollout.rewards, &job.rollout.dones, &job.rollout.last_value})
          *t = t->to(device);
        if (job.rollout.states.defined()) job.rollout.states = job.rollout.states.to(device);
      }
      result->stats = trainer->Update(job.rollout, job.progress);
      // The inference thread copies the new weights on its own stream once it hears of this result (and an
      // asynchronous CUDA error of the update surfaces here).
      stream.Synchronize();
      // A diverged update (the run stops on it) is never saved: `latest` stays on the last good checkpoint.
      // The parameters are checked only when a checkpoint is due (a device-to-host sync).
      if (std::isfinite(result->stats.policy_loss) && job.checkpoint && !ParametersFinite(training)) {
        spdlog::error("PPO update {}: non-finite parameters", job.counters.updates);
        result->stats.policy_loss = std::nan("");
      }
      if (job.checkpoint && std::isfinite(result->stats.policy_loss)) {
        job.counters.policy_version = job.version + 1;
        job.state.rng[kRngTrainer] = GeneratorState(trainer->generator());  // as the next update will find it
        if (auto s = SaveCheckpoint(run_dir + "/checkpoints", training, trainer->optimizer(), job.counters, nullptr,
                                    &trainer->scaler(), config.learner.keep_checkpoints, &job.state);
            !s.ok())
          spdlog::error("checkpoint: {}", s.message());
      }
    } catch (const std::exception& e) {
      // Any exception is a failed update: the run stops on it, with no checkpoint after it, never by std::terminate.
      const auto* torch_error = dynamic_cast<const c10::Error*>(&e);
      spdlog::error("PPO update failed: {}", torch_error ? torch_error->what_without_backtrace() : e.what());
      result->stats.policy_loss = std::nan("");
    }
    // The rollout's arena goes back to the store's pool now, not when the next job arrives: in sync mode the
    // next rollout is recorded into it.
    job.rollout = Rollout{};
    result->update_seconds = Seconds(Clock::now() - t0);
    result->version = job.version + 1;
    Work w;
    w.kind = Work::Kind::kTrainerDone;
    w.result = std::move(result);
    if (!batcher.PushFront(std::move(w)).ok()) return;
  }
}

// ---------------------------------------------------------------- inference thread

void Learner::Impl::Reply(const std::string& identity, const wire::Envelope& env) {
  env.SerializeToString(&scratch);
  reply_push.send(zmq::buffer(identity), zmq::send_flags::sndmore);
  reply_push.send(zmq::buffer(scratch), zmq::send_flags::none);
}

std::string Learner::Impl::RequestedStopReason() {
  std::lock_guard<std::mutex> lock(stop_request_mutex);
  return stop_request_reason;
}

void Learner::Impl::FailServing(const std::string& what) {
  if (!store) {
    // Still setting up from the first Hello (building the policy, resuming): as any failure to start, it leaves the
    // run directory as it was, with no checkpoint of a policy that may be half loaded.
    FailStart("internal error while starting: " + what);
    return;
  }
  spdlog::error("learner: {} while serving a batch; stopping", what);
  if (serve_failure.ok()) serve_failure = Status::Internal(what + " (while serving a batch)");
  if (!stopping || stop_reason.empty()) stop_reason = "internal error: " + what;
  stopping = true;
}

void Learner::Impl::FailStart(const std::string& why) {
  stopping = true;
  stop_reason = why;
  if (start_failure.ok()) start_failure = Status::InvalidArgument(why);
}

void Learner::Impl::ReplyError(const std::string& identity, const std::string& message,
                               const wire::StepRequest* req, wire::Error::Code code) {
  ++errors;
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

void Learner::Impl::OnHello(Work& w) {
  const wire::Hello& h = w.msg.hello();
  wire::Envelope reply;
  auto* welcome = reply.mutable_welcome();
  auto refuse = [&](const std::string& why) {
    ++errors;
    if (const auto d = error_log.Allow("refused " + w.identity); d.log)
      spdlog::warn("refused {}: {}{}", w.identity, why, LogRateLimiter::Suffix(d));
    welcome->set_accepted(false);
    welcome->set_error(why);
    Reply(w.identity, reply);
  };
  Handshake hs;
  if (auto s = CheckHello(h, &hs); !s.ok()) return refuse(s.message());
  if (auto s = NormalizerOptions::CheckMatches(h.normalization(), normalization); !s.ok()) return refuse(s.message());
  // A message over the limit would not be refused but lost (ZeroMQ drops the connection): refuse the layout.
  if (const int64_t largest = MaxSessionMessageBytes(hs.group_rows, hs.observation, hs.action, hs.global_state) +
                              (normalization.any() ? MaxNormalizerStatsBytes(hs.observation.numel()) : 0);
      largest > config.transport.max_message_bytes)
    return refuse(fmt::format("{} envs per group with observation {} may need {}-byte messages, more than the "
                              "learner's transport.max_message_bytes ({}); raise it, or use more env.num_groups",
                              hs.group_size, hs.observation.ToString(), largest,
                              config.transport.max_message_bytes));
  if (workers.count(w.identity)) return refuse("this worker id already said hello");
  if (stopping) return refuse("the learner is stopping");
  const Space& obs = hs.observation;
  const Space& act = hs.action;
  if (!obs_space) {
    norm_obs.Reset(normalization.obs ? obs.numel() : 0);
    norm_ret.Reset(normalization.reward ? 1 : 0);
    std::vector<int> hidden = config.ppo.hidden_sizes;
    PolicyOptions options;  // MAPPO: the critic reads the env's global state whenever it has one
    if (auto s = ParseEncoder(config.ppo.encoder, &options.encoder); !s.ok()) return refuse("ppo." + s.message());
    options.global_state = hs.global_state;
    ActorCritic initial{nullptr};
    if (!config.learner.init_from.empty()) {
      FarmConfig saved;
      std::string path;
      if (auto s = LoadPolicy(config.learner.init_from, &initial, &saved, nullptr, &path); !s.ok())
        return refuse("learner.init_from: " + s.message());
      if (initial->observation_space() != obs || initial->action_space() != act)
        return refuse(fmt::format("learner.init_from: the policy in {} takes {} and acts in {}, but this worker's env "
                                  "has {} and {}",
                                  config.learner.init_from, initial->observation_space().ToString(),
                                  initial->action_space().ToString(), obs.ToString(), act.ToString()));
      if (auto s = InitNormalizerFrom(saved, path); !s.ok()) return refuse("learner.init_from: " + s.message());
      // The saved architecture: widths, encoder and critic input. A critic on the observation serves (or
      // fine-tunes) an env with a state too, the state checked but unused; a critic on a state needs that state.
      const auto& saved_state = initial->options().global_state;
      if (saved_state && saved_state != hs.global_state)
        return refuse(fmt::format("learner.init_from: the policy in {} has a critic on the global state {}, but this "
                                  "worker's env has {}",
                                  config.learner.init_from, saved_state->ToString(),
                                  hs.global_state ? "global state " + hs.global_state->ToString()
                                                  : std::string("no global state")));
      hidden = initial->hidden_sizes();
      options = initial->options();
      spdlog::info("starting from {} (encoder {}, critic on {})", path, EncoderName(options.encoder),
                   options.global_state ? "the global state" : "the observation");
    }
    try {
      acting = ActorCritic(obs, act, hidden, options);
      training = ActorCritic(obs, act, hidden, options);
    } catch (const std::exception& e) {
      // The config cannot fit this env (e.g. ppo.encoder cnn on a vector observation): every worker would be.
      FailStart(fmt::format("cannot build the policy: {}", e.what()));
      return refuse(stop_reason);
    }
    obs_space = obs;
    action_space = act;
    state_space = hs.global_state;
    num_agents = hs.num_agents;
    use_state = options.global_state.has_value();
    env_name = h.env_name();
    obs_shape = obs.shape;
    if (use_state) state_shape = options.global_state->shape;
    if (initial) training->CopyFrom(*initial);
    acting->CopyFrom(*training);
    acting->to(device);
    training->to(device);
    acting->eval();
    if (config.learner.cuda_graphs && !config.learner.random_actions) {
      if (auto s = GraphedActor::Create(acting, device, precision, obs_shape, config.learner.deterministic, &graphed,
                                        state_shape);
          !s.ok()) {
        FailStart(s.message());
        return refuse(s.message());
      }
    }
    WarmUp();
    try {
      trainer = std::make_unique<PpoTrainer>(training, config.ppo, config.seed, precision);
    } catch (const std::invalid_argument& e) {  // ppo.fused_update on for a policy it cannot train
      FailStart(e.what());
      return refuse(stop_reason);
    }
    if (config.learner.resume) {
      if (auto s = Resume(); !s.ok()) {
        spdlog::error("resume: {}", s.message());
        FailStart("resume failed: " + s.message());
        return refuse("the learner could not resume: " + s.message());
      }
      torch::NoGradGuard no_grad;
      acting->CopyFrom(*training);
      // Only now that the checkpoint has loaded: the run's config with this session's overrides.
      if (auto s = WriteFileAtomic(run_dir + "/config.yaml", DumpConfig(config)); !s.ok())
        spdlog::error("{}", s.message());
    }
    if (auto s = WriteFileAtomic(run_dir + "/policy_spec.json", PolicySpecJson(obs, act, hidden, options));
        !s.ok())
      spdlog::error("{}", s.message());  // eval/export will say the file is missing; training goes on
    store = std::make_unique<TrajectoryStore>(config.ppo.rollout_length, obs.numel(), act,
                                              use_state ? options.global_state->numel() : 0,
                                              static_cast<int>(num_agents));
    spdlog::info("env {}: observation {}, action {}, {} agent(s) per env, global state {}; policy on {} (encoder "
                 "{}, critic on {})",
                 env_name, obs.ToString(), act.ToString(), num_agents,
                 state_space ? state_space->ToString() : std::string("none"), device.str(),
                 EncoderName(options.encoder), use_state ? "the global state" : "the observation");
  } else if (h.env_name() != env_name || obs != *obs_space || act != *action_space) {
    return refuse(fmt::format("env {} with observation {} and action {} does not match this run's {} ({}, {})",
                              h.env_name(), obs.ToString(), act.ToString(), env_name, obs_space->ToString(),
                              action_space->ToString()));
  } else if (hs.num_agents != num_agents || hs.global_state != state_space) {
    return refuse(fmt::format("env {} has {} agent(s) per env and global state {}, but this run's workers have {} and "
                              "{}",
                              h.env_name(), hs.num_agents,
                              hs.global_state ? hs.global_state->ToString() : std::string("none"), num_agents,
                              state_space ? state_space->ToString() : std::string("none")));
  }
  WorkerState ws;
  ws.identity = w.identity;
  ws.group_size = static_cast<int>(hs.group_rows);  // a multi-agent env's agents are rows of their own
  ws.group_envs = static_cast<int>(hs.group_size);
  for (uint32_t g = 0; g < h.num_groups(); ++g) ws.store_group.push_back(store->AddGroup(ws.group_size));
  ws.next_seq.assign(h.num_groups(), 0);
  ws.acted.assign(h.num_groups(), 0);
  ws.last_seen = Clock::now();
  total_groups += static_cast<int>(h.num_groups());
  workers.emplace(w.identity, std::move(ws));
  welcome->set_accepted(true);
  welcome->set_policy_version(static_cast<uint64_t>(version));
  welcome->set_heartbeat_interval_s(config.transport.heartbeat_interval_s);
  welcome->set_heartbeat_timeout_s(config.transport.heartbeat_timeout_s);
  if (normalization.any()) FillNormalizer(welcome->mutable_normalizer());  // a rejoin, a resume, a served policy
  Reply(w.identity, reply);
  spdlog::info("worker {} joined: {} envs in {} groups ({} workers, {} agent rows)", w.identity, h.num_envs(),
               h.num_groups(), workers.size(), store->num_envs());
  if (static_cast<int>(workers.size()) == config.learner.min_workers) ReleaseParked();
}

// The checks themselves need no LibTorch (common/wire.h), so tests/fuzz feeds them arbitrary bytes.
Status Learner::Impl::ValidateStep(const WorkerState& ws, const wire::StepRequest& req) const {
  if (auto s = CheckStepRequest(req, ws.group_size, obs_shape, ws.next_seq); !s.ok()) return s;
  if (auto s = CheckStepGlobalState(req, ws.group_size, num_agents, state_space ? &state_space->shape : nullptr);
      !s.ok())
    return s;
  // Truncated envs' final observations (and states) come as whole envs: the critic runs once per env.
  return CheckStepWholeEnvs(req, num_agents);
}

void Learner::Impl::ConsumeOutcome(WorkerState& ws, const wire::StepRequest& req) {
  if (recording) {
    store->RecordOutcome(ws.store_group[req.group()], reinterpret_cast<const float*>(req.reward().data().data()),
                         reinterpret_cast<const uint8_t*>(req.terminated().data()),
                         reinterpret_cast<const uint8_t*>(req.truncated().data()));
  }
  env_steps += ws.group_envs;  // env steps, not agent rows: what users compare (agent_steps = env_steps x agents)
  interval_steps += ws.group_envs;
  for (const auto& ep : req.episodes()) window.Add(ep.episode_return(), ep.length());
  if (!solved_at_steps && config.target_return && window.full() && window.mean_return() >= *config.target_return) {
    solved_at_steps = env_steps;
    solved_at_seconds = Wall();
    solved_at_unix = UnixNow();
    spdlog::info("target {} reached: mean return {:.1f} over 100 episodes at {} steps, {:.1f} s",
                 *config.target_return, window.mean_return(), env_steps, *solved_at_seconds);
  }
}

// Runs one forward pass over every request's observations (and the final
// observations of truncated envs), then records, parks or replies.
void Learner::Impl::ServeSteps(std::vector<Work*>& steps) {
  int64_t rows = 0;
  for (Work* w : steps) rows += w->rows + w->msg.step().final_obs_index_size();
  torch::Tensor action, logp, value;
  const auto t0 = Clock::now();
  if (config.learner.random_actions) {
    RandomActions(rows, &action, &logp, &value);
  } else {
    Forward(steps, rows, &action, &logp, &value);
  }
  const auto t1 = Clock::now();
  forward_s += Seconds(t1 - t0);
  ++batches;
  batch_rows += rows;
  Respond(steps, action, logp, value);
  serve_s += Seconds(Clock::now() - t1);
}

void Learner::Impl::RandomActions(int64_t rows, torch::Tensor* action, torch::Tensor* logp, torch::Tensor* value) {
  if (action_space->is_discrete()) {
    *action = torch::randint(action_space->n, {rows}, random_gen, torch::kInt64);
  } else if (action_space->is_multi_discrete()) {
    // Component i uniform in [0, nvec[i]): floor(u * nvec[i]), u in [0, 1) (clamped against rounding up).
    const auto& nvec = action_space->nvec;
    const auto k = static_cast<int64_t>(nvec.size());
    const torch::Tensor n = torch::tensor(nvec, torch::kInt64);
    *action = torch::minimum((torch::rand({rows, k}, random_gen, torch::kFloat64) * n).to(torch::kInt64), n - 1);
  } else {
    std::vector<int64_t> shape{rows};
    shape.insert(shape.end(), action_space->shape.begin(), action_space->shape.end());
    auto low = torch::from_blob(action_space->low.data(), action_space->shape, torch::kFloat32);
    auto high = torch::from_blob(action_space->high.data(), action_space->shape, torch::kFloat32);
    *action = low + (high - low) * torch::rand(shape, random_gen, torch::kFloat32);
  }
  *logp = torch::zeros({rows});
  *value = torch::zeros({rows});
}

void Learner::Impl::Forward(const std::vector<Work*>& steps, int64_t rows, torch::Tensor* action, torch::Tensor* logp,
                            torch::Tensor* value) {
  const int64_t obs_numel = obs_space->numel();
  if (!batch_obs.defined() || batch_obs.size(0) < rows) {
    auto opts = torch::TensorOptions().dtype(torch::kFloat32);
    batch_obs = torch::empty({std::max<int64_t>(rows, config.batcher.max_rows), obs_numel}, opts);
    if (device.is_cuda()) batch_obs = batch_obs.pin_memory();
  }
  float* dst = batch_obs.data_ptr<float>();
  for (Work* w : steps) {
    const auto& o = w->msg.step().obs().data();
    std::memcpy(dst, o.data(), o.size());
    dst += w->rows * obs_numel;
  }
  for (Work* w : steps) {
    const auto& o = w->msg.step().final_obs().data();
    if (w->msg.step().final_obs_index_size() > 0) {
      std::memcpy(dst, o.data(), o.size());
      dst += w->msg.step().final_obs_index_size() * obs_numel;
    }
  }
  // The critic's global states in the same order: each request's, then the final ones, one per env as they
  // come (the critic runs once per env; the CUDA graphs, whose buckets are powers of two, take one per row, so
  // for them each env's state is repeated for its agents). Serving without training needs only the actor: no
  // states, no critic (the graphs were captured with them, so they keep them).
  torch::Tensor state;
  if (use_state && (recording || graphed)) {
    const int64_t state_numel = state_space->numel();
    const int64_t per = graphed ? 1 : num_agents;
    const int64_t state_rows = rows / per;  // requests and final_obs_index hold whole envs
    if (!batch_state.defined() || batch_state.size(0) < state_rows) {
      auto opts = torch::TensorOptions().dtype(torch::kFloat32);
      batch_state = torch::empty({std::max<int64_t>(state_rows, config.batcher.max_rows / per), state_numel}, opts);
      if (device.is_cuda()) batch_state = batch_state.pin_memory();
    }
    float* sdst = batch_state.data_ptr<float>();
    const std::size_t env_bytes = sizeof(float) * static_cast<std::size_t>(state_numel);
    auto copy_envs = [&](const std::string& bytes, int64_t envs) {
      if (!graphed) {
        std::memcpy(sdst, bytes.data(), static_cast<std::size_t>(envs) * env_bytes);
        sdst += envs * state_numel;
        return;
      }
      for (int64_t e = 0; e < envs; ++e)
        for (uint32_t a = 0; a < num_agents; ++a, sdst += state_numel)
          std::memcpy(sdst, bytes.data() + e * env_bytes, env_bytes);
    };
    for (Work* w : steps) copy_envs(w->msg.step().global_state().data(), w->rows / num_agents);
    for (Work* w : steps)
      copy_envs(w->msg.step().final_global_state().data(), w->msg.step().final_obs_index_size() / num_agents);
    std::vector<int64_t> sshape{state_rows};
    sshape.insert(sshape.end(), state_shape.begin(), state_shape.end());
    state = batch_state.narrow(0, 0, state_rows).view(sshape);
  }

  {
    c10::InferenceMode guard;
    torch::Tensor obs = batch_obs.narrow(0, 0, rows);
    std::vector<int64_t> shape{rows};
    shape.insert(shape.end(), obs_shape.begin(), obs_shape.end());
    ActOutput out;
    if (graphed) {
      out = graphed->Act(obs.view(shape), state);  // copies the pinned rows in itself
    } else {
      // Per batch, not per thread: the cast cache must not outlive a weight update.
      AutocastGuard autocast(device, precision);
      if (device.is_cuda()) {
        obs = obs.to(device, /*non_blocking=*/true);
        if (state.defined()) state = state.to(device, /*non_blocking=*/true);
      }
      const auto generator_lock = LockCudaGenerator(device);  // sampling draws while the trainer may capture
      out = acting->Act(obs.view(shape), state, config.learner.deterministic);
    }
    *action = out.action.to(torch::kCPU).contiguous();
    *logp = out.logp.to(torch::kCPU, torch::kFloat32).contiguous();
    // Undefined only when serving a centralised critic's policy without states: values are used only to train.
    *value = out.value.defined() ? out.value.to(torch::kCPU, torch::kFloat32).contiguous() : torch::zeros({rows});
  }
}

// Records each request's step (or parks it) and replies with its actions.
void Learner::Impl::Respond(std::vector<Work*>& steps, const torch::Tensor& action, const torch::Tensor& logp,
                            const torch::Tensor& value) {
  // Discrete: int64 [rows]; multi-discrete: int64 [rows, K]; box: float [rows, shape...].
  const int64_t action_numel = action_space->numel();
  const bool integer = action_space->is_categorical();
  const std::size_t action_bytes = integer ? sizeof(int64_t) : sizeof(float);
  const auto* act_ptr = static_cast<const uint8_t*>(action.data_ptr());
  const float* logp_ptr = logp.data_ptr<float>();
  const float* value_ptr = value.data_ptr<float>();
  const bool hold = (recording && config.mode == "sync" && trainer_busy) ||
                    static_cast<int>(workers.size()) < config.learner.min_workers || stopping;

  int64_t row = 0;
  int64_t final_row = 0;
  for (Work* w : steps) final_row += w->rows;
  wire::Envelope reply;
  for (Work* w : steps) {
    WorkerState& ws = workers.at(w->identity);
    const auto& req = w->msg.step();
    const int g = ws.store_group[req.group()];
    // Truncated envs: add gamma * V(final obs) (V(final global state) for a centralised critic) to the reward
    // of their last step.
    for (int32_t i : req.final_obs_index()) {
      if (recording && config.ppo.bootstrap_truncated && w->kind == Work::Kind::kStep)
        store->AddReward(g, i, static_cast<float>(config.ppo.gamma) * value_ptr[final_row]);
      ++final_row;
    }
    if (recording && store->full(g)) {
      store->SetBootstrap(g, value_ptr + row);
      w->kind = Work::Kind::kReplay;
      parked.push_back(std::move(*w));
    } else if (hold) {
      w->kind = Work::Kind::kReplay;
      parked.push_back(std::move(*w));
    } else {
      if (recording)
        store->RecordStep(g, reinterpret_cast<const float*>(req.obs().data().data()),
                          act_ptr + row * action_numel * action_bytes, logp_ptr + row, value_ptr + row, version,
                          use_state ? reinterpret_cast<const float*>(req.global_state().data().data()) : nullptr);
      ws.acted[req.group()] = 1;
      auto* a = reply.mutable_action();
      a->set_group(req.group());
      a->set_seq(req.seq());
      a->set_policy_version(static_cast<uint64_t>(version));
      // A request that brought a statistics delta gets the merged statistics back (about once per rollout).
      if (req.has_stats_delta() && normalization.any()) {
        FillNormalizer(a->mutable_normalizer());
      } else {
        a->clear_normalizer();
      }
      std::vector<int64_t> shape{w->rows};
      shape.insert(shape.end(), action_space->shape.begin(), action_space->shape.end());
      SetTensor(a->mutable_action(), integer ? DType::kInt64 : DType::kFloat32, shape,
                act_ptr + row * action_numel * action_bytes,
                static_cast<std::size_t>(w->rows * action_numel) * action_bytes);
      if (!integer) {
        // The env gets the action clipped to its bounds; the store keeps the unclipped sample, whose
        // log-prob the PPO ratio needs.
        auto* out = reinterpret_cast<float*>(a->mutable_action()->mutable_data()->data());
        const auto& lo = action_space->low;
        const auto& hi = action_space->high;
        for (int64_t i = 0; i < w->rows * action_numel; ++i) {
          const auto k = static_cast<std::size_t>(i % action_numel);
          out[i] = std::min(std::max(out[i], lo[k]), hi[k]);
        }
      }
      Reply(w->identity, reply);
    }
    row += w->rows;
  }
}

void Learner::Impl::ProcessBatch(std::vector<Work>& batch) {
  std::vector<Work*> steps;
  steps.reserve(batch.size());
  for (Work& w : batch) {
    switch (w.kind) {
      case Work::Kind::kHello:
        OnHello(w);
        break;
      case Work::Kind::kStop:
        if (!stopping) {
          stopping = true;
          stop_reason = RequestedStopReason();
        }
        break;
      case Work::Kind::kTrainerDone:
        OnTrainerDone(*w.result);
        break;
      case Work::Kind::kHeartbeat: {
        auto it = workers.find(w.identity);
        if (it == workers.end()) {
          ReplyError(w.identity, "Heartbeat from a worker that never said hello (or was dropped as silent)", nullptr,
                     wire::Error::UNKNOWN_WORKER);
          break;
        }
        it->second.last_seen = Clock::now();
        wire::Envelope beat;
        beat.mutable_heartbeat();
        Reply(w.identity, beat);
        break;
      }
      case Work::Kind::kStep: {
        auto it = workers.find(w.identity);
        if (it == workers.end()) {
          ReplyError(w.identity, "StepRequest from a worker that never said hello (or was dropped as silent)",
                     &w.msg.step(), wire::Error::UNKNOWN_WORKER);
          break;
        }
        it->second.last_seen = Clock::now();
        if (auto s = ValidateStep(it->second, w.msg.step()); !s.ok()) {
          ReplyError(w.identity, s.message(), &w.msg.step());
          break;
        }
        const auto& req = w.msg.step();
        if (!req.first() && !it->second.acted[req.group()]) {
          ReplyError(w.identity, fmt::format("group {}: step results before the learner sent actions", req.group()),
                     &req);
          break;
        }
        if (req.has_stats_delta()) {
          if (auto s = MergeStatsDelta(req.stats_delta()); !s.ok()) {
            ReplyError(w.identity, s.message(), &req);
            break;
          }
        }
        if (!AdmitNonFinite(it->second, w)) break;
        it->second.acted[req.group()] = 0;
        ++it->second.next_seq[req.group()];
        if (!req.first()) ConsumeOutcome(it->second, req);
        steps.push_back(&w);
        break;
      }
      case Work::Kind::kReplay:
        if (workers.count(w.identity)) steps.push_back(&w);  // else its worker was dropped meanwhile
        break;
    }
  }
  if (!steps.empty()) ServeSteps(steps);
  MaybeHandOff();
  CheckStop();
  UpdateReadyHint();
  ShowProgress(false);
}

void Learner::Impl::MaybeHandOff() {
  if (!store || !store->all_full() || trainer_busy || stopping) return;
  TrainJob job;
  LagStats lag;
  job.rollout = store->Take(obs_shape, version, &lag, state_shape);
  if (!use_state) job.rollout.rows_per_state = 1;  // units of one row: minibatches need not keep an env's agents
  last_lag = lag;
  // The schedule's progress when this rollout began (CleanRL: frac = 1 - (update - 1) / updates): the first
  // update runs at the full learning rate and the last one at lr / updates, not at 0.
  job.progress =
      std::min(1.0, static_cast<double>(handoff_env_steps) / static_cast<double>(config.total_env_steps));
  handoff_env_steps = env_steps;
  job.version = version;
  job.checkpoint = config.learner.checkpoint_every > 0 && (updates + 1) % config.learner.checkpoint_every == 0;
  job.counters = TrainingCounters{env_steps, updates + 1, version + 1, window.total_episodes(), Wall()};
  if (job.checkpoint) job.state = CaptureRunState();
  trainer_busy = true;
  if (!jobs.Send(std::move(job)).ok()) return;
  // async: keep acting with the current snapshot while the trainer works.
  if (config.mode == "async") ReleaseParked();
}

void Learner::Impl::ReleaseParked() {
  for (auto it = parked.rbegin(); it != parked.rend(); ++it) {
    if (!batcher.PushFront(std::move(*it)).ok()) break;
  }
  parked.clear();
}

void Learner::Impl::OnTrainerDone(const TrainResult& r) {
  trainer_busy = false;
  ++updates;
  update_s += r.update_seconds;
  last_stats = r.stats;
  {
    torch::NoGradGuard no_grad;
    acting->CopyFrom(*training);
    // The trainer may start its next update (on its own stream) as soon as the next hand-off: the copies
    // must have read `training` by then.
    SynchronizeCurrentStream(device);
  }
  version = r.version;
  const double wall = Wall();
  nlohmann::json row = {
      {"env_steps", env_steps},
      {"agent_steps", env_steps * num_agents},
      {"wall_seconds", wall},
      {"sps", wall > 0 ? static_cast<double>(env_steps) / wall : 0.0},
      {"episodes", window.total_episodes()},
      {"mean_return_100", window.empty() ? nlohmann::json(nullptr) : nlohmann::json(window.mean_return())},
      {"mean_length_100", window.empty() ? nlohmann::json(nullptr) : nlohmann::json(window.mean_length())},
      {"policy_version", version},
      {"update", updates},
      {"update_seconds", r.update_seconds},
      {"policy_lag_min", last_lag.min},
      {"policy_lag_avg", last_lag.avg},
      {"policy_lag_max", last_lag.max},
      {"batch_rows_avg", batches ? static_cast<double>(batch_rows) / static_cast<double>(batches) : 0.0},
      {"time_wait_seconds", wait_s},
      {"time_held_for_update_seconds", held_s},
      {"time_forward_seconds", forward_s},
      {"time_serve_seconds", serve_s},
      {"time_update_seconds", update_s},
      {"rss_mb", CurrentRssMb()},
      {"protocol_errors", errors + io_errors.load()},
      {"non_finite_rejected", non_finite_rejected},
      {"non_finite_sanitized", non_finite_sanitized},
  };
  for (const auto& [k, v] : r.stats.Items()) row[k] = std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
  metrics.Write(row);
  std::vector<std::pair<std::string, double>> scalars;
  for (const auto& [k, v] : row.items())
    if (v.is_number() && k != "env_steps" && k != "agent_steps") scalars.emplace_back(k, v.get<double>());
  tensorboard->AddScalars(scalars, env_steps, UnixNow());
  if (!std::isfinite(r.stats.policy_loss)) {
    stopping = true;
    update_failed = true;
    stop_reason = "the PPO update failed (non-finite loss or parameters)";
  }
  // Requests held for this update (sync), or a full rollout waiting for the trainer (async).
  if (store->all_full()) {
    MaybeHandOff();
  } else if (config.mode == "sync") {
    ReleaseParked();
  }
  ShowProgress(false);
}

void Learner::Impl::CheckStop() {
  if (!stopping) {
    if (env_steps >= config.total_env_steps) {
      stopping = true;
      stop_reason = fmt::format("reached total_env_steps ({})", config.total_env_steps);
    } else if (config.stop_at_target && solved_at_steps) {
      stopping = true;
      stop_reason = fmt::format("reached target_return ({})", *config.target_return);
    } else if (config.max_wall_seconds > 0 && Seconds(Clock::now() - start) >= config.max_wall_seconds) {
      stopping = true;
      stop_reason = fmt::format("reached max_wall_seconds ({})", config.max_wall_seconds);
    } else if (stop_requested.load()) {
      // Seen before the kStop item that RequestStop queued (a busy learner checks after every batch).
      stopping = true;
      stop_reason = RequestedStopReason();
    }
  }
}

// Continues run_dir: the latest checkpoint's policy, optimizer, loss-scaler
// state, counters (env steps, updates, policy version, episodes, wall time)
// and run state (random generators, episode window, when the target was
// reached). What an older checkpoint lacks starts afresh, with a warning.
Status Learner::Impl::Resume() {
  const std::string dir = run_dir + "/checkpoints";
  std::string path;
  std::vector<std::string> skipped;
  const Status found = FindLatestValidCheckpoint(dir, &path, &skipped);
  for (const auto& why : skipped) spdlog::warn("resume: skipping {}; using an older checkpoint", why);
  if (!found.ok()) return found;
  TrainingCounters c;
  RunState state;
  if (auto s = LoadCheckpoint(path, training, &trainer->optimizer(), &c, &trainer->scaler(), &state); !s.ok())
    return s;
  env_steps = c.env_steps;
  handoff_env_steps = c.env_steps;  // the schedule goes on from here
  updates = c.updates;
  version = c.policy_version;
  wall_offset = c.wall_seconds;
  window.Restore(state.episode_returns, state.episode_lengths, c.episodes);
  solved_at_steps = state.solved_at_steps;
  solved_at_seconds = state.solved_at_seconds;
  solved_at_unix = state.solved_at_unix;
  if (!state.has_normalizer && normalization.any())
    spdlog::warn("resume: {} holds no normaliser statistics (written before checkpoints stored them); they start "
                 "afresh",
                 path);
  if (state.has_normalizer && normalization.any()) {
    // What the checkpoint's run normalised (its config may have differed): restored where the sizes agree.
    const bool obs_ok = !normalization.obs || state.normalizer_obs.dim() == norm_obs.dim();
    const bool ret_ok = !normalization.reward || state.normalizer_ret.dim() == norm_ret.dim();
    if (obs_ok && normalization.obs) norm_obs = state.normalizer_obs;
    if (ret_ok && normalization.reward) norm_ret = state.normalizer_ret;
    if (!obs_ok || !ret_ok)
      spdlog::warn("resume: {} holds no {} statistics (its run did not normalise them); they start afresh", path,
                   !obs_ok ? "observation" : "return");
  }

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
  restore(kRngTrainer, trainer->generator());
  restore(kRngRandomActions, random_gen);
  restore(kRngTorchCpu, at::detail::getDefaultCPUGenerator());
#ifdef FARM_WITH_CUDA
  if (device.is_cuda()) restore(kRngTorchCuda, at::globalContext().defaultGenerator(device));
#endif
  if (!missing.empty())
    spdlog::warn("resume: {} has no {} (written by an older version): {}", path, fmt::join(missing, ", "),
                 "those start afresh (generators from the seed, an empty window)");
  if (!state.config_yaml.empty()) {
    try {
      const auto changes = ConfigChanges(state.config_yaml, DumpConfig(config));
      if (!changes.empty())
        spdlog::info("resume: config keys changed since the checkpoint: {}", fmt::join(changes, "; "));
    } catch (const YAML::Exception& e) {
      spdlog::warn("resume: {}: the stored config is not valid YAML ({}); not compared", path, e.what());
    }
  }
  spdlog::info("resumed {}: {} env steps, {} updates, policy version {}, {} episodes (window of {}, mean return "
               "{}), {:.1f} s of wall time before",
               path, env_steps, updates, version, window.total_episodes(), window.count(),
               window.empty() ? std::string("-") : fmt::format("{:.2f}", window.mean_return()), wall_offset);
  return Status::Ok();
}

// Everything but weights, optimizer and counters that a checkpoint needs to continue exactly (the trainer's
// generator is added by whoever owns the trainer at that moment).
RunState Learner::Impl::CaptureRunState() {
  RunState s;
  s.rng[kRngRandomActions] = GeneratorState(random_gen);
  torch::Generator cpu = at::detail::getDefaultCPUGenerator();
  s.rng[kRngTorchCpu] = GeneratorState(cpu);
#ifdef FARM_WITH_CUDA
  if (device.is_cuda()) {
    torch::Generator cuda = at::globalContext().defaultGenerator(device);
    s.rng[kRngTorchCuda] = GeneratorState(cuda);
  }
#endif
  s.has_episode_window = true;
  s.episode_returns = window.returns();
  s.episode_lengths = window.lengths();
  s.solved_at_steps = solved_at_steps;
  s.solved_at_seconds = solved_at_seconds;
  s.solved_at_unix = solved_at_unix;
  s.config_yaml = DumpConfig(config);
  s.has_normalizer = true;  // empty moments when normalisation is off
  s.normalizer_obs = norm_obs;
  s.normalizer_ret = norm_ret;
  return s;
}

// learner.init_from: the statistics the policy was trained with. A policy trained on normalised observations
// needs them (and a run that normalises needs a policy trained so); return statistics start afresh when absent.
Status Learner::Impl::InitNormalizerFrom(const FarmConfig& saved, const std::string& checkpoint) {
  if (saved.env.normalize_obs != config.env.normalize_obs)
    return Status::InvalidArgument(fmt::format(
        "the policy in {} was trained with env.normalize_obs {}, but this run has {}: it would see observations "
        "unlike those it learned from",
        config.learner.init_from, saved.env.normalize_obs, config.env.normalize_obs));
  if (!normalization.any()) return Status::Ok();
  RunningMoments obs, ret;
  if (auto s = ReadCheckpointNormalizer(checkpoint, &obs, &ret); !s.ok()) {
    if (s.code() != Status::Code::kNotFound || normalization.obs) return s;
    return Status::Ok();
  }
  if (normalization.obs) {
    if (obs.dim() != norm_obs.dim())
      return Status::InvalidArgument(fmt::format("{}: normalizer.obs has {} elements, the observation {}", checkpoint,
                                                 obs.dim(), norm_obs.dim()));
    norm_obs = std::move(obs);
  }
  if (normalization.reward && ret.dim() == 1) norm_ret = std::move(ret);
  spdlog::info("normaliser statistics from {}: {} observations, {} returns{}", checkpoint, norm_obs.count(),
               norm_ret.count(), recording ? "" : " (frozen)");
  return Status::Ok();
}

// A worker's StepRequest.stats_delta: checked, then merged into the run's statistics (unless frozen). A few
// hundred numbers per worker and rollout: no per-row work.
Status Learner::Impl::MergeStatsDelta(const wire::NormalizerStats& delta) {
  RunningMoments obs, ret;
  if (auto s = CheckNormalizerStats(delta, normalization.obs, norm_obs.dim(), normalization.reward,
                                    "StepRequest.stats_delta", &obs, &ret);
      !s.ok())
    return s;
  if (!recording) return Status::Ok();  // frozen: serving a trained policy's statistics as they are
  norm_obs.Merge(obs);
  norm_ret.Merge(ret);
  return Status::Ok();
}

void Learner::Impl::FillNormalizer(wire::NormalizerStats* out) const {
  out->Clear();
  if (normalization.obs) ToWire(norm_obs, out->mutable_obs());
  if (normalization.reward) ToWire(norm_ret, out->mutable_ret());
  out->set_frozen(!recording);
}

double Learner::Impl::Wall() const { return wall_offset + Seconds(Clock::now() - start); }

// learner.non_finite for a request that passed ValidateStep: true when it may be recorded and served (all
// finite, or sanitized); false when it was refused with an Error.
bool Learner::Impl::AdmitNonFinite(WorkerState& ws, Work& w) {
  NonFinite first;
  if (!FindNonFinite(w.msg.step(), &first)) return true;
  const bool in_state = first.field == "StepRequest.global_state" || first.field == "StepRequest.final_global_state";
  const std::string where = first.ToString(first.field == "StepRequest.obs" || first.field == "StepRequest.final_obs"
                                               ? obs_space->numel()
                                           : in_state && state_space ? state_space->numel()
                                                                     : 1);
  if (config.learner.non_finite == "reject") {
    ++non_finite_rejected;
    ReplyError(w.identity,
               fmt::format("worker {}: non-finite value {}; request refused, nothing recorded (learner.non_finite: "
                           "reject; 'sanitize' would replace such values by 0)",
                           w.identity, where),
               &w.msg.step());
    return false;
  }
  const int64_t replaced = SanitizeNonFinite(w.msg.mutable_step());
  non_finite_sanitized += replaced;
  ws.non_finite_unreported += replaced;
  const auto now = Clock::now();
  if (!ws.last_non_finite_warning || now - *ws.last_non_finite_warning >= kNonFiniteWarnInterval) {
    spdlog::warn("worker {}: replaced {} non-finite value(s) by 0 {} (this one: {}; learner.non_finite: sanitize)",
                 w.identity, ws.non_finite_unreported,
                 ws.last_non_finite_warning
                     ? fmt::format("in the last {:.0f} s", Seconds(now - *ws.last_non_finite_warning))
                     : std::string("in its first such request"),
                 where);
    ws.non_finite_unreported = 0;
    ws.last_non_finite_warning = now;
  }
  return true;
}

// Drops workers silent for longer than transport.heartbeat_timeout_s.
void Learner::Impl::CheckWorkers() {
  const auto now = Clock::now();
  if (Seconds(now - last_worker_check) < 0.5 * config.transport.heartbeat_interval_s) return;
  last_worker_check = now;
  std::vector<std::string> silent;
  for (const auto& [id, ws] : workers)
    if (Seconds(now - ws.last_seen) > config.transport.heartbeat_timeout_s) silent.push_back(id);
  for (const auto& id : silent)
    RemoveWorker(id, fmt::format("silent for more than {} s", config.transport.heartbeat_timeout_s));
}

// Forgets a worker: its partial trajectories leave the rollout, its held
// requests are dropped, and the others go on (the rollout may now be full).
void Learner::Impl::RemoveWorker(const std::string& identity, const std::string& why) {
  auto it = workers.find(identity);
  if (it == workers.end()) return;
  for (int g : it->second.store_group) store->RemoveGroup(g);
  total_groups -= static_cast<int>(it->second.store_group.size());
  parked.erase(std::remove_if(parked.begin(), parked.end(), [&](const Work& w) { return w.identity == identity; }),
               parked.end());
  workers.erase(it);
  ++workers_lost;
  spdlog::warn("dropped worker {}: {}; {} workers left", identity, why, workers.size());
  MaybeHandOff();
  UpdateReadyHint();
}

// One forward pass at the largest batch before serving, so that the first
// requests do not pay for allocator growth, kernel selection or lazy init.
void Learner::Impl::WarmUp() {
  const auto t0 = Clock::now();
  // As Forward batches them: with a centralised critic, one state per env (per row for the CUDA graphs).
  const int64_t per = use_state && !graphed ? num_agents : 1;
  const int64_t rows = std::max<int64_t>(per, config.batcher.max_rows / per * per);
  std::vector<int64_t> shape{rows};
  shape.insert(shape.end(), obs_shape.begin(), obs_shape.end());
  {
    c10::InferenceMode guard;
    torch::Tensor state;
    if (use_state && (recording || graphed)) {  // as Forward: serving needs no critic
      std::vector<int64_t> sshape{rows / per};
      sshape.insert(sshape.end(), state_shape.begin(), state_shape.end());
      state = torch::zeros(sshape, torch::TensorOptions().device(device));
    }
    if (graphed) {
      // Captures the largest bucket's graph now rather than on the first full batch.
      auto out = graphed->Act(torch::zeros(shape, torch::TensorOptions().device(device)), state);
      (void)out.action.to(torch::kCPU);
    } else {
      AutocastGuard autocast(device, precision);
      auto out = acting->Act(torch::zeros(shape, torch::TensorOptions().device(device)), state);
      (void)out.action.to(torch::kCPU);
    }
  }
  spdlog::debug("warm-up forward at batch {}: {:.1f} ms", config.batcher.max_rows, 1e3 * Seconds(Clock::now() - t0));
}

void Learner::Impl::UpdateReadyHint() {
  // Every group not parked may be waiting in the queue: once all of them are,
  // nobody else can arrive, so the batch goes at once.
  const int active = total_groups - static_cast<int>(parked.size());
  batcher.SetReadyItems(static_cast<std::size_t>(std::max(active, 1)));
}

void Learner::Impl::ShowProgress(bool force) {
  const auto now = Clock::now();
  const double since = Seconds(now - last_progress);
  if (!force && since < config.learner.progress_interval_s) return;
  const double wall = Seconds(now - start);
  const double interval = Seconds(now - interval_start);
  const double sps = interval > 0 ? static_cast<double>(interval_steps) / interval : 0;
  auto pct = [&](double v) { return 100.0 * v / std::max(wall, 1e-9); };
  progress.Show(fmt::format(
      "[{:7.1f}s] steps {:>10} | {:>8.0f} sps | return {:>7} | v{} | batch {:>6.1f} rows | learner time: wait-data "
      "{:4.1f}% infer {:4.1f}% serve {:4.1f}% update {:4.1f}%",
      wall, env_steps, sps, window.empty() ? std::string("-") : fmt::format("{:.1f}", window.mean_return()), version,
      batches ? static_cast<double>(batch_rows) / static_cast<double>(batches) : 0.0, pct(wait_s), pct(forward_s),
      pct(serve_s), pct(update_s)));
  last_progress = now;
  interval_start = now;
  interval_steps = 0;
}

nlohmann::json Learner::Impl::Summary() const {
  const double wall = Wall();
  auto opt = [](const auto& o) { return o ? nlohmann::json(*o) : nlohmann::json(nullptr); };
  return nlohmann::json{
      {"env", env_name},
      {"mode", config.mode},
      // Env steps (what total_env_steps, sps and solved_at_steps count); agent_steps = env_steps x num_agents,
      // the transitions PPO trains on.
      {"env_steps", env_steps},
      {"num_agents", num_agents},
      {"agent_steps", env_steps * num_agents},
      {"wall_seconds", wall},
      {"sps", wall > 0 ? static_cast<double>(env_steps) / wall : 0.0},
      {"agent_sps", wall > 0 ? static_cast<double>(env_steps * num_agents) / wall : 0.0},
      {"episodes", window.total_episodes()},
      {"mean_return_100", window.empty() ? nlohmann::json(nullptr) : nlohmann::json(window.mean_return())},
      {"target_return", opt(config.target_return)},
      {"solved_at_steps", opt(solved_at_steps)},
      {"solved_at_seconds", opt(solved_at_seconds)},
      {"updates", updates},
      // The update's implementation: fused (CPU), graphed (CUDA graphs; its first update is LibTorch's) or libtorch.
      {"update_path", !trainer                          ? "none"
                      : trainer->fused()                ? "fused"
                      : trainer->graphed_updates() > 0 ? "graphed"
                                                        : "libtorch"},
      {"graphed_updates", trainer ? trainer->graphed_updates() : int64_t{0}},
      {"policy_version", version},
      {"workers", workers.size() + static_cast<std::size_t>(workers_lost)},
      {"workers_active", workers.size()},
      {"num_envs", store ? store->num_envs() / num_agents : 0},  // the store holds a column per agent row
      {"protocol_errors", errors + io_errors.load()},
      {"non_finite_rejected", non_finite_rejected},
      {"non_finite_sanitized", non_finite_sanitized},
      {"connections_closed", connections_closed.load()},
      {"replies_dropped", replies_dropped.load()},
      {"workers_lost", workers_lost},
      {"auth_refused", zap ? zap->refused() : int64_t{0}},
      {"stop_reason", stop_reason},
      {"device", device.str()},
      {"precision", config.learner.precision},
      {"torch_version", TORCH_VERSION},
      {"start_unix", start_unix},
      {"solved_at_unix", opt(solved_at_unix)},
      {"max_rss_mb", MaxRssMb()},
      {"time_seconds",
       {{"wait_for_data", wait_s}, {"held_for_update", held_s}, {"forward", forward_s}, {"serve", serve_s},
        {"update", update_s}}},
  };
}

Status Learner::Run(nlohmann::json* summary) {
  Impl& m = *impl_;
  m.start = Clock::now();
  m.start_unix = UnixNow();
  spdlog::info("learner listening on {}; run directory {}", m.endpoint, m.run_dir);
  std::vector<Work> batch;
  while (true) {
    const auto t0 = Clock::now();
    const bool during_update = m.trainer_busy;
    const auto idle = std::chrono::milliseconds(
        std::max<int64_t>(1, static_cast<int64_t>(500 * m.config.transport.heartbeat_interval_s)));
    if (!m.batcher.NextBatch(&batch, idle).ok()) break;
    // Waiting while the trainer runs is the update's cost (sync mode), not a lack of data.
    (during_update ? m.held_s : m.wait_s) += Seconds(Clock::now() - t0);
    if (!m.serve_failure.ok()) {
      // Serving failed: nothing more is served (it would likely fail again); only the update in flight is awaited.
      batch.erase(std::remove_if(batch.begin(), batch.end(),
                                 [](const Work& w) { return w.kind != Work::Kind::kTrainerDone; }),
                  batch.end());
    }
    try {
      if (!batch.empty() && m.fail_next_batch.load() && m.fail_next_batch.exchange(false))
        throw std::runtime_error("injected fault (TEST_FailNextBatch)");
      m.CheckWorkers();
      m.ProcessBatch(batch);
    } catch (const std::exception& e) {
      const auto* torch_error = dynamic_cast<const c10::Error*>(&e);
      m.FailServing(torch_error ? torch_error->what_without_backtrace() : e.what());
    }
    if (m.stopping && !m.trainer_busy) break;
  }
  m.progress.Finish();
  spdlog::info("stopping: {}", m.stop_reason);
  // Nothing more is served: the I/O thread drops what arrives instead of blocking on a full batcher (which
  // would keep it from ever seeing the quit message below).
  m.shutting_down.store(true);
  m.batcher.Close();

  // Final checkpoint, unless the run never started or its last update diverged; then tell every worker to stop.
  // (Updates check their parameters only when they checkpoint: the last one is checked here.)
  try {  // after a LibTorch or CUDA error these may throw too: the workers must still hear Stop
    if (!m.update_failed && m.trainer && m.start_failure.ok() && !ParametersFinite(m.training)) {
      m.update_failed = true;
      m.stop_reason = "the PPO update failed (non-finite parameters)";
    }
    if (m.update_failed) {
      spdlog::error("no final checkpoint: the last update diverged; the newest checkpoint is the last good one");
    } else if (m.trainer && m.start_failure.ok()) {
      TrainingCounters c{m.env_steps, m.updates, m.version, m.window.total_episodes(), m.Wall()};
      RunState state = m.CaptureRunState();
      state.rng[kRngTrainer] = GeneratorState(m.trainer->generator());  // the trainer is idle: no update in flight
      std::string path;
      if (auto s = SaveCheckpoint(m.run_dir + "/checkpoints", m.training, m.trainer->optimizer(), c, &path,
                                  &m.trainer->scaler(), m.config.learner.keep_checkpoints, &state);
          !s.ok())
        spdlog::error("final checkpoint: {}", s.message());
      else
        spdlog::info("checkpoint written: {}", path);
    }
  } catch (const std::exception& e) {
    const auto* torch_error = dynamic_cast<const c10::Error*>(&e);
    spdlog::error("no final checkpoint: {}", torch_error ? torch_error->what_without_backtrace() : e.what());
  }
  wire::Envelope stop;
  stop.mutable_stop()->set_reason(m.stop_reason);
  for (const auto& [identity, ws] : m.workers) m.Reply(identity, stop);
  m.reply_push.send(zmq::message_t(), zmq::send_flags::none);  // tells the I/O thread to finish
  if (m.io_thread.joinable()) m.io_thread.join();
  if (!m.start_failure.ok()) return m.start_failure;  // the run directory stays as it was

  nlohmann::json s = m.Summary();
  if (auto st = WriteFileAtomic(m.run_dir + "/summary.json", s.dump(2) + "\n"); !st.ok()) return st;
  if (summary) *summary = s;
  if (m.update_failed) return Status::InvalidArgument(m.stop_reason + " (see metrics.jsonl; lower ppo.lr?)");
  return m.serve_failure;
}

}  // namespace farm
