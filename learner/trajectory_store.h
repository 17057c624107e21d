// TrajectoryStore: per-env trajectories of the rollout being collected, in
// preallocated time-major arrays [T, N, ...]. Envs are registered a group at
// a time; a group's envs are contiguous columns, so recording one group's
// step is one contiguous copy per field.
//
// Protocol per group: RecordStep (obs, global state, action, log-prob, value at step t)
// → RecordOutcome (reward and done flags of that step; t becomes t+1) → ...
// until t == T, then SetBootstrap (value of the next observation). When every
// group is full, Take() gathers the rollout and resets all groups to t = 0.
//
// Threading: not thread-safe; owned by the learner's inference thread.
#pragma once

#include <cstdint>
#include <vector>

#include "common/space.h"
#include "learner/ppo.h"

namespace farm {

struct LagStats {
  int64_t min = 0;
  double avg = 0;
  int64_t max = 0;
};

class TrajectoryStore {
 public:
  // Actions are kept as `action` says: one int64 per step (discrete), action.numel() int64s (multi-discrete)
  // or floats (box). state_numel: floats of the global state stored per row for a centralised critic; 0: none.
  TrajectoryStore(int64_t rollout_length, int64_t obs_numel, const Space& action, int64_t state_numel = 0);

  // Adds a group of `size` envs (existing data is kept); returns its id.
  int AddGroup(int size);
  int num_groups() const { return static_cast<int>(groups_.size()); }  // ids handed out, removed ones included
  int64_t num_envs() const { return num_envs_; }  // columns of the groups still in the store
  int64_t rollout_length() const { return T_; }

  int steps(int group) const { return groups_[group].steps; }
  bool full(int group) const { return groups_[group].steps == T_; }
  bool pending(int group) const { return groups_[group].pending; }
  int full_groups() const { return full_groups_; }
  bool all_full() const { return alive_groups_ > 0 && full_groups_ == alive_groups_; }

  // Drops a group (its worker is gone): its partial trajectories are discarded,
  // it no longer counts towards a full rollout, and its columns are freed (the
  // other groups' columns move up; their data is kept). Its id is not reused.
  void RemoveGroup(int group);

  // `actions` is int64 [size] (discrete), int64 [size, K] (multi-discrete) or float [size, action numel]; `states` is float [size, state_numel]
  // when the store keeps states (ignored, and may be null, otherwise).
  void RecordStep(int group, const float* obs, const void* actions, const float* logp, const float* value,
                  int64_t policy_version, const float* states = nullptr);
  void RecordOutcome(int group, const float* reward, const uint8_t* terminated, const uint8_t* truncated);
  // Adds `bonus` to the reward of env `env` (within the group) at its last completed step.
  void AddReward(int group, int env, float bonus);
  void SetBootstrap(int group, const float* values);

  // The rollout of the alive groups' envs, obs shaped [T, N, obs_shape...] and, when the store keeps
  // states, states [T, N, state_shape...] (state_shape's numel must be state_numel); lag relative to
  // `current_version`.
  Rollout Take(const std::vector<int64_t>& obs_shape, int64_t current_version, LagStats* lag,
               const std::vector<int64_t>& state_shape = {});

 private:
  struct Group {
    int64_t base = 0;  // first env column (moves when a group before it is removed)
    int size = 0;
    int steps = 0;
    bool pending = false;
    bool alive = true;
  };
  void Grow(int64_t new_num_envs);
  template <class U>
  void CopyRows(std::vector<U>& field, int64_t width, int64_t t, const Group& g, const U* src);

  const int64_t T_;
  const int64_t obs_numel_;
  const bool integer_actions_;  // discrete or multi-discrete: int64 in disc_; box: float in cont_
  const int64_t action_numel_;  // per step
  const std::vector<int64_t> action_shape_;  // per step: {} (discrete), {K}, or the box's shape
  const int64_t state_numel_;   // 0: no states
  int64_t num_envs_ = 0;
  std::vector<Group> groups_;
  int full_groups_ = 0;   // alive groups with T steps
  int alive_groups_ = 0;

  std::vector<float> obs_;       // [T, N, obs_numel]
  std::vector<float> state_;     // [T, N, state_numel]
  std::vector<int64_t> disc_;    // [T, N, action_numel] discrete / multi-discrete actions
  std::vector<float> cont_;      // [T, N, action_numel] continuous actions
  std::vector<float> logp_;      // [T, N]
  std::vector<float> value_;     // [T, N]
  std::vector<float> reward_;    // [T, N]
  std::vector<float> done_;      // [T, N]
  std::vector<int64_t> version_;  // [T, N]
  std::vector<float> bootstrap_;  // [N]
};

}  // namespace farm
