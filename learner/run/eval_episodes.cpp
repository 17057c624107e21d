// The episodes of an evaluation by a serving learner (learner.eval_episodes) and their file.
#include "learner/run/eval_episodes.h"

#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>

namespace farm {

std::vector<int> EpisodeQuota(int episodes, int envs) {
  std::vector<int> quota(static_cast<std::size_t>(envs));
  for (int i = 0; i < envs; ++i) quota[i] = episodes / envs + (i < episodes % envs ? 1 : 0);
  return quota;
}

Status EvalEpisodes::Open(int episodes, const std::string& path, std::unique_ptr<EvalEpisodes>* out) {
  if (episodes <= 0)
    return Status::InvalidArgument(fmt::format("learner.eval_episodes: expected a count > 0, got {}", episodes));
  std::unique_ptr<EvalEpisodes> e(new EvalEpisodes(episodes));
  if (auto s = e->file_.Open(path); !s.ok()) return s;
  *out = std::move(e);
  return Status::Ok();
}

bool EvalEpisodes::SetWorker(const std::string& identity, int num_envs) {
  if (has_worker_ || num_envs <= 0) return false;
  has_worker_ = true;
  identity_ = identity;
  left_ = EpisodeQuota(episodes_, num_envs);
  return true;
}

Status EvalEpisodes::Add(int env, double episode_return, int64_t length) {
  if (env < 0 || env >= static_cast<int>(left_.size()))
    return Status::InvalidArgument(
        fmt::format("eval episode of env {}, but the evaluating worker has {} envs", env, left_.size()));
  if (left_[env] == 0) return Status::Ok();
  --left_[env];
  ++counted_;
  return file_.Write(nlohmann::json{{"env", env}, {"return", episode_return}, {"length", length}});
}

}  // namespace farm
