// MultiCue-v0: cue matching with a multi-discrete action, registered as "MultiCue-v0".
#include "worker/envs/multi_cue.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace farm {
namespace {

// Options arrive as doubles (YAML numbers); these ones must be whole and within [min, max].
int IntOption(const EnvOptions& options, const char* key, int min, int max) {
  const auto it = options.find(key);
  if (it == options.end()) throw std::invalid_argument(fmt::format("option '{}' missing", key));
  const double v = it->second;
  if (!(v >= min && v <= max) || std::floor(v) != v)
    throw std::invalid_argument(fmt::format("option '{}' must be a whole number in [{}, {}], got {}", key, min, max, v));
  return static_cast<int>(v);
}

std::vector<int64_t> Nvec(const EnvOptions& options) {
  const int k = IntOption(options, "components", 1, 64);
  const int choices = IntOption(options, "choices", 2, 1 << 16);
  const int spread = IntOption(options, "spread", 0, 1 << 16);
  std::vector<int64_t> nvec;
  for (int i = 0; i < k; ++i) nvec.push_back(int64_t{choices} + int64_t{spread} * i);
  return nvec;
}

}  // namespace

MultiCueEnv::MultiCueEnv(int length, std::vector<int64_t> nvec, uint64_t seed)
    : length_(length),
      nvec_(std::move(nvec)),
      obs_dim_(1 + std::accumulate(nvec_.begin(), nvec_.end(), int64_t{0})),
      cues_(nvec_.size()),
      rng_(seed) {}

void MultiCueEnv::DrawCuesAndWriteObs(float* obs) {
  std::fill(obs, obs + obs_dim_, 0.0f);
  obs[0] = static_cast<float>(step_) / static_cast<float>(length_);
  int64_t offset = 1;
  for (std::size_t i = 0; i < nvec_.size(); ++i) {
    cues_[i] = static_cast<int64_t>(rng_() % static_cast<uint64_t>(nvec_[i]));
    obs[offset + cues_[i]] = 1.0f;
    offset += nvec_[i];
  }
}

void MultiCueEnv::reset(float* obs) {
  step_ = 0;
  DrawCuesAndWriteObs(obs);
}

StepResult MultiCueEnv::step(const ActionRef& action, float* obs) {
  int matched = 0;
  for (std::size_t i = 0; i < nvec_.size(); ++i) {
    const int64_t a = action.discrete[i];
    // EnvGroup checks actions against the spec; this catches direct callers.
    if (a < 0 || a >= nvec_[i])
      throw std::out_of_range(fmt::format("MultiCue-v0: action {} outside [0, {}) in component {}", a, nvec_[i], i));
    matched += a == cues_[i] ? 1 : 0;
  }
  StepResult result;
  // Scored against the cues the agent saw, before the next ones are drawn.
  result.reward = static_cast<float>(matched) / static_cast<float>(nvec_.size());
  ++step_;
  result.terminated = step_ >= length_;
  DrawCuesAndWriteObs(obs);
  return result;
}

EnvOptions MultiCueDefaultOptions() { return {{"length", 8}, {"components", 3}, {"choices", 2}, {"spread", 1}}; }

EnvSpec MultiCueSpec(const EnvOptions& resolved) {
  const int length = IntOption(resolved, "length", 1, 1 << 20);
  std::vector<int64_t> nvec = Nvec(resolved);
  const int64_t obs_dim = 1 + std::accumulate(nvec.begin(), nvec.end(), int64_t{0});
  EnvSpec spec;
  spec.name = "MultiCue-v0";
  spec.observation = Space::Box({obs_dim}, {0.0f}, {1.0f});
  spec.action = Space::MultiDiscrete(std::move(nvec));
  spec.max_episode_steps = 0;  // episodes end by termination only
  spec.reward_threshold = length;  // every cue of every step matched
  return spec;
}

std::unique_ptr<Env> MakeMultiCue(const EnvOptions& resolved, uint64_t seed) {
  return std::make_unique<MultiCueEnv>(IntOption(resolved, "length", 1, 1 << 20), Nvec(resolved), seed);
}

FARM_REGISTER_ENV("MultiCue-v0", MultiCueDefaultOptions(), MultiCueSpec, MakeMultiCue);

}  // namespace farm
