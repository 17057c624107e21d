#include "worker/policy_split.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <fnmatch.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <sstream>

namespace farm {

Status ParsePolicyEndpoints(const FarmConfig& config, const std::string& text, bool allow_empty,
                            std::vector<PolicyEndpoint>* out) {
  std::vector<std::string> names;
  for (const auto& p : config.policies) names.push_back(p.name);
  const auto expected = [&] {
    return fmt::format("expected NAME=ENDPOINT for each of the config's policies ({}), comma-separated",
                       fmt::join(names, ", "));
  };
  std::map<std::string, std::string> by_name;
  if (text.empty() && allow_empty)
    for (const auto& n : names) by_name.emplace(n, "");
  // One tcp://HOST:PORT for every policy: the i-th policy's learner on PORT + i (as scripts/farm cluster, Slurm and
  // docker-compose start them).
  if (!text.empty() && text.find_first_of("=,") == std::string::npos) {
    const auto colon = text.rfind(':');
    const std::string digits = colon == std::string::npos ? "" : text.substr(colon + 1);
    const bool numeric = !digits.empty() && digits.size() <= 5 &&
                         std::all_of(digits.begin(), digits.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
    if (text.rfind("tcp://", 0) != 0 || !numeric) {
      return Status::InvalidArgument(fmt::format(
          "--learner: '{}': {}, or one tcp://HOST:PORT for the i-th policy's learner on PORT + i", text, expected()));
    }
    const int port = std::stoi(digits);
    const int last = port + static_cast<int>(names.size()) - 1;
    if (port < 1 || last > 65535) {
      return Status::InvalidArgument(fmt::format("--learner: '{}': {} policies need ports {} to {}, past 65535 or "
                                                 "below 1",
                                                 text, names.size(), port, last));
    }
    out->clear();
    for (std::size_t i = 0; i < names.size(); ++i)
      out->push_back({names[i], fmt::format("{}:{}", text.substr(0, colon), port + static_cast<int>(i))});
    return Status::Ok();
  }
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    const auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      return Status::InvalidArgument(fmt::format("--learner: '{}': {}", item, expected()));
    const std::string name = item.substr(0, eq);
    if (std::find(names.begin(), names.end(), name) == names.end())
      return Status::InvalidArgument(fmt::format("--learner: no policy '{}' in the config; {}", name, expected()));
    if (!by_name.emplace(name, item.substr(eq + 1)).second)
      return Status::InvalidArgument(fmt::format("--learner: policy '{}' given twice; {}", name, expected()));
  }
  out->clear();
  for (const auto& n : names) {
    const auto it = by_name.find(n);
    if (it == by_name.end())
      return Status::InvalidArgument(fmt::format("--learner: no endpoint for policy '{}'; {}", n, expected()));
    out->push_back({n, it->second});
  }
  return Status::Ok();
}

NormalizerInput PolicyRows::ForNormalizer(const EnvGroup& group) const {
  NormalizerInput in;
  in.envs = envs_;
  in.agents = num_agents();
  in.obs = obs_.data();
  in.final_obs = &final_obs_;
  in.active = any_inactive() ? active_.data() : nullptr;
  in.reward = reward_.data();
  in.team_reward = group.team_reward();
  in.ended = group.ended();
  return in;
}

Status AssignAgentIndices(const std::vector<PolicyConfig>& policies, int num_agents,
                          std::vector<std::vector<int>>* out) {
  std::vector<std::vector<int>> owned(policies.size());
  const auto patterns = [&] {
    std::vector<std::string> each;
    for (const auto& p : policies) each.push_back(fmt::format("{}: [{}]", p.name, fmt::join(p.agents, ", ")));
    return fmt::format("{}", fmt::join(each, "; "));
  };
  for (int a = 0; a < num_agents; ++a) {
    const std::string name = std::to_string(a);
    bool claimed = false;
    for (std::size_t k = 0; k < policies.size() && !claimed; ++k) {
      for (const auto& pattern : policies[k].agents) {
        if (::fnmatch(pattern.c_str(), name.c_str(), 0) == 0) {
          owned[k].push_back(a);
          claimed = true;
          break;
        }
      }
    }
    if (!claimed)
      return Status::InvalidArgument(fmt::format(
          "policies: agent '{}' belongs to no policy (the env's agents are '0' to '{}', by index; the policies' "
          "patterns: {})",
          name, num_agents - 1, patterns()));
  }
  for (std::size_t k = 0; k < policies.size(); ++k)
    if (owned[k].empty())
      return Status::InvalidArgument(fmt::format(
          "policies: policy '{}' ([{}]) matches none of the env's agents '0' to '{}' (or only agents an earlier "
          "policy claims)",
          policies[k].name, fmt::join(policies[k].agents, ", "), num_agents - 1));
  *out = std::move(owned);
  return Status::Ok();
}

PolicyRows::PolicyRows(std::string name, std::vector<int> agents, const EnvGroup& group)
    : name_(std::move(name)),
      agents_(std::move(agents)),
      envs_(group.size()),
      group_agents_(group.num_agents()),
      obs_numel_(group.obs_numel()),
      action_numel_(group.spec().action.numel()) {
  const auto n = static_cast<std::size_t>(rows());
  obs_.resize(n * static_cast<std::size_t>(obs_numel_));
  reward_.resize(n);
  terminated_.resize(n);
  truncated_.resize(n);
  active_.resize(n);
}

Status PolicyRows::Gather(const EnvGroup& group) {
  const int k = num_agents();
  const std::size_t obs_bytes = static_cast<std::size_t>(obs_numel_) * sizeof(float);
  inactive_rows_ = 0;
  for (int e = 0; e < envs_; ++e) {
    bool any_active = false;
    for (int j = 0; j < k; ++j) {
      const std::size_t from = static_cast<std::size_t>(e) * group_agents_ + agents_[j];
      const std::size_t to = static_cast<std::size_t>(e) * k + j;
      std::memcpy(obs_.data() + to * obs_numel_, group.obs() + from * obs_numel_, obs_bytes);
      reward_[to] = group.reward()[from];
      terminated_[to] = group.terminated()[from];
      truncated_[to] = group.truncated()[from];
      active_[to] = group.active()[from];
      any_active = any_active || active_[to];
      inactive_rows_ += active_[to] ? 0 : 1;
    }
    // An ended env has been reset (every row active again): none of this policy's rows active means its agents
    // have all finished while others act on.
    if (!any_active) {
      std::vector<int> acting;
      for (int a = 0; a < group_agents_; ++a)
        if (group.active()[static_cast<std::size_t>(e) * group_agents_ + a]) acting.push_back(a);
      return Status::InvalidArgument(fmt::format(
          "env {} of the group: every agent of policy '{}' (agents {}) has finished while the env goes on (for agents "
          "{}): a policy's agents finishing before their env is not supported; give them a policy together with "
          "agents that act on, or end the env with them",
          e, name_, fmt::join(agents_, ", "), fmt::join(acting, ", ")));
    }
  }
  final_obs_index_.clear();
  final_obs_.clear();
  const auto& idx = group.final_obs_index();
  for (std::size_t i = 0; i < idx.size(); ++i) {
    const int e = idx[i] / group_agents_;
    const auto it = std::find(agents_.begin(), agents_.end(), idx[i] % group_agents_);
    if (it == agents_.end()) continue;
    final_obs_index_.push_back(e * k + static_cast<int32_t>(it - agents_.begin()));
    const float* from = group.final_obs().data() + i * static_cast<std::size_t>(obs_numel_);
    final_obs_.insert(final_obs_.end(), from, from + obs_numel_);
  }
  return Status::Ok();
}

template <class T> void PolicyRows::ScatterRows(const T* actions, T* group_actions) const {
  const int k = num_agents();
  const std::size_t bytes = static_cast<std::size_t>(action_numel_) * sizeof(T);
  for (int e = 0; e < envs_; ++e)
    for (int j = 0; j < k; ++j)
      std::memcpy(group_actions + (static_cast<std::size_t>(e) * group_agents_ + agents_[j]) * action_numel_,
                  actions + (static_cast<std::size_t>(e) * k + j) * action_numel_, bytes);
}

void PolicyRows::Scatter(const int64_t* actions, int64_t* group_actions) const { ScatterRows(actions, group_actions); }
void PolicyRows::Scatter(const float* actions, float* group_actions) const { ScatterRows(actions, group_actions); }

}  // namespace farm
