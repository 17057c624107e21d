#include "worker/envs/mujoco/recording.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <utility>

namespace farm::mujoco {

EpisodeRecording::EpisodeRecording(std::shared_ptr<const Model> model, double dt)
    : model_(std::move(model)), dt_(dt) {}

void EpisodeRecording::Add(const mjData* d, double reward) {
  const mjModel* m = model_->get();
  time_.push_back(d->time);
  reward_.push_back(reward);
  qpos_.insert(qpos_.end(), d->qpos, d->qpos + m->nq);
  qvel_.insert(qvel_.end(), d->qvel, d->qvel + m->nv);
}

void EpisodeRecording::Restore(int i, mjData* d) const {
  const mjModel* m = model_->get();
  const auto k = static_cast<std::size_t>(i);
  if (k >= time_.size()) throw std::out_of_range(fmt::format("EpisodeRecording::Restore({}) of {} states", i, size()));
  mj_resetData(m, d);
  d->time = time_[k];
  std::copy_n(qpos_.begin() + static_cast<std::ptrdiff_t>(k * m->nq), m->nq, d->qpos);
  std::copy_n(qvel_.begin() + static_cast<std::ptrdiff_t>(k * m->nv), m->nv, d->qvel);
  mj_forward(m, d);
}

Status EpisodeRecording::WriteTrace(const std::string& path) const {
  const mjModel* m = model_->get();
  const std::vector<std::string> bodies = model_->Names(mjOBJ_BODY, m->nbody);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    if (!out) return Status::IoError(fmt::format("cannot write {}", tmp));
    out << "step,time,reward,return";
    for (int b = 1; b < m->nbody; ++b) {
      const std::string& name = bodies[static_cast<std::size_t>(b)].empty() ? fmt::format("body{}", b)
                                                                              : bodies[static_cast<std::size_t>(b)];
      out << ',' << name << "_z," << name << "_vx," << name << "_vz";
    }
    out << '\n';
    mjData* d = mj_makeData(m);
    double episode_return = 0;
    mjtNum velocity[6];
    for (int i = 0; i < size(); ++i) {
      Restore(i, d);
      episode_return += reward(i);
      out << fmt::format("{},{:.6g},{:.6g},{:.6g}", i, time(i), reward(i), episode_return);
      for (int b = 1; b < m->nbody; ++b) {
        // The body frame's linear velocity in world axes: [angular(3), linear(3)].
        mj_objectVelocity(m, d, mjOBJ_BODY, b, velocity, 0);
        out << fmt::format(",{:.6g},{:.6g},{:.6g}", d->xpos[3 * b + 2], velocity[3], velocity[5]);
      }
      out << '\n';
    }
    mj_deleteData(d);
    if (!out.flush()) return Status::IoError(fmt::format("cannot write {}", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return Status::IoError(fmt::format("cannot write {}", path));
  return Status::Ok();
}

}  // namespace farm::mujoco
