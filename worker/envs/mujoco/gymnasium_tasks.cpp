// Gymnasium's v4 MuJoCo tasks over the built-in models (worker/envs/mujoco/models/): the observation layout,
// reward terms and weights, health ranges and termination, reset noise, frame skip, the time limit (1000 steps;
// Reacher's 50) and the registered reward thresholds of gymnasium/envs/mujoco/*_v4.py. Each accepts the keyword arguments of its
// Gymnasium constructor as env.options (0/1 for the booleans; a (low, high) range as two options _min and _max).
// Registered as "HalfCheetah-v4", "Hopper-v4", "Walker2d-v4", "Ant-v4", "Humanoid-v4", "Swimmer-v4",
// "InvertedPendulum-v4", "InvertedDoublePendulum-v4" and "Reacher-v4".
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>

#include "worker/env.h"
#include "worker/envs/mujoco/locomotion.h"
#include "worker/envs/mujoco/mujoco_env.h"
#include "worker/envs/mujoco/model.h"

namespace farm::mujoco {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

bool Flag(const EnvOptions& o, const char* key) { return o.at(key) != 0; }

// The parts every locomotion task starts with: qpos without the root's x (and y, for robots that move in a
// plane: skip 2) unless exclude_current_positions_from_observation is 0, and qvel (clipped to +-clip when > 0).
std::vector<ObsPart> PositionsAndVelocities(const EnvOptions& o, int root_skip, double qvel_clip) {
  ObsPart qpos;
  qpos.kind = ObsPart::Kind::kQpos;
  qpos.skip = Flag(o, "exclude_current_positions_from_observation") ? root_skip : 0;
  ObsPart qvel;
  qvel.kind = ObsPart::Kind::kQvel;
  qvel.clip = qvel_clip;
  return {qpos, qvel};
}

// What most tasks share: the name and frame skip, qpos and qvel observed, and the options every task takes
// (the forward reward's weight where the task has one, the control cost's, the reset noise's scale).
LocomotionTask BaseTask(const EnvOptions& o, const char* name, int frame_skip, int root_skip, double qvel_clip) {
  LocomotionTask t;
  t.name = name;
  t.frame_skip = frame_skip;
  t.observation = PositionsAndVelocities(o, root_skip, qvel_clip);
  t.forward_weight = o.count("forward_reward_weight") ? o.at("forward_reward_weight") : 1.0;  // Ant-v4 has none
  t.ctrl_cost_weight = o.at("ctrl_cost_weight");
  t.reset_qpos_noise = t.reset_qvel_noise = o.at("reset_noise_scale");
  return t;
}

void SetHealth(const EnvOptions& o, LocomotionTask* t) {
  t->healthy_reward = o.at("healthy_reward");
  t->terminate_when_unhealthy = Flag(o, "terminate_when_unhealthy");
}

// ---- HalfCheetah-v4: runs forward; never terminates.
EnvOptions HalfCheetahDefaults() {
  return {{"forward_reward_weight", 1.0}, {"ctrl_cost_weight", 0.1}, {"reset_noise_scale", 0.1},
          {"exclude_current_positions_from_observation", 1}};
}
LocomotionTask HalfCheetahTask(const EnvOptions& o) {
  LocomotionTask t = BaseTask(o, "HalfCheetah-v4", 5, 1, 0);
  t.reward_threshold = 4800.0;
  t.reset_qvel_kind = VelocityNoise::kNormal;
  return t;
}

// ---- Hopper-v4: one leg; healthy while the torso is high, upright and the state bounded.
EnvOptions HopperDefaults() {
  return {{"forward_reward_weight", 1.0},  {"ctrl_cost_weight", 1e-3},     {"healthy_reward", 1.0},
          {"terminate_when_unhealthy", 1}, {"healthy_state_min", -100.0}, {"healthy_state_max", 100.0},
          {"healthy_z_min", 0.7},          {"healthy_z_max", kInf},       {"healthy_angle_min", -0.2},
          {"healthy_angle_max", 0.2},      {"reset_noise_scale", 5e-3},   {"exclude_current_positions_from_observation", 1}};
}
LocomotionTask HopperTask(const EnvOptions& o) {
  LocomotionTask t = BaseTask(o, "Hopper-v4", 4, 1, 10.0);
  t.reward_threshold = 3800.0;
  SetHealth(o, &t);
  t.qpos_bounds = {{1, {o.at("healthy_z_min"), o.at("healthy_z_max")}},
                   {2, {o.at("healthy_angle_min"), o.at("healthy_angle_max")}}};
  t.state_range = Range{o.at("healthy_state_min"), o.at("healthy_state_max")};
  t.state_from = 2;
  return t;
}

// ---- Walker2d-v4: two legs; healthy while the torso's height and angle stay in range.
EnvOptions Walker2dDefaults() {
  return {{"forward_reward_weight", 1.0},  {"ctrl_cost_weight", 1e-3}, {"healthy_reward", 1.0},
          {"terminate_when_unhealthy", 1}, {"healthy_z_min", 0.8},    {"healthy_z_max", 2.0},
          {"healthy_angle_min", -1.0},     {"healthy_angle_max", 1.0}, {"reset_noise_scale", 5e-3},
          {"exclude_current_positions_from_observation", 1}};
}
LocomotionTask Walker2dTask(const EnvOptions& o) {
  LocomotionTask t = BaseTask(o, "Walker2d-v4", 4, 1, 10.0);
  SetHealth(o, &t);
  t.qpos_bounds = {{1, {o.at("healthy_z_min"), o.at("healthy_z_max")}},
                   {2, {o.at("healthy_angle_min"), o.at("healthy_angle_max")}}};
  return t;
}

// ---- Ant-v4: four legs in 3D; the torso's height in [0.2, 1.0] (bounds included) and a finite state.
EnvOptions AntDefaults() {
  return {{"ctrl_cost_weight", 0.5},       {"use_contact_forces", 0},      {"contact_cost_weight", 5e-4},
          {"healthy_reward", 1.0},         {"terminate_when_unhealthy", 1}, {"healthy_z_min", 0.2},
          {"healthy_z_max", 1.0},          {"contact_force_min", -1.0},    {"contact_force_max", 1.0},
          {"reset_noise_scale", 0.1},      {"exclude_current_positions_from_observation", 1}};
}
LocomotionTask AntTask(const EnvOptions& o) {
  LocomotionTask t = BaseTask(o, "Ant-v4", 5, 2, 0);
  t.reward_threshold = 6000.0;
  t.contact_force_range = Range{o.at("contact_force_min"), o.at("contact_force_max"), true};
  if (Flag(o, "use_contact_forces")) {
    ObsPart contact;
    contact.kind = ObsPart::Kind::kContactForce;
    contact.clip_low = t.contact_force_range.low;
    contact.clip_high = t.contact_force_range.high;
    t.observation.push_back(contact);
    t.contact_cost_weight = o.at("contact_cost_weight");
  }
  t.forward = Forward{Forward::Of::kBody, "torso"};
  SetHealth(o, &t);
  t.qpos_bounds = {{2, {o.at("healthy_z_min"), o.at("healthy_z_max"), true}}};
  t.finite_state = true;
  t.reset_qvel_kind = VelocityNoise::kNormal;
  return t;
}

// ---- Humanoid-v4: the centre of mass's forward velocity; observes inertias, body velocities, actuator and
// contact forces (376 values); the torso's height in (1, 2).
EnvOptions HumanoidDefaults() {
  return {{"forward_reward_weight", 1.25}, {"ctrl_cost_weight", 0.1}, {"healthy_reward", 5.0},
          {"terminate_when_unhealthy", 1}, {"healthy_z_min", 1.0},   {"healthy_z_max", 2.0},
          {"reset_noise_scale", 1e-2},     {"exclude_current_positions_from_observation", 1}};
}
LocomotionTask HumanoidTask(const EnvOptions& o) {
  LocomotionTask t = BaseTask(o, "Humanoid-v4", 5, 2, 0);
  for (ObsPart::Kind k : {ObsPart::Kind::kComInertia, ObsPart::Kind::kComVelocity, ObsPart::Kind::kActuatorForce,
                          ObsPart::Kind::kContactForce}) {
    ObsPart part;
    part.kind = k;
    t.observation.push_back(part);
  }
  t.forward = Forward{Forward::Of::kMassCenter, ""};
  SetHealth(o, &t);
  t.qpos_bounds = {{2, {o.at("healthy_z_min"), o.at("healthy_z_max")}}};
  return t;
}

// ---- Swimmer-v4: three links in a viscous fluid; never terminates.
EnvOptions SwimmerDefaults() {
  return {{"forward_reward_weight", 1.0}, {"ctrl_cost_weight", 1e-4}, {"reset_noise_scale", 0.1},
          {"exclude_current_positions_from_observation", 1}};
}
LocomotionTask SwimmerTask(const EnvOptions& o) {
  LocomotionTask t = BaseTask(o, "Swimmer-v4", 4, 2, 0);
  t.reward_threshold = 360.0;
  return t;
}

// ---- InvertedPendulum-v4: 1 per step while the pole's angle stays within +-0.2 (bounds included).
LocomotionTask InvertedPendulumTask(const EnvOptions& /*o*/) {
  LocomotionTask t;
  t.name = "InvertedPendulum-v4";
  t.frame_skip = 2;
  t.reward_threshold = 950.0;
  ObsPart qpos, qvel;
  qpos.kind = ObsPart::Kind::kQpos;
  qvel.kind = ObsPart::Kind::kQvel;
  t.observation = {qpos, qvel};
  t.healthy_reward = 1.0;
  t.terminate_when_unhealthy = true;
  t.qpos_bounds = {{1, {-0.2, 0.2, true}}};
  t.finite_state = true;
  t.reset_qpos_noise = t.reset_qvel_noise = 0.01;
  return t;
}

// ---- InvertedDoublePendulum-v4: a task class of its own (its observation takes sines and cosines and the
// constraint forces; its reward is the tip's distance from upright), as a user's task the description cannot
// say would be.
class InvertedDoublePendulum : public MujocoEnv {
 public:
  static constexpr int kObs = 11;
  InvertedDoublePendulum(std::shared_ptr<const Model> model, uint64_t seed) : MujocoEnv(std::move(model), 5, seed) {}

  void reset(float* obs) override {
    ResetWithNoise(0.1, 0.1, VelocityNoise::kNormal);
    WriteObs(obs);
  }

  StepResult step(const ActionRef& action, float* obs) override {
    Simulate(action.continuous);
    const mjData* d = data();
    const double x = d->site_xpos[0], y = d->site_xpos[2];  // the tip: the model's first site
    const double v1 = d->qvel[1], v2 = d->qvel[2];
    const double dist_penalty = 0.01 * x * x + (y - 2) * (y - 2);
    const double vel_penalty = 1e-3 * v1 * v1 + 5e-3 * v2 * v2;
    WriteObs(obs);
    StepResult r;
    r.reward = static_cast<float>(10.0 - dist_penalty - vel_penalty);
    r.terminated = y <= 1;
    return r;
  }

 private:
  void WriteObs(float* obs) const {
    const mjData* d = data();
    auto clip = [](double v) { return static_cast<float>(std::clamp(v, -10.0, 10.0)); };
    obs[0] = static_cast<float>(d->qpos[0]);                                   // the cart's position
    for (int i = 0; i < 2; ++i) obs[1 + i] = static_cast<float>(std::sin(d->qpos[1 + i]));  // the links' angles
    for (int i = 0; i < 2; ++i) obs[3 + i] = static_cast<float>(std::cos(d->qpos[1 + i]));
    for (int i = 0; i < 3; ++i) obs[5 + i] = clip(d->qvel[i]);
    for (int i = 0; i < 3; ++i) obs[8 + i] = clip(d->qfrc_constraint[i]);
  }
};

EnvSpec InvertedDoublePendulumSpec(const EnvOptions& /*o*/) {
  const mjModel* m = BuiltinModel("inverted_double_pendulum.xml")->get();
  constexpr float kMax = std::numeric_limits<float>::max();
  EnvSpec spec;
  spec.name = "InvertedDoublePendulum-v4";
  spec.observation = Space::Box({InvertedDoublePendulum::kObs}, std::vector<float>(InvertedDoublePendulum::kObs, -kMax),
                                std::vector<float>(InvertedDoublePendulum::kObs, kMax));
  spec.action = MujocoEnv::ActionSpace(m);
  spec.max_episode_steps = 1000;
  spec.reward_threshold = 9100.0;
  return spec;
}
std::unique_ptr<Env> MakeInvertedDoublePendulum(const EnvOptions& /*o*/, uint64_t seed) {
  return std::make_unique<InvertedDoublePendulum>(BuiltinModel("inverted_double_pendulum.xml"), seed);
}

// ---- Reacher-v4: a two-link arm reaching for a target placed at random on each reset. As in Gymnasium's v4 the
// reward is of the state the action starts from (the fingertip's distance to the target before the physics
// steps) less the squared action, and the episode has no end but the 50-step limit.
class Reacher : public MujocoEnv {
 public:
  static constexpr int kObs = 11;
  Reacher(std::shared_ptr<const Model> model, uint64_t seed)
      : MujocoEnv(std::move(model), 2, seed),
        fingertip_(shared_model().BodyId("fingertip")),
        target_(shared_model().BodyId("target")) {}

  void reset(float* obs) override {
    // qpos0 + U(-0.1, 0.1) and qvel U(-0.005, 0.005); then the target at a uniform point of the disc of radius 0.2
    // (drawn in the square, kept inside the disc), at rest.
    ResetWithNoise(0.1, 0.005, VelocityNoise::kUniform);
    std::uniform_real_distribution<double> u(-0.2, 0.2);
    double gx = 0, gy = 0;
    do {
      gx = u(rng());
      gy = u(rng());
    } while (std::hypot(gx, gy) >= 0.2);
    mjData* d = mutable_data();
    d->qpos[2] = gx;
    d->qpos[3] = gy;
    d->qvel[2] = d->qvel[3] = 0;
    mj_forward(model(), d);
    WriteObs(obs);
  }

  StepResult step(const ActionRef& action, float* obs) override {
    const double distance = FingertipToTarget().norm();
    Simulate(action.continuous);
    double ctrl = 0;
    for (double a : clipped_action()) ctrl += a * a;
    WriteObs(obs);
    StepResult r;
    r.reward = static_cast<float>(-distance - ctrl);
    return r;
  }

 private:
  struct Vec3 {
    double x, y, z;
    double norm() const { return std::sqrt(x * x + y * y + z * z); }
  };
  // Body frames' positions, as Gymnasium's get_body_com reads them (xpos, not the centre of mass).
  Vec3 FingertipToTarget() const {
    const mjData* d = data();
    const double* f = d->xpos + 3 * fingertip_;
    const double* t = d->xpos + 3 * target_;
    return {f[0] - t[0], f[1] - t[1], f[2] - t[2]};
  }
  void WriteObs(float* obs) const {
    const mjData* d = data();
    for (int i = 0; i < 2; ++i) obs[i] = static_cast<float>(std::cos(d->qpos[i]));  // the joints' angles
    for (int i = 0; i < 2; ++i) obs[2 + i] = static_cast<float>(std::sin(d->qpos[i]));
    for (int i = 0; i < 2; ++i) obs[4 + i] = static_cast<float>(d->qpos[2 + i]);  // the target's position
    for (int i = 0; i < 2; ++i) obs[6 + i] = static_cast<float>(d->qvel[i]);      // the joints' velocities
    const Vec3 v = FingertipToTarget();
    obs[8] = static_cast<float>(v.x);
    obs[9] = static_cast<float>(v.y);
    obs[10] = static_cast<float>(v.z);
  }

  int fingertip_, target_;
};

EnvSpec ReacherSpec(const EnvOptions& /*o*/) {
  const mjModel* m = BuiltinModel("reacher.xml")->get();
  constexpr float kMax = std::numeric_limits<float>::max();
  EnvSpec spec;
  spec.name = "Reacher-v4";
  spec.observation =
      Space::Box({Reacher::kObs}, std::vector<float>(Reacher::kObs, -kMax), std::vector<float>(Reacher::kObs, kMax));
  spec.action = MujocoEnv::ActionSpace(m);
  spec.max_episode_steps = 50;
  spec.reward_threshold = -3.75;
  return spec;
}
std::unique_ptr<Env> MakeReacher(const EnvOptions& /*o*/, uint64_t seed) {
  return std::make_unique<Reacher>(BuiltinModel("reacher.xml"), seed);
}

// A family for a locomotion task over a built-in model: the task built from the resolved options.
using TaskBuilder = LocomotionTask (*)(const EnvOptions&);
bool RegisterLocomotion(const std::string& name, const std::string& model_file, EnvOptions defaults,
                        TaskBuilder build) {
  EnvFamily family;
  family.default_options = std::move(defaults);
  family.spec = [model_file, build](const EnvOptions& o) {
    auto model = BuiltinModel(model_file);
    const LocomotionTask task = build(o);
    ValidateTask(task, *model);
    return LocomotionSpec(task, model->get());
  };
  family.make = [model_file, build](const EnvOptions& o, uint64_t seed) -> std::unique_ptr<Env> {
    return std::make_unique<LocomotionEnv>(build(o), BuiltinModel(model_file), seed);
  };
  return EnvRegistry::Global().Add(name, std::move(family));
}

const bool registered = RegisterLocomotion("HalfCheetah-v4", "half_cheetah.xml", HalfCheetahDefaults(), HalfCheetahTask) &&
                        RegisterLocomotion("Hopper-v4", "hopper.xml", HopperDefaults(), HopperTask) &&
                        RegisterLocomotion("Walker2d-v4", "walker2d.xml", Walker2dDefaults(), Walker2dTask) &&
                        RegisterLocomotion("Ant-v4", "ant.xml", AntDefaults(), AntTask) &&
                        RegisterLocomotion("Humanoid-v4", "humanoid.xml", HumanoidDefaults(), HumanoidTask) &&
                        RegisterLocomotion("Swimmer-v4", "swimmer.xml", SwimmerDefaults(), SwimmerTask) &&
                        RegisterLocomotion("InvertedPendulum-v4", "inverted_pendulum.xml", EnvOptions{},
                                           InvertedPendulumTask);

}  // namespace

FARM_REGISTER_ENV("InvertedDoublePendulum-v4", EnvOptions{}, InvertedDoublePendulumSpec, MakeInvertedDoublePendulum);
FARM_REGISTER_ENV("Reacher-v4", EnvOptions{}, ReacherSpec, MakeReacher);

}  // namespace farm::mujoco
