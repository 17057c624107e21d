// The learner over a real socket, driven by a hand-written DEALER client:
// answers, clipping of continuous actions, and an Error for each kind of bad
// message (malformed, out of order, duplicated, of an unknown type, holding
// NaN/Inf, too large) without disturbing a good client.
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <future>
#include <limits>
#include <optional>
#include <random>
#include <thread>
#include <zmq.hpp>

#include "common/files.h"
#include "common/log_limit.h"
#include "common/transport.h"
#include "common/wire.h"
#include "learner/learner.h"
#include "learner/run/checkpoint.h"

// LibTorch pulls in glog, whose CHECK would replace Catch's: include Catch last.
#undef CHECK
#include <catch2/catch.hpp>

using namespace farm;

namespace {

// A learner serving on an ephemeral loopback port from a thread of its own.
class ServedLearner {
 public:
  // `adjust` changes the test's config before the learner is created.
  explicit ServedLearner(const std::function<void(FarmConfig&)>& adjust = {}) {
    FarmConfig config;
    config.learner.train = false;
    config.learner.progress_interval_s = 3600;
    config.learner.checkpoint_every = 0;
    config.total_env_steps = int64_t{1} << 40;
    config.batcher.max_wait_us = 0;
    config.run_dir = (std::filesystem::temp_directory_path() /
                      ("farm-protocol-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++)))
                         .string();
    if (adjust) adjust(config);
    run_dir_ = config.run_dir;
    REQUIRE(ValidateConfig(config).ok());
    REQUIRE(Learner::Create(config, &learner_).ok());
    thread_ = std::thread([this] {
      status_ = learner_->Run(&summary_);
      done_ = true;
    });
  }
  ~ServedLearner() {
    Stop();
    (void)RemoveTree(run_dir_);  // not std::filesystem::remove_all: see RemoveTree
  }
  void Stop() {
    if (!thread_.joinable()) return;
    learner_->RequestStop("test done");
    thread_.join();
  }
  // Waits for Run to return by itself (no stop request) and gives its status; a learner that does not stop
  // within 60 s ends the test program (its threads cannot be unwound).
  Status Wait() {
    for (int i = 0; !done_.load() && i < 6000; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (!done_.load()) {
      std::fprintf(stderr, "FAILED: the learner did not stop by itself within 60 s\n");
      std::_Exit(1);
    }
    thread_.join();
    return status_;
  }
  Learner& learner() { return *learner_; }
  const std::string& run_dir() const { return run_dir_; }
  const std::string& endpoint() const { return learner_->endpoint(); }
  const nlohmann::json& summary() const { return summary_; }

 private:
  static inline int counter_ = 0;
  std::unique_ptr<Learner> learner_;
  std::thread thread_;
  std::atomic<bool> done_{false};  // Run returned
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
  bool TrySend(const wire::Envelope& e) { return SendEnvelope(sock_, e, &scratch_); }  // no Catch: any thread
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

// Step() with env `env` truncated (its final observation [1, obs_dim] of `final_value`s) and one finished
// episode of return `episode_return`.
wire::Envelope StepWithEnding(uint32_t group, uint64_t seq, int64_t rows, int64_t obs_dim, int env, float final_value,
                              float episode_return) {
  wire::Envelope e = Step(group, seq, rows, obs_dim, true);
  auto* s = e.mutable_step();
  (*s->mutable_truncated())[static_cast<std::size_t>(env)] = 1;
  s->add_final_obs_index(env);
  const std::vector<float> final_obs(static_cast<std::size_t>(obs_dim), final_value);
  SetTensor(s->mutable_final_obs(), DType::kFloat32, {1, obs_dim}, final_obs.data(), final_obs.size() * 4);
  auto* ep = s->add_episodes();
  ep->set_episode_return(episode_return);
  ep->set_length(10);
  return e;
}

// Sets element `index` of a float tensor's data.
void SetFloat(wire::Tensor* t, int64_t index, float value) {
  std::memcpy(t->mutable_data()->data() + index * 4, &value, sizeof value);
}

// Copies of what the default logger writes while it lives (spdlog's ring buffer), to count warnings.
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(1000)) {
    spdlog::default_logger()->sinks().push_back(sink_);  // before any learner thread logs
  }
  ~LogCapture() {
    auto& sinks = spdlog::default_logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  int Count(const std::string& a, const std::string& b) const {
    int n = 0;
    for (const auto& line : sink_->last_formatted())
      n += line.find(a) != std::string::npos && line.find(b) != std::string::npos;
    return n;
  }

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
};

// One good client's step seq (first when seq is 0): answered with actions for that seq.
// `c` says hello with this layout (8 envs in 2 groups, the current protocol) and is welcomed.
void Join(Client& c, const Space& obs, const Space& act) {
  c.Send(Hello(obs, act, 8, 2, kProtocolVersion));
  REQUIRE(c.Receive().welcome().accepted());
}

void ServeGood(Client& good, uint64_t seq) {
  good.Send(Step(0, seq, 4, 3, seq > 0));
  const auto reply = good.Receive();
  REQUIRE(reply.has_action());
  CHECK(reply.action().seq() == seq);
}

}  // namespace

TEST_CASE("continuous actions reach the worker clipped to the action bounds", "[learner][protocol]") {
  ServedLearner learner;
  Client c(learner.endpoint(), "box-client");
  const Space obs = Space::Box({3}, {-1.f}, {1.f});
  const Space act = Space::Box({2}, {-0.001f}, {0.001f});  // a unit-std Gaussian almost never lands inside
  Join(c, obs, act);
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
  Join(good, obs, act);

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
  Join(bad, obs, act);
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
  // Row counts no group can have: the batcher counts rows before the shape is checked, and must not
  // overflow its sums (UBSan caught none only because the I/O thread clamps them).
  wire::Envelope huge = Step(0, 0, 4, 3, false);
  huge.mutable_step()->mutable_obs()->set_shape(0, std::numeric_limits<int64_t>::max());
  bad.Send(huge);
  bad.Send(huge);
  for (int i = 0; i < 2; ++i) {
    e = bad.Receive();
    REQUIRE(e.has_error());
    CHECK_THAT(e.error().message(), Catch::Contains("StepRequest.obs: expected float32 [4, 3]"));
  }
  // A space whose dimensions overflow when multiplied (found by tests/fuzz): refused, not wrapped around.
  Client other(learner.endpoint(), "overflow");
  wire::Envelope overflow = Hello(obs, act, 8, 2, kProtocolVersion);
  overflow.mutable_hello()->mutable_observation()->set_shape(0, (int64_t{1} << 62) + 1);
  overflow.mutable_hello()->mutable_observation()->add_shape(4);
  other.Send(overflow);
  e = other.Receive();
  REQUIRE(e.has_welcome());
  REQUIRE_FALSE(e.welcome().accepted());
  CHECK_THAT(e.welcome().error(), Catch::Contains("more than"));

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
  CHECK(learner.summary()["protocol_errors"].get<int>() == 10);
}

TEST_CASE("a flood of messages with invalid UTF-8 gets an Error each, a count, and a few log lines",
          "[learner][protocol]") {
  LogCapture log;  // before the learner's threads start
  ServedLearner learner;
  const Space obs = Space::Box({3}, {-1.f}, {1.f});
  const Space act = Space::Discrete(4);
  Client good(learner.endpoint(), "good");
  Join(good, obs, act);
  uint64_t good_seq = 0;
  ServeGood(good, good_seq++);

  // Hellos whose worker_id is not UTF-8 (0xFF never is; the rest random, seeded), put in by replacing
  // the bytes of a placeholder: protobuf itself would complain when serialising them.
  const auto start = std::chrono::steady_clock::now();
  Client flood(learner.endpoint(), "flood");
  std::mt19937 rng(1126);
  constexpr int kMessages = 1000;
  for (int i = 0; i < kMessages; ++i) {
    std::string bad(8, '\xff');
    for (std::size_t j = 1; j < bad.size(); ++j) bad[j] = static_cast<char>(rng() % 256);
    wire::Envelope hello = Hello(obs, act, 8, 2, kProtocolVersion);
    hello.mutable_hello()->set_worker_id(std::string(bad.size(), 'P'));
    std::string bytes = Encode(hello);
    const auto at = bytes.find(std::string(bad.size(), 'P'));
    REQUIRE(at != std::string::npos);
    bytes.replace(at, bad.size(), bad);
    flood.SendRaw(bytes);
    const auto e = flood.Receive();
    REQUIRE(e.has_error());
    CHECK_THAT(e.error().message(), Catch::Contains("cannot parse"));
    if (i % 100 == 0) ServeGood(good, good_seq++);  // the good client is served all along
  }
  const double elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  learner.Stop();
  CHECK(learner.summary()["protocol_errors"].get<int>() == kMessages);
  // One line per kLogRateInterval, each for protobuf's complaint and the learner's own: the first, then one
  // per interval that passed (none, unless this machine took more than 10 s for the loop).
  const int allowed = 1 + static_cast<int>(elapsed_s / std::chrono::duration<double>(kLogRateInterval).count()) + 1;
  INFO("elapsed " << elapsed_s << " s");
  CHECK(log.Count("bad message from", "cannot parse") >= 1);
  CHECK(log.Count("bad message from", "cannot parse") <= allowed);
  CHECK(log.Count("protobuf:", "invalid UTF-8") >= 1);
  CHECK(log.Count("protobuf:", "invalid UTF-8") <= allowed);
}

TEST_CASE("NaN or Inf in a request is refused with an Error naming it (learner.non_finite: reject)",
          "[learner][protocol]") {
  ServedLearner learner([](FarmConfig& c) { c.learner.train = true; });  // recording on: nothing bad may reach it
  const Space obs = Space::Box({3}, {-1.f}, {1.f});
  const Space act = Space::Discrete(4);
  Client good(learner.endpoint(), "good");
  Client bad(learner.endpoint(), "nan-worker");
  Join(good, obs, act);
  Join(bad, obs, act);
  uint64_t good_seq = 0;
  ServeGood(good, good_seq++);

  auto refused = [&](const wire::Envelope& request, const std::string& where) {
    bad.Send(request);
    const auto e = bad.Receive();
    REQUIRE(e.has_error());
    CHECK_THAT(e.error().message(), Catch::Contains("nan-worker") && Catch::Contains(where) &&
                                        Catch::Contains("learner.non_finite"));
    CHECK(e.error().seq() == request.step().seq());
    ServeGood(good, good_seq++);  // interleaved: the good client is served as before
  };
  // The first request's observations: row 1, element 2 is NaN.
  wire::Envelope first = Step(0, 0, 4, 3, false);
  SetFloat(first.mutable_step()->mutable_obs(), 5, std::nanf(""));
  refused(first, "StepRequest.obs[5] = nan (row 1, element 2)");
  // Refused requests are not consumed: the same seq, finite, is served.
  bad.Send(Step(0, 0, 4, 3, false));
  REQUIRE(bad.Receive().has_action());
  ServeGood(good, good_seq++);
  // A reward, a truncated env's final observation, an episode's return.
  wire::Envelope reward = Step(0, 1, 4, 3, true);
  SetFloat(reward.mutable_step()->mutable_reward(), 2, std::numeric_limits<float>::infinity());
  refused(reward, "StepRequest.reward[2] = inf");
  refused(StepWithEnding(0, 1, 4, 3, 1, -std::numeric_limits<float>::infinity(), 5.f),
          "StepRequest.final_obs[0] = -inf (row 0, element 0)");
  refused(StepWithEnding(0, 1, 4, 3, 1, 0.5f, std::nanf("")), "StepRequest.episodes.episode_return[0] = nan");
  // The same step, all finite, goes through.
  bad.Send(StepWithEnding(0, 1, 4, 3, 1, 0.5f, 7.f));
  REQUIRE(bad.Receive().has_action());

  learner.Stop();
  const auto& s = learner.summary();
  CHECK(s["non_finite_rejected"].get<int>() == 4);
  CHECK(s["non_finite_sanitized"].get<int>() == 0);
  CHECK(s["protocol_errors"].get<int>() == 4);
  // Recorded: the good client's 5 steps with results and the bad one's 1, 4 envs each; the one episode.
  CHECK(s["env_steps"].get<int>() == (5 + 1) * 4);
  CHECK(s["episodes"].get<int>() == 1);
  CHECK(s["mean_return_100"].get<double>() == 7.0);
}

TEST_CASE("NaN or Inf is replaced by 0 with one warning per worker and interval (learner.non_finite: sanitize)",
          "[learner][protocol]") {
  LogCapture log;
  ServedLearner learner([](FarmConfig& c) {
    c.learner.train = true;
    c.learner.non_finite = "sanitize";
  });
  const Space obs = Space::Box({3}, {-1.f}, {1.f});
  const Space act = Space::Discrete(4);
  Client good(learner.endpoint(), "good");
  Client bad(learner.endpoint(), "inf-worker");
  Join(good, obs, act);
  Join(bad, obs, act);
  uint64_t good_seq = 0;
  ServeGood(good, good_seq++);

  auto served = [&](const wire::Envelope& request) {
    bad.Send(request);
    const auto reply = bad.Receive();
    REQUIRE(reply.has_action());
    CHECK(reply.action().seq() == request.step().seq());
    const auto* a = reinterpret_cast<const int64_t*>(reply.action().action().data().data());
    for (int i = 0; i < 4; ++i) CHECK((a[i] >= 0 && a[i] < 4));
    ServeGood(good, good_seq++);
  };
  wire::Envelope first = Step(0, 0, 4, 3, false);
  SetFloat(first.mutable_step()->mutable_obs(), 0, std::nanf(""));
  SetFloat(first.mutable_step()->mutable_obs(), 11, -std::numeric_limits<float>::infinity());
  served(first);  // 2 values
  wire::Envelope second = StepWithEnding(0, 1, 4, 3, 2, std::nanf(""), std::numeric_limits<float>::infinity());
  SetFloat(second.mutable_step()->mutable_reward(), 3, std::nanf(""));
  served(second);  // 3 (final obs) + 1 (reward) + 1 (episode return)
  served(Step(0, 2, 4, 3, true));

  learner.Stop();
  const auto& s = learner.summary();
  CHECK(s["non_finite_sanitized"].get<int>() == 2 + 3 + 1 + 1);
  CHECK(s["non_finite_rejected"].get<int>() == 0);
  CHECK(s["protocol_errors"].get<int>() == 0);
  CHECK(s["env_steps"].get<int>() == 2 * 4 + 3 * 4);  // the bad client's 2 steps with results, the good one's 3
  CHECK(s["episodes"].get<int>() == 1);
  CHECK(s["mean_return_100"].get<double>() == 0.0);  // the infinite return, replaced by 0
  // Two requests with non-finite values, one warning naming the worker (rate-limited), none for the good one.
  CHECK(log.Count("inf-worker", "non-finite") == 1);
  CHECK(log.Count("good", "non-finite") == 0);
}

TEST_CASE("duplicated seqs and unknown message types get an Error each and are counted", "[learner][protocol]") {
  ServedLearner learner;
  const Space obs = Space::Box({3}, {-1.f}, {1.f});
  const Space act = Space::Discrete(4);
  Client good(learner.endpoint(), "good");
  Join(good, obs, act);
  Client odd(learner.endpoint(), "odd");
  Join(odd, obs, act);
  uint64_t good_seq = 0;
  ServeGood(good, good_seq++);

  auto error = [&](const std::string& bytes, const std::string& expected) {
    odd.SendRaw(bytes);
    const auto e = odd.Receive();
    REQUIRE(e.has_error());
    CHECK_THAT(e.error().message(), Catch::Contains(expected));
    ServeGood(good, good_seq++);
  };
  // Two requests of group 1 served, then each sent again: duplicates, refused, and nothing recorded twice.
  for (uint64_t seq = 0; seq < 2; ++seq) {
    odd.Send(Step(1, seq, 4, 3, seq > 0));
    REQUIRE(odd.Receive().has_action());
  }
  error(Encode(Step(1, 1, 4, 3, true)), "group 1: seq 1 out of order (expected 2): a duplicate");
  error(Encode(Step(1, 0, 4, 3, false)), "group 1: seq 0 out of order (expected 2): a duplicate");
  // An empty envelope (no body set).
  error(std::string(), "message has no body");
  // A message type from a future protocol: field 20 of Envelope, which this version does not know.
  error(std::string("\xa2\x01\x02\x08\x01", 5), "message has no body");
  // A message that only the learner sends.
  wire::Envelope welcome;
  welcome.mutable_welcome()->set_accepted(true);
  error(Encode(welcome), "unexpected message type");
  wire::Envelope stop;
  stop.mutable_stop()->set_reason("no");
  error(Encode(stop), "unexpected message type");
  // Still in order after all of that.
  odd.Send(Step(1, 2, 4, 3, true));
  REQUIRE(odd.Receive().has_action());

  learner.Stop();
  CHECK(learner.summary()["protocol_errors"].get<int>() == 6);
  CHECK(learner.summary()["env_steps"].get<int>() == 4 * static_cast<int>(good_seq - 1) + 2 * 4);
}

TEST_CASE("clients that leave before their Error is sent do not stop the learner serving", "[learner][protocol]") {
  ServedLearner learner;
  const Space obs = Space::Box({3}, {-1.f}, {1.f});
  const Space act = Space::Discrete(4);
  Client good(learner.endpoint(), "good");
  Join(good, obs, act);
  ServeGood(good, 0);
  // Each sends a message of two frames (answered with an Error by the I/O thread itself) and is gone at
  // once; the answer then has no peer to go to (router_mandatory: EHOSTUNREACH).
  for (int i = 0; i < 30; ++i) {
    zmq::context_t ctx(1);
    zmq::socket_t s(ctx, zmq::socket_type::dealer);
    s.set(zmq::sockopt::routing_id, "gone-" + std::to_string(i));
    s.set(zmq::sockopt::linger, 1000);  // delivered before the close
    s.connect(learner.endpoint());
    s.send(zmq::str_buffer("a"), zmq::send_flags::sndmore);
    s.send(zmq::str_buffer("b"), zmq::send_flags::none);
  }
  for (uint64_t seq = 1; seq <= 5; ++seq) ServeGood(good, seq);
}

TEST_CASE("a client that never reads what it is sent cannot stall the learner", "[learner][protocol]") {
  LogCapture log;
  ServedLearner learner([](FarmConfig& c) { c.transport.heartbeat_timeout_s = 600; });
  const Space obs = Space::Box({3}, {-1.f}, {1.f});
  const Space act = Space::Discrete(4);
  Client good(learner.endpoint(), "good");
  Join(good, obs, act);
  ServeGood(good, 0);
  // A client that sends garbage and reads none of the Errors it earns: past the learner's send high-water
  // mark for it (100,000 messages) and the sockets' buffers, a blocking send would stop the learner's I/O
  // thread, and with it every worker.
  zmq::context_t ctx(1);
  zmq::socket_t deaf(ctx, zmq::socket_type::dealer);
  deaf.set(zmq::sockopt::routing_id, "deaf");
  deaf.set(zmq::sockopt::rcvhwm, 1);
  deaf.set(zmq::sockopt::rcvbuf, 4096);
  deaf.set(zmq::sockopt::sndhwm, 0);
  deaf.set(zmq::sockopt::linger, 0);
  deaf.connect(learner.endpoint());
  const std::string garbage(64, '\xff');  // each answered with a "cannot parse" Error of about 100 bytes
  for (int i = 0; i < 400000; ++i) deaf.send(zmq::buffer(garbage), zmq::send_flags::none);
  // Until the learner has found its queue to "deaf" full (a blocking send would never get there)...
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (log.Count("message to deaf dropped", "does not read") == 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (log.Count("message to deaf dropped", "does not read") == 0) {
    // The I/O thread is stuck in a send for good: nothing can be unwound.
    std::fprintf(stderr, "FAILED: the learner never dropped a message to the client that does not read\n");
    std::_Exit(1);
  }
  // ...then the good client is still served.
  for (uint64_t seq = 1; seq <= 5; ++seq) ServeGood(good, seq);
  learner.Stop();
  CHECK(learner.summary()["replies_dropped"].get<int64_t>() > 0);
}

TEST_CASE("the learner stops while clients keep sending into a full queue", "[learner][protocol]") {
  // The smallest queue that admits a worker of two groups (16 slots are kept for control messages).
  auto learner = std::make_unique<ServedLearner>([](FarmConfig& c) { c.batcher.queue_capacity = 18; });
  const Space obs = Space::Box({3}, {-1.f}, {1.f});
  const Space act = Space::Discrete(4);
  Client chatty(learner->endpoint(), "chatty");
  Join(chatty, obs, act);
  ServeGood(chatty, 0);
  // Heartbeats (the I/O thread answers them) and requests out of turn (queued, each refused), as fast as they go
  // and never read: the queue is full most of the time, and the I/O thread refuses what does not fit.
  std::atomic<bool> done{false};
  std::thread flood([&] {
    wire::Envelope beat;
    beat.mutable_heartbeat();
    const wire::Envelope out_of_turn = Step(0, 7, 4, 3, true);
    while (!done.load()) {
      (void)chatty.TrySend(beat);
      (void)chatty.TrySend(out_of_turn);
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto stopped = std::async(std::launch::async, [&] { learner->Stop(); });
  const bool in_time = stopped.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  done.store(true);
  flood.join();
  if (!in_time) {
    // The learner's threads are stuck for good: nothing can be unwound.
    std::fprintf(stderr, "FAILED: the learner did not stop within 30 s with a full queue\n");
    std::_Exit(1);
  }
  CHECK(in_time);
}

TEST_CASE("an exception while serving stops the run: final checkpoint, Stop to the workers, an internal error",
          "[learner][protocol]") {
  ServedLearner learner([](FarmConfig& c) {
    c.learner.train = true;
    c.ppo.rollout_length = 4;
  });
  const Space obs = Space::Box({3}, {-1.f}, {1.f});
  const Space act = Space::Discrete(4);
  Client c(learner.endpoint(), "c");
  Join(c, obs, act);
  ServeGood(c, 0);
  ServeGood(c, 1);
  learner.learner().TEST_FailNextBatch();
  c.Send(Step(0, 2, 4, 3, true));  // in the first batch with work in it, which fails: never answered with actions
  const auto reply = c.Receive();
  REQUIRE(reply.has_stop());
  CHECK_THAT(reply.stop().reason(), Catch::Contains("internal error: injected fault"));
  const Status s = learner.Wait();
  CHECK(s.code() == Status::Code::kInternal);
  CHECK_THAT(s.ToString(), Catch::Contains("injected fault"));
  CHECK_THAT(learner.summary().value("stop_reason", ""), Catch::Contains("internal error: injected fault"));
  // Nothing learned is lost: the final checkpoint and summary.json are written as on any other stop.
  std::string checkpoint;
  CHECK(FindLatestValidCheckpoint(learner.run_dir() + "/checkpoints", &checkpoint, nullptr).ok());
  CHECK(std::filesystem::exists(learner.run_dir() + "/summary.json"));
}

TEST_CASE("an oversized message costs its sender the connection, not the learner or others",
          "[learner][protocol]") {
  LogCapture log;  // before the learner's threads start
  ServedLearner learner([](FarmConfig& c) {
    c.transport.max_message_bytes = 8192;
    c.transport.heartbeat_interval_s = 0.1;
    c.transport.heartbeat_timeout_s = 1.0;
  });
  const Space obs = Space::Box({3}, {-1.f}, {1.f});
  const Space act = Space::Discrete(4);
  Client good(learner.endpoint(), "good");
  Join(good, obs, act);
  uint64_t good_seq = 0;
  ServeGood(good, good_seq++);

  // A layout whose requests could exceed the limit is refused at the handshake, naming the key.
  Client wide(learner.endpoint(), "wide");
  wide.Send(Hello(Space::Box({200}, {-1.f}, {1.f}), act, 8, 1, kProtocolVersion));  // 8 x 200 floats, twice
  const auto refusal = wide.Receive();
  REQUIRE(refusal.has_welcome());
  REQUIRE_FALSE(refusal.welcome().accepted());
  CHECK_THAT(refusal.welcome().error(), Catch::Contains("transport.max_message_bytes (8192)"));

  // A worker that joins, then sends more than the limit: ZeroMQ drops its connection, the message with it.
  Client big(learner.endpoint(), "big");
  Join(big, obs, act);
  wire::Envelope huge = Step(0, 0, 4, 3, false);
  huge.mutable_step()->mutable_obs()->mutable_data()->append(20000, '\0');
  big.Send(huge);
  // The good client goes on being served; "big", silent from now on, is dropped after the heartbeat timeout
  // (waited for, up to 60 s: a busy machine may check late).
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (log.Count("dropped worker big:", "silent") == 0 && std::chrono::steady_clock::now() < until) {
    ServeGood(good, good_seq++);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(log.Count("dropped worker big:", "silent") == 1);

  learner.Stop();
  const auto& s = learner.summary();
  CHECK(s["workers_lost"].get<int>() == 1);       // "big", by the heartbeat timeout
  CHECK(s["workers_active"].get<int>() == 1);     // "good"
  CHECK(s["connections_closed"].get<int>() >= 1);  // the dropped connection, seen by the monitor
  CHECK(s["protocol_errors"].get<int>() == 1);    // the refused handshake; the oversized message never arrived
}

namespace {

// A multi-agent Step: `rows` agent rows of envs of 3 agents with a [2, 2] global state of `state_value` per env
// (protocol 3); with results, the rows in `truncated_rows` (whole envs) are truncated, each with a final
// observation, and a final global state per truncated env.
wire::Envelope TeamStep(uint32_t group, uint64_t seq, int64_t rows, float state_value,
                        const std::vector<int>& truncated_rows = {}) {
  wire::Envelope e = Step(group, seq, rows, 3, seq > 0);
  auto* s = e.mutable_step();
  const int64_t envs = rows / 3;
  const std::vector<float> state(static_cast<std::size_t>(envs * 4), state_value);
  SetTensor(s->mutable_global_state(), DType::kFloat32, {envs, 2, 2}, state.data(), state.size() * 4);
  if (seq > 0 && !truncated_rows.empty()) {
    const auto k = static_cast<int64_t>(truncated_rows.size());
    for (int row : truncated_rows) {
      (*s->mutable_truncated())[static_cast<std::size_t>(row)] = 1;
      s->add_final_obs_index(row);
    }
    const std::vector<float> final_obs(static_cast<std::size_t>(k * 3), 0.1f);
    SetTensor(s->mutable_final_obs(), DType::kFloat32, {k, 3}, final_obs.data(), final_obs.size() * 4);
    const std::vector<float> final_state(static_cast<std::size_t>(k / 3 * 4), 0.75f);
    SetTensor(s->mutable_final_global_state(), DType::kFloat32, {k / 3, 2, 2}, final_state.data(),
              final_state.size() * 4);
    s->add_episodes()->set_episode_return(1.0f);
  }
  return e;
}

}  // namespace

TEST_CASE("a multi-agent worker's global states reach the centralised critic, steps count envs and agents",
          "[learner][protocol][multi_agent]") {
  // Training, so that states are stored, bootstrapped and trained on: 2 steps per rollout.
  ServedLearner learner([](FarmConfig& c) {
    c.learner.train = true;
    c.ppo.rollout_length = 2;
    c.ppo.hidden_sizes = {8};
  });
  const Space obs = Space::Box({3}, {-1.f}, {1.f});
  const Space act = Space::Discrete(2);
  const Space state = Space::Box({2, 2}, {0.f}, {1.f});
  // 4 envs of 3 agents in 2 groups: 6 rows per request, with a [2, 2] state per env.
  Client team(learner.endpoint(), "team");
  wire::Envelope hello = Hello(obs, act, 4, 2, kProtocolVersion);
  hello.mutable_hello()->set_num_agents(3);
  ToWire(state, hello.mutable_hello()->mutable_global_state());
  team.Send(hello);
  const auto welcome = team.Receive();
  INFO(welcome.welcome().error());
  REQUIRE(welcome.welcome().accepted());
  // seq 0 and 1 of both groups are answered at once; seq 2 fills the rollout, so its answers come after
  // the update (sync mode). Group 0's env 1 (rows 3-5) is truncated at seq 2: its final state bootstraps.
  for (uint64_t seq = 0; seq < 3; ++seq) {
    for (uint32_t group = 0; group < 2; ++group)
      team.Send(TeamStep(group, seq, 6, 0.25f, seq == 2 && group == 0 ? std::vector<int>{3, 4, 5}
                                                                       : std::vector<int>{}));
    for (int i = 0; i < 2; ++i) {
      const auto reply = team.Receive();
      INFO(reply.DebugString());
      REQUIRE(reply.has_action());
      CHECK(reply.action().seq() == seq);
      CHECK(CheckTensor(reply.action().action(), DType::kInt64, {6}, "action").ok());  // an action per agent row
    }
  }
  // A state of the wrong shape, a request without one, and final observations without final states.
  auto refused = [&](wire::Envelope step, const std::string& what) {
    team.Send(step);
    const auto error = team.Receive();
    REQUIRE(error.has_error());
    CHECK_THAT(error.error().message(), Catch::Contains(what));
  };
  wire::Envelope wrong = TeamStep(1, 3, 6, 0.5f);
  const std::vector<float> small(2 * 3, 0.5f);
  SetTensor(wrong.mutable_step()->mutable_global_state(), DType::kFloat32, {2, 3}, small.data(), small.size() * 4);
  refused(wrong, "StepRequest.global_state: expected float32 [2, 2, 2], got float32 [2, 3]");
  wire::Envelope missing = TeamStep(1, 3, 6, 0.5f);
  missing.mutable_step()->clear_global_state();
  refused(missing, "StepRequest.global_state: expected float32 [2, 2, 2]");
  wire::Envelope no_final = TeamStep(1, 3, 6, 0.5f, {0, 1, 2});
  no_final.mutable_step()->clear_final_global_state();
  refused(no_final, "StepRequest.final_global_state: expected float32 [1, 2, 2]");
  // A state per agent row (protocol 2's layout) is refused: one per env.
  wire::Envelope per_row = TeamStep(1, 3, 6, 0.5f);
  const std::vector<float> rows_state(6 * 4, 0.5f);
  SetTensor(per_row.mutable_step()->mutable_global_state(), DType::kFloat32, {6, 2, 2}, rows_state.data(),
            rows_state.size() * 4);
  refused(per_row, "StepRequest.global_state: expected float32 [2, 2, 2], got float32 [6, 2, 2]");
  // A request with a row per env rather than per agent is refused.
  refused(TeamStep(0, 3, 2, 0.5f), "StepRequest.obs: expected float32 [6, 3]");

  // Other workers must bring the same team and state: another agent count, another state, or none.
  auto refused_hello = [&](const std::string& id, uint32_t agents, const std::optional<Space>& s,
                           const std::string& what) {
    Client other(learner.endpoint(), id);
    wire::Envelope h = Hello(obs, act, 4, 2, kProtocolVersion);
    h.mutable_hello()->set_num_agents(agents);
    if (s) ToWire(*s, h.mutable_hello()->mutable_global_state());
    other.Send(h);
    const auto refusal = other.Receive();
    REQUIRE(refusal.has_welcome());
    REQUIRE_FALSE(refusal.welcome().accepted());
    CHECK_THAT(refusal.welcome().error(), Catch::Contains(what));
  };
  refused_hello("pair", 2, state, "2 agent(s) per env and global state Box(float32, shape=[2, 2])");
  refused_hello("big-state", 3, Space::Box({3, 3}, {0.f}, {1.f}),
                "this run's workers have 3 and Box(float32, shape=[2, 2])");
  refused_hello("no-state", 3, std::nullopt, "global state none");

  // A worker of protocol 1 (before multi-agent envs) is told why it is refused.
  Client old(learner.endpoint(), "old");
  old.Send(Hello(obs, act, 4, 2, 1));
  const auto refusal = old.Receive();
  REQUIRE(refusal.has_welcome());
  REQUIRE_FALSE(refusal.welcome().accepted());
  CHECK_THAT(refusal.welcome().error(), Catch::Contains("protocol version 1 is not supported (expected 3)"));

  learner.Stop();
  const auto& s = learner.summary();
  INFO(s.dump());
  CHECK(s["updates"].get<int>() == 1);
  // Two steps of results per group: 2 x 2 groups x 2 envs = 8 env steps, x 3 agents = 24 agent steps.
  CHECK(s["env_steps"].get<int64_t>() == 8);
  CHECK(s["agent_steps"].get<int64_t>() == 24);
  CHECK(s["num_agents"].get<int>() == 3);
  CHECK(s["num_envs"].get<int>() == 4);
  CHECK(s["episodes"].get<int>() == 1);
}

TEST_CASE("two learners never share a run directory", "[learner][run_dir]") {
  const std::filesystem::path base =
      std::filesystem::temp_directory_path() / ("farm-protocol-run-dir-" + std::to_string(::getpid()));
  std::filesystem::create_directories(base);
  FarmConfig config;
  config.learner.train = false;
  config.learner.progress_interval_s = 3600;

  SECTION("a run_dir in use (a new run, or --resume of a live one) is refused, naming it") {
    config.run_dir = (base / "run").string();
    std::unique_ptr<Learner> first, second;
    REQUIRE(Learner::Create(config, &first).ok());
    const Status s = Learner::Create(config, &second);
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.message(), Catch::Contains("run_dir '" + config.run_dir + "' is in use by another farm-learner"));
    first.reset();  // gone (as after a crash: the lock goes with the process): the directory is free again
    CHECK(Learner::Create(config, &second).ok());
  }
  SECTION("default run directories are distinct even within one second") {
    // runs/<name>-<timestamp> is named to the second: take every name of the next half minute beforehand.
    const auto old_cwd = std::filesystem::current_path();
    std::filesystem::current_path(base);
    std::vector<std::string> taken;
    const std::time_t now = std::time(nullptr);
    for (std::time_t t = now - 1; t <= now + 30; ++t) {
      std::tm tm{};
      localtime_r(&t, &tm);
      char stamp[32];
      std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
      taken.push_back(std::string("runs/collide-") + stamp);
      std::filesystem::create_directories(taken.back());
    }
    config.name = "collide";
    std::unique_ptr<Learner> first, second;
    const Status s1 = Learner::Create(config, &first);
    const Status s2 = Learner::Create(config, &second);
    std::filesystem::current_path(old_cwd);
    REQUIRE(s1.ok());
    REQUIRE(s2.ok());
    CHECK(first->run_dir() != second->run_dir());
    CHECK(std::find(taken.begin(), taken.end(), first->run_dir()) == taken.end());
    CHECK(std::find(taken.begin(), taken.end(), second->run_dir()) == taken.end());
  }
  (void)RemoveTree(base.string());
}

TEST_CASE("a learner that cannot bind its port says so and leaves no run directory", "[learner][run_dir]") {
  const std::filesystem::path base =
      std::filesystem::temp_directory_path() / ("farm-protocol-port-busy-" + std::to_string(::getpid()));
  std::filesystem::create_directories(base);
  zmq::context_t ctx;
  zmq::socket_t holder(ctx, zmq::socket_type::router);  // holds the port
  holder.set(zmq::sockopt::linger, 0);
  holder.bind("tcp://127.0.0.1:*");
  const std::string busy = holder.get(zmq::sockopt::last_endpoint);
  FarmConfig config;
  config.learner.train = false;
  config.transport.bind = busy;
  std::unique_ptr<Learner> learner;

  config.run_dir = (base / "run").string();
  const Status s = Learner::Create(config, &learner);
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains("transport.bind: cannot bind " + busy));
  CHECK_THAT(s.message(), Catch::Contains("Address already in use"));
  CHECK_FALSE(std::filesystem::exists(config.run_dir));

  // The default run directory (runs/<name>-<timestamp>) is not created either.
  config.run_dir.clear();
  const auto old_cwd = std::filesystem::current_path();
  std::filesystem::current_path(base);
  const Status s2 = Learner::Create(config, &learner);
  std::filesystem::current_path(old_cwd);
  CHECK_FALSE(s2.ok());
  CHECK_FALSE(std::filesystem::exists(base / "runs"));
  (void)RemoveTree(base.string());
}

TEST_CASE("a busy learner stops with the reason RequestStop was given", "[learner][protocol]") {
  // The reason is what summary.json's stop_reason and the log show for a Ctrl-C ("interrupted (SIGINT)"). A learner
  // that checks for a stop after every batch used to see the request before the queued stop item that carries
  // its reason, and recorded "stop requested".
  for (int attempt = 0; attempt < 5; ++attempt) {
    ServedLearner learner;
    const Space obs = Space::Box({3}, {-1.f}, {1.f});
    const Space act = Space::Discrete(4);
    Client chatty(learner.endpoint(), "chatty");
    Join(chatty, obs, act);
    ServeGood(chatty, 0);
    std::atomic<bool> done{false};
    std::thread flood([&] {  // one batch after another
      wire::Envelope beat;
      beat.mutable_heartbeat();
      while (!done.load()) (void)chatty.TrySend(beat);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    learner.Stop();
    done.store(true);
    flood.join();
    CHECK(learner.summary()["stop_reason"] == "test done");
  }
}

namespace farm {

TEST_CASE("slow is not dead: a stalled inference thread keeps its workers, answers heartbeats and says so",
          "[learner][protocol][liveness]") {
  LogCapture log;  // before the learner's threads start
  ServedLearner learner([](FarmConfig& c) {
    c.transport.heartbeat_interval_s = 0.1;
    c.transport.heartbeat_timeout_s = 1.0;  // the stall below lasts 3 s: three times the timeout
    c.learner.stall_warn_s = 1.0;
  });
  const Space obs = Space::Box({3}, {-1.f}, {1.f});
  const Space act = Space::Discrete(4);
  Client c(learner.endpoint(), "patient");
  Join(c, obs, act);
  ServeGood(c, 0);
  learner.learner().TEST_StallNextBatch(3.0);
  const auto t0 = std::chrono::steady_clock::now();
  c.Send(Step(0, 1, 4, 3, true));  // lands in the stalled batch: its answer comes after the stall
  // Meanwhile the worker's heartbeats are answered at once (by the I/O thread), every one of them.
  int answered = 0;
  for (int i = 0; i < 20; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    wire::Envelope beat;
    beat.mutable_heartbeat();
    c.Send(beat);
    const auto reply = c.Receive();
    if (reply.has_action()) break;  // the stall is over
    REQUIRE(reply.has_heartbeat());
    ++answered;
  }
  CHECK(answered >= 15);
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(1500));
  // After the stall the worker is served as if nothing happened: not dropped, the next step answered.
  wire::Envelope reply;
  do {
    reply = c.Receive();  // the step's answer (if the loop above did not take it), after heartbeats
  } while (reply.has_heartbeat());
  ServeGood(c, 2);
  for (int i = 0; i < 15; ++i) {  // the I/O thread looks once a second; a worker waiting sends heartbeats
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    wire::Envelope beat;
    beat.mutable_heartbeat();
    c.Send(beat);
    REQUIRE(c.Receive().has_heartbeat());
  }
  learner.Stop();
  const auto& s = learner.summary();
  CHECK(s["workers_lost"].get<int>() == 0);
  CHECK(s["heartbeats_answered"].get<int>() >= 15);
  // The log said which thread stalled, in what, for how long, and when it came back.
  CHECK(log.Count("the learner's inference thread has been busy for", "in an injected stall") >= 1);
  CHECK(log.Count("the learner's inference thread is back from", "an injected stall") == 1);
}

}  // namespace farm

namespace farm {

TEST_CASE("a stop requested during a stalled serve ends the run as soon as the batch is done", "[learner][protocol]") {
  ServedLearner learner([](FarmConfig& c) {
    c.learner.train = true;
    c.ppo.rollout_length = 64;
  });
  const Space obs = Space::Box({3}, {-1.f}, {1.f});
  const Space act = Space::Discrete(4);
  Client c(learner.endpoint(), "c");
  Join(c, obs, act);
  ServeGood(c, 0);
  learner.learner().TEST_StallNextBatch(2.0);
  c.Send(Step(0, 1, 4, 3, true));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // inside the stall
  const auto t0 = std::chrono::steady_clock::now();
  learner.learner().RequestStop("stop during a stall");
  const Status s = learner.Wait();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(s.ok());
  CHECK(took < 5.0);  // the rest of the stall (1.5 s), then the final checkpoint and summary
  CHECK(learner.summary().value("stop_reason", "") == "stop during a stall");
  std::string checkpoint;
  CHECK(FindLatestValidCheckpoint(learner.run_dir() + "/checkpoints", &checkpoint, nullptr).ok());
}

}  // namespace farm
