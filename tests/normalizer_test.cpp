// Observation normalisation and reward scaling below the learner (no LibTorch):
// running moments against a two-pass computation, their parallel merge, the
// transforms and their clipping, reward scaling on a hand-computed sequence,
// multi-agent rows, the wire messages and their checks, and a real
// WorkerClient's requests (scaled rewards, raw episode returns, deltas once per
// rollout, the learner's statistics taken up) against a stand-in learner.
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <memory>
#include <new>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "common/config.h"
#include "common/running_stats.h"
#include "common/wire.h"
#include "tests/env_test_util.h"
#include "tests/stand_in_learner.h"
#include "worker/env.h"
#include "worker/env_group.h"
#include "worker/normalizer.h"
#include "worker/worker_client.h"

namespace farm {
namespace {

using testing::FloatsOf;
using testing::MakeGroup;

// ---------------------------------------------------------------------------
// A test-only env: agent a observes [t + a, 100 - 2 (t + a)] at step t of the
// episode (0 after reset); the reward of step t (1-based) is t; it terminates
// after `length` steps. Options: length (3), agents (1), max_steps (0: none).
class NormTestEnv : public Env {
 public:
  NormTestEnv(int length, int agents) : length_(length), agents_(agents) {}
  void reset(float* obs) override {
    t_ = 0;
    Write(obs);
  }
  StepResult step(const ActionRef&, float* obs) override {
    ++t_;
    Write(obs);
    return StepResult{static_cast<float>(t_), t_ >= length_};
  }

 private:
  void Write(float* obs) const {
    for (int a = 0; a < agents_; ++a) {
      obs[2 * a] = static_cast<float>(t_ + a);
      obs[2 * a + 1] = static_cast<float>(100 - 2 * (t_ + a));
    }
  }
  int length_;
  int agents_;
  int t_ = 0;
};

EnvOptions NormTestDefaults() { return {{"length", 3}, {"agents", 1}, {"max_steps", 0}}; }

EnvSpec NormTestSpec(const EnvOptions& o) {
  EnvSpec spec;
  spec.name = "NormTest-v0";
  spec.observation = Space::Box({2}, {-1000, -1000}, {1000, 1000});
  spec.action = Space::Discrete(2);
  spec.num_agents = static_cast<int>(o.at("agents"));
  spec.max_episode_steps = static_cast<int>(o.at("max_steps"));
  return spec;
}

std::unique_ptr<Env> MakeNormTest(const EnvOptions& o, uint64_t) {
  return std::make_unique<NormTestEnv>(static_cast<int>(o.at("length")), static_cast<int>(o.at("agents")));
}

FARM_REGISTER_ENV("NormTest-v0", NormTestDefaults(), NormTestSpec, MakeNormTest);

// Test-only envs for WorkerClient::Create's order of work. Wide-v0: 2^20 floats per observation (the spec's
// bounds take 8 MiB); `made` counts the envs its factory built. A group of 2^18 of them would need 1 TiB of
// frames. OutOfMemory-v0: a factory that throws std::bad_alloc, as an env too large for the host would.
class WideEnv : public Env {
 public:
  static constexpr int64_t kObs = int64_t{1} << 20;
  static inline std::atomic<int64_t> made{0};
  void reset(float* obs) override { std::fill(obs, obs + kObs, 0.0f); }
  StepResult step(const ActionRef&, float* obs) override {
    reset(obs);
    return StepResult{0.0f, true};
  }
};

EnvSpec WideSpec(const EnvOptions&) {
  EnvSpec spec;
  spec.name = "Wide-v0";
  spec.observation = Space::Box({WideEnv::kObs}, {-1.0f}, {1.0f});
  spec.action = Space::Discrete(2);
  return spec;
}

std::unique_ptr<Env> MakeWide(const EnvOptions&, uint64_t) {
  ++WideEnv::made;
  return std::make_unique<WideEnv>();
}

FARM_REGISTER_ENV("Wide-v0", EnvOptions{}, WideSpec, MakeWide);

EnvSpec OutOfMemorySpec(const EnvOptions&) {
  EnvSpec spec;
  spec.name = "OutOfMemory-v0";
  spec.observation = Space::Box({2}, {-1.0f}, {1.0f});
  spec.action = Space::Discrete(2);
  return spec;
}

std::unique_ptr<Env> MakeOutOfMemory(const EnvOptions&, uint64_t) { throw std::bad_alloc(); }

FARM_REGISTER_ENV("OutOfMemory-v0", EnvOptions{}, OutOfMemorySpec, MakeOutOfMemory);

// Mean and population variance per element, by the textbook two passes.
void TwoPass(const std::vector<float>& data, int64_t dim, std::vector<double>* mean, std::vector<double>* var) {
  const auto rows = static_cast<int64_t>(data.size()) / dim;
  mean->assign(static_cast<std::size_t>(dim), 0.0);
  var->assign(static_cast<std::size_t>(dim), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < dim; ++i) (*mean)[i] += data[r * dim + i];
  for (auto& m : *mean) m /= static_cast<double>(rows);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < dim; ++i) {
      const double d = data[r * dim + i] - (*mean)[i];
      (*var)[i] += d * d;
    }
  for (auto& v : *var) v /= static_cast<double>(rows);
}

std::vector<float> RandomRows(std::mt19937_64& rng, int64_t rows, int64_t dim) {
  // Offsets and scales that differ per element, far from 0 and 1: what normalisation is for.
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> out(static_cast<std::size_t>(rows * dim));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < dim; ++i) out[r * dim + i] = 1000.0f * static_cast<float>(i) + (1.0f + 3.0f * i) * n(rng);
  return out;
}

void CheckMoments(const RunningMoments& m, const std::vector<float>& data, int64_t dim) {
  std::vector<double> mean, var;
  TwoPass(data, dim, &mean, &var);
  REQUIRE(m.count() == static_cast<int64_t>(data.size()) / dim);
  for (int64_t i = 0; i < dim; ++i) {
    CHECK(m.mean()[i] == Approx(mean[i]).epsilon(1e-12).margin(1e-9));
    CHECK(m.Variance(i) == Approx(var[i]).epsilon(1e-9));
  }
}


}  // namespace

TEST_CASE("RunningMoments: batches of rows give the two-pass mean and variance", "[normalizer][stats]") {
  std::mt19937_64 rng(7);
  const int64_t dim = 5;
  RunningMoments m(dim);
  CHECK(m.empty());
  CHECK(m.Variance(0) == 1.0);  // no samples: the identity's variance
  std::vector<float> all;
  for (int64_t rows : {1, 3, 64, 2, 500}) {
    const auto batch = RandomRows(rng, rows, dim);
    m.AddRows(batch.data(), rows);
    all.insert(all.end(), batch.begin(), batch.end());
    CheckMoments(m, all, dim);
  }
  // One sample at a time (doubles) agrees too.
  RunningMoments one(dim);
  for (std::size_t r = 0; r < all.size() / dim; ++r) {
    std::vector<double> row(all.begin() + r * dim, all.begin() + (r + 1) * dim);
    one.Add(row.data());
  }
  CheckMoments(one, all, dim);
}

TEST_CASE("RunningMoments: rows holding NaN or Inf are not counted", "[normalizer][stats]") {
  RunningMoments m(2);
  const float rows[] = {1, 2, NAN, 3, 5, INFINITY, 3, 4};
  m.AddRows(rows, 4);
  CHECK(m.count() == 2);
  CHECK(m.mean()[0] == 2.0);
  CHECK(m.mean()[1] == 3.0);
  const double bad[] = {1, NAN};
  m.Add(bad);
  CHECK(m.count() == 2);
}

TEST_CASE("RunningMoments: merging chunks in any order gives the moments of the whole", "[normalizer][stats]") {
  std::mt19937_64 rng(11);
  const int64_t dim = 3;
  const auto data = RandomRows(rng, 1000, dim);
  // Random chunk sizes (some empty), each chunk's moments gathered on its own, as each worker does.
  std::vector<RunningMoments> chunks;
  std::uniform_int_distribution<int64_t> size(0, 90);
  for (int64_t at = 0; at < 1000;) {
    const int64_t n = std::min<int64_t>(size(rng), 1000 - at);
    RunningMoments c(dim);
    c.AddRows(data.data() + at * dim, n);
    chunks.push_back(c);
    at += n;
  }
  RunningMoments forward(dim);
  for (const auto& c : chunks) forward.Merge(c);
  CheckMoments(forward, data, dim);

  std::shuffle(chunks.begin(), chunks.end(), rng);
  RunningMoments shuffled;  // an empty set of no size takes the first merged set's size
  for (const auto& c : chunks) shuffled.Merge(c);
  CheckMoments(shuffled, data, dim);

  // A tree of merges (as a learner merging workers that merged their groups).
  std::vector<RunningMoments> level = chunks;
  while (level.size() > 1) {
    std::vector<RunningMoments> next;
    for (std::size_t i = 0; i < level.size(); i += 2) {
      RunningMoments m = level[i];
      if (i + 1 < level.size()) m.Merge(level[i + 1]);
      next.push_back(m);
    }
    level = next;
  }
  CheckMoments(level[0], data, dim);

  const RunningMoments before = forward;
  forward.Merge(RunningMoments(dim));  // empty: no change
  CHECK(forward.count() == before.count());
  CHECK(forward.mean() == before.mean());
  CHECK(forward.m2() == before.m2());
  CHECK_NOTHROW(forward.Merge(RunningMoments(dim + 1)));  // empty, of another size: still a no-op
  CHECK(forward.count() == before.count());
  RunningMoments other(dim + 1);
  const float row[] = {1, 2, 3, 4};
  other.AddRows(row, 1);
  CHECK_THROWS_AS(forward.Merge(other), std::invalid_argument);
}

TEST_CASE("ObsTransform: (x - mean) / sqrt(var + 1e-8), clipped to +-clip", "[normalizer][transform]") {
  RunningMoments m(3);
  const float rows[] = {0, 10, -5,  //
                        2, 10, -5,  //
                        4, 10, -5};
  m.AddRows(rows, 3);  // means 2, 10, -5; variances 8/3, 0, 0
  const ObsTransform t = ObsTransform::From(m, 5.0);
  const float in[] = {5, 10.01f, -6};
  float out[3];
  t.Apply(in, out, 1);
  CHECK(out[0] == Approx(3.0 / std::sqrt(8.0 / 3.0 + 1e-8)).epsilon(1e-6));
  CHECK(out[1] == 5.0f);   // 0.01 / sqrt(0 + 1e-8) = 100, clipped
  CHECK(out[2] == -5.0f);  // -1 / 1e-4 = -1e4, clipped
  // In place, and exactly the float formula the exported module uses.
  float again[] = {5, 10, -5};
  t.Apply(again, again, 1);
  CHECK(again[0] == std::min(std::max((5.0f - t.mean[0]) / t.std[0], -5.0f), 5.0f));
  CHECK(again[1] == 0.0f);
  CHECK(again[2] == 0.0f);
  // No samples yet: mean 0, std sqrt(1 + 1e-8), i.e. the identity up to the clip.
  const ObsTransform identity = ObsTransform::From(RunningMoments(3), 10.0);
  const float raw[] = {0.5f, -3, 42};
  float id[3];
  identity.Apply(raw, id, 1);
  CHECK(id[0] == Approx(0.5));
  CHECK(id[1] == Approx(-3));
  CHECK(id[2] == 10.0f);
}

TEST_CASE("Normalizer: rewards scaled by the running discounted return's std, by hand", "[normalizer][reward]") {
  auto group = MakeGroup("NormTest-v0", {}, 1, 1);
  NormalizerOptions o;
  o.reward = true;
  o.gamma = 0.5;
  o.reward_clip = 10;
  Normalizer n(o, group->obs_numel());
  REQUIRE(n.AddGroup(1, 1) == 0);
  group->Reset();
  n.OnReset(0, *group);
  const int64_t action = 0;
  // Rewards 1, 2, 3 (terminated), then 1 in the next episode: G = 1, 0.5*1+2 = 2.5, 0.5*2.5+3 = 4.25, 1
  // (reset after the episode ended). reward' = r / sqrt(var(G so far) + 1e-8), clipped to 10.
  const double expected[] = {10.0,                  // var {1} = 0: 1e4, clipped
                             2.666666642962963,     // var {1, 2.5} = 0.5625
                             2.2588408920943572,    // var {1, 2.5, 4.25} = 1.763888...
                             0.7468160427323144};   // var {1, 2.5, 4.25, 1} = 1.79296875
  for (int step = 0; step < 4; ++step) {
    group->Step(&action, nullptr);
    n.OnStep(0, *group);
    INFO("step " << step + 1);
    CHECK(n.reward(0)[0] == Approx(expected[step]).epsilon(1e-6));
    CHECK_THROWS_AS(n.obs(0), std::logic_error);  // observations left raw without normalize_obs: no output
  }
  CHECK(n.ret_view().count() == 4);
  CHECK(n.ret_view().mean()[0] == Approx(2.1875));
  // The episode's return is the env's: 1 + 2 + 3.
  auto again = MakeGroup("NormTest-v0", {}, 1, 1);
  for (int step = 0; step < 3; ++step) again->Step(&action, nullptr);
  REQUIRE(again->finished().size() == 1);
  CHECK(again->finished()[0].episode_return == 6.0f);
}

TEST_CASE("Normalizer: observation rows of every agent share the statistics, deltas and views",
          "[normalizer][obs]") {
  // 2 envs x 2 agents = 4 rows; truncated every 2 steps, so final observations appear.
  auto group = MakeGroup("NormTest-v0", {{"agents", 2}, {"length", 100}, {"max_steps", 2}}, 2, 1);
  NormalizerOptions o;
  o.obs = true;
  o.obs_clip = 1.5;
  Normalizer n(o, group->obs_numel());
  REQUIRE(n.AddGroup(2, 2) == 0);
  group->Reset();
  n.OnReset(0, *group);
  std::vector<float> seen(group->obs(), group->obs() + 8);
  const int64_t actions[] = {0, 0, 0, 0};
  for (int step = 0; step < 2; ++step) {
    group->Step(actions, nullptr);
    n.OnStep(0, *group);
    seen.insert(seen.end(), group->obs(), group->obs() + 8);
  }
  // Every row of every step counted (final observations are not: the reset rows are).
  CheckMoments(n.obs_view(), seen, 2);
  CheckMoments(n.pending_obs(), seen, 2);
  // The output is the view's transform of the rows, and of the truncated rows' final observations.
  const ObsTransform t = ObsTransform::From(n.obs_view(), 1.5);
  std::vector<float> want(8);
  t.Apply(group->obs(), want.data(), 4);
  CHECK(std::vector<float>(n.obs(0), n.obs(0) + 8) == want);
  REQUIRE(group->final_obs().size() == 8);
  std::vector<float> want_final(8);
  t.Apply(group->final_obs().data(), want_final.data(), 4);
  CHECK(n.final_obs(0) == want_final);
  CHECK(*std::max_element(n.final_obs(0).begin(), n.final_obs(0).end()) <= 1.5f);

  // A delta holds what was seen since the last; the view stays the worker's own until the learner's arrive.
  wire::NormalizerStats delta;
  n.TakeDelta(&delta);
  CHECK(delta.has_obs());
  CHECK_FALSE(delta.has_ret());
  CHECK(delta.obs().count() == 12);
  CHECK(n.pending_obs().count() == 0);
  CHECK(n.obs_view().count() == 12);

  // The learner's statistics become the view and stay fixed while the worker gathers its next delta.
  RunningMoments global(2);
  const float g[] = {0, 0, 10, 10};
  global.AddRows(g, 2);
  wire::NormalizerStats from_learner;
  ToWire(global, from_learner.mutable_obs());
  REQUIRE(n.ApplyGlobal(from_learner).ok());
  group->Step(actions, nullptr);
  n.OnStep(0, *group);
  CHECK(n.obs_view().count() == 2);
  CHECK(n.obs_view().mean() == global.mean());
  CHECK(n.pending_obs().count() == 4);
  const ObsTransform tg = ObsTransform::From(global, 1.5);
  tg.Apply(group->obs(), want.data(), 4);
  CHECK(std::vector<float>(n.obs(0), n.obs(0) + 8) == want);

  // Empty statistics from the learner (a fresh run) do not replace a view.
  wire::NormalizerStats empty;
  ToWire(RunningMoments(2), empty.mutable_obs());
  REQUIRE(n.ApplyGlobal(empty).ok());
  CHECK(n.obs_view().count() == 2);

  // Frozen (serving): the view is the learner's as given, nothing more is gathered.
  wire::NormalizerStats frozen = from_learner;
  frozen.set_frozen(true);
  REQUIRE(n.ApplyGlobal(frozen).ok());
  CHECK(n.frozen());
  group->Step(actions, nullptr);
  n.OnStep(0, *group);
  CHECK(n.pending_obs().count() == 4);
  CHECK(n.obs_view().count() == 2);

  // Statistics of the wrong size or with a bad number are refused, naming the field.
  wire::NormalizerStats bad = from_learner;
  bad.mutable_obs()->add_mean(1.0);
  Status s = n.ApplyGlobal(bad);
  CHECK(s.code() == Status::Code::kProtocol);
  CHECK_THAT(s.message(), Catch::Contains("obs") && Catch::Contains("2 entries"));
  bad = from_learner;
  bad.mutable_obs()->set_m2(1, -1.0);
  s = n.ApplyGlobal(bad);
  CHECK_THAT(s.message(), Catch::Contains("m2[1]") && Catch::Contains(">= 0"));
  bad = from_learner;
  bad.mutable_ret()->set_count(1);
  s = n.ApplyGlobal(bad);
  CHECK_THAT(s.message(), Catch::Contains(".ret") && Catch::Contains("not scaled"));
}

TEST_CASE("NormalizerStats, Normalization and the messages that carry them round-trip", "[normalizer][wire]") {
  std::mt19937_64 rng(3);
  RunningMoments obs(4), ret(1);
  const auto rows = RandomRows(rng, 17, 4);
  obs.AddRows(rows.data(), 17);
  const double g[] = {-3.25};
  ret.Add(g);

  wire::Envelope step;
  auto* req = step.mutable_step();
  req->set_seq(32);
  ToWire(obs, req->mutable_stats_delta()->mutable_obs());
  ToWire(ret, req->mutable_stats_delta()->mutable_ret());
  wire::Envelope reply;
  ToWire(obs, reply.mutable_action()->mutable_normalizer()->mutable_obs());
  reply.mutable_action()->mutable_normalizer()->set_frozen(true);
  wire::Envelope welcome;
  welcome.mutable_welcome()->set_accepted(true);
  ToWire(ret, welcome.mutable_welcome()->mutable_normalizer()->mutable_ret());
  wire::Envelope hello;
  NormalizerOptions o;
  o.obs = true;
  o.reward = true;
  o.obs_clip = 5;
  o.reward_clip = 7;
  o.gamma = 0.9;
  o.ToWire(hello.mutable_hello()->mutable_normalization());

  auto round_trip = [](const wire::Envelope& e, wire::Envelope* out) {
    const std::string bytes = Encode(e);
    return Decode(bytes.data(), bytes.size(), out).ok();
  };
  wire::Envelope got_step, got;
  REQUIRE(round_trip(step, &got_step));
  RunningMoments o2, r2;
  REQUIRE(
      CheckNormalizerStats(got_step.step().stats_delta(), true, 4, true, "StepRequest.stats_delta", &o2, &r2).ok());
  CHECK(o2.count() == 17);
  CHECK(o2.mean() == obs.mean());  // doubles travel exactly
  CHECK(o2.m2() == obs.m2());
  CHECK(r2.count() == 1);
  CHECK(r2.mean()[0] == -3.25);

  REQUIRE(round_trip(reply, &got));
  CHECK(got.action().normalizer().frozen());
  REQUIRE(FromWire(got.action().normalizer().obs(), 4, "ActionReply.normalizer.obs", &o2).ok());
  CHECK(o2.m2() == obs.m2());
  REQUIRE(round_trip(welcome, &got));
  REQUIRE(got.welcome().has_normalizer());
  CHECK_FALSE(got.welcome().normalizer().has_obs());
  CHECK(got.welcome().normalizer().ret().mean(0) == -3.25);

  REQUIRE(round_trip(hello, &got));
  CHECK(NormalizerOptions::CheckMatches(got.hello().normalization(), o).ok());
  // An old worker (no field) against a learner that normalises, and differing clips: each key named.
  Status s = NormalizerOptions::CheckMatches(wire::Normalization(), o);
  CHECK(s.code() == Status::Code::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("env.normalize_obs false (learner: true)") &&
                              Catch::Contains("env.normalize_reward false (learner: true)"));
  wire::Normalization other = got.hello().normalization();
  other.set_obs_clip(10);
  other.set_gamma(0.99);
  s = NormalizerOptions::CheckMatches(other, o);
  CHECK_THAT(s.message(), Catch::Contains("env.obs_clip 10 (learner: 5)") && Catch::Contains("ppo.gamma 0.99"));
  CHECK(NormalizerOptions::CheckMatches(wire::Normalization(), NormalizerOptions()).ok());

  // The receiver's checks: presence follows the options, sizes and numbers are checked.
  RunningMoments a, b;
  s = CheckNormalizerStats(got_step.step().stats_delta(), false, 4, true, "StepRequest.stats_delta", &a, &b);
  CHECK_THAT(s.message(), Catch::Contains("StepRequest.stats_delta.obs") && Catch::Contains("not normalised"));
  s = CheckNormalizerStats(wire::NormalizerStats(), true, 4, false, "StepRequest.stats_delta", &a, &b);
  CHECK_THAT(s.message(), Catch::Contains("StepRequest.stats_delta.obs: missing"));
  wire::NormalizerStats neg;
  ToWire(obs, neg.mutable_obs());
  neg.mutable_obs()->set_count(-1);
  s = CheckNormalizerStats(neg, true, 4, false, "StepRequest.stats_delta", &a, &b);
  CHECK_THAT(s.message(), Catch::Contains("count: expected >= 0, got -1"));
  neg.mutable_obs()->set_count(3);
  neg.mutable_obs()->set_mean(2, NAN);
  s = CheckNormalizerStats(neg, true, 4, false, "StepRequest.stats_delta", &a, &b);
  CHECK_THAT(s.message(), Catch::Contains("mean[2]: expected a finite number"));
  s = CheckNormalizerStats(got_step.step().stats_delta(), true, 3, true, "StepRequest.stats_delta", &a, &b);
  CHECK_THAT(s.message(), Catch::Contains("expected mean and m2 of 3 entries each, got 4 and 4"));
}

TEST_CASE("WorkerClient: scaled rewards, raw episode returns, a delta per rollout, the learner's view taken up",
          "[normalizer][worker]") {
  testing::StandInLearner learner;

  FarmConfig config;
  config.seed = 5;
  config.env.name = "NormTest-v0";
  config.env.num_envs = 2;
  config.env.num_groups = 1;
  config.env.options = {{"length", 3}};
  config.env.normalize_obs = true;
  config.env.normalize_reward = true;
  config.env.reward_clip = 1000;
  config.ppo.gamma = 0.5;
  config.ppo.rollout_length = 4;
  WorkerClient* client = learner.StartWorker(config);

  std::string identity;
  wire::Envelope in;
  wire::Hello hello;
  learner.AcceptHello(&identity, &hello);
  const auto& norm = hello.normalization();
  CHECK(norm.normalize_obs());
  CHECK(norm.normalize_reward());
  CHECK(norm.obs_clip() == 10);
  CHECK(norm.gamma() == 0.5);

  // The learner's statistics, sent with the reply to the first delta: observations all of mean (1, 98)
  // and variance (4, 16); returns of variance 4.
  RunningMoments global_obs(2), global_ret(1);
  const float gobs[] = {-1, 94, 3, 102};
  global_obs.AddRows(gobs, 2);
  const double gret[] = {1, 5};
  global_ret.Add(&gret[0]);
  global_ret.Add(&gret[1]);

  int64_t action_sent = 0;
  bool synced = false;
  for (uint64_t seq = 0; seq <= 9; ++seq) {
    learner.ReceiveSkippingHeartbeats(&identity, &in);
    REQUIRE(in.has_step());
    const auto& req = in.step();
    REQUIRE(req.seq() == seq);
    const std::vector<float> obs = FloatsOf(req.obs());
    const int t = static_cast<int>(seq % 3);  // the env's step counter after the auto-reset
    // Deltas exactly at seq 4 and 8 (rollout_length 4), never on the first request.
    CHECK(req.has_stats_delta() == (seq == 4 || seq == 8));
    if (seq == 4) {
      // Both envs' rows of the reset and four steps; the returns of four steps.
      CHECK(req.stats_delta().obs().count() == 10);
      CHECK(req.stats_delta().ret().count() == 8);
    }
    if (synced) {
      // Normalised with the learner's statistics: (t - 1) / 2 and (100 - 2t - 98) / 4.
      CHECK(obs[0] == Approx((t - 1) / 2.0).epsilon(1e-6));
      CHECK(obs[1] == Approx((2 - 2 * t) / 4.0).epsilon(1e-6));
    }
    if (!req.first()) {
      const std::vector<float> reward = FloatsOf(req.reward());
      // The raw reward of the step that led here is t (3 at termination, where t is 0 again).
      const float raw = static_cast<float>(t == 0 ? 3 : t);
      if (synced) {
        CHECK(reward[0] == Approx(raw / std::sqrt(4.0 + 1e-8)).epsilon(1e-6));
        CHECK(reward[1] == reward[0]);
      } else {
        CHECK(reward[0] != raw);  // scaled by the worker's own statistics
      }
      if (t == 0) {
        REQUIRE(req.episodes_size() == 2);
        CHECK(req.episodes(0).episode_return() == 6.0f);  // raw: 1 + 2 + 3
        CHECK(req.episodes(1).episode_return() == 6.0f);
        CHECK(req.episodes(0).length() == 3);
      }
    }
    if (seq == 4) synced = true;  // from the reply below on
    wire::Envelope reply;
    auto* a = reply.mutable_action();
    a->set_group(0);
    a->set_seq(req.seq());
    const std::vector<int64_t> actions(2, action_sent);
    SetTensor(a->mutable_action(), DType::kInt64, {2}, actions.data(), actions.size() * sizeof(int64_t));
    if (req.has_stats_delta()) {
      ToWire(global_obs, a->mutable_normalizer()->mutable_obs());
      ToWire(global_ret, a->mutable_normalizer()->mutable_ret());
    }
    learner.Send(identity, reply);
  }
  const Status run_status = learner.StopAndJoin(identity);
  INFO(run_status.ToString());
  CHECK(run_status.ok());
  REQUIRE(client->normalizer() != nullptr);
  CHECK(client->normalizer()->obs_view().mean() == global_obs.mean());
  CHECK(client->normalizer()->ret_view().m2() == global_ret.m2());
}

TEST_CASE("WorkerClient: a worker whose message could exceed the limit with its statistics is refused",
          "[normalizer][worker]") {
  FarmConfig config;
  config.env.name = "NormTest-v0";
  config.env.num_envs = 1;
  config.env.num_groups = 1;
  // One env of 2 floats: a request may take 1080 bytes (common/wire.h's bound); the statistics add 176.
  config.transport.max_message_bytes = 1100;
  std::unique_ptr<WorkerClient> client;
  REQUIRE(WorkerClient::Create(config, 0, "tcp://127.0.0.1:1", &client).ok());
  config.env.normalize_obs = true;
  const Status s = WorkerClient::Create(config, 0, "tcp://127.0.0.1:1", &client);
  CHECK_THAT(s.message(), Catch::Contains("transport.max_message_bytes"));
  // Stacked frames count: 2 frames of 2 floats take 1096 bytes, 3 take 1112.
  config.env.normalize_obs = false;
  config.env.frame_stack = 2;
  REQUIRE(WorkerClient::Create(config, 0, "tcp://127.0.0.1:1", &client).ok());
  config.env.frame_stack = 3;
  const Status stacked = WorkerClient::Create(config, 0, "tcp://127.0.0.1:1", &client);
  CHECK_THAT(stacked.message(), Catch::Contains("transport.max_message_bytes: 1100 is too small") &&
                                    Catch::Contains("observation [6], 3 stacked frames"));
}

TEST_CASE("WorkerClient: a worker whose message would exceed the limit is refused before it builds an env",
          "[worker]") {
  // 2^18 envs of 2^20 floats: 1 TiB of frames per group, and 2 TiB per request. Built first, the group would
  // end the test with std::bad_alloc (or the host's OOM killer); checked first, nothing is built.
  FarmConfig config;
  config.env.name = "Wide-v0";
  config.env.num_envs = 1 << 18;
  config.env.num_groups = 1;
  config.env.frame_stack = 4;
  WideEnv::made = 0;
  std::unique_ptr<WorkerClient> client;
  const Status s = WorkerClient::Create(config, 0, "tcp://127.0.0.1:1", &client);
  CHECK(s.code() == Status::Code::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("transport.max_message_bytes: 67108864 is too small for 262144 envs per "
                                          "group of Wide-v0 (observation [4194304], 4 stacked frames)"));
  CHECK(WideEnv::made == 0);
  CHECK(client == nullptr);
}

TEST_CASE("WorkerClient: an env group the host has no memory for is a Status naming the keys to lower", "[worker]") {
  FarmConfig config;
  config.env.name = "OutOfMemory-v0";
  config.env.num_envs = 4;
  config.env.num_groups = 2;
  std::unique_ptr<WorkerClient> client;
  Status s;
  REQUIRE_NOTHROW(s = WorkerClient::Create(config, 0, "tcp://127.0.0.1:1", &client));
  CHECK(s.code() == Status::Code::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::StartsWith("out of memory building env group 1 of 2 (2 envs of OutOfMemory-v0, 2 "
                                            "rows, observation [2]") &&
                              Catch::EndsWith("lower env.num_envs, env.frame_stack or the env's size options "
                                              "(env.options)"));
}

}  // namespace farm
