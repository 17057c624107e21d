// Atomic checkpoint files; policy_spec.json; rebuilding a run's policy.
#include "learner/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <algorithm>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "common/files.h"
#include "common/tensorboard.h"

namespace farm {

Status SaveCheckpoint(const std::string& dir, ActorCritic& policy, torch::optim::Optimizer& optimizer,
                      const TrainingCounters& c, std::string* written_path, const LossScaler* scaler, int keep) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IoError(fmt::format("{}: cannot create directory: {}", dir, ec.message()));
  const std::string name = fmt::format("ckpt-{:08d}.pt", c.updates);
  const std::string path = dir + "/" + name;
  const std::string tmp = path + ".tmp";
  try {
    torch::serialize::OutputArchive archive;
    torch::serialize::OutputArchive policy_archive;
    policy->save(policy_archive);
    archive.write("policy", policy_archive);
    torch::serialize::OutputArchive optimizer_archive;
    optimizer.save(optimizer_archive);
    archive.write("optimizer", optimizer_archive);
    archive.write("counters", torch::tensor({c.env_steps, c.updates, c.policy_version, c.episodes}, torch::kInt64));
    archive.write("wall_seconds", torch::tensor({c.wall_seconds}, torch::kFloat64));
    if (scaler) {
      torch::serialize::OutputArchive scaler_archive;
      scaler->Save(scaler_archive);
      archive.write("loss_scaler", scaler_archive);
    }
    archive.save_to(tmp);
  } catch (const c10::Error& e) {
    return Status::IoError(fmt::format("{}: cannot write checkpoint: {}", tmp, e.what_without_backtrace()));
  }
  if (auto s = CommitFile(tmp, path); !s.ok()) return s;
  uint32_t crc = 0;
  if (auto s = FileCrc32c(path, &crc); !s.ok()) return s;
  if (auto s = WriteFileAtomic(path + ".crc32c", fmt::format("{:08x}\n", crc)); !s.ok()) return s;
  if (auto s = WriteFileAtomic(dir + "/latest", name + "\n"); !s.ok()) return s;
  if (keep > 0) {
    const auto all = ListCheckpoints(dir);  // newest first
    for (std::size_t i = static_cast<std::size_t>(keep); i < all.size(); ++i) {
      std::filesystem::remove(all[i], ec);
      std::filesystem::remove(all[i] + ".crc32c", ec);
    }
  }
  if (written_path) *written_path = path;
  return Status::Ok();
}

std::vector<std::string> ListCheckpoints(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("ckpt-", 0) == 0 && name.size() > 8 && name.compare(name.size() - 3, 3, ".pt") == 0)
      out.push_back(entry.path().string());
  }
  std::sort(out.rbegin(), out.rend());  // zero-padded update counts: newest first
  return out;
}

Status FileCrc32c(const std::string& path, uint32_t* crc) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::IoError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  std::stringstream bytes;
  bytes << in.rdbuf();
  const std::string data = bytes.str();
  *crc = Crc32c(data.data(), data.size());
  return Status::Ok();
}

Status FindLatestValidCheckpoint(const std::string& dir, std::string* path, std::vector<std::string>* skipped) {
  for (const auto& candidate : ListCheckpoints(dir)) {
    std::ifstream sidecar(candidate + ".crc32c");
    std::string expected;
    uint32_t crc = 0;
    std::string why;
    if (!sidecar || !(sidecar >> expected)) {
      why = "no .crc32c checksum file";
    } else if (auto s = FileCrc32c(candidate, &crc); !s.ok()) {
      why = s.message();
    } else if (fmt::format("{:08x}", crc) != expected) {
      why = fmt::format("checksum {:08x} does not match the recorded {} (truncated or corrupt)", crc, expected);
    } else {
      *path = candidate;
      return Status::Ok();
    }
    if (skipped) skipped->push_back(candidate + ": " + why);
  }
  return Status::NotFound(fmt::format("{}: no checkpoint with a valid checksum", dir));
}

namespace {

// LoadCheckpoint with an optional map location (LoadPolicy reads CUDA-written checkpoints on the CPU).
Status LoadCheckpointTo(const std::string& path, ActorCritic& policy, torch::optim::Optimizer* optimizer,
                        TrainingCounters* c, LossScaler* scaler, std::optional<torch::Device> device) {
  try {
    torch::serialize::InputArchive archive;
    if (device) {
      archive.load_from(path, *device);
    } else {
      archive.load_from(path);
    }
    torch::serialize::InputArchive policy_archive;
    archive.read("policy", policy_archive);
    policy->load(policy_archive);
    if (optimizer) {
      torch::serialize::InputArchive optimizer_archive;
      archive.read("optimizer", optimizer_archive);
      optimizer->load(optimizer_archive);
    }
    torch::Tensor counters, wall;
    archive.read("counters", counters);
    archive.read("wall_seconds", wall);
    if (counters.numel() != 4) return Status::InvalidArgument(path + ": counters have the wrong size");
    auto a = counters.accessor<int64_t, 1>();
    c->env_steps = a[0];
    c->updates = a[1];
    c->policy_version = a[2];
    c->episodes = a[3];
    c->wall_seconds = wall.item<double>();
    if (scaler) {
      // Optional: checkpoints written before mixed precision (or without a scaler) have no such entry.
      torch::serialize::InputArchive scaler_archive;
      if (archive.try_read("loss_scaler", scaler_archive)) scaler->Load(scaler_archive);
    }
  } catch (const c10::Error& e) {
    return Status::IoError(fmt::format("{}: cannot read checkpoint: {}", path, e.what_without_backtrace()));
  }
  return Status::Ok();
}

}  // namespace

Status LoadCheckpoint(const std::string& path, ActorCritic& policy, torch::optim::Optimizer* optimizer,
                      TrainingCounters* c, LossScaler* scaler) {
  return LoadCheckpointTo(path, policy, optimizer, c, scaler, std::nullopt);
}

// ---- policy_spec.json ----

namespace {

using nlohmann::json;

// Written in key order (kind first, observation before action), for people reading the file.
using ordered_json = nlohmann::ordered_json;

ordered_json BoundsJson(const std::vector<float>& values) {
  ordered_json out = ordered_json::array();
  for (float v : values) {
    if (std::isfinite(v)) {
      out.push_back(static_cast<double>(v));
    } else if (std::isnan(v)) {
      out.push_back("nan");
    } else {
      out.push_back(v > 0 ? "inf" : "-inf");
    }
  }
  return out;
}

ordered_json SpaceJson(const Space& space) {
  ordered_json j;
  j["kind"] = space.is_discrete() ? "discrete" : "box";
  j["shape"] = space.is_discrete() ? std::vector<int64_t>{} : space.shape;
  j["n"] = space.is_discrete() ? space.n : 0;
  j["low"] = space.is_discrete() ? ordered_json::array() : BoundsJson(space.low);
  j["high"] = space.is_discrete() ? ordered_json::array() : BoundsJson(space.high);
  return j;
}

Status ParseBounds(const json& j, const std::string& where, std::vector<float>* out) {
  if (!j.is_array())
    return Status::InvalidArgument(fmt::format("{}: expected an array of numbers, got {}", where, j.dump()));
  out->clear();
  for (std::size_t i = 0; i < j.size(); ++i) {
    const json& v = j[i];
    if (v.is_number()) {
      out->push_back(static_cast<float>(v.get<double>()));
    } else if (v.is_string() && (v == "inf" || v == "+inf")) {
      out->push_back(std::numeric_limits<float>::infinity());
    } else if (v.is_string() && v == "-inf") {
      out->push_back(-std::numeric_limits<float>::infinity());
    } else if (v.is_string() && v == "nan") {
      out->push_back(std::numeric_limits<float>::quiet_NaN());
    } else {
      return Status::InvalidArgument(
          fmt::format("{}[{}]: expected a number or \"inf\", \"-inf\", \"nan\", got {}", where, i, v.dump()));
    }
  }
  return Status::Ok();
}

Status ParseSpace(const json& j, const std::string& where, Space* out) {
  if (!j.is_object())
    return Status::InvalidArgument(
        fmt::format("{}: expected an object {{\"kind\", \"shape\", \"n\", \"low\", "
                    "\"high\"}}, got {}",
                    where, j.dump()));
  for (const auto& item : j.items()) {
    const std::string& key = item.key();
    if (key != "kind" && key != "shape" && key != "n" && key != "low" && key != "high")
      return Status::InvalidArgument(
          fmt::format("{}: unknown key '{}' (expected kind, shape, n, low, high)", where, key));
  }
  if (!j.contains("kind") || !j["kind"].is_string())
    return Status::InvalidArgument(fmt::format("{}.kind: expected \"discrete\" or \"box\"", where));
  const std::string kind = j["kind"].get<std::string>();
  if (kind == "discrete") {
    if (!j.contains("n") || !j["n"].is_number_integer() || j["n"].get<int64_t>() <= 0)
      return Status::InvalidArgument(fmt::format("{}.n: expected an integer > 0 for a discrete space, got {}", where,
                                                 j.contains("n") ? j["n"].dump() : std::string("nothing")));
    for (const char* key : {"shape", "low", "high"}) {
      if (j.contains(key) && !(j[key].is_array() && j[key].empty()))
        return Status::InvalidArgument(
            fmt::format("{}.{}: expected [] for a discrete space, got {}", where, key, j[key].dump()));
    }
    *out = Space::Discrete(j["n"].get<int64_t>());
    return Status::Ok();
  }
  if (kind != "box")
    return Status::InvalidArgument(fmt::format("{}.kind: expected \"discrete\" or \"box\", got \"{}\"", where, kind));
  if (!j.contains("shape") || !j["shape"].is_array())
    return Status::InvalidArgument(fmt::format("{}.shape: expected an array of positive integers", where));
  std::vector<int64_t> shape;
  for (const json& d : j["shape"]) {
    if (!d.is_number_integer() || d.get<int64_t>() <= 0)
      return Status::InvalidArgument(
          fmt::format("{}.shape: expected an array of positive integers, got {}", where, j["shape"].dump()));
    shape.push_back(d.get<int64_t>());
  }
  if (j.contains("n") && !(j["n"].is_number_integer() && j["n"].get<int64_t>() == 0))
    return Status::InvalidArgument(fmt::format("{}.n: expected 0 for a box space, got {}", where, j["n"].dump()));
  std::vector<float> low, high;
  if (!j.contains("low")) return Status::InvalidArgument(fmt::format("{}.low: missing (a box needs bounds)", where));
  if (!j.contains("high")) return Status::InvalidArgument(fmt::format("{}.high: missing (a box needs bounds)", where));
  if (auto s = ParseBounds(j["low"], where + ".low", &low); !s.ok()) return s;
  if (auto s = ParseBounds(j["high"], where + ".high", &high); !s.ok()) return s;
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  if (static_cast<int64_t>(low.size()) != numel || static_cast<int64_t>(high.size()) != numel)
    return Status::InvalidArgument(fmt::format("{}: low and high need {} entries each (shape [{}]), got {} and {}",
                                               where, numel, fmt::join(shape, ", "), low.size(), high.size()));
  *out = Space::Box(std::move(shape), std::move(low), std::move(high));
  return Status::Ok();
}

// The whole file, or NotFound / IoError naming it and what it should be.
Status ReadTextFile(const std::string& path, const std::string& what, std::string* out) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    return Status::NotFound(fmt::format("{}: not found (expected {})", path, what));
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::IoError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return Status::IoError(fmt::format("{}: read error", path));
  *out = text.str();
  return Status::Ok();
}

}  // namespace

std::string PolicySpecJson(const Space& obs, const Space& action, const std::vector<int>& hidden) {
  ordered_json j;
  j["observation"] = SpaceJson(obs);
  j["action"] = SpaceJson(action);
  j["hidden_sizes"] = hidden;
  return j.dump(2) + "\n";
}

Status ParsePolicySpecJson(const std::string& text, const std::string& source, Space* obs, Space* action,
                           std::vector<int>* hidden) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    return Status::InvalidArgument(fmt::format("{}: not valid JSON: {}", source, e.what()));
  }
  if (!j.is_object())
    return Status::InvalidArgument(
        fmt::format("{}: expected an object with observation, action and hidden_sizes", source));
  for (const auto& item : j.items()) {
    const std::string& key = item.key();
    if (key != "observation" && key != "action" && key != "hidden_sizes")
      return Status::InvalidArgument(
          fmt::format("{}: unknown key '{}' (expected observation, action, hidden_sizes)", source, key));
  }
  for (const char* key : {"observation", "action", "hidden_sizes"}) {
    if (!j.contains(key)) return Status::InvalidArgument(fmt::format("{}: missing key '{}'", source, key));
  }
  if (auto s = ParseSpace(j["observation"], source + ": observation", obs); !s.ok()) return s;
  if (auto s = ParseSpace(j["action"], source + ": action", action); !s.ok()) return s;
  const json& h = j["hidden_sizes"];
  if (!h.is_array())
    return Status::InvalidArgument(
        fmt::format("{}: hidden_sizes: expected an array of positive integers, got {}", source, h.dump()));
  hidden->clear();
  for (const json& w : h) {
    if (!w.is_number_integer() || w.get<int64_t>() <= 0 || w.get<int64_t>() > std::numeric_limits<int>::max())
      return Status::InvalidArgument(
          fmt::format("{}: hidden_sizes: expected an array of positive integers, got {}", source, h.dump()));
    hidden->push_back(static_cast<int>(w.get<int64_t>()));
  }
  return Status::Ok();
}

Status LoadPolicy(const std::string& run_dir, ActorCritic* policy, FarmConfig* config, TrainingCounters* counters,
                  std::string* checkpoint_path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(run_dir, ec))
    return Status::NotFound(fmt::format("{}: not a directory (expected a training run directory)", run_dir));

  const std::string config_path = run_dir + "/config.yaml";
  if (!std::filesystem::exists(config_path, ec))
    return Status::NotFound(fmt::format("{}: not found (expected the run's resolved config; is {} a run directory?)",
                                        config_path, run_dir));
  FarmConfig cfg;
  if (auto s = LoadConfig(config_path, {}, &cfg); !s.ok()) return s;

  const std::string spec_path = run_dir + "/policy_spec.json";
  std::string spec_text;
  if (auto s = ReadTextFile(spec_path, "the policy's spaces and widths, written when the learner creates the policy",
                            &spec_text);
      !s.ok())
    return s;
  Space obs, action;
  std::vector<int> hidden;
  if (auto s = ParsePolicySpecJson(spec_text, spec_path, &obs, &action, &hidden); !s.ok()) return s;

  const std::string latest_path = run_dir + "/checkpoints/latest";
  std::string latest;
  if (auto s = ReadTextFile(latest_path, "the latest checkpoint's file name, written with each checkpoint", &latest);
      !s.ok())
    return s;
  const auto first = latest.find_first_not_of(" \t\r\n");
  const auto last = latest.find_last_not_of(" \t\r\n");
  latest = first == std::string::npos ? std::string() : latest.substr(first, last - first + 1);
  if (latest.empty() || latest.find('/') != std::string::npos || latest.find('\n') != std::string::npos)
    return Status::InvalidArgument(
        fmt::format("{}: expected one checkpoint file name such as ckpt-00000042.pt, got '{}'", latest_path, latest));
  const std::string ckpt_path = run_dir + "/checkpoints/" + latest;
  if (!std::filesystem::exists(ckpt_path, ec))
    return Status::NotFound(fmt::format("{}: not found (named by {})", ckpt_path, latest_path));

  ActorCritic built{nullptr};
  try {
    built = ActorCritic(obs, action, hidden);
  } catch (const std::exception& e) {
    return Status::InvalidArgument(fmt::format("{}: cannot build the policy: {}", spec_path, e.what()));
  }
  // InputArchive replaces tensors whatever their shape: remember the shapes the spec implies and compare after.
  std::map<std::string, std::vector<int64_t>> expected;
  for (const auto& item : built->named_parameters()) expected[item.key()] = item.value().sizes().vec();
  for (const auto& item : built->named_buffers()) expected[item.key()] = item.value().sizes().vec();

  TrainingCounters loaded;
  if (auto s = LoadCheckpointTo(ckpt_path, built, nullptr, &loaded, nullptr, torch::Device(torch::kCPU)); !s.ok())
    return s;
  auto check_shapes = [&](const torch::OrderedDict<std::string, torch::Tensor>& tensors) -> Status {
    for (const auto& item : tensors) {
      const auto& want = expected[item.key()];
      if (item.value().sizes().vec() != want)
        return Status::InvalidArgument(fmt::format(
            "{}: {} has shape [{}] but {} implies [{}] (checkpoint and policy spec are from different policies?)",
            ckpt_path, item.key(), fmt::join(item.value().sizes(), ", "), spec_path, fmt::join(want, ", ")));
    }
    return Status::Ok();
  };
  if (auto s = check_shapes(built->named_parameters()); !s.ok()) return s;
  if (auto s = check_shapes(built->named_buffers()); !s.ok()) return s;
  built->to(torch::kFloat32);
  built->eval();

  *policy = built;
  *config = std::move(cfg);
  if (counters) *counters = loaded;
  if (checkpoint_path) *checkpoint_path = ckpt_path;
  return Status::Ok();
}

}  // namespace farm
