// EnvGroup: steps a vector of envs of one family with Gymnasium's vector-env
// semantics (auto-reset in the same step, TimeLimit truncation, final_obs),
// stacking frames as Gymnasium's FrameStackObservation(padding_type="reset").
#include "worker/env_group.h"

#include "worker/random.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <stdexcept>

namespace farm {
namespace {

// Nearby (seed, i) pairs give unrelated env seeds and no two envs of a group share one.
uint64_t EnvSeed(uint64_t seed, int index) { return SplitMix64(SplitMix64(seed) ^ static_cast<uint64_t>(index)); }

Status CheckSpaces(const EnvSpec& spec) {
  const Space& obs = spec.observation;
  if (!obs.is_box() || obs.dtype != DType::kFloat32 || obs.numel() <= 0)
    return Status::InvalidArgument(
        fmt::format("env {}: observation space must be a non-empty float32 box, got {}", spec.name, obs.ToString()));
  const Space& act = spec.action;
  const std::vector<int64_t> choices = act.categories();
  const bool ok = act.is_categorical()
                      ? !choices.empty() && std::all_of(choices.begin(), choices.end(), [](int64_t c) { return c > 0; })
                      : (act.dtype == DType::kFloat32 && act.numel() > 0);
  if (!ok)
    return Status::InvalidArgument(
        fmt::format("env {}: action space must be discrete, multi-discrete or a non-empty float32 box, got {}",
                    spec.name, act.ToString()));
  if (spec.max_episode_steps < 0)
    return Status::InvalidArgument(
        fmt::format("env {}: max_episode_steps must be >= 0, got {}", spec.name, spec.max_episode_steps));
  if (spec.num_agents < 1)
    return Status::InvalidArgument(fmt::format("env {}: num_agents must be >= 1, got {}", spec.name, spec.num_agents));
  if (spec.global_state) {
    const Space& st = *spec.global_state;
    if (!st.is_box() || st.dtype != DType::kFloat32 || st.numel() <= 0)
      return Status::InvalidArgument(
          fmt::format("env {}: global_state must be a non-empty float32 box, got {}", spec.name, st.ToString()));
  }
  return Status::Ok();
}

// k frames of shape `frame` along the first axis (a scalar becomes [k]).
std::vector<int64_t> StackedShape(std::vector<int64_t> shape, int k) {
  if (shape.empty())
    shape = {k};
  else
    shape[0] *= k;
  return shape;
}

// k frames of `frame` along the first axis, bounds repeated per frame.
Space StackedSpace(const Space& frame, int k) {
  std::vector<int64_t> shape = StackedShape(frame.shape, k);
  std::vector<float> low, high;
  low.reserve(frame.low.size() * static_cast<std::size_t>(k));
  high.reserve(frame.high.size() * static_cast<std::size_t>(k));
  for (int i = 0; i < k; ++i) {
    low.insert(low.end(), frame.low.begin(), frame.low.end());
    high.insert(high.end(), frame.high.begin(), frame.high.end());
  }
  return Space::Box(std::move(shape), std::move(low), std::move(high));
}

std::vector<EnvDescriber>& Describers() {
  static std::vector<EnvDescriber> describers;
  return describers;
}

}  // namespace

bool AddEnvDescriber(EnvDescriber describer) {
  Describers().push_back(describer);
  return true;
}

Status DescribeEnv(const EnvConfig& env) {
  for (EnvDescriber describe : Describers())
    if (Status s = describe(env); !s.ok()) return s;
  return Status::Ok();
}

Status EnvGroup::Create(const EnvConfig& env, int num_envs, uint64_t seed, std::unique_ptr<EnvGroup>* out) {
  if (Status s = DescribeEnv(env); !s.ok()) return s;
  EnvGroupOptions group_options;
  group_options.frame_stack = env.frame_stack;
  return Create(env.name, env.options, num_envs, seed, group_options, out);
}

Status EnvGroup::Create(const std::string& env_name, const std::map<std::string, double>& options, int num_envs,
                        uint64_t seed, std::unique_ptr<EnvGroup>* out) {
  return Create(env_name, options, num_envs, seed, EnvGroupOptions{}, out);
}

Status EnvGroup::Layout(const EnvConfig& env, int num_envs, EnvGroupLayout* out) {
  if (Status s = DescribeEnv(env); !s.ok()) return s;
  const EnvFamily* family = nullptr;
  EnvOptions resolved;
  return Plan(env.name, env.options, num_envs, env.frame_stack, &family, &resolved, out);
}

Status EnvGroup::Plan(const std::string& env_name, const std::map<std::string, double>& options, int num_envs,
                      int frame_stack, const EnvFamily** family_out, EnvOptions* resolved, EnvGroupLayout* out) {
  const EnvFamily* family = EnvRegistry::Global().Find(env_name);
  if (family == nullptr) {
    const auto names = EnvRegistry::Global().Names();
    return Status::NotFound(
        fmt::format("unknown env '{}'; registered envs: {}", env_name,
                    names.empty() ? std::string("(none)") : fmt::format("{}", fmt::join(names, ", "))));
  }
  if (num_envs < 1)
    return Status::InvalidArgument(fmt::format("env {}: num_envs must be >= 1, got {}", env_name, num_envs));
  const int k = frame_stack;
  if (k < 1 || k > kMaxFrameStack)
    return Status::InvalidArgument(
        fmt::format("env {}: frame_stack must be a whole number from 1 to {}, got {}", env_name, kMaxFrameStack, k));

  if (Status s = ResolveEnvOptions(env_name, family->default_options, options, resolved); !s.ok()) return s;

  EnvGroupLayout layout;
  // The spec follows the resolved options, so it is built per group; it sizes
  // the buffers and the worker's handshake.
  try {
    layout.env_spec = family->spec(*resolved);
  } catch (const std::invalid_argument& e) {
    // Like factories, specs reject out-of-range option values by throwing.
    return Status::InvalidArgument(fmt::format("env {}: {}", env_name, e.what()));
  }
  EnvSpec& spec = layout.env_spec;
  if (spec.name.empty()) spec.name = env_name;
  if (spec.name != env_name)
    return Status::InvalidArgument(
        fmt::format("env {}: registered under this name but its spec says '{}'", env_name, spec.name));
  if (Status s = CheckSpaces(spec); !s.ok()) return s;

  // Row indices travel as int32 (final_obs_index).
  if (static_cast<int64_t>(num_envs) * spec.num_agents > std::numeric_limits<int32_t>::max())
    return Status::InvalidArgument(
        fmt::format("env {}: {} envs x {} agents is too many rows", env_name, num_envs, spec.num_agents));
  // The rows carry the stacked observation; the env keeps writing one frame.
  layout.frame_stack = k;
  layout.obs_shape = k > 1 ? StackedShape(spec.observation.shape, k) : spec.observation.shape;
  layout.obs_numel = k * spec.observation.numel();
  layout.state_numel = spec.global_state ? spec.global_state->numel() : 0;
  layout.rows = static_cast<int64_t>(num_envs) * spec.num_agents;
  *family_out = family;
  *out = std::move(layout);
  return Status::Ok();
}

Status EnvGroup::Create(const std::string& env_name, const std::map<std::string, double>& options, int num_envs,
                        uint64_t seed, const EnvGroupOptions& group_options, std::unique_ptr<EnvGroup>* out) {
  const EnvFamily* family = nullptr;
  EnvOptions resolved;
  EnvGroupLayout layout;
  if (Status s = Plan(env_name, options, num_envs, group_options.frame_stack, &family, &resolved, &layout); !s.ok())
    return s;
  const int k = layout.frame_stack;
  std::unique_ptr<EnvGroup> group(new EnvGroup());
  group->env_spec_ = std::move(layout.env_spec);
  group->spec_ = group->env_spec_;
  group->frame_stack_ = k;
  if (k > 1) group->spec_.observation = StackedSpace(group->env_spec_.observation, k);

  group->envs_.reserve(static_cast<std::size_t>(num_envs));
  for (int i = 0; i < num_envs; ++i) {
    try {
      group->envs_.push_back(family->make(resolved, EnvSeed(seed, i)));
    } catch (const std::invalid_argument& e) {
      // Factories reject out-of-range option values by throwing; the caller
      // (config loading) wants that as a value.
      return Status::InvalidArgument(fmt::format("env {}: {}", env_name, e.what()));
    }
    if (!group->envs_.back()) return Status::InvalidArgument(fmt::format("env {}: factory returned no env", env_name));
  }

  const auto n = static_cast<std::size_t>(num_envs);
  const auto rows = n * static_cast<std::size_t>(group->spec_.num_agents);
  group->frame_numel_ = group->env_spec_.observation.numel();
  group->obs_numel_ = group->spec_.observation.numel();
  group->action_numel_ = group->spec_.action.numel();
  group->choices_ = group->spec_.action.categories();
  group->state_numel_ = group->spec_.global_state ? group->spec_.global_state->numel() : 0;
  const auto obs_numel = static_cast<std::size_t>(group->obs_numel_);  // per row, as sent
  const auto state_numel = static_cast<std::size_t>(group->state_numel_);
  group->frames_.assign(rows * static_cast<std::size_t>(group->frame_numel_), 0.0f);
  if (k > 1) group->stacked_.assign(rows * obs_numel, 0.0f);
  group->global_state_.assign(n * state_numel, 0.0f);  // one state per env
  group->reward_.assign(rows, 0.0f);
  group->terminated_.assign(rows, 0);
  group->truncated_.assign(rows, 0);
  group->active_.assign(rows, 1);
  if (group->spec_.agents_finish_early) group->done_.assign(rows, 0);
  group->ended_.assign(n, 0);
  group->team_reward_.assign(n, 0.0f);
  group->episode_length_.assign(n, 0);
  group->episode_limit_.assign(n, 0);
  group->episode_return_.assign(n, 0.0);
  // At most every env finishes in one Step: reserving that much now keeps Step
  // free of allocations.
  group->final_obs_index_.reserve(rows);
  group->final_obs_.reserve(rows * obs_numel);
  group->final_global_state_.reserve(n * state_numel);
  group->finished_.reserve(n);
  // Start in a steppable state; a later Reset() simply starts new episodes.
  try {
    group->Reset();
    // An env whose spec declares agents_finish_early must answer agents_done: ask now, so that one that does
    // not is refused here by name rather than at its first step. Nothing is finished right after a reset.
    if (group->spec_.agents_finish_early) {
      for (int e = 0; e < num_envs; ++e) {
        uint8_t* done = group->done_.data() + static_cast<std::size_t>(e) * group->spec_.num_agents;
        group->envs_[e]->agents_done(done);
        for (int a = 0; a < group->spec_.num_agents; ++a)
          if (done[a] != 0)
            return Status::InvalidArgument(fmt::format(
                "env {}: agents_done says agent {} of env {} is done right after a reset, expected every agent "
                "to act at an episode's start",
                env_name, a, e));
      }
    }
  } catch (const std::logic_error& e) {
    // An env that cannot start, such as one whose spec promises a global state
    // it does not write (Env::state's default throws std::logic_error), or
    // agents_finish_early without agents_done.
    return Status::InvalidArgument(fmt::format("env {}: {}", env_name, e.what()));
  }
  *out = std::move(group);
  return Status::Ok();
}

void EnvGroup::WriteState(int e) {
  if (state_numel_ == 0) return;
  envs_[e]->state(global_state_.data() + static_cast<std::size_t>(e) * static_cast<std::size_t>(state_numel_));
}

void EnvGroup::PushFrames(int e) {
  if (frame_stack_ == 1) return;
  const auto frame = static_cast<std::size_t>(frame_numel_);
  const auto stacked = static_cast<std::size_t>(obs_numel_);
  for (int r = e * spec_.num_agents; r < (e + 1) * spec_.num_agents; ++r) {
    float* row = stacked_.data() + static_cast<std::size_t>(r) * stacked;
    const float* newest = frames_.data() + static_cast<std::size_t>(r) * frame;
    std::copy(row + frame, row + stacked, row);  // drop the oldest (overlapping, towards the front)
    std::copy(newest, newest + frame, row + stacked - frame);
  }
}

void EnvGroup::FillFrames(int e) {
  if (frame_stack_ == 1) return;
  const auto frame = static_cast<std::size_t>(frame_numel_);
  const auto stacked = static_cast<std::size_t>(obs_numel_);
  for (int r = e * spec_.num_agents; r < (e + 1) * spec_.num_agents; ++r) {
    float* row = stacked_.data() + static_cast<std::size_t>(r) * stacked;
    const float* first = frames_.data() + static_cast<std::size_t>(r) * frame;
    for (int i = 0; i < frame_stack_; ++i) std::copy(first, first + frame, row + static_cast<std::size_t>(i) * frame);
  }
}

void EnvGroup::ResetEnv(int e) {
  envs_[e]->reset(frames_.data() + static_cast<std::size_t>(e) * spec_.num_agents * frame_numel_);
  FillFrames(e);
  WriteState(e);
}

void EnvGroup::Reset() {
  final_obs_index_.clear();
  final_obs_.clear();
  final_global_state_.clear();
  finished_.clear();
  std::fill(reward_.begin(), reward_.end(), 0.0f);
  std::fill(terminated_.begin(), terminated_.end(), 0);
  std::fill(truncated_.begin(), truncated_.end(), 0);
  std::fill(active_.begin(), active_.end(), 1);  // every agent acts after a reset
  inactive_rows_ = 0;
  std::fill(ended_.begin(), ended_.end(), 0);
  std::fill(team_reward_.begin(), team_reward_.end(), 0.0f);
  std::fill(episode_length_.begin(), episode_length_.end(), 0);
  std::fill(episode_limit_.begin(), episode_limit_.end(), 0);
  std::fill(episode_return_.begin(), episode_return_.end(), 0.0);
  for (int e = 0; e < size(); ++e) ResetEnv(e);
}

bool EnvGroup::DecorrelateEpisodes(uint64_t seed) {
  const int max_steps = spec_.max_episode_steps;
  if (max_steps <= 0) return false;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> steps(1, max_steps);
  for (int e = 0; e < size(); ++e) {
    // A draw at or below the steps already taken ends the episode at the next step; one at the limit is no cut.
    const int32_t limit = std::max(steps(rng), episode_length_[e] + 1);
    episode_limit_[e] = limit < max_steps ? limit : 0;
  }
  return true;
}

void EnvGroup::Step(const int64_t* discrete_actions, const float* continuous_actions) {
  final_obs_index_.clear();
  final_obs_.clear();
  final_global_state_.clear();
  finished_.clear();

  const bool discrete = spec_.action.is_categorical();  // discrete or multi-discrete: int64
  if (discrete ? discrete_actions == nullptr : continuous_actions == nullptr)
    throw std::invalid_argument(
        fmt::format("EnvGroup::Step on {}: missing {} actions", spec_.name, discrete ? "discrete" : "continuous"));
  const std::vector<int64_t>& choices = choices_;  // per component: {n} or nvec
  const auto k = static_cast<int64_t>(choices.size());
  const int max_steps = spec_.max_episode_steps;
  const int agents = spec_.num_agents;
  const int n = size();

  for (int e = 0; e < n; ++e) {
    const int first_row = e * agents;
    float* obs = frames_.data() + static_cast<std::size_t>(first_row) * frame_numel_;
    ActionRef action;
    if (discrete) {
      action.discrete = discrete_actions + static_cast<std::size_t>(first_row) * k;
      // An out-of-range action is a learner/wire bug; envs index with it. Per row, component c in
      // [0, choices[c]) (no division on this per-step path).
      const int64_t* a = action.discrete;
      for (int r = first_row; r < first_row + agents; ++r) {
        for (int64_t c = 0; c < k; ++c, ++a) {
          const int64_t limit = choices[static_cast<std::size_t>(c)];
          if (*a >= 0 && *a < limit) continue;
          const std::string where =
              agents == 1 ? fmt::format("env {}", e) : fmt::format("row {} (env {}, agent {})", r, e, r - first_row);
          throw std::out_of_range(fmt::format("EnvGroup::Step on {}: {} got action {}{}, expected [0, {})", spec_.name,
                                              where, *a, k == 1 ? std::string() : fmt::format(" in component {}", c),
                                              limit));
        }
      }
    } else {
      action.continuous = continuous_actions + static_cast<std::size_t>(first_row) * action_numel_;
    }

    const StepResult res = envs_[e]->step(action, obs);
    PushFrames(e);
    WriteState(e);
    const int32_t length = ++episode_length_[e];
    episode_return_[e] += res.reward;
    team_reward_[e] = res.reward;
    // Agents that finish early: which are done now. Every agent done ends the env as a team termination (there
    // is no one left to act, and nothing to bootstrap).
    const uint8_t* done = nullptr;
    bool all_done = false;
    if (spec_.agents_finish_early) {
      uint8_t* answers = done_.data() + first_row;
      envs_[e]->agents_done(answers);
      all_done = true;
      for (int a = 0; a < agents; ++a) {
        // A row inactive since an earlier step that comes back would act again mid-episode: the learner has
        // already left it out until the env's end, so this is an env bug.
        if (!active_[first_row + a] && !answers[a])
          throw std::logic_error(fmt::format(
              "env {} (env {} of the group): agents_done says agent {} is not done, but it was at an earlier "
              "step; an agent's part stays over until the next reset",
              spec_.name, e, a));
        all_done = all_done && answers[a] != 0;
      }
      done = answers;
    }
    // Gymnasium's TimeLimit: truncation only when the env did not terminate on
    // the same step, so the learner never bootstraps past a real terminal.
    const bool terminated = res.terminated || all_done;
    const int limit = episode_limit_[e] > 0 ? episode_limit_[e] : max_steps;
    const bool truncated = !terminated && limit > 0 && length >= limit;
    const bool ended = terminated || truncated;
    ended_[e] = ended;
    if (observer_) observer_(e, *envs_[e], res.reward, ended);
    if (done == nullptr) {
      for (int r = first_row; r < first_row + agents; ++r) {
        reward_[r] = res.reward;
        terminated_[r] = terminated;
        truncated_[r] = truncated;
      }
    } else {
      for (int r = first_row; r < first_row + agents; ++r) {
        const bool was_active = active_[r] != 0;  // acted on the observation this step answered
        const bool now_done = done[r - first_row] != 0;
        // An agent's own end (while its env goes on) is a termination of its row alone. At the env's end every
        // row gets the env's flag, as without agents_finish_early: truncated rows must be whole envs (the
        // learner keeps an env's agents together), so an agent done on the time limit's step is truncated
        // with the others.
        reward_[r] = was_active ? res.reward : 0.0f;
        terminated_[r] = terminated || (!truncated && was_active && now_done);
        truncated_[r] = truncated;
        // After the env's end the reset below starts a new episode in which every agent acts.
        const uint8_t active = ended || !now_done ? 1 : 0;
        inactive_rows_ += static_cast<int64_t>(active_[r]) - active;
        active_[r] = active;
      }
    }
    if (ended) {
      finished_.push_back(EpisodeStat{static_cast<float>(episode_return_[e]), length, truncated && episode_limit_[e] > 0});
      episode_limit_[e] = 0;
      // A truncated episode's value is bootstrapped from its last observation
      // (and state), which the reset below overwrites: keep a copy per row
      // (stacked, so the value is of the observation the policy would see).
      if (truncated) {
        for (int r = first_row; r < first_row + agents; ++r) final_obs_index_.push_back(r);
        const float* last = EnvObs(e);
        final_obs_.insert(final_obs_.end(), last, last + agents * obs_numel_);
        if (state_numel_ > 0) {
          const float* state = global_state_.data() + static_cast<std::size_t>(e) * state_numel_;
          final_global_state_.insert(final_global_state_.end(), state, state + state_numel_);
        }
      }
      ResetEnv(e);
      episode_length_[e] = 0;
      episode_return_[e] = 0.0;
    }
  }
}

}  // namespace farm
