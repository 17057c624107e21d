// TrajectoryStore: the rollout being collected, time-major [T, N, ...], with
// the envs registered a group at a time. A group's rows (envs x agents) are
// contiguous columns, so recording one group's step is one contiguous copy
// per field. With a centralised critic the global state is kept once per
// env ([T, E, state...], E = N / agents_per_env), not once per agent row.
// With a recurrent core it keeps each row's core state at the start of every
// chunk of bptt steps ([T / bptt, N, core state]): the update re-runs the
// core from there.
//
// Where the data lives. A rollout's arrays are one RolloutArena (an anonymous
// mapping of its own), laid out exactly as the trainer reads them, so that in
// steady state Take() hands the arena itself to the trainer: no copy. The
// arena is made at the first step recorded after a Take, for the groups
// present then; a group that joins later gets an arena of its own (only its
// columns), and a group that leaves just stops counting (its columns are
// skipped). Neither ever copies, moves or zero-fills another group's data.
// A Take after such a change gathers the groups present into a fresh arena
// (the one copy, counted in copy_stats().take_gather_bytes). Arenas come from
// an ArenaPool and go back to it when the trainer drops the rollout's
// tensors, so a steady run reuses two arenas (one in sync mode) and faults
// in no new pages.
//
// Protocol per group: RecordStep (obs, global states, action, log-prob, value
// at step t; or RecordInputs then RecordOutputs) -> RecordOutcome (reward and done flags of that step; t becomes
// t+1) -> ... until t == T, then SetBootstrap (value of the next
// observation). When every group is full, Take() gives the rollout and starts
// every group at t = 0.
//
// Threading: not thread-safe; owned by the learner's inference thread. The
// rollouts it returns may be read (and dropped) on any thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "common/space.h"
#include "learner/train/ppo.h"

namespace farm {

// The policy lag of a rollout's samples: updates between the policy that acted on a step and the one the
// rollout is handed to (0 in sync mode).
struct LagStats {
  int64_t min = 0;
  double avg = 0;
  int64_t p95 = 0;  // the smallest lag that at least 95% of the samples have or are below
  int64_t max = 0;
  std::map<int64_t, int64_t> counts;  // samples per lag
};

// Sets min, avg, p95 and max from counts (all 0 without samples).
void SummarizeLag(LagStats* lag);

// Anonymous mappings for rollout arenas, kept for reuse (at most `keep` spare
// ones) so that a steady run does not fault in fresh pages for every rollout.
// Allocation failures throw std::bad_alloc.
//
// Threading: thread-safe (the trainer thread returns arenas as it drops a
// rollout's tensors).
class ArenaPool {
 public:
  explicit ArenaPool(int keep = 2) : keep_(keep) {}
  ~ArenaPool();
  ArenaPool(const ArenaPool&) = delete;
  ArenaPool& operator=(const ArenaPool&) = delete;

  // A mapping of at least `bytes` (page-rounded; `*capacity` gets its size): a spare one no more than twice
  // as large, else a new one.
  void* Acquire(std::size_t bytes, std::size_t* capacity);
  void Release(void* data, std::size_t capacity);
  // Bytes mapped: in use and spare.
  int64_t mapped_bytes() const;

 private:
  const int keep_;
  mutable std::mutex mu_;
  struct Spare {
    void* data;
    std::size_t capacity;
  };
  std::vector<Spare> spare_;  // GUARDED_BY(mu_)
  int64_t mapped_ = 0;        // GUARDED_BY(mu_)
};

class TrajectoryStore {
 public:
  // Actions are kept as `action` says: one int64 per step (discrete), action.numel() int64s (multi-discrete)
  // or floats (box). state_numel: floats of the global state kept per env for a centralised critic (0: none);
  // agents_per_env: rows per env (a group's rows are whole envs, and Take's states are [T, N / agents, ...]).
  // core_numel: floats of recurrent state per row (0: no core), kept every `bptt` steps (bptt divides
  // rollout_length).
  TrajectoryStore(int64_t rollout_length, int64_t obs_numel, const Space& action, int64_t state_numel = 0,
                  int agents_per_env = 1, int64_t core_numel = 0, int64_t bptt = 0);
  ~TrajectoryStore();
  TrajectoryStore(const TrajectoryStore&) = delete;
  TrajectoryStore& operator=(const TrajectoryStore&) = delete;

  // Adds a group of `rows` rows (a multiple of agents_per_env); returns its id. Ids are not reused.
  int AddGroup(int rows);
  // Drops a group (its worker is gone): its partial trajectories are discarded and it no longer counts
  // towards a full rollout. Other groups' data is not touched.
  void RemoveGroup(int group);

  int num_groups() const { return static_cast<int>(groups_.size()); }  // ids handed out, removed ones included
  int64_t num_envs() const { return num_rows_; }  // agent rows (columns) of the groups still in the store
  int64_t num_rows() const { return num_rows_; }
  int agents_per_env() const { return agents_; }
  int64_t rollout_length() const { return T_; }

  int steps(int group) const { return groups_[group].steps; }
  bool full(int group) const { return groups_[group].steps == T_; }
  bool pending(int group) const { return groups_[group].pending; }
  int full_groups() const { return full_groups_; }
  bool all_full() const { return alive_groups_ > 0 && full_groups_ == alive_groups_; }

  // `actions` is int64 [rows] (discrete), int64 [rows, K] (multi-discrete) or float [rows, action numel];
  // `states` is float [rows / agents_per_env, state_numel], one per env, when the store keeps states (ignored,
  // and may be null, otherwise).
  // inputs_written: the observations and states are already in place, written through NextStepInputs (obs and
  // states are then not read; the bytes count in copy_stats() all the same).
  // active: [rows] bytes, 0 for a row whose agent finished before its env ended (StepRequest.active); null: every
  // row acts. A rollout with such a row has Rollout::active.
  void RecordStep(int group, const float* obs, const void* actions, const float* logp, const float* value,
                  int64_t policy_version, const float* states = nullptr, bool inputs_written = false,
                  const uint8_t* active = nullptr);
  // RecordStep in two halves, for a caller that copies the inputs while the forward runs on a device: the inputs
  // (observations, states, which rows act), then the forward's outputs, which complete the step. Same arguments as
  // RecordStep.
  void RecordInputs(int group, const float* obs, const float* states = nullptr, bool inputs_written = false,
                    const uint8_t* active = nullptr);
  // `core_state` [rows, core_numel]: the rows' core states before this step, kept when the step starts a chunk
  // (ignored, and may be null, otherwise or without a core).
  void RecordOutputs(int group, const void* actions, const float* logp, const float* value, int64_t policy_version,
                     const float* core_state = nullptr);
  // Where the group's next RecordStep will put its observations ([rows, obs numel]) and states ([rows /
  // agents_per_env, state numel]; null when the store keeps none), so that a caller may write them beforehand
  // (then RecordStep(..., inputs_written)). `ahead` 1: after the pending step's outcome (RecordOutcome) is
  // recorded; 0: with no step pending. Both null when that place is not known yet: the group has no arena (its
  // first record after a Take places it), `ahead` does not match whether a step is pending, or the step would be
  // past the rollout's end. Writing there changes nothing recorded.
  struct StepInputs {
    float* obs = nullptr;
    float* states = nullptr;
  };
  StepInputs NextStepInputs(int group, int ahead);
  void RecordOutcome(int group, const float* reward, const uint8_t* terminated, const uint8_t* truncated);
  // The largest |reward| RecordOutcome has recorded since the store was made, as the workers sent it (AddReward's
  // bonuses not counted); 0 before any. CriticWatch::ObserveScale bounds the values with it.
  float max_abs_reward() const { return max_abs_reward_; }
  // Adds `bonus` to the reward of row `row` (within the group) at its last completed step.
  void AddReward(int group, int row, float bonus);
  void SetBootstrap(int group, const float* values);

  // The rollout of the groups present: obs [T, N, obs_shape...] and, when the store keeps states, states
  // [T, N / agents_per_env, state_shape...] (state_shape's numel must be state_numel); active [T, N] when a row
  // of the rollout did not act (RecordInputs' `active`), undefined otherwise; lag relative to
  // `current_version`. The tensors share one arena, returned to the pool when the last is dropped.
  // length: the rollout's steps, 0 for rollout_length (every group full); less ends the rollout early (a cut,
  // learner.sync_fraction): it must be at most CutLength(), each group's steps from `length` on are left out, and
  // its bootstrap is the value it recorded at step `length`. A group whose step past the cut is pending (its
  // outcome still to come) drops that outcome when it comes and starts the next rollout with the step after.
  Rollout Take(const std::vector<int64_t>& obs_shape, int64_t current_version, LagStats* lag,
               const std::vector<int64_t>& state_shape = {}, int64_t length = 0);
  // The longest a rollout cut now may be: the largest multiple of `multiple` (a core's ppo.bptt; 1 without one),
  // at most rollout_length, at which every group present has recorded the value the cut bootstraps from; 0 when
  // there is none (a group has not acted yet) or no group is present.
  int64_t CutLength(int64_t multiple) const;

  // What the store copies and holds, for reports and tests. AddGroup and RemoveGroup copy nothing.
  struct CopyStats {
    int64_t record_bytes = 0;       // written by RecordStep/RecordOutcome/AddReward/SetBootstrap
    int64_t take_gather_bytes = 0;  // copied by a Take that had to gather (after joins or leaves)
    int64_t takes = 0;
    int64_t zero_copy_takes = 0;    // Takes that handed the arena itself
    int64_t cut_takes = 0;          // Takes that ended the rollout early (a length below rollout_length)
    int64_t cut_steps = 0;          // the lengths of those rollouts, added up
    int64_t cut_dropped_rows = 0;   // agent-row steps acted on past a cut and left out of training
  };
  const CopyStats& copy_stats() const { return copy_; }
  // Bytes of the arenas this store and its rollouts hold, spare ones included.
  int64_t bytes() const;
  // Bytes of trajectory data per step of one row (obs, action, log-prob, value, reward, done, active, version, and
  // the row's share of its env's state), for memory estimates.
  int64_t bytes_per_row_step() const;

 private:
  struct Arena;
  struct Group {
    std::shared_ptr<Arena> arena;  // where its columns are (null: none yet)
    int64_t col = 0;               // first row column in `arena`
    int64_t env_col = 0;           // first env column in `arena` (states)
    int rows = 0;
    int steps = 0;
    bool pending = false;
    bool alive = true;
    bool skip_outcome = false;  // its pending step fell past a cut: the outcome that comes for it is dropped
  };
  std::shared_ptr<Arena> NewArena(int64_t rows);
  // Places every alive group that has no arena into a new shared arena (the first record after a Take).
  void PlaceGroups();
  template <class U>
  void CopyRows(U* field, int64_t width, int64_t stride_rows, int64_t t, int64_t col, int64_t rows, const U* src);

  const int64_t T_;
  const int64_t obs_numel_;
  const bool integer_actions_;  // discrete or multi-discrete: int64; box: float
  const int64_t action_numel_;  // per step
  const std::vector<int64_t> action_shape_;  // per step: {} (discrete), {K}, or the box's shape
  const int64_t state_numel_;   // 0: no states
  const int agents_;
  const int64_t core_numel_;  // 0: no core
  const int64_t bptt_;        // with a core: steps per chunk
  std::shared_ptr<ArenaPool> pool_;
  std::shared_ptr<Arena> shared_;  // the arena the groups present at the last placement share (null: none)
  int64_t num_rows_ = 0;
  std::vector<Group> groups_;
  int full_groups_ = 0;   // alive groups with T steps
  int alive_groups_ = 0;
  int64_t inactive_rows_ = 0;  // rows recorded as not acting since the last Take: the next rollout has `active`
  float max_abs_reward_ = 0;
  CopyStats copy_;
};

}  // namespace farm
