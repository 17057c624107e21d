// ZeroMQ plumbing shared by workers (DEALER) and the learner (ROUTER): socket
// set-up with the project's options, and sending/receiving Envelopes.
// Transport knows ZeroMQ and protobuf only: nothing of envs or models.
//
// Threading: ZeroMQ sockets are not thread-safe; each belongs to one thread.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <zmq.hpp>

#include "common/config.h"
#include "common/curve.h"
#include "common/status.h"
#include "common/wire.h"

namespace farm {

// A DEALER connected to `endpoint`, with routing id `identity`; a CURVE
// client of the learner when `curve` is given.
zmq::socket_t MakeDealer(zmq::context_t& ctx, const std::string& identity, const std::string& endpoint,
                         const TransportConfig& config, const CurveClientKeys* curve = nullptr);

// A ROUTER bound to config.bind; returns the endpoint actually bound (the
// port resolved when the config asks for "*"). With `curve` it is a CURVE
// server: start a ZapAuthenticator in `ctx` first.
zmq::socket_t MakeRouter(zmq::context_t& ctx, const TransportConfig& config, std::string* bound_endpoint,
                         const CurveKeyPair* curve = nullptr);

// True for endpoints only this host can reach: tcp:// on 127.x.x.x,
// localhost or ::1, and ipc:// and inproc://. Interface names and "*" count
// as reachable from elsewhere.
bool IsLoopbackEndpoint(const std::string& endpoint);

// Whether ZeroMQ can bind (`bind`) or connect to `endpoint`: tcp://HOST:PORT,
// ipc://PATH or inproc://NAME, with PORT from 0 to 65535 or * to bind, from 1
// to 65535 to connect. (ZeroMQ itself takes a larger port modulo 65536, and
// throws on a missing port or an unknown scheme.) The message names neither
// the key nor the flag: callers prefix it.
Status CheckEndpoint(const std::string& endpoint, bool bind);

// The learner's rule: binding a non-loopback address needs transport.curve
// or an explicit transport.insecure.
Status CheckBindPolicy(const TransportConfig& config);

// Connection events of one DEALER, watched from before it connects (zmq_socket_monitor on the socket,
// the monitor's PAIR connected, and only then the DEALER's connect): a handshake that ZeroMQ's I/O thread
// finishes at once still has all of its events read here. It tells the failures of a handshake that
// retrying cannot mend (a refused CURVE key, CURVE on one side only, a wrong learner public key) apart
// from a learner that is merely absent (no connection at all, which the caller's timeout covers).
//
// A learner that closes the connection before the handshake completes, kHandshakeClosesBeforeFailing
// times in a row, is such a failure too: that is how a mechanism mismatch looks from the worker when the
// learner detects it first and resets the connection before the worker has read the learner's greeting
// (no HANDSHAKE_FAILED_PROTOCOL reaches the worker then, only a closed connection, and ZeroMQ reconnects).
//
// Threading: one thread, like the socket.
class WatchedDealer {
 public:
  static constexpr int kHandshakeClosesBeforeFailing = 3;

  WatchedDealer() = default;
  WatchedDealer(WatchedDealer&&) = default;
  WatchedDealer& operator=(WatchedDealer&&) = default;

  // A DEALER as MakeDealer makes it, connected to `endpoint` once its monitor is listening. `identity`
  // must be unique in `ctx` among live WatchedDealers (it names the monitor's inproc endpoint); `curve`
  // must outlive the dealer.
  static WatchedDealer Connect(zmq::context_t& ctx, const std::string& identity, const std::string& endpoint,
                               const TransportConfig& config, const CurveClientKeys* curve = nullptr);

  zmq::socket_t& socket() { return socket_; }
  zmq::socket_t& monitor() { return monitor_; }
  bool valid() const { return static_cast<bool>(socket_); }

  // Reads every pending event; returns the first handshake failure that retrying cannot mend, else Ok
  // (the failure stays: later calls return it again).
  Status Check();

  // Connections the learner closed before their handshake completed, since the last one that completed.
  int closed_in_handshake() const { return closed_in_handshake_; }
  bool handshake_succeeded() const { return handshake_succeeded_; }

 private:
  zmq::socket_t socket_;
  zmq::socket_t monitor_;
  const CurveClientKeys* curve_ = nullptr;  // this side's keys (null without CURVE)
  std::string peer_;                        // the learner's endpoint, for messages
  bool in_handshake_ = false;               // connected, handshake not yet completed
  bool handshake_succeeded_ = false;
  int closed_in_handshake_ = 0;
  Status failure_;
};

// Serialises into `scratch` (reused to avoid allocations) and sends one
// frame. Returns false when the socket's send timeout expired (no peer).
// Throws zmq::error_t on EINTR, like ReceiveEnvelope.
bool SendEnvelope(zmq::socket_t& socket, const wire::Envelope& envelope, std::string* scratch);

// Waits up to `timeout` for one frame and decodes it. Returns false on
// timeout; a decode failure is reported in `status`. Throws zmq::error_t on
// EINTR (a signal arrived), which callers treat as "check the stop flag".
bool ReceiveEnvelope(zmq::socket_t& socket, std::chrono::milliseconds timeout, wire::Envelope* out, Status* status);

// The same on a WatchedDealer: a handshake failure (WatchedDealer::Check) ends the wait early, returning
// true with the failure in `status`.
bool ReceiveEnvelope(WatchedDealer& dealer, std::chrono::milliseconds timeout, wire::Envelope* out, Status* status);

}  // namespace farm
