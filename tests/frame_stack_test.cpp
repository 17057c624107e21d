// Frame stacking on the workers (EnvGroupOptions::frame_stack, env.frame_stack): the stacked spec, the
// stacked rows against an independent history of an unstacked group's observations (reset padding,
// auto-reset, final observations, multi-agent rows, the global state left alone), frame_stack 1 as before,
// the config key, and a WorkerClient that stacks and then normalises what it sends.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/running_stats.h"
#include "common/wire.h"
#include "tests/env_test_util.h"
#include "tests/stand_in_learner.h"
#include "worker/env.h"
#include "worker/env_group.h"
#include "worker/worker_client.h"

namespace farm {
namespace {

using testing::Floats;
using testing::MakeGroup;
using testing::ShapeOf;

// ---------------------------------------------------------------------------
// A test-only env whose observations say where they come from: agent a at step t of its env's episode e
// (e counts from 1 per env) observes [t, e, a] (with option scalar: just t, a rank-0 box). Actions:
// Discrete(2), 1 on every agent row terminates the episode. Global state (option state): [100 e + t].
// Options: agents (1), max_steps (4; 0: no time limit), scalar (0), state (0).
class FramesEnv : public Env {
 public:
  FramesEnv(int agents, bool scalar) : agents_(agents), scalar_(scalar) {}
  void reset(float* obs) override {
    t_ = 0;
    ++episode_;
    Write(obs);
  }
  StepResult step(const ActionRef& action, float* obs) override {
    ++t_;
    Write(obs);
    StepResult r;
    r.terminated = true;
    for (int a = 0; a < agents_; ++a) r.terminated = r.terminated && action.discrete[a] == 1;
    r.reward = static_cast<float>(t_);
    return r;
  }
  void state(float* out) const override { out[0] = static_cast<float>(100 * episode_ + t_); }

 private:
  void Write(float* obs) const {
    for (int a = 0; a < agents_; ++a) {
      if (scalar_) {
        obs[a] = static_cast<float>(t_);
      } else {
        obs[3 * a] = static_cast<float>(t_);
        obs[3 * a + 1] = static_cast<float>(episode_);
        obs[3 * a + 2] = static_cast<float>(a);
      }
    }
  }
  int agents_;
  bool scalar_;
  int t_ = 0;
  int episode_ = 0;
};

EnvOptions FramesDefaults() { return {{"agents", 1}, {"max_steps", 4}, {"scalar", 0}, {"state", 0}}; }

EnvSpec FramesSpec(const EnvOptions& o) {
  EnvSpec spec;
  spec.name = "TestFrames-v0";
  // Bounds differ per element, so that their order in the stacked space shows.
  spec.observation = o.at("scalar") != 0 ? Space::Box({}, {-1.0f}, {1e6f})
                                         : Space::Box({3}, {-1.0f, -2.0f, -3.0f}, {1e6f, 2e6f, 3e6f});
  spec.action = Space::Discrete(2);
  spec.num_agents = static_cast<int>(o.at("agents"));
  spec.max_episode_steps = static_cast<int>(o.at("max_steps"));
  if (o.at("state") != 0) spec.global_state = Space::Box({1}, {0.0f}, {1e9f});
  return spec;
}

FARM_REGISTER_ENV("TestFrames-v0", FramesDefaults(), FramesSpec, [](const EnvOptions& o, uint64_t) {
  return std::make_unique<FramesEnv>(static_cast<int>(o.at("agents")), o.at("scalar") != 0);
});

std::vector<float> Concat(const std::vector<std::vector<float>>& parts) {
  std::vector<float> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// Seeded random actions for every row of `spec`: discrete in [0, n), box in [low, high] (finite bounds).
struct RandomActions {
  RandomActions(const EnvSpec& spec, int rows, uint64_t seed) : spec(spec), rng(seed) {
    if (spec.action.is_discrete())
      discrete.resize(static_cast<std::size_t>(rows));
    else
      continuous.resize(static_cast<std::size_t>(rows * spec.action.numel()));
  }
  void Draw() {
    for (auto& a : discrete) a = static_cast<int64_t>(rng() % static_cast<uint64_t>(spec.action.n));
    for (std::size_t i = 0; i < continuous.size(); ++i) {
      const std::size_t j = i % static_cast<std::size_t>(spec.action.numel());
      const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
      continuous[i] = static_cast<float>(spec.action.low[j] + u * (spec.action.high[j] - spec.action.low[j]));
    }
  }
  void Step(EnvGroup& g) const {
    g.Step(discrete.empty() ? nullptr : discrete.data(), continuous.empty() ? nullptr : continuous.data());
  }
  EnvSpec spec;
  std::mt19937_64 rng;
  std::vector<int64_t> discrete;
  std::vector<float> continuous;
};

// Steps a group stacking k frames and an unstacked one of the same env and seed with the same random
// actions, and checks after every step that each stacked row is the last k observations the unstacked
// group produced for that row, oldest first, with every frame the reset observation after a reset; that a
// truncated row's final observation is its last k frames, the unstacked final observation newest; and that
// rewards, flags, episodes and global states are those of the unstacked group. Returns the number of
// (terminated, truncated) env endings seen, so callers can require that both happened.
std::pair<int, int> CheckAgainstUnstacked(const std::string& name, const EnvOptions& options, int n, int k, int steps,
                                          uint64_t seed) {
  auto stacked = MakeGroup(name, options, n, seed, k);
  auto plain = MakeGroup(name, options, n, seed, 1);
  const int64_t frame = plain->obs_numel();
  const int rows = plain->rows();
  REQUIRE(stacked->rows() == rows);
  REQUIRE(stacked->frame_numel() == frame);
  REQUIRE(stacked->obs_numel() == k * frame);
  REQUIRE(stacked->state_numel() == plain->state_numel());  // the global state is not stacked

  // The history of each row: k frames, oldest first.
  std::vector<std::deque<std::vector<float>>> history(static_cast<std::size_t>(rows));
  auto pad = [&](int r) { history[r].assign(static_cast<std::size_t>(k), Floats(plain->obs() + r * frame, frame)); };
  auto check_rows = [&](const char* when) {
    for (int r = 0; r < rows; ++r) {
      INFO(when << ", row " << r);
      const std::vector<float> want = Concat({history[r].begin(), history[r].end()});
      REQUIRE(Floats(stacked->obs() + r * k * frame, k * frame) == want);
    }
    const int64_t s = plain->state_numel();
    CHECK(Floats(stacked->global_state(), plain->size() * s) == Floats(plain->global_state(), plain->size() * s));
  };
  for (int r = 0; r < rows; ++r) pad(r);
  check_rows("after Create");

  RandomActions actions(plain->spec(), rows, seed ^ 0xAC7105ull);
  int terminations = 0, truncations = 0;
  for (int t = 1; t <= steps; ++t) {
    INFO("step " << t);
    actions.Draw();
    actions.Step(*stacked);
    actions.Step(*plain);
    REQUIRE(Floats(stacked->reward(), rows) == Floats(plain->reward(), rows));
    REQUIRE(std::memcmp(stacked->terminated(), plain->terminated(), static_cast<std::size_t>(rows)) == 0);
    REQUIRE(std::memcmp(stacked->truncated(), plain->truncated(), static_cast<std::size_t>(rows)) == 0);
    REQUIRE(stacked->finished().size() == plain->finished().size());
    REQUIRE(stacked->final_obs_index() == plain->final_obs_index());
    REQUIRE(stacked->final_obs().size() == plain->final_obs_index().size() * static_cast<std::size_t>(k * frame));
    CHECK(stacked->final_global_state() == plain->final_global_state());
    std::size_t next_final = 0;
    for (int r = 0; r < rows; ++r) {
      if (plain->truncated()[r]) {
        // The last frame before the reset is the unstacked final observation.
        REQUIRE(next_final < plain->final_obs_index().size());
        REQUIRE(plain->final_obs_index()[next_final] == r);
        history[r].pop_front();
        history[r].push_back(Floats(plain->final_obs().data() + next_final * frame, frame));
        const std::vector<float> want = Concat({history[r].begin(), history[r].end()});
        CHECK(Floats(stacked->final_obs().data() + next_final * k * frame, k * frame) == want);
        ++next_final;
      }
      if (plain->terminated()[r] || plain->truncated()[r]) {
        pad(r);  // the new episode's first observation, k times
        if (r % plain->num_agents() == 0) ++(plain->terminated()[r] ? terminations : truncations);
      } else {
        history[r].pop_front();
        history[r].push_back(Floats(plain->obs() + r * frame, frame));
      }
    }
    check_rows("after the step");
  }
  return {terminations, truncations};
}

}  // namespace

TEST_CASE("FrameStack: the stacked spec multiplies the first axis and repeats the bounds", "[framestack]") {
  SECTION("a vector [3] becomes [k * 3]") {
    auto g = MakeGroup("TestFrames-v0", {}, 2, 1, 4);
    CHECK(g->frame_stack() == 4);
    CHECK(g->env_spec().observation.shape == std::vector<int64_t>{3});
    CHECK(g->spec().observation.shape == std::vector<int64_t>{12});
    CHECK(g->obs_numel() == 12);
    CHECK(g->frame_numel() == 3);
    const std::vector<float> low = {-1, -2, -3}, high = {1e6f, 2e6f, 3e6f};
    CHECK(g->spec().observation.low == Concat({low, low, low, low}));
    CHECK(g->spec().observation.high == Concat({high, high, high, high}));
    // Everything else is the env's.
    CHECK(g->spec().action == g->env_spec().action);
    CHECK(g->spec().max_episode_steps == 4);
    CHECK(g->spec().name == "TestFrames-v0");
  }
  SECTION("a scalar (rank 0) becomes [k]") {
    auto g = MakeGroup("TestFrames-v0", {{"scalar", 1}}, 1, 1, 3);
    CHECK(g->env_spec().observation.shape.empty());
    CHECK(g->spec().observation.shape == std::vector<int64_t>{3});
    CHECK(g->spec().observation.low == std::vector<float>(3, -1.0f));
  }
  SECTION("a map [C, H, W] becomes [k * C, H, W], channels first; the global state keeps its space") {
    const EnvOptions options = {{"agents", 3}, {"grid", 8}, {"obstacles", 4}, {"window", 5}};
    auto g = MakeGroup("uav_coverage", options, 1, 1, 2);
    const auto& frame = g->env_spec().observation;
    REQUIRE(frame.shape == std::vector<int64_t>{5, 5, 5});
    CHECK(g->spec().observation.shape == std::vector<int64_t>{10, 5, 5});
    CHECK(g->spec().observation.low == Concat({frame.low, frame.low}));
    REQUIRE(g->spec().global_state.has_value());
    CHECK(*g->spec().global_state == *g->env_spec().global_state);
    CHECK(g->state_numel() == 3 * 8 * 8);
  }
}

TEST_CASE("FrameStack: rows hold the last k frames oldest first, reset-padded, by hand", "[framestack]") {
  // One env, k = 3, time limit 4: frames are [t, episode, 0].
  auto g = MakeGroup("TestFrames-v0", {}, 1, 1, 3);
  auto frames = [](std::vector<std::vector<float>> f) { return Concat(f); };
  CHECK(Floats(g->obs(), 9) == frames({{0, 1, 0}, {0, 1, 0}, {0, 1, 0}}));
  const int64_t stay = 0, stop = 1;
  g->Step(&stay, nullptr);
  CHECK(Floats(g->obs(), 9) == frames({{0, 1, 0}, {0, 1, 0}, {1, 1, 0}}));
  g->Step(&stay, nullptr);
  CHECK(Floats(g->obs(), 9) == frames({{0, 1, 0}, {1, 1, 0}, {2, 1, 0}}));
  g->Step(&stay, nullptr);
  CHECK(Floats(g->obs(), 9) == frames({{1, 1, 0}, {2, 1, 0}, {3, 1, 0}}));
  g->Step(&stay, nullptr);  // step 4: truncated
  REQUIRE(g->truncated()[0] == 1);
  REQUIRE(g->final_obs_index() == std::vector<int32_t>{0});
  CHECK(g->final_obs() == frames({{2, 1, 0}, {3, 1, 0}, {4, 1, 0}}));
  CHECK(Floats(g->obs(), 9) == frames({{0, 2, 0}, {0, 2, 0}, {0, 2, 0}}));
  g->Step(&stay, nullptr);
  g->Step(&stop, nullptr);  // terminated: no final observation, the new episode padded
  REQUIRE(g->terminated()[0] == 1);
  CHECK(g->final_obs().empty());
  CHECK(Floats(g->obs(), 9) == frames({{0, 3, 0}, {0, 3, 0}, {0, 3, 0}}));
  g->Step(&stay, nullptr);
  CHECK(Floats(g->obs(), 9) == frames({{0, 3, 0}, {0, 3, 0}, {1, 3, 0}}));
  g->Reset();  // Reset() pads too
  CHECK(Floats(g->obs(), 9) == frames({{0, 4, 0}, {0, 4, 0}, {0, 4, 0}}));
}

TEST_CASE("FrameStack: stacked rows are the unstacked group's last k observations", "[framestack]") {
  SECTION("CartPole-v1, k = 4 (terminations)") {
    CHECK(CheckAgainstUnstacked("CartPole-v1", {}, 5, 4, 300, 11).first > 0);
  }
  SECTION("Pendulum-v1, k = 3 (continuous actions, time-limit truncations)") {
    CHECK(CheckAgainstUnstacked("Pendulum-v1", {}, 3, 3, 450, 12).second > 0);
  }
  SECTION("TestFrames-v0, k = 2 and k = 7 (both endings; k longer than the episodes)") {
    for (int k : {2, 7}) {
      INFO("k " << k);
      const auto endings = CheckAgainstUnstacked("TestFrames-v0", {{"max_steps", 3}}, 4, k, 60, 13);
      CHECK(endings.first > 0);
      CHECK(endings.second > 0);
    }
  }
  SECTION("multi-agent rows stack their own frames; the global state is the env's (TestFrames-v0, 3 agents)") {
    const auto endings =
        CheckAgainstUnstacked("TestFrames-v0", {{"agents", 3}, {"max_steps", 5}, {"state", 1}}, 3, 3, 60, 14);
    CHECK(endings.first > 0);
    CHECK(endings.second > 0);
  }
  SECTION("uav_coverage, [5, 5, 5] maps of 3 agents, k = 2") {
    const EnvOptions options = {{"agents", 3}, {"grid", 6}, {"obstacles", 2}, {"window", 5}, {"max_steps", 6}};
    const auto endings = CheckAgainstUnstacked("uav_coverage", options, 2, 2, 40, 15);
    CHECK(endings.first + endings.second > 0);
  }
}

TEST_CASE("FrameStack: frame_stack 1 is the group as it was", "[framestack]") {
  std::unique_ptr<EnvGroup> legacy;
  REQUIRE(EnvGroup::Create("Pendulum-v1", {}, 3, 21, &legacy).ok());
  auto one = MakeGroup("Pendulum-v1", {}, 3, 21, 1);
  CHECK(one->frame_stack() == 1);
  CHECK(one->spec().observation == legacy->spec().observation);
  CHECK(one->spec().observation == one->env_spec().observation);
  CHECK(one->obs_numel() == one->frame_numel());
  RandomActions actions(one->spec(), one->rows(), 22);
  for (int t = 0; t < 210; ++t) {  // past the 200-step limit
    actions.Draw();
    actions.Step(*one);
    actions.Step(*legacy);
    REQUIRE(Floats(one->obs(), 9) == Floats(legacy->obs(), 9));
    REQUIRE(one->final_obs() == legacy->final_obs());
  }
}

TEST_CASE("FrameStack: frame_stack outside [1, 64] is refused, naming it", "[framestack]") {
  std::unique_ptr<EnvGroup> g;
  for (int k : {0, -1, 65}) {
    INFO("k " << k);
    const Status s = EnvGroup::Create("CartPole-v1", {}, 1, 0, EnvGroupOptions{k}, &g);
    REQUIRE_FALSE(s.ok());
    CHECK(s.code() == Status::Code::kInvalidArgument);
    CHECK_THAT(s.message(),
               Catch::Contains("frame_stack") && Catch::Contains(std::to_string(k)) && Catch::Contains("1 to 64"));
  }
  CHECK(EnvGroup::Create("CartPole-v1", {}, 1, 0, EnvGroupOptions{kMaxFrameStack}, &g).ok());
  CHECK(g->spec().observation.shape == std::vector<int64_t>{4 * kMaxFrameStack});
}

TEST_CASE("FrameStack: the config's env.frame_stack reaches the group", "[framestack][config]") {
  FarmConfig config;
  REQUIRE(LoadConfig("", {"env.name=Debug-v0", "env.frame_stack=5", "env.options={obs_dim: 6}"}, &config).ok());
  REQUIRE(config.env.frame_stack == 5);
  std::unique_ptr<EnvGroup> g;
  REQUIRE(EnvGroup::Create(config.env, 2, 3, &g).ok());
  CHECK(g->frame_stack() == 5);
  CHECK(g->spec().observation.shape == std::vector<int64_t>{30});

  const Status bad = LoadConfig("", {"env.frame_stack=65"}, &config);
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.message(), Catch::Contains("env.frame_stack") && Catch::Contains("65"));
}

// A real WorkerClient with env.frame_stack 3 and env.normalize_obs: the Hello declares the stacked space,
// the statistics are of the stacked size, and what is sent is the stacked rows normalised element by element.
TEST_CASE("FrameStack: a worker stacks, then normalises with statistics of the stacked size",
          "[framestack][normalizer][worker]") {
  testing::StandInLearner learner;
  constexpr int k = 3;
  constexpr int kEnvs = 2;
  constexpr int64_t kStacked = 3 * k;
  FarmConfig config;
  config.seed = 5;
  config.env.name = "TestFrames-v0";
  config.env.num_envs = kEnvs;
  config.env.num_groups = 1;
  config.env.options = {{"max_steps", 4}};
  config.env.frame_stack = k;
  config.env.normalize_obs = true;
  config.env.obs_clip = 1000;
  config.ppo.rollout_length = 2;
  learner.StartWorker(config);

  std::string identity;
  wire::Envelope in;
  const Handshake hs = learner.AcceptHello(&identity);
  CHECK(hs.observation.shape == std::vector<int64_t>{kStacked});
  CHECK(hs.observation.low == std::vector<float>{-1, -2, -3, -1, -2, -3, -1, -2, -3});

  // The learner's statistics, one mean and variance per stacked element (all different), sent with the
  // reply to the first delta; from then on every element x_i is sent as (x_i - mean_i) / sqrt(var_i + 1e-8).
  RunningMoments global(kStacked);
  std::vector<float> two_rows(2 * kStacked);
  for (int64_t i = 0; i < kStacked; ++i) {
    two_rows[i] = static_cast<float>(i);  // mean i + 0.5 * (i + 1), variance ((i + 1) / 2)^2
    two_rows[kStacked + i] = static_cast<float>(2 * i + 1);
  }
  global.AddRows(two_rows.data(), 2);

  // What each env's stacked row holds, worked out independently: frames [t, episode, 0].
  auto expected_row = [&](int t, int episode) {
    std::vector<float> row;
    for (int j = k - 1; j >= 0; --j) {
      const int tj = std::max(t - j, 0);
      row.insert(row.end(), {static_cast<float>(tj), static_cast<float>(episode), 0.0f});
    }
    return row;
  };
  auto normalised = [&](const std::vector<float>& row) {
    std::vector<float> out(row.size());
    for (std::size_t i = 0; i < row.size(); ++i)
      out[i] = static_cast<float>((row[i] - global.mean()[i]) / std::sqrt(global.Variance(i) + 1e-8));
    return out;
  };

  bool synced = false;
  for (uint64_t seq = 0; seq <= 9; ++seq) {
    learner.ReceiveSkippingHeartbeats(&identity, &in);
    REQUIRE(in.has_step());
    const auto& req = in.step();
    REQUIRE(req.seq() == seq);
    INFO("seq " << seq);
    REQUIRE(ShapeOf(req.obs()) == std::vector<int64_t>{kEnvs, kStacked});
    if (req.has_stats_delta()) {
      CHECK(req.stats_delta().obs().mean_size() == kStacked);
      CHECK(req.stats_delta().obs().count() == (seq == 2 ? 3 * kEnvs : 2 * kEnvs));  // reset + 2 steps, 2 steps
    }
    const int t = static_cast<int>(seq % 4);  // always action 0: truncated every 4 steps
    // Episodes count from 2: Create resets every env once, and the worker resets its groups when it starts.
    const int episode = static_cast<int>(seq / 4) + 2;
    std::vector<float> obs(static_cast<std::size_t>(kEnvs * kStacked));
    std::memcpy(obs.data(), req.obs().data().data(), obs.size() * sizeof(float));
    if (synced) {
      const std::vector<float> want = normalised(expected_row(t, episode));
      for (int e = 0; e < kEnvs; ++e)
        for (int64_t i = 0; i < kStacked; ++i) {
          INFO("env " << e << " element " << i);
          CHECK(obs[e * kStacked + i] == Approx(want[i]).epsilon(1e-6).margin(1e-6));
        }
      if (t == 0) {  // truncated: the final observations are the stacked last frames, normalised alike
        REQUIRE(req.final_obs_index_size() == kEnvs);
        REQUIRE(ShapeOf(req.final_obs()) == std::vector<int64_t>{kEnvs, kStacked});
        std::vector<float> fin(static_cast<std::size_t>(kEnvs * kStacked));
        std::memcpy(fin.data(), req.final_obs().data().data(), fin.size() * sizeof(float));
        const std::vector<float> want_final = normalised(expected_row(4, episode - 1));
        for (int64_t i = 0; i < kStacked; ++i) CHECK(fin[kStacked + i] == Approx(want_final[i]).epsilon(1e-6));
      }
    }
    wire::Envelope reply;
    auto* a = reply.mutable_action();
    a->set_group(0);
    a->set_seq(req.seq());
    const std::vector<int64_t> actions(kEnvs, 0);
    SetTensor(a->mutable_action(), DType::kInt64, {kEnvs}, actions.data(), actions.size() * sizeof(int64_t));
    if (req.has_stats_delta() && !synced) {
      ToWire(global, a->mutable_normalizer()->mutable_obs());
      synced = true;
    }
    learner.Send(identity, reply);
  }
  const Status run_status = learner.StopAndJoin(identity);
  INFO(run_status.ToString());
  CHECK(run_status.ok());
}

}  // namespace farm
