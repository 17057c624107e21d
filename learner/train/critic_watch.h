// CriticWatch: notices a critic that gives every row the same value, update after update, and says so once.
//
// A critic one of whose hidden layers is saturated or dead in every unit for every input (each tanh at +-1,
// each ReLU below zero) outputs one constant: its explained variance is 0 to the last digit, no gradient
// reaches the layers below, and the actor trains on advantages without a baseline. Nothing fails, so without a
// word the run only looks slow. Seen on uav_coverage with ppo.encoder impala (records/performance-history.md,
// "uav_coverage learning"): the values' spread shrank over 17 updates from 0.46 to 2e-5, against the returns'
// spread of about 2; in 3 runs of 6 the critic was constant for 43 to 139 updates, and two of them never came
// back. There the tanh trunk behind the encoder was saturated in every unit for every state, the encoder's
// features still varying; impala's initialisation that let its features grow large is mended (encoder.h).
// The watch takes each update's PpoStats (value_std, return_std) and returns a line to log when the critic has
// been constant for kUpdates updates in a row while the returns varied, and another when it varies again
// (kVaryingSpread).
//
// The opposite failure: a critic whose values grow without bound, update after update. Seen on MPE's simple_tag
// with the truncation bootstrap (records/performance-history.md, "PettingZoo's MPE"): the agents drift without
// limit, each episode's last observation is a state the critic never trained on, and the bootstrap fed its
// extrapolation back into its own targets; value_std grew from 0.5 to 2e9 over 375 updates while the explained
// variance stayed near 0.9 (the critic fits targets made of its own values). ObserveScale names it once the
// values' spread exceeds what any return of the rewards recorded so far allows, max |reward| / (1 - gamma), for
// kUpdates updates in a row.
// The largest reward is the store's, since the learner started: a resumed run whose critic learned of large rewards
// that come rarely (none in its first kUpdates updates) could be warned without cause.
//
// RolloutCriticSaturation measures the other half of that story as it happens: the share of the critic's tanh
// outputs at +-1 (ActorCriticImpl::CriticSaturation) on rows of an update's rollout, per update in metrics as
// critic_saturation. On uav_coverage without value normalisation it ended at 0.62-0.71
// (records/performance-history.md, "Value normalisation").
//
// Threading: CriticWatch is not thread-safe; the learner's inference thread owns it. RolloutCriticSaturation runs
// on the thread that owns the policy (the trainer thread).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/status.h"
#include "learner/model/policy.h"
#include "learner/train/ppo.h"

namespace farm {

// The critic's saturation (ActorCriticImpl::CriticSaturation) on at most `max_rows` rows of `rollout`, evenly
// spaced over its steps and envs (its global states when the policy has them, else its observations); nullopt
// for a critic without tanh layers or an empty rollout.
std::optional<double> RolloutCriticSaturation(ActorCriticImpl& policy, const Rollout& rollout,
                                              int64_t max_rows = 512);

class CriticWatch {
 public:
  // Updates in a row whose values did not vary before the watch speaks.
  static constexpr int kUpdates = 5;
  // Values "do not vary" when their spread is below this fraction of the returns'; a critic reported constant
  // "varies again" once its spread reaches kVaryingSpread of the returns' (in between, it is neither: a dying
  // critic's spread wanders about 1e-4 for many updates, and the log should not flap).
  static constexpr double kConstantSpread = 1e-4;
  static constexpr double kVaryingSpread = 1e-2;

  // A line for the log, and whether it is a warning (the critic went constant) or a note (it varies again).
  struct Report {
    bool warning = false;
    std::string text;
  };
  // The update `update`'s statistics. Returns a warning the first time the critic has been constant for
  // kUpdates updates, and a note when a critic reported constant varies again; nullopt otherwise.
  std::optional<Report> Observe(int64_t update, const PpoStats& stats);
  // Updates in a row, up to the latest, whose values did not vary.
  int constant_updates() const { return constant_updates_; }

  // The update `update`'s statistics against the largest |reward| recorded in the run so far (as the workers sent
  // it: scaled when they normalise rewards, before any bootstrap is added) and the discount: a warning the first
  // time value_std has exceeded max_abs_reward / (1 - gamma) for kUpdates updates in a row (no return of such
  // rewards can be larger, so neither can the spread of correct values); nullopt otherwise, and always for a
  // reward bound of 0, gamma >= 1 or a cancelled update. Said once per process (a resumed run may say it again).
  std::optional<Report> ObserveScale(int64_t update, const PpoStats& stats, double max_abs_reward, double gamma);

  // What a checkpoint keeps of the watch (RunState's critic_watch), so that a resumed run goes on counting and
  // does not warn again of a collapse already reported.
  struct State {
    int64_t constant_updates = 0;
    std::optional<int64_t> reported_at;
  };
  State state() const { return {constant_updates_, reported_at_}; }
  // InvalidArgument (nothing changed) for a negative count or update.
  Status Restore(const State& state);

 private:
  int constant_updates_ = 0;
  std::optional<int64_t> reported_at_;  // the update whose warning was given, until the critic varies again
  int unbounded_updates_ = 0;            // updates in a row whose value_std exceeded the rewards' bound
  bool unbounded_reported_ = false;
};

}  // namespace farm
