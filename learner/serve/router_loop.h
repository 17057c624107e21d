// RouterLoop: the learner's I/O thread. It owns the ROUTER socket the workers
// connect to, that socket's connection monitor, and the inproc PULL socket
// the inference thread's replies arrive on. For every message it:
//   - records that its sender was heard from (Liveness), whatever else is
//     going on in the learner;
//   - answers at once what needs no training state: an undecodable message
//     (an Error), a Heartbeat from an admitted worker (a Heartbeat back), and
//     a request that finds the batcher full (an Error: more requests in
//     flight than the credit rules allow);
//   - decodes the rest into Work items for the batcher, never blocking on it.
// So a busy inference thread (a long batch, building the policy, a
// checkpoint) never silences the learner: workers keep hearing from it, and
// it keeps hearing from them. Once a second it looks at the inference
// thread's ThreadActivity and says in the log when it has been busy in one
// thing for longer than learner.stall_warn_s.
//
// Threading: Start() launches the I/O thread, which alone uses the ROUTER,
// the monitor and the PULL socket; the ReplySink belongs to the inference
// thread. Counters are atomics, readable anywhere. The destructor joins the
// thread: Quit() through the sink, or shut the context down, first.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <zmq.hpp>

#include "common/config.h"
#include "common/status.h"
#include "farm.pb.h"
#include "learner/serve/batcher.h"
#include "learner/serve/liveness.h"
#include "learner/serve/work.h"

namespace farm {

struct RouterCounters {
  std::atomic<int64_t> io_errors{0};            // messages answered with an Error by the I/O thread
  std::atomic<int64_t> connections_closed{0};   // connections the ROUTER saw close (not while shutting down)
  std::atomic<int64_t> replies_dropped{0};      // messages to peers whose queue was full, or that are gone
  std::atomic<int64_t> heartbeats_answered{0};  // by the I/O thread itself
  std::atomic<int64_t> overloaded{0};           // requests refused because the batcher was full
};

// The inference thread's end of the reply path: messages to workers, sent by the I/O thread.
class ReplySink {
 public:
  ReplySink(zmq::context_t& ctx, const std::string& endpoint);
  void Send(const std::string& identity, const wire::Envelope& envelope);
  // Tells the I/O thread to finish once everything sent before has gone out.
  void Quit();

 private:
  zmq::socket_t push_;
  std::string scratch_;
};

class RouterLoop {
 public:
  // Takes the bound ROUTER. `on_failure` is called (on the I/O thread) if the loop fails for good: without it
  // nothing is received or answered, so the learner should stop.
  static Status Create(zmq::context_t& ctx, zmq::socket_t router, const FarmConfig& config,
                       DynamicBatcher<Work>* batcher, Liveness* liveness, const ThreadActivity* inference,
                       std::function<void(const std::string&)> on_failure, std::unique_ptr<RouterLoop>* out);
  ~RouterLoop();
  RouterLoop(const RouterLoop&) = delete;
  RouterLoop& operator=(const RouterLoop&) = delete;

  void Start();
  // A sink for the inference thread (one per thread that replies).
  std::unique_ptr<ReplySink> MakeReplySink();
  // From now on what arrives is dropped and closed connections are not counted (the workers leaving on Stop).
  void SetShuttingDown() { shutting_down_.store(true); }
  const RouterCounters& counters() const { return counters_; }

 private:
  RouterLoop(zmq::context_t& ctx, const FarmConfig& config) : ctx_(ctx), config_(config) {}
  void Loop();
  void CheckStall();

  zmq::context_t& ctx_;
  const FarmConfig config_;
  DynamicBatcher<Work>* batcher_ = nullptr;
  Liveness* liveness_ = nullptr;
  const ThreadActivity* inference_ = nullptr;
  std::function<void(const std::string&)> on_failure_;
  zmq::socket_t router_;   // I/O thread only
  zmq::socket_t events_;   // I/O thread only: the ROUTER's accepted and closed connections
  zmq::socket_t replies_;  // I/O thread only: PULL, from the ReplySinks
  std::string reply_endpoint_;
  std::atomic<bool> shutting_down_{false};
  RouterCounters counters_;
  // The stall report (I/O thread only): what the inference thread was last reported busy with.
  const char* stall_what_ = nullptr;
  double stall_reported_s_ = 0;
  std::thread thread_;
};

}  // namespace farm
