// farm-learner: central batched inference and PPO training for a run.
#include <CLI/CLI.hpp>
#include <atomic>
#include <mutex>
#include <csignal>
#include <filesystem>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/config.h"
#include "common/resources.h"
#include "common/signal_watcher.h"
#include "learner/learner.h"
#include "learner/model/blas_kernel.h"
#include "learner/model/device.h"
#include "learner/run/checkpoint_files.h"
#include "learner/run/metrics.h"
#include "learner/run/run_dir.h"

int main(int argc, char** argv) {
  // First: it may start this program again with a better OpenBLAS kernel (learner/model/blas_kernel.h).
  const farm::BlasKernelStart blas_kernel = farm::StartWithBestBlasKernel(argv);
  // A file size limit (ulimit -f, a container's) makes a write past it fail with EFBIG instead of killing the
  // process: the learner then reports the file it could not write and goes on or stops in order, as on a full
  // disk.
  std::signal(SIGXFSZ, SIG_IGN);
  // Before the first tensor: every batch's and minibatch's temporaries are then reused, not faulted in afresh.
  const std::string allocator = farm::KeepFreedMemoryForReuse();
  // Before the first BLAS call: OpenBLAS's pool restarts with the shorter wait.
  const std::string blas = farm::ShortenBlasThreadWait().message;
  CLI::App app{"Rollout Farm learner: batches workers' requests, acts with the policy and trains it with PPO"};
  std::string config_path;
  std::vector<std::string> overrides;
  std::string endpoint_file;
  app.add_option("--config", config_path, "YAML config file (default: built-in defaults)")->check(CLI::ExistingFile);
  app.add_option("--set", overrides, "override a config key: --set ppo.lr=1e-3 (repeatable)");
  app.add_option("--endpoint-file", endpoint_file, "write the bound endpoint to this file once listening");
  bool print_blas = false;
  app.add_flag("--blas-kernel", print_blas,
               "check and choose the OpenBLAS kernel as at every start, print the variables that give other "
               "processes the same kernel without checking again (NAME=value lines), and exit");
  std::string serve_dir, resume_dir;
  app.add_option("--resume", resume_dir,
                 "continue this run directory from its latest valid checkpoint: policy, optimizer, counters, "
                 "random generators, episode window (config: --config, else RUN_DIR/config.yaml, else the "
                 "checkpoint's own; --set still applies)")
      ->check(CLI::ExistingDirectory);
  app.add_option("--serve", serve_dir,
                 "serve the latest policy of this run directory without training (its config.yaml unless --config)")
      ->check(CLI::ExistingDirectory);
  std::string policy;
  app.add_option("--policy", policy,
                 "in a config with policies: be the learner of this one (its overrides applied, run directory "
                 "run_dir/NAME); scripts/farm train starts one per policy");
  bool policies_plan = false;
  app.add_flag("--policies-plan", policies_plan,
               "in a config with policies: write run_dir/config.yaml (the run's config; run_dir "
               "runs/NAME-TIMESTAMP when not set), print 'run_dir PATH' and 'policy NAME' lines and exit; "
               "prints nothing for a config without policies");
  CLI11_PARSE(app, argc, argv);
  if (print_blas) {
    if (blas_kernel.warning) fmt::print(stderr, "farm-learner: {}\n", blas_kernel.message);
    fmt::print("{}", farm::BlasKernelEnvironment());
    return 0;
  }

  if (!serve_dir.empty()) {
    if (config_path.empty()) config_path = serve_dir + "/config.yaml";
    // Serving: the run's policy, no updates, until stopped. User overrides still come last.
    std::vector<std::string> serve = {"learner.init_from=" + serve_dir, "learner.train=false", "learner.resume=false",
                                      "total_env_steps=4611686018427387904", "stop_at_target=false", "run_dir=",
                                      "name=serve"};
    overrides.insert(overrides.begin(), serve.begin(), serve.end());
  }
  farm::FarmConfig config;
  if (!resume_dir.empty()) {
    overrides.insert(overrides.begin(), {"run_dir=" + resume_dir, "learner.resume=true"});
    std::error_code ec;
    if (config_path.empty() && std::filesystem::exists(resume_dir + "/config.yaml", ec))
      config_path = resume_dir + "/config.yaml";
    if (config_path.empty()) {
      // No config.yaml (deleted, or copied without it): the config the newest valid checkpoint was written with.
      std::string checkpoint, yaml;
      farm::Status s = farm::FindLatestValidCheckpoint(resume_dir + "/checkpoints", &checkpoint, nullptr);
      if (s.ok()) s = farm::ReadCheckpointConfig(checkpoint, &yaml);
      if (s.ok()) s = farm::ParseConfig(yaml, checkpoint + " (its stored config)", &config);
      farm::NoteConfigSource(resume_dir + "/config.yaml", &config);  // the run directory's, for its files
      if (!s.ok()) {
        fmt::print(stderr, "farm-learner: --resume {}: no config.yaml there, and no config from a checkpoint: {}\n",
                   resume_dir, s.message());
        return 2;
      }
      fmt::print(stderr, "farm-learner: --resume {}: no config.yaml; using the config stored in {}\n", resume_dir,
                 checkpoint);
    }
  }
  if (auto s = farm::LoadConfig(config_path, overrides, &config); !s.ok()) {
    fmt::print(stderr, "farm-learner: {}\n", s.message());
    return 2;
  }
  if (policies_plan) {
    if (config.policies.empty()) return 0;
    std::string run_dir;
    if (auto s = farm::PlanPolicies(config, &run_dir); !s.ok()) {
      fmt::print(stderr, "farm-learner: --policies-plan: {}\n", s.message());
      return 2;
    }
    fmt::print("run_dir {}\n", run_dir);
    for (const auto& p : config.policies) fmt::print("policy {}\n", p.name);
    return 0;
  }
  if (!policy.empty()) {
    if (auto s = farm::PolicyRunConfig(farm::FarmConfig(config), policy, &config); !s.ok()) {
      fmt::print(stderr, "farm-learner: --policy {}: {}\n", policy, s.message());
      return 2;
    }
  } else if (!config.policies.empty()) {
    fmt::print(stderr,
               "farm-learner: the config has policies ({} of them): start one learner per policy with --policy NAME "
               "(scripts/farm train does)\n",
               config.policies.size());
    return 2;
  }
  spdlog::info("{}", allocator);
  if (blas_kernel.warning) {
    spdlog::warn("{}", blas_kernel.message);
  } else {
    spdlog::info("{}", blas_kernel.message);
  }
  spdlog::info("{}", blas);
  // The watcher thread and this one meet here: a signal before the learner exists is kept and delivered once it
  // does (the mutex makes "not yet running" and "remember the signal" one step, so none is lost in between).
  std::mutex signal_mu;
  farm::Learner* running = nullptr;  // GUARDED_BY(signal_mu)
  int early_stop = 0;                // GUARDED_BY(signal_mu): a signal before the learner existed
  const auto reason = [](int sig) {
    return std::string(sig == SIGINT    ? "interrupted (SIGINT)"
                       : sig == SIGHUP ? "hung up (SIGHUP: the terminal or session closed)"
                                       : "terminated (SIGTERM)");
  };
  farm::SignalWatcher watcher([&](int sig) {
    std::lock_guard<std::mutex> lock(signal_mu);
    if (running) {
      running->RequestStop(reason(sig));
    } else if (early_stop == 0) {
      early_stop = sig;
    }
  });
  // Made after the watcher, so destroyed before it: a signal while the learner shuts down (its threads, sockets and
  // buffers, after the run's final checkpoint and summary) reaches the watcher, which no longer has a learner to
  // stop, instead of the default action, which would kill a process that is ending cleanly (a launcher's SIGTERM to
  // every learner once the first has finished, say). A second one kForceAfter later still ends it.
  std::unique_ptr<farm::Learner> learner;
  if (auto s = farm::Learner::Create(config, &learner); !s.ok()) {
    fmt::print(stderr, "farm-learner: {}\n", s.message());
    return 2;
  }
  {
    std::lock_guard<std::mutex> lock(signal_mu);
    running = learner.get();
    if (early_stop != 0) learner->RequestStop(reason(early_stop) + " during start-up");
  }
  if (!endpoint_file.empty()) {
    if (auto s = farm::WriteFileAtomic(endpoint_file, learner->endpoint() + "\n"); !s.ok()) {
      fmt::print(stderr, "farm-learner: {}\n", s.message());
      return 2;
    }
  }
  nlohmann::json summary;
  const farm::Status run_status = learner->Run(&summary);
  {
    std::lock_guard<std::mutex> lock(signal_mu);
    running = nullptr;
  }
  if (auto s = run_status; !s.ok()) {
    fmt::print(stderr, "farm-learner: {}\n", s.ToString());
    return 1;
  }
  if (learner->rank() == 0) fmt::print("{}\n", summary.dump());  // the run's; the other ranks' are in their logs
  return 0;
}
