// The learner's I/O thread: ROUTER in, replies out, liveness and stall reports.
#include "learner/serve/router_loop.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <unordered_map>
#include <vector>
#include <zmq_addon.hpp>

#include "common/log_limit.h"
#include "common/wire.h"

namespace farm {
namespace {

using Clock = std::chrono::steady_clock;

// The address of the peer on a connection's socket, while it is open ("" when it is already gone).
std::string PeerAddress(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "";
  char host[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    return fmt::format("{}:{}", host, ntohs(a->sin_port));
  }
  if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    return fmt::format("[{}]:{}", host, ntohs(a->sin6_port));
  }
  return "";
}

// How often the loop wakes with nothing to do, to look at the inference thread.
constexpr std::chrono::milliseconds kWatchInterval{1000};
// How often a stall that goes on is reported again.
constexpr double kStallRepeatSeconds = 30;

}  // namespace

// ---------------------------------------------------------------- ReplySink

ReplySink::ReplySink(zmq::context_t& ctx, const std::string& endpoint) : push_(ctx, zmq::socket_type::push) {
  push_.set(zmq::sockopt::sndhwm, 0);
  push_.connect(endpoint);
}

void ReplySink::Send(const std::string& identity, const wire::Envelope& envelope) {
  envelope.SerializeToString(&scratch_);
  push_.send(zmq::buffer(identity), zmq::send_flags::sndmore);
  push_.send(zmq::buffer(scratch_), zmq::send_flags::none);
}

void ReplySink::Quit() { push_.send(zmq::message_t(), zmq::send_flags::none); }

// ---------------------------------------------------------------- RouterLoop

Status RouterLoop::Create(zmq::context_t& ctx, zmq::socket_t router, const FarmConfig& config,
                          DynamicBatcher<Work>* batcher, Liveness* liveness, const ThreadActivity* inference,
                          std::function<void(const std::string&)> on_failure, std::unique_ptr<RouterLoop>* out) {
  std::unique_ptr<RouterLoop> loop(new RouterLoop(ctx, config));
  loop->batcher_ = batcher;
  loop->liveness_ = liveness;
  loop->inference_ = inference;
  loop->on_failure_ = std::move(on_failure);
  loop->router_ = std::move(router);
  // Connections the ROUTER closes: a worker that left, or one that sent more than transport.max_message_bytes
  // (ZeroMQ drops such a peer rather than deliver part of a message).
  const std::string events = fmt::format("inproc://farm-router-events-{}", static_cast<const void*>(loop.get()));
  if (zmq_socket_monitor(loop->router_.handle(), events.c_str(), ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) != 0)
    return Status::IoError(fmt::format("zmq_socket_monitor: {}", zmq_strerror(zmq_errno())));
  loop->events_ = zmq::socket_t(ctx, zmq::socket_type::pair);
  loop->events_.set(zmq::sockopt::linger, 0);
  loop->events_.connect(events);
  loop->reply_endpoint_ = fmt::format("inproc://farm-replies-{}", static_cast<const void*>(loop.get()));
  loop->replies_ = zmq::socket_t(ctx, zmq::socket_type::pull);
  loop->replies_.set(zmq::sockopt::rcvhwm, 0);
  loop->replies_.bind(loop->reply_endpoint_);
  *out = std::move(loop);
  return Status::Ok();
}

RouterLoop::~RouterLoop() {
  if (thread_.joinable()) thread_.join();
}

void RouterLoop::Start() {
  thread_ = std::thread([this] { Loop(); });
}

std::unique_ptr<ReplySink> RouterLoop::MakeReplySink() {
  return std::make_unique<ReplySink>(ctx_, reply_endpoint_);
}

void RouterLoop::CheckStall() {
  const auto busy = inference_ ? inference_->BusyAt(Clock::now()) : std::nullopt;
  const double warn = config_.learner.stall_warn_s;
  // The stall reported is over when the thread is idle or busy with something else (or started it anew).
  if (stall_what_ != nullptr && (!busy || busy->what != stall_what_ || busy->seconds < stall_reported_s_)) {
    spdlog::info("the learner's inference thread is back from {} (busy for more than {:.0f} s)", stall_what_,
                 stall_reported_s_);
    stall_what_ = nullptr;
    stall_reported_s_ = 0;
  }
  if (busy && busy->seconds >= warn) {
    if (stall_what_ == nullptr) {
      spdlog::warn("the learner's inference thread has been busy for {:.1f} s in {}; meanwhile its I/O thread "
                   "answers the workers' heartbeats, so none is dropped for it",
                   busy->seconds, busy->what);
      stall_what_ = busy->what;
      stall_reported_s_ = busy->seconds;
    } else if (busy->seconds - stall_reported_s_ >= kStallRepeatSeconds) {
      spdlog::warn("the learner's inference thread is still busy in {} ({:.0f} s so far)", busy->what,
                   busy->seconds);
      stall_reported_s_ = busy->seconds;
    }
  }
}

void RouterLoop::Loop() {
  zmq::pollitem_t items[] = {{router_.handle(), 0, ZMQ_POLLIN, 0},
                             {replies_.handle(), 0, ZMQ_POLLIN, 0},
                             {events_.handle(), 0, ZMQ_POLLIN, 0}};
  std::vector<zmq::message_t> frames;
  std::unordered_map<int, std::string> peers;  // open connections' descriptors -> peer address
  std::string err_scratch, beat_scratch;
  {
    wire::Envelope beat;
    beat.mutable_heartbeat();
    beat.SerializeToString(&beat_scratch);
  }
  // Undecodable messages arrive at whatever rate a client sends them: each gets its Error and is counted,
  // but the log says so at most once per kLogRateInterval, with the count in between.
  LogRateLimiter bad_message_log;
  LogRateLimiter dropped_log;
  LogRateLimiter overload_log;
  auto last_watch = Clock::now();
  // Sends one message to a peer without ever blocking this thread: a peer that is gone (router_mandatory:
  // EHOSTUNREACH) or that does not read what it is sent (its queue at transport's send high-water mark)
  // loses the message, and every other peer is still served.
  auto send_to = [&](zmq::const_buffer identity, zmq::const_buffer payload) {
    // Only for the log lines: the common case (sent) builds no string.
    const auto name = [&] { return std::string(static_cast<const char*>(identity.data()), identity.size()); };
    try {
      if (!router_.send(identity, zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
        counters_.replies_dropped.fetch_add(1);
        const std::string who = name();
        if (const auto d = dropped_log.Allow("full " + who); d.log && !shutting_down_.load())
          spdlog::warn("message to {} dropped: it does not read what it is sent (its queue is full){}", who,
                       LogRateLimiter::Suffix(d));
        return;
      }
      router_.send(payload, zmq::send_flags::dontwait);  // the rest of a message the first frame got in
    } catch (const zmq::error_t& ex) {
      if (ex.num() != EHOSTUNREACH) throw;
      counters_.replies_dropped.fetch_add(1);
      if (!shutting_down_.load()) spdlog::warn("message to {} dropped: the worker is gone", name());
    }
  };
  auto send_error = [&](const std::string& identity, const std::string& message) {
    counters_.io_errors.fetch_add(1);
    wire::Envelope e;
    e.mutable_error()->set_message(message);
    e.SerializeToString(&err_scratch);
    send_to(zmq::buffer(identity), zmq::buffer(err_scratch));
  };
  try {
    while (true) {
      const auto waited_from = Clock::now();
      zmq::poll(items, 3, kWatchInterval);
      const auto now = Clock::now();
      // A wait that ended late, or began late: the process did not run (SIGSTOP, a paused VM).
      if (const double lost = liveness_->Listening(waited_from, kWatchInterval, now); lost > 0 && !shutting_down_.load())
        spdlog::warn("the learner did not run for {:.1f} s (stopped, or starved of CPU): its workers' silence in that "
                     "time is not held against them",
                     lost);
      if (now - last_watch >= kWatchInterval) {
        last_watch = now;
        CheckStall();
      }
      if (items[2].revents & ZMQ_POLLIN) {
        // A monitor event: 16-bit event and 32-bit value (the descriptor), then the endpoint.
        frames.clear();
        if (zmq::recv_multipart(events_, std::back_inserter(frames), zmq::recv_flags::dontwait) &&
            frames[0].size() >= 6) {
          uint16_t event = 0;
          int32_t fd = -1;
          std::memcpy(&event, frames[0].data(), sizeof event);
          std::memcpy(&fd, static_cast<const char*>(frames[0].data()) + sizeof event, sizeof fd);
          if (event == ZMQ_EVENT_ACCEPTED) {
            peers[fd] = PeerAddress(fd);
          } else if (event == ZMQ_EVENT_DISCONNECTED) {
            const auto it = peers.find(fd);
            const std::string peer = it == peers.end() || it->second.empty() ? "a peer" : it->second;
            if (it != peers.end()) peers.erase(it);
            if (!shutting_down_.load()) {  // else: the workers leaving on Stop
              const int64_t n = counters_.connections_closed.fetch_add(1) + 1;
              spdlog::info("connection from {} closed ({} so far): the worker left, or sent a message over "
                           "transport.max_message_bytes ({}), which ZeroMQ answers by disconnecting",
                           peer, n, config_.transport.max_message_bytes);
            }
          }
        }
      }
      if (items[0].revents & ZMQ_POLLIN) {
        frames.clear();
        if (zmq::recv_multipart(router_, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
          std::string identity = frames[0].to_string();
          const bool admitted = liveness_->Heard(identity, now);
          Work w;
          Status decoded;
          if (frames.size() != 2) {
            decoded = Status::Protocol(fmt::format("expected one frame per message, got {}", frames.size() - 1));
          } else if (decoded = Decode(frames[1].data(), frames[1].size(), &w.msg); !decoded.ok()) {
            if (const auto d = bad_message_log.Allow("undecodable"); d.log)
              spdlog::warn("bad message from {}: {}{}", identity, decoded.message(), LogRateLimiter::Suffix(d));
          }
          if (shutting_down_.load()) {
            // Nothing more is served; the Stop replies and the quit message still come through `replies_`.
          } else if (!decoded.ok()) {
            send_error(identity, decoded.message());
          } else if (w.msg.has_heartbeat() && admitted) {
            // Answered here, whatever the inference thread is doing: the worker knows the learner is alive.
            counters_.heartbeats_answered.fetch_add(1);
            send_to(zmq::buffer(identity), zmq::buffer(beat_scratch));
          } else if (!w.msg.has_hello() && !w.msg.has_heartbeat() && !w.msg.has_step()) {
            send_error(identity, fmt::format("unexpected message type {} (expected Hello, StepRequest or Heartbeat)",
                                             static_cast<int>(w.msg.body_case())));
          } else {
            w.identity = std::move(identity);
            if (w.msg.has_hello()) {
              w.kind = Work::Kind::kHello;
            } else if (w.msg.has_heartbeat()) {
              w.kind = Work::Kind::kHeartbeat;  // from a worker the learner does not know: answered there
            } else {
              w.kind = Work::Kind::kStep;
              const auto& shape = w.msg.step().obs().shape();
              // The batcher's row count until the inference thread checks the shape: clamped, so that a bad
              // request cannot overflow the batcher's sums.
              w.rows = shape.empty() ? 0 : std::clamp<int64_t>(shape[0], 0, kMaxEnvsPerWorker);
            }
            bool queued = false;
            const std::string who = w.identity;
            if (batcher_->TryPush(std::move(w), &queued).ok() && !queued) {
              // Every worker has at most one request per group in flight, and the learner admits no more groups
              // than the queue holds: only a client that breaks that rule gets here.
              counters_.overloaded.fetch_add(1);
              if (const auto d = overload_log.Allow("overloaded"); d.log)
                spdlog::warn("request from {} refused: the learner's queue is full (batcher.queue_capacity {}){}", who,
                             config_.batcher.queue_capacity, LogRateLimiter::Suffix(d));
              send_error(who, fmt::format("the learner's request queue is full (batcher.queue_capacity {}): more "
                                          "requests in flight than one per group",
                                          config_.batcher.queue_capacity));
            }
          }
        }
      }
      if (items[1].revents & ZMQ_POLLIN) {
        frames.clear();
        if (zmq::recv_multipart(replies_, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
          if (frames.size() == 1 && frames[0].size() == 0) return;  // quit
          send_to(zmq::buffer(frames[0].data(), frames[0].size()), zmq::buffer(frames[1].data(), frames[1].size()));
        }
      }
    }
  } catch (const zmq::error_t& e) {
    if (e.num() == ETERM) return;  // the context is shutting down (the learner's destructor)
    // Without this thread nothing is received or answered: stop the run (final checkpoint) rather than hang.
    spdlog::error("learner I/O thread: {}; stopping", e.what());
    if (on_failure_) on_failure_(fmt::format("the learner's I/O thread failed: {}", e.what()));
  }
}

}  // namespace farm
