// A locomotion task described as data: what the observation holds, which reward terms weigh how much, when the
// robot is healthy, how a reset perturbs it. Gymnasium's v4 locomotion tasks (gymnasium_tasks.cpp) are
// instances of it over the built-in models, and a robot of a user's own is the same description over their
// MJCF. What the description cannot say is written as a task class over MujocoEnv (as
// InvertedDoublePendulum-v4 is).
//
// Per step (Gymnasium's order): the position that "forward" measures, the physics (MujocoEnv::Simulate), the
// position again; then
//   reward = forward_weight * forward velocity + healthy_reward * (healthy or terminate_when_unhealthy)
//            - ctrl_cost_weight * sum(action^2) - contact_cost_weight * sum(clip(cfrc_ext)^2)
//   terminated = terminate_when_unhealthy and not healthy
// with the action as clipped into the control ranges (as CleanRL's and SB3's ClipAction give the env).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "worker/env.h"
#include "worker/envs/mujoco/mujoco_env.h"

namespace farm::mujoco {

struct Range {
  double low = 0;
  double high = 0;
  bool inclusive = false;  // low <= x <= high; false: low < x < high
  bool Contains(double x) const { return inclusive ? (low <= x && x <= high) : (low < x && x < high); }
};

// One part of the observation, written in the order the task lists them.
struct ObsPart {
  enum class Kind {
    kQpos,           // qpos[skip:]
    kQvel,           // qvel, clipped to +-clip when clip > 0
    kComInertia,     // cinert of every body (10 each, the world's included, as Gymnasium v4)
    kComVelocity,    // cvel of every body (6 each)
    kActuatorForce,  // qfrc_actuator (nv)
    kContactForce,   // cfrc_ext of every body (6 each), clipped to [clip_low, clip_high] when clip_low < clip_high
    kSensors,        // the readings (sensordata) of the named sensors in that order; none named: every sensor's
  };
  Kind kind = Kind::kQpos;
  int skip = 0;          // kQpos: leading entries left out (the root's x, or x and y)
  double clip = 0;       // kQvel
  double clip_low = 0;   // kContactForce
  double clip_high = 0;  // kContactForce
  std::vector<std::string> sensors;  // kSensors
};

// What the forward velocity is of.
struct Forward {
  enum class Of {
    kRootX,       // qpos[0] (planar robots: the root's slide joint)
    kBody,        // the x of a named body's centre of mass (xipos)
    kMassCenter,  // the x of the whole robot's centre of mass (bodies' xipos weighted by their masses)
  };
  Of of = Of::kRootX;
  std::string body;  // kBody
};

// A bound on one coordinate (qpos index) for the health check.
struct QposBound {
  int index = 0;
  Range range;
};

// A bound on a named body's height for the health check: the z of its frame (xpos) as of the step's last
// kinematics, and, for a body on a free joint, that joint's z in qpos (the state after the step, as Gymnasium's
// Ant reads qpos[2]).
struct BodyHeightBound {
  std::string body;
  Range range;
};

struct LocomotionTask {
  std::string name;        // the env's registered name, e.g. "Hopper-v4"
  int frame_skip = 1;
  int max_episode_steps = 1000;
  std::optional<double> reward_threshold;

  std::vector<ObsPart> observation;

  Forward forward;
  double forward_weight = 0;
  double healthy_reward = 0;
  double ctrl_cost_weight = 0;
  double contact_cost_weight = 0;   // over cfrc_ext clipped to contact_force_range
  Range contact_force_range{-1, 1, true};

  bool terminate_when_unhealthy = false;
  std::vector<QposBound> qpos_bounds;      // each qpos[index] within its range
  std::vector<BodyHeightBound> body_heights;  // each named body's height within its range
  std::optional<Range> state_range;        // every qpos[state_from:] and qvel value within it (Hopper)
  int state_from = 0;
  bool finite_state = false;               // every qpos and qvel finite (Ant, InvertedPendulum)

  // The policy's action: clipped into each actuator's ctrlrange (kClip, Gymnasium's tasks), or in [-1, 1] and
  // mapped onto the ctrlrange (kScale); the control cost is over the clipped action either way.
  ActionMode action_mode = ActionMode::kClip;

  double reset_qpos_noise = 0;
  double reset_qvel_noise = 0;
  VelocityNoise reset_qvel_kind = VelocityNoise::kUniform;
};

// The observation's length for a task over a model.
int ObservationSize(const LocomotionTask& task, const mjModel* m);
// The spec of a task over a model: a float box of ObservationSize (unbounded), the model's action space, the
// task's time limit and threshold.
EnvSpec LocomotionSpec(const LocomotionTask& task, const mjModel* m);
// Throws std::invalid_argument naming what the model lacks (a body, a sensor, a qpos index) or a bad value.
void ValidateTask(const LocomotionTask& task, const Model& model);

class LocomotionEnv : public MujocoEnv {
 public:
  LocomotionEnv(LocomotionTask task, std::shared_ptr<const Model> model, uint64_t seed);

  void reset(float* obs) override;
  StepResult step(const ActionRef& action, float* obs) override;

  const LocomotionTask& task() const { return task_; }
  bool IsHealthy() const;
  // The reward terms of the last step, for tests and plots.
  struct Terms {
    double forward_velocity = 0;
    double forward = 0;
    double healthy = 0;
    double ctrl_cost = 0;
    double contact_cost = 0;
  };
  const Terms& last_terms() const { return terms_; }
  void WriteObs(float* obs) const;

 private:
  double ForwardPosition() const;
  double ContactCost() const;
  double BodyHeight(int bound) const;

  LocomotionTask task_;
  int forward_body_ = -1;
  struct Slice {
    int adr = 0;
    int dim = 0;
  };
  std::vector<std::vector<Slice>> sensor_slices_;  // per kSensors part, in the order of task_.observation
  std::vector<int> height_bodies_;                 // per body_heights entry: the body's id
  std::vector<int> height_qpos_;                   // per body_heights entry: qpos index of its free joint's z, or -1
  double total_mass_ = 0;
  Terms terms_;
};

}  // namespace farm::mujoco
