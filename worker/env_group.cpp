// EnvGroup: steps a vector of envs of one family with Gymnasium's vector-env
// semantics (auto-reset in the same step, TimeLimit truncation, final_obs).
#include "worker/env_group.h"

#include "worker/random.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <stdexcept>

namespace farm {
namespace {

// Nearby (seed, i) pairs give unrelated env seeds and no two envs of a group share one.
uint64_t EnvSeed(uint64_t seed, int index) { return SplitMix64(SplitMix64(seed) ^ static_cast<uint64_t>(index)); }

Status CheckSpaces(const EnvSpec& spec) {
  const Space& obs = spec.observation;
  if (obs.is_discrete() || obs.dtype != DType::kFloat32 || obs.numel() <= 0)
    return Status::InvalidArgument(
        fmt::format("env {}: observation space must be a non-empty float32 box, got {}", spec.name, obs.ToString()));
  const Space& act = spec.action;
  const bool ok = act.is_discrete() ? act.n > 0 : (act.dtype == DType::kFloat32 && act.numel() > 0);
  if (!ok)
    return Status::InvalidArgument(fmt::format(
        "env {}: action space must be discrete or a non-empty float32 box, got {}", spec.name, act.ToString()));
  if (spec.max_episode_steps < 0)
    return Status::InvalidArgument(
        fmt::format("env {}: max_episode_steps must be >= 0, got {}", spec.name, spec.max_episode_steps));
  return Status::Ok();
}

}  // namespace

Status EnvGroup::Create(const std::string& env_name, const std::map<std::string, double>& options, int num_envs,
                        uint64_t seed, std::unique_ptr<EnvGroup>* out) {
  const EnvFamily* family = EnvRegistry::Global().Find(env_name);
  if (family == nullptr) {
    const auto names = EnvRegistry::Global().Names();
    return Status::NotFound(
        fmt::format("unknown env '{}'; registered envs: {}", env_name,
                    names.empty() ? std::string("(none)") : fmt::format("{}", fmt::join(names, ", "))));
  }
  if (num_envs < 1)
    return Status::InvalidArgument(fmt::format("env {}: num_envs must be >= 1, got {}", env_name, num_envs));

  EnvOptions resolved;
  if (Status s = ResolveEnvOptions(env_name, family->default_options, options, &resolved); !s.ok()) return s;

  std::unique_ptr<EnvGroup> group(new EnvGroup());
  // The spec follows the resolved options, so it is built per group; it sizes
  // the buffers below and the worker's handshake.
  try {
    group->spec_ = family->spec(resolved);
  } catch (const std::invalid_argument& e) {
    // Like factories, specs reject out-of-range option values by throwing.
    return Status::InvalidArgument(fmt::format("env {}: {}", env_name, e.what()));
  }
  if (group->spec_.name.empty()) group->spec_.name = env_name;
  if (group->spec_.name != env_name)
    return Status::InvalidArgument(
        fmt::format("env {}: registered under this name but its spec says '{}'", env_name, group->spec_.name));
  if (Status s = CheckSpaces(group->spec_); !s.ok()) return s;

  group->envs_.reserve(static_cast<std::size_t>(num_envs));
  for (int i = 0; i < num_envs; ++i) {
    try {
      group->envs_.push_back(family->make(resolved, EnvSeed(seed, i)));
    } catch (const std::invalid_argument& e) {
      // Factories reject out-of-range option values by throwing; the caller
      // (config loading) wants that as a value.
      return Status::InvalidArgument(fmt::format("env {}: {}", env_name, e.what()));
    }
    if (!group->envs_.back()) return Status::InvalidArgument(fmt::format("env {}: factory returned no env", env_name));
  }

  const auto n = static_cast<std::size_t>(num_envs);
  group->obs_numel_ = group->spec_.observation.numel();
  group->action_numel_ = group->spec_.action.numel();
  group->obs_.assign(n * static_cast<std::size_t>(group->obs_numel_), 0.0f);
  group->reward_.assign(n, 0.0f);
  group->terminated_.assign(n, 0);
  group->truncated_.assign(n, 0);
  group->episode_length_.assign(n, 0);
  group->episode_return_.assign(n, 0.0);
  // At most every env finishes in one Step: reserving that much now keeps Step
  // free of allocations.
  group->final_obs_index_.reserve(n);
  group->final_obs_.reserve(n * static_cast<std::size_t>(group->obs_numel_));
  group->finished_.reserve(n);
  // Start in a steppable state; a later Reset() simply starts new episodes.
  group->Reset();
  *out = std::move(group);
  return Status::Ok();
}

void EnvGroup::Reset() {
  final_obs_index_.clear();
  final_obs_.clear();
  finished_.clear();
  std::fill(reward_.begin(), reward_.end(), 0.0f);
  std::fill(terminated_.begin(), terminated_.end(), 0);
  std::fill(truncated_.begin(), truncated_.end(), 0);
  std::fill(episode_length_.begin(), episode_length_.end(), 0);
  std::fill(episode_return_.begin(), episode_return_.end(), 0.0);
  for (std::size_t i = 0; i < envs_.size(); ++i) envs_[i]->reset(obs_.data() + i * obs_numel_);
}

void EnvGroup::Step(const int64_t* discrete_actions, const float* continuous_actions) {
  final_obs_index_.clear();
  final_obs_.clear();
  finished_.clear();

  const bool discrete = spec_.action.is_discrete();
  if (discrete ? discrete_actions == nullptr : continuous_actions == nullptr)
    throw std::invalid_argument(
        fmt::format("EnvGroup::Step on {}: missing {} actions", spec_.name, discrete ? "discrete" : "continuous"));
  const int64_t num_choices = spec_.action.n;
  const int max_steps = spec_.max_episode_steps;
  const int n = size();

  for (int i = 0; i < n; ++i) {
    float* row = obs_.data() + static_cast<std::size_t>(i) * obs_numel_;
    ActionRef action;
    if (discrete) {
      action.discrete = discrete_actions + i;
      // An out-of-range action is a learner/wire bug; envs index with it.
      if (*action.discrete < 0 || *action.discrete >= num_choices)
        throw std::out_of_range(fmt::format("EnvGroup::Step on {}: env {} got action {}, expected [0, {})", spec_.name,
                                            i, *action.discrete, num_choices));
    } else {
      action.continuous = continuous_actions + static_cast<std::size_t>(i) * action_numel_;
    }

    const StepResult res = envs_[i]->step(action, row);
    const int32_t length = ++episode_length_[i];
    episode_return_[i] += res.reward;
    // Gymnasium's TimeLimit: truncation only when the env did not terminate on
    // the same step, so the learner never bootstraps past a real terminal.
    const bool terminated = res.terminated;
    const bool truncated = !terminated && max_steps > 0 && length >= max_steps;
    reward_[i] = res.reward;
    terminated_[i] = terminated;
    truncated_[i] = truncated;
    if (terminated || truncated) {
      finished_.push_back(EpisodeStat{static_cast<float>(episode_return_[i]), length});
      // A truncated episode's value is bootstrapped from its last observation,
      // which the reset below overwrites: keep a copy.
      if (truncated) {
        final_obs_index_.push_back(i);
        final_obs_.insert(final_obs_.end(), row, row + obs_numel_);
      }
      envs_[i]->reset(row);
      episode_length_[i] = 0;
      episode_return_[i] = 0.0;
    }
  }
}

}  // namespace farm
