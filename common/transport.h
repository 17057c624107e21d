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

// Starts watching `socket`'s ZMTP handshakes (zmq_socket_monitor) and returns
// the PAIR socket that receives the failures. `name` must be unique in `ctx`
// among live monitors (the socket's routing id is).
zmq::socket_t MonitorHandshakes(zmq::context_t& ctx, zmq::socket_t& socket, const std::string& name);

// Reads every pending event of a MonitorHandshakes socket; returns the first
// handshake failure that retrying cannot mend (refused CURVE key, CURVE on
// one side only, a wrong learner public key), else Ok. `curve`: this side's
// keys (null without CURVE); `peer` names the other side in messages.
Status CheckHandshakes(zmq::socket_t& monitor, const CurveClientKeys* curve, const std::string& peer);

// Serialises into `scratch` (reused to avoid allocations) and sends one
// frame. Returns false when the socket's send timeout expired (no peer).
// Throws zmq::error_t on EINTR, like ReceiveEnvelope.
bool SendEnvelope(zmq::socket_t& socket, const wire::Envelope& envelope, std::string* scratch);

// Waits up to `timeout` for one frame and decodes it. Returns false on
// timeout; a decode failure is reported in `status`. Throws zmq::error_t on
// EINTR (a signal arrived), which callers treat as "check the stop flag".
bool ReceiveEnvelope(zmq::socket_t& socket, std::chrono::milliseconds timeout, wire::Envelope* out, Status* status);

// The same, also watching `monitor` (from MonitorHandshakes): a handshake
// failure ends the wait early, returning true with the failure in `status`.
bool ReceiveEnvelope(zmq::socket_t& socket, zmq::socket_t& monitor, const CurveClientKeys* curve,
                     const std::string& peer, std::chrono::milliseconds timeout, wire::Envelope* out, Status* status);

}  // namespace farm
