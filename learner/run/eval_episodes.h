// EvalEpisodes: the episodes a serving learner counts for an evaluation (learner.eval_episodes), written to
// run_dir/episodes.jsonl as they end, and whether the evaluation is complete.
//
// Which episodes count is the rule farm-eval uses for C++ envs (EpisodeQuota): N episodes spread evenly over
// the K envs of the evaluating worker (env i runs N/K, the first N%K one more), each env's first episodes, as
// Stable-Baselines3's evaluate_policy does; taking whichever N episodes end first would favour short ones. The
// envs are the first admitted worker's, numbered group-major (group g, env e: g x envs-per-group + e); other
// workers' episodes are not counted (an evaluation has one worker).
//
// Threading: not thread-safe; used by the learner's inference thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "learner/run/metrics.h"

namespace farm {

// Episodes per env: `episodes` spread over `envs` (env i gets episodes / envs, the first episodes % envs one
// more). envs > 0.
std::vector<int> EpisodeQuota(int episodes, int envs);

class EvalEpisodes {
 public:
  // `episodes` > 0: the evaluation's N. Opens `path` (appending) for the episodes' lines.
  static Status Open(int episodes, const std::string& path, std::unique_ptr<EvalEpisodes>* out);

  // The evaluating worker: its identity and envs (once; later calls are ignored and return false).
  bool SetWorker(const std::string& identity, int num_envs);
  bool counts(const std::string& identity) const { return has_worker_ && identity == identity_; }

  // An episode of env `env` of the evaluating worker ended: written as {"env", "return", "length"} while that
  // env's quota lasts. A line that cannot be written is an error (the evaluation would be incomplete).
  Status Add(int env, double episode_return, int64_t length);

  bool done() const { return has_worker_ && counted_ == episodes_; }
  int counted() const { return counted_; }
  int episodes() const { return episodes_; }

 private:
  explicit EvalEpisodes(int episodes) : episodes_(episodes) {}

  const int episodes_;
  MetricsWriter file_;
  bool has_worker_ = false;
  std::string identity_;
  std::vector<int> left_;  // per env: episodes still to count
  int counted_ = 0;
};

}  // namespace farm
