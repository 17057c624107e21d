// Helpers for the tests that fill a TrajectoryStore by hand.
#pragma once

#include <cstdint>
#include <stdexcept>

#include "learner/train/trajectory_store.h"

namespace farm::testing {

// One whole step of `group` (at most 64 envs) in which no episode ends: RecordStep with the rows given (policy
// version `version`), then RecordOutcome with `reward` and every terminated and truncated flag 0.
inline void StepWithoutEnding(TrajectoryStore& store, int group, const float* obs, const void* actions,
                              const float* logp, const float* value, const float* reward, int64_t version = 0) {
  static const uint8_t no[64] = {};
  // Every group is at most all the store's columns: then `no` covers it.
  if (store.num_envs() > 64) throw std::logic_error("StepWithoutEnding: groups of at most 64 envs");
  store.RecordStep(group, obs, actions, logp, value, version);
  store.RecordOutcome(group, reward, no, no);
}

}  // namespace farm::testing
