// CriticWatch: notices a critic that gives every row the same value, update after update, and says so once.
//
// A critic whose hidden ReLU units have all gone below zero for every input (a step that moved the Linear
// after the encoder too far) outputs one constant: its explained variance is 0 to the last digit, no gradient
// reaches its encoder again, and the actor trains on advantages without a baseline for the rest of the run.
// Nothing fails, so without a word the run only looks slow. Seen on uav_coverage with ppo.encoder impala: one
// seed of three kept explained variance 0.000 from update 16 to its last (docs/PERFORMANCE.md, "uav_coverage
// learning"). The watch takes each update's PpoStats (value_std, return_std) and returns a line to log when
// the critic has been constant for kUpdates updates in a row while the returns varied, and another when it
// varies again.
//
// Threading: not thread-safe; the learner's inference thread owns it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "learner/train/ppo.h"

namespace farm {

class CriticWatch {
 public:
  // Updates in a row whose values did not vary before the watch speaks.
  static constexpr int kUpdates = 5;
  // Values "do not vary" when their spread is below this fraction of the returns'.
  static constexpr double kRelativeSpread = 1e-4;

  // The update `update`'s statistics. Returns a warning the first time the critic has been constant for
  // kUpdates updates, and a note when a critic reported constant varies again; nullopt otherwise.
  std::optional<std::string> Observe(int64_t update, const PpoStats& stats);
  // Updates in a row, up to the latest, whose values did not vary.
  int constant_updates() const { return constant_updates_; }

 private:
  int constant_updates_ = 0;
  std::optional<int64_t> reported_at_;  // the update whose warning was given, until the critic varies again
};

}  // namespace farm
