// A robot of the user's own, described in the config (env.mujoco, common/config.h's MujocoConfig): its MJCF
// file and a LocomotionTask built from the keys. The describer registers it under env.name when a worker,
// farm-eval or farm-random first builds an env group from the config (worker/env_group.h, EnvDescriber).
//
// Threading: TaskFromConfig is a pure function; DescribeMujocoRobot may be called from any thread (it locks).
#pragma once

#include <memory>
#include <string>

#include "common/config.h"
#include "common/status.h"
#include "worker/envs/mujoco/locomotion.h"
#include "worker/envs/mujoco/model.h"

namespace farm::mujoco {

// The task env.mujoco describes, over its compiled model, under the name `name`. Throws std::invalid_argument
// naming the key and what the model has, for a joint, body or sensor the model lacks or a joint that cannot be
// bounded (a free or ball joint: bound a body's height instead).
LocomotionTask TaskFromConfig(const MujocoConfig& config, const std::string& name, const Model& model);

// The EnvDescriber: with env.mujoco.model set, loads the model, builds and checks the task and registers it as
// env.name (once per process; the same description again does nothing, another one under the same name, or a
// registered env's name, is refused).
Status DescribeMujocoRobot(const EnvConfig& env);

}  // namespace farm::mujoco
