// Wire protocol: every message survives a protobuf round trip; receivers'
// checks reject tensors that contradict what was announced.
#include <catch2/catch.hpp>

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
