// Finding the files a config names (common/config_files.h).
#include "common/config_files.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>

namespace farm {
namespace {

namespace fs = std::filesystem;

std::string Normal(const fs::path& p) {
  std::error_code ec;
  return fs::absolute(p, ec).lexically_normal().string();
}

void Add(std::vector<std::string>* out, const fs::path& p) {
  if (p.empty()) return;
  const std::string s = Normal(p);
  for (const std::string& have : *out)
    if (have == s) return;
  out->push_back(s);
}

bool Exists(const std::string& path, const FileQuery& q) {
  std::error_code ec;
  if (q.either) return fs::exists(path, ec);
  return q.directory ? fs::is_directory(path, ec) : fs::is_regular_file(path, ec);
}

}  // namespace

std::vector<std::string> RecordedPlaces(const FarmConfig& config, const std::string& recorded) {
  std::vector<std::string> out;
  if (recorded.empty()) return out;
  const fs::path r(recorded);
  Add(&out, r);
  // A run directory read from elsewhere than where it was recorded: the same place relative to it (the project
  // folder moved with it), then beside it and inside it.
  if (!config.in_run_dir || !r.is_absolute()) return out;
  const fs::path here(config.source_dir);
  if (!config.run_dir.empty() && fs::path(config.run_dir).is_absolute() && fs::path(config.run_dir) != here) {
    const fs::path rel = r.lexically_relative(config.run_dir);
    if (!rel.empty()) Add(&out, here / rel);
  }
  Add(&out, here.parent_path() / r.filename());
  Add(&out, here / r.filename());
  return out;
}

std::vector<std::string> ConfigFileCandidates(const FarmConfig& config, const FileQuery& q) {
  std::vector<std::string> out;
  for (const std::string& p : q.preferred) Add(&out, p);
  // An absolute path says which file is meant: it (and, from a moved run directory, where it is now) comes before
  // what the run recorded for the key.
  const fs::path p(q.path);
  for (const std::string& place : RecordedPlaces(config, p.is_absolute() ? q.path : std::string())) Add(&out, place);
  for (const std::string& place : RecordedPlaces(config, q.recorded)) Add(&out, place);
  if (p.is_relative()) {
    std::error_code ec;
    Add(&out, fs::current_path(ec) / p);
    if (!config.source_dir.empty()) Add(&out, fs::path(config.source_dir) / p);
    for (const std::string& d : q.also)
      if (!d.empty()) Add(&out, fs::path(d) / p);
  }
  return out;
}

Status FindConfigFile(const FarmConfig& config, const FileQuery& q, std::string* found) {
  const std::vector<std::string> candidates = ConfigFileCandidates(config, q);
  for (const std::string& c : candidates) {
    if (Exists(c, q)) {
      *found = c;
      return Status::Ok();
    }
  }
  const char* what = q.either ? "file or directory" : q.directory ? "directory" : "file";
  return Status::NotFound(fmt::format("{}: {} '{}' not found (looked for {}); {}", q.key, what, q.path,
                                      fmt::join(candidates, ", "),
                                      q.hint.empty() ? fmt::format("set {} to where it is now (--set {}=PATH)", q.key,
                                                                   q.key)
                                                     : q.hint));
}

Status ResolveLearnerFiles(FarmConfig* config, const std::string& actor_copy, const std::string& critic_copy) {
  const auto resolve = [&](const char* key, std::string* value, FileQuery q, bool required) -> Status {
    if (value->empty()) return Status::Ok();
    q.key = key;
    q.path = *value;
    std::string found;
    Status s = FindConfigFile(*config, q, &found);
    if (s.ok()) {
      *value = found;
    } else if (required) {
      return s;
    }
    return Status::Ok();
  };
  const auto copy = [&](const std::string& name) {
    std::vector<std::string> out;
    if (config->in_run_dir && !name.empty()) out.push_back((fs::path(config->source_dir) / name).string());
    return out;
  };
  FileQuery dir;
  dir.directory = true;
  if (auto s = resolve("learner.init_from", &config->learner.init_from, dir, true); !s.ok()) return s;
  FileQuery actor;
  actor.preferred = copy(actor_copy);
  if (auto s = resolve("ppo.actor_encoder_script", &config->ppo.actor_encoder_script, actor, true); !s.ok()) return s;
  FileQuery critic;
  critic.preferred = copy(critic_copy);
  if (auto s = resolve("ppo.critic_encoder_script", &config->ppo.critic_encoder_script, critic, true); !s.ok())
    return s;
  TransportConfig& t = config->transport;
  const bool curve = t.curve;
  FileQuery authorized;
  authorized.either = true;
  if (auto s = resolve("transport.curve_learner_secret_key_file", &t.curve_learner_secret_key_file, {}, curve); !s.ok())
    return s;
  if (auto s = resolve("transport.curve_authorized_keys", &t.curve_authorized_keys, authorized, curve); !s.ok())
    return s;
  (void)resolve("transport.curve_learner_public_key_file", &t.curve_learner_public_key_file, {}, false);
  (void)resolve("transport.curve_worker_secret_key_file", &t.curve_worker_secret_key_file, {}, false);
  (void)resolve("env.mujoco.model", &config->env.mujoco.model, {}, false);
  return Status::Ok();
}

Status ResolveEnvFiles(FarmConfig* config) {
  std::string& model = config->env.mujoco.model;
  if (model.empty()) return Status::Ok();
  FileQuery q;
  q.key = "env.mujoco.model";
  q.path = model;
  std::string found;
  if (auto s = FindConfigFile(*config, q, &found); !s.ok()) return s;
  model = found;
  return Status::Ok();
}

Status ResolveWorkerFiles(FarmConfig* config) {
  if (auto s = ResolveEnvFiles(config); !s.ok()) return s;
  TransportConfig& t = config->transport;
  if (!t.curve) return Status::Ok();
  for (auto [key, value] : {std::pair<const char*, std::string*>{"transport.curve_worker_secret_key_file",
                                                                  &t.curve_worker_secret_key_file},
                            {"transport.curve_learner_public_key_file", &t.curve_learner_public_key_file}}) {
    if (value->empty()) continue;
    FileQuery q;
    q.key = key;
    q.path = *value;
    std::string found;
    if (auto s = FindConfigFile(*config, q, &found); !s.ok()) return s;
    *value = found;
  }
  return Status::Ok();
}

}  // namespace farm
