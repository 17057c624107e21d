// The base of every MuJoCo env: one mjData over a shared Model, a reset to the model's initial state plus
// seeded noise, and a step that clips the action into each actuator's control range and advances the physics
// frame_skip times (Gymnasium's MujocoEnv: data.ctrl = action, mj_step n times, then mj_rnePostConstraint so
// that contact forces, cfrc_ext, are current). A task (worker/envs/mujoco/locomotion.h, or a user's class)
// adds the observation, the reward and the termination.
//
// Threading: one thread at a time per env (env.h); the Model is shared read-only.
#pragma once

#include <mujoco/mujoco.h>

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "worker/env.h"
#include "worker/envs/mujoco/model.h"

namespace farm::mujoco {

// How a reset perturbs the initial velocities: uniform in [-scale, scale] (Hopper, Walker2d, Humanoid, Swimmer)
// or scale times a standard normal (HalfCheetah, Ant, InvertedDoublePendulum).
enum class VelocityNoise { kUniform, kNormal };

// What the policy's action means: a control clipped into each actuator's ctrlrange (kClip, Gymnasium's tasks;
// the action space is the ctrlranges), or a value in [-1, 1] mapped linearly onto the ctrlrange (kScale; the
// action space is [-1, 1] for every actuator, values outside it clipped first).
enum class ActionMode { kClip, kScale };

class MujocoEnv : public Env {
 public:
  MujocoEnv(std::shared_ptr<const Model> model, int frame_skip, uint64_t seed,
            ActionMode action_mode = ActionMode::kClip);
  ~MujocoEnv() override;
  MujocoEnv(const MujocoEnv&) = delete;
  MujocoEnv& operator=(const MujocoEnv&) = delete;

  const mjModel* model() const { return model_->get(); }
  const mjData* data() const { return data_; }
  const Model& shared_model() const { return *model_; }
  std::shared_ptr<const Model> model_handle() const { return model_; }
  // Seconds of simulated time per env step: timestep * frame_skip.
  double dt() const { return model()->opt.timestep * frame_skip_; }
  int frame_skip() const { return frame_skip_; }

  // For tests and tools: put the simulation in a state (qpos: nq values, qvel: nv), then mj_forward, as
  // Gymnasium's set_state does.
  void SetState(const std::vector<double>& qpos, const std::vector<double>& qvel);

  // The action space every MuJoCo task shares: one float per actuator, in its ctrlrange with kClip ([-1, 1]
  // for an actuator without a limit), in [-1, 1] with kScale.
  static Space ActionSpace(const mjModel* m, ActionMode mode = ActionMode::kClip);

 protected:
  // mj_resetData, then qpos = qpos0 + U(-qpos_noise, qpos_noise) and qvel = 0 + the velocity noise, then
  // mj_forward.
  void ResetWithNoise(double qpos_noise, double qvel_noise, VelocityNoise kind);
  // Clips `action` (nu floats) into the action space, keeps it (clipped_action()), sets data.ctrl (mapped onto
  // the ctrlranges with kScale) and steps frame_skip times.
  void Simulate(const float* action);
  // The last action after clipping into the action space, for control costs.
  const std::vector<double>& clipped_action() const { return action_; }

  mjData* mutable_data() { return data_; }
  std::mt19937_64& rng() { return rng_; }

 private:
  std::shared_ptr<const Model> model_;
  mjData* data_;  // owned; mj_deleteData in the destructor
  int frame_skip_;
  ActionMode action_mode_;
  std::vector<double> action_;
  std::mt19937_64 rng_;
};

}  // namespace farm::mujoco
