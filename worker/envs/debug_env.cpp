// Debug-v0: deterministic cue-matching env for learner tests, registered as "Debug-v0".
#include "worker/envs/debug_env.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace farm {
namespace {

constexpr int kDefaultLength = 10;
constexpr int kDefaultObsDim = 4;
constexpr int kDefaultNumActions = 2;

// Options arrive as doubles (YAML numbers); these ones must be whole and >= min.
int IntOption(const EnvOptions& options, const char* key, int min) {
  const auto it = options.find(key);
  if (it == options.end()) throw std::invalid_argument(fmt::format("option '{}' missing", key));
  const double v = it->second;
  if (!(v >= min) || v > 1e9 || std::floor(v) != v)
    throw std::invalid_argument(fmt::format("option '{}' must be a whole number >= {}, got {}", key, min, v));
  return static_cast<int>(v);
}

}  // namespace

DebugEnv::DebugEnv(int length, int obs_dim, int num_actions, uint64_t seed)
    : length_(length), obs_dim_(obs_dim), num_actions_(num_actions), rng_(seed) {}

void DebugEnv::DrawCueAndWriteObs(float* obs) {
  cue_ = (rng_() >> 63) ? 1.0f : -1.0f;
  std::fill(obs, obs + obs_dim_, 0.0f);
  obs[0] = static_cast<float>(step_) / static_cast<float>(length_);
  obs[1] = cue_;
}

void DebugEnv::reset(float* obs) {
  step_ = 0;
  DrawCueAndWriteObs(obs);
}

StepResult DebugEnv::step(const ActionRef& action, float* obs) {
  const int64_t a = *action.discrete;
  // EnvGroup checks actions against the spec; this catches direct callers.
  if (a < 0 || a >= num_actions_)
    throw std::out_of_range(fmt::format("Debug-v0: action {} outside [0, {})", a, num_actions_));
  StepResult result;
  // Rewarded against the cue the agent saw, before the next one is drawn.
  result.reward = a == (cue_ > 0 ? 1 : 0) ? 1.0f : 0.0f;
  ++step_;
  result.terminated = step_ >= length_;
  DrawCueAndWriteObs(obs);
  return result;
}

EnvOptions DebugEnvDefaultOptions() {
  return {{"length", kDefaultLength}, {"obs_dim", kDefaultObsDim}, {"num_actions", kDefaultNumActions}};
}

EnvSpec DebugEnvSpec(const EnvOptions& resolved) {
  const int length = IntOption(resolved, "length", 1);
  const int obs_dim = IntOption(resolved, "obs_dim", 2);
  const int num_actions = IntOption(resolved, "num_actions", 2);
  EnvSpec spec;
  spec.name = "Debug-v0";
  spec.observation = Space::Box({obs_dim}, {-1.0f}, {1.0f});
  spec.action = Space::Discrete(num_actions);
  spec.max_episode_steps = 0;  // episodes end by termination only
  spec.reward_threshold = length;  // the optimal return: every cue matched
  return spec;
}

std::unique_ptr<Env> MakeDebugEnv(const EnvOptions& resolved, uint64_t seed) {
  const int length = IntOption(resolved, "length", 1);
  const int obs_dim = IntOption(resolved, "obs_dim", 2);
  const int num_actions = IntOption(resolved, "num_actions", 2);
  return std::make_unique<DebugEnv>(length, obs_dim, num_actions, seed);
}

FARM_REGISTER_ENV("Debug-v0", DebugEnvDefaultOptions(), DebugEnvSpec, MakeDebugEnv);

}  // namespace farm
