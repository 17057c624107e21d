// Wire protocol: every message survives a protobuf round trip; receivers'
// checks reject tensors that contradict what was announced.
#include <catch2/catch.hpp>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string_view>
#include <vector>

#include "common/log_limit.h"
#include "common/non_finite.h"
#include "common/protobuf_log.h"
#include "common/wire.h"

using namespace farm;

namespace {
wire::Envelope RoundTrip(const wire::Envelope& in) {
  const std::string bytes = Encode(in);
  wire::Envelope out;
  REQUIRE(Decode(bytes.data(), bytes.size(), &out).ok());
  REQUIRE(out.SerializeAsString() == bytes);
  return out;
}
}  // namespace

TEST_CASE("Hello round trip keeps spaces exactly", "[wire]") {
  wire::Envelope e;
  auto* h = e.mutable_hello();
  h->set_protocol_version(kProtocolVersion);
  h->set_worker_id("worker-3");
  h->set_env_name("CartPole-v1");
  h->set_num_envs(64);
  h->set_num_groups(2);
  const Space obs = Space::Box({4}, {-4.8f, -1e30f, -0.42f, -1e30f}, {4.8f, 1e30f, 0.42f, 1e30f});
  const Space act = Space::Discrete(2);
  ToWire(obs, h->mutable_observation());
  ToWire(act, h->mutable_action());
  const auto out = RoundTrip(e);
  REQUIRE(out.has_hello());
  CHECK(out.hello().worker_id() == "worker-3");
  CHECK(out.hello().num_envs() == 64);
  Space obs2, act2;
  REQUIRE(FromWire(out.hello().observation(), &obs2).ok());
  REQUIRE(FromWire(out.hello().action(), &act2).ok());
  CHECK(obs2 == obs);
  CHECK(act2 == act);
  CHECK(obs2.numel() == 4);
}

TEST_CASE("StepRequest round trip carries raw tensor bytes", "[wire]") {
  wire::Envelope e;
  auto* s = e.mutable_step();
  s->set_group(1);
  s->set_seq(42);
  const std::vector<float> obs = {0.1f, -0.2f, 0.3f, -0.4f, 1.5f, 2.5f, 3.5f, 4.5f};
  const std::vector<float> reward = {1.0f, 0.5f};
  SetTensor(s->mutable_obs(), DType::kFloat32, {2, 4}, obs.data(), obs.size() * 4);
  SetTensor(s->mutable_reward(), DType::kFloat32, {2}, reward.data(), reward.size() * 4);
  s->set_terminated(std::string("\x01\x00", 2));
  s->set_truncated(std::string("\x00\x01", 2));
  s->add_final_obs_index(1);
  SetTensor(s->mutable_final_obs(), DType::kFloat32, {1, 4}, obs.data() + 4, 16);
  auto* ep = s->add_episodes();
  ep->set_episode_return(500);
  ep->set_length(500);
  const auto out = RoundTrip(e);
  REQUIRE(out.has_step());
  const auto& r = out.step();
  CHECK(r.seq() == 42);
  REQUIRE(CheckTensor(r.obs(), DType::kFloat32, {2, 4}, "obs").ok());
  const auto* back = reinterpret_cast<const float*>(r.obs().data().data());
  CHECK(std::vector<float>(back, back + 8) == obs);
  CHECK(r.terminated()[0] == 1);
  CHECK(r.truncated()[1] == 1);
  CHECK(r.final_obs_index(0) == 1);
  CHECK(r.episodes(0).length() == 500);
}

TEST_CASE("ActionReply, Welcome, Stop and Error round trip", "[wire]") {
  wire::Envelope a;
  const std::vector<int64_t> actions = {0, 1, 1, 0};
  SetTensor(a.mutable_action()->mutable_action(), DType::kInt64, {4}, actions.data(), 32);
  a.mutable_action()->set_policy_version(7);
  a.mutable_action()->set_seq(3);
  auto a2 = RoundTrip(a);
  REQUIRE(CheckTensor(a2.action().action(), DType::kInt64, {4}, "action").ok());
  CHECK(a2.action().policy_version() == 7);

  wire::Envelope w;
  w.mutable_welcome()->set_accepted(false);
  w.mutable_welcome()->set_error("nope");
  CHECK(RoundTrip(w).welcome().error() == "nope");

  wire::Envelope st;
  st.mutable_stop()->set_reason("done");
  CHECK(RoundTrip(st).stop().reason() == "done");

  wire::Envelope er;
  er.mutable_error()->set_message("bad");
  er.mutable_error()->set_seq(9);
  CHECK(RoundTrip(er).error().seq() == 9);
}

TEST_CASE("Decode rejects garbage and empty envelopes", "[wire]") {
  wire::Envelope out;
  const std::string garbage = "\xff\xff\xff\xff\x0f garbage";
  auto s = Decode(garbage.data(), garbage.size(), &out);
  CHECK_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains("cannot parse"));
  auto empty = Decode("", 0, &out);
  CHECK_FALSE(empty.ok());
  CHECK_THAT(empty.message(), Catch::Contains("no body"));
}

TEST_CASE("CheckTensor says what was expected and what was seen", "[wire]") {
  wire::Tensor t;
  const std::vector<float> data(12, 0.0f);
  SetTensor(&t, DType::kFloat32, {3, 4}, data.data(), 48);
  CHECK(CheckTensor(t, DType::kFloat32, {3, 4}, "obs").ok());
  auto shape = CheckTensor(t, DType::kFloat32, {2, 4}, "obs");
  REQUIRE_FALSE(shape.ok());
  CHECK_THAT(shape.message(), Catch::Contains("obs: expected float32 [2, 4], got float32 [3, 4]"));
  auto dtype = CheckTensor(t, DType::kInt64, {3, 4}, "obs");
  REQUIRE_FALSE(dtype.ok());
  CHECK_THAT(dtype.message(), Catch::Contains("expected int64"));
  t.set_data(std::string(40, '\0'));  // truncated payload
  auto bytes = CheckTensor(t, DType::kFloat32, {3, 4}, "obs");
  REQUIRE_FALSE(bytes.ok());
  CHECK_THAT(bytes.message(), Catch::Contains("needs 48 bytes, got 40"));
}

TEST_CASE("FromWire rejects inconsistent spaces", "[wire]") {
  wire::Space s;
  s.set_kind(wire::Space::BOX);
  s.set_dtype(wire::FLOAT32);
  s.add_shape(3);
  s.add_low(0);  // 1 bound for 3 elements
  s.add_high(1);
  Space out;
  auto st = FromWire(s, &out);
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains("expected 3"));
  wire::Space d;
  d.set_kind(wire::Space::DISCRETE);
  d.set_n(0);
  CHECK_FALSE(FromWire(d, &out).ok());
  wire::Space unknown;
  CHECK_FALSE(FromWire(unknown, &out).ok());
}

// Found by tests/fuzz/wire_decode_fuzzer: dimensions whose product overflows int64 reached
// Space::numel() (undefined behaviour) and could wrap to a small count that the bounds then matched.
TEST_CASE("FromWire refuses spaces whose element count overflows", "[wire]") {
  Space out;
  wire::Space wrap;  // (2^62 + 1) * 4 wraps to 4, and 4 bounds are given
  wrap.set_kind(wire::Space::BOX);
  wrap.set_dtype(wire::FLOAT32);
  wrap.add_shape((int64_t{1} << 62) + 1);
  wrap.add_shape(4);
  for (int i = 0; i < 4; ++i) {
    wrap.add_low(0);
    wrap.add_high(1);
  }
  auto st = FromWire(wrap, &out);
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains("more than"));
  wire::Space zero;  // 2^32 * 2^32 wraps to 0, and no bounds are given
  zero.set_kind(wire::Space::BOX);
  zero.set_dtype(wire::FLOAT32);
  zero.add_shape(int64_t{1} << 32);
  zero.add_shape(int64_t{1} << 32);
  CHECK_FALSE(FromWire(zero, &out).ok());
  wire::Space discrete;
  discrete.set_kind(wire::Space::DISCRETE);
  discrete.set_n(kMaxSpaceElements + 1);
  CHECK_FALSE(FromWire(discrete, &out).ok());
}

TEST_CASE("Multi-discrete spaces round-trip and malformed ones are refused with the reason", "[wire]") {
  const Space md = Space::MultiDiscrete({3, 1, 7});
  wire::Space w;
  ToWire(md, &w);
  CHECK(w.kind() == wire::Space::MULTI_DISCRETE);
  Space back;
  REQUIRE(FromWire(w, &back).ok());
  CHECK(back == md);
  CHECK(back.shape == std::vector<int64_t>{3});

  auto refused = [](const std::vector<int64_t>& nvec, const char* why) {
    wire::Space bad;
    bad.set_kind(wire::Space::MULTI_DISCRETE);
    for (int64_t n : nvec) bad.add_nvec(n);
    Space out;
    const Status st = FromWire(bad, &out);
    INFO("nvec of " << nvec.size());
    REQUIRE_FALSE(st.ok());
    CHECK_THAT(st.message(), Catch::Contains(why));
  };
  refused({}, "1 to 4096 components");
  refused({2, 0}, "nvec[1] = 0");
  refused({2, -3}, "nvec[1] = -3");
  refused(std::vector<int64_t>(kMaxSpaceComponents + 1, 2), "got 4097");
  refused({kMaxSpaceElements, 1}, "nvec[1] = 1");  // the head's total width is bounded, not only each entry

  // A worker with a multi-discrete action is served; its replies carry 8 bytes per component and row.
  wire::Hello h;
  h.set_protocol_version(kProtocolVersion);
  h.set_num_envs(4);
  h.set_num_groups(1);
  ToWire(Space::Box({2}, {-1.f}, {1.f}), h.mutable_observation());
  ToWire(md, h.mutable_action());
  Handshake hs;
  REQUIRE(CheckHello(h, &hs).ok());
  CHECK(hs.action == md);
  // 100 int64 components per row against 100 float32 elements: 400 bytes more per row.
  const Space obs = Space::Box({1}, {0.f}, {1.f});
  const Space wide = Space::MultiDiscrete(std::vector<int64_t>(100, 2));
  CHECK(MaxSessionMessageBytes(1000, obs, wide) - MaxSessionMessageBytes(1000, obs, Space::Box({100}, {0}, {1})) ==
        1000 * 400);
}

TEST_CASE("CheckTensor refuses a shape whose byte count overflows", "[wire]") {
  wire::Tensor t;  // 2^31 * 2^31 * 4 float32 = 2^66 bytes, which wraps to 0: the empty payload must not pass
  SetTensor(&t, DType::kFloat32, {int64_t{1} << 31, int64_t{1} << 31, 4}, nullptr, 0);
  auto st = CheckTensor(t, DType::kFloat32, {int64_t{1} << 31, int64_t{1} << 31, 4}, "final_obs");
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains("too large"));
}

TEST_CASE("Decode refuses sizes protobuf cannot parse", "[wire]") {
  wire::Envelope out;
  const char byte = 0;
  auto st = Decode(&byte, std::size_t{1} << 31, &out);  // refused on its size alone: nothing is read
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains("larger than protobuf can parse"));
}

namespace {
wire::Hello GoodHello() {
  wire::Hello h;
  h.set_protocol_version(kProtocolVersion);
  h.set_num_envs(8);
  h.set_num_groups(2);
  ToWire(Space::Box({2, 3}, {-1.f}, {1.f}), h.mutable_observation());
  ToWire(Space::Discrete(4), h.mutable_action());
  return h;
}
}  // namespace

TEST_CASE("CheckHello accepts a worker the learner can serve and says why not otherwise", "[wire]") {
  Handshake hs;
  REQUIRE(CheckHello(GoodHello(), &hs).ok());
  CHECK(hs.group_size == 4);
  CHECK(hs.num_groups == 2);
  CHECK(hs.observation.numel() == 6);
  CHECK(hs.action.is_discrete());

  auto refused = [](wire::Hello h, const char* why) {
    Handshake out;
    const Status st = CheckHello(h, &out);
    REQUIRE_FALSE(st.ok());
    CHECK_THAT(st.message(), Catch::Contains(why));
  };
  wire::Hello h = GoodHello();
  h.set_protocol_version(kProtocolVersion + 1);
  refused(h, "protocol version");
  h = GoodHello();
  h.set_num_groups(3);
  refused(h, "positive multiple");
  h = GoodHello();
  h.set_num_envs(4000000000u);  // found by the fuzzer: the group size did not fit the learner's int
  h.set_num_groups(1);
  refused(h, "more than one worker may have");
  h = GoodHello();
  ToWire(Space::Discrete(3), h.mutable_observation());
  refused(h, "observation space must be a float32 box");
  h = GoodHello();
  h.mutable_action()->set_kind(wire::Space::BOX);
  h.mutable_action()->set_dtype(wire::INT64);
  h.mutable_action()->add_shape(1);
  h.mutable_action()->add_low(0);
  h.mutable_action()->add_high(1);
  refused(h, "action space must be discrete, multi-discrete or a float32 box");
}

TEST_CASE("CheckStepRequest holds a request to the handshake", "[wire]") {
  const std::vector<int64_t> obs_shape{3};
  const std::vector<uint64_t> next_seq{0, 5};
  const std::vector<float> obs(6, 0.5f), reward(2, 1.f);
  wire::StepRequest first;
  first.set_first(true);
  SetTensor(first.mutable_obs(), DType::kFloat32, {2, 3}, obs.data(), 24);
  CHECK(CheckStepRequest(first, 2, obs_shape, next_seq).ok());

  wire::StepRequest step;
  step.set_group(1);
  step.set_seq(5);
  SetTensor(step.mutable_obs(), DType::kFloat32, {2, 3}, obs.data(), 24);
  SetTensor(step.mutable_reward(), DType::kFloat32, {2}, reward.data(), 8);
  step.set_terminated(std::string(2, '\0'));
  step.set_truncated(std::string("\0\1", 2));
  step.add_final_obs_index(1);
  SetTensor(step.mutable_final_obs(), DType::kFloat32, {1, 3}, obs.data(), 12);
  CHECK(CheckStepRequest(step, 2, obs_shape, next_seq).ok());

  auto refused = [&](const wire::StepRequest& req, const char* why) {
    const Status st = CheckStepRequest(req, 2, obs_shape, next_seq);
    REQUIRE_FALSE(st.ok());
    CHECK_THAT(st.message(), Catch::Contains(why));
  };
  wire::StepRequest bad = step;
  bad.set_group(2);
  refused(bad, "group 2 out of range");
  bad = step;
  bad.set_seq(6);
  refused(bad, "out of order");
  bad = step;
  bad.set_first(true);
  refused(bad, "'first' must be set exactly on seq 0");
  bad = step;
  bad.set_truncated(std::string(1, '\0'));
  refused(bad, "terminated/truncated");
  bad = step;
  bad.set_final_obs_index(0, 2);
  refused(bad, "final_obs_index 2 out of range");
  bad = step;
  bad.add_final_obs_index(0);  // two indices, one final observation
  refused(bad, "StepRequest.final_obs: expected float32 [2, 3]");
}

TEST_CASE("CheckStepRequest: flags are 0 or 1, and final_obs_index is exactly the truncated rows, ascending",
          "[wire]") {
  // A group of 4 rows: row 0 terminated, rows 1 and 3 truncated, row 2 still running.
  const std::vector<int64_t> obs_shape{3};
  const std::vector<uint64_t> next_seq{5};
  const std::vector<float> obs(12, 0.5f), reward(4, 1.f);
  wire::StepRequest step;
  step.set_seq(5);
  SetTensor(step.mutable_obs(), DType::kFloat32, {4, 3}, obs.data(), 48);
  SetTensor(step.mutable_reward(), DType::kFloat32, {4}, reward.data(), 16);
  step.set_terminated(std::string("\1\0\0\0", 4));
  step.set_truncated(std::string("\0\1\0\1", 4));
  step.add_final_obs_index(1);
  step.add_final_obs_index(3);
  SetTensor(step.mutable_final_obs(), DType::kFloat32, {2, 3}, obs.data(), 24);
  REQUIRE(CheckStepRequest(step, 4, obs_shape, next_seq).ok());

  auto refused = [&](const wire::StepRequest& req, const char* why) {
    const Status st = CheckStepRequest(req, 4, obs_shape, next_seq);
    REQUIRE_FALSE(st.ok());
    CHECK(st.code() == Status::Code::kProtocol);
    CHECK_THAT(st.message(), Catch::Contains(why));
  };
  // Sets the final observations to `rows` (one each).
  auto finals = [&](wire::StepRequest* req, const std::vector<int32_t>& rows) {
    req->clear_final_obs_index();
    for (int32_t r : rows) req->add_final_obs_index(r);
    const auto k = static_cast<int64_t>(rows.size());
    SetTensor(req->mutable_final_obs(), DType::kFloat32, {k, 3}, obs.data(), static_cast<std::size_t>(k) * 12);
  };
  wire::StepRequest bad = step;
  SECTION("a flag byte other than 0 or 1") {
    (*bad.mutable_terminated())[2] = 2;
    refused(bad, "StepRequest.terminated: row 2 holds 2, expected 0 or 1");
    bad = step;
    (*bad.mutable_truncated())[1] = '\xff';
    refused(bad, "StepRequest.truncated: row 1 holds 255, expected 0 or 1");
  }
  SECTION("terminated and truncated on one row") {
    (*bad.mutable_terminated())[3] = 1;
    refused(bad, "StepRequest row 3: terminated and truncated both set");
  }
  SECTION("a row listed twice") {
    finals(&bad, {1, 1, 3});
    refused(bad, "StepRequest.final_obs_index: entry 1 (1) repeats entry 0 (1)");
  }
  SECTION("rows out of order") {
    finals(&bad, {3, 1});
    refused(bad, "StepRequest.final_obs_index: entry 1 (1) is below entry 0 (3), expected strictly ascending");
  }
  SECTION("a row that was not truncated") {
    finals(&bad, {1, 2, 3});
    refused(bad, "StepRequest.final_obs_index: entry 1 names row 2, which was not truncated (truncated[2] = 0)");
    finals(&bad, {0, 1, 3});
    refused(bad, "entry 0 names row 0, which was not truncated (truncated[0] = 0, terminated)");
  }
  SECTION("a truncated row left out") {
    finals(&bad, {1});
    refused(bad, "StepRequest.final_obs_index: row 3 was truncated but is not listed (2 truncated rows, 1 entries)");
    bad.clear_final_obs_index();
    bad.clear_final_obs();
    refused(bad, "row 1 was truncated but is not listed (2 truncated rows, 0 entries)");
  }
  SECTION("an index out of range names its entry") {
    finals(&bad, {1, 4});
    refused(bad, "StepRequest.final_obs_index 4 out of range [0, 4) at entry 1");
  }
}

TEST_CASE("CheckStepRequest: a multi-agent worker's truncated env lists every one of its agent rows", "[wire]") {
  // 2 envs x 2 agents: env 1 (rows 2 and 3) truncated, its flags on both rows.
  const std::vector<int64_t> obs_shape{3};
  const std::vector<uint64_t> next_seq{1};
  const std::vector<float> obs(12, 0.5f), reward(4, 1.f);
  wire::StepRequest step;
  step.set_seq(1);
  SetTensor(step.mutable_obs(), DType::kFloat32, {4, 3}, obs.data(), 48);
  SetTensor(step.mutable_reward(), DType::kFloat32, {4}, reward.data(), 16);
  step.set_terminated(std::string(4, '\0'));
  step.set_truncated(std::string("\0\0\1\1", 4));
  step.add_final_obs_index(2);
  step.add_final_obs_index(3);
  SetTensor(step.mutable_final_obs(), DType::kFloat32, {2, 3}, obs.data(), 24);
  REQUIRE(CheckStepRequest(step, 4, obs_shape, next_seq).ok());
  // One agent row of the env only: the other would be bootstrapped as terminal.
  wire::StepRequest bad = step;
  bad.clear_final_obs_index();
  bad.add_final_obs_index(2);
  SetTensor(bad.mutable_final_obs(), DType::kFloat32, {1, 3}, obs.data(), 12);
  const Status st = CheckStepRequest(bad, 4, obs_shape, next_seq);
  CHECK_THAT(st.message(), Catch::Contains("row 3 was truncated but is not listed"));
}

TEST_CASE("CheckStepRequest: active is absent or a 0/1 byte per row, and all 1 on a first request", "[wire]") {
  // 2 envs x 2 agents. Env 0: agent 1 terminated alone with this step (its row terminated, no longer acting).
  // Env 1: agent 0 finished earlier (inactive, reward 0), and the env goes on.
  const std::vector<int64_t> obs_shape{3};
  const std::vector<uint64_t> next_seq{4};
  const std::vector<float> obs(12, 0.5f), reward{1.f, 1.f, 0.f, 1.f};
  wire::StepRequest step;
  step.set_seq(4);
  SetTensor(step.mutable_obs(), DType::kFloat32, {4, 3}, obs.data(), 48);
  SetTensor(step.mutable_reward(), DType::kFloat32, {4}, reward.data(), 16);
  step.set_terminated(std::string("\0\1\0\0", 4));
  step.set_truncated(std::string(4, '\0'));
  step.set_active(std::string("\1\0\0\1", 4));
  REQUIRE(CheckStepRequest(step, 4, obs_shape, next_seq).ok());
  wire::StepRequest absent = step;
  absent.clear_active();
  CHECK(CheckStepRequest(absent, 4, obs_shape, next_seq).ok());  // every row acts

  auto refused = [&](const wire::StepRequest& req, const std::vector<uint64_t>& seq, const char* why) {
    const Status st = CheckStepRequest(req, 4, obs_shape, seq);
    REQUIRE_FALSE(st.ok());
    CHECK(st.code() == Status::Code::kProtocol);
    CHECK_THAT(st.message(), Catch::Contains(why));
  };
  wire::StepRequest bad = step;
  SECTION("a byte per row or none") {
    bad.set_active(std::string(3, '\1'));
    refused(bad, next_seq, "StepRequest.active: expected 4 bytes (one per row) or none, got 3");
    bad.set_active(std::string(8, '\1'));  // a byte per row of twice the envs: not this group's
    refused(bad, next_seq, "StepRequest.active: expected 4 bytes (one per row) or none, got 8");
  }
  SECTION("a byte other than 0 or 1") {
    (*bad.mutable_active())[3] = 2;
    refused(bad, next_seq, "StepRequest.active: row 3 holds 2, expected 0 or 1");
    bad = step;
    (*bad.mutable_active())[0] = '\xff';
    refused(bad, next_seq, "StepRequest.active: row 0 holds 255, expected 0 or 1");
  }
  SECTION("a first request acts on every row") {
    wire::StepRequest first;
    first.set_seq(0);
    first.set_first(true);
    SetTensor(first.mutable_obs(), DType::kFloat32, {4, 3}, obs.data(), 48);
    first.set_active(std::string(4, '\1'));
    CHECK(CheckStepRequest(first, 4, obs_shape, {0}).ok());
    first.set_active(std::string("\1\1\0\1", 4));
    refused(first, {0},
            "StepRequest.active: row 2 is 0 on a first request, expected 1 (every agent acts after a reset)");
    first.set_active(std::string("\1\1\3\1", 4));  // the values are checked on a first request too
    refused(first, {0}, "StepRequest.active: row 2 holds 3, expected 0 or 1");
  }
}

TEST_CASE("non-finite values are found at their first index and replaced by 0, message size bound", "[wire]") {
  // A group of 3 envs with 700-float observations: the obs tensor spans more than one 1024-float scan chunk.
  const int64_t n = 3, dim = 700;
  std::vector<float> obs(static_cast<std::size_t>(n * dim), 0.25f);
  wire::StepRequest req;
  SetTensor(req.mutable_obs(), DType::kFloat32, {n, dim}, obs.data(), obs.size() * 4);
  const std::vector<float> reward(3, 1.f);
  SetTensor(req.mutable_reward(), DType::kFloat32, {n}, reward.data(), 12);
  NonFinite first;
  CHECK_FALSE(FindNonFinite(req, &first));
  CHECK(SanitizeNonFinite(&req) == 0);

  auto set = [](wire::Tensor* t, int64_t i, float v) { std::memcpy(t->mutable_data()->data() + i * 4, &v, 4); };
  set(req.mutable_obs(), 1500, -std::numeric_limits<float>::infinity());  // second chunk, row 2
  set(req.mutable_obs(), 2099, std::nanf(""));
  set(req.mutable_reward(), 0, std::numeric_limits<float>::infinity());
  req.add_episodes()->set_episode_return(std::nanf(""));
  REQUIRE(FindNonFinite(req, &first));
  CHECK(first.field == "StepRequest.obs");
  CHECK(first.index == 1500);
  CHECK(first.ToString(dim) == "StepRequest.obs[1500] = -inf (row 2, element 100)");
  CHECK(SanitizeNonFinite(&req) == 4);
  CHECK_FALSE(FindNonFinite(req, &first));
  float v = 1;
  std::memcpy(&v, req.obs().data().data() + 2099 * 4, 4);
  CHECK(v == 0.f);
  CHECK(req.episodes(0).episode_return() == 0.f);

  // The bound holds for the largest request: every env truncated, an episode each.
  const Space box = Space::Box({dim}, {-1.f}, {1.f});
  wire::Envelope e;
  auto* big = e.mutable_step();
  *big = req;
  big->set_seq(std::numeric_limits<uint64_t>::max());
  big->set_group(std::numeric_limits<uint32_t>::max());
  big->set_terminated(std::string(n, '\1'));
  big->set_truncated(std::string(n, '\1'));
  for (int i = 0; i < n; ++i) big->add_final_obs_index(i);
  SetTensor(big->mutable_final_obs(), DType::kFloat32, {n, dim}, obs.data(), obs.size() * 4);
  big->clear_episodes();
  for (int i = 0; i < n; ++i) {
    auto* ep = big->add_episodes();
    ep->set_episode_return(-1e30f);
    ep->set_length(std::numeric_limits<int32_t>::max());
  }
  const int64_t bound = MaxSessionMessageBytes(n, box, Space::Discrete(2));
  CHECK(static_cast<int64_t>(Encode(e).size()) <= bound);
  CHECK(bound < 2 * static_cast<int64_t>(Encode(e).size()));  // generous, not wasteful
}

TEST_CASE("LogRateLimiter writes one line per interval and kind, and counts the rest", "[log]") {
  auto t = std::make_shared<LogRateLimiter::Clock::time_point>();
  LogRateLimiter limiter(std::chrono::seconds(10), [t] { return *t; }, 3);
  CHECK(limiter.Allow("a").log);
  for (int i = 0; i < 1000; ++i) CHECK_FALSE(limiter.Allow("a").log);
  CHECK(limiter.Allow("b").log);  // kinds are independent
  *t += std::chrono::milliseconds(9999);
  CHECK_FALSE(limiter.Allow("a").log);
  *t += std::chrono::milliseconds(1);
  auto d = limiter.Allow("a");
  REQUIRE(d.log);
  CHECK(d.suppressed == 1001);
  CHECK(d.since_s == Approx(10.0));
  CHECK(LogRateLimiter::Suffix(d) == " (1001 more like it in the last 10 s not logged)");
  d = limiter.Allow("b");  // b's interval has passed too, with nothing dropped
  REQUIRE(d.log);
  CHECK(d.suppressed == 0);
  CHECK(LogRateLimiter::Suffix(d).empty());
  // The table is full (a, b and the shared slot): every further kind shares one line per interval.
  CHECK(limiter.Allow("c").log);
  CHECK_FALSE(limiter.Allow("d").log);
  CHECK_FALSE(limiter.Allow("e").log);
  *t += std::chrono::seconds(10);
  CHECK(limiter.Allow("a").log);
  d = limiter.Allow("g");  // b, idle, is forgotten; the table is still full with a and the shared slot
  REQUIRE(d.log);
  CHECK(d.suppressed == 2);
  CHECK_FALSE(limiter.Allow("h").log);
  *t += std::chrono::seconds(10);
  d = limiter.Allow("i");  // a is forgotten too: room for a kind of its own
  REQUIRE(d.log);
  CHECK(d.suppressed == 0);
  CHECK_FALSE(limiter.Allow("i").log);
}

namespace {
// What the process writes to file descriptor 2 while it lives (protobuf's default log handler writes there).
class StderrCapture {
 public:
  StderrCapture() : file_(std::tmpfile()) {
    REQUIRE(file_ != nullptr);
    std::fflush(stderr);
    saved_ = ::dup(2);
    REQUIRE(::dup2(::fileno(file_), 2) == 2);
  }
  ~StderrCapture() {
    if (saved_ >= 0) Restore();
    std::fclose(file_);
  }
  std::string Stop() {
    Restore();
    std::string text;
    std::rewind(file_);
    char buf[4096];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, file_)) > 0;) text.append(buf, n);
    return text;
  }

 private:
  void Restore() {
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    saved_ = -1;
  }
  std::FILE* file_;
  int saved_ = -1;
};

int CountLines(const std::string& text, const std::string& needle) {
  int n = 0;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    n += std::string_view(text).substr(start, end - start).find(needle) != std::string_view::npos;
    start = end + 1;
  }
  return n;
}

// An envelope of one of the five kinds with a string field, that field holding `bad` (same length as the
// placeholder): built by replacing bytes, since protobuf would complain when serialising invalid UTF-8 itself.
std::string WithInvalidUtf8(int kind, const std::string& bad) {
  const std::string placeholder(bad.size(), 'P');
  wire::Envelope e;
  switch (kind) {
    case 0: e.mutable_hello()->set_worker_id(placeholder); break;
    case 1: e.mutable_hello()->set_env_name(placeholder); break;
    case 2: e.mutable_welcome()->set_error(placeholder); break;
    case 3: e.mutable_stop()->set_reason(placeholder); break;
    default: e.mutable_error()->set_message(placeholder); break;
  }
  std::string bytes = Encode(e);
  const auto at = bytes.find(placeholder);
  REQUIRE(at != std::string::npos);
  bytes.replace(at, bad.size(), bad);
  return bytes;
}
}  // namespace

TEST_CASE("1000 messages with invalid UTF-8 strings are refused and logged at most once per interval", "[wire][log]") {
  // A clock that stands still unless the test moves it: no sleeps, no dependence on the machine's speed.
  auto t = std::make_shared<LogRateLimiter::Clock::time_point>(LogRateLimiter::Clock::time_point{} +
                                                               std::chrono::hours(1));
  InstallProtobufLogHandler([t] { return *t; });
  auto ring = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(2000);
  spdlog::default_logger()->sinks().push_back(ring);
  StderrCapture err;
  std::mt19937 rng(1126);
  auto decode_bad = [&] {
    // 0xFF never occurs in UTF-8; the rest are random bytes.
    std::string bad(1 + rng() % 16, '\xff');
    for (std::size_t i = 1; i < bad.size(); ++i) bad[i] = static_cast<char>(rng() % 256);
    const std::string bytes = WithInvalidUtf8(static_cast<int>(rng() % 5), bad);
    wire::Envelope out;
    const Status s = Decode(bytes.data(), bytes.size(), &out);
    CHECK_FALSE(s.ok());  // still refused: the field stays a validated string
  };
  for (int i = 0; i < 1000; ++i) decode_bad();
  *t += kLogRateInterval;
  decode_bad();
  const std::string captured = err.Stop();
  auto& sinks = spdlog::default_logger()->sinks();
  sinks.erase(std::remove(sinks.begin(), sinks.end(), ring), sinks.end());
  std::string logged;
  for (const auto& line : ring->last_formatted()) logged += line;

  INFO("stderr:\n" << captured.substr(0, 2000) << "\nspdlog:\n" << logged.substr(0, 2000));
  CHECK(ProtobufLogMessages() == 1001);  // protobuf complained about every message...
  CHECK(CountLines(captured, "invalid UTF-8") == 0);  // ...none of it straight to stderr...
  CHECK(CountLines(logged, "invalid UTF-8") == 2);    // ...and two lines in the log: the first, and one 10 s on
  CHECK(CountLines(logged, "protobuf: String field") == 2);
  CHECK(CountLines(logged, "(999 more like it in the last 10 s not logged)") == 1);
}

TEST_CASE("CopyUntilNonFinite copies finite floats in one pass and finds the first non-finite one", "[wire]") {
  // 10,001 floats: two whole 4096-float chunks, a partial one, and an odd tail past the 16-float vector loop.
  const int64_t n = 10001;
  std::vector<float> src(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) src[static_cast<std::size_t>(i)] = static_cast<float>(i) * 0.5f - 7.f;
  src[42] = std::numeric_limits<float>::max();  // finite extremes
  src[43] = -std::numeric_limits<float>::denorm_min();
  // At an odd byte offset, as a protobuf string may hold it.
  std::string bytes(1, 'x');
  bytes.append(reinterpret_cast<const char*>(src.data()), src.size() * 4);
  const std::string unaligned = bytes.substr(1);
  std::vector<float> dst(static_cast<std::size_t>(n), 1.f);
  CHECK(CopyUntilNonFinite(unaligned, dst.data()) == -1);
  CHECK(dst == src);
  for (const int64_t at : {int64_t{0}, int64_t{4095}, int64_t{4096}, int64_t{8200}, n - 1}) {
    for (const float bad : {std::nanf(""), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()}) {
      std::vector<float> s = src;
      s[static_cast<std::size_t>(at)] = bad;
      if (at + 1 < n) s[static_cast<std::size_t>(n - 1)] = std::nanf("");  // a later one too
      const std::string b(reinterpret_cast<const char*>(s.data()), s.size() * 4);
      CHECK(CopyUntilNonFinite(b, dst.data()) == at);
    }
  }
  // The other fields: reward, final_obs, final_global_state and the episodes, never obs or global_state.
  wire::StepRequest req;
  const std::vector<float> nan_row(3, std::nanf(""));
  SetTensor(req.mutable_obs(), DType::kFloat32, {1, 3}, nan_row.data(), 12);
  SetTensor(req.mutable_global_state(), DType::kFloat32, {1, 3}, nan_row.data(), 12);
  NonFinite first;
  CHECK_FALSE(FindNonFiniteBesidesObsAndState(req, &first));
  CHECK(FindNonFinite(req, &first));
  SetTensor(req.mutable_final_global_state(), DType::kFloat32, {1, 3}, nan_row.data(), 12);
  REQUIRE(FindNonFiniteBesidesObsAndState(req, &first));
  CHECK(first.field == "StepRequest.final_global_state");
  req.add_episodes()->set_episode_return(std::numeric_limits<float>::infinity());
  const std::vector<float> one(1, std::numeric_limits<float>::infinity());
  SetTensor(req.mutable_reward(), DType::kFloat32, {1}, one.data(), 4);
  REQUIRE(FindNonFiniteBesidesObsAndState(req, &first));
  CHECK(first.field == "StepRequest.reward");
}
