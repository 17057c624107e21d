// EnvGroup: a vector of envs of one family stepped together, with auto-reset
// and Gymnasium's TimeLimit truncation. Results land in contiguous buffers
// that the worker copies straight into a StepRequest.
//
// Threading: one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/env.h"

namespace farm {

struct EpisodeStat {
  float episode_return = 0;
  int32_t length = 0;
};

class EnvGroup {
 public:
  // Builds `num_envs` envs of `env_name`; env i gets seed (seed, i) mixed.
  // Fails with a clear Status for an unknown env or a bad option.
  static Status Create(const std::string& env_name, const std::map<std::string, double>& options, int num_envs,
                       uint64_t seed, std::unique_ptr<EnvGroup>* out);

  const EnvSpec& spec() const { return spec_; }
  int size() const { return static_cast<int>(envs_.size()); }
  int64_t obs_numel() const { return obs_numel_; }

  // Resets every env; obs() holds the first observations, flags are cleared.
  void Reset();
  // Steps env i with action i (discrete: size() int64; box: size() x action numel floats).
  // Finished envs are reset at once: obs() holds their new first observation.
  void Step(const int64_t* discrete_actions, const float* continuous_actions);

  const float* obs() const { return obs_.data(); }           // [size, obs...]
  const float* reward() const { return reward_.data(); }     // [size]
  const uint8_t* terminated() const { return terminated_.data(); }
  const uint8_t* truncated() const { return truncated_.data(); }
  // Envs truncated (not terminated) by the last Step, and their final observations.
  const std::vector<int32_t>& final_obs_index() const { return final_obs_index_; }
  const std::vector<float>& final_obs() const { return final_obs_; }
  // Episodes that ended in the last Step.
  const std::vector<EpisodeStat>& finished() const { return finished_; }

 private:
  EnvGroup() = default;

  EnvSpec spec_;
  int64_t obs_numel_ = 0;
  int64_t action_numel_ = 0;
  std::vector<std::unique_ptr<Env>> envs_;
  std::vector<float> obs_;
  std::vector<float> reward_;
  std::vector<uint8_t> terminated_;
  std::vector<uint8_t> truncated_;
  std::vector<int32_t> final_obs_index_;
  std::vector<float> final_obs_;
  std::vector<EpisodeStat> finished_;
  std::vector<int32_t> episode_length_;
  std::vector<double> episode_return_;
};

}  // namespace farm
