// MultiCue-v0: Debug-v0's cue matching with a multi-discrete action, for
// testing multi-discrete policies end to end. Each step shows K cues, cue i in
// [0, nvec[i]); the agent answers all K at once.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "worker/env.h"

namespace farm {

// Observation [1 + sum(nvec)] floats in [0, 1]: obs[0] = step / length, then one
// one-hot block per component marking its cue. Action: MultiDiscrete(nvec); the
// reward is the fraction of components whose action equals their cue, so the
// optimal return is `length` (episodes terminate after `length` steps) and a
// uniform-random agent expects length * mean(1 / nvec[i]).
class MultiCueEnv : public Env {
 public:
  MultiCueEnv(int length, std::vector<int64_t> nvec, uint64_t seed);

  void reset(float* obs) override;
  StepResult step(const ActionRef& action, float* obs) override;

 private:
  void DrawCuesAndWriteObs(float* obs);

  int length_;
  std::vector<int64_t> nvec_;
  int64_t obs_dim_;
  int step_ = 0;
  std::vector<int64_t> cues_;
  std::mt19937_64 rng_;
};

// Options: "length" (8, >= 1), "components" K (3, 1..64), "choices" (2, >= 2) and "spread" (1, >= 0):
// component i has choices + spread * i choices (spread 0: all alike), so the default is nvec [2, 3, 4].
EnvOptions MultiCueDefaultOptions();
// The spec for resolved options: Box [1 + sum(nvec)] in [0, 1], MultiDiscrete(nvec), no time limit,
// reward_threshold = length. Throws std::invalid_argument for an out-of-range option value.
EnvSpec MultiCueSpec(const EnvOptions& resolved);
std::unique_ptr<Env> MakeMultiCue(const EnvOptions& resolved, uint64_t seed);

}  // namespace farm
