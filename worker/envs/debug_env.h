// Debug-v0: a tiny deterministic env with a known optimal return, for testing
// learners. Each step shows a cue in {-1, +1}; matching it pays 1.
#pragma once

#include <cstdint>
#include <memory>
#include <random>

#include "worker/env.h"

namespace farm {

// Observation [obs_dim] floats: obs[0] = step / length, obs[1] = cue, the rest 0.
// Action: Discrete(num_actions); reward 1 when action == (cue > 0 ? 1 : 0), else 0,
// so actions 2 and up (when num_actions > 2) never pay.
// Terminates after `length` steps, so the optimal return is `length`.
class DebugEnv : public Env {
 public:
  // obs_dim >= 2, num_actions >= 2 (MakeDebugEnv checks the options).
  DebugEnv(int length, int obs_dim, int num_actions, uint64_t seed);

  void reset(float* obs) override;
  StepResult step(const ActionRef& action, float* obs) override;

 private:
  void DrawCueAndWriteObs(float* obs);

  int length_;
  int obs_dim_;
  int num_actions_;
  int step_ = 0;
  float cue_ = 1.0f;
  std::mt19937_64 rng_;
};

// Options: "length" (10, >= 1), "obs_dim" (4, >= 2), "num_actions" (2, >= 2).
EnvOptions DebugEnvDefaultOptions();
// The spec for resolved options: Box [obs_dim] in [-1, 1], Discrete(num_actions),
// no time limit, reward_threshold = length (the optimal return).
// Throws std::invalid_argument for an out-of-range option value.
EnvSpec DebugEnvSpec(const EnvOptions& resolved);
// Throws std::invalid_argument for an out-of-range option value.
std::unique_ptr<Env> MakeDebugEnv(const EnvOptions& resolved, uint64_t seed);

}  // namespace farm
