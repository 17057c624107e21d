// MujocoEnv: reset with noise, clipped controls, frame skip.
#include "worker/envs/mujoco/mujoco_env.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "worker/random.h"

namespace farm::mujoco {

MujocoEnv::MujocoEnv(std::shared_ptr<const Model> model, int frame_skip, uint64_t seed)
    : model_(std::move(model)), data_(mj_makeData(model_->get())), frame_skip_(frame_skip),
      action_(model_->get()->nu, 0.0), rng_(seed) {
  if (data_ == nullptr) throw std::runtime_error(fmt::format("MuJoCo model {}: mj_makeData failed", model_->name()));
  if (frame_skip < 1) throw std::invalid_argument(fmt::format("frame_skip {}: expected at least 1", frame_skip));
}

MujocoEnv::~MujocoEnv() { mj_deleteData(data_); }

Space MujocoEnv::ActionSpace(const mjModel* m) {
  std::vector<float> low(m->nu, -1.0f), high(m->nu, 1.0f);
  for (int i = 0; i < m->nu; ++i) {
    if (m->actuator_ctrllimited[i]) {
      low[i] = static_cast<float>(m->actuator_ctrlrange[2 * i]);
      high[i] = static_cast<float>(m->actuator_ctrlrange[2 * i + 1]);
    }
  }
  return Space::Box({m->nu}, std::move(low), std::move(high));
}

void MujocoEnv::SetState(const std::vector<double>& qpos, const std::vector<double>& qvel) {
  const mjModel* m = model();
  if (static_cast<int>(qpos.size()) != m->nq || static_cast<int>(qvel.size()) != m->nv)
    throw std::invalid_argument(fmt::format("SetState: {} qpos and {} qvel values, expected {} and {}", qpos.size(),
                                            qvel.size(), m->nq, m->nv));
  std::copy(qpos.begin(), qpos.end(), data_->qpos);
  std::copy(qvel.begin(), qvel.end(), data_->qvel);
  mj_forward(m, data_);
}

void MujocoEnv::ResetWithNoise(double qpos_noise, double qvel_noise, VelocityNoise kind) {
  const mjModel* m = model();
  mj_resetData(m, data_);
  for (int i = 0; i < m->nq; ++i) data_->qpos[i] = m->qpos0[i] + UniformReal(rng_, -qpos_noise, qpos_noise);
  for (int i = 0; i < m->nv; ++i) {
    data_->qvel[i] = kind == VelocityNoise::kNormal ? qvel_noise * StandardNormal(rng_)
                                                     : UniformReal(rng_, -qvel_noise, qvel_noise);
  }
  mj_forward(m, data_);
}

void MujocoEnv::Simulate(const float* action) {
  const mjModel* m = model();
  for (int i = 0; i < m->nu; ++i) {
    double a = action[i];
    const double lo = m->actuator_ctrllimited[i] ? m->actuator_ctrlrange[2 * i] : -1.0;
    const double hi = m->actuator_ctrllimited[i] ? m->actuator_ctrlrange[2 * i + 1] : 1.0;
    a = std::clamp(a, lo, hi);
    action_[i] = a;
    data_->ctrl[i] = a;
  }
  for (int k = 0; k < frame_skip_; ++k) mj_step(m, data_);
  mj_rnePostConstraint(m, data_);
}

}  // namespace farm::mujoco
