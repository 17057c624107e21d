// The run directory: name, lock, config.yaml, the checks of a new run and of a resume.
#include "learner/run/run_dir.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <ctime>
#include <filesystem>
#include <map>

#include "common/config_files.h"
#include "learner/run/checkpoint.h"

namespace farm {
namespace {

std::string Timestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  return buf;
}

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

// Creates *path, or, when it is taken, *path-2, *path-3, ... (set to the one made). The default directory is named
// to the second: a second run started within it gets "-2", "-3", ... rather than the same directory. mkdir decides,
// so two learners starting at once cannot both take one name.
Status MakeFreshDirectory(std::string* path) {
  std::error_code ec;
  const std::string parent = std::filesystem::path(*path).parent_path().string();
  std::filesystem::create_directories(parent, ec);
  if (ec) return Status::IoError(fmt::format("{}: cannot create directory: {}", parent, ec.message()));
  const std::string base = *path;
  for (int n = 2; !std::filesystem::create_directory(*path, ec); ++n) {
    if (ec) return Status::IoError(fmt::format("{}: cannot create run directory: {}", *path, ec.message()));
    *path = fmt::format("{}-{}", base, n);
  }
  return Status::Ok();
}

}  // namespace

Status PlanPolicies(const FarmConfig& config, std::string* run_dir) {
  std::string path = config.run_dir;
  std::error_code ec;
  if (path.empty()) {
    path = fmt::format("runs/{}-{}", config.name, Timestamp());
    if (auto s = MakeFreshDirectory(&path); !s.ok()) return s;
  } else {
    std::filesystem::create_directories(path, ec);
    if (ec) return Status::IoError(fmt::format("{}: cannot create run directory: {}", path, ec.message()));
  }
  FarmConfig recorded = config;
  recorded.run_dir = std::filesystem::absolute(path, ec).lexically_normal().string();
  recorded.learner.resume = false;
  // The files it names, absolute, as a run directory's config.yaml has them (common/config_files.h): what starts
  // from the run directory alone (--resume, eval) reads this copy, not the config beside its files.
  if (auto s = ResolveLearnerFiles(&recorded, "", ""); !s.ok()) return s;
  if (auto s = ResolveWorkerFiles(&recorded); !s.ok()) return s;
  const auto colon = recorded.env.python.rfind(':');
  if (colon != std::string::npos && colon > 0) {
    const std::string module = recorded.env.python.substr(0, colon);
    FileQuery q;
    q.key = "env.python";
    q.path = module;
    std::string found;  // not found here: left as given (farm-worker also looks in the checkout it came from)
    if (module.size() > 3 && module.compare(module.size() - 3, 3, ".py") == 0 && FindConfigFile(recorded, q, &found).ok())
      recorded.env.python = found + recorded.env.python.substr(colon);
  }
  if (auto s = WriteFileAtomic(recorded.run_dir + "/config.yaml", DumpConfig(recorded)); !s.ok()) return s;
  *run_dir = recorded.run_dir;
  return Status::Ok();
}

std::vector<std::string> ConfigChanges(const std::string& before, const std::string& after) {
  std::map<std::string, std::string> a, b;
  FlattenYaml(YAML::Load(before), "", &a);
  FlattenYaml(YAML::Load(after), "", &b);
  std::vector<std::string> out;
  for (const auto& [key, value] : b) {
    if (key == "run_dir" || key == "learner.resume" || key == "env.python_found") continue;  // resuming sets them
    auto it = a.find(key);
    const std::string old = it == a.end() ? std::string("(absent)") : it->second;
    if (old != value) out.push_back(fmt::format("{}: {} -> {}", key, old, value));
  }
  return out;
}

Status RunDir::CheckUsable(const FarmConfig& config) {
  const std::string dir = config.run_dir;
  if (config.learner.resume && dir.empty())
    return Status::InvalidArgument("learner.resume: run_dir is not set: name the run directory to continue "
                                   "(farm-learner --resume RUN_DIR)");
  if (config.learner.resume) {
    // Checked now rather than at the first worker's Hello: a run that cannot resume should not start.
    std::string latest;
    std::vector<std::string> skipped;
    if (auto s = FindLatestValidCheckpoint(config.ResumeCheckpoints(), &latest, &skipped); !s.ok())
      return Status::NotFound(fmt::format("learner.resume: nothing to resume in run_dir '{}': {}{}", dir, s.message(),
                                          skipped.empty() ? "" : " (" + skipped.front() + ")"));
  } else if (!dir.empty()) {
    // A new run would write checkpoints with low update counts next to the old run's, which the keep-newest
    // pruning would then delete at once.
    std::error_code ec;
    const bool any = !ListCheckpoints(dir + "/checkpoints", &ec).empty();
    if (ec)
      return Status::IoError(fmt::format("run_dir '{}': cannot list {}/checkpoints: {}", dir, dir, ec.message()));
    if (any)
      return Status::InvalidArgument(fmt::format(
        "run_dir '{}' already holds another run's checkpoints: continue it with --resume (learner.resume: true) once "
        "no learner is using it, or choose another run_dir",
        dir));
  }
  return Status::Ok();
}

Status RunDir::Open(const FarmConfig& config, std::unique_ptr<RunDir>* out) {
  std::unique_ptr<RunDir> d(new RunDir());
  d->path_ = config.run_dir.empty() ? fmt::format("runs/{}-{}", config.name, Timestamp()) : config.run_dir;
  std::error_code ec;
  if (config.run_dir.empty() && !config.learner.resume) {
    if (auto s = MakeFreshDirectory(&d->path_); !s.ok()) return s;
  }
  std::filesystem::create_directories(d->checkpoints(), ec);
  if (ec) return Status::IoError(fmt::format("{}: cannot create run directory: {}", d->path_, ec.message()));
  // One learner per run directory, held until this process ends: a second one (the same run_dir, or --resume of
  // a run that is still going) would interleave checkpoints, metrics and config.yaml with this one's.
  if (auto s = DirectoryLock::Acquire(d->path_, "learner.lock", &d->lock_); !s.ok())
    return Status::InvalidArgument(fmt::format(
        "run_dir '{}' is in use by another farm-learner ({}): wait for it to stop, or choose another run_dir",
        d->path_, s.message()));
  // Resuming, config.yaml is rewritten once the checkpoint has loaded (the first Hello): a failed resume leaves it.
  if (!config.learner.resume)
    if (auto s = d->WriteConfig(config); !s.ok()) return s;
  *out = std::move(d);
  return Status::Ok();
}

Status RunDir::WriteConfig(const FarmConfig& config) const {
  FarmConfig recorded = config;
  std::error_code ec;
  recorded.run_dir = std::filesystem::absolute(path_, ec).lexically_normal().string();
  recorded.learner.resume = false;  // how this session started, not the run's: --resume says it each time
  if (!python_found_.empty()) recorded.env.python_found = python_found_;
  return WriteFileAtomic(file("config.yaml"), DumpConfig(recorded));
}

}  // namespace farm
