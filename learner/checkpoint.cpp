// Atomic checkpoint files.
#include "learner/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "learner/metrics.h"

namespace farm {
namespace {

Status Fsync(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::IoError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return Status::IoError(fmt::format("{}: fsync failed: {}", path, std::strerror(errno)));
  return Status::Ok();
}

}  // namespace

Status SaveCheckpoint(const std::string& dir, ActorCritic& policy, torch::optim::Optimizer& optimizer,
                      const TrainingCounters& c, std::string* written_path, const LossScaler* scaler) {
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
  if (auto s = Fsync(tmp); !s.ok()) return s;
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return Status::IoError(fmt::format("rename {} -> {} failed: {}", tmp, path, std::strerror(errno)));
  if (auto s = WriteFileAtomic(dir + "/latest", name + "\n"); !s.ok()) return s;
  if (written_path) *written_path = path;
  return Status::Ok();
}

Status LoadCheckpoint(const std::string& path, ActorCritic& policy, torch::optim::Optimizer* optimizer,
                      TrainingCounters* c, LossScaler* scaler) {
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(path);
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

}  // namespace farm
