// A robot of the user's own from env.mujoco: the keys become a LocomotionTask over the user's MJCF.
#include "worker/envs/mujoco/config_task.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <limits>
#include <map>
#include <mutex>
#include <stdexcept>

#include "worker/env_group.h"

namespace farm::mujoco {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

ObsPart Part(const std::string& name, const MujocoConfig& c) {
  ObsPart part;
  if (name == "qpos") {
    part.kind = ObsPart::Kind::kQpos;
    part.skip = c.qpos_skip;
  } else if (name == "qvel") {
    part.kind = ObsPart::Kind::kQvel;
    part.clip = c.qvel_clip;
  } else if (name == "sensors") {
    part.kind = ObsPart::Kind::kSensors;
    part.sensors = c.sensors;
  } else if (name == "cfrc_ext") {
    part.kind = ObsPart::Kind::kContactForce;
    part.clip_low = c.contact_force_min;
    part.clip_high = c.contact_force_max;
  } else if (name == "cinert") {
    part.kind = ObsPart::Kind::kComInertia;
  } else if (name == "cvel") {
    part.kind = ObsPart::Kind::kComVelocity;
  } else if (name == "qfrc_actuator") {
    part.kind = ObsPart::Kind::kActuatorForce;
  } else {
    throw std::invalid_argument(fmt::format(
        "env.mujoco.observation: no part '{}'; expected qpos, qvel, sensors, cfrc_ext, cinert, cvel or qfrc_actuator",
        name));
  }
  return part;
}

// Every field of the description, for telling two descriptions under one name apart.
std::string Fingerprint(const MujocoConfig& c) {
  std::string bounds;
  for (const MujocoHealthBound& b : c.healthy)
    bounds += fmt::format("{}|{}|{}|{};", b.body, b.joint, b.min.value_or(-kInf), b.max.value_or(kInf));
  return fmt::format("{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}", c.model, c.frame_skip,
                     c.max_episode_steps, fmt::join(c.observation, ","), c.qpos_skip, c.qvel_clip,
                     fmt::join(c.sensors, ","), c.contact_force_min, c.contact_force_max, c.action, c.forward,
                     c.forward_body, c.forward_weight, c.healthy_reward, c.ctrl_cost_weight, c.contact_cost_weight,
                     c.terminate_when_unhealthy, bounds, c.reset_noise_scale, c.reset_qvel_noise,
                     c.reward_threshold.value_or(-kInf), c.healthy.size());
}

}  // namespace

LocomotionTask TaskFromConfig(const MujocoConfig& c, const std::string& name, const Model& model) {
  const mjModel* m = model.get();
  LocomotionTask t;
  t.name = name;
  t.frame_skip = c.frame_skip;
  t.max_episode_steps = c.max_episode_steps;
  t.reward_threshold = c.reward_threshold;
  for (const std::string& part : c.observation) t.observation.push_back(Part(part, c));
  if (c.forward == "root_x") {
    t.forward.of = Forward::Of::kRootX;
  } else if (c.forward == "mass_center") {
    t.forward.of = Forward::Of::kMassCenter;
  } else if (c.forward_body.empty()) {
    t.forward.of = Forward::Of::kRootX;  // forward_weight 0 (config validation): not rewarded
  } else {
    t.forward = Forward{Forward::Of::kBody, c.forward_body};
  }
  t.forward_weight = c.forward_weight;
  t.healthy_reward = c.healthy_reward;
  t.ctrl_cost_weight = c.ctrl_cost_weight;
  t.contact_cost_weight = c.contact_cost_weight;
  t.contact_force_range = Range{c.contact_force_min, c.contact_force_max, true};
  t.terminate_when_unhealthy = c.terminate_when_unhealthy;
  t.finite_state = true;
  for (std::size_t i = 0; i < c.healthy.size(); ++i) {
    const MujocoHealthBound& b = c.healthy[i];
    const Range range{b.min.value_or(-kInf), b.max.value_or(kInf), true};
    if (!b.body.empty()) {
      t.body_heights.push_back({b.body, range});
      continue;
    }
    const int joint = mj_name2id(m, mjOBJ_JOINT, b.joint.c_str());
    if (joint < 0)
      throw std::invalid_argument(fmt::format("env.mujoco.healthy[{}]: no joint '{}' in {}; joints: {}", i, b.joint,
                                              model.name(), fmt::join(model.Names(mjOBJ_JOINT, m->njnt), ", ")));
    if (m->jnt_type[joint] != mjJNT_HINGE && m->jnt_type[joint] != mjJNT_SLIDE)
      throw std::invalid_argument(fmt::format(
          "env.mujoco.healthy[{}]: joint '{}' is a {} joint; expected a hinge or slide joint (bound a body's height "
          "with body: instead)",
          i, b.joint, m->jnt_type[joint] == mjJNT_FREE ? "free" : "ball"));
    t.qpos_bounds.push_back({m->jnt_qposadr[joint], range});
  }
  t.action_mode = c.action == "scale" ? ActionMode::kScale : ActionMode::kClip;
  t.reset_qpos_noise = t.reset_qvel_noise = c.reset_noise_scale;
  t.reset_qvel_kind = c.reset_qvel_noise == "normal" ? VelocityNoise::kNormal : VelocityNoise::kUniform;
  return t;
}

Status DescribeMujocoRobot(const EnvConfig& env) {
  const MujocoConfig& c = env.mujoco;
  if (c.model.empty()) return Status::Ok();
  static std::mutex mu;
  static std::map<std::string, std::string> described;  // env name -> the description registered under it
  std::lock_guard<std::mutex> lock(mu);
  const std::string fingerprint = Fingerprint(c);
  if (auto it = described.find(env.name); it != described.end()) {
    if (it->second == fingerprint) return Status::Ok();
    return Status::InvalidArgument(fmt::format(
        "env {}: described twice in this process with different env.mujoco sections; give each robot a name of "
        "its own",
        env.name));
  }
  if (EnvRegistry::Global().Find(env.name) != nullptr)
    return Status::InvalidArgument(fmt::format(
        "env.name '{}' is a registered env; a robot described by env.mujoco needs a name of its own (e.g. "
        "MyRobot-v0)",
        env.name));
  std::shared_ptr<const Model> model;
  if (Status s = Model::FromFile(c.model, &model); !s.ok())
    return Status::InvalidArgument(fmt::format("env.mujoco.model: {}", s.message()));
  LocomotionTask task;
  try {
    task = TaskFromConfig(c, env.name, *model);
    ValidateTask(task, *model);
  } catch (const std::invalid_argument& e) {
    return Status::InvalidArgument(fmt::format("env.mujoco: {}", e.what()));
  }
  EnvFamily family;
  family.spec = [task, model](const EnvOptions&) { return LocomotionSpec(task, model->get()); };
  family.make = [task, model](const EnvOptions&, uint64_t seed) -> std::unique_ptr<Env> {
    return std::make_unique<LocomotionEnv>(task, model, seed);
  };
  EnvRegistry::Global().Add(env.name, std::move(family));
  described[env.name] = fingerprint;
  return Status::Ok();
}

namespace {
const bool registered = AddEnvDescriber(DescribeMujocoRobot);
}  // namespace

}  // namespace farm::mujoco
