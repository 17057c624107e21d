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

// Rows: an env with num_agents agents has that many rows, env-major: agent a
// of env e is row e * num_agents + a. Every per-row buffer below (actions,
// obs, reward, flags, global state) is laid out that way; with one agent per
// env, rows are envs.
class EnvGroup {
 public:
  // Builds `num_envs` envs of `env_name`; env i gets seed (seed, i) mixed.
  // Fails with a clear Status for an unknown env or a bad option.
  static Status Create(const std::string& env_name, const std::map<std::string, double>& options, int num_envs,
                       uint64_t seed, std::unique_ptr<EnvGroup>* out);

  const EnvSpec& spec() const { return spec_; }
  int size() const { return static_cast<int>(envs_.size()); }  // envs
  int num_agents() const { return spec_.num_agents; }
  int rows() const { return size() * num_agents(); }
  int64_t obs_numel() const { return obs_numel_; }      // per row
  int64_t state_numel() const { return state_numel_; }  // per row; 0 without a global state

  // Resets every env; obs() holds the first observations, flags are cleared.
  void Reset();
  // Steps every env with its rows' actions (discrete: rows() int64;
  // multi-discrete: rows() x K int64; box: rows() x action numel floats). Finished envs are reset at once: obs()
  // holds their new first observation.
  void Step(const int64_t* discrete_actions, const float* continuous_actions);

  const float* obs() const { return obs_.data(); }  // [rows, obs...]
  // The env's team reward and flags, repeated on each of its rows.
  const float* reward() const { return reward_.data(); }  // [rows]
  const uint8_t* terminated() const { return terminated_.data(); }
  const uint8_t* truncated() const { return truncated_.data(); }
  // Rows of envs truncated (not terminated) by the last Step, ascending (all
  // agent rows of each such env), and their final observations.
  const std::vector<int32_t>& final_obs_index() const { return final_obs_index_; }
  const std::vector<float>& final_obs() const { return final_obs_; }
  // With a global state only (no data otherwise): [rows, state...], each row
  // holding its env's state (after the auto-reset, like obs()); and the final
  // states of the truncated rows, aligned with final_obs_index().
  const float* global_state() const { return global_state_.data(); }
  const std::vector<float>& final_global_state() const { return final_global_state_; }
  // Episodes that ended in the last Step, one per env (team return), in env order.
  const std::vector<EpisodeStat>& finished() const { return finished_; }

 private:
  EnvGroup() = default;
  void ResetEnv(int e);
  // Env e's state into its first row, copied to its other rows.
  void WriteState(int e);

  EnvSpec spec_;
  int64_t obs_numel_ = 0;
  int64_t action_numel_ = 0;
  std::vector<int64_t> choices_;  // categorical actions: choices per component ({n} or nvec); box: empty
  int64_t state_numel_ = 0;
  std::vector<std::unique_ptr<Env>> envs_;
  std::vector<float> obs_;
  std::vector<float> reward_;
  std::vector<uint8_t> terminated_;
  std::vector<uint8_t> truncated_;
  std::vector<int32_t> final_obs_index_;
  std::vector<float> final_obs_;
  std::vector<float> global_state_;
  std::vector<float> final_global_state_;
  std::vector<EpisodeStat> finished_;
  std::vector<int32_t> episode_length_;  // per env
  std::vector<double> episode_return_;   // per env
};

}  // namespace farm
