// farm-bench: micro-benchmarks that print one JSON object each.
//   env       steps/s of one EnvGroup stepped in-process with random actions
//   forward   rows/s of a plain ActorCritic forward loop (the inference ceiling)
//   serve     rows/s the learner serves to in-process DEALER clients at a batch size; with --config the
//             clients take that env's shapes (agents, global state, episode ends) and, with --train, the
//             learner records into its store and updates: the JSON then has the inference thread's
//             ns_per_row per phase (admit, gather, forward, serve, handoff, non_forward) from its summary
//   matmul    peak matrix-multiply rate (GFLOP/s) with LibTorch, float32 or a lower precision
//   flops     FLOPs per env step of a config's model and PPO settings (for the roofline)
//   update    PPO update cost (samples/s) on a random rollout, on the config's device and precision
// forward, serve, matmul and update take --device (auto | cpu | cuda[:N]); GPU timings synchronise the
// device before reading the clock.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <filesystem>
#include <limits>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <zmq.hpp>

#include "common/config.h"
#include "common/files.h"
#include "common/resources.h"
#include "common/running_stats.h"
#include "common/transport.h"
#include "common/wire.h"
#include "learner/learner.h"
#include "learner/model/amp.h"
#include "learner/model/blas_kernel.h"
#include "learner/model/cuda_graph.h"
#include "learner/model/device.h"
#include "learner/model/policy.h"
#include "learner/train/ppo.h"
#include "worker/env_group.h"

namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

int BenchEnv(const std::string& env, int num_envs, int frame_stack, double seconds) {
  std::unique_ptr<farm::EnvGroup> group;
  farm::EnvGroupOptions group_options;
  group_options.frame_stack = frame_stack;  // worker-side preprocessing, part of what a worker pays per step
  if (auto s = farm::EnvGroup::Create(env, {}, num_envs, 1, group_options, &group); !s.ok()) {
    fmt::print(stderr, "{}\n", s.message());
    return 2;
  }
  const auto& act = group->spec().action;
  const int rows = group->rows();  // one action per agent row (num_envs for single-agent envs)
  std::mt19937_64 rng(1);
  constexpr int kActionSets = 64;
  const bool integer = act.is_categorical();  // discrete or multi-discrete
  const std::vector<int64_t> choices = act.categories();
  std::vector<int64_t> disc(static_cast<std::size_t>(kActionSets * rows * act.numel()));
  std::vector<float> cont(static_cast<std::size_t>(kActionSets * rows * act.numel()));
  for (std::size_t i = 0; i < disc.size(); ++i)
    disc[i] = integer ? static_cast<int64_t>(rng() % static_cast<uint64_t>(choices[i % choices.size()])) : 0;
  for (std::size_t i = 0; i < cont.size(); ++i)
    cont[i] = integer ? 0.f : act.low[i % act.low.size()] +
                                  (act.high[i % act.high.size()] - act.low[i % act.low.size()]) * 0.5f;
  group->Reset();
  int64_t steps = 0;
  int k = 0;
  const auto t0 = Clock::now();
  while (Since(t0) < seconds) {
    for (int i = 0; i < 64; ++i, k = (k + 1) % kActionSets)
      group->Step(integer ? disc.data() + static_cast<std::size_t>(k * rows * act.numel()) : nullptr,
                  integer ? nullptr : cont.data() + static_cast<std::size_t>(k * rows * act.numel()));
    steps += 64LL * num_envs;
  }
  const double t = Since(t0);
  fmt::print("{}\n", nlohmann::json{{"case", "env"}, {"env", env}, {"num_envs", num_envs},
                                    {"num_agents", group->num_agents()}, {"frame_stack", frame_stack},
                                    {"obs_numel", group->obs_numel()}, {"seconds", t},
                                    {"steps_per_second", static_cast<double>(steps) / t},
                                    {"agent_steps_per_second", static_cast<double>(steps) * group->num_agents() / t}}
                         .dump());
  return 0;
}

farm::ActorCritic CartPolePolicy(const std::vector<int>& hidden) {
  return farm::ActorCritic(farm::Space::Box({4}, {-1.f}, {1.f}), farm::Space::Discrete(2), hidden);
}

// Device and precision from their config spellings; prints the error and returns false when invalid.
bool ResolveDeviceAndPrecision(const std::string& device_name, const std::string& precision_name,
                               torch::Device* device, farm::Precision* precision) {
  farm::Status s = farm::ResolveDevice(device_name, device);
  if (s.ok()) s = farm::ParsePrecision(precision_name, precision);
  if (s.ok()) s = farm::CheckPrecision(*precision, *device);
  if (!s.ok()) fmt::print(stderr, "{}\n", s.message());
  return s.ok();
}

// The learner's acting path without its transport: observations in a (pinned, on CUDA) host buffer,
// host->device copy, Act under autocast (or a CUDA-graph replay), device->host copies of the outputs.
int BenchForward(int batch, int threads, double seconds, const std::string& device_name,
                 const std::string& precision_name, const std::vector<int>& hidden, bool graphs) {
  farm::SetCpuThreads(threads);
  torch::Device device(torch::kCPU);
  farm::Precision precision;
  if (!ResolveDeviceAndPrecision(device_name, precision_name, &device, &precision)) return 2;
  auto policy = CartPolePolicy(hidden);
  policy->to(device);
  policy->eval();
  auto obs = torch::randn({batch, 4});
  if (device.is_cuda()) obs = obs.pin_memory();
  std::unique_ptr<farm::GraphedActor> graphed;
  if (graphs) {
    if (auto s = farm::GraphedActor::Create(policy, device, precision, {4}, false, &graphed); !s.ok()) {
      fmt::print(stderr, "{}\n", s.message());
      return 2;
    }
  }
  auto step = [&] {
    c10::InferenceMode guard;
    farm::ActOutput out;
    if (graphed) {
      out = graphed->Act(obs);
    } else {
      farm::AutocastGuard autocast(device, precision);
      out = policy->Act(device.is_cuda() ? obs.to(device, /*non_blocking=*/true) : obs);
    }
    // The same host copies the learner makes for its replies.
    auto a = out.action.to(torch::kCPU).contiguous();
    auto l = out.logp.to(torch::kCPU, torch::kFloat32).contiguous();
    auto v = out.value.to(torch::kCPU, torch::kFloat32).contiguous();
  };
  for (int i = 0; i < 20; ++i) step();  // warm-up
  int64_t rows = 0;
  const auto t0 = Clock::now();
  while (Since(t0) < seconds) {
    step();
    rows += batch;
  }
  const double t = Since(t0);
  fmt::print("{}\n", nlohmann::json{{"case", "forward"}, {"batch", batch}, {"threads", threads},
                                    {"device", device.str()}, {"precision", precision_name},
                                    {"hidden", hidden}, {"cuda_graphs", graphs}, {"seconds", t},
                                    {"rows_per_second", static_cast<double>(rows) / t}}
                         .dump());
  return 0;
}

// What the in-process clients of `serve` present to the learner: an env's spaces and a group's observations,
// global states (one per env) and episode boundaries, as a worker sends them.
struct ClientShape {
  std::string env_name = "CartPole-v1";
  farm::Space observation = farm::Space::Box({4}, {-1.f}, {1.f});
  farm::Space action = farm::Space::Discrete(2);
  uint32_t num_agents = 1;
  std::optional<farm::Space> global_state;
  int group_envs = 1;     // envs per group (rows: group_envs x num_agents)
  int episode_steps = 0;  // every this many steps each env is truncated, as at max_episode_steps (0: never)
  std::vector<float> obs;    // [rows, obs numel]: every request's observations
  std::vector<float> state;  // [group_envs, state numel]: every request's global states (empty without)
  farm::NormalizerOptions normalization;  // what the Hello declares: the learner refuses a worker whose differs

  int rows() const { return group_envs * static_cast<int>(num_agents); }
};

// The shape of `env`'s groups of `group_envs` envs, with the observations and states of a real reset.
farm::Status EnvClientShape(const farm::EnvConfig& env, int group_envs, ClientShape* out) {
  std::unique_ptr<farm::EnvGroup> group;
  if (auto s = farm::EnvGroup::Create(env, group_envs, 1, &group); !s.ok()) return s;
  group->Reset();
  const farm::EnvSpec& spec = group->spec();
  out->env_name = spec.name;
  out->observation = spec.observation;
  out->action = spec.action;
  out->num_agents = static_cast<uint32_t>(group->num_agents());
  out->global_state = spec.global_state;
  out->group_envs = group_envs;
  out->episode_steps = spec.max_episode_steps > 0 ? spec.max_episode_steps : 0;
  out->obs.assign(group->obs(), group->obs() + group->rows() * group->obs_numel());
  out->state.assign(group->global_state(), group->global_state() + group->size() * group->state_numel());
  return farm::Status::Ok();
}

// Clients that answer every ActionReply at once with the same observations:
// the learner's serving capacity without env stepping. Step results as a worker sends them: a reward and the
// flags per row and, every shape.episode_steps steps of a group, every env truncated with its final observation
// and state and an episode's statistics.
// The serve bench's window, shared by its clients and the thread that measures. The window opens only once
// every client has its Welcome (the learner builds the run from the first Hello, which may take seconds), so
// start-up is never counted as serving time. Thread-safe.
class ServeWindow {
 public:
  explicit ServeWindow(int clients) : waiting_(clients) {}
  // A client has its Welcome (or gave up): one fewer to wait for.
  void Joined() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--waiting_ <= 0) cv_.notify_all();
  }
  // A client was not welcomed: `why` (the learner's error, or that none came). The bench fails with it.
  void Refused(std::string why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (refused_.empty()) refused_ = std::move(why);
  }
  std::string refused() {
    std::lock_guard<std::mutex> lock(mu_);
    return refused_;
  }
  // Waits until every client joined or `timeout` passed; false on timeout.
  bool WaitAllJoined(std::chrono::seconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return waiting_ <= 0; });
  }
  void set_measuring(bool on) { measuring_.store(on); }
  bool measuring() const { return measuring_.load(); }
  void Stop() { stop_.store(true); }
  bool stopped() const { return stop_.load(); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int waiting_;  // GUARDED_BY(mu_)
  std::string refused_;  // GUARDED_BY(mu_): the first client's refusal
  std::atomic<bool> measuring_{false};
  std::atomic<bool> stop_{false};
};

// Runs until window->stopped(). latencies_us: each reply's time since its request was sent (requests of all
// groups are outstanding at once, so queueing is included), for replies while the window measures.
void RunClient(const std::string& endpoint, int index, int groups, const ClientShape& shape, ServeWindow* window,
               std::atomic<int64_t>* rows_served, std::vector<double>* latencies_us) {
  struct JoinOnExit {  // the window learns of this client however it leaves the hand-shake
    ServeWindow* w;
    bool done = false;
    void Join() { if (!done) { done = true; w->Joined(); } }
    ~JoinOnExit() { Join(); }
  } join{window};
  zmq::context_t ctx(1);
  farm::TransportConfig tc;
  auto sock = farm::MakeDealer(ctx, fmt::format("bench-client-{}", index), endpoint, tc);
  std::string scratch;
  const int group_rows = shape.rows();
  const int64_t obs_numel = shape.observation.numel();
  farm::wire::Envelope hello;
  auto* h = hello.mutable_hello();
  h->set_protocol_version(farm::kProtocolVersion);
  h->set_worker_id(fmt::format("bench-client-{}", index));
  h->set_env_name(shape.env_name);
  h->set_num_envs(static_cast<uint32_t>(groups * shape.group_envs));
  h->set_num_groups(static_cast<uint32_t>(groups));
  farm::ToWire(shape.observation, h->mutable_observation());
  farm::ToWire(shape.action, h->mutable_action());
  h->set_num_agents(shape.num_agents);
  if (shape.global_state) farm::ToWire(*shape.global_state, h->mutable_global_state());
  if (shape.normalization.any()) shape.normalization.ToWire(h->mutable_normalization());
  farm::SendEnvelope(sock, hello, &scratch);
  farm::wire::Envelope in;
  farm::Status st;
  // Generous: under valgrind the learner takes a minute to build the run from the first Hello.
  const bool answered = farm::ReceiveEnvelope(sock, std::chrono::seconds(600), &in, &st);
  if (!answered || !in.has_welcome() || !in.welcome().accepted()) {
    window->Refused(fmt::format("bench-client-{} was not welcomed: {}", index,
                                !st.ok()                ? st.message()
                                : !answered             ? std::string("no answer to its Hello within 600 s")
                                : in.has_welcome()      ? in.welcome().error()
                                : in.has_error()        ? in.error().message()
                                                        : std::string("the answer to its Hello was not a Welcome")));
    return;
  }
  join.Join();
  std::vector<float> obs = shape.obs;
  if (obs.empty()) obs.assign(static_cast<std::size_t>(group_rows * obs_numel), 0.01f);
  std::vector<int64_t> obs_shape{group_rows};
  obs_shape.insert(obs_shape.end(), shape.observation.shape.begin(), shape.observation.shape.end());
  std::vector<int64_t> state_shape{shape.group_envs};
  if (shape.global_state)
    state_shape.insert(state_shape.end(), shape.global_state->shape.begin(), shape.global_state->shape.end());
  std::vector<float> reward(static_cast<std::size_t>(group_rows), 1.f);
  const std::string no_flags(static_cast<std::size_t>(group_rows), '\0');
  const std::string all_flags(static_cast<std::size_t>(group_rows), '\1');
  std::vector<int32_t> all_rows(static_cast<std::size_t>(group_rows));
  for (int i = 0; i < group_rows; ++i) all_rows[static_cast<std::size_t>(i)] = i;
  std::vector<uint64_t> seq(static_cast<std::size_t>(groups), 0);
  std::vector<Clock::time_point> sent(static_cast<std::size_t>(groups));
  farm::wire::Envelope out;
  auto send = [&](int g) {
    auto* r = out.mutable_step();
    r->Clear();
    r->set_group(static_cast<uint32_t>(g));
    r->set_seq(seq[g]);
    r->set_first(seq[g] == 0);
    farm::SetTensor(r->mutable_obs(), farm::DType::kFloat32, obs_shape, obs.data(), obs.size() * 4);
    if (shape.global_state)
      farm::SetTensor(r->mutable_global_state(), farm::DType::kFloat32, state_shape, shape.state.data(),
                      shape.state.size() * 4);
    if (seq[g] > 0) {
      farm::SetTensor(r->mutable_reward(), farm::DType::kFloat32, {group_rows}, reward.data(), reward.size() * 4);
      const bool end = shape.episode_steps > 0 && seq[g] % static_cast<uint64_t>(shape.episode_steps) == 0;
      r->set_terminated(no_flags);
      r->set_truncated(end ? all_flags : no_flags);
      if (end) {  // the final observations (and states) are the same data: the cost is in their size
        r->mutable_final_obs_index()->Assign(all_rows.begin(), all_rows.end());
        farm::SetTensor(r->mutable_final_obs(), farm::DType::kFloat32, obs_shape, obs.data(), obs.size() * 4);
        if (shape.global_state)
          farm::SetTensor(r->mutable_final_global_state(), farm::DType::kFloat32, state_shape, shape.state.data(),
                          shape.state.size() * 4);
        for (int e = 0; e < shape.group_envs; ++e) {
          auto* ep = r->add_episodes();
          ep->set_episode_return(static_cast<float>(shape.episode_steps));
          ep->set_length(shape.episode_steps);
        }
      }
    }
    ++seq[g];
    sent[g] = Clock::now();
    farm::SendEnvelope(sock, out, &scratch);
  };
  for (int g = 0; g < groups; ++g) send(g);
  while (!window->stopped()) {
    if (!farm::ReceiveEnvelope(sock, std::chrono::seconds(30), &in, &st) || !st.ok() || !in.has_action()) return;
    rows_served->fetch_add(group_rows);
    const int g = static_cast<int>(in.action().group());
    const auto now = Clock::now();
    if (window->measuring() && g >= 0 && g < groups)
      latencies_us->push_back(std::chrono::duration<double, std::micro>(now - sent[g]).count());
    send(g);
  }
}

// batch (> 0: batcher.max_rows). Without a config: CartPole-shaped clients, serving only (learner.train false),
// 4 groups per client and twice the batch outstanding. With one: clients shaped as its env (spaces, agents, global
// state, episode length) with `envs` envs each (0: env.num_envs) in env.num_groups groups; `train`: the learner
// records every step into its trajectory store and runs the PPO updates as the config says.
int BenchServe(const std::string& config_path, int batch, int threads, int clients, int envs, bool train,
               double seconds, const std::vector<std::string>& overrides) {
  farm::FarmConfig config;
  if (auto s = farm::LoadConfig(config_path, overrides, &config); !s.ok()) {
    fmt::print(stderr, "{}\n", s.message());
    return 2;
  }
  const bool env_shaped = !config_path.empty();
  config.learner.threads = threads;
  config.learner.train = train;
  config.learner.progress_interval_s = 3600;
  config.learner.checkpoint_every = 0;
  config.total_env_steps = int64_t{1} << 60;
  config.stop_at_target = false;  // the clients' episodes all return episode_steps: a target would end the run
  config.max_wall_seconds = 0;
  if (batch > 0 || !env_shaped) config.batcher.max_rows = batch;
  if (!env_shaped) config.batcher.max_wait_us = 1000;
  config.run_dir = fmt::format("/tmp/farm-bench-serve-{}", ::getpid());
  ClientShape shape;
  int groups = 4;
  if (env_shaped) {
    groups = config.env.num_groups;
    const int client_envs = envs > 0 ? envs : config.env.num_envs;
    if (client_envs % groups != 0) {
      fmt::print(stderr, "--envs {} is not a multiple of env.num_groups {}\n", client_envs, groups);
      return 2;
    }
    if (auto s = EnvClientShape(config.env, client_envs / groups, &shape); !s.ok()) {
      fmt::print(stderr, "{}\n", s.message());
      return 2;
    }
    shape.normalization = farm::NormalizerOptions::FromConfig(config);
  } else {
    // Twice the batch outstanding, so that one batch queues while another is served.
    shape.group_envs = std::max(1, 2 * batch / (clients * groups));
  }
  const int group_rows = shape.rows();
  std::unique_ptr<farm::Learner> learner;
  if (auto s = farm::Learner::Create(config, &learner); !s.ok()) {
    fmt::print(stderr, "{}\n", s.message());
    return 2;
  }
  nlohmann::json summary;
  std::thread server([&] { (void)learner->Run(&summary); });
  std::atomic<int64_t> rows{0};
  std::vector<std::thread> client_threads;
  ServeWindow window(clients);
  std::vector<std::vector<double>> latencies(static_cast<std::size_t>(clients));
  for (int c = 0; c < clients; ++c)
    client_threads.emplace_back(RunClient, learner->endpoint(), c, groups, std::cref(shape), &window, &rows,
                                &latencies[static_cast<std::size_t>(c)]);
  // Generous, as the clients' own wait: under valgrind the learner takes a minute to build the run.
  const auto launched = Clock::now();
  if (!window.WaitAllJoined(std::chrono::seconds(600)))
    fmt::print(stderr, "serve: not every client was welcomed within 600 s; measuring those that were\n");
  const double startup = Since(launched);
  const double warmup = 0.5;
  std::this_thread::sleep_for(std::chrono::duration<double>(warmup));
  window.set_measuring(true);
  const int64_t r0 = rows.load();
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  const int64_t r1 = rows.load();
  const double t = Since(t0);
  window.set_measuring(false);
  window.Stop();
  for (auto& th : client_threads) th.join();
  learner->RequestStop("benchmark done");
  server.join();
  if (const std::string why = window.refused(); !why.empty()) {
    (void)farm::RemoveTree(config.run_dir);
    fmt::print(stderr, "serve: {}\n", why);
    return 2;
  }
  // The learner's metrics rows (one per update; the time split and env steps so far): the steady state is from
  // the second update to the last, past the start-up and the first rollouts' fresh store pages.
  std::vector<nlohmann::json> metrics;
  {
    std::ifstream in(config.run_dir + "/metrics.jsonl");
    std::string line;
    while (std::getline(in, line))
      if (auto row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false); row.is_object()) metrics.push_back(row);
  }
  (void)farm::RemoveTree(config.run_dir);
  std::vector<double> all;
  for (const auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
  const auto percentile = [&](double q) {
    if (all.empty()) return std::numeric_limits<double>::quiet_NaN();
    auto at = all.begin() + static_cast<std::ptrdiff_t>(q * static_cast<double>(all.size() - 1));
    std::nth_element(all.begin(), at, all.end());
    return *at;
  };
  const double p50 = percentile(0.5), p99 = percentile(0.99);
  nlohmann::json result{{"case", "serve"}, {"batch", config.batcher.max_rows}, {"threads", threads},
                        {"clients", clients}, {"latency_us_p50", p50}, {"latency_us_p99", p99},
                        {"replies", all.size()}, {"group_rows", group_rows}, {"device", config.learner.device},
                        {"precision", config.learner.precision}, {"cuda_graphs", config.learner.cuda_graphs},
                        {"seconds", t}, {"startup_seconds", startup},
                        {"rows_per_second", static_cast<double>(r1 - r0) / t}};
  if (env_shaped) {
    result["env"] = shape.env_name;
    result["groups"] = groups;
    result["train"] = train;
    // The inference thread's cost per agent row over the whole run (warm-up included), from the learner's
    // summary: each phase's seconds over the rows it admitted with step results (agent_steps).
    const auto& ts = summary.value("time_seconds", nlohmann::json::object());
    const double agent_rows = summary.value("agent_steps", 0.0);
    nlohmann::json per_row = nlohmann::json::object();
    double non_forward = 0;
    for (const char* phase : {"admit", "gather", "forward", "serve", "handoff"}) {
      const double s = ts.value(phase, 0.0);
      per_row[phase] = agent_rows > 0 ? 1e9 * s / agent_rows : 0.0;
      if (std::string(phase) != "forward") non_forward += s;
    }
    per_row["non_forward"] = agent_rows > 0 ? 1e9 * non_forward / agent_rows : 0.0;
    result["ns_per_row"] = per_row;
    // Steady state: between the metrics rows of update 2 and of the last update.
    const nlohmann::json* from = nullptr;
    const nlohmann::json* to = nullptr;
    for (const auto& row : metrics) {
      if (row.value("update", 0) == 2) from = &row;
      if (row.value("update", 0) > 2) to = &row;
    }
    if (from && to) {
      const double rows_between =
          (to->value("env_steps", 0.0) - from->value("env_steps", 0.0)) * static_cast<double>(shape.num_agents);
      nlohmann::json steady = nlohmann::json::object();
      double steady_non_forward = 0;
      for (const char* phase : {"admit", "gather", "forward", "serve", "handoff"}) {
        const std::string key = fmt::format("time_{}_seconds", phase);
        const double s = to->value(key, 0.0) - from->value(key, 0.0);
        steady[phase] = 1e9 * s / rows_between;
        if (std::string(phase) != "forward") steady_non_forward += s;
      }
      steady["non_forward"] = 1e9 * steady_non_forward / rows_between;
      steady["rows"] = rows_between;
      steady["updates"] = to->value("update", 0) - 2;
      result["ns_per_row_steady"] = steady;
    }
    result["agent_rows"] = agent_rows;
    result["stop_reason"] = summary.value("stop_reason", "");
    result["updates"] = summary.value("updates", 0);
    result["time_seconds"] = ts;
  }
  fmt::print("{}\n", result.dump());
  return 0;
}

// PPO updates on a random CartPole-shaped rollout with a config's settings:
// the learner's update cost without collection.
int BenchUpdate(const std::string& config_path, const std::vector<std::string>& overrides, int envs, double seconds) {
  farm::FarmConfig config;
  if (auto s = farm::LoadConfig(config_path, overrides, &config); !s.ok()) {
    fmt::print(stderr, "{}\n", s.message());
    return 2;
  }
  farm::SetCpuThreads(config.learner.threads);
  torch::manual_seed(1);
  torch::Device device(torch::kCPU);
  farm::Precision precision;
  if (!ResolveDeviceAndPrecision(config.learner.device, config.learner.precision, &device, &precision)) return 2;
  // CartPole's spaces; the config's core (ppo.core, core_size, critic_core), whose update runs over chunks of
  // ppo.bptt steps from stored states.
  farm::PolicyOptions options;
  if (auto s = farm::ParseCore(config.ppo.core, &options.core); !s.ok()) {
    fmt::print(stderr, "ppo.{}\n", s.message());
    return 2;
  }
  options.core_size = config.ppo.core_size;
  options.critic_core = config.ppo.critic_core;
  farm::ActorCritic policy(farm::Space::Box({4}, {-1.f}, {1.f}), farm::Space::Discrete(2), config.ppo.hidden_sizes,
                           options);
  policy->to(device);
  farm::PpoTrainer trainer(policy, config.ppo, 1, precision);
  const int64_t T = config.ppo.rollout_length, N = envs;
  const auto on = torch::TensorOptions().device(device);
  farm::Rollout r;
  r.obs = torch::randn({T, N, 4}, on);
  r.actions = torch::randint(2, {T, N}, on.dtype(torch::kInt64));
  r.logp = torch::full({T, N}, -0.69f, on);
  r.values = torch::randn({T, N}, on);
  r.rewards = torch::ones({T, N}, on);
  r.dones = (torch::rand({T, N}, on) < 0.02).to(torch::kFloat32);
  r.last_value = torch::randn({N}, on);
  if (options.core != farm::CoreKind::kNone) {
    r.bptt = config.ppo.chunk_steps();
    r.core_states = torch::zeros({T / r.bptt, N, policy->core_state_size()}, on);
  }
  // Warm-up: the first update creates Adam's state (LibTorch path); with ppo.graph_update the second warms up and
  // captures the CUDA graph.
  trainer.Update(r, 0.0);
  trainer.Update(r, 0.0);
  farm::SynchronizeCurrentStream(device);
  int64_t updates = 0;
  const auto t0 = Clock::now();
  while (Since(t0) < seconds) {
    trainer.Update(r, 0.0);
    ++updates;
  }
  farm::SynchronizeCurrentStream(device);
  const double t = Since(t0);
  const double samples = static_cast<double>(T * N * updates);
  // Gradient steps: every minibatch of every epoch (a target_kl stop would make this an overestimate).
  const double grad_steps = static_cast<double>(updates) * config.ppo.update_epochs *
                            static_cast<double>(std::min<int64_t>(config.ppo.num_minibatches, T * N));
  fmt::print("{}\n", nlohmann::json{{"case", "update"}, {"config", config_path}, {"samples_per_update", T * N},
                                    {"device", device.str()}, {"precision", config.learner.precision},
                                    {"fused", trainer.fused()}, {"graphed", trainer.graphed_updates() > 0},
                                    {"grad_steps_per_second", grad_steps / t},
                                    {"hidden", config.ppo.hidden_sizes}, {"skipped_steps", trainer.scaler().skipped_steps()},
                                    {"core", config.ppo.core}, {"bptt", config.ppo.chunk_steps()},
                                    {"epochs", config.ppo.update_epochs}, {"minibatches", config.ppo.num_minibatches},
                                    {"ms_per_update", 1e3 * t / static_cast<double>(updates)},
                                    {"samples_per_second", samples / t}}
                         .dump());
  return 0;
}

// dtype: fp32 (TF32 allowed on CUDA, as the learner allows it), fp16 or bf16 operands.
int BenchMatmul(int threads, int n, double seconds, const std::string& device_name, const std::string& dtype_name) {
  farm::SetCpuThreads(threads);
  torch::Device device(torch::kCPU);
  farm::Precision precision;
  if (auto s = farm::ResolveDevice(device_name, &device); !s.ok()) {
    fmt::print(stderr, "{}\n", s.message());
    return 2;
  }
  if (auto s = farm::ParsePrecision(dtype_name, &precision); !s.ok()) {
    fmt::print(stderr, "{}\n", s.message());
    return 2;
  }
  if (device.is_cuda()) at::globalContext().setAllowTF32CuBLAS(true);
  const auto on = torch::TensorOptions().device(device).dtype(farm::PrecisionDtype(precision));
  auto a = torch::randn({n, n}, on);
  auto b = torch::randn({n, n}, on);
  auto c = torch::mm(a, b);
  farm::SynchronizeCurrentStream(device);
  int64_t iters = 0;
  const auto t0 = Clock::now();
  while (Since(t0) < seconds) {
    for (int i = 0; i < (device.is_cuda() ? 20 : 1); ++i, ++iters) c = torch::mm(a, b);
    farm::SynchronizeCurrentStream(device);
  }
  const double t = Since(t0);
  const double flops = 2.0 * n * n * static_cast<double>(n) * static_cast<double>(iters);
  fmt::print("{}\n", nlohmann::json{{"case", "matmul"}, {"n", n}, {"threads", threads}, {"device", device.str()},
                                    {"dtype", dtype_name}, {"seconds", t}, {"gflops", flops / t / 1e9},
                                    {"blas", device.is_cuda() ? std::string("cuBLAS") : farm::LoadedBlasInfo().library},
                                    {"blas_kernel", device.is_cuda() ? std::string() : farm::LoadedBlasInfo().kernel}}
                         .dump());
  return 0;
}

// Multiply-adds of an MLP in -> hidden... -> out.
double MlpMacs(int64_t in, const std::vector<int>& hidden, int64_t out) {
  double macs = 0;
  int64_t prev = in;
  for (int h : hidden) {
    macs += static_cast<double>(prev) * h;
    prev = h;
  }
  return macs + static_cast<double>(prev) * static_cast<double>(out);
}

int BenchFlops(const std::string& config_path, const std::vector<std::string>& overrides) {
  farm::FarmConfig config;
  if (auto s = farm::LoadConfig(config_path, overrides, &config); !s.ok()) {
    fmt::print(stderr, "{}\n", s.message());
    return 2;
  }
  std::unique_ptr<farm::EnvGroup> group;
  if (auto s = farm::EnvGroup::Create(config.env, 1, 1, &group); !s.ok()) {
    fmt::print(stderr, "{}\n", s.message());
    return 2;
  }
  const auto& spec = group->spec();
  const int64_t obs = spec.observation.numel();
  const int64_t act = spec.action.head_size();
  const double forward = 2.0 * (MlpMacs(obs, config.ppo.hidden_sizes, act) + MlpMacs(obs, config.ppo.hidden_sizes, 1));
  // Acting: one forward. Training: per epoch a forward and a backward (~2x the forward).
  const double per_step = forward + config.ppo.update_epochs * 3.0 * forward;
  fmt::print("{}\n", nlohmann::json{{"case", "flops"}, {"config", config_path}, {"forward_flops", forward},
                                    {"update_epochs", config.ppo.update_epochs}, {"flops_per_env_step", per_step}}
                         .dump());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // As farm-learner does (its serving and update figures are measured as the learner runs them): the same OpenBLAS
  // kernel choice (it may start this program again), allocator and BLAS threads.
  const farm::BlasKernelStart blas_kernel = farm::StartWithBestBlasKernel(argv);
  if (blas_kernel.warning) fmt::print(stderr, "farm-bench: {}\n", blas_kernel.message);
  (void)farm::KeepFreedMemoryForReuse();
  (void)farm::ShortenBlasThreadWait();
  CLI::App app{"Rollout Farm micro-benchmarks (one JSON line each)"};
  app.require_subcommand(1);
  double seconds = 2.0;
  app.add_option("--seconds", seconds, "measuring time per case");
  std::string env = "CartPole-v1";
  int num_envs = 1024, batch = 1024, threads = 1, clients = 2, n = 1024, frame_stack = 1;
  std::string device = "cpu", precision = "fp32";
  std::vector<int> hidden{64, 64};
  bool graphs = false;
  auto* env_cmd = app.add_subcommand("env", "env steps/s in-process");
  env_cmd->add_option("--env", env);
  env_cmd->add_option("--num-envs", num_envs);
  env_cmd->add_option("--frame-stack", frame_stack, "env.frame_stack (1: none)");
  auto* fwd = app.add_subcommand("forward", "plain forward loop rows/s");
  fwd->add_option("--batch", batch);
  fwd->add_option("--threads", threads);
  fwd->add_option("--device", device, "auto | cpu | cuda[:N]");
  fwd->add_option("--precision", precision, "fp32 | fp16 | bf16");
  fwd->add_option("--hidden", hidden, "hidden layer sizes")->expected(1, 16);
  fwd->add_flag("--cuda-graphs", graphs, "replay the forward from CUDA graphs");
  auto* serve = app.add_subcommand("serve", "learner serving rows/s");
  std::string serve_config;
  int serve_envs = 0;
  bool serve_train = false;
  auto* serve_batch = serve->add_option("--batch", batch, "batcher.max_rows (with --config: the config's unless given)");
  serve->add_option("--config", serve_config,
                    "clients shaped as this config's env (spaces, agents, global state, episode length), "
                    "env.num_groups groups each; the learner as the config says");
  serve->add_option("--envs", serve_envs, "with --config: envs per client (default env.num_envs)");
  serve->add_flag("--train", serve_train,
                  "with --config: record every step into the trajectory store and run the PPO updates");
  serve->add_option("--threads", threads);
  serve->add_option("--clients", clients);
  std::vector<std::string> serve_overrides;
  serve->add_option("--set", serve_overrides, "config overrides, e.g. learner.device=cuda");
  auto* mm = app.add_subcommand("matmul", "peak matmul GFLOP/s");
  mm->add_option("--threads", threads);
  mm->add_option("--n", n);
  mm->add_option("--device", device, "auto | cpu | cuda[:N]");
  mm->add_option("--dtype", precision, "fp32 | fp16 | bf16");
  std::string config_path;
  std::vector<std::string> overrides;
  auto* fl = app.add_subcommand("flops", "FLOPs per env step of a config");
  fl->add_option("--config", config_path)->required();
  fl->add_option("--set", overrides);
  auto* up = app.add_subcommand("update", "PPO update cost on a random rollout");
  up->add_option("--config", config_path)->required();
  up->add_option("--set", overrides);
  up->add_option("--envs", num_envs, "envs in the rollout (N)");
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::warn);
  if (*env_cmd) return BenchEnv(env, num_envs, frame_stack, seconds);
  if (*fwd) return BenchForward(batch, threads, seconds, device, precision, hidden, graphs);
  if (*serve)
    return BenchServe(serve_config, serve_config.empty() || serve_batch->count() ? batch : 0, threads, clients,
                      serve_envs, serve_train, seconds, serve_overrides);
  if (*mm) return BenchMatmul(threads, n, seconds, device, precision);
  if (*fl) return BenchFlops(config_path, overrides);
  if (*up) return BenchUpdate(config_path, overrides, num_envs, seconds);
  return 2;
}
