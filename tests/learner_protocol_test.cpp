// The learner over a real socket, driven by a hand-written DEALER client:
// answers, clipping of continuous actions, and an Error for each kind of bad
// message without disturbing a good client.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>
#include <zmq.hpp>

#include "common/transport.h"
#include "common/wire.h"
#include "learner/learner.h"

// LibTorch pulls in glog, whose CHECK would replace Catch's: include Catch last.
#undef CHECK
#include <catch2/catch.hpp>

using namespace farm;

namespace {

// A learner serving on an ephemeral loopback port from a thread of its own.
class ServedLearner {
 public:
  ServedLearner() {
    FarmConfig config;
    config.learner.train = false;
    config.learner.progress_interval_s = 3600;
    config.learner.checkpoint_every = 0;
    config.total_env_steps = int64_t{1} << 40;
    config.batcher.max_wait_us = 0;
    config.run_dir = (std::filesystem::temp_directory_path() /
                      ("farm-protocol-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++)))
                         .string();
    run_dir_ = config.run_dir;
    REQUIRE(Learner::Create(config, &learner_).ok());
    thread_ = std::thread([this] { status_ = learner_->Run(&summary_); });
  }
  ~ServedLearner() {
    Stop();
    std::filesystem::remove_all(run_dir_);
  }
  void Stop() {
    if (!thread_.joinable()) return;
    learner_->RequestStop("test done");
    thread_.join();
  }
  const std::string& endpoint() const { return learner_->endpoint(); }
  const nlohmann::json& summary() const { return summary_; }

 private:
  static inline int counter_ = 0;
  std::unique_ptr<Learner> learner_;
  std::thread thread_;
  Status status_;
  nlohmann::json summary_;
  std::string run_dir_;
};

class Client {
 public:
  Client(const std::string& endpoint, const std::string& id) {
    TransportConfig tc;
    tc.worker_give_up_s = 5;
    sock_ = MakeDealer(ctx_, id, endpoint, tc);
  }
  void Send(const wire::Envelope& e) { REQUIRE(SendEnvelope(sock_, e, &scratch_)); }
  void SendRaw(const std::string& bytes) { sock_.send(zmq::buffer(bytes), zmq::send_flags::none); }
  wire::Envelope Receive() {
    wire::Envelope e;
    Status s;
    REQUIRE(ReceiveEnvelope(sock_, std::chrono::seconds(10), &e, &s));
    REQUIRE(s.ok());
    return e;
  }

 private:
  zmq::context_t ctx_{1};
  zmq::socket_t sock_;
  std::string scratch_;
};

wire::Envelope Hello(const Space& obs, const Space& act, uint32_t envs, uint32_t groups, uint32_t version) {
  wire::Envelope e;
  auto* h = e.mutable_hello();
  h->set_protocol_version(version);
  h->set_worker_id("test");
  h->set_env_name("Test-v0");
  h->set_num_envs(envs);
  h->set_num_groups(groups);
  ToWire(obs, h->mutable_observation());
  ToWire(act, h->mutable_action());
  return e;
}

wire::Envelope Step(uint32_t group, uint64_t seq, int64_t rows, int64_t obs_dim, bool with_results) {
  wire::Envelope e;
  auto* s = e.mutable_step();
  s->set_group(group);
  s->set_seq(seq);
  s->set_first(seq == 0);
  const std::vector<float> obs(static_cast<std::size_t>(rows * obs_dim), 0.5f);
  SetTensor(s->mutable_obs(), DType::kFloat32, {rows, obs_dim}, obs.data(), obs.size() * 4);
  if (with_results) {
    const std::vector<float> reward(static_cast<std::size_t>(rows), 1.0f);
    SetTensor(s->mutable_reward(), DType::kFloat32, {rows}, reward.data(), reward.size() * 4);
    s->set_terminated(std::string(static_cast<std::size_t>(rows), '\0'));
    s->set_truncated(std::string(static_cast<std::size_t>(rows), '\0'));
  }
  return e;
}

}  // namespace

TEST_CASE("continuous actions reach the worker clipped to the action bounds", "[learner][protocol]") {
  ServedLearner learner;
  Client c(learner.endpoint(), "box-client");
  const Space obs = Space::Box({3}, {-1.f}, {1.f});
  const Space act = Space::Box({2}, {-0.001f}, {0.001f});  // a unit-std Gaussian almost never lands inside
  c.Send(Hello(obs, act, 8, 2, kProtocolVersion));
  REQUIRE(c.Receive().welcome().accepted());
  c.Send(Step(0, 0, 4, 3, false));
  const auto reply = c.Receive();
  REQUIRE(reply.has_action());
  REQUIRE(CheckTensor(reply.action().action(), DType::kFloat32, {4, 2}, "action").ok());
  const auto* a = reinterpret_cast<const float*>(reply.action().action().data().data());
  int at_bound = 0;
  for (int i = 0; i < 8; ++i) {
    CHECK(a[i] >= -0.001f);
    CHECK(a[i] <= 0.001f);
    at_bound += (a[i] == -0.001f || a[i] == 0.001f);
  }
  CHECK(at_bound >= 6);  // clipping happened (P(|N(0,1)| < 0.001) is tiny)
}

TEST_CASE("each bad message gets an Error and a good client is not affected", "[learner][protocol]") {
  ServedLearner learner;
  const Space obs = Space::Box({3}, {-1.f}, {1.f});
  const Space act = Space::Discrete(4);
  Client good(learner.endpoint(), "good");
  good.Send(Hello(obs, act, 8, 2, kProtocolVersion));
  REQUIRE(good.Receive().welcome().accepted());

  Client bad(learner.endpoint(), "bad");
  // Garbage bytes.
  bad.SendRaw(std::string("\xff\xfe\xfd not a protobuf", 19));
  auto e = bad.Receive();
  REQUIRE(e.has_error());
  CHECK_THAT(e.error().message(), Catch::Contains("cannot parse"));
  // A step before the handshake.
  bad.Send(Step(0, 0, 4, 3, false));
  e = bad.Receive();
  REQUIRE(e.has_error());
  CHECK_THAT(e.error().message(), Catch::Contains("never said hello"));
  // Wrong protocol version.
  bad.Send(Hello(obs, act, 8, 2, kProtocolVersion + 7));
  e = bad.Receive();
  REQUIRE(e.has_welcome());
  CHECK_FALSE(e.welcome().accepted());
  CHECK_THAT(e.welcome().error(), Catch::Contains("protocol version"));
  // Spaces that contradict the run's.
  bad.Send(Hello(Space::Box({5}, {-1.f}, {1.f}), act, 8, 2, kProtocolVersion));
  e = bad.Receive();
  REQUIRE_FALSE(e.welcome().accepted());
  CHECK_THAT(e.welcome().error(), Catch::Contains("does not match"));
  // A proper handshake, then shapes that contradict it, and order violations.
  bad.Send(Hello(obs, act, 8, 2, kProtocolVersion));
  REQUIRE(bad.Receive().welcome().accepted());
  bad.Send(Step(0, 0, 5, 3, false));  // 5 rows, the group has 4
  e = bad.Receive();
  REQUIRE(e.has_error());
  CHECK_THAT(e.error().message(), Catch::Contains("StepRequest.obs: expected float32 [4, 3], got float32 [5, 3]"));
  bad.Send(Step(1, 3, 4, 3, true));  // seq 3 before 0
  e = bad.Receive();
  REQUIRE(e.has_error());
  CHECK_THAT(e.error().message(), Catch::Contains("out of order"));
  bad.Send(Step(7, 0, 4, 3, false));  // no such group
  e = bad.Receive();
  REQUIRE(e.has_error());
  CHECK_THAT(e.error().message(), Catch::Contains("group 7 out of range"));

  // The good client is served throughout, step after step.
  for (uint64_t seq = 0; seq < 3; ++seq) {
    good.Send(Step(0, seq, 4, 3, seq > 0));
    const auto reply = good.Receive();
    REQUIRE(reply.has_action());
    CHECK(reply.action().seq() == seq);
    REQUIRE(CheckTensor(reply.action().action(), DType::kInt64, {4}, "action").ok());
    const auto* a = reinterpret_cast<const int64_t*>(reply.action().action().data().data());
    for (int i = 0; i < 4; ++i) CHECK((a[i] >= 0 && a[i] < 4));
  }
  // The bad client, now in order, is served too.
  bad.Send(Step(0, 0, 4, 3, false));
  CHECK(bad.Receive().has_action());

  learner.Stop();
  CHECK(learner.summary()["protocol_errors"].get<int>() == 7);
}
