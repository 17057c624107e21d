// WorkerClient: runs one worker's envs against the learner over a DEALER
// socket. The envs are split into groups (double buffering, as in Sample
// Factory): while the learner chooses actions for one group, the others step.
// With the config's policies (several policies, worker/policy_split.h) it
// has one DEALER per policy's learner: each learner gets its policy's agents'
// rows of every group, and a group steps once every learner has acted for it.
//
// Threading: Run() is called from one thread; RequestStop() from any thread
// or a signal handler.
#pragma once

#include <atomic>
#include <chrono>
#include <fmt/format.h>
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
#include "worker/policy_split.h"

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
  // `index` distinguishes this worker's seeds and identity from the others'. With config.policies,
  // `learner_endpoint` is "NAME=ENDPOINT,NAME=ENDPOINT", one per policy, or one tcp://HOST:PORT for policy i on
  // PORT + i (ParsePolicyEndpoints).
  static Status Create(const FarmConfig& config, int index, const std::string& learner_endpoint,
                       std::unique_ptr<WorkerClient>* out);
  ~WorkerClient();

  // Handshake, then steps until the learner says Stop (Ok), the learner is
  // silent for transport.worker_give_up_s, a stop is requested, or an error.
  // A learner silent for transport.heartbeat_timeout_s, or one that answers
  // Error UNKNOWN_WORKER (it restarted, or dropped this worker as silent), is
  // connected to again under a new identity; the episodes start over. An
  // exception from an env (its step or reset) ends the run as an internal
  // error naming the env. With several policies: every learner is connected
  // to again when one is, and one learner's Stop ends the run (the env cannot
  // step without it).
  Status Run();
  void RequestStop() { stop_requested_.store(true); }
  const WorkerStats& stats() const { return stats_; }
  // With env.normalize_obs or env.normalize_reward: the observation/reward preprocessing (null otherwise); with
  // several policies, the first policy's (each policy's learner has statistics of its own agents' rows).
  // Read it only while Run() is not running.
  const Normalizer* normalizer() const { return links_.empty() ? nullptr : links_[0]->normalizer.get(); }

 private:
  using Clock = std::chrono::steady_clock;
  // A learner: the run's one, or one policy's. Its socket, identity and requests in flight per group.
  struct Link {
    std::string policy;    // empty: the run's one learner
    std::string endpoint;
    std::string identity;  // LinkIdentity
    WatchedDealer dealer;  // the DEALER and its connection events (a refused CURVE key, ...)
    std::unique_ptr<PolicyRows> rows;  // several policies: this policy's rows; null: every row of the group
    // With normalisation (null otherwise): this learner's rows normalised with its statistics; sends obs and
    // rewards from its buffers.
    std::unique_ptr<Normalizer> normalizer;
    std::vector<int64_t> obs_shape;    // [rows of a group's request, obs...]
    std::vector<uint64_t> next_seq;    // per group: seq of the next request
    std::vector<uint8_t> waiting;      // per group: a request is in flight
    std::vector<Clock::time_point> sent_at;  // per group
    Clock::time_point last_heard;      // its last message
    Clock::time_point last_sent;       // our last message to it (a request or a heartbeat)
    std::string Who() const {
      return policy.empty() ? fmt::format("the learner at {}", endpoint)
                            : fmt::format("the learner of policy {} at {}", policy, endpoint);
    }
  };

  WorkerClient() = default;
  Status Loop();
  // Hello to every learner, then each one's Welcome, within `timeout`.
  Status Handshake(std::chrono::milliseconds timeout);
  Status SendHello(Link& link, std::chrono::milliseconds timeout);
  Status OnWelcome(Link& link, const wire::Envelope& reply);
  // worker-HOST-INDEX-PID, then -cN for the Nth reconnection; with a policy -POLICY-cN, -c0 included.
  std::string LinkIdentity(const Link& link, int connection) const;
  Status Reconnect(const Link& failed, const std::string& why);
  Status StartGroups();
  // Sends group g's step to every learner (its rows of it).
  Status SendStep(int group, bool first);
  void SendStepTo(Link& link, int group, bool first);
  Status OnAction(Link& link, const wire::ActionReply& reply);

  FarmConfig config_;
  std::string base_identity_;  // worker-HOST-INDEX-PID
  int connection_ = 0;
  std::unique_ptr<CurveClientKeys> curve_;  // null without transport.curve
  zmq::context_t ctx_{1};
  std::vector<std::unique_ptr<Link>> links_;  // one, or one per policy in the config's order
  std::vector<std::unique_ptr<EnvGroup>> groups_;
  std::vector<uint64_t> group_seeds_;  // per group: the seed its envs were made with
  // Several policies: per group, the learners whose actions are still awaited, and the actions gathered so far
  // ([group rows, action numel]; int64 for categorical spaces, float for boxes).
  std::vector<int> awaited_;
  std::vector<std::vector<int64_t>> discrete_actions_;
  std::vector<std::vector<float>> continuous_actions_;
  wire::Envelope out_;              // reused for every request
  std::string scratch_;
  std::atomic<bool> stop_requested_{false};
  bool send_failed_ = false;
  std::string failed_link_;  // the learner a send to failed (Link::Who)
  WorkerStats stats_;
};

}  // namespace farm
