// ZeroMQ socket set-up and envelope framing.
#include "common/transport.h"

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

}  // namespace

zmq::socket_t MakeDealer(zmq::context_t& ctx, const std::string& identity, const std::string& endpoint,
                         const TransportConfig& config) {
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  CommonOptions(s, config);
  s.set(zmq::sockopt::routing_id, identity);
  // ZMQ_IMMEDIATE stays off: with it, libzmq 4.3 may discard unread inbound messages (the learner's
  // final Stop) when the connection closes. An absent learner shows as an unanswered handshake instead.
  s.set(zmq::sockopt::sndtimeo, static_cast<int>(config.worker_give_up_s * 1000));
  s.connect(endpoint);
  return s;
}

zmq::socket_t MakeRouter(zmq::context_t& ctx, const TransportConfig& config, std::string* bound_endpoint) {
  zmq::socket_t s(ctx, zmq::socket_type::router);
  CommonOptions(s, config);
  s.set(zmq::sockopt::router_mandatory, 1);
  s.set(zmq::sockopt::linger, 1000);  // deliver the final Stop messages before closing  // a reply to a vanished worker is an error, not a silent drop
  s.bind(config.bind);
  if (bound_endpoint) *bound_endpoint = s.get(zmq::sockopt::last_endpoint);
  return s;
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

}  // namespace farm
