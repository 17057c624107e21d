// MemoryCue-v0: a delayed cue, for testing recurrent policies (ppo.core). The
// first observation of an episode shows a cue; `delay` steps later the agent
// must answer it, with nothing in between to remind it.
#pragma once

#include <cstdint>
#include <memory>
#include <random>

#include "worker/env.h"

namespace farm {

// Let D = delay and C = choices, and t the steps taken in the episode so far
// (0 at reset).
//
// Observation [2 + C] floats in [0, 1]:
//   obs[0]         t / D, the step fraction: 0 when the cue is shown, 1 at the answer step;
//   obs[1]         1 at t = 0 (the cue is shown), else 0;
//   obs[2 + c]     1 at t = 0 for the cue c (one-hot), all 0 for t > 0.
// The cue is drawn uniformly from [0, C) at each reset.
// Action: Discrete(C).
// Steps: the actions at t = 0 .. D - 1 pay 0 and never end the episode; the
// action at t = D (the answer step, obs[0] == 1) pays +1 when it equals the
// cue and 0 otherwise, and terminates the episode. An episode is therefore
// exactly D + 1 steps long, and its return is 1 (right) or 0 (wrong): the mean
// return is the fraction answered right. The observation written by the
// terminating step (never acted on: EnvGroup resets the env at once) is that
// of the answer step, [1, 0, ..., 0].
//
// Without memory it cannot be done: the answer step's observation [1, 0, ...,
// 0] is the same whatever the cue, so a memoryless (MLP) policy answers
// independently of the cue and, cues being uniform, is right with probability
// exactly 1 / C (0.5 for the default C = 2), whatever it does. A policy that
// carries the cue over the D steps is right every time.
class MemoryCueEnv : public Env {
 public:
  // delay >= 1, choices >= 2 (MakeMemoryCue checks the options).
  MemoryCueEnv(int delay, int choices, uint64_t seed);

  void reset(float* obs) override;
  StepResult step(const ActionRef& action, float* obs) override;

  // For tests: this episode's cue and the steps taken in it.
  int64_t cue() const { return cue_; }
  int t() const { return t_; }

 private:
  void WriteObs(float* obs) const;

  int delay_;
  int choices_;
  int t_ = 0;
  int64_t cue_ = 0;
  std::mt19937_64 rng_;
};

// Options: "delay" D (32, a whole number in [1, 2^20]), "choices" C (2, a whole
// number in [2, 2^16]).
EnvOptions MemoryCueDefaultOptions();
// The spec for resolved options: Box [2 + choices] in [0, 1], Discrete(choices),
// no time limit (episodes end by termination after delay + 1 steps),
// reward_threshold 0.95 (95% of the cues answered right; a memoryless policy
// gets 1 / choices). Throws std::invalid_argument for an out-of-range option
// value, naming the option, the value and the range.
EnvSpec MemoryCueSpec(const EnvOptions& resolved);
std::unique_ptr<Env> MakeMemoryCue(const EnvOptions& resolved, uint64_t seed);

}  // namespace farm
