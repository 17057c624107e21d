// MemoryCue-v0: a cue shown at the first step and answered `delay` steps later, registered as "MemoryCue-v0".
#include "worker/envs/memory_cue.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace farm {
namespace {

constexpr int kDefaultDelay = 32;
constexpr int kDefaultChoices = 2;
constexpr int kMaxDelay = 1 << 20;
constexpr int kMaxChoices = 1 << 16;
constexpr double kRewardThreshold = 0.95;  // 95% of the cues answered right

// Options arrive as doubles (YAML numbers); these ones must be whole and within [min, max].
int IntOption(const EnvOptions& options, const char* key, int min, int max) {
  const auto it = options.find(key);
  if (it == options.end()) throw std::invalid_argument(fmt::format("option '{}' missing", key));
  const double v = it->second;
  if (!(v >= min && v <= max) || std::floor(v) != v)
    throw std::invalid_argument(fmt::format("option '{}' must be a whole number in [{}, {}], got {}", key, min, max, v));
  return static_cast<int>(v);
}

int Delay(const EnvOptions& options) { return IntOption(options, "delay", 1, kMaxDelay); }
int Choices(const EnvOptions& options) { return IntOption(options, "choices", 2, kMaxChoices); }

}  // namespace

MemoryCueEnv::MemoryCueEnv(int delay, int choices, uint64_t seed) : delay_(delay), choices_(choices), rng_(seed) {}

void MemoryCueEnv::WriteObs(float* obs) const {
  std::fill(obs, obs + 2 + choices_, 0.0f);
  // After the answer (t = D + 1) the fraction stays at 1, within the box.
  obs[0] = static_cast<float>(std::min(t_, delay_)) / static_cast<float>(delay_);
  if (t_ == 0) {
    obs[1] = 1.0f;
    obs[2 + cue_] = 1.0f;
  }
}

void MemoryCueEnv::reset(float* obs) {
  t_ = 0;
  cue_ = static_cast<int64_t>(rng_() % static_cast<uint64_t>(choices_));
  WriteObs(obs);
}

StepResult MemoryCueEnv::step(const ActionRef& action, float* obs) {
  const int64_t a = *action.discrete;
  // EnvGroup checks actions against the spec; this catches direct callers.
  if (a < 0 || a >= choices_)
    throw std::out_of_range(fmt::format("MemoryCue-v0: action {} outside [0, {})", a, choices_));
  StepResult result;
  if (t_ == delay_) {  // the answer step
    result.reward = a == cue_ ? 1.0f : 0.0f;
    result.terminated = true;
  }
  ++t_;
  WriteObs(obs);
  return result;
}

EnvOptions MemoryCueDefaultOptions() { return {{"delay", kDefaultDelay}, {"choices", kDefaultChoices}}; }

EnvSpec MemoryCueSpec(const EnvOptions& resolved) {
  Delay(resolved);  // checked here too, so that a bad delay is refused before any env is made
  const int choices = Choices(resolved);
  EnvSpec spec;
  spec.name = "MemoryCue-v0";
  spec.observation = Space::Box({2 + int64_t{choices}}, {0.0f}, {1.0f});
  spec.action = Space::Discrete(choices);
  spec.max_episode_steps = 0;  // episodes end by termination, after delay + 1 steps
  spec.reward_threshold = kRewardThreshold;
  return spec;
}

std::unique_ptr<Env> MakeMemoryCue(const EnvOptions& resolved, uint64_t seed) {
  return std::make_unique<MemoryCueEnv>(Delay(resolved), Choices(resolved), seed);
}

FARM_REGISTER_ENV("MemoryCue-v0", MemoryCueDefaultOptions(), MemoryCueSpec, MakeMemoryCue);

}  // namespace farm
