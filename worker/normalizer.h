// Normalizer: observation normalisation and reward scaling on the worker
// (env.normalize_obs, env.normalize_reward), beside a worker's EnvGroups. It
// reads what a group wrote after Reset/Step (or, with several policies, one
// policy's rows of it: a normaliser per policy's learner, each with its own
// statistics) and writes transformed copies for the worker to send; the envs
// and EnvGroup never see it, and the learner's hot loop does no per-row work
// for it.
//
//   obs'    = clip((obs - mean) / sqrt(var + 1e-8), +-obs_clip)   per element;
//             every agent row of a multi-agent env is a sample of the same
//             statistics; final observations alike; a global state stays raw
//             (a centralised critic's input, not the policy's).
//   reward' = clip(reward / sqrt(var_G + 1e-8), +-reward_clip)   with G each
//             env's running discounted return, G = gamma * G + reward, reset
//             to 0 when its episode ends, and var_G the variance of every G
//             seen. Episode returns (EnvGroup::finished) are not touched.
//
// Statistics. The worker transforms with a *view*: the run's merged
// statistics as the learner last sent them (Welcome, or the reply to a
// request carrying a delta), fixed between syncs so that workers transform
// alike (in sync mode, every worker holds the same view for a whole rollout);
// until the learner has any, the worker's own running statistics, updated
// before each use (as Stable-Baselines3's VecNormalize does). What the worker
// saw since its last delta is *pending* until TakeDelta hands it over.
// Frozen (the learner serves a trained policy, or does not train): the view
// stays as received; nothing is gathered.
//
// Threading: one thread at a time (the worker's loop).
#pragma once

#include <cstdint>
#include <vector>

#include "common/running_stats.h"
#include "common/status.h"
#include "farm.pb.h"
#include "worker/env_group.h"

namespace farm {

// What a Normalizer reads of a step: a group's rows (NormalizerInput::Of), or one policy's rows of a group
// (PolicyRows::ForNormalizer). Borrowed pointers, valid until the next Reset/Step of the group.
struct NormalizerInput {
  int envs = 0;
  int agents = 1;                               // rows per env
  const float* obs = nullptr;                   // [envs * agents, obs...]
  const std::vector<float>* final_obs = nullptr;  // the truncated rows' final observations
  const uint8_t* active = nullptr;              // [rows], or null: every row acts
  const float* reward = nullptr;                // [rows]
  const float* team_reward = nullptr;           // [envs]: the env's reward (the running return's)
  const uint8_t* ended = nullptr;               // [envs]: the env's episode ended at this step
  int64_t rows() const { return static_cast<int64_t>(envs) * agents; }
  static NormalizerInput Of(const EnvGroup& group);
};

class Normalizer {
 public:
  Normalizer(const NormalizerOptions& options, int64_t obs_numel);

  const NormalizerOptions& options() const { return options_; }
  // Adds a group of `num_envs` envs of `num_agents` rows each; returns its index (0, 1, ...).
  int AddGroup(int num_envs, int num_agents);

  // After group g's EnvGroup::Reset(): its envs' returns start at 0; the first observations are
  // counted and normalised.
  void OnReset(int g, const EnvGroup& group) { OnReset(g, NormalizerInput::Of(group)); }
  void OnReset(int g, const NormalizerInput& in);
  // After group g's EnvGroup::Step(): observations counted and normalised (final observations
  // normalised only), returns advanced and counted, rewards scaled, ended episodes' returns reset.
  void OnStep(int g, const EnvGroup& group) { OnStep(g, NormalizerInput::Of(group)); }
  void OnStep(int g, const NormalizerInput& in);

  // Group g's latest output, laid out as EnvGroup's buffers: the normalised observations and final observations
  // (options().obs) and the scaled rewards (options().reward), in the normaliser's own buffers, valid until the
  // group's next OnReset/OnStep. A part the options leave raw has no output here (std::logic_error): read it from
  // its source.
  const float* obs(int g) const { return Out(g, options_.obs, "obs").obs.data(); }
  const std::vector<float>& final_obs(int g) const { return Out(g, options_.obs, "final_obs").final_obs; }
  const float* reward(int g) const { return Out(g, options_.reward, "reward").reward.data(); }

  bool frozen() const { return frozen_; }
  // Moves the pending statistics into `out` (obs and/or ret, as the options say) and starts a new delta.
  void TakeDelta(wire::NormalizerStats* out);
  // The learner's statistics (checked against the options and the observation size): they become the
  // view, except a part with no samples while not frozen (this worker's own statistics stay in use).
  Status ApplyGlobal(const wire::NormalizerStats& stats);

  // What the worker transforms with now.
  const RunningMoments& obs_view() const { return has_global_obs_ ? global_obs_ : own_obs_; }
  const RunningMoments& ret_view() const { return has_global_ret_ ? global_ret_ : own_ret_; }
  const RunningMoments& pending_obs() const { return pending_obs_; }
  const RunningMoments& pending_ret() const { return pending_ret_; }

 private:
  struct Group {
    int envs = 0;
    int agents = 1;
    std::vector<double> returns;  // per env: the running discounted return G
    std::vector<float> obs;       // [rows, obs...] normalised
    std::vector<float> final_obs;
    std::vector<float> reward;  // [rows] scaled
  };
  const Group& Out(int g, bool transformed, const char* part) const;
  void Observe(Group& s, const NormalizerInput& in);
  void RefreshTransform();

  NormalizerOptions options_;
  int64_t obs_numel_ = 0;
  std::vector<Group> groups_;
  bool frozen_ = false;
  bool has_global_obs_ = false;
  bool has_global_ret_ = false;
  RunningMoments global_obs_, global_ret_;    // the learner's, once it has some
  RunningMoments own_obs_, own_ret_;          // everything this worker saw (used until the learner's arrive)
  RunningMoments pending_obs_, pending_ret_;  // since the last delta
  ObsTransform transform_;  // from obs_view()
};

}  // namespace farm
