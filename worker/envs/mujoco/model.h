// A compiled MuJoCo model (mjModel), loaded once and shared read-only by every env of a process that simulates
// it: from a user's MJCF file, or from one of the built-in models (worker/envs/mujoco/models/*.xml, compiled
// into the program, so a worker needs no file beside it).
//
// Threading: a Model is immutable after loading; any number of envs on any threads read it at once (mj_step
// reads the model and writes only its own mjData). BuiltinModel and the cache behind it are thread-safe.
#pragma once

#include <mujoco/mujoco.h>

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace farm::mujoco {

class Model {
 public:
  // Compiles the MJCF file at `path` (its includes and meshes found beside it). The error names the file and
  // quotes MuJoCo's own message.
  static Status FromFile(const std::string& path, std::shared_ptr<const Model>* out);
  // Compiles MJCF text held in memory, under the file name `name` (for MuJoCo's messages).
  static Status FromText(const std::string& name, const std::string& xml, std::shared_ptr<const Model>* out);

  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const mjModel* get() const { return model_; }
  const std::string& name() const { return name_; }

  // A body's id, or -1 when the model has none of that name.
  int BodyId(const std::string& body) const;
  // The names of every object of a type (mjOBJ_BODY ...), in id order: for refusals that list what exists.
  std::vector<std::string> Names(mjtObj type, int count) const;

 private:
  Model(std::string name, mjModel* model) : name_(std::move(name)), model_(model) {}

  std::string name_;
  mjModel* model_;  // owned; mj_deleteModel in the destructor
};

// The built-in model of that file name ("half_cheetah.xml"), compiled on first use and kept for the process.
// Throws std::invalid_argument for a name that is not built in, std::runtime_error when it does not compile
// (a build bug: tests load every one).
std::shared_ptr<const Model> BuiltinModel(const std::string& file);
// The built-in models' file names, sorted.
std::vector<std::string> BuiltinModelNames();
// A built-in model's MJCF text (for tests and for writing it out); throws std::invalid_argument as BuiltinModel.
const std::string& BuiltinModelText(const std::string& file);

}  // namespace farm::mujoco
