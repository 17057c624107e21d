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
#include "common/status.h"
#include "common/wire.h"

namespace farm {

// A DEALER connected to `endpoint`, with routing id `identity`.
zmq::socket_t MakeDealer(zmq::context_t& ctx, const std::string& identity, const std::string& endpoint,
                         const TransportConfig& config);

// A ROUTER bound to config.bind; returns the endpoint actually bound (the
// port resolved when the config asks for "*").
zmq::socket_t MakeRouter(zmq::context_t& ctx, const TransportConfig& config, std::string* bound_endpoint);

// Serialises into `scratch` (reused to avoid allocations) and sends one
// frame. Returns false when the socket's send timeout expired (no peer).
// Throws zmq::error_t on EINTR, like ReceiveEnvelope.
bool SendEnvelope(zmq::socket_t& socket, const wire::Envelope& envelope, std::string* scratch);

// Waits up to `timeout` for one frame and decodes it. Returns false on
// timeout; a decode failure is reported in `status`. Throws zmq::error_t on
// EINTR (a signal arrived), which callers treat as "check the stop flag".
bool ReceiveEnvelope(zmq::socket_t& socket, std::chrono::milliseconds timeout, wire::Envelope* out, Status* status);

}  // namespace farm
