// The MuJoCo env family: Gymnasium v4's spaces, observation layouts, reward terms and health bounds on hand-set
// states, seeded determinism, the built-in models' published constants, and refusals (a bad model path or
// file, an unknown body, a bound past the model's qpos, an unknown option).
//
// Expected rewards come from a reference written out here: a second mjData of the same model, put in the same
// state, stepped frame_skip times with the clipped action, and Gymnasium's formula for the task applied to it.
#include <catch2/catch.hpp>

#include <mujoco/mujoco.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "env_test_util.h"
#include "worker/env.h"
#include "worker/env_group.h"
#include "worker/envs/mujoco/locomotion.h"
#include "worker/envs/mujoco/model.h"
#include "worker/envs/mujoco/mujoco_env.h"

namespace farm {
namespace {

using mujoco::LocomotionEnv;
using mujoco::MujocoEnv;

std::unique_ptr<Env> Make(const std::string& name, const EnvOptions& user = {}, uint64_t seed = 1) {
  const EnvFamily* family = EnvRegistry::Global().Find(name);
  REQUIRE(family != nullptr);
  EnvOptions resolved;
  const Status s = ResolveEnvOptions(name, family->default_options, user, &resolved);
  INFO(s.ToString());
  REQUIRE(s.ok());
  return family->make(resolved, seed);
}

EnvSpec SpecOf(const std::string& name, const EnvOptions& user = {}) {
  const EnvFamily* family = EnvRegistry::Global().Find(name);
  REQUIRE(family != nullptr);
  EnvOptions resolved;
  REQUIRE(ResolveEnvOptions(name, family->default_options, user, &resolved).ok());
  return family->spec(resolved);
}

LocomotionEnv& Locomotion(const std::unique_ptr<Env>& env) {
  auto* l = dynamic_cast<LocomotionEnv*>(env.get());
  REQUIRE(l != nullptr);
  return *l;
}

// The reference: a fresh mjData of the env's model in the env's current state, stepped as Gymnasium does.
struct Reference {
  const mjModel* m;
  mjData* d;
  Reference(const MujocoEnv& env) : m(env.model()), d(mj_makeData(env.model())) {
    std::copy(env.data()->qpos, env.data()->qpos + m->nq, d->qpos);
    std::copy(env.data()->qvel, env.data()->qvel + m->nv, d->qvel);
    mj_forward(m, d);
  }
  ~Reference() { mj_deleteData(d); }
  // Returns the clipped action's sum of squares.
  double Step(const std::vector<float>& action, int frame_skip) {
    double squared = 0;
    for (int i = 0; i < m->nu; ++i) {
      const double a = std::clamp<double>(action[i], m->actuator_ctrlrange[2 * i], m->actuator_ctrlrange[2 * i + 1]);
      d->ctrl[i] = a;
      squared += a * a;
    }
    for (int k = 0; k < frame_skip; ++k) mj_step(m, d);
    mj_rnePostConstraint(m, d);
    return squared;
  }
};

std::vector<double> Qpos0(const MujocoEnv& env) {
  return std::vector<double>(env.model()->qpos0, env.model()->qpos0 + env.model()->nq);
}

TEST_CASE("MuJoCo tasks: Gymnasium v4's observation and action sizes, time limits and thresholds", "[mujoco]") {
  struct Want {
    const char* name;
    int obs;
    int obs_with_positions;  // exclude_current_positions_from_observation=0 (0: no such option)
    int act;
    double threshold;  // 0: none
  };
  const Want wants[] = {
      {"HalfCheetah-v4", 17, 18, 6, 4800}, {"Hopper-v4", 11, 12, 3, 3800},     {"Walker2d-v4", 17, 18, 6, 0},
      {"Ant-v4", 27, 29, 8, 6000},         {"Humanoid-v4", 376, 378, 17, 0},   {"Swimmer-v4", 8, 10, 2, 360},
      {"InvertedPendulum-v4", 4, 0, 1, 950}, {"InvertedDoublePendulum-v4", 11, 0, 1, 9100},
  };
  for (const Want& w : wants) {
    INFO(w.name);
    const EnvSpec spec = SpecOf(w.name);
    CHECK(spec.observation.numel() == w.obs);
    CHECK(spec.action.kind == Space::Kind::kBox);
    CHECK(spec.action.numel() == w.act);
    CHECK(spec.max_episode_steps == 1000);
    CHECK(spec.reward_threshold.value_or(0) == w.threshold);
    if (w.obs_with_positions > 0)
      CHECK(SpecOf(w.name, {{"exclude_current_positions_from_observation", 0}}).observation.numel() ==
            w.obs_with_positions);
    // Every env it makes writes exactly the spec's observation (a canary past the end stays put).
    auto env = Make(w.name);
    std::vector<float> obs(w.obs + 1, 12345.0f);
    env->reset(obs.data());
    CHECK(obs.back() == 12345.0f);
    std::vector<float> action(w.act, 0.1f);
    env->step(ActionRef{nullptr, action.data()}, obs.data());
    CHECK(obs.back() == 12345.0f);
    for (int i = 0; i < w.obs; ++i) CHECK(std::isfinite(obs[i]));
  }
  // Ant with contact forces: 84 more (14 bodies x 6).
  CHECK(SpecOf("Ant-v4", {{"use_contact_forces", 1}}).observation.numel() == 111);
}

TEST_CASE("MuJoCo models: the published constants of Gymnasium's assets", "[mujoco]") {
  auto cheetah = mujoco::BuiltinModel("half_cheetah.xml")->get();
  CHECK(cheetah->opt.timestep == 0.01);
  const double gears[] = {120, 90, 60, 120, 60, 30};
  for (int i = 0; i < 6; ++i) CHECK(cheetah->actuator_gear[6 * i] == gears[i]);
  double mass = 0;
  for (int b = 0; b < cheetah->nbody; ++b) mass += cheetah->body_mass[b];
  CHECK(mass == Approx(14.0).epsilon(1e-9));  // settotalmass="14"
  CHECK(mujoco::BuiltinModel("hopper.xml")->get()->opt.timestep == 0.002);
  CHECK(mujoco::BuiltinModel("walker2d.xml")->get()->opt.timestep == 0.002);
  CHECK(mujoco::BuiltinModel("ant.xml")->get()->opt.timestep == 0.01);
  CHECK(mujoco::BuiltinModel("humanoid.xml")->get()->opt.timestep == 0.003);
  CHECK(mujoco::BuiltinModel("swimmer.xml")->get()->opt.timestep == 0.01);
  const auto* humanoid = mujoco::BuiltinModel("humanoid.xml")->get();
  CHECK(humanoid->nq == 24);
  CHECK(humanoid->nv == 23);
  CHECK(humanoid->nbody == 14);
  // Every built-in model compiles, and a second request shares the first's compiled model.
  for (const std::string& file : mujoco::BuiltinModelNames()) {
    INFO(file);
    CHECK(mujoco::BuiltinModel(file) == mujoco::BuiltinModel(file));
  }
}

TEST_CASE("HalfCheetah: observation is qpos without x, then qvel: reward is forward velocity minus 0.1 |a|^2",
          "[mujoco]") {
  auto env = Make("HalfCheetah-v4");
  auto& cheetah = Locomotion(env);
  const mjModel* m = cheetah.model();
  std::vector<double> qpos = Qpos0(cheetah), qvel(m->nv, 0.0);
  for (int i = 0; i < m->nq; ++i) qpos[i] += 0.01 * (i + 1);
  for (int i = 0; i < m->nv; ++i) qvel[i] = 0.1 * (i - 3);
  qvel[0] = 2.0;  // moving forward
  cheetah.SetState(qpos, qvel);
  std::vector<float> obs(17);
  cheetah.WriteObs(obs.data());
  for (int i = 1; i < m->nq; ++i) CHECK(obs[i - 1] == static_cast<float>(qpos[i]));
  for (int i = 0; i < m->nv; ++i) CHECK(obs[m->nq - 1 + i] == static_cast<float>(qvel[i]));

  // 1.5 is past the control range: clipped to 1 for the physics and the cost (as CleanRL's ClipAction).
  const std::vector<float> action = {0.5f, -0.25f, 1.5f, 0.0f, -1.0f, 0.75f};
  Reference ref(cheetah);
  const double x_before = ref.d->qpos[0];
  const double squared = ref.Step(action, 5);
  CHECK(squared == Approx(0.25 + 0.0625 + 1 + 0 + 1 + 0.5625));
  const double want = (ref.d->qpos[0] - x_before) / (5 * 0.01) - 0.1 * squared;
  const StepResult r = cheetah.step(ActionRef{nullptr, action.data()}, obs.data());
  CHECK(r.reward == Approx(want).epsilon(1e-6));
  CHECK(cheetah.last_terms().forward_velocity > 1.0);  // it was moving forward at 2
  CHECK_FALSE(r.terminated);
  for (int i = 1; i < m->nq; ++i) CHECK(obs[i - 1] == static_cast<float>(ref.d->qpos[i]));
}

TEST_CASE("Hopper: healthy only with z > 0.7, |angle| < 0.2 and the state within +-100: qvel clipped to 10",
          "[mujoco]") {
  auto env = Make("Hopper-v4");
  auto& hopper = Locomotion(env);
  const mjModel* m = hopper.model();
  const std::vector<double> qpos0 = Qpos0(hopper), zero(m->nv, 0.0);
  auto healthy_with = [&](int index, double value, bool velocity = false) {
    std::vector<double> qpos = qpos0, qvel = zero;
    (velocity ? qvel : qpos)[index] = value;
    hopper.SetState(qpos, qvel);
    return hopper.IsHealthy();
  };
  CHECK(healthy_with(1, 1.25));
  CHECK(healthy_with(1, 0.7001));
  CHECK_FALSE(healthy_with(1, 0.7));  // strict, as Gymnasium's min_z < z
  CHECK(healthy_with(2, 0.1999));
  CHECK_FALSE(healthy_with(2, 0.2));
  CHECK_FALSE(healthy_with(2, -0.2001));
  CHECK(healthy_with(3, 99.0));  // a joint angle (state from qpos[2] on)
  CHECK_FALSE(healthy_with(3, 100.5));
  CHECK_FALSE(healthy_with(4, -101.0, true));  // a velocity
  CHECK(healthy_with(0, 500.0));  // the root's x is not part of the checked state

  // A step from a fallen state terminates and still pays the healthy reward (terminate_when_unhealthy).
  std::vector<double> qpos = qpos0;
  qpos[1] = 0.3;
  std::vector<double> qvel = zero;
  qvel[5] = 25.0;  // clipped to 10 in the observation
  hopper.SetState(qpos, qvel);
  std::vector<float> obs(11);
  hopper.WriteObs(obs.data());
  CHECK(obs[m->nq - 1 + 5] == 10.0f);
  const std::vector<float> action = {0.2f, -0.3f, 0.4f};
  Reference ref(hopper);
  const double x_before = ref.d->qpos[0];
  const double squared = ref.Step(action, 4);
  const StepResult r = hopper.step(ActionRef{nullptr, action.data()}, obs.data());
  CHECK(r.terminated);
  CHECK(r.reward == Approx((ref.d->qpos[0] - x_before) / (4 * 0.002) + 1.0 - 1e-3 * squared).epsilon(1e-6));

  // terminate_when_unhealthy=0: no termination and no healthy reward while unhealthy.
  auto free_env = Make("Hopper-v4", {{"terminate_when_unhealthy", 0}});
  auto& free_hopper = Locomotion(free_env);
  free_hopper.SetState(qpos, zero);
  CHECK_FALSE(free_hopper.step(ActionRef{nullptr, action.data()}, obs.data()).terminated);
  CHECK(free_hopper.last_terms().healthy == 0.0);
}

TEST_CASE("Walker2d, Ant, Humanoid: health bounds, strict or inclusive as in Gymnasium", "[mujoco]") {
  auto check = [](const std::string& name, int index, double value, bool want) {
    auto env = Make(name);
    auto& l = Locomotion(env);
    std::vector<double> qpos = Qpos0(l), qvel(l.model()->nv, 0.0);
    qpos[index] = value;
    l.SetState(qpos, qvel);
    INFO(name << " qpos[" << index << "] = " << value);
    CHECK(l.IsHealthy() == want);
  };
  check("Walker2d-v4", 1, 1.5, true);
  check("Walker2d-v4", 1, 0.8, false);
  check("Walker2d-v4", 1, 2.0, false);
  check("Walker2d-v4", 2, 0.99, true);
  check("Walker2d-v4", 2, -1.0, false);
  check("Ant-v4", 2, 0.2, true);  // min_z <= z <= max_z
  check("Ant-v4", 2, 1.0, true);
  check("Ant-v4", 2, 0.1999, false);
  check("Ant-v4", 2, 1.0001, false);
  check("Ant-v4", 2, std::nan(""), false);
  check("Humanoid-v4", 2, 1.4, true);
  check("Humanoid-v4", 2, 1.0, false);  // min_z < z < max_z
  check("Humanoid-v4", 2, 2.0, false);
  check("InvertedPendulum-v4", 1, 0.2, true);  // terminated only past |angle| > 0.2
  check("InvertedPendulum-v4", 1, -0.2001, false);
}

TEST_CASE("Ant: forward velocity of the torso's centre of mass, control cost 0.5, contact cost only with "
          "use_contact_forces", "[mujoco]") {
  for (int contact : {0, 1}) {
    INFO("use_contact_forces " << contact);
    auto env = Make("Ant-v4", {{"use_contact_forces", static_cast<double>(contact)}});
    auto& ant = Locomotion(env);
    const mjModel* m = ant.model();
    std::vector<double> qpos = Qpos0(ant), qvel(m->nv, 0.0);
    qvel[0] = 1.0;
    ant.SetState(qpos, qvel);
    Reference ref(ant);
    const int torso = mj_name2id(m, mjOBJ_BODY, "torso");
    std::vector<float> obs(contact ? 111 : 27);
    double contact_total = 0;
    // 30 steps from 0.75 m up: the ant falls onto its legs, so the later steps have contacts.
    for (int t = 0; t < 30; ++t) {
      INFO("step " << t);
      std::vector<float> action(8);
      for (int i = 0; i < 8; ++i) action[i] = 0.9f * std::sin(0.7 * t + i);
      const double x_before = ref.d->xipos[3 * torso];
      const double squared = ref.Step(action, 5);
      double contact_sq = 0;
      for (int i = 0; i < 6 * m->nbody; ++i) {
        const double f = std::clamp(ref.d->cfrc_ext[i], -1.0, 1.0);
        contact_sq += f * f;
      }
      contact_total += contact_sq;
      const double want =
          (ref.d->xipos[3 * torso] - x_before) / 0.05 + 1.0 - 0.5 * squared - contact * 5e-4 * contact_sq;
      const StepResult r = ant.step(ActionRef{nullptr, action.data()}, obs.data());
      CHECK(r.reward == Approx(want).epsilon(1e-6));
      if (contact)
        for (int i = 0; i < 84; ++i) CHECK(std::abs(obs[27 + i]) <= 1.0f);
    }
    CHECK(contact_total > 0);  // the feet touched the floor
  }
}

TEST_CASE("Humanoid: the centre of mass's velocity at 1.25, healthy 5, control cost 0.1: its 376 observations",
          "[mujoco]") {
  auto env = Make("Humanoid-v4");
  auto& h = Locomotion(env);
  const mjModel* m = h.model();
  std::vector<double> qpos = Qpos0(h), qvel(m->nv, 0.0);
  qvel[0] = 0.8;
  h.SetState(qpos, qvel);
  std::vector<float> action(17);
  for (int i = 0; i < 17; ++i) action[i] = 0.05f * (i % 5) - 0.1f;
  Reference ref(h);
  auto com_x = [m](const mjData* d) {
    double x = 0, mass = 0;
    for (int b = 0; b < m->nbody; ++b) {
      x += m->body_mass[b] * d->xipos[3 * b];
      mass += m->body_mass[b];
    }
    return x / mass;
  };
  const double before = com_x(ref.d);
  const double squared = ref.Step(action, 5);
  std::vector<float> obs(376);
  const StepResult r = h.step(ActionRef{nullptr, action.data()}, obs.data());
  CHECK(r.reward == Approx(1.25 * (com_x(ref.d) - before) / (5 * 0.003) + 5.0 - 0.1 * squared).epsilon(1e-6));
  // Layout: qpos[2:] (22), qvel (23), cinert (140), cvel (84), qfrc_actuator (23), cfrc_ext (84).
  CHECK(obs[0] == static_cast<float>(ref.d->qpos[2]));
  CHECK(obs[22] == static_cast<float>(ref.d->qvel[0]));
  CHECK(obs[45 + 10] == static_cast<float>(ref.d->cinert[10]));  // body 1's first inertia value
  CHECK(obs[185 + 6] == static_cast<float>(ref.d->cvel[6]));
  CHECK(obs[269 + 6] == static_cast<float>(ref.d->qfrc_actuator[6]));
  CHECK(obs[292 + 6] == static_cast<float>(ref.d->cfrc_ext[6]));
}

TEST_CASE("InvertedDoublePendulum: sines, cosines, clipped velocities and constraint forces: the tip's height "
          "ends it at 1", "[mujoco]") {
  auto env = Make("InvertedDoublePendulum-v4");
  auto& p = dynamic_cast<MujocoEnv&>(*env);
  const mjModel* m = p.model();
  std::vector<float> obs(11);
  const std::vector<float> action = {0.4f};
  struct Case {
    double angle, velocity;
    int terminated;  // -1: not checked
  };
  for (const Case& c : {Case{0.05, 0.0, 0}, Case{1.4, 0.0, 1}, Case{0.05, 30.0, -1}}) {
    INFO("first link's angle " << c.angle << ", second link's velocity " << c.velocity);
    std::vector<double> qpos = Qpos0(p), qvel(m->nv, 0.0);
    qpos[1] = c.angle;
    qpos[2] = -0.1;
    qvel[2] = c.velocity;
    p.SetState(qpos, qvel);
    Reference ref(p);
    ref.Step(action, 5);
    const StepResult r = env->step(ActionRef{nullptr, action.data()}, obs.data());
    const double x = ref.d->site_xpos[0], y = ref.d->site_xpos[2];
    const double v1 = ref.d->qvel[1], v2 = ref.d->qvel[2];
    CHECK(r.reward == Approx(10 - 0.01 * x * x - (y - 2) * (y - 2) - 1e-3 * v1 * v1 - 5e-3 * v2 * v2).epsilon(1e-6));
    CHECK(r.terminated == (y <= 1));
    if (c.terminated >= 0) CHECK(r.terminated == (c.terminated == 1));  // leaning far over, the tip is below 1
    CHECK(obs[0] == static_cast<float>(ref.d->qpos[0]));
    CHECK(obs[1] == static_cast<float>(std::sin(ref.d->qpos[1])));
    CHECK(obs[4] == static_cast<float>(std::cos(ref.d->qpos[2])));
    for (int i = 5; i < 11; ++i) CHECK(std::abs(obs[i]) <= 10.0f);
  }
}

TEST_CASE("Reacher: a target drawn in the disc of radius 0.2, cosines and sines, the fingertip's offset: the "
          "reward is of the state before the step", "[mujoco]") {
  const EnvSpec spec = SpecOf("Reacher-v4");
  CHECK(spec.observation.numel() == 11);
  CHECK(spec.action.numel() == 2);
  CHECK(spec.max_episode_steps == 50);
  CHECK(spec.reward_threshold.value_or(0) == -3.75);

  auto env = Make("Reacher-v4", {}, 5);
  auto& p = dynamic_cast<MujocoEnv&>(*env);
  const mjModel* m = p.model();
  const int fingertip = mj_name2id(m, mjOBJ_BODY, "fingertip"), target = mj_name2id(m, mjOBJ_BODY, "target");
  std::vector<float> obs(11);
  std::vector<double> goals;
  for (int episode = 0; episode < 50; ++episode) {
    env->reset(obs.data());
    const mjData* d = p.data();
    CHECK(std::hypot(d->qpos[2], d->qpos[3]) < 0.2);
    CHECK(d->qvel[2] == 0);
    CHECK(d->qvel[3] == 0);
    for (int i = 0; i < 2; ++i) {
      CHECK(std::abs(d->qpos[i] - m->qpos0[i]) <= 0.1);
      CHECK(std::abs(d->qvel[i]) <= 0.005);
    }
    // The target's qpos is its position on the table.
    CHECK(d->xpos[3 * target] == Approx(d->qpos[2]).margin(1e-12));
    CHECK(d->xpos[3 * target + 1] == Approx(d->qpos[3]).margin(1e-12));
    CHECK(obs[4] == static_cast<float>(d->qpos[2]));
    CHECK(obs[8] == static_cast<float>(d->xpos[3 * fingertip] - d->xpos[3 * target]));
    goals.push_back(d->qpos[2]);
  }
  std::sort(goals.begin(), goals.end());
  CHECK(goals.front() < -0.1);  // spread over the disc, not one point
  CHECK(goals.back() > 0.1);

  // A hand-set state: the reward is -(the fingertip's distance to the target before the step) - |clip(a)|^2.
  std::vector<double> qpos = {0.3, -1.2, 0.15, 0.05}, qvel = {0.5, -0.2, 0, 0};
  p.SetState(qpos, qvel);
  const mjData* d = p.data();
  const double before = std::sqrt(std::pow(d->xpos[3 * fingertip] - d->xpos[3 * target], 2) +
                                   std::pow(d->xpos[3 * fingertip + 1] - d->xpos[3 * target + 1], 2) +
                                   std::pow(d->xpos[3 * fingertip + 2] - d->xpos[3 * target + 2], 2));
  Reference ref(p);
  const std::vector<float> action = {0.5f, 2.0f};  // the second clipped to 1
  const double ctrl = ref.Step(action, 2);
  CHECK(ctrl == Approx(1.25));
  const StepResult r = env->step(ActionRef{nullptr, action.data()}, obs.data());
  CHECK(r.reward == Approx(-before - 1.25).epsilon(1e-6));
  CHECK_FALSE(r.terminated);
  CHECK(obs[0] == static_cast<float>(std::cos(ref.d->qpos[0])));
  CHECK(obs[3] == static_cast<float>(std::sin(ref.d->qpos[1])));
  CHECK(obs[5] == static_cast<float>(0.05));
  CHECK(obs[6] == static_cast<float>(ref.d->qvel[0]));
  CHECK(obs[9] == static_cast<float>(ref.d->xpos[3 * fingertip + 1] - ref.d->xpos[3 * target + 1]));
}

TEST_CASE("MuJoCo envs: the same seed gives the same episodes, in any group, another seed others", "[mujoco]") {
  for (const char* name : {"HalfCheetah-v4", "Hopper-v4", "Ant-v4"}) {
    INFO(name);
    const EnvSpec spec = SpecOf(name);
    auto a = testing::MakeGroup(name, {}, 3, 42);
    auto b = testing::MakeGroup(name, {}, 3, 42);
    auto c = testing::MakeGroup(name, {}, 3, 43);
    a->Reset();
    b->Reset();
    c->Reset();
    const int64_t n = 3 * spec.observation.numel();
    CHECK(testing::Floats(a->obs(), n) == testing::Floats(b->obs(), n));
    CHECK(testing::Floats(a->obs(), n) != testing::Floats(c->obs(), n));
    std::vector<float> actions(3 * spec.action.numel());
    for (int t = 0; t < 50; ++t) {
      for (std::size_t i = 0; i < actions.size(); ++i) actions[i] = std::sin(0.1 * t + i);
      a->Step(nullptr, actions.data());
      b->Step(nullptr, actions.data());
    }
    CHECK(testing::Floats(a->obs(), n) == testing::Floats(b->obs(), n));
    CHECK(testing::Floats(a->reward(), 3) == testing::Floats(b->reward(), 3));
  }
}

TEST_CASE("MuJoCo: a reset draws its noise around the initial state at the task's scale", "[mujoco]") {
  auto env = Make("Walker2d-v4", {}, 7);
  auto& w = Locomotion(env);
  std::vector<float> obs(17);
  double max_dev = 0;
  for (int k = 0; k < 20; ++k) {
    env->reset(obs.data());
    for (int i = 0; i < w.model()->nq; ++i) max_dev = std::max(max_dev, std::abs(w.data()->qpos[i] - w.model()->qpos0[i]));
  }
  CHECK(max_dev <= 5e-3);
  CHECK(max_dev > 2.5e-3);  // 340 draws of U(-5e-3, 5e-3): the largest is near the bound
}

TEST_CASE("MuJoCo refusals: a missing or broken model file, an unknown body, a bound past qpos, an unknown option",
          "[mujoco]") {
  std::shared_ptr<const mujoco::Model> model;
  Status s = mujoco::Model::FromFile("/nonexistent/robot.xml", &model);
  CHECK(s.code() == Status::Code::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("/nonexistent/robot.xml"));

  const std::string broken = "/tmp/farm_mujoco_broken_model.xml";
  std::ofstream(broken) << "<mujoco><worldbody><body name='a'><geom type='sphere'/></body></worldbody>";
  s = mujoco::Model::FromFile(broken, &model);
  std::remove(broken.c_str());
  CHECK(s.code() == Status::Code::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains(broken));

  mujoco::LocomotionTask task;
  task.name = "MyRobot";
  task.observation = {mujoco::ObsPart{}};
  task.forward = mujoco::Forward{mujoco::Forward::Of::kBody, "nose"};
  auto cheetah = mujoco::BuiltinModel("half_cheetah.xml");
  try {
    mujoco::ValidateTask(task, *cheetah);
    FAIL("an unknown body was accepted");
  } catch (const std::invalid_argument& e) {
    CHECK_THAT(e.what(), Catch::Contains("no body 'nose'") && Catch::Contains("torso"));
  }
  task.forward = mujoco::Forward{};
  task.qpos_bounds = {{9, {0, 1}}};
  CHECK_THROWS_WITH(mujoco::ValidateTask(task, *cheetah), Catch::Contains("qpos[9]"));
  CHECK_THROWS_AS(mujoco::BuiltinModel("cheetah.xml"), std::invalid_argument);

  EnvOptions resolved;
  s = ResolveEnvOptions("Hopper-v4", EnvRegistry::Global().Find("Hopper-v4")->default_options,
                        {{"healthy_z", 0.5}}, &resolved);
  CHECK_THAT(s.message(), Catch::Contains("healthy_z") && Catch::Contains("healthy_z_min"));
}

TEST_CASE("MuJoCo: an episode runs to its time limit or its end through EnvGroup", "[mujoco]") {
  auto group = testing::MakeGroup("Hopper-v4", {}, 2, 5);
  group->Reset();
  std::vector<float> actions(6, 0.0f);
  int episodes = 0;
  for (int t = 0; t < 1200 && episodes < 2; ++t) {
    group->Step(nullptr, actions.data());
    episodes += static_cast<int>(group->finished().size());
  }
  // A hopper left to itself falls over long before 1000 steps.
  CHECK(episodes == 2);
}

}  // namespace
}  // namespace farm
