// WorkerRegistry: the workers admitted to the run and what the learner checks
// about them: a Hello against the run's env and the learner's limits, each
// StepRequest against its worker's handshake (shapes, order, step results
// only for actions sent, whole envs), and non-finite values per
// learner.non_finite. No LibTorch and no sockets: unit-tested directly.
//
// Threading: owned by the inference thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/running_stats.h"
#include "common/space.h"
#include "common/status.h"
#include "common/wire.h"
#include "farm.pb.h"

namespace farm {

// The run's env, fixed by the first accepted Hello: every later worker must match it.
struct RunSpec {
  std::string env_name;
  Space observation;
  Space action;
  uint32_t num_agents = 1;
  std::optional<Space> global_state;
};

struct WorkerState {
  std::string identity;
  int group_rows = 0;  // rows per group: envs x agents (each row an agent's transition)
  int group_envs = 0;  // envs per group (what env_steps counts)
  std::vector<int> store_group;    // per worker group: group id in the trajectory store
  std::vector<uint64_t> next_seq;  // per worker group: expected seq
  std::vector<uint8_t> acted;      // per worker group: actions sent, results not yet received
  // learner.non_finite: sanitize: values replaced since the last warning, and when that was.
  int64_t non_finite_unreported = 0;
  std::optional<std::chrono::steady_clock::time_point> last_non_finite_warning;
};

// Which connection of which worker process an identity is: a worker that connects again (the learner went silent,
// or answered UNKNOWN_WORKER) says Hello as "<its first identity>-cN" (WorkerClient, farm_worker.py).
struct WorkerConnection {
  std::string process;  // the first identity
  int64_t connection = 0;  // N; 0 for the first identity
  static WorkerConnection Of(const std::string& identity);
};

class WorkerRegistry {
 public:
  explicit WorkerRegistry(const FarmConfig& config);

  // Whether a Hello may join, before anything is built for it: the protocol checks (CheckHello, filling
  // `hs`), preprocessing as the learner's (`normalization`), its largest message within
  // transport.max_message_bytes, an identity not already admitted, its groups within
  // batcher.queue_capacity, and (once the run is set) the run's env. The message says why not.
  Status CheckHello(const std::string& identity, const wire::Hello& hello, const NormalizerOptions& normalization,
                    Handshake* hs) const;

  // The run's env (the first accepted Hello's). Until then every Hello may set it.
  bool has_run() const { return run_.has_value(); }
  const RunSpec& run() const { return *run_; }
  void SetRun(RunSpec spec) { run_ = std::move(spec); }

  // Admits a worker whose Hello passed CheckHello, with its groups' ids in the store.
  WorkerState& Add(const std::string& identity, const Handshake& hs, std::vector<int> store_groups);
  // Forgets a worker; returns what it had (nullopt when unknown).
  std::optional<WorkerState> Remove(const std::string& identity);
  WorkerState* Find(const std::string& identity);
  // The admitted identities of the same worker process as `identity` (other connections of it), oldest first.
  std::vector<std::string> OtherConnections(const std::string& identity) const;
  std::size_t size() const { return workers_.size(); }
  int total_groups() const { return total_groups_; }
  const std::map<std::string, WorkerState>& workers() const { return workers_; }

  // The checks of a StepRequest from an admitted worker (common/wire.h: shapes, order, flags, final
  // observations, global states, whole envs), and that step results come only for a group that was sent
  // actions. Ok: the request may be used; it is not yet counted (Accept).
  Status CheckStep(const WorkerState& ws, const wire::StepRequest& req) const;
  // Counts a checked request: the next seq of its group, and no actions outstanding until MarkActed.
  static void Accept(WorkerState& ws, const wire::StepRequest& req);
  static void MarkActed(WorkerState& ws, uint32_t group) { ws.acted[group] = 1; }

  // learner.non_finite for a request that passed CheckStep. Ok: it may be used (all finite, or sanitized:
  // `*sanitized` values replaced, warned about at most once per worker and 10 s). Otherwise (reject) the
  // message for the Error reply.
  Status AdmitNonFinite(WorkerState& ws, wire::StepRequest* req, int64_t* sanitized);

 private:
  const FarmConfig config_;
  std::optional<RunSpec> run_;
  std::map<std::string, WorkerState> workers_;
  int total_groups_ = 0;
};

}  // namespace farm
