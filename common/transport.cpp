// ZeroMQ socket set-up and envelope framing.
#include "common/transport.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstring>
#include <limits>

namespace farm {
namespace {

void CommonOptions(zmq::socket_t& s, const TransportConfig& config) {
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::maxmsgsize, config.max_message_bytes);
  // Flow control is by credit (a worker has at most one request per group in
  // flight), so high-water marks only guard against a misbehaving peer.
  s.set(zmq::sockopt::sndhwm, 100000);
  s.set(zmq::sockopt::rcvhwm, 100000);
}

constexpr const char* kSecurityDoc = "docs/OPERATIONS.md, \"Security: CURVE keys\"";

}  // namespace

namespace {
// A DEALER with the project's options, not yet connected.
zmq::socket_t NewDealer(zmq::context_t& ctx, const std::string& identity, const TransportConfig& config,
                        const CurveClientKeys* curve) {
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  CommonOptions(s, config);
  s.set(zmq::sockopt::routing_id, identity);
  // ZMQ_IMMEDIATE stays off: with it, libzmq 4.3 may discard unread inbound messages (the learner's
  // final Stop) when the connection closes. An absent learner shows as an unanswered handshake instead.
  // ValidateConfig bounds worker_give_up_s; the clamp keeps the cast defined for a config that skipped it.
  s.set(zmq::sockopt::sndtimeo,
        static_cast<int>(std::clamp(config.worker_give_up_s * 1000, 0.0,
                                    static_cast<double>(std::numeric_limits<int>::max()))));
  if (curve) {
    s.set(zmq::sockopt::curve_serverkey, curve->server_public_key);
    s.set(zmq::sockopt::curve_publickey, curve->own.public_key);
    s.set(zmq::sockopt::curve_secretkey, curve->own.secret_key);
  }
  return s;
}
}  // namespace

zmq::socket_t MakeDealer(zmq::context_t& ctx, const std::string& identity, const std::string& endpoint,
                         const TransportConfig& config, const CurveClientKeys* curve) {
  zmq::socket_t s = NewDealer(ctx, identity, config, curve);
  s.connect(endpoint);
  return s;
}

zmq::socket_t MakeRouter(zmq::context_t& ctx, const TransportConfig& config, std::string* bound_endpoint,
                         const CurveKeyPair* curve) {
  zmq::socket_t s(ctx, zmq::socket_type::router);
  CommonOptions(s, config);
  s.set(zmq::sockopt::router_mandatory, 1);  // a reply to a vanished worker is an error, not a silent drop
  s.set(zmq::sockopt::linger, 1000);         // deliver the final Stop messages before closing
  if (curve) {
    s.set(zmq::sockopt::curve_server, 1);
    s.set(zmq::sockopt::curve_secretkey, curve->secret_key);
    s.set(zmq::sockopt::zap_domain, "farm");
  }
  s.bind(config.bind);
  if (bound_endpoint) *bound_endpoint = s.get(zmq::sockopt::last_endpoint);
  return s;
}

bool IsLoopbackEndpoint(const std::string& endpoint) {
  if (endpoint.rfind("ipc://", 0) == 0 || endpoint.rfind("inproc://", 0) == 0) return true;
  if (endpoint.rfind("tcp://", 0) != 0) return false;
  const std::string address = endpoint.substr(6);
  const auto colon = address.rfind(':');
  if (colon == std::string::npos) return false;
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

Status CheckEndpoint(const std::string& endpoint, bool bind) {
  const auto starts = [&](const char* scheme) { return endpoint.rfind(scheme, 0) == 0; };
  if (starts("ipc://") || starts("inproc://")) return Status::Ok();
  if (!starts("tcp://"))
    return Status::InvalidArgument(
        fmt::format("expected tcp://HOST:PORT, ipc://PATH or inproc://NAME, got '{}'", endpoint));
  const std::string address = endpoint.substr(6);
  const auto colon = address.rfind(':');
  const std::string port = colon == std::string::npos ? "" : address.substr(colon + 1);
  const bool digits = !port.empty() && port.size() <= 5 && port.find_first_not_of("0123456789") == std::string::npos;
  const int number = digits ? std::stoi(port) : -1;
  const bool host = colon != std::string::npos && colon > 0;
  if (host && (bind ? (port == "*" || (digits && number <= 65535)) : (digits && number >= 1 && number <= 65535)))
    return Status::Ok();
  return Status::InvalidArgument(fmt::format("expected tcp://HOST:PORT with PORT a number from {} to 65535{}, got '{}'",
                                             bind ? 0 : 1, bind ? " or * (a free port)" : "", endpoint));
}

Status CheckBindPolicy(const TransportConfig& config) {
  if (config.curve || config.insecure || IsLoopbackEndpoint(config.bind)) return Status::Ok();
  return Status::InvalidArgument(fmt::format(
      "transport.bind: '{}' is not a loopback address, so anyone who can reach it could join as a worker; set "
      "transport.curve: true (encryption, and only workers whose keys are listed may join) or, on a trusted "
      "private network, transport.insecure: true (see {})",
      config.bind, kSecurityDoc));
}

WatchedDealer WatchedDealer::Connect(zmq::context_t& ctx, const std::string& identity, const std::string& endpoint,
                                     const TransportConfig& config, const CurveClientKeys* curve) {
  WatchedDealer d;
  d.curve_ = curve;
  d.peer_ = endpoint;
  d.socket_ = NewDealer(ctx, identity, config, curve);
  // Monitor first, its PAIR connected, then the DEALER's connect: every event of every connection is queued for
  // the PAIR, whichever thread gets there first.
  const std::string events = "inproc://farm-handshakes-" + identity;
  if (zmq_socket_monitor(d.socket_.handle(), events.c_str(),
                         ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
                             ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                             ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) != 0)
    throw zmq::error_t();
  d.monitor_ = zmq::socket_t(ctx, zmq::socket_type::pair);
  d.monitor_.set(zmq::sockopt::linger, 0);
  d.monitor_.connect(events);
  d.socket_.connect(endpoint);
  return d;
}

Status WatchedDealer::Check() {
  while (failure_.ok()) {
    // An event is two frames: 16-bit event and 32-bit value, then the endpoint.
    zmq::message_t event, address;
    if (!monitor_.recv(event, zmq::recv_flags::dontwait)) break;
    if (event.more() && !monitor_.recv(address, zmq::recv_flags::dontwait)) break;
    if (event.size() < 6) continue;
    uint16_t id = 0;
    uint32_t value = 0;
    std::memcpy(&id, event.data(), sizeof id);
    std::memcpy(&value, static_cast<const char*>(event.data()) + sizeof id, sizeof value);
    switch (id) {
      case ZMQ_EVENT_CONNECTED:
        in_handshake_ = true;
        break;
      case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
        in_handshake_ = false;
        handshake_succeeded_ = true;
        closed_in_handshake_ = 0;
        break;
      case ZMQ_EVENT_DISCONNECTED:
        if (in_handshake_ && ++closed_in_handshake_ >= kHandshakeClosesBeforeFailing) {
          failure_ = Status::InvalidArgument(
              curve_ ? fmt::format("the learner at {} closed the connection during the CURVE handshake {} times in a "
                                   "row: is transport.curve_learner_public_key_file the learner's public key, does "
                                   "the learner use CURVE, and is this worker's key {} in its "
                                   "transport.curve_authorized_keys? (see {})",
                                   peer_, closed_in_handshake_, curve_->own.public_key, kSecurityDoc)
                     : fmt::format("the learner at {} closed the connection during the ZeroMQ handshake {} times in "
                                   "a row: it requires CURVE, most likely (set transport.curve: true, "
                                   "transport.curve_worker_secret_key_file and transport.curve_learner_public_key_file; "
                                   "see {}), or it is not a farm-learner",
                                   peer_, closed_in_handshake_, kSecurityDoc));
        }
        in_handshake_ = false;
        break;
      case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
        failure_ = Status::InvalidArgument(fmt::format(
            "the learner at {} refused this worker's CURVE public key {} (ZAP status {}): add this worker's "
            "NAME.pub to the learner's transport.curve_authorized_keys",
            peer_, curve_ ? curve_->own.public_key : std::string("(none)"), value));
        break;
      case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
        if (value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH) {
          failure_ = Status::InvalidArgument(
              curve_ ? fmt::format("the learner at {} does not use CURVE, but transport.curve is true here", peer_)
                     : fmt::format("the learner at {} requires CURVE: set transport.curve: true, "
                                   "transport.curve_worker_secret_key_file and transport.curve_learner_public_key_file "
                                   "(see {})",
                                   peer_, kSecurityDoc));
        } else if (value == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC) {
          failure_ = Status::InvalidArgument(fmt::format(
              "the CURVE handshake with the learner at {} failed (cryptographic error): is "
              "transport.curve_learner_public_key_file the learner's public key?",
              peer_));
        } else {
          failure_ = Status::Protocol(
              fmt::format("the ZMTP handshake with the learner at {} failed: protocol error 0x{:x}", peer_, value));
        }
        break;
      default:  // HANDSHAKE_FAILED_NO_DETAIL: the DISCONNECTED that follows counts it
        break;
    }
  }
  return failure_;
}

bool SendEnvelope(zmq::socket_t& socket, const wire::Envelope& envelope, std::string* scratch) {
  scratch->clear();
  envelope.SerializeToString(scratch);
  return socket.send(zmq::buffer(*scratch), zmq::send_flags::none).has_value();
}

bool ReceiveEnvelope(zmq::socket_t& socket, std::chrono::milliseconds timeout, wire::Envelope* out, Status* status) {
  zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
  if (zmq::poll(&item, 1, timeout) == 0) return false;
  zmq::message_t msg;
  if (!socket.recv(msg, zmq::recv_flags::dontwait)) return false;
  *status = Decode(msg.data(), msg.size(), out);
  return true;
}

bool ReceiveEnvelope(WatchedDealer& dealer, std::chrono::milliseconds timeout, wire::Envelope* out, Status* status) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  zmq::pollitem_t items[] = {{dealer.socket().handle(), 0, ZMQ_POLLIN, 0},
                             {dealer.monitor().handle(), 0, ZMQ_POLLIN, 0}};
  while (true) {
    // Events first, also those queued before this call: a failed handshake is never taken for silence.
    if (Status s = dealer.Check(); !s.ok()) {
      *status = std::move(s);
      return true;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (zmq::poll(items, 2, std::max(left, std::chrono::milliseconds(0))) == 0) {
      if (Status s = dealer.Check(); !s.ok()) {
        *status = std::move(s);
        return true;
      }
      return false;
    }
    if (items[0].revents & ZMQ_POLLIN) {
      zmq::message_t msg;
      if (dealer.socket().recv(msg, zmq::recv_flags::dontwait)) {
        *status = Decode(msg.data(), msg.size(), out);
        return true;
      }
    }
    if (Clock::now() >= deadline) return false;
  }
}

}  // namespace farm
