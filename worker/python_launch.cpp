#include "worker/python_launch.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace farm {

Status PythonWorkerArgv(const FarmConfig& config, int index, const std::string& learner_endpoint,
                        const std::string& stats_file, const std::vector<std::string>& search_dirs,
                        std::vector<std::string>* argv) {
  const EnvConfig& env = config.env;
  std::string spec = env.python;
  const auto colon = spec.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == spec.size())
    return Status::InvalidArgument(fmt::format(
        "env.python: expected MODULE:FACTORY (a module name or a path to a .py file, then the function that makes "
        "one env), got '{}'",
        spec));
  std::string module = spec.substr(0, colon);
  if (module.size() > 3 && module.compare(module.size() - 3, 3, ".py") == 0) {
    std::error_code ec;
    std::filesystem::path found;
    std::vector<std::string> tried;
    const std::filesystem::path rel(module);
    std::vector<std::filesystem::path> candidates{std::filesystem::absolute(rel, ec)};
    if (rel.is_relative())
      for (const auto& d : search_dirs)
        if (!d.empty()) candidates.push_back(std::filesystem::absolute(std::filesystem::path(d) / rel, ec));
    for (const auto& c : candidates) {
      if (std::filesystem::is_regular_file(c, ec)) {
        found = c.lexically_normal();
        break;
      }
      tried.push_back(c.lexically_normal().string());
    }
    if (found.empty())
      return Status::InvalidArgument(
          fmt::format("env.python: file '{}' not found (looked for {})", module, fmt::join(tried, ", ")));
    spec = found.string() + spec.substr(colon);
  }
  if (env.python_interpreter.empty())
    return Status::InvalidArgument("env.python_interpreter: expected a Python interpreter (python3, or a path)");
  std::vector<std::string> a = {env.python_interpreter,
                                "-m",
                                "farm_worker",
                                "--learner",
                                learner_endpoint,
                                "--env-module",
                                spec,
                                "--num-envs",
                                std::to_string(env.num_envs),
                                "--groups",
                                std::to_string(env.num_groups),
                                "--seed",
                                std::to_string(config.seed),
                                "--index",
                                std::to_string(index),
                                "--give-up-s",
                                fmt::format("{}", config.transport.worker_give_up_s),
                                "--frame-stack",
                                std::to_string(env.frame_stack)};
  if (env.normalize_obs || env.normalize_reward) {
    if (env.normalize_obs) a.push_back("--normalize-obs");
    if (env.normalize_reward) a.push_back("--normalize-reward");
    a.insert(a.end(), {"--obs-clip", fmt::format("{}", env.obs_clip), "--reward-clip",
                       fmt::format("{}", env.reward_clip), "--gamma", fmt::format("{}", config.ppo.gamma),
                       "--rollout-length", std::to_string(config.ppo.rollout_length)});
  }
  if (config.transport.curve) {
    const auto& t = config.transport;
    if (t.curve_worker_secret_key_file.empty() || t.curve_learner_public_key_file.empty())
      return Status::InvalidArgument(
          "transport.curve: a worker needs transport.curve_worker_secret_key_file and "
          "transport.curve_learner_public_key_file");
    a.insert(a.end(), {"--curve-worker-secret-key-file", t.curve_worker_secret_key_file,
                       "--curve-learner-public-key-file", t.curve_learner_public_key_file});
  }
  if (!stats_file.empty()) a.insert(a.end(), {"--stats-file", stats_file});
  *argv = std::move(a);
  return Status::Ok();
}

Status ExecPythonWorker(const std::vector<std::string>& argv, const std::string& package_dir) {
  std::error_code ec;
  if (!package_dir.empty() && std::filesystem::is_directory(package_dir + "/farm_worker", ec)) {
    const char* old = std::getenv("PYTHONPATH");
    const std::string path = old && *old ? package_dir + ":" + old : package_dir;
    setenv("PYTHONPATH", path.c_str(), 1);
  }
  std::vector<char*> args;
  for (const auto& s : argv) args.push_back(const_cast<char*>(s.c_str()));
  args.push_back(nullptr);
  execvp(args[0], args.data());
  return Status::InvalidArgument(fmt::format("env.python_interpreter: cannot run '{}': {}", argv[0],
                                             std::strerror(errno)));
}

std::string CheckoutPythonPackageDir() { return FARM_PYTHON_PACKAGE_DIR; }

}  // namespace farm
