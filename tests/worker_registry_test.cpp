// WorkerRegistry, Liveness and ThreadActivity without sockets: who may join, which requests are used, who
// counts as silent, and what a thread reports it is busy with.
#include "learner/serve/worker_registry.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <thread>

#include "learner/serve/liveness.h"

namespace farm {
namespace {

const Space kObs = Space::Box({3}, {-1.f}, {1.f});
const Space kAct = Space::Discrete(4);

// A Hello of `envs` envs in `groups` groups of the test env, the current protocol.
wire::Hello MakeHello(uint32_t envs = 8, uint32_t groups = 2, const Space& obs = kObs) {
  wire::Hello h;
  h.set_protocol_version(kProtocolVersion);
  h.set_worker_id("w");
  h.set_env_name("Test-v0");
  h.set_num_envs(envs);
  h.set_num_groups(groups);
  ToWire(obs, h.mutable_observation());
  ToWire(kAct, h.mutable_action());
  return h;
}

wire::StepRequest MakeStep(uint32_t group, uint64_t seq, int64_t rows, bool results, float value = 0.5f) {
  wire::StepRequest s;
  s.set_group(group);
  s.set_seq(seq);
  s.set_first(seq == 0);
  const std::vector<float> obs(static_cast<std::size_t>(rows * 3), value);
  SetTensor(s.mutable_obs(), DType::kFloat32, {rows, 3}, obs.data(), obs.size() * 4);
  if (results) {
    const std::vector<float> reward(static_cast<std::size_t>(rows), 1.f);
    SetTensor(s.mutable_reward(), DType::kFloat32, {rows}, reward.data(), reward.size() * 4);
    s.set_terminated(std::string(static_cast<std::size_t>(rows), '\0'));
    s.set_truncated(std::string(static_cast<std::size_t>(rows), '\0'));
  }
  return s;
}

FarmConfig Config() {
  FarmConfig c;
  c.batcher.queue_capacity = 64;
  return c;
}

}  // namespace

TEST_CASE("WorkerRegistry: who may join", "[registry]") {
  FarmConfig config = Config();
  WorkerRegistry registry(config);
  const NormalizerOptions none;
  Handshake hs;
  REQUIRE(registry.CheckHello("a", MakeHello(), none, &hs).ok());
  CHECK(hs.group_size == 4);
  registry.SetRun(RunSpec{"Test-v0", kObs, kAct, 1, std::nullopt});
  registry.Add("a", hs, {0, 1});
  CHECK(registry.size() == 1);
  CHECK(registry.total_groups() == 2);

  auto refused = [&](const std::string& id, const wire::Hello& h, const std::string& why) {
    Handshake out;
    const Status s = registry.CheckHello(id, h, none, &out);
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.message(), Catch::Contains(why));
  };
  refused("a", MakeHello(), "this worker id already said hello");
  refused("b", MakeHello(8, 2, Space::Box({4}, {-1.f}, {1.f})), "does not match this run's Test-v0");
  wire::Hello old = MakeHello();
  old.set_protocol_version(2);
  refused("b", old, "protocol version 2 is not supported (expected 3)");
  // The queue must hold one request per group: 64 slots, 16 kept for control, 2 taken: 46 more groups fit.
  Handshake fits;
  CHECK(registry.CheckHello("b", MakeHello(46, 46), none, &fits).ok());
  refused("b", MakeHello(47, 47), "would make 49 groups in the run, more than batcher.queue_capacity (64)");
  // Preprocessing must be the learner's.
  wire::Hello normalising = MakeHello();
  NormalizerOptions{true, false}.ToWire(normalising.mutable_normalization());
  refused("b", normalising, "normalize_obs");
  // A layout whose messages could exceed transport.max_message_bytes is refused before anything is built.
  config.transport.max_message_bytes = 4096;
  WorkerRegistry small(config);
  Handshake out;
  const Status s = small.CheckHello("c", MakeHello(512, 1), none, &out);
  CHECK_THAT(s.message(), Catch::Contains("transport.max_message_bytes (4096)"));

  const auto gone = registry.Remove("a");
  REQUIRE(gone);
  CHECK(gone->store_group == std::vector<int>{0, 1});
  CHECK(registry.total_groups() == 0);
  CHECK_FALSE(registry.Remove("a"));
}

TEST_CASE("WorkerRegistry: a request is used in order, results only for actions sent", "[registry]") {
  WorkerRegistry registry(Config());
  Handshake hs;
  REQUIRE(registry.CheckHello("a", MakeHello(), NormalizerOptions{}, &hs).ok());
  registry.SetRun(RunSpec{"Test-v0", kObs, kAct, 1, std::nullopt});
  WorkerState& ws = registry.Add("a", hs, {0, 1});
  CHECK(registry.CheckStep(ws, MakeStep(0, 0, 4, false)).ok());
  WorkerRegistry::Accept(ws, MakeStep(0, 0, 4, false));
  // Results before the learner sent actions for that group: refused, naming the group.
  CHECK_THAT(registry.CheckStep(ws, MakeStep(0, 1, 4, true)).message(),
             Catch::Contains("group 0: step results before the learner sent actions"));
  WorkerRegistry::MarkActed(ws, 0);
  CHECK(registry.CheckStep(ws, MakeStep(0, 1, 4, true)).ok());
  // Out of order, and the wrong shape.
  CHECK_FALSE(registry.CheckStep(ws, MakeStep(0, 5, 4, true)).ok());
  CHECK_THAT(registry.CheckStep(ws, MakeStep(1, 0, 3, false)).message(), Catch::Contains("StepRequest.obs"));
}

TEST_CASE("WorkerRegistry: learner.non_finite rejects or sanitises", "[registry]") {
  FarmConfig config = Config();
  WorkerRegistry reject(config);
  config.learner.non_finite = "sanitize";
  WorkerRegistry sanitize(config);
  for (WorkerRegistry* r : {&reject, &sanitize}) {
    Handshake hs;
    REQUIRE(r->CheckHello("a", MakeHello(), NormalizerOptions{}, &hs).ok());
    r->SetRun(RunSpec{"Test-v0", kObs, kAct, 1, std::nullopt});
    r->Add("a", hs, {0, 1});
  }
  wire::StepRequest bad = MakeStep(0, 0, 4, false, std::nanf(""));
  int64_t replaced = 0;
  const Status refused = reject.AdmitNonFinite(*reject.Find("a"), &bad, &replaced);
  CHECK_THAT(refused.message(), Catch::Contains("non-finite value StepRequest.obs[0] = nan"));
  CHECK(replaced == 0);
  CHECK(sanitize.AdmitNonFinite(*sanitize.Find("a"), &bad, &replaced).ok());
  CHECK(replaced == 12);
  NonFinite first;
  CHECK_FALSE(FindNonFinite(bad, &first));
}

TEST_CASE("Liveness: silent means nothing heard, whatever the inference thread did", "[liveness]") {
  Liveness live;
  const auto t0 = Liveness::Clock::now();
  live.Admit("a", t0);
  live.Admit("b", t0);
  CHECK_FALSE(live.Heard("stranger", t0));  // not admitted: its heartbeat is not answered as a worker's
  CHECK(live.Heard("a", t0 + std::chrono::seconds(8)));
  CHECK(live.SilentFor(10, t0 + std::chrono::seconds(5)).empty());
  CHECK(live.SilentFor(10, t0 + std::chrono::seconds(11)) == std::vector<std::string>{"b"});
  CHECK(live.SilentFor(10, t0 + std::chrono::seconds(19)).size() == 2);
  // An older arrival never moves the clock back (the I/O thread's times are in order; this is a guard).
  CHECK(live.Heard("a", t0));
  CHECK(live.SilentFor(10, t0 + std::chrono::seconds(11)) == std::vector<std::string>{"b"});
  live.Forget("b");
  CHECK(live.size() == 1);
  CHECK(live.SilentFor(10, t0 + std::chrono::seconds(11)).empty());
}

TEST_CASE("Liveness: the time the learner itself did not run is not the workers' silence", "[liveness]") {
  using std::chrono::milliseconds;
  using std::chrono::seconds;
  Liveness live;
  const auto t0 = Liveness::Clock::now();
  const auto wait = seconds(1);  // the I/O thread's longest wait for a message
  // A turn: the wait began `from` and ended `to` (the next one begins at once).
  const auto turn = [&](Liveness::Clock::time_point from, Liveness::Clock::time_point to) {
    return live.Listening(from, wait, to);
  };
  live.Admit("a", t0);
  live.Admit("b", t0);
  CHECK(turn(t0, t0 + milliseconds(300)) == 0);  // a message arrived
  CHECK(turn(t0 + milliseconds(300), t0 + milliseconds(1300)) == 0);  // a full wait
  CHECK(turn(t0 + milliseconds(1400), t0 + milliseconds(1500)) == 0);  // 100 ms to handle a message: ordinary
  CHECK(live.Heard("a", t0 + milliseconds(1500)));
  // The process is stopped for 20 s in a wait. Checked on waking, before the I/O thread turns: silence counts up
  // to its last turn, so no one is dropped.
  CHECK(live.SilentFor(10, t0 + seconds(21)).empty());
  // Its first turn after waking finds 20 s beyond its wait of 1 s: a stop, so every worker counts as heard then
  // (t0 + 22.5), with a whole timeout to show up again.
  CHECK(turn(t0 + milliseconds(1500), t0 + milliseconds(22500)) == Approx(20.0));
  CHECK(live.SilentFor(10, t0 + milliseconds(22500)).empty());
  CHECK(live.Heard("a", t0 + seconds(25)));
  auto last = t0 + milliseconds(22500);
  const auto turns_until = [&](int end) {
    for (int t = static_cast<int>(std::chrono::duration_cast<seconds>(last - t0).count()) + 1; t <= end; ++t) {
      CHECK(turn(last, t0 + seconds(t)) == 0);
      last = t0 + seconds(t);
    }
  };
  turns_until(32);
  CHECK(live.SilentFor(10, t0 + seconds(32)).empty());
  // A shorter stretch (0.6 s while handling a message, between two waits) is credited as it is: b goes from
  // t0 + 22.5 to t0 + 23.1, a from t0 + 25 to t0 + 25.6.
  CHECK(turn(t0 + milliseconds(32600), t0 + seconds(33)) == Approx(0.6));
  last = t0 + seconds(33);
  CHECK(live.SilentFor(10, t0 + seconds(33)).empty());  // b: 9.9 s (10.5 without the credit)
  CHECK(turn(last, t0 + milliseconds(33500)) == 0);
  last = t0 + milliseconds(33500);
  CHECK(live.SilentFor(10, t0 + milliseconds(33500)) == std::vector<std::string>{"b"});
  turns_until(36);
  CHECK(live.SilentFor(10, t0 + seconds(36)).size() == 2);
}

TEST_CASE("WorkerConnection: a worker's later connections are told from other workers", "[registry]") {
  const auto of = [](const std::string& id) {
    const WorkerConnection c = WorkerConnection::Of(id);
    return std::make_pair(c.process, c.connection);
  };
  CHECK(of("worker-host-3-1234") == std::make_pair(std::string("worker-host-3-1234"), int64_t{0}));
  CHECK(of("worker-host-3-1234-c2") == std::make_pair(std::string("worker-host-3-1234"), int64_t{2}));
  CHECK(of("worker-host-c-3-1234") == std::make_pair(std::string("worker-host-c-3-1234"), int64_t{0}));
  CHECK(of("w-c") == std::make_pair(std::string("w-c"), int64_t{0}));
  CHECK(of("-c5") == std::make_pair(std::string("-c5"), int64_t{0}));
  CHECK(of("w-c1x") == std::make_pair(std::string("w-c1x"), int64_t{0}));
  CHECK(of("w-c99999999999999999999").second == 0);  // too many digits: not a connection number

  FarmConfig config = Config();
  WorkerRegistry registry(config);
  const NormalizerOptions none;
  Handshake hs;
  REQUIRE(registry.CheckHello("w1", MakeHello(), none, &hs).ok());
  registry.SetRun(RunSpec{"Test-v0", kObs, kAct, 1, std::nullopt});
  registry.Add("w1", hs, {0});
  registry.Add("w1-c3", hs, {1});
  registry.Add("w1-c1", hs, {2});
  registry.Add("w10", hs, {3});
  registry.Add("w2-c1", hs, {4});
  CHECK(registry.OtherConnections("w1-c4") == std::vector<std::string>{"w1", "w1-c1", "w1-c3"});
  CHECK(registry.OtherConnections("w1-c1") == std::vector<std::string>{"w1", "w1-c3"});
  CHECK(registry.OtherConnections("w2") == std::vector<std::string>{"w2-c1"});
  CHECK(registry.OtherConnections("w3").empty());
}

TEST_CASE("ThreadActivity: what a thread is busy with, nested activities resume", "[liveness]") {
  ThreadActivity activity;
  const auto now = ThreadActivity::Clock::now();
  CHECK_FALSE(activity.BusyAt(now));
  {
    ActivityScope outer(activity, "a batch");
    const auto busy = activity.BusyAt(ThreadActivity::Clock::now() + std::chrono::seconds(2));
    REQUIRE(busy);
    CHECK(std::string(busy->what) == "a batch");
    CHECK(busy->seconds >= 2.0);
    {
      ActivityScope inner(activity, "a checkpoint");
      CHECK(std::string(activity.BusyAt(ThreadActivity::Clock::now())->what) == "a checkpoint");
    }
    CHECK(std::string(activity.BusyAt(ThreadActivity::Clock::now())->what) == "a batch");
  }
  CHECK_FALSE(activity.BusyAt(ThreadActivity::Clock::now()));
}

}  // namespace farm
