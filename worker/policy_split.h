// Several policies for a C++ env (the config's `policies:`, docs/ENVIRONMENTS.md "Several policies"): which agents
// of each env are each policy's, and each policy's rows of a group's step, gathered into buffers of its own for its
// learner, with that learner's actions written back into the group's action buffer.
//
// A C++ env's agents are named by their index, "0" to "N-1", as the Python worker names the agents of an env in
// the array style: a policy's `agents` are those names or fnmatch patterns ("[0-4]", "*"), and each agent goes to
// the first policy that matches it.
//
// Threading: one thread at a time (the worker's).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "worker/env_group.h"
#include "worker/normalizer.h"

namespace farm {

struct PolicyEndpoint {
  std::string name;
  std::string endpoint;
};

// farm-worker --learner with the config's policies: "NAME=ENDPOINT,NAME=ENDPOINT", one per policy, returned in the
// config's order. InvalidArgument naming an item that is not NAME=ENDPOINT, an unknown policy, one given twice or
// one without an endpoint. One "tcp://HOST:PORT" alone names every policy's learner: the i-th policy's (from 0, in
// the config's order) on PORT + i, as scripts/farm cluster, Slurm and docker-compose start them. An empty `text`
// with `allow_empty` gives every policy an empty endpoint (farm-worker --check-python, which connects to nothing).
Status ParsePolicyEndpoints(const FarmConfig& config, const std::string& text, bool allow_empty,
                            std::vector<PolicyEndpoint>* out);

// Each policy's agent indices (ascending) for an env of `num_agents` agents named "0" to "N-1": every agent goes to
// the first policy whose `agents` matches its name. InvalidArgument naming an agent no policy claims, or a policy
// that claims none.
Status AssignAgentIndices(const std::vector<PolicyConfig>& policies, int num_agents,
                          std::vector<std::vector<int>>* out);

// One policy's rows of a group: agent `agents[j]` of env e is its row e * agents.size() + j (env-major, as the
// group's own rows). Gather copies them out of the group after each Reset and Step; Scatter writes its learner's
// actions for them into the group's action buffer.
class PolicyRows {
 public:
  // `name` names the policy in errors; `group` gives the layout (envs, agents, observation, action, state).
  PolicyRows(std::string name, std::vector<int> agents, const EnvGroup& group);

  const std::string& name() const { return name_; }
  const std::vector<int>& agents() const { return agents_; }
  int num_agents() const { return static_cast<int>(agents_.size()); }  // this policy's agents per env
  int rows() const { return envs_ * num_agents(); }

  // This policy's rows of the group's latest observations, rewards, flags, active masks and final observations
  // (after a Reset: observations, every row active, no flags). InvalidArgument naming the policy and the env when
  // every one of its agents in an env has finished while the env goes on (agents_finish_early): its learner would
  // see the env end (every row of it flagged) while the other agents act on.
  Status Gather(const EnvGroup& group);
  const float* obs() const { return obs_.data(); }          // [rows, obs...]
  const float* reward() const { return reward_.data(); }    // [rows]
  const uint8_t* terminated() const { return terminated_.data(); }
  const uint8_t* truncated() const { return truncated_.data(); }
  const uint8_t* active() const { return active_.data(); }
  bool any_inactive() const { return inactive_rows_ > 0; }
  // This policy's rows of the truncated envs (ascending) and their final observations, in that order; the envs are
  // the group's final_obs_index() envs, so the group's final global states go with them unchanged.
  const std::vector<int32_t>& final_obs_index() const { return final_obs_index_; }
  const std::vector<float>& final_obs() const { return final_obs_; }

  // What a Normalizer of this policy reads after Gather: its rows, with the group's env-level reward and ends.
  NormalizerInput ForNormalizer(const EnvGroup& group) const;

  // This policy's actions ([rows, action numel]) into `group_actions`, the group's ([group rows, action numel]).
  void Scatter(const int64_t* actions, int64_t* group_actions) const;
  void Scatter(const float* actions, float* group_actions) const;

 private:
  template <class T> void ScatterRows(const T* actions, T* group_actions) const;

  std::string name_;
  std::vector<int> agents_;
  int envs_ = 0;
  int group_agents_ = 0;      // the env's agents
  int64_t obs_numel_ = 0;     // per row
  int64_t action_numel_ = 0;  // per row
  std::vector<float> obs_;
  std::vector<float> reward_;
  std::vector<uint8_t> terminated_;
  std::vector<uint8_t> truncated_;
  std::vector<uint8_t> active_;
  int64_t inactive_rows_ = 0;
  std::vector<int32_t> final_obs_index_;
  std::vector<float> final_obs_;
};

}  // namespace farm
