// farm-worker: steps one process's environments for the learner.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/config.h"
#include "common/config_files.h"
#include "common/resources.h"
#include "worker/python_launch.h"
#include "worker/worker_client.h"

namespace {
farm::WorkerClient* g_client = nullptr;

extern "C" void OnSignal(int) {
  if (g_client) g_client->RequestStop();
}
}  // namespace

int main(int argc, char** argv) {
  // The launcher, recorded before anything can delay us: PR_SET_PDEATHSIG below only covers a parent that dies
  // after it is set.
  const pid_t launcher = getppid();
  CLI::App app{"Rollout Farm worker: steps environments and asks the learner for actions"};
  std::string config_path;
  std::string endpoint;
  int index = 0;
  std::vector<std::string> overrides;
  std::string stats_file;
  bool check_python = false;
  bool python_checked = false;
  app.add_option("--config", config_path, "YAML config file (the learner's)")->check(CLI::ExistingFile);
  app.add_option("--learner", endpoint, "learner endpoint, e.g. tcp://127.0.0.1:5555 (required unless --check-python); with the config's "
                 "policies, NAME=ENDPOINT for each, comma-separated, or one tcp://HOST:PORT for the i-th policy's "
                 "learner on PORT + i");
  app.add_option("--index", index, "this worker's index (seeds and identity)")->check(CLI::NonNegativeNumber);
  app.add_option("--set", overrides, "override a config key: --set env.num_envs=64");
  app.add_option("--stats-file", stats_file, "write this worker's statistics (JSON) here at exit");
  app.add_flag("--check-python", check_python,
               "with env.python: choose the interpreter (env.python_interpreter, or automatically), print it on "
               "stdout and the choice on stderr, exit 0; or print why none can run the Python worker, exit 2. "
               "Starts nothing; prints nothing on stdout without env.python");
  app.add_flag("--python-checked", python_checked,
               "env.python_interpreter (set) has been checked by the launcher (farm-worker --check-python): run it "
               "without probing it again (the probe imports numpy: seconds of CPU across many workers)");
  CLI11_PARSE(app, argc, argv);
  if (endpoint.empty() && !check_python) {
    fmt::print(stderr, "farm-worker: --learner is required (e.g. --learner tcp://127.0.0.1:5555)\n");
    return 2;
  }

  // Die with the launcher: no orphan workers if it is killed. One that died before prctl took effect sends no
  // signal, but this process has been reparented by then: leave now, as the signal would have made us.
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (const pid_t parent = getppid(); parent != launcher) {
    fmt::print(stderr,
               "farm-worker: the launcher (pid {}) exited before this worker started (parent now pid {}); "
               "exiting\n",
               launcher, parent);
    return 1;
  }

  farm::FarmConfig config;
  if (auto s = farm::LoadConfig(config_path, overrides, &config); !s.ok()) {
    fmt::print(stderr, "farm-worker: {}\n", s.message());
    return 2;
  }
  if (auto s = farm::ResolveWorkerFiles(&config); !s.ok()) {
    fmt::print(stderr, "farm-worker: {}\n", s.message());
    return 2;
  }
  if (check_python && config.env.python.empty()) return 0;  // a C++ env: no interpreter to choose
  if (!config.env.python.empty()) {
    // The interpreter: env.python_interpreter as given, or the first of python3 on PATH and /usr/bin/python3
    // that can import the worker's modules, probed with the PYTHONPATH ExecPythonWorker will set.
    // scripts/farm asks once (--check-python) and passes the choice to every worker as env.python_interpreter with
    // --python-checked: its workers neither probe again nor say it again.
    if (check_python || !python_checked || config.env.python_interpreter.empty()) {
      farm::PythonChoice choice;
      const farm::PythonSearch search = farm::PythonSearch::FromEnvironment(config.env.python_interpreter);
      if (auto s = farm::ChoosePythonInterpreter(search, &choice); !s.ok()) {
        fmt::print(stderr, "{}\n", s.message());
        return 2;
      }
      // Said when chosen automatically (or asked for).
      if (check_python || config.env.python_interpreter.empty()) fmt::print(stderr, "{}\n", choice.note);
      config.env.python_interpreter = choice.interpreter;
    }
    // A Python env: the Python worker runs in this process's place (same pid: the launcher's signals and
    // PR_SET_PDEATHSIG reach it), with this config's settings. Its .py file: where the run found it, else from
    // here, beside the config file, then in the checkout this binary came from (common/config_files.h).
    std::vector<std::string> python_argv;
    std::string note;
    const std::string checkout = std::filesystem::path(farm::CheckoutPythonPackageDir()).parent_path().parent_path();
    farm::Status s = farm::PythonWorkerArgv(config, index, endpoint, stats_file, {checkout}, &python_argv, &note);
    if (!note.empty()) fmt::print(stderr, "farm-worker: {}\n", note);
    // Asked by the launcher: the interpreter, once the env's file is found (so that a run whose env cannot be found
    // stops before anything starts).
    if (s.ok() && check_python) {
      fmt::print("{}\n", config.env.python_interpreter);
      return 0;
    }
    if (s.ok()) s = farm::ExecPythonWorker(python_argv, farm::CheckoutPythonPackageDir());
    fmt::print(stderr, "farm-worker: {}\n", s.message());
    return 2;
  }
  std::unique_ptr<farm::WorkerClient> client;
  if (auto s = farm::WorkerClient::Create(config, index, endpoint, &client); !s.ok()) {
    fmt::print(stderr, "farm-worker: {}\n", s.message());
    return 2;
  }
  g_client = client.get();
  struct sigaction sa {};
  sa.sa_handler = OnSignal;  // no SA_RESTART: a blocking poll returns EINTR
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  const farm::Status s = client->Run();
  g_client = nullptr;
  const auto& st = client->stats();
  if (!stats_file.empty()) {
    nlohmann::json j = {{"index", index},
                        {"env_steps", st.env_steps},
                        {"episodes", st.episodes},
                        {"messages", st.messages},
                        {"reconnects", st.reconnects},
                        {"seconds", st.seconds},
                        {"sps", st.seconds > 0 ? static_cast<double>(st.env_steps) / st.seconds : 0.0},
                        {"round_trip_us_p50", st.RoundTripPercentile(0.50)},
                        {"round_trip_us_p99", st.RoundTripPercentile(0.99)},
                        {"max_rss_mb", farm::MaxRssMb()}};
    if (const farm::Normalizer* n = client->normalizer()) {
      // The statistics this worker normalised with last (env.normalize_obs / normalize_reward); with several
      // policies, the first policy's (named).
      j["normalizer"] = {{"policy", config.policies.empty() ? std::string() : config.policies[0].name},
                         {"frozen", n->frozen()},
                         {"obs_count", n->obs_view().count()},
                         {"obs_mean", n->obs_view().mean()},
                         {"obs_m2", n->obs_view().m2()},
                         {"ret_count", n->ret_view().count()},
                         {"ret_mean", n->ret_view().mean()},
                         {"ret_m2", n->ret_view().m2()}};
    }
    std::ofstream(stats_file) << j.dump() << "\n";
  }
  if (s.ok() || s.code() == farm::Status::Code::kClosed) {
    spdlog::info("worker {} done: {} env steps, {} episodes", index, st.env_steps, st.episodes);
    return 0;
  }
  fmt::print(stderr, "farm-worker {}: {}\n", index, s.ToString());
  return 1;
}
