// WorkerClient: runs one worker's envs against the learner over a DEALER
// socket. The envs are split into groups (double buffering, as in Sample
// Factory): while the learner chooses actions for one group, the others step.
//
// Threading: Run() is called from one thread; RequestStop() from any thread
// or a signal handler.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "common/config.h"
#include "common/curve.h"
#include "common/transport.h"
#include "common/status.h"
#include "farm.pb.h"
#include "worker/env_group.h"
#include "worker/normalizer.h"

namespace farm {

struct WorkerStats {
  int64_t env_steps = 0;
  int64_t episodes = 0;
  int64_t messages = 0;
  double seconds = 0;                   // from the first request to the end of Run()
  int64_t reconnects = 0;               // handshakes redone after the learner went away
  std::vector<float> round_trip_us;     // request sent -> its actions received, per message (capped)
  // Percentile q in [0, 1] of round_trip_us (0 when empty).
  double RoundTripPercentile(double q) const;
};

class WorkerClient {
 public:
  // `index` distinguishes this worker's seeds and identity from the others'.
  static Status Create(const FarmConfig& config, int index, const std::string& learner_endpoint,
                       std::unique_ptr<WorkerClient>* out);
  ~WorkerClient();

  // Handshake, then steps until the learner says Stop (Ok), the learner is
  // silent for transport.worker_give_up_s, a stop is requested, or an error.
  // A learner silent for transport.heartbeat_timeout_s, or one that answers
  // Error UNKNOWN_WORKER (it restarted, or dropped this worker as silent), is
  // connected to again under a new identity; the episodes start over. An
  // exception from an env (its step or reset) ends the run as an internal
  // error naming the env.
  Status Run();
  void RequestStop() { stop_requested_.store(true); }
  const WorkerStats& stats() const { return stats_; }
  // With env.normalize_obs or env.normalize_reward: the observation/reward preprocessing (null otherwise).
  // Read it only while Run() is not running.
  const Normalizer* normalizer() const { return normalizer_.get(); }

 private:
  WorkerClient() = default;
  Status Loop();
  Status Handshake(std::chrono::milliseconds timeout);
  Status Reconnect(const std::string& why);
  void StartGroups();
  void SendStep(int group, bool first);
  Status OnAction(const wire::ActionReply& reply);

  FarmConfig config_;
  std::string base_identity_;  // worker-HOST-INDEX-PID
  std::string identity_;       // base_identity_, then -cN for the Nth reconnection
  int connection_ = 0;
  std::string endpoint_;
  std::unique_ptr<CurveClientKeys> curve_;  // null without transport.curve
  zmq::context_t ctx_{1};
  WatchedDealer dealer_;  // the DEALER and its connection events (a refused CURVE key, ...)
  std::vector<std::unique_ptr<EnvGroup>> groups_;
  std::vector<uint64_t> group_seeds_;  // per group: the seed its envs were made with
  std::unique_ptr<Normalizer> normalizer_;  // null without normalisation; sends obs/rewards from its buffers
  std::vector<int64_t> obs_shape_;  // [group size, obs...] of every request
  std::vector<uint64_t> next_seq_;  // per group: seq of the next request
  std::vector<uint8_t> waiting_;    // per group: a request is in flight
  std::vector<std::chrono::steady_clock::time_point> sent_at_;  // per group
  wire::Envelope out_;              // reused for every request
  std::string scratch_;
  std::atomic<bool> stop_requested_{false};
  bool send_failed_ = false;
  WorkerStats stats_;
};

}  // namespace farm
