// A robot of the user's own described in the config (env.mujoco): a description of Ant-v4 in config keys gives
// Ant-v4's episodes exactly; the example quadruped's observation layout (qpos, qvel, named sensors), reward and
// termination by its torso's height on hand-set states; joint bounds; actions scaled onto the control ranges;
// the model found beside the config file; and refusals by name (a bad model path, a body, joint or sensor the
// model lacks, a free joint bounded, a built-in env's name, two descriptions under one name, bad keys).
#include <catch2/catch.hpp>

#include <mujoco/mujoco.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/config_files.h"
#include "env_test_util.h"
#include "temp_dir.h"
#include "worker/env_group.h"
#include "worker/envs/mujoco/config_task.h"
#include "worker/envs/mujoco/locomotion.h"
#include "worker/envs/mujoco/model.h"

namespace farm {
namespace {

namespace fs = std::filesystem;

const std::string kQuadruped = std::string(FARM_SOURCE_DIR) + "/examples/mujoco/quadruped.xml";

// A fresh folder under the system's temp dir (tests/temp_dir.h), removed at the end of the test, as a path.
struct TempDir {
  testing::TempDir dir;
  fs::path path;
  explicit TempDir(const std::string& name) : dir("farm_mujoco_robot_" + name), path(dir.path) {}
};

// Ant-v4 as env.mujoco keys, over a copy of the built-in ant.xml.
EnvConfig AntDescribed(const fs::path& dir, const std::string& name) {
  const fs::path xml = dir / "ant.xml";
  std::ofstream(xml) << mujoco::BuiltinModelText("ant.xml");
  EnvConfig env;
  env.name = name;
  MujocoConfig& m = env.mujoco;
  m.model = xml.string();
  m.frame_skip = 5;
  m.max_episode_steps = 1000;
  m.observation = {"qpos", "qvel"};
  m.qpos_skip = 2;
  m.forward = "body";
  m.forward_body = "torso";
  m.forward_weight = 1;
  m.healthy_reward = 1;
  m.ctrl_cost_weight = 0.5;
  m.terminate_when_unhealthy = true;
  MujocoHealthBound torso;
  torso.body = "torso";
  torso.min = 0.2;
  torso.max = 1.0;
  m.healthy = {torso};
  m.reset_noise_scale = 0.1;
  m.reset_qvel_noise = "normal";
  m.reward_threshold = 6000;
  return env;
}

std::unique_ptr<EnvGroup> Group(const EnvConfig& env, int n, uint64_t seed) {
  std::unique_ptr<EnvGroup> group;
  const Status s = EnvGroup::Create(env, n, seed, &group);
  INFO(s.ToString());
  REQUIRE(s.ok());
  return group;
}

Status CreateStatus(const EnvConfig& env) {
  std::unique_ptr<EnvGroup> group;
  return EnvGroup::Create(env, 1, 1, &group);
}

EnvConfig Quadruped(const std::string& name) {
  EnvConfig env;
  env.name = name;
  MujocoConfig& m = env.mujoco;
  m.model = kQuadruped;
  m.observation = {"qpos", "qvel", "sensors"};
  m.sensors = {"gyro", "up", "fl_touch"};
  m.forward_weight = 0;
  m.healthy_reward = 1;
  m.ctrl_cost_weight = 0.05;
  MujocoHealthBound torso;
  torso.body = "torso";
  torso.min = 0.3;
  torso.max = 1.0;
  m.healthy = {torso};
  return env;
}

TEST_CASE("env.mujoco: Ant-v4 described in config keys gives Ant-v4's episodes exactly", "[mujoco]") {
  TempDir dir("ant");
  const EnvConfig described = AntDescribed(dir.path, "AntDescribed-v0");
  auto a = Group(described, 3, 11);
  auto b = testing::MakeGroup("Ant-v4", {}, 3, 11);
  const EnvSpec& sa = a->spec();
  const EnvSpec& sb = b->spec();
  CHECK(sa.name == "AntDescribed-v0");
  CHECK(sa.observation == sb.observation);
  CHECK(sa.action == sb.action);
  CHECK(sa.max_episode_steps == sb.max_episode_steps);
  CHECK(sa.reward_threshold == sb.reward_threshold);

  a->Reset();
  b->Reset();
  const int64_t n = 3 * sa.observation.numel();
  REQUIRE(testing::Floats(a->obs(), n) == testing::Floats(b->obs(), n));
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> actions(3 * 8);
  int finished = 0;
  for (int t = 0; t < 400; ++t) {
    for (float& x : actions) x = 1.5f * u(rng);  // past the control range too: both clip
    a->Step(nullptr, actions.data());
    b->Step(nullptr, actions.data());
    INFO("step " << t);
    REQUIRE(testing::Floats(a->obs(), n) == testing::Floats(b->obs(), n));
    REQUIRE(testing::Floats(a->reward(), 3) == testing::Floats(b->reward(), 3));
    REQUIRE(a->finished().size() == b->finished().size());
    finished += static_cast<int>(a->finished().size());
  }
  CHECK(finished > 0);  // random ants flip over: the termination was compared too
}

TEST_CASE("env.mujoco: the quadruped's observation is qpos without x and y, qvel and the named sensors",
          "[mujoco]") {
  const EnvConfig env = Quadruped("QuadrupedLayout-v0");
  std::shared_ptr<const mujoco::Model> model;
  REQUIRE(mujoco::Model::FromFile(kQuadruped, &model).ok());
  const mjModel* m = model->get();
  REQUIRE(m->nq == 15);
  REQUIRE(m->nv == 14);
  REQUIRE(m->nu == 8);
  mujoco::LocomotionTask task = mujoco::TaskFromConfig(env.mujoco, env.name, *model);
  mujoco::LocomotionEnv robot(task, model, 3);
  // gyro 3, up 3, fl_touch 1.
  REQUIRE(mujoco::ObservationSize(task, m) == 13 + 14 + 7);
  std::vector<double> qpos(m->qpos0, m->qpos0 + m->nq), qvel(m->nv, 0.0);
  qpos[0] = 3.0;   // x and y are left out
  qpos[1] = -2.0;
  qpos[7] = 0.3;   // fl_hip
  qvel[5] = 1.25;  // yaw rate
  robot.SetState(qpos, qvel);
  std::vector<float> obs(34);
  robot.WriteObs(obs.data());
  for (int i = 0; i < 13; ++i) CHECK(obs[i] == static_cast<float>(qpos[2 + i]));
  for (int i = 0; i < 14; ++i) CHECK(obs[13 + i] == static_cast<float>(qvel[i]));
  const mjData* d = robot.data();
  const int gyro = mj_name2id(m, mjOBJ_SENSOR, "gyro");
  const int up = mj_name2id(m, mjOBJ_SENSOR, "up");
  const int touch = mj_name2id(m, mjOBJ_SENSOR, "fl_touch");
  for (int i = 0; i < 3; ++i) CHECK(obs[27 + i] == static_cast<float>(d->sensordata[m->sensor_adr[gyro] + i]));
  for (int i = 0; i < 3; ++i) CHECK(obs[30 + i] == static_cast<float>(d->sensordata[m->sensor_adr[up] + i]));
  CHECK(obs[33] == static_cast<float>(d->sensordata[m->sensor_adr[touch]]));
  CHECK(obs[29] == Approx(1.25));            // the gyro reads the yaw rate
  CHECK(obs[32] == Approx(1.0).margin(1e-9));  // upright: the torso's z axis is the world's
}

TEST_CASE("env.mujoco: reward is the alive bonus less the control cost, the end a torso below its bound",
          "[mujoco]") {
  const EnvConfig env = Quadruped("QuadrupedReward-v0");
  std::shared_ptr<const mujoco::Model> model;
  REQUIRE(mujoco::Model::FromFile(kQuadruped, &model).ok());
  mujoco::LocomotionEnv robot(mujoco::TaskFromConfig(env.mujoco, env.name, *model), model, 3);
  std::vector<float> obs(34);
  robot.reset(obs.data());
  std::vector<float> action = {0.5f, -0.5f, 0, 0, 0, 0, 0, 2.0f};  // the last one clipped to 1
  StepResult r = robot.step(ActionRef{nullptr, action.data()}, obs.data());
  CHECK_FALSE(r.terminated);
  CHECK(r.reward == Approx(1.0 - 0.05 * (0.25 + 0.25 + 1.0)).epsilon(1e-6));
  CHECK(robot.last_terms().forward == 0);

  // The torso (on a free joint: its z is qpos[2]) just above, at and below 0.3 m.
  const mjModel* m = robot.model();
  std::vector<double> qpos(m->qpos0, m->qpos0 + m->nq), qvel(m->nv, 0.0);
  qpos[2] = 0.3;
  robot.SetState(qpos, qvel);
  CHECK(robot.IsHealthy());  // bounds include their ends
  qpos[2] = 0.2999;
  robot.SetState(qpos, qvel);
  CHECK_FALSE(robot.IsHealthy());
  qpos[2] = 1.0001;
  robot.SetState(qpos, qvel);
  CHECK_FALSE(robot.IsHealthy());

  // A torso held above its bound, at rest, is still there after one step: the episode ends on it.
  qpos[2] = 1.2;
  robot.SetState(qpos, qvel);
  std::vector<float> zero(8, 0.0f);
  r = robot.step(ActionRef{nullptr, zero.data()}, obs.data());
  CHECK(r.terminated);
  CHECK(r.reward == Approx(1.0));  // with terminate_when_unhealthy the bonus is paid on the last step too
}

TEST_CASE("env.mujoco: a hinge joint's range as a health bound, and a non-root body's height", "[mujoco]") {
  EnvConfig env = Quadruped("QuadrupedJoint-v0");
  MujocoHealthBound hip, shin;
  hip.joint = "fl_hip";
  hip.min = -0.5;
  hip.max = 0.5;
  shin.body = "hr_shin";  // its frame's height, at the knee: 0.52 - 0.04 - 0.22 = 0.26 standing
  shin.min = 0.2;
  env.mujoco.healthy = {hip, shin};
  std::shared_ptr<const mujoco::Model> model;
  REQUIRE(mujoco::Model::FromFile(kQuadruped, &model).ok());
  mujoco::LocomotionEnv robot(mujoco::TaskFromConfig(env.mujoco, env.name, *model), model, 3);
  const mjModel* m = robot.model();
  std::vector<double> qpos(m->qpos0, m->qpos0 + m->nq), qvel(m->nv, 0.0);
  const int fl_hip = m->jnt_qposadr[mj_name2id(m, mjOBJ_JOINT, "fl_hip")];
  qpos[fl_hip] = 0.45;
  robot.SetState(qpos, qvel);
  CHECK(robot.IsHealthy());
  qpos[fl_hip] = 0.55;
  robot.SetState(qpos, qvel);
  CHECK_FALSE(robot.IsHealthy());
  qpos[fl_hip] = 0;
  qpos[2] = 0.45;  // the whole robot 7 cm lower: the knee at 0.19
  robot.SetState(qpos, qvel);
  CHECK_FALSE(robot.IsHealthy());
}

TEST_CASE("env.mujoco: action scale maps [-1, 1] onto each actuator's ctrlrange", "[mujoco]") {
  TempDir dir("scale");
  const fs::path xml = dir.path / "arm.xml";
  std::ofstream(xml) << R"(<mujoco><worldbody><body name="arm"><joint name="j" type="hinge" axis="0 1 0"/>
    <geom type="capsule" fromto="0 0 0 0.5 0 0" size="0.05"/></body></worldbody>
    <actuator><motor joint="j" ctrllimited="true" ctrlrange="0 2"/><motor joint="j" ctrllimited="true"
    ctrlrange="-3 1"/></actuator></mujoco>)";
  EnvConfig env;
  env.name = "ArmScaled-v0";
  env.mujoco.model = xml.string();
  env.mujoco.qpos_skip = 0;
  env.mujoco.forward = "root_x";
  env.mujoco.forward_weight = 0;
  env.mujoco.ctrl_cost_weight = 1;
  env.mujoco.action = "scale";
  std::shared_ptr<const mujoco::Model> model;
  REQUIRE(mujoco::Model::FromFile(xml.string(), &model).ok());
  mujoco::LocomotionTask task = mujoco::TaskFromConfig(env.mujoco, env.name, *model);
  const EnvSpec spec = mujoco::LocomotionSpec(task, model->get());
  CHECK(spec.action.low == std::vector<float>{-1, -1});
  CHECK(spec.action.high == std::vector<float>{1, 1});
  mujoco::LocomotionEnv arm(task, model, 1);
  std::vector<float> obs(2);
  arm.reset(obs.data());
  std::vector<float> action = {0.5f, -3.0f};  // 0.5 -> 1.5 of [0, 2]; -3 clipped to -1 -> -3 of [-3, 1]
  const StepResult r = arm.step(ActionRef{nullptr, action.data()}, obs.data());
  CHECK(arm.data()->ctrl[0] == Approx(1.5));
  CHECK(arm.data()->ctrl[1] == Approx(-3.0));
  CHECK(r.reward == Approx(1.0 - (0.25 + 1.0)));  // alive 1, control cost over the clipped action

  env.mujoco.action = "clip";
  const EnvSpec clipped = mujoco::LocomotionSpec(mujoco::TaskFromConfig(env.mujoco, env.name, *model), model->get());
  CHECK(clipped.action.low == std::vector<float>{0, -3});
  CHECK(clipped.action.high == std::vector<float>{2, 1});
}

TEST_CASE("env.mujoco: two workers of one seed step alike, the model shared read-only", "[mujoco]") {
  const EnvConfig env = Quadruped("QuadrupedSeeded-v0");
  auto a = Group(env, 2, 9);
  auto b = Group(env, 2, 9);
  auto c = Group(env, 2, 10);
  a->Reset();
  b->Reset();
  c->Reset();
  const int64_t n = 2 * 34;
  CHECK(testing::Floats(a->obs(), n) == testing::Floats(b->obs(), n));
  CHECK(testing::Floats(a->obs(), n) != testing::Floats(c->obs(), n));
  std::vector<float> actions(16);
  for (int t = 0; t < 100; ++t) {
    for (std::size_t i = 0; i < actions.size(); ++i) actions[i] = static_cast<float>(std::sin(0.3 * t + i));
    a->Step(nullptr, actions.data());
    b->Step(nullptr, actions.data());
  }
  CHECK(testing::Floats(a->obs(), n) == testing::Floats(b->obs(), n));
  CHECK(testing::Floats(a->reward(), 2) == testing::Floats(b->reward(), 2));
}

TEST_CASE("env.mujoco refusals name the key and what the model has", "[mujoco]") {
  SECTION("a model file that is not there") {
    EnvConfig env = Quadruped("RefusedPath-v0");
    env.mujoco.model = "/nonexistent/robot.xml";
    const Status s = CreateStatus(env);
    CHECK(s.code() == Status::Code::kInvalidArgument);
    CHECK_THAT(s.message(), Catch::Contains("env.mujoco.model") && Catch::Contains("/nonexistent/robot.xml"));
  }
  SECTION("a body the model lacks") {
    EnvConfig env = Quadruped("RefusedBody-v0");
    env.mujoco.healthy[0].body = "head";
    const Status s = CreateStatus(env);
    CHECK_THAT(s.message(), Catch::Contains("no body 'head'") && Catch::Contains("torso, fl_thigh"));
    env.mujoco.healthy[0].body = "torso";
    env.mujoco.forward_body = "nose";
    env.mujoco.forward_weight = 1;
    CHECK_THAT(CreateStatus(env).message(), Catch::Contains("no body 'nose'"));
  }
  SECTION("a sensor the model lacks") {
    EnvConfig env = Quadruped("RefusedSensor-v0");
    env.mujoco.sensors = {"gyro", "lidar"};
    CHECK_THAT(CreateStatus(env).message(), Catch::Contains("no sensor 'lidar'") && Catch::Contains("accelerometer"));
  }
  SECTION("a joint the model lacks, and the free joint") {
    EnvConfig env = Quadruped("RefusedJoint-v0");
    MujocoHealthBound b;
    b.joint = "elbow";
    b.max = 1;
    env.mujoco.healthy = {b};
    CHECK_THAT(CreateStatus(env).message(), Catch::Contains("healthy[0]") && Catch::Contains("no joint 'elbow'") &&
                                                Catch::Contains("fl_hip"));
    env.mujoco.healthy[0].joint = "root";
    CHECK_THAT(CreateStatus(env).message(), Catch::Contains("'root' is a free joint"));
  }
  SECTION("a qpos_skip past qpos") {
    EnvConfig env = Quadruped("RefusedSkip-v0");
    env.mujoco.qpos_skip = 15;
    CHECK_THAT(CreateStatus(env).message(), Catch::Contains("leaves out 15 of qpos's 15"));
  }
  SECTION("a built-in env's name, and a second description under one name") {
    EnvConfig env = Quadruped("Ant-v4");
    CHECK_THAT(CreateStatus(env).message(), Catch::Contains("'Ant-v4' is a registered env"));
    env.name = "QuadrupedTwice-v0";
    REQUIRE(CreateStatus(env).ok());
    REQUIRE(CreateStatus(env).ok());  // the same description again
    env.mujoco.ctrl_cost_weight = 0.1;
    CHECK_THAT(CreateStatus(env).message(), Catch::Contains("described twice"));
  }
  SECTION("a wrong-size action is the model's, not the config's: the spec has one per actuator") {
    auto group = Group(Quadruped("QuadrupedActions-v0"), 1, 1);
    CHECK(group->spec().action.shape == std::vector<int64_t>{8});
  }
}

TEST_CASE("env.mujoco keys: checked when the config is read, by name", "[mujoco]") {
  const auto parse = [](const std::string& yaml) {
    FarmConfig c;
    if (Status s = ParseConfig(yaml, "test.yaml", &c); !s.ok()) return s;
    return ValidateConfig(c);
  };
  const std::string head = "env:\n  name: Robot-v0\n  mujoco:\n    model: robot.xml\n";
  CHECK(parse(head + "    forward_body: torso\n").ok());
  CHECK_THAT(parse(head + "    forward_body: torso\n    observation: [qpos, lidar]\n").message(),
             Catch::Contains("env.mujoco.observation[1]") && Catch::Contains("qfrc_actuator"));
  CHECK_THAT(parse(head + "    forward_body: torso\n    gear: 2\n").message(),
             Catch::Contains("env.mujoco.gear: unknown key"));
  CHECK_THAT(parse(head).message(), Catch::Contains("env.mujoco.forward_body is empty"));
  CHECK_THAT(parse(head + "    forward_weight: 0\n    healthy: [{body: torso, joint: rootz, min: 0}]\n").message(),
             Catch::Contains("env.mujoco.healthy[0]") && Catch::Contains("got both"));
  CHECK_THAT(parse(head + "    forward_weight: 0\n    healthy: [{body: torso}]\n").message(),
             Catch::Contains("expected min, max or both"));
  CHECK_THAT(parse(head + "    forward_weight: 0\n    sensors: [gyro]\n").message(),
             Catch::Contains("no 'sensors' part"));
  CHECK_THAT(parse(head + "    forward_weight: 0\n  options: {a: 1}\n").message(),
             Catch::Contains("takes no options"));
  CHECK_THAT(parse(head + "    forward_weight: 0\n    action: tanh\n").message(),
             Catch::Contains("env.mujoco.action") && Catch::Contains("clip, scale"));
}

TEST_CASE("env.mujoco.model: found beside the config file, recorded as an absolute path", "[mujoco]") {
  TempDir dir("files");
  fs::create_directories(dir.path / "project");
  fs::copy_file(kQuadruped, dir.path / "project" / "robot.xml");
  std::ofstream(dir.path / "project" / "robot.yaml")
      << "env:\n  name: RobotFound-v0\n  mujoco:\n    model: robot.xml\n    forward_weight: 0\n";
  FarmConfig c;
  REQUIRE(LoadConfig((dir.path / "project" / "robot.yaml").string(), {}, &c).ok());
  REQUIRE(c.env.mujoco.model == "robot.xml");
  REQUIRE(ResolveEnvFiles(&c).ok());
  CHECK(c.env.mujoco.model == fs::canonical(dir.path / "project" / "robot.xml").string());

  FarmConfig missing;
  std::ofstream(dir.path / "project" / "other.yaml")
      << "env:\n  name: RobotMissing-v0\n  mujoco:\n    model: missing.xml\n    forward_weight: 0\n";
  REQUIRE(LoadConfig((dir.path / "project" / "other.yaml").string(), {}, &missing).ok());
  const Status s = ResolveEnvFiles(&missing);
  CHECK(s.code() == Status::Code::kNotFound);
  CHECK_THAT(s.message(), Catch::Contains("env.mujoco.model") && Catch::Contains("missing.xml"));
}

}  // namespace
}  // namespace farm
