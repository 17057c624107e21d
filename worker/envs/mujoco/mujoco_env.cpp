// MujocoEnv: reset with noise, clipped controls, frame skip.
#include "worker/envs/mujoco/mujoco_env.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "worker/random.h"

namespace farm::mujoco {

MujocoEnv::MujocoEnv(std::shared_ptr<const Model> model, int frame_skip, uint64_t seed, ActionMode action_mode)
    : model_(std::move(model)), data_(mj_makeData(model_->get())), frame_skip_(frame_skip),
      action_mode_(action_mode), action_(model_->get()->nu, 0.0), rng_(seed) {
  if (data_ == nullptr) throw std::runtime_error(fmt::format("MuJoCo model {}: mj_makeData failed", model_->name()));
  if (frame_skip < 1) throw std::invalid_argument(fmt::format("frame_skip {}: expected at least 1", frame_skip));
}

MujocoEnv::~MujocoEnv() { mj_deleteData(data_); }

namespace {

// An actuator's control range; [-1, 1] for one without a limit.
std::pair<double, double> CtrlRange(const mjModel* m, int i) {
  if (!m->actuator_ctrllimited[i]) return {-1.0, 1.0};
  return {m->actuator_ctrlrange[2 * i], m->actuator_ctrlrange[2 * i + 1]};
}

}  // namespace

Space MujocoEnv::ActionSpace(const mjModel* m, ActionMode mode) {
  std::vector<float> low(m->nu, -1.0f), high(m->nu, 1.0f);
  for (int i = 0; i < m->nu && mode == ActionMode::kClip; ++i) {
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
    const auto [lo, hi] = CtrlRange(m, i);
    if (action_mode_ == ActionMode::kClip) {
      action_[i] = std::clamp(static_cast<double>(action[i]), lo, hi);
      data_->ctrl[i] = action_[i];
    } else {
      action_[i] = std::clamp(static_cast<double>(action[i]), -1.0, 1.0);
      data_->ctrl[i] = lo + 0.5 * (action_[i] + 1.0) * (hi - lo);
    }
  }
  for (int k = 0; k < frame_skip_; ++k) mj_step(m, data_);
  mj_rnePostConstraint(m, data_);
}

}  // namespace farm::mujoco
