// A test playing the learner by hand: a bare ROUTER socket on loopback, and a real WorkerClient (the
// farm-worker's client) on its own thread connected to it. The test receives the worker's messages and
// answers them one by one, so it can check exactly what a worker sends and how it takes each reply.
//
// Threading: the test's thread owns the socket and calls every method; the worker runs on its own thread
// from StartWorker until StopAndJoin, or until the destructor stops and joins it (a failed REQUIRE included).
#pragma once

#include <catch2/catch.hpp>
#include <zmq.hpp>

#include <memory>
#include <string>
#include <thread>

#include "common/config.h"
#include "common/status.h"
#include "common/wire.h"
#include "worker/worker_client.h"

namespace farm::testing {

class StandInLearner {
 public:
  StandInLearner() : router_(context_, zmq::socket_type::router) {
    router_.set(zmq::sockopt::linger, 0);
    router_.set(zmq::sockopt::rcvtimeo, 20000);  // a test that hangs fails instead
    router_.bind("tcp://127.0.0.1:*");
    endpoint_ = router_.get(zmq::sockopt::last_endpoint);
  }
  ~StandInLearner() {
    if (!worker_.joinable()) return;
    client_->RequestStop();
    worker_.join();
  }
  StandInLearner(const StandInLearner&) = delete;
  StandInLearner& operator=(const StandInLearner&) = delete;

  // Creates worker 0 of `config` connected here and runs it on its own thread.
  WorkerClient* StartWorker(const FarmConfig& config) {
    const Status created = WorkerClient::Create(config, 0, endpoint_, &client_);
    INFO(created.ToString());
    REQUIRE(created.ok());
    worker_ = std::thread([this] { run_status_ = client_->Run(); });
    return client_.get();
  }

  void Receive(std::string* identity, wire::Envelope* env) {
    zmq::message_t id, body;
    REQUIRE(router_.recv(id));
    REQUIRE(router_.recv(body));
    *identity = id.to_string();
    REQUIRE(Decode(body.data(), body.size(), env).ok());
  }

  void Send(const std::string& identity, const wire::Envelope& env) {
    router_.send(zmq::buffer(identity), zmq::send_flags::sndmore);
    router_.send(zmq::buffer(Encode(env)), zmq::send_flags::none);
  }

  // The next message that is not a Heartbeat (a worker waiting for a reply sends them).
  void ReceiveSkippingHeartbeats(std::string* identity, wire::Envelope* env) {
    do {
      Receive(identity, env);
    } while (env->has_heartbeat());
  }

  // Answers a Hello with an accepting Welcome (and nothing else).
  void Accept(const std::string& identity) {
    wire::Envelope welcome;
    welcome.mutable_welcome()->set_accepted(true);
    Send(identity, welcome);
  }

  // Receives the worker's first message, which must be a Hello that passes the learner's CheckHello, and
  // accepts it. Returns the handshake CheckHello made of it; `hello` (optional) gets the Hello itself.
  Handshake AcceptHello(std::string* identity, wire::Hello* hello = nullptr) {
    wire::Envelope in;
    Receive(identity, &in);
    REQUIRE(in.has_hello());
    Handshake hs;
    const Status checked = CheckHello(in.hello(), &hs);
    INFO(checked.ToString());
    REQUIRE(checked.ok());
    if (hello != nullptr) *hello = in.hello();
    Accept(*identity);
    return hs;
  }

  // Tells the worker to stop, waits for its Run to return and gives Run's status.
  Status StopAndJoin(const std::string& identity) {
    wire::Envelope stop;
    stop.mutable_stop()->set_reason("test done");
    Send(identity, stop);
    worker_.join();
    return run_status_;
  }

  // Waits for the worker's Run to return by itself and gives its status.
  Status Join() {
    worker_.join();
    return run_status_;
  }

  const std::string& endpoint() const { return endpoint_; }

 private:
  zmq::context_t context_{1};
  zmq::socket_t router_;
  std::string endpoint_;
  std::unique_ptr<WorkerClient> client_;
  Status run_status_;
  std::thread worker_;
};

}  // namespace farm::testing
