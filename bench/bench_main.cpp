// farm-bench: micro-benchmarks that print one JSON object each.
//   env       steps/s of one EnvGroup stepped in-process with random actions
//   forward   rows/s of a plain ActorCritic forward loop (the inference ceiling)
//   serve     rows/s the learner serves to in-process DEALER clients at a batch size
//   matmul    peak float32 matrix-multiply rate (GFLOP/s) with LibTorch
//   flops     FLOPs per env step of a config's model and PPO settings (for the roofline)
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <random>
#include <thread>
#include <zmq.hpp>

#include "common/config.h"
#include "common/transport.h"
#include "common/wire.h"
#include "learner/learner.h"
#include "learner/policy.h"
#include "learner/ppo.h"
#include "worker/env_group.h"

namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

int BenchEnv(const std::string& env, int num_envs, double seconds) {
  std::unique_ptr<farm::EnvGroup> group;
  if (auto s = farm::EnvGroup::Create(env, {}, num_envs, 1, &group); !s.ok()) {
    fmt::print(stderr, "{}\n", s.message());
    return 2;
  }
  const auto& act = group->spec().action;
  std::mt19937_64 rng(1);
  constexpr int kActionSets = 64;
  std::vector<int64_t> disc(static_cast<std::size_t>(kActionSets * num_envs));
  std::vector<float> cont(static_cast<std::size_t>(kActionSets * num_envs * act.numel()));
  for (auto& a : disc) a = act.is_discrete() ? static_cast<int64_t>(rng() % static_cast<uint64_t>(act.n)) : 0;
  for (std::size_t i = 0; i < cont.size(); ++i)
    cont[i] = act.is_discrete() ? 0.f : act.low[i % act.low.size()] +
                                            (act.high[i % act.high.size()] - act.low[i % act.low.size()]) * 0.5f;
  group->Reset();
  int64_t steps = 0;
  int k = 0;
  const auto t0 = Clock::now();
  while (Since(t0) < seconds) {
    for (int i = 0; i < 64; ++i, k = (k + 1) % kActionSets)
      group->Step(act.is_discrete() ? disc.data() + k * num_envs : nullptr,
                  act.is_discrete() ? nullptr : cont.data() + static_cast<std::size_t>(k * num_envs * act.numel()));
    steps += 64LL * num_envs;
  }
  const double t = Since(t0);
  fmt::print("{}\n", nlohmann::json{{"case", "env"}, {"env", env}, {"num_envs", num_envs}, {"seconds", t},
                                    {"steps_per_second", static_cast<double>(steps) / t}}
                         .dump());
  return 0;
}

farm::ActorCritic CartPolePolicy(const std::vector<int>& hidden) {
  return farm::ActorCritic(farm::Space::Box({4}, {-1.f}, {1.f}), farm::Space::Discrete(2), hidden);
}

int BenchForward(int batch, int threads, double seconds) {
  torch::set_num_threads(threads);
  auto policy = CartPolePolicy({64, 64});
  policy->eval();
  auto obs = torch::randn({batch, 4});
  int64_t rows = 0;
  for (int i = 0; i < 20; ++i) {  // warm-up
    c10::InferenceMode guard;
    policy->Act(obs);
  }
  const auto t0 = Clock::now();
  while (Since(t0) < seconds) {
    c10::InferenceMode guard;
    auto out = policy->Act(obs);
    // The same host copies the learner makes for its replies.
    auto a = out.action.contiguous();
    auto l = out.logp.contiguous();
    auto v = out.value.contiguous();
    rows += batch;
  }
  const double t = Since(t0);
  fmt::print("{}\n", nlohmann::json{{"case", "forward"}, {"batch", batch}, {"threads", threads}, {"seconds", t},
                                    {"rows_per_second", static_cast<double>(rows) / t}}
                         .dump());
  return 0;
}

// Clients that answer every ActionReply at once with the same observations:
// the learner's serving capacity without env stepping.
void RunClient(const std::string& endpoint, int index, int groups, int group_rows, double seconds,
               std::atomic<int64_t>* rows_served) {
  zmq::context_t ctx(1);
  farm::TransportConfig tc;
  auto sock = farm::MakeDealer(ctx, fmt::format("bench-client-{}", index), endpoint, tc);
  std::string scratch;
  farm::wire::Envelope hello;
  auto* h = hello.mutable_hello();
  h->set_protocol_version(farm::kProtocolVersion);
  h->set_worker_id(fmt::format("bench-client-{}", index));
  h->set_env_name("CartPole-v1");
  h->set_num_envs(static_cast<uint32_t>(groups * group_rows));
  h->set_num_groups(static_cast<uint32_t>(groups));
  farm::ToWire(farm::Space::Box({4}, {-1.f}, {1.f}), h->mutable_observation());
  farm::ToWire(farm::Space::Discrete(2), h->mutable_action());
  farm::SendEnvelope(sock, hello, &scratch);
  farm::wire::Envelope in;
  farm::Status st;
  if (!farm::ReceiveEnvelope(sock, std::chrono::seconds(30), &in, &st) || !in.has_welcome()) return;
  std::vector<float> obs(static_cast<std::size_t>(group_rows * 4), 0.01f);
  std::vector<float> reward(static_cast<std::size_t>(group_rows), 1.f);
  const std::string flags(static_cast<std::size_t>(group_rows), '\0');
  std::vector<uint64_t> seq(static_cast<std::size_t>(groups), 0);
  farm::wire::Envelope out;
  auto send = [&](int g) {
    auto* r = out.mutable_step();
    r->Clear();
    r->set_group(static_cast<uint32_t>(g));
    r->set_seq(seq[g]);
    r->set_first(seq[g] == 0);
    farm::SetTensor(r->mutable_obs(), farm::DType::kFloat32, {group_rows, 4}, obs.data(), obs.size() * 4);
    if (seq[g] > 0) {
      farm::SetTensor(r->mutable_reward(), farm::DType::kFloat32, {group_rows}, reward.data(), reward.size() * 4);
      r->set_terminated(flags);
      r->set_truncated(flags);
    }
    ++seq[g];
    farm::SendEnvelope(sock, out, &scratch);
  };
  for (int g = 0; g < groups; ++g) send(g);
  const auto t0 = Clock::now();
  while (Since(t0) < seconds) {
    if (!farm::ReceiveEnvelope(sock, std::chrono::seconds(10), &in, &st) || !st.ok() || !in.has_action()) return;
    rows_served->fetch_add(group_rows);
    send(static_cast<int>(in.action().group()));
  }
}

int BenchServe(int batch, int threads, int clients, double seconds) {
  farm::FarmConfig config;
  config.learner.threads = threads;
  config.learner.train = false;
  config.learner.progress_interval_s = 3600;
  config.learner.checkpoint_every = 0;
  config.total_env_steps = int64_t{1} << 60;
  config.batcher.max_rows = batch;
  config.batcher.max_wait_us = 1000;
  config.run_dir = fmt::format("/tmp/farm-bench-serve-{}", ::getpid());
  // Twice the batch outstanding, so that one batch queues while another is served.
  const int groups = 4;
  const int group_rows = std::max(1, 2 * batch / (clients * groups));
  std::unique_ptr<farm::Learner> learner;
  if (auto s = farm::Learner::Create(config, &learner); !s.ok()) {
    fmt::print(stderr, "{}\n", s.message());
    return 2;
  }
  nlohmann::json summary;
  std::thread server([&] { (void)learner->Run(&summary); });
  std::atomic<int64_t> rows{0};
  std::vector<std::thread> client_threads;
  const double warmup = 0.5;
  for (int c = 0; c < clients; ++c)
    client_threads.emplace_back(RunClient, learner->endpoint(), c, groups, group_rows, seconds + warmup, &rows);
  std::this_thread::sleep_for(std::chrono::duration<double>(warmup));
  const int64_t r0 = rows.load();
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  const int64_t r1 = rows.load();
  const double t = Since(t0);
  for (auto& th : client_threads) th.join();
  learner->RequestStop("benchmark done");
  server.join();
  std::filesystem::remove_all(config.run_dir);
  fmt::print("{}\n", nlohmann::json{{"case", "serve"}, {"batch", batch}, {"threads", threads}, {"clients", clients},
                                    {"group_rows", group_rows}, {"seconds", t},
                                    {"rows_per_second", static_cast<double>(r1 - r0) / t}}
                         .dump());
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
  torch::set_num_threads(config.learner.threads);
  torch::manual_seed(1);
  auto policy = CartPolePolicy(config.ppo.hidden_sizes);
  farm::PpoTrainer trainer(policy, config.ppo, 1);
  const int64_t T = config.ppo.rollout_length, N = envs;
  farm::Rollout r;
  r.obs = torch::randn({T, N, 4});
  r.actions = torch::randint(2, {T, N}, torch::kInt64);
  r.logp = torch::full({T, N}, -0.69f);
  r.values = torch::randn({T, N});
  r.rewards = torch::ones({T, N});
  r.dones = (torch::rand({T, N}) < 0.02).to(torch::kFloat32);
  r.last_value = torch::randn({N});
  trainer.Update(r, 0.0);  // warm-up
  int64_t updates = 0;
  const auto t0 = Clock::now();
  while (Since(t0) < seconds) {
    trainer.Update(r, 0.0);
    ++updates;
  }
  const double t = Since(t0);
  const double samples = static_cast<double>(T * N * updates);
  fmt::print("{}\n", nlohmann::json{{"case", "update"}, {"config", config_path}, {"samples_per_update", T * N},
                                    {"epochs", config.ppo.update_epochs}, {"minibatches", config.ppo.num_minibatches},
                                    {"ms_per_update", 1e3 * t / static_cast<double>(updates)},
                                    {"samples_per_second", samples / t}}
                         .dump());
  return 0;
}

int BenchMatmul(int threads, int n, double seconds) {
  torch::set_num_threads(threads);
  auto a = torch::randn({n, n});
  auto b = torch::randn({n, n});
  auto c = torch::mm(a, b);
  int64_t iters = 0;
  const auto t0 = Clock::now();
  while (Since(t0) < seconds) {
    c = torch::mm(a, b);
    ++iters;
  }
  const double t = Since(t0);
  const double flops = 2.0 * n * n * static_cast<double>(n) * static_cast<double>(iters);
  fmt::print("{}\n", nlohmann::json{{"case", "matmul"}, {"n", n}, {"threads", threads}, {"seconds", t},
                                    {"gflops", flops / t / 1e9}}
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
  if (auto s = farm::EnvGroup::Create(config.env.name, config.env.options, 1, 1, &group); !s.ok()) {
    fmt::print(stderr, "{}\n", s.message());
    return 2;
  }
  const auto& spec = group->spec();
  const int64_t obs = spec.observation.numel();
  const int64_t act = spec.action.is_discrete() ? spec.action.n : spec.action.numel();
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
  CLI::App app{"Rollout Farm micro-benchmarks (one JSON line each)"};
  app.require_subcommand(1);
  double seconds = 2.0;
  app.add_option("--seconds", seconds, "measuring time per case");
  std::string env = "CartPole-v1";
  int num_envs = 1024, batch = 1024, threads = 1, clients = 2, n = 1024;
  auto* env_cmd = app.add_subcommand("env", "env steps/s in-process");
  env_cmd->add_option("--env", env);
  env_cmd->add_option("--num-envs", num_envs);
  auto* fwd = app.add_subcommand("forward", "plain forward loop rows/s");
  fwd->add_option("--batch", batch);
  fwd->add_option("--threads", threads);
  auto* serve = app.add_subcommand("serve", "learner serving rows/s");
  serve->add_option("--batch", batch);
  serve->add_option("--threads", threads);
  serve->add_option("--clients", clients);
  auto* mm = app.add_subcommand("matmul", "peak matmul GFLOP/s");
  mm->add_option("--threads", threads);
  mm->add_option("--n", n);
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
  if (*env_cmd) return BenchEnv(env, num_envs, seconds);
  if (*fwd) return BenchForward(batch, threads, seconds);
  if (*serve) return BenchServe(batch, threads, clients, seconds);
  if (*mm) return BenchMatmul(threads, n, seconds);
  if (*fl) return BenchFlops(config_path, overrides);
  if (*up) return BenchUpdate(config_path, overrides, num_envs, seconds);
  return 2;
}
