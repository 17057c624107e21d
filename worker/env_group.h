// EnvGroup: a vector of envs of one family stepped together, with auto-reset
// and Gymnasium's TimeLimit truncation, and optional frame stacking. Results
// land in contiguous buffers that the worker copies straight into a StepRequest.
//
// Threading: one thread at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "worker/env.h"

namespace farm {

// What the group does to the envs' observations before anyone reads them
// (docs/ENVIRONMENTS.md, "Frame stacking").
struct EnvGroupOptions {
  // Observations per row: the last frame_stack env observations, oldest first,
  // concatenated along the first axis ([D] -> [k*D], [C, H, W] -> [k*C, H, W],
  // a scalar -> [k]); after a reset every slot holds the reset observation.
  // 1: the env's observation as it is. 1 to kMaxFrameStack.
  int frame_stack = 1;
};
inline constexpr int kMaxFrameStack = 64;

// What a group would be, short of building it (EnvGroup::Layout).
struct EnvGroupLayout {
  EnvSpec env_spec;  // the env's own, env.options resolved: one frame per observation
  int frame_stack = 1;
  std::vector<int64_t> obs_shape;  // a row's observation, stacked: the group's spec().observation.shape
  int64_t obs_numel = 0;           // its elements: frame_stack x env_spec.observation.numel()
  int64_t state_numel = 0;         // an env's global state; 0 without one
  int64_t rows = 0;                // num_envs x env_spec.num_agents
};

struct EpisodeStat {
  float episode_return = 0;
  int32_t length = 0;
  // A first episode cut short by DecorrelateEpisodes: its return understates the policy's, so the worker does
  // not report it.
  bool cut = false;
};

// Envs a config describes rather than names (env.mujoco: a robot of your own). A describer looks at the env
// section; when it describes an env, it registers a family under env.name (once per process: the same
// description again does nothing) and returns Ok, and a bad description is an error naming the key and what was
// expected. Describers register at static initialisation (worker/envs/mujoco/config_task.cpp).
using EnvDescriber = Status (*)(const EnvConfig& env);
bool AddEnvDescriber(EnvDescriber describer);
// Runs every describer over `env`: EnvGroup::Create and Layout with an EnvConfig do it first, so workers,
// farm-eval and farm-random find a described env as a registered one.
Status DescribeEnv(const EnvConfig& env);

// Rows: an env with num_agents agents has that many rows, env-major: agent a
// of env e is row e * num_agents + a. Every per-row buffer below (actions,
// obs, reward, flags, global state) is laid out that way; with one agent per
// env, rows are envs.
class EnvGroup {
 public:
  // Builds `num_envs` envs of `env_name`; env i gets seed (seed, i) mixed.
  // Fails with a clear Status for an unknown env or a bad option.
  static Status Create(const std::string& env_name, const std::map<std::string, double>& options, int num_envs,
                       uint64_t seed, const EnvGroupOptions& group_options, std::unique_ptr<EnvGroup>* out);
  // The same with env.name, env.options and env.frame_stack: what workers and
  // farm-eval call, so that they preprocess alike.
  static Status Create(const EnvConfig& env, int num_envs, uint64_t seed, std::unique_ptr<EnvGroup>* out);
  // No preprocessing (frame_stack 1).
  static Status Create(const std::string& env_name, const std::map<std::string, double>& options, int num_envs,
                       uint64_t seed, std::unique_ptr<EnvGroup>* out);
  // What Create(env, num_envs, ...) would build, with the same checks, but
  // without making an env or a buffer (the family's spec function is cheap,
  // and the stacked observation space, which holds bounds per element, is not
  // built): so that a caller can check sizes, such as the largest message
  // against transport.max_message_bytes, before Create commits memory.
  static Status Layout(const EnvConfig& env, int num_envs, EnvGroupLayout* out);

  // The spec of the rows: the env's, with the stacked observation space.
  const EnvSpec& spec() const { return spec_; }
  // The env's own spec (one frame per observation).
  const EnvSpec& env_spec() const { return env_spec_; }
  int frame_stack() const { return frame_stack_; }
  int size() const { return static_cast<int>(envs_.size()); }  // envs
  int num_agents() const { return spec_.num_agents; }
  int rows() const { return size() * num_agents(); }
  int64_t obs_numel() const { return obs_numel_; }  // per row, stacked: frame_stack() x frame_numel()
  int64_t frame_numel() const { return frame_numel_; }  // per row, one env observation
  int64_t state_numel() const { return state_numel_; }  // per env; 0 without a global state

  // Env e itself, read-only: for tools that look inside an env between steps (farm-eval --video reads a MuJoCo
  // env's simulation state).
  const Env& env(int e) const { return *envs_.at(static_cast<std::size_t>(e)); }
  // Called by Step after env e has stepped and before an ended env is reset, with the env's reward and whether
  // its episode ended (terminated or truncated): the only moment an episode's last state can be seen. Empty
  // (the default): nothing is called.
  using StepObserver = std::function<void(int e, const Env& env, float reward, bool ended)>;
  void SetStepObserver(StepObserver observer) { observer_ = std::move(observer); }

  // Resets every env; obs() holds the first observations, flags are cleared.
  void Reset();
  // Steps every env with its rows' actions (discrete: rows() int64;
  // multi-discrete: rows() x K int64; box: rows() x action numel floats). Finished envs are reset at once: obs()
  // holds their new first observation.
  void Step(const int64_t* discrete_actions, const float* continuous_actions);

  // Spreads the envs over the course of their episodes (Sample Factory's decorrelation of experience): each
  // env's current episode is truncated, as by the time limit, after a uniformly random number of steps in
  // [1, max_episode_steps] drawn from `seed`; the episodes after it run to the limit. Without it every env of a
  // run starts together, so each rollout holds the same stretch of every episode (the start, the middle or the
  // end). Its finished() entry has `cut` set when the cut ended it (not a termination before it). The worker calls it after
  // each Reset (with env.decorrelate_episodes); a Reset ends the cuts. False, doing nothing, for an env without
  // a time limit (max_episode_steps 0).
  bool DecorrelateEpisodes(uint64_t seed);

  // [rows, obs...] in spec().observation's shape (stacked frames with frame_stack > 1).
  const float* obs() const { return frame_stack_ > 1 ? stacked_.data() : frames_.data(); }
  // The env's team reward and flags, repeated on each of its rows; with
  // agents_finish_early (env.h), per row: an agent's own end terminates its
  // row alone, and a row inactive before the step gets reward 0. An env has
  // ended when every one of its rows is flagged (ended()), not when its first is.
  const float* reward() const { return reward_.data(); }  // [rows]
  const uint8_t* terminated() const { return terminated_.data(); }
  const uint8_t* truncated() const { return truncated_.data(); }
  // [rows]: 1 where the row's agent acts on obs(), 0 where it finished earlier
  // in its env's episode (including with the last Step: the row that step
  // terminated). Always 1 without agents_finish_early and after a reset.
  const uint8_t* active() const { return active_.data(); }
  // Whether some row is inactive now (StepRequest.active is sent only then).
  bool any_inactive() const { return inactive_rows_ > 0; }
  // [envs]: 1 for each env whose episode ended with the last Step (terminated,
  // truncated, or every agent done), and its team reward of that step (what
  // each of its rows that still acted got).
  const uint8_t* ended() const { return ended_.data(); }
  const float* team_reward() const { return team_reward_.data(); }
  // Rows of envs truncated (not terminated) by the last Step, ascending (all
  // agent rows of each such env), and their final observations (stacked like
  // obs(): the frames before the reset, the last one newest).
  const std::vector<int32_t>& final_obs_index() const { return final_obs_index_; }
  const std::vector<float>& final_obs() const { return final_obs_; }
  // With a global state only (no data otherwise): [envs, state...], one per
  // env (after the auto-reset, like obs()); and the final state of each
  // truncated env, in the order final_obs_index() lists them.
  const float* global_state() const { return global_state_.data(); }
  const std::vector<float>& final_global_state() const { return final_global_state_; }
  // Episodes that ended in the last Step, one per env (team return), in env order.
  const std::vector<EpisodeStat>& finished() const { return finished_; }

 private:
  EnvGroup() = default;
  // Layout's checks and results, with the family and resolved options that Create goes on with.
  static Status Plan(const std::string& env_name, const std::map<std::string, double>& options, int num_envs,
                     int frame_stack, const EnvFamily** family, EnvOptions* resolved, EnvGroupLayout* out);
  void ResetEnv(int e);
  // Env e's state into global_state_[e].
  void WriteState(int e);
  // Frame stacking, no-ops for frame_stack 1: env e's rows of frames_ (just
  // written by the env) become the newest frame of its stacked rows, or, after
  // a reset, every frame of them.
  void PushFrames(int e);
  void FillFrames(int e);
  // Env e's first row of obs().
  const float* EnvObs(int e) const { return obs() + static_cast<std::size_t>(e) * spec_.num_agents * obs_numel_; }

  EnvSpec spec_;      // stacked observation
  EnvSpec env_spec_;  // the env's own
  int frame_stack_ = 1;
  // frames_ is what the envs write: [rows, frame_numel_], one frame per row.
  // With frame_stack > 1 the rows' observations are in stacked_ ([rows,
  // obs_numel_], oldest frame first); with 1, stacked_ is empty, obs_numel_ is
  // frame_numel_ and obs() is frames_ itself.
  int64_t frame_numel_ = 0;
  int64_t obs_numel_ = 0;
  std::vector<float> frames_;
  std::vector<float> stacked_;
  int64_t action_numel_ = 0;
  std::vector<int64_t> choices_;  // categorical actions: choices per component ({n} or nvec); box: empty
  int64_t state_numel_ = 0;
  std::vector<std::unique_ptr<Env>> envs_;
  StepObserver observer_;
  std::vector<float> reward_;
  std::vector<uint8_t> terminated_;
  std::vector<uint8_t> truncated_;
  std::vector<uint8_t> active_;     // [rows]
  std::vector<uint8_t> done_;       // [rows]: Env::agents_done's answers (agents_finish_early only)
  int64_t inactive_rows_ = 0;       // zeros in active_
  std::vector<uint8_t> ended_;      // [envs]
  std::vector<float> team_reward_;  // [envs]
  std::vector<int32_t> final_obs_index_;
  std::vector<float> final_obs_;
  std::vector<float> global_state_;
  std::vector<float> final_global_state_;
  std::vector<EpisodeStat> finished_;
  std::vector<int32_t> episode_length_;  // per env
  std::vector<int32_t> episode_limit_;   // per env: the current episode's cut (DecorrelateEpisodes); 0: none
  std::vector<double> episode_return_;   // per env
};

}  // namespace farm
