// LocomotionEnv: a LocomotionTask's observation, reward and health over MujocoEnv.
#include "worker/envs/mujoco/locomotion.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace farm::mujoco {
namespace {

// The id of a named sensor, or -1.
int SensorId(const mjModel* m, const std::string& name) { return mj_name2id(m, mjOBJ_SENSOR, name.c_str()); }

// The readings a kSensors part writes: the named sensors' slices of sensordata, or one slice of all of it.
struct SensorSlice {
  int adr = 0;
  int dim = 0;
};
std::vector<SensorSlice> SensorSlices(const ObsPart& part, const mjModel* m) {
  if (part.sensors.empty()) return {{0, m->nsensordata}};
  std::vector<SensorSlice> out;
  for (const std::string& name : part.sensors) {
    const int id = SensorId(m, name);
    if (id >= 0) out.push_back({m->sensor_adr[id], m->sensor_dim[id]});
  }
  return out;
}

// The qpos index of the z of a body's free joint, or -1 when its first joint is not free.
int FreeJointZ(const mjModel* m, int body) {
  if (m->body_jntnum[body] < 1) return -1;
  const int j = m->body_jntadr[body];
  return m->jnt_type[j] == mjJNT_FREE ? m->jnt_qposadr[j] + 2 : -1;
}

}  // namespace

int ObservationSize(const LocomotionTask& task, const mjModel* m) {
  int n = 0;
  for (const ObsPart& part : task.observation) {
    switch (part.kind) {
      case ObsPart::Kind::kQpos: n += m->nq - part.skip; break;
      case ObsPart::Kind::kQvel: n += m->nv; break;
      case ObsPart::Kind::kComInertia: n += 10 * m->nbody; break;
      case ObsPart::Kind::kComVelocity: n += 6 * m->nbody; break;
      case ObsPart::Kind::kActuatorForce: n += m->nv; break;
      case ObsPart::Kind::kContactForce: n += 6 * m->nbody; break;
      case ObsPart::Kind::kSensors:
        for (const SensorSlice& s : SensorSlices(part, m)) n += s.dim;
        break;
    }
  }
  return n;
}

EnvSpec LocomotionSpec(const LocomotionTask& task, const mjModel* m) {
  const int n = ObservationSize(task, m);
  constexpr float kMax = std::numeric_limits<float>::max();
  EnvSpec spec;
  spec.name = task.name;
  spec.observation = Space::Box({n}, std::vector<float>(n, -kMax), std::vector<float>(n, kMax));
  spec.action = MujocoEnv::ActionSpace(m, task.action_mode);
  spec.max_episode_steps = task.max_episode_steps;
  spec.reward_threshold = task.reward_threshold;
  return spec;
}

void ValidateTask(const LocomotionTask& task, const Model& model) {
  const mjModel* m = model.get();
  auto bad = [&](const std::string& what) {
    throw std::invalid_argument(fmt::format("{} (model {}): {}", task.name, model.name(), what));
  };
  if (task.frame_skip < 1) bad(fmt::format("frame_skip {}: expected at least 1", task.frame_skip));
  if (task.max_episode_steps < 0) bad(fmt::format("max_episode_steps {}: expected 0 (none) or more", task.max_episode_steps));
  if (m->nu < 1) bad("the model has no actuator to act with");
  if (task.observation.empty()) bad("the observation has no part");
  for (const ObsPart& part : task.observation) {
    if (part.kind == ObsPart::Kind::kQpos && (part.skip < 0 || part.skip >= m->nq))
      bad(fmt::format("the observation leaves out {} of qpos's {} entries: expected 0 to {}", part.skip, m->nq,
                      m->nq - 1));
    if (part.kind == ObsPart::Kind::kSensors) {
      if (m->nsensor == 0) bad("the observation reads sensors, but the model has none");
      for (const std::string& name : part.sensors)
        if (SensorId(m, name) < 0)
          bad(fmt::format("no sensor '{}' for the observation; sensors: {}", name,
                          fmt::join(model.Names(mjOBJ_SENSOR, m->nsensor), ", ")));
    }
  }
  if (task.forward.of == Forward::Of::kBody && model.BodyId(task.forward.body) < 0)
    bad(fmt::format("no body '{}' for the forward velocity; bodies: {}", task.forward.body,
                    fmt::join(model.Names(mjOBJ_BODY, m->nbody), ", ")));
  for (const QposBound& b : task.qpos_bounds) {
    if (b.index < 0 || b.index >= m->nq)
      bad(fmt::format("a health bound on qpos[{}]: the model's qpos has {} entries", b.index, m->nq));
    if (!(b.range.low <= b.range.high))
      bad(fmt::format("the health bound on qpos[{}] is [{}, {}]: low above high", b.index, b.range.low, b.range.high));
  }
  for (const BodyHeightBound& b : task.body_heights) {
    if (model.BodyId(b.body) < 0)
      bad(fmt::format("no body '{}' for a health bound on its height; bodies: {}", b.body,
                      fmt::join(model.Names(mjOBJ_BODY, m->nbody), ", ")));
    if (!(b.range.low <= b.range.high))
      bad(fmt::format("the health bound on {}'s height is [{}, {}]: low above high", b.body, b.range.low,
                      b.range.high));
  }
  if (task.state_from < 0 || task.state_from > m->nq)
    bad(fmt::format("state_from {}: expected 0 to {}", task.state_from, m->nq));
  if (task.reset_qpos_noise < 0 || task.reset_qvel_noise < 0) bad("a negative reset noise");
}

LocomotionEnv::LocomotionEnv(LocomotionTask task, std::shared_ptr<const Model> model, uint64_t seed)
    : MujocoEnv(std::move(model), task.frame_skip, seed, task.action_mode), task_(std::move(task)) {
  ValidateTask(task_, shared_model());
  if (task_.forward.of == Forward::Of::kBody) forward_body_ = shared_model().BodyId(task_.forward.body);
  for (const ObsPart& part : task_.observation) {
    if (part.kind != ObsPart::Kind::kSensors) continue;
    std::vector<Slice> slices;
    for (const SensorSlice& s : SensorSlices(part, this->model())) slices.push_back({s.adr, s.dim});
    sensor_slices_.push_back(std::move(slices));
  }
  for (const BodyHeightBound& b : task_.body_heights) {
    const int id = shared_model().BodyId(b.body);
    height_bodies_.push_back(id);
    height_qpos_.push_back(FreeJointZ(this->model(), id));
  }
  for (int b = 0; b < this->model()->nbody; ++b) total_mass_ += this->model()->body_mass[b];
}

double LocomotionEnv::ForwardPosition() const {
  const mjModel* m = model();
  const mjData* d = data();
  switch (task_.forward.of) {
    case Forward::Of::kRootX: return d->qpos[0];
    case Forward::Of::kBody: return d->xipos[3 * forward_body_];
    case Forward::Of::kMassCenter: {
      double x = 0;
      for (int b = 0; b < m->nbody; ++b) x += m->body_mass[b] * d->xipos[3 * b];
      return x / total_mass_;
    }
  }
  return 0;
}

bool LocomotionEnv::IsHealthy() const {
  const mjModel* m = model();
  const mjData* d = data();
  if (task_.finite_state) {
    for (int i = 0; i < m->nq; ++i)
      if (!std::isfinite(d->qpos[i])) return false;
    for (int i = 0; i < m->nv; ++i)
      if (!std::isfinite(d->qvel[i])) return false;
  }
  for (const QposBound& b : task_.qpos_bounds)
    if (!b.range.Contains(d->qpos[b.index])) return false;
  for (std::size_t i = 0; i < task_.body_heights.size(); ++i)
    if (!task_.body_heights[i].range.Contains(BodyHeight(static_cast<int>(i)))) return false;
  if (task_.state_range) {
    for (int i = task_.state_from; i < m->nq; ++i)
      if (!task_.state_range->Contains(d->qpos[i])) return false;
    for (int i = 0; i < m->nv; ++i)
      if (!task_.state_range->Contains(d->qvel[i])) return false;
  }
  return true;
}

double LocomotionEnv::BodyHeight(int bound) const {
  const int z = height_qpos_[bound];
  return z >= 0 ? data()->qpos[z] : data()->xpos[3 * height_bodies_[bound] + 2];
}

double LocomotionEnv::ContactCost() const {
  if (task_.contact_cost_weight == 0) return 0;
  const mjModel* m = model();
  const Range& r = task_.contact_force_range;
  double sum = 0;
  for (int i = 0; i < 6 * m->nbody; ++i) {
    const double f = std::clamp(data()->cfrc_ext[i], r.low, r.high);
    sum += f * f;
  }
  return task_.contact_cost_weight * sum;
}

void LocomotionEnv::WriteObs(float* obs) const {
  const mjModel* m = model();
  const mjData* d = data();
  float* out = obs;
  auto put = [&out](const mjtNum* src, int n, double lo, double hi) {
    for (int i = 0; i < n; ++i) *out++ = static_cast<float>(lo < hi ? std::clamp(src[i], lo, hi) : src[i]);
  };
  std::size_t sensor_part = 0;
  for (const ObsPart& part : task_.observation) {
    switch (part.kind) {
      case ObsPart::Kind::kSensors:
        for (const Slice& s : sensor_slices_[sensor_part]) put(d->sensordata + s.adr, s.dim, 0, 0);
        ++sensor_part;
        break;
      case ObsPart::Kind::kQpos: put(d->qpos + part.skip, m->nq - part.skip, 0, 0); break;
      case ObsPart::Kind::kQvel: put(d->qvel, m->nv, -part.clip, part.clip); break;
      case ObsPart::Kind::kComInertia: put(d->cinert, 10 * m->nbody, 0, 0); break;
      case ObsPart::Kind::kComVelocity: put(d->cvel, 6 * m->nbody, 0, 0); break;
      case ObsPart::Kind::kActuatorForce: put(d->qfrc_actuator, m->nv, 0, 0); break;
      case ObsPart::Kind::kContactForce: put(d->cfrc_ext, 6 * m->nbody, part.clip_low, part.clip_high); break;
    }
  }
}

void LocomotionEnv::reset(float* obs) {
  ResetWithNoise(task_.reset_qpos_noise, task_.reset_qvel_noise, task_.reset_qvel_kind);
  terms_ = Terms{};
  WriteObs(obs);
}

StepResult LocomotionEnv::step(const ActionRef& action, float* obs) {
  const double before = ForwardPosition();
  Simulate(action.continuous);
  const double after = ForwardPosition();

  Terms t;
  t.forward_velocity = (after - before) / dt();
  t.forward = task_.forward_weight * t.forward_velocity;
  const bool healthy = IsHealthy();
  t.healthy = (healthy || task_.terminate_when_unhealthy) ? task_.healthy_reward : 0.0;
  double squared = 0;
  for (double a : clipped_action()) squared += a * a;
  t.ctrl_cost = task_.ctrl_cost_weight * squared;
  t.contact_cost = ContactCost();
  terms_ = t;

  WriteObs(obs);
  StepResult result;
  result.reward = static_cast<float>(t.forward + t.healthy - t.ctrl_cost - t.contact_cost);
  result.terminated = task_.terminate_when_unhealthy && !healthy;
  return result;
}

}  // namespace farm::mujoco
