// farm-learner: central batched inference and PPO training for a run.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/config.h"
#include "common/signal_watcher.h"
#include "learner/learner.h"
#include "learner/metrics.h"

int main(int argc, char** argv) {
  CLI::App app{"Rollout Farm learner: batches workers' requests, acts with the policy and trains it with PPO"};
  std::string config_path;
  std::vector<std::string> overrides;
  std::string endpoint_file;
  app.add_option("--config", config_path, "YAML config file (default: built-in defaults)")->check(CLI::ExistingFile);
  app.add_option("--set", overrides, "override a config key: --set ppo.lr=1e-3 (repeatable)");
  app.add_option("--endpoint-file", endpoint_file, "write the bound endpoint to this file once listening");
  CLI11_PARSE(app, argc, argv);

  farm::FarmConfig config;
  if (auto s = farm::LoadConfig(config_path, overrides, &config); !s.ok()) {
    fmt::print(stderr, "farm-learner: {}\n", s.message());
    return 2;
  }
  std::unique_ptr<farm::Learner> learner;
  // Signals are routed to this watcher before any other thread starts.
  farm::SignalWatcher watcher([&learner](int sig) {
    if (learner) learner->RequestStop(sig == SIGINT ? "interrupted (SIGINT)" : "terminated (SIGTERM)");
  });
  if (auto s = farm::Learner::Create(config, &learner); !s.ok()) {
    fmt::print(stderr, "farm-learner: {}\n", s.message());
    return 2;
  }
  if (!endpoint_file.empty()) {
    if (auto s = farm::WriteFileAtomic(endpoint_file, learner->endpoint() + "\n"); !s.ok()) {
      fmt::print(stderr, "farm-learner: {}\n", s.message());
      return 2;
    }
  }
  nlohmann::json summary;
  if (auto s = learner->Run(&summary); !s.ok()) {
    fmt::print(stderr, "farm-learner: {}\n", s.ToString());
    return 1;
  }
  fmt::print("{}\n", summary.dump());
  return 0;
}
