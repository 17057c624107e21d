// RunDir: the run directory and what is kept in it besides checkpoints'
// contents: its name (run_dir, or runs/<name>-<time>, then -2, -3, ... when
// taken), the lock that keeps a second learner out for this learner's life,
// config.yaml, learner.endpoint, and the checks that a new run or a resume
// may use the directory at all.
//
// Threading: set up by Learner::Create; then used by the inference thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/files.h"
#include "common/status.h"

namespace farm {

class RunDir {
 public:
  // Before the socket is bound, nothing written: a resume needs a valid checkpoint in run_dir; a new run with
  // an explicit run_dir must not find another run's checkpoints there.
  static Status CheckUsable(const FarmConfig& config);
  // Creates (or, resuming, opens) the directory and takes its lock; a new run writes config.yaml.
  static Status Open(const FarmConfig& config, std::unique_ptr<RunDir>* out);

  const std::string& path() const { return path_; }
  std::string checkpoints() const { return path_ + "/checkpoints"; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  // config.yaml: `config` with run_dir as this directory's absolute path and env.python_found as recorded, so
  // that what starts from this directory alone finds the run's files (common/config_files.h).
  Status WriteConfig(const FarmConfig& config) const;
  // Where the run's first Python worker found the env's code (its Hello's env_source), for the next WriteConfig.
  void RecordPythonFound(const std::string& found) { python_found_ = found; }

 private:
  RunDir() = default;
  std::string path_;
  std::string python_found_;  // empty: the config's own env.python_found
  std::unique_ptr<DirectoryLock> lock_;  // run_dir/learner.lock, held for this learner's life
};

// A run with several policies (config.policies), before its learners start: creates its directory (run_dir, or
// runs/<name>-<time>, then -2, -3, ... when taken) and writes the run's config.yaml there (run_dir absolute), which
// each policy's learner then reads (farm-learner --policy NAME, run directory run_dir/NAME). Sets *run_dir to the
// directory's absolute path.
Status PlanPolicies(const FarmConfig& config, std::string* run_dir);

// The keys whose values differ between two dumped configs, as "key: before -> after" (run_dir, learner.resume and
// env.python_found, which resuming itself sets, left out).
std::vector<std::string> ConfigChanges(const std::string& before, const std::string& after);

}  // namespace farm
