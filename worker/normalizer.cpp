// Normalizer: the worker's observation normalisation and reward scaling, and its share of the run's statistics.
#include "worker/normalizer.h"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>
#include <string>

namespace farm {

Normalizer::Normalizer(const NormalizerOptions& options, int64_t obs_numel)
    : options_(options), obs_numel_(obs_numel) {
  for (RunningMoments* m : {&global_obs_, &own_obs_, &pending_obs_}) m->Reset(options_.obs ? obs_numel : 0);
  for (RunningMoments* m : {&global_ret_, &own_ret_, &pending_ret_}) m->Reset(options_.reward ? 1 : 0);
  RefreshTransform();
}

int Normalizer::AddGroup(int num_envs, int num_agents) {
  Group s;
  s.envs = num_envs;
  s.agents = num_agents;
  const auto rows = static_cast<std::size_t>(num_envs) * static_cast<std::size_t>(num_agents);
  s.returns.assign(static_cast<std::size_t>(num_envs), 0.0);
  if (options_.obs) {
    s.obs.assign(rows * static_cast<std::size_t>(obs_numel_), 0.0f);
    s.final_obs.reserve(rows * static_cast<std::size_t>(obs_numel_));  // Step stays free of allocations
  }
  if (options_.reward) s.reward.assign(rows, 0.0f);
  groups_.push_back(std::move(s));
  return static_cast<int>(groups_.size()) - 1;
}

const Normalizer::Group& Normalizer::Out(int g, bool transformed, const char* part) const {
  if (!transformed)
    throw std::logic_error(fmt::format("Normalizer::{}: this normaliser leaves it raw; read it from its source", part));
  return groups_.at(static_cast<std::size_t>(g));
}

void Normalizer::RefreshTransform() {
  if (options_.obs) transform_ = ObsTransform::From(obs_view(), options_.obs_clip);
}

NormalizerInput NormalizerInput::Of(const EnvGroup& group) {
  NormalizerInput in;
  in.envs = group.size();
  in.agents = group.num_agents();
  in.obs = group.obs();
  in.final_obs = &group.final_obs();
  in.active = group.any_inactive() ? group.active() : nullptr;
  in.reward = group.reward();
  in.team_reward = group.team_reward();
  in.ended = group.ended();
  return in;
}

// Counts (unless frozen) and normalises the rows' observations and final observations.
void Normalizer::Observe(Group& s, const NormalizerInput& in) {
  if (!options_.obs) return;
  const int64_t rows = in.rows();
  if (!frozen_) {
    // The rows that act: an agent that finished early (env.h, agents_finish_early) repeats its last observation
    // until its env ends, which would weigh it once per step. Runs of acting rows, in row order.
    const uint8_t* active = in.active;
    for (int64_t begin = 0; begin < rows;) {
      int64_t end = rows;
      if (active != nullptr) {
        while (begin < rows && !active[begin]) ++begin;
        end = begin;
        while (end < rows && active[end]) ++end;
      }
      if (end > begin) {
        const float* first = in.obs + begin * obs_numel_;
        pending_obs_.AddRows(first, end - begin);
        if (!has_global_obs_) own_obs_.AddRows(first, end - begin);
      }
      begin = end;
    }
    if (!has_global_obs_) RefreshTransform();
  }
  transform_.Apply(in.obs, s.obs.data(), rows);
  s.final_obs.resize(in.final_obs->size());
  transform_.Apply(in.final_obs->data(), s.final_obs.data(), static_cast<int64_t>(in.final_obs->size()) / obs_numel_);
}

void Normalizer::OnReset(int g, const NormalizerInput& in) {
  Group& s = groups_.at(static_cast<std::size_t>(g));
  if (in.envs != s.envs || in.agents != s.agents)
    throw std::invalid_argument(fmt::format("Normalizer::OnReset: group {} has {} envs x {} agents, registered {} x {}",
                                            g, in.envs, in.agents, s.envs, s.agents));
  std::fill(s.returns.begin(), s.returns.end(), 0.0);
  Observe(s, in);  // no rewards yet: the first request carries none
}

void Normalizer::OnStep(int g, const NormalizerInput& in) {
  Group& s = groups_.at(static_cast<std::size_t>(g));
  Observe(s, in);
  if (!options_.reward) return;
  if (!frozen_) {
    for (int e = 0; e < s.envs; ++e) {
      // The env's team reward: not a row's, since an agent that finished early (env.h, agents_finish_early)
      // gets 0 on its row while the team goes on.
      s.returns[e] = options_.gamma * s.returns[e] + static_cast<double>(in.team_reward[e]);
      pending_ret_.Add(&s.returns[e]);
      if (!has_global_ret_) own_ret_.Add(&s.returns[e]);
    }
  }
  const RunningMoments& view = ret_view();
  // Each row's own reward (the team's, or 0 on a row whose agent had finished).
  const int64_t rows = in.rows();
  for (int64_t r = 0; r < rows; ++r)
    s.reward[static_cast<std::size_t>(r)] = ScaleReward(in.reward[r], view, options_.reward_clip);
  // An env's return restarts only when the env ended (every row flagged), not at one agent's own termination.
  for (int e = 0; e < s.envs; ++e)
    if (in.ended[e]) s.returns[e] = 0.0;
}

void Normalizer::TakeDelta(wire::NormalizerStats* out) {
  out->Clear();
  if (options_.obs) {
    ToWire(pending_obs_, out->mutable_obs());
    pending_obs_.Reset(obs_numel_);
  }
  if (options_.reward) {
    ToWire(pending_ret_, out->mutable_ret());
    pending_ret_.Reset(1);
  }
}

Status Normalizer::ApplyGlobal(const wire::NormalizerStats& stats) {
  RunningMoments obs, ret;
  if (auto s = CheckNormalizerStats(stats, options_.obs, obs_numel_, options_.reward, "the learner's NormalizerStats",
                                    &obs, &ret);
      !s.ok())
    return s;
  frozen_ = stats.frozen();
  if (options_.obs && (frozen_ || !obs.empty())) {
    global_obs_ = std::move(obs);
    has_global_obs_ = true;
    RefreshTransform();
  }
  if (options_.reward && (frozen_ || !ret.empty())) {
    global_ret_ = std::move(ret);
    has_global_ret_ = true;
  }
  return Status::Ok();
}

}  // namespace farm
