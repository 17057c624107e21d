// CoreStates: the recurrent core's state of every agent row the learner acts
// for (ppo.core), kept here so that workers stay model-free. A row is named
// by its worker's identity, the worker's group and its place in the group
// (env-major: agent a of env e is row e * agents + a), so its state follows
// it whatever batch its request lands in and in whatever order the dynamic
// batcher merges workers' requests.
//
// A state is zero before an episode's first step: on a group's first request
// (a new, rejoined or restarted worker, a resumed run: the map starts empty),
// and on every row whose previous step ended its episode (the request's
// terminated or truncated flag: the observation is then the next episode's
// first). A state changes only when Commit is called, for a request that was
// answered: a request parked and served again later (a full rollout, a sync
// update) starts again from the same state.
//
// Threading: owned by the inference thread (through Acting).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "farm.pb.h"

namespace farm {

class CoreStates {
 public:
  explicit CoreStates(int64_t state_size) : size_(state_size) {}

  int64_t state_size() const { return size_; }

  // The states before the request's step, into `dst` [rows, state_size], and into `final_dst`
  // [final_obs_index_size(), state_size] (may be null when there are none) the states of the truncated rows
  // before their reset: the final observation's value is the old episode's.
  void Gather(const std::string& identity, const wire::StepRequest& req, int64_t rows, float* dst,
              float* final_dst) const;
  // The states after the request's step, `next` [rows, state_size]: the request was answered.
  void Commit(const std::string& identity, uint32_t group, int64_t rows, const float* next);
  // The worker is gone: its states go too.
  void Drop(const std::string& identity) { states_.erase(identity); }

  // Rows with a state kept, and their bytes.
  int64_t rows() const;
  int64_t bytes() const { return rows() * size_ * static_cast<int64_t>(sizeof(float)); }

 private:
  const int64_t size_;
  // Per worker identity, per group: [rows * size_] floats (empty: not committed yet).
  std::unordered_map<std::string, std::vector<std::vector<float>>> states_;
};

}  // namespace farm
