// Atomic checkpoint files; rebuilding a run's policy (policy_spec.json itself: policy_spec.cpp).
#include "learner/run/checkpoint.h"

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
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "common/files.h"
#include "common/tensorboard.h"

namespace farm {

torch::Tensor GeneratorState(torch::Generator& generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state().clone();
}

Status SetGeneratorState(torch::Generator& generator, const torch::Tensor& state, const std::string& what) {
  try {
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state.to(torch::kCPU).contiguous());
  } catch (const c10::Error& e) {
    return Status::InvalidArgument(
        fmt::format("random generator '{}': cannot restore its state: {}", what, e.what_without_backtrace()));
  }
  return Status::Ok();
}

namespace {

// "solved_at": [steps, seconds, unix seconds], all -1 when the target was not reached.
torch::Tensor SolvedAtTensor(const RunState& s) {
  if (!s.solved_at_steps) return torch::full({3}, -1.0, torch::kFloat64);
  return torch::tensor({static_cast<double>(*s.solved_at_steps), s.solved_at_seconds.value_or(-1.0),
                        s.solved_at_unix.value_or(-1.0)},
                       torch::kFloat64);
}

void WriteRunState(torch::serialize::OutputArchive& archive, const RunState& s) {
  torch::serialize::OutputArchive rng;
  for (const auto& [name, state] : s.rng) rng.write(name, state);
  archive.write("rng", rng);
  if (s.has_episode_window) {
    torch::serialize::OutputArchive window;
    window.write("returns", torch::tensor(s.episode_returns, torch::kFloat64));
    window.write("lengths", torch::tensor(s.episode_lengths, torch::kInt64));
    archive.write("episode_window", window);
  }
  archive.write("solved_at", SolvedAtTensor(s));
  if (!s.config_yaml.empty()) archive.write("config_yaml", c10::IValue(s.config_yaml));
  if (s.has_normalizer) {
    torch::serialize::OutputArchive normalizer;
    for (const auto& [name, m] : {std::pair<const char*, const RunningMoments*>{"obs", &s.normalizer_obs},
                                  std::pair<const char*, const RunningMoments*>{"ret", &s.normalizer_ret}}) {
      normalizer.write(fmt::format("{}_count", name), torch::tensor({m->count()}, torch::kInt64));
      normalizer.write(fmt::format("{}_mean", name), torch::tensor(m->mean(), torch::kFloat64));
      normalizer.write(fmt::format("{}_m2", name), torch::tensor(m->m2(), torch::kFloat64));
    }
    archive.write("normalizer", normalizer);
  }
  if (s.has_policy_lag) {
    std::vector<int64_t> lags, counts;
    for (const auto& [lag, n] : s.lag_counts) {
      lags.push_back(lag);
      counts.push_back(n);
    }
    torch::serialize::OutputArchive lag;
    lag.write("lags", torch::tensor(lags, torch::kInt64));
    lag.write("counts", torch::tensor(counts, torch::kInt64));
    lag.write("dropped", torch::tensor({s.lag_dropped}, torch::kInt64));
    archive.write("policy_lag", lag);
  }
  if (s.has_critic_watch)  // [constant updates, reported at update or -1]
    archive.write("critic_watch",
                  torch::tensor({s.critic_constant_updates, s.critic_reported_at.value_or(-1)}, torch::kInt64));
}

// The "critic_watch" entry: has_critic_watch false when the archive has none.
Status ReadCriticWatch(torch::serialize::InputArchive& archive, const std::string& path, RunState* s) {
  torch::Tensor watch;
  s->has_critic_watch = archive.try_read("critic_watch", watch);
  if (!s->has_critic_watch) return Status::Ok();
  if (watch.numel() != 2)
    return Status::InvalidArgument(
        fmt::format("{}: critic_watch: expected 2 entries (constant updates, reported at), got {}", path, watch.numel()));
  watch = watch.to(torch::kCPU, torch::kInt64).contiguous();
  const int64_t constant = watch.data_ptr<int64_t>()[0], reported = watch.data_ptr<int64_t>()[1];
  if (constant < 0 || reported < -1)
    return Status::InvalidArgument(fmt::format("{}: critic_watch: {} constant updates, reported at {} (expected >= 0, "
                                               "and -1 for none)",
                                               path, constant, reported));
  s->critic_constant_updates = constant;
  s->critic_reported_at = reported >= 0 ? std::optional<int64_t>(reported) : std::nullopt;
  return Status::Ok();
}

// The "policy_lag" entry: has_policy_lag false when the archive has none.
Status ReadPolicyLag(torch::serialize::InputArchive& archive, const std::string& path, RunState* s) {
  torch::serialize::InputArchive lag;
  s->has_policy_lag = archive.try_read("policy_lag", lag);
  if (!s->has_policy_lag) return Status::Ok();
  torch::Tensor lags, counts, dropped;
  lag.read("lags", lags);
  lag.read("counts", counts);
  lag.read("dropped", dropped);
  if (lags.dim() != 1 || counts.dim() != 1 || lags.numel() != counts.numel() || dropped.numel() != 1)
    return Status::InvalidArgument(fmt::format("{}: policy_lag: expected lags and counts of one length and one "
                                               "dropped count, got {}, {} and {} entries",
                                               path, lags.numel(), counts.numel(), dropped.numel()));
  lags = lags.to(torch::kCPU, torch::kInt64).contiguous();
  counts = counts.to(torch::kCPU, torch::kInt64).contiguous();
  s->lag_dropped = dropped.to(torch::kInt64).item<int64_t>();
  for (int64_t i = 0; i < lags.numel(); ++i) {
    const int64_t l = lags.data_ptr<int64_t>()[i], n = counts.data_ptr<int64_t>()[i];
    if (l < 0 || n < 0)
      return Status::InvalidArgument(fmt::format("{}: policy_lag: lag {} with {} samples (expected both >= 0)", path,
                                                 l, n));
    s->lag_counts[l] = n;
  }
  if (s->lag_dropped < 0)
    return Status::InvalidArgument(fmt::format("{}: policy_lag: {} dropped samples", path, s->lag_dropped));
  return Status::Ok();
}

// The "normalizer" entry: false when the archive has none.
Status ReadNormalizer(torch::serialize::InputArchive& archive, const std::string& path, bool* found,
                      RunningMoments* obs, RunningMoments* ret) {
  torch::serialize::InputArchive normalizer;
  *found = archive.try_read("normalizer", normalizer);
  if (!*found) return Status::Ok();
  for (const auto& [name, m] : {std::pair<const char*, RunningMoments*>{"obs", obs},
                                std::pair<const char*, RunningMoments*>{"ret", ret}}) {
    torch::Tensor count, mean, m2;
    normalizer.read(fmt::format("{}_count", name), count);
    normalizer.read(fmt::format("{}_mean", name), mean);
    normalizer.read(fmt::format("{}_m2", name), m2);
    if (count.numel() != 1 || mean.dim() != 1 || m2.dim() != 1 || mean.numel() != m2.numel())
      return Status::InvalidArgument(fmt::format("{}: normalizer.{}: expected a count and two vectors of one length, "
                                                 "got {}, {} and {} entries",
                                                 path, name, count.numel(), mean.numel(), m2.numel()));
    mean = mean.to(torch::kCPU, torch::kFloat64).contiguous();
    m2 = m2.to(torch::kCPU, torch::kFloat64).contiguous();
    const double* mp = mean.data_ptr<double>();
    const double* m2p = m2.data_ptr<double>();
    for (int64_t i = 0; i < mean.numel(); ++i)
      if (!std::isfinite(mp[i]) || !std::isfinite(m2p[i]) || m2p[i] < 0)
        return Status::InvalidArgument(fmt::format("{}: normalizer.{}: element {} has mean {} and m2 {} (expected "
                                                   "finite numbers, m2 >= 0)",
                                                   path, name, i, mp[i], m2p[i]));
    if (auto s = RunningMoments::Make(count.to(torch::kInt64).item<int64_t>(), {mp, mp + mean.numel()},
                                      {m2p, m2p + m2.numel()}, m);
        !s.ok())
      return Status::InvalidArgument(fmt::format("{}: normalizer.{}: {}", path, name, s.message()));
  }
  return Status::Ok();
}

// What the archive holds of a RunState; absent entries are listed in s->missing.
Status ReadRunState(torch::serialize::InputArchive& archive, const std::string& path, RunState* s) {
  torch::serialize::InputArchive rng;
  if (archive.try_read("rng", rng)) {
    for (const char* name : {kRngTrainer, kRngRandomActions, kRngTorchCpu, kRngTorchCuda}) {
      torch::Tensor state;
      if (rng.try_read(name, state)) s->rng[name] = state;
    }
  } else {
    s->missing.push_back("rng (random generator states)");
  }
  torch::serialize::InputArchive window;
  if (archive.try_read("episode_window", window)) {
    torch::Tensor returns, lengths;
    window.read("returns", returns);
    window.read("lengths", lengths);
    if (returns.dim() != 1 || lengths.dim() != 1 || returns.numel() != lengths.numel())
      return Status::InvalidArgument(fmt::format("{}: episode_window: returns and lengths must be two vectors of one "
                                                 "length, got {} and {} entries",
                                                 path, returns.numel(), lengths.numel()));
    returns = returns.to(torch::kCPU, torch::kFloat64).contiguous();
    lengths = lengths.to(torch::kCPU, torch::kInt64).contiguous();
    s->has_episode_window = true;
    s->episode_returns.assign(returns.data_ptr<double>(), returns.data_ptr<double>() + returns.numel());
    s->episode_lengths.assign(lengths.data_ptr<int64_t>(), lengths.data_ptr<int64_t>() + lengths.numel());
  } else {
    s->missing.push_back("episode_window (the last 100 episodes' returns and lengths)");
  }
  torch::Tensor solved;
  if (archive.try_read("solved_at", solved)) {
    if (solved.numel() != 3)
      return Status::InvalidArgument(fmt::format("{}: solved_at: expected 3 numbers, got {}", path, solved.numel()));
    solved = solved.to(torch::kCPU, torch::kFloat64).contiguous();
    const double* v = solved.data_ptr<double>();
    if (v[0] >= 0) {
      s->solved_at_steps = static_cast<int64_t>(v[0]);
      s->solved_at_seconds = v[1];
      if (v[2] >= 0) s->solved_at_unix = v[2];
    }
  } else {
    s->missing.push_back("solved_at");
  }
  c10::IValue config;
  if (archive.try_read("config_yaml", config) && config.isString()) {
    s->config_yaml = config.toStringRef();
  } else {
    s->missing.push_back("config_yaml");
  }
  if (auto st = ReadNormalizer(archive, path, &s->has_normalizer, &s->normalizer_obs, &s->normalizer_ret); !st.ok())
    return st;
  if (auto st = ReadPolicyLag(archive, path, s); !st.ok()) return st;
  if (auto st = ReadCriticWatch(archive, path, s); !st.ok()) return st;
  // No "normalizer" (nor "policy_lag", nor "critic_watch") is not listed in `missing`: a run without
  // normalisation needs none (the learner warns when a run that normalises resumes from a checkpoint without it).
  return Status::Ok();
}

}  // namespace

Status SaveCheckpoint(const std::string& dir, ActorCritic& policy, torch::optim::Optimizer& optimizer,
                      const TrainingCounters& c, std::string* written_path, const LossScaler* scaler, int keep,
                      const RunState* state) {
  CheckpointBytes bytes;
  if (auto s = SerializeCheckpoint(policy, optimizer, c, scaler, state, &bytes); !s.ok()) return s;
  return WriteCheckpoint(dir, bytes, keep, written_path);
}

Status SerializeCheckpoint(ActorCritic& policy, torch::optim::Optimizer& optimizer, const TrainingCounters& c,
                           const LossScaler* scaler, const RunState* state, CheckpointBytes* out) {
  const std::string name = fmt::format("ckpt-{:08d}.pt", c.updates);
  // Serialised into memory first, then written with the checked, fsynced WriteFileAtomic: LibTorch's own file
  // writer (1.13) throws from a destructor when the disk fills up, which no catch can stop from terminating.
  std::ostringstream bytes;
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
    if (state) WriteRunState(archive, *state);
    archive.save_to(bytes);
  } catch (const c10::Error& e) {
    return Status::IoError(fmt::format("{}: cannot serialise the checkpoint: {}", name, e.what_without_backtrace()));
  }
  out->name = name;
  out->data = bytes.str();
  return Status::Ok();
}

Status WriteCheckpoint(const std::string& dir, const CheckpointBytes& bytes, int keep, std::string* written_path) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IoError(fmt::format("{}: cannot create directory: {}", dir, ec.message()));
  const std::string& name = bytes.name;
  const std::string& data = bytes.data;
  const std::string path = dir + "/" + name;
  const std::string crc_path = path + ".crc32c";
  // The final checkpoint may have the name of the last periodic one (no update between them), which `latest`
  // may name: both files are written and synced in full before either replaces anything, so a full disk (seen
  // at write or at fsync) leaves that pair as it was. Unsure whether it exists: treated as there.
  const bool replacing = std::filesystem::exists(path, ec) || ec;
  const std::string tmp = path + ".tmp", crc_tmp = crc_path + ".tmp";
  auto drop_temps = [&] {
    std::filesystem::remove(tmp, ec);
    std::filesystem::remove(crc_tmp, ec);
  };
  const uint32_t crc = Crc32c(data.data(), data.size());
  Status s = WriteTempFile(tmp, data);
  if (s.ok()) s = WriteTempFile(crc_tmp, fmt::format("{:08x}\n", crc));
  if (s.ok()) s = SyncFile(tmp);
  if (s.ok()) s = SyncFile(crc_tmp);
  if (!s.ok()) {
    drop_temps();
    return s;
  }
  // Renames need no space; the directory's fsync makes both durable.
  if (std::rename(tmp.c_str(), path.c_str()) != 0 || std::rename(crc_tmp.c_str(), crc_path.c_str()) != 0) {
    s = Status::IoError(fmt::format("{}: rename into place failed: {}", path, std::strerror(errno)));
    drop_temps();
  }
  if (s.ok()) s = SyncParentDirectory(path);
  // A checkpoint counts once `latest` names it. A new one whose checksum or `latest` cannot be written is removed
  // again (a checkpoint without its checksum would only be skipped by --resume), and `latest` stays on the
  // previous one; one that replaced a checkpoint of the same name stays (`latest` may name it already).
  if (s.ok()) s = WriteFileAtomic(dir + "/latest", name + "\n");
  if (!s.ok()) {
    if (!replacing) {
      std::filesystem::remove(path, ec);
      std::filesystem::remove(crc_path, ec);
    }
    return s;
  }
  // Older checkpoints are pruned only now, never to make room for one that then fails.
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

std::vector<std::string> ListCheckpoints(const std::string& dir, std::error_code* error) {
  std::vector<std::string> out;
  std::error_code ec;
  // increment(ec), not a range-for: reading a directory can fail midway (EIO, ESTALE on a network disk), and
  // the range-for's increment would throw. A missing directory holds no checkpoints; any other error is the
  // caller's to report.
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("ckpt-", 0) == 0 && name.size() > 8 && name.compare(name.size() - 3, 3, ".pt") == 0)
      out.push_back(it->path().string());
  }
  if (error) *error = ec == std::errc::no_such_file_or_directory ? std::error_code() : ec;
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
  std::error_code list_error;
  const auto candidates = ListCheckpoints(dir, &list_error);
  // A listing cut short could hide the newest checkpoint: resuming from an older one without a word is worse
  // than stopping.
  if (list_error) return Status::IoError(fmt::format("{}: cannot list the checkpoints: {}", dir, list_error.message()));
  for (const auto& candidate : candidates) {
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

// The "counters" and "wall_seconds" entries (may throw c10::Error).
Status ReadCounters(torch::serialize::InputArchive& archive, const std::string& path, TrainingCounters* c) {
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
  return Status::Ok();
}

// LoadCheckpoint with an optional map location (LoadPolicy reads CUDA-written checkpoints on the CPU).
Status LoadCheckpointTo(const std::string& path, ActorCritic& policy, torch::optim::Optimizer* optimizer,
                        TrainingCounters* c, LossScaler* scaler, RunState* state,
                        std::optional<torch::Device> device) {
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
    if (auto s = ReadCounters(archive, path, c); !s.ok()) return s;
    if (scaler) {
      // Optional: checkpoints written before mixed precision (or without a scaler) have no such entry.
      torch::serialize::InputArchive scaler_archive;
      if (archive.try_read("loss_scaler", scaler_archive)) scaler->Load(scaler_archive);
    }
    if (state) {
      *state = RunState();
      if (auto s = ReadRunState(archive, path, state); !s.ok()) return s;
    }
  } catch (const c10::Error& e) {
    return Status::IoError(fmt::format("{}: cannot read checkpoint: {}", path, e.what_without_backtrace()));
  }
  return Status::Ok();
}

}  // namespace

Status LoadCheckpoint(const std::string& path, ActorCritic& policy, torch::optim::Optimizer* optimizer,
                      TrainingCounters* c, LossScaler* scaler, RunState* state) {
  return LoadCheckpointTo(path, policy, optimizer, c, scaler, state, std::nullopt);
}

Status ReadCheckpointProgress(const std::string& path, TrainingCounters* counters, RunState* state) {
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(path, torch::Device(torch::kCPU));
    if (auto s = ReadCounters(archive, path, counters); !s.ok()) return s;
    *state = RunState();
    if (auto s = ReadRunState(archive, path, state); !s.ok()) return s;
  } catch (const c10::Error& e) {
    return Status::IoError(fmt::format("{}: cannot read checkpoint: {}", path, e.what_without_backtrace()));
  }
  return Status::Ok();
}

Status ReadCheckpointConfig(const std::string& path, std::string* yaml) {
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(path, torch::Device(torch::kCPU));
    c10::IValue config;
    if (!archive.try_read("config_yaml", config) || !config.isString())
      return Status::NotFound(fmt::format("{}: holds no config (written before checkpoints stored one)", path));
    *yaml = config.toStringRef();
  } catch (const c10::Error& e) {
    return Status::IoError(fmt::format("{}: cannot read checkpoint: {}", path, e.what_without_backtrace()));
  }
  return Status::Ok();
}

Status ReadCheckpointNormalizer(const std::string& path, RunningMoments* obs, RunningMoments* ret) {
  bool found = false;
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(path, torch::Device(torch::kCPU));
    if (auto s = ReadNormalizer(archive, path, &found, obs, ret); !s.ok()) return s;
  } catch (const c10::Error& e) {
    return Status::IoError(fmt::format("{}: cannot read checkpoint: {}", path, e.what_without_backtrace()));
  }
  if (!found)
    return Status::NotFound(
        fmt::format("{}: holds no normaliser statistics (written before checkpoints stored them)", path));
  return Status::Ok();
}

Status LoadObsTransform(const FarmConfig& config, const std::string& path, int64_t obs_numel,
                        std::optional<ObsTransform>* out) {
  out->reset();
  if (!config.env.normalize_obs) return Status::Ok();
  RunningMoments obs, ret;
  if (auto s = ReadCheckpointNormalizer(path, &obs, &ret); !s.ok()) {
    if (s.code() != Status::Code::kNotFound) return s;
    return Status::NotFound(s.message() +
                            "; the run has env.normalize_obs true, so its policy expects normalised observations");
  }
  if (obs.dim() != obs_numel)
    return Status::InvalidArgument(fmt::format("{}: normalizer.obs has {} elements, but observations have {}", path,
                                               obs.dim(), obs_numel));
  *out = ObsTransform::From(obs, config.env.obs_clip);
  return Status::Ok();
}

namespace {

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
  PolicyOptions options;
  if (auto s = ParsePolicySpecJson(spec_text, spec_path, &obs, &action, &hidden, &options); !s.ok()) return s;
  for (std::string* script : {&options.actor_encoder_script, &options.critic_encoder_script})
    if (!script->empty() && std::filesystem::path(*script).is_relative()) *script = run_dir + "/" + *script;

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
    built = ActorCritic(obs, action, hidden, options);
  } catch (const std::exception& e) {
    return Status::InvalidArgument(fmt::format("{}: cannot build the policy: {}", spec_path, e.what()));
  }
  // InputArchive replaces tensors whatever their shape: remember the shapes the spec implies and compare after.
  std::map<std::string, std::vector<int64_t>> expected;
  for (const auto& item : built->named_parameters()) expected[item.key()] = item.value().sizes().vec();
  for (const auto& item : built->named_buffers()) expected[item.key()] = item.value().sizes().vec();

  TrainingCounters loaded;
  if (auto s = LoadCheckpointTo(ckpt_path, built, nullptr, &loaded, nullptr, nullptr, torch::Device(torch::kCPU)); !s.ok())
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
