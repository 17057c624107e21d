// The learner's three threads and the state machine of a rollout.
//
// All mutable training state (workers, trajectory store, counters, the
// acting policy) belongs to the inference thread; the I/O thread only
// decodes and forwards bytes, and the trainer thread only runs updates on
// rollouts it is handed. They meet through the batcher and channels, so no
// lock guards model state.
#include "learner/learner.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>
#include <unordered_map>
#include <zmq.hpp>
#include <zmq_addon.hpp>
#include <torch/version.h>
#include <unistd.h>
#include <ATen/CPUGeneratorImpl.h>

#include "common/channel.h"
#include "common/resources.h"
#include "common/transport.h"
#include "common/wire.h"
#include "common/tensorboard.h"
#include "learner/amp.h"
#include "learner/batcher.h"
#include "learner/checkpoint.h"
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
  std::string reason;
};

struct TrainJob {
  Rollout rollout;
  double progress = 0;
  int64_t version = 0;  // version of the policy being trained
  bool checkpoint = false;
  TrainingCounters counters;
};

struct WorkerState {
  std::string identity;
  int group_size = 0;
  std::vector<int> store_group;     // per worker group: group id in the store
  std::vector<uint64_t> next_seq;   // per worker group: expected seq
  std::vector<uint8_t> acted;       // per worker group: actions sent, results not yet received
  std::chrono::steady_clock::time_point last_seen;  // any message from it
};

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
  void ReplyError(const std::string& identity, const std::string& message, const wire::StepRequest* req);
  void ShowProgress(bool force);
  nlohmann::json Summary() const;
  void UpdateReadyHint();
  void WarmUp();
  void CheckWorkers();
  Status Resume();
  void RemoveWorker(const std::string& identity, const std::string& why);

  FarmConfig config;
  std::string run_dir;
  std::string endpoint;
  torch::Device device{torch::kCPU};
  Precision precision = Precision::kFp32;
  std::unique_ptr<TensorBoardWriter> tensorboard;

  zmq::context_t ctx{1};
  zmq::socket_t router;       // I/O thread only (after Create)
  zmq::socket_t reply_pull;   // I/O thread only
  zmq::socket_t reply_push;   // inference thread only
  std::string reply_endpoint;

  DynamicBatcher<Work> batcher;
  Channel<TrainJob> jobs;
  std::thread io_thread;
  std::thread trainer_thread;
  std::atomic<bool> stop_requested{false};

  // ---- inference-thread state ----
  const bool recording = config.learner.train && !config.learner.random_actions;
  torch::Generator random_gen = at::make_generator<at::CPUGeneratorImpl>(config.seed);
  std::unordered_map<std::string, WorkerState> workers;
  std::optional<Space> obs_space;
  std::optional<Space> action_space;
  std::string env_name;
  int total_groups = 0;
  ActorCritic acting{nullptr};    // the policy that answers requests
  ActorCritic training{nullptr};  // trained by the trainer thread (shared with it by handing jobs)
  std::unique_ptr<PpoTrainer> trainer;
  std::unique_ptr<TrajectoryStore> store;
  std::vector<Work> parked;  // requests held until a handoff or an update ends
  bool trainer_busy = false;
  bool stopping = false;
  std::string stop_reason;
  int64_t version = 0;  // policy version of `acting`
  int64_t updates = 0;
  int64_t env_steps = 0;
  EpisodeWindow window{100};
  std::optional<int64_t> solved_at_steps;
  std::optional<double> solved_at_seconds;
  LagStats last_lag;
  PpoStats last_stats;
  Clock::time_point start = Clock::now();
  double start_unix = UnixNow();
  torch::Tensor batch_obs;  // preallocated, grown as needed
  std::vector<int64_t> obs_shape;
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
  std::atomic<int64_t> io_errors{0};  // answered by the I/O thread (undecodable, unexpected type)
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

void Learner::RequestStop(const std::string& reason) {
  if (impl_->stop_requested.exchange(true)) return;
  Work w;
  w.kind = Work::Kind::kStop;
  w.reason = reason;
  (void)impl_->batcher.PushFront(std::move(w));  // Closed only when already shutting down
}

Status Learner::Create(const FarmConfig& config, std::unique_ptr<Learner>* out) {
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
  torch::set_num_threads(config.learner.threads);
  if (device.is_cuda()) {
    // fp32 matmuls may use TF32 tensor cores; convolutions pick their fastest algorithm.
    at::globalContext().setAllowTF32CuBLAS(true);
    at::globalContext().setAllowTF32CuDNN(true);
    at::globalContext().setBenchmarkCuDNN(true);
  }
  torch::manual_seed(config.seed);

  run_dir = config.run_dir.empty() ? fmt::format("runs/{}-{}", config.name, Timestamp()) : config.run_dir;
  std::error_code ec;
  std::filesystem::create_directories(run_dir + "/checkpoints", ec);
  if (ec) return Status::IoError(fmt::format("{}: cannot create run directory: {}", run_dir, ec.message()));
  if (auto s = WriteFileAtomic(run_dir + "/config.yaml", DumpConfig(config)); !s.ok()) return s;
  if (auto s = metrics.Open(run_dir + "/metrics.jsonl"); !s.ok()) return s;
  if (auto s = TensorBoardWriter::Open(run_dir + "/tb", &tensorboard); !s.ok()) return s;

  try {
    router = MakeRouter(ctx, config.transport, &endpoint);
  } catch (const zmq::error_t& e) {
    return Status::IoError(fmt::format("transport.bind: cannot bind {}: {}", config.transport.bind, e.what()));
  }
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

void Learner::Impl::IoLoop() {
  zmq::pollitem_t items[] = {{router.handle(), 0, ZMQ_POLLIN, 0}, {reply_pull.handle(), 0, ZMQ_POLLIN, 0}};
  std::vector<zmq::message_t> frames;
  std::string err_scratch;
  auto send_error = [&](const std::string& identity, const std::string& message) {
    io_errors.fetch_add(1);
    wire::Envelope e;
    e.mutable_error()->set_message(message);
    e.SerializeToString(&err_scratch);
    router.send(zmq::buffer(identity), zmq::send_flags::sndmore);
    router.send(zmq::buffer(err_scratch), zmq::send_flags::none);
  };
  try {
    while (true) {
      zmq::poll(items, 2, std::chrono::milliseconds(-1));
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
          spdlog::warn("bad message from {}: {}", identity, s.message());
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
          w.rows = shape.empty() ? 0 : shape[0];
        } else {
          send_error(w.identity, fmt::format("unexpected message type {} (expected Hello, StepRequest or Heartbeat)",
                                             static_cast<int>(w.msg.body_case())));
          continue;
        }
        if (!batcher.Push(std::move(w)).ok()) return;
      }
      if (items[1].revents & ZMQ_POLLIN) {
        frames.clear();
        if (!zmq::recv_multipart(reply_pull, std::back_inserter(frames), zmq::recv_flags::dontwait)) continue;
        if (frames.size() == 1 && frames[0].size() == 0) return;  // quit
        try {
          router.send(frames[0], zmq::send_flags::sndmore);
          router.send(frames[1], zmq::send_flags::none);
        } catch (const zmq::error_t& e) {
          if (e.num() != EHOSTUNREACH) throw;
          spdlog::warn("reply to {} dropped: the worker is gone", frames[0].to_string());
        }
      }
    }
  } catch (const zmq::error_t& e) {
    if (e.num() != ETERM) spdlog::error("learner I/O thread: {}", e.what());
  }
}

// ---------------------------------------------------------------- trainer

void Learner::Impl::TrainerLoop() {
  // OpenMP's thread count is a per-thread setting: set it here too, not only on the thread that ran Init.
  torch::set_num_threads(config.learner.threads);
  TrainJob job;
  while (jobs.Receive(&job).ok()) {
    auto result = std::make_shared<TrainResult>();
    const auto t0 = Clock::now();
    try {
      result->stats = trainer->Update(job.rollout, job.progress);
    } catch (const c10::Error& e) {
      spdlog::error("PPO update failed: {}", e.what_without_backtrace());
      result->stats.policy_loss = std::nan("");
    }
    result->update_seconds = Seconds(Clock::now() - t0);
    result->version = job.version + 1;
    if (job.checkpoint) {
      job.counters.policy_version = result->version;
      if (auto s = SaveCheckpoint(run_dir + "/checkpoints", training, trainer->optimizer(), job.counters, nullptr,
                                  &trainer->scaler(), config.learner.keep_checkpoints);
          !s.ok())
        spdlog::error("checkpoint: {}", s.message());
    }
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

void Learner::Impl::ReplyError(const std::string& identity, const std::string& message,
                               const wire::StepRequest* req) {
  ++errors;
  spdlog::warn("{}: {}", identity, message);
  wire::Envelope e;
  e.mutable_error()->set_message(message);
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
    spdlog::warn("refused {}: {}", w.identity, why);
    welcome->set_accepted(false);
    welcome->set_error(why);
    Reply(w.identity, reply);
  };
  if (h.protocol_version() != kProtocolVersion)
    return refuse(fmt::format("protocol version {} is not supported (expected {})", h.protocol_version(),
                              kProtocolVersion));
  if (workers.count(w.identity)) return refuse("this worker id already said hello");
  if (stopping) return refuse("the learner is stopping");
  if (h.num_groups() == 0 || h.num_envs() == 0 || h.num_envs() % h.num_groups() != 0)
    return refuse(fmt::format("num_envs ({}) must be a positive multiple of num_groups ({})", h.num_envs(),
                              h.num_groups()));
  Space obs, act;
  if (auto s = FromWire(h.observation(), &obs); !s.ok()) return refuse("observation space: " + s.message());
  if (auto s = FromWire(h.action(), &act); !s.ok()) return refuse("action space: " + s.message());
  if (obs.is_discrete() || obs.dtype != DType::kFloat32)
    return refuse("observation space must be a float32 box, got " + obs.ToString());
  if (!act.is_discrete() && act.dtype != DType::kFloat32)
    return refuse("action space must be discrete or a float32 box, got " + act.ToString());
  if (!obs_space) {
    std::vector<int> hidden = config.ppo.hidden_sizes;
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
      hidden = saved.ppo.hidden_sizes;
      spdlog::info("starting from {}", path);
    }
    obs_space = obs;
    action_space = act;
    env_name = h.env_name();
    obs_shape = obs.shape;
    acting = ActorCritic(obs, act, hidden);
    training = ActorCritic(obs, act, hidden);
    if (initial) training->CopyFrom(*initial);
    acting->CopyFrom(*training);
    acting->to(device);
    training->to(device);
    acting->eval();
    if (auto s = WriteFileAtomic(run_dir + "/policy_spec.json", PolicySpecJson(obs, act, hidden));
        !s.ok())
      spdlog::error("{}", s.message());  // eval/export will say the file is missing; training goes on
    WarmUp();
    trainer = std::make_unique<PpoTrainer>(training, config.ppo, config.seed, precision);
    if (config.learner.resume) {
      if (auto s = Resume(); !s.ok()) {
        spdlog::error("resume: {}", s.message());
        stopping = true;
        stop_reason = "resume failed: " + s.message();
        return refuse("the learner could not resume: " + s.message());
      }
      torch::NoGradGuard no_grad;
      acting->CopyFrom(*training);
    }
    store = std::make_unique<TrajectoryStore>(config.ppo.rollout_length, obs.numel(),
                                              act.is_discrete() ? 0 : act.numel());
    spdlog::info("env {}: observation {}, action {}; policy on {}", env_name, obs.ToString(), act.ToString(),
                 device.str());
  } else if (h.env_name() != env_name || obs != *obs_space || act != *action_space) {
    return refuse(fmt::format("env {} with observation {} and action {} does not match this run's {} ({}, {})",
                              h.env_name(), obs.ToString(), act.ToString(), env_name, obs_space->ToString(),
                              action_space->ToString()));
  }
  WorkerState ws;
  ws.identity = w.identity;
  ws.group_size = static_cast<int>(h.num_envs() / h.num_groups());
  for (uint32_t g = 0; g < h.num_groups(); ++g) ws.store_group.push_back(store->AddGroup(ws.group_size));
  ws.next_seq.assign(h.num_groups(), 0);
  ws.acted.assign(h.num_groups(), 0);
  ws.last_seen = Clock::now();
  total_groups += static_cast<int>(h.num_groups());
  workers.emplace(w.identity, std::move(ws));
  welcome->set_accepted(true);
  welcome->set_policy_version(static_cast<uint64_t>(version));
  Reply(w.identity, reply);
  spdlog::info("worker {} joined: {} envs in {} groups ({} workers, {} envs)", w.identity, h.num_envs(),
               h.num_groups(), workers.size(), store->num_envs());
  if (static_cast<int>(workers.size()) == config.learner.min_workers) ReleaseParked();
}

Status Learner::Impl::ValidateStep(const WorkerState& ws, const wire::StepRequest& req) const {
  if (req.group() >= ws.store_group.size())
    return Status::Protocol(fmt::format("group {} out of range (worker has {} groups)", req.group(),
                                        ws.store_group.size()));
  const uint64_t expected = ws.next_seq[req.group()];
  if (req.seq() != expected)
    return Status::Protocol(fmt::format("group {}: seq {} out of order (expected {})", req.group(), req.seq(),
                                        expected));
  if (req.first() != (req.seq() == 0))
    return Status::Protocol(fmt::format("group {}: 'first' must be set exactly on seq 0", req.group()));
  const int64_t n = ws.group_size;
  std::vector<int64_t> shape{n};
  shape.insert(shape.end(), obs_shape.begin(), obs_shape.end());
  if (auto s = CheckTensor(req.obs(), DType::kFloat32, shape, "StepRequest.obs"); !s.ok()) return s;
  if (req.first()) return Status::Ok();
  if (auto s = CheckTensor(req.reward(), DType::kFloat32, {n}, "StepRequest.reward"); !s.ok()) return s;
  if (static_cast<int64_t>(req.terminated().size()) != n || static_cast<int64_t>(req.truncated().size()) != n)
    return Status::Protocol(fmt::format("terminated/truncated: expected {} bytes each, got {}/{}", n,
                                        req.terminated().size(), req.truncated().size()));
  const int64_t k = req.final_obs_index_size();
  if (k > 0) {
    shape[0] = k;
    if (auto s = CheckTensor(req.final_obs(), DType::kFloat32, shape, "StepRequest.final_obs"); !s.ok()) return s;
    for (int32_t i : req.final_obs_index())
      if (i < 0 || i >= n) return Status::Protocol(fmt::format("final_obs_index {} out of range [0, {})", i, n));
  }
  return Status::Ok();
}

void Learner::Impl::ConsumeOutcome(WorkerState& ws, const wire::StepRequest& req) {
  if (recording) {
    store->RecordOutcome(ws.store_group[req.group()], reinterpret_cast<const float*>(req.reward().data().data()),
                         reinterpret_cast<const uint8_t*>(req.terminated().data()),
                         reinterpret_cast<const uint8_t*>(req.truncated().data()));
  }
  env_steps += ws.group_size;
  interval_steps += ws.group_size;
  for (const auto& ep : req.episodes()) window.Add(ep.episode_return(), ep.length());
  if (!solved_at_steps && config.target_return && window.full() && window.mean_return() >= *config.target_return) {
    solved_at_steps = env_steps;
    solved_at_seconds = Seconds(Clock::now() - start);
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

  {
    c10::InferenceMode guard;
    // Per batch, not per thread: the cast cache must not outlive a weight update.
    AutocastGuard autocast(device, precision);
    torch::Tensor obs = batch_obs.narrow(0, 0, rows);
    if (device.is_cuda()) obs = obs.to(device, /*non_blocking=*/true);
    std::vector<int64_t> shape{rows};
    shape.insert(shape.end(), obs_shape.begin(), obs_shape.end());
    ActOutput out = acting->Act(obs.view(shape), config.learner.deterministic);
    *action = out.action.to(torch::kCPU).contiguous();
    *logp = out.logp.to(torch::kCPU, torch::kFloat32).contiguous();
    *value = out.value.to(torch::kCPU, torch::kFloat32).contiguous();
  }
}

// Records each request's step (or parks it) and replies with its actions.
void Learner::Impl::Respond(std::vector<Work*>& steps, const torch::Tensor& action, const torch::Tensor& logp,
                            const torch::Tensor& value) {
  const int64_t action_numel = action_space->is_discrete() ? 1 : action_space->numel();
  const std::size_t action_bytes = action_space->is_discrete() ? sizeof(int64_t) : sizeof(float);
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
    // Truncated envs: add gamma * V(final obs) to the reward of their last step.
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
                          act_ptr + row * action_numel * action_bytes, logp_ptr + row, value_ptr + row, version);
      ws.acted[req.group()] = 1;
      auto* a = reply.mutable_action();
      a->set_group(req.group());
      a->set_seq(req.seq());
      a->set_policy_version(static_cast<uint64_t>(version));
      std::vector<int64_t> shape{w->rows};
      if (!action_space->is_discrete()) shape.insert(shape.end(), action_space->shape.begin(), action_space->shape.end());
      SetTensor(a->mutable_action(), action_space->is_discrete() ? DType::kInt64 : DType::kFloat32, shape,
                act_ptr + row * action_numel * action_bytes,
                static_cast<std::size_t>(w->rows * action_numel) * action_bytes);
      if (!action_space->is_discrete()) {
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
          stop_reason = w.reason;
        }
        break;
      case Work::Kind::kTrainerDone:
        OnTrainerDone(*w.result);
        break;
      case Work::Kind::kHeartbeat: {
        auto it = workers.find(w.identity);
        if (it == workers.end()) {
          ReplyError(w.identity, "Heartbeat from a worker that never said hello (or was dropped as silent)", nullptr);
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
                     &w.msg.step());
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
  job.rollout = store->Take(obs_shape, version, &lag);
  last_lag = lag;
  job.progress = std::min(1.0, static_cast<double>(env_steps) / static_cast<double>(config.total_env_steps));
  job.version = version;
  job.checkpoint = config.learner.checkpoint_every > 0 && (updates + 1) % config.learner.checkpoint_every == 0;
  job.counters = TrainingCounters{env_steps, updates + 1, version + 1, window.total_episodes(),
                                  Seconds(Clock::now() - start)};
  if (device.is_cuda()) {
    for (auto* t : {&job.rollout.obs, &job.rollout.actions, &job.rollout.logp, &job.rollout.values,
                    &job.rollout.rewards, &job.rollout.dones, &job.rollout.last_value})
      *t = t->to(device);
  }
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
  }
  version = r.version;
  const double wall = Seconds(Clock::now() - start);
  nlohmann::json row = {
      {"env_steps", env_steps},
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
  };
  for (const auto& [k, v] : r.stats.Items()) row[k] = std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
  metrics.Write(row);
  std::vector<std::pair<std::string, double>> scalars;
  for (const auto& [k, v] : row.items())
    if (v.is_number() && k != "env_steps") scalars.emplace_back(k, v.get<double>());
  tensorboard->AddScalars(scalars, env_steps, UnixNow());
  if (!std::isfinite(r.stats.policy_loss)) {
    stopping = true;
    stop_reason = "the PPO update failed (non-finite loss)";
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
      stopping = true;
      stop_reason = "stop requested";
    }
  }
}

// Continues run_dir: the latest checkpoint's policy, optimizer, loss-scaler
// state and counters (env steps, updates, policy version).
Status Learner::Impl::Resume() {
  const std::string dir = run_dir + "/checkpoints";
  std::string path;
  std::vector<std::string> skipped;
  const Status found = FindLatestValidCheckpoint(dir, &path, &skipped);
  for (const auto& why : skipped) spdlog::warn("resume: skipping {}; using an older checkpoint", why);
  if (!found.ok()) return found;
  TrainingCounters c;
  if (auto s = LoadCheckpoint(path, training, &trainer->optimizer(), &c, &trainer->scaler()); !s.ok()) return s;
  env_steps = c.env_steps;
  updates = c.updates;
  version = c.policy_version;
  spdlog::info("resumed {}: {} env steps, {} updates, policy version {}", path, env_steps, updates,
               version);
  return Status::Ok();
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
  std::vector<int64_t> shape{config.batcher.max_rows};
  shape.insert(shape.end(), obs_shape.begin(), obs_shape.end());
  {
    c10::InferenceMode guard;
    AutocastGuard autocast(device, precision);
    auto out = acting->Act(torch::zeros(shape, torch::TensorOptions().device(device)));
    (void)out.action.to(torch::kCPU);
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
  const double wall = Seconds(Clock::now() - start);
  auto opt = [](const auto& o) { return o ? nlohmann::json(*o) : nlohmann::json(nullptr); };
  return nlohmann::json{
      {"env", env_name},
      {"mode", config.mode},
      {"env_steps", env_steps},
      {"wall_seconds", wall},
      {"sps", wall > 0 ? static_cast<double>(env_steps) / wall : 0.0},
      {"episodes", window.total_episodes()},
      {"mean_return_100", window.empty() ? nlohmann::json(nullptr) : nlohmann::json(window.mean_return())},
      {"target_return", opt(config.target_return)},
      {"solved_at_steps", opt(solved_at_steps)},
      {"solved_at_seconds", opt(solved_at_seconds)},
      {"updates", updates},
      {"policy_version", version},
      {"workers", workers.size() + static_cast<std::size_t>(workers_lost)},
      {"workers_active", workers.size()},
      {"num_envs", store ? store->num_envs() : 0},
      {"protocol_errors", errors + io_errors.load()},
      {"workers_lost", workers_lost},
      {"stop_reason", stop_reason},
      {"device", device.str()},
      {"precision", config.learner.precision},
      {"torch_version", TORCH_VERSION},
      {"start_unix", start_unix},
      {"solved_at_unix", solved_at_steps ? nlohmann::json(start_unix + *solved_at_seconds) : nlohmann::json(nullptr)},
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
    m.CheckWorkers();
    m.ProcessBatch(batch);
    if (m.stopping && !m.trainer_busy) break;
  }
  m.progress.Finish();
  spdlog::info("stopping: {}", m.stop_reason);

  // Final checkpoint, then tell every worker to stop.
  if (m.trainer) {
    TrainingCounters c{m.env_steps, m.updates, m.version, m.window.total_episodes(),
                       Seconds(Clock::now() - m.start)};
    std::string path;
    if (auto s = SaveCheckpoint(m.run_dir + "/checkpoints", m.training, m.trainer->optimizer(), c, &path,
                                &m.trainer->scaler(), m.config.learner.keep_checkpoints);
        !s.ok())
      spdlog::error("final checkpoint: {}", s.message());
    else
      spdlog::info("checkpoint written: {}", path);
  }
  wire::Envelope stop;
  stop.mutable_stop()->set_reason(m.stop_reason);
  for (const auto& [identity, ws] : m.workers) m.Reply(identity, stop);
  m.reply_push.send(zmq::message_t(), zmq::send_flags::none);  // tells the I/O thread to finish
  if (m.io_thread.joinable()) m.io_thread.join();

  nlohmann::json s = m.Summary();
  if (auto st = WriteFileAtomic(m.run_dir + "/summary.json", s.dump(2) + "\n"); !st.ok()) return st;
  if (summary) *summary = s;
  return Status::Ok();
}

}  // namespace farm
