// One episode of a MuJoCo env kept state by state, to be looked at after it ran: as a video
// (worker/envs/mujoco/video.h) or as a table of every body's height and velocity over time (WriteTrace), which
// needs no renderer. farm-eval --video records the first episode of its first env this way.
//
// Threading: one thread at a time; the Model is shared read-only.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/envs/mujoco/model.h"

namespace farm::mujoco {

class EpisodeRecording {
 public:
  // `dt`: the simulated seconds between two recorded states (one env step: timestep * frame_skip).
  EpisodeRecording(std::shared_ptr<const Model> model, double dt);

  // Keeps d's time, qpos and qvel, and the reward that led to this state (0 for the first state, after a reset).
  void Add(const mjData* d, double reward);

  const Model& model() const { return *model_; }
  double dt() const { return dt_; }
  int size() const { return static_cast<int>(time_.size()); }
  double time(int i) const { return time_.at(static_cast<std::size_t>(i)); }
  double reward(int i) const { return reward_.at(static_cast<std::size_t>(i)); }
  // Puts state i into `d` (a mjData of model()) and runs mj_forward, so that every derived quantity (body
  // positions, velocities, contacts) is that of the recorded state.
  void Restore(int i, mjData* d) const;

  // A CSV file: a header, then one row per recorded state: step, time, reward, the return so far, then for each
  // body but the world <body>_z (its frame's height, m), <body>_vx and <body>_vz (its frame's linear velocity
  // along world x and z, m/s).
  Status WriteTrace(const std::string& path) const;

 private:
  std::shared_ptr<const Model> model_;
  double dt_;
  std::vector<double> time_;
  std::vector<double> reward_;
  std::vector<double> qpos_;  // [size, nq]
  std::vector<double> qvel_;  // [size, nv]
};

}  // namespace farm::mujoco
