// Multi-agent envs below the learner: EnvGroup's rows (agent a of env e is row
// e * num_agents + a) and global states, the protocol-2 checks of common/wire.h
// (Hello.num_agents and global_state, StepRequest.global_state and
// final_global_state), and a real WorkerClient's messages to a stand-in
// learner. No LibTorch.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <iterator>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "common/config.h"
#include "common/wire.h"
#include "tests/env_test_util.h"
#include "tests/stand_in_learner.h"
#include "worker/env.h"
#include "worker/env_group.h"
#include "worker/envs/uav_coverage.h"
#include "worker/normalizer.h"
#include "worker/worker_client.h"

namespace farm {
namespace {

using testing::Floats;
using testing::FloatsOf;
using testing::MakeGroup;

// ---------------------------------------------------------------------------
// A test-only team env: kAgents agents, Discrete(4) actions. Agent a observes
// [a, t, episodes started]; the team reward is the sum of the agents' actions;
// any agent choosing 3 terminates. Global state [2, 2]: t, episodes, the last
// action sum, and 7. Time limit kTeamLimit.
constexpr int kAgents = 3;
constexpr int kTeamLimit = 4;

class TeamEnv : public Env {
 public:
  void reset(float* obs) override {
    t_ = 0;
    last_sum_ = 0;
    ++episodes_;
    Write(obs);
  }
  StepResult step(const ActionRef& action, float* obs) override {
    ++t_;
    StepResult r;
    last_sum_ = 0;
    for (int a = 0; a < kAgents; ++a) {
      last_sum_ += static_cast<int>(action.discrete[a]);
      r.terminated = r.terminated || action.discrete[a] == 3;
    }
    r.reward = static_cast<float>(last_sum_);
    Write(obs);
    return r;
  }
  void state(float* out) const override {
    out[0] = static_cast<float>(t_);
    out[1] = static_cast<float>(episodes_);
    out[2] = static_cast<float>(last_sum_);
    out[3] = 7.0f;
  }

 private:
  void Write(float* obs) const {
    for (int a = 0; a < kAgents; ++a) {
      obs[a * 3 + 0] = static_cast<float>(a);
      obs[a * 3 + 1] = static_cast<float>(t_);
      obs[a * 3 + 2] = static_cast<float>(episodes_);
    }
  }
  int t_ = 0;
  int episodes_ = 0;
  int last_sum_ = 0;
};

EnvSpec TeamSpec(const EnvOptions& /*resolved*/) {
  EnvSpec spec;
  spec.observation = Space::Box({3}, {0.0f}, {1e6f});
  spec.action = Space::Discrete(4);
  spec.max_episode_steps = kTeamLimit;
  spec.num_agents = kAgents;
  spec.global_state = Space::Box({2, 2}, {0.0f}, {1e6f});
  return spec;
}

FARM_REGISTER_ENV("TestTeam-v0", EnvOptions{}, TeamSpec,
                  [](const EnvOptions&, uint64_t) { return std::make_unique<TeamEnv>(); });

// A spec that promises a global state its env (no state() override) does not write.
class StatelessTeamEnv : public Env {
 public:
  void reset(float* obs) override { std::fill(obs, obs + kAgents * 3, 0.0f); }
  StepResult step(const ActionRef&, float* obs) override {
    reset(obs);
    return {};
  }
};
FARM_REGISTER_ENV("TestStatelessTeam-v0", EnvOptions{}, TeamSpec,
                  [](const EnvOptions&, uint64_t) { return std::make_unique<StatelessTeamEnv>(); });

// Specs that break the multi-agent rules, picked by option "bad".
EnvSpec BadSpec(const EnvOptions& resolved) {
  EnvSpec spec = TeamSpec(resolved);
  if (resolved.at("bad") == 1) spec.num_agents = 0;
  if (resolved.at("bad") == 2) spec.global_state = Space::Discrete(3);
  return spec;
}
EnvOptions BadDefaults() { return {{"bad", 0}}; }
FARM_REGISTER_ENV("TestBadTeam-v0", BadDefaults(), BadSpec,
                  [](const EnvOptions&, uint64_t) { return std::make_unique<TeamEnv>(); });

// ---------------------------------------------------------------------------
// A test-only env whose agents finish early (agents_finish_early): kAgents
// agents, Discrete(2); an agent that chooses 1 is done from that step on (its
// later actions are ignored). Agent a observes [a, t, 1 if done]; the team
// reward of step t is t; the env ends as a team when every agent is done, or
// at the time limit kTeamLimit + 2 (6 steps). Option "comeback" 1: an agent
// comes back one step after it finished (an env bug EnvGroup refuses).
class FinishEarlyEnv : public Env {
 public:
  explicit FinishEarlyEnv(bool comeback) : comeback_(comeback) {}
  void reset(float* obs) override {
    t_ = 0;
    std::fill(std::begin(done_), std::end(done_), 0);
    std::fill(std::begin(done_at_), std::end(done_at_), 0);
    Write(obs);
  }
  StepResult step(const ActionRef& action, float* obs) override {
    ++t_;
    for (int a = 0; a < kAgents; ++a) {
      if (!done_[a] && action.discrete[a] == 1) {
        done_[a] = 1;
        done_at_[a] = t_;
      } else if (comeback_ && done_[a] && t_ > done_at_[a]) {
        done_[a] = 0;
      }
    }
    Write(obs);
    return StepResult{static_cast<float>(t_), false};  // the team's end is EnvGroup's (all done) or the time limit
  }
  void agents_done(uint8_t* out) const override { std::copy(std::begin(done_), std::end(done_), out); }

 private:
  void Write(float* obs) const {
    for (int a = 0; a < kAgents; ++a) {
      obs[a * 3 + 0] = static_cast<float>(a);
      obs[a * 3 + 1] = static_cast<float>(t_);
      obs[a * 3 + 2] = static_cast<float>(done_[a]);
    }
  }
  bool comeback_;
  int t_ = 0;
  uint8_t done_[kAgents] = {};
  int done_at_[kAgents] = {};
};

EnvSpec FinishEarlySpec(const EnvOptions& resolved) {
  EnvSpec spec;
  spec.observation = Space::Box({3}, {0.0f}, {1e6f});
  spec.action = Space::Discrete(2);
  spec.max_episode_steps = kTeamLimit + 2;
  spec.num_agents = kAgents;
  spec.agents_finish_early = resolved.at("declared") != 0;
  return spec;
}
EnvOptions FinishEarlyDefaults() { return {{"comeback", 0}, {"declared", 1}}; }
FARM_REGISTER_ENV("TestFinishEarly-v0", FinishEarlyDefaults(), FinishEarlySpec, [](const EnvOptions& o, uint64_t) {
  return std::make_unique<FinishEarlyEnv>(o.at("comeback") != 0);
});
// The same spec with an env that does not answer agents_done.
FARM_REGISTER_ENV("TestFinishEarlyMute-v0", FinishEarlyDefaults(), FinishEarlySpec,
                  [](const EnvOptions&, uint64_t) { return std::make_unique<StatelessTeamEnv>(); });

std::vector<uint8_t> Bytes(const uint8_t* p, int n) { return std::vector<uint8_t>(p, p + n); }


}  // namespace

// ===========================================================================
// EnvGroup

TEST_CASE("EnvGroup: a team env has a row per agent, env-major, and a state per env", "[multi_agent][group]") {
  auto group = MakeGroup("TestTeam-v0", {}, 2, 1);
  CHECK(group->size() == 2);
  CHECK(group->num_agents() == kAgents);
  CHECK(group->rows() == 6);
  CHECK(group->state_numel() == 4);
  // After Create's reset: row e * 3 + a holds agent a of env e.
  for (int row = 0; row < 6; ++row) {
    INFO("row " << row);
    CHECK(Floats(group->obs() + row * 3, 3) == std::vector<float>{static_cast<float>(row % kAgents), 0.0f, 1.0f});
  }
  for (int e = 0; e < 2; ++e)  // one state per env (protocol 3), not one per agent row
    CHECK(Floats(group->global_state() + e * 4, 4) == std::vector<float>{0.0f, 1.0f, 0.0f, 7.0f});

  // Env 0 gets actions {0, 1, 2} (sum 3), env 1 gets {2, 2, 1} (sum 5): each env reads its own rows.
  const std::vector<int64_t> actions = {0, 1, 2, 2, 2, 1};
  group->Step(actions.data(), nullptr);
  for (int row = 0; row < 6; ++row) {
    INFO("row " << row);
    const float sum = row < 3 ? 3.0f : 5.0f;
    CHECK(group->reward()[row] == sum);  // the team reward on every agent row
    CHECK(group->terminated()[row] == 0);
    CHECK(group->truncated()[row] == 0);
    CHECK(Floats(group->obs() + row * 3, 3) == std::vector<float>{static_cast<float>(row % kAgents), 1.0f, 1.0f});
  }
  CHECK(Floats(group->global_state() + 0 * 4, 4) == std::vector<float>{1.0f, 1.0f, 3.0f, 7.0f});
  CHECK(Floats(group->global_state() + 1 * 4, 4) == std::vector<float>{1.0f, 1.0f, 5.0f, 7.0f});
  CHECK(group->finished().empty());
  CHECK(group->final_obs_index().empty());
  CHECK(group->final_global_state().empty());
}

TEST_CASE("EnvGroup: a team's termination and truncation apply to all its rows", "[multi_agent][group]") {
  auto group = MakeGroup("TestTeam-v0", {}, 3, 1);
  const std::vector<int64_t> calm(9, 1);
  // Step 1: agent 1 of env 1 (row 4) chooses 3: env 1 terminates, on its three rows.
  std::vector<int64_t> actions = calm;
  actions[4] = 3;
  group->Step(actions.data(), nullptr);
  for (int row = 0; row < 9; ++row) {
    INFO("row " << row);
    CHECK(group->terminated()[row] == (row / kAgents == 1 ? 1 : 0));
    CHECK(group->truncated()[row] == 0);
    CHECK(group->reward()[row] == (row / kAgents == 1 ? 5.0f : 3.0f));
  }
  REQUIRE(group->finished().size() == 1);
  CHECK(group->finished()[0].episode_return == 5.0f);
  CHECK(group->finished()[0].length == 1);
  CHECK(group->final_obs_index().empty());  // terminated: nothing to bootstrap
  // Env 1 was reset: its rows hold episode 2's first observation and state.
  CHECK(Floats(group->obs() + 4 * 3, 3) == std::vector<float>{1.0f, 0.0f, 2.0f});
  CHECK(Floats(group->global_state() + 1 * 4, 4) == std::vector<float>{0.0f, 2.0f, 0.0f, 7.0f});  // env 1

  // Steps 2..4: envs 0 and 2 reach the time limit on step 4, env 1 (restarted) does not.
  for (int t = 2; t <= 4; ++t) {
    group->Step(calm.data(), nullptr);
    if (t < 4) CHECK(group->final_obs_index().empty());
  }
  CHECK(group->final_obs_index() == std::vector<int32_t>{0, 1, 2, 6, 7, 8});
  for (int row = 0; row < 9; ++row) {
    INFO("row " << row);
    CHECK(group->truncated()[row] == (row / kAgents == 1 ? 0 : 1));
    CHECK(group->terminated()[row] == 0);
  }
  // Final observations per truncated row, aligned with final_obs_index; a final state per truncated env.
  REQUIRE(group->final_obs().size() == 6 * 3);
  REQUIRE(group->final_global_state().size() == 2 * 4);
  for (int k = 0; k < 6; ++k) {
    INFO("final row " << k);
    CHECK(Floats(group->final_obs().data() + k * 3, 3) ==
          std::vector<float>{static_cast<float>(k % kAgents), 4.0f, 1.0f});
  }
  for (int k = 0; k < 2; ++k)
    CHECK(Floats(group->final_global_state().data() + k * 4, 4) == std::vector<float>{4.0f, 1.0f, 3.0f, 7.0f});
  // The rows themselves already hold the next episode.
  CHECK(Floats(group->global_state() + 0, 4) == std::vector<float>{0.0f, 2.0f, 0.0f, 7.0f});
  REQUIRE(group->finished().size() == 2);
  CHECK(group->finished()[0].episode_return == 12.0f);  // 4 steps x 3
  CHECK(group->finished()[0].length == 4);
}

TEST_CASE("EnvGroup: multi-agent specs are checked and an unwritten state is refused", "[multi_agent][group]") {
  std::unique_ptr<EnvGroup> group;
  Status s = EnvGroup::Create("TestStatelessTeam-v0", {}, 1, 1, &group);
  CHECK(s.code() == Status::Code::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("global_state") && Catch::Contains("Env::state"));
  s = EnvGroup::Create("TestBadTeam-v0", {{"bad", 1}}, 1, 1, &group);
  CHECK_THAT(s.message(), Catch::Contains("num_agents must be >= 1, got 0"));
  s = EnvGroup::Create("TestBadTeam-v0", {{"bad", 2}}, 1, 1, &group);
  CHECK_THAT(s.message(), Catch::Contains("global_state must be a non-empty float32 box"));

  auto team = MakeGroup("TestTeam-v0", {}, 2, 1);
  std::vector<int64_t> actions(6, 0);
  actions[5] = 4;
  try {
    team->Step(actions.data(), nullptr);
    FAIL("no exception");
  } catch (const std::out_of_range& e) {
    CHECK_THAT(e.what(), Catch::Contains("row 5 (env 1, agent 2) got action 4, expected [0, 4)"));
  }
}

TEST_CASE("EnvGroup: a single-agent env has rows = envs and no state", "[multi_agent][group]") {
  auto group = MakeGroup("CartPole-v1", {}, 4, 1);
  CHECK(group->num_agents() == 1);
  CHECK(group->rows() == 4);
  CHECK(group->state_numel() == 0);
  CHECK_FALSE(group->spec().global_state.has_value());
  const std::vector<int64_t> actions(4, 1);
  group->Step(actions.data(), nullptr);
  CHECK(group->final_global_state().empty());
}

// ===========================================================================
// Protocol 2 checks (common/wire.h)

namespace {
wire::Hello TeamHello() {
  wire::Hello h;
  h.set_protocol_version(kProtocolVersion);
  h.set_num_envs(8);
  h.set_num_groups(2);
  h.set_num_agents(10);
  ToWire(Space::Box({5, 7, 7}, {0.f}, {1.f}), h.mutable_observation());
  ToWire(Space::Discrete(5), h.mutable_action());
  ToWire(Space::Box({3, 32, 32}, {0.f}, {1.f}), h.mutable_global_state());
  return h;
}
}  // namespace

TEST_CASE("EnvGroup: an agent that finishes early terminates its row alone, then is inactive with reward 0",
          "[multi_agent][group][finish_early]") {
  // 2 envs x 3 agents (rows 0-2: env 0, rows 3-5: env 1), time limit 6. Team reward of step t: t.
  auto group = MakeGroup("TestFinishEarly-v0", {}, 2, 1);
  REQUIRE(group->spec().agents_finish_early);
  using B = std::vector<uint8_t>;
  const B all_active(6, 1), none(6, 0);
  CHECK(Bytes(group->active(), 6) == all_active);
  CHECK_FALSE(group->any_inactive());
  auto step = [&](std::vector<int64_t> actions) { group->Step(actions.data(), nullptr); };

  // Step 1: env 0's agent 1 finishes. Its row alone is terminated, with the team's reward of the step, and it acts
  // no more (active 0 already on this step's observation); its env goes on.
  step({0, 1, 0, 0, 0, 0});
  CHECK(Bytes(group->terminated(), 6) == B{0, 1, 0, 0, 0, 0});
  CHECK(Bytes(group->truncated(), 6) == none);
  CHECK(Floats(group->reward(), 6) == std::vector<float>(6, 1.0f));
  CHECK(Bytes(group->active(), 6) == B{1, 0, 1, 1, 1, 1});
  CHECK(group->any_inactive());
  CHECK(Bytes(group->ended(), 2) == B{0, 0});
  CHECK(group->finished().empty());
  CHECK(group->final_obs_index().empty());
  CHECK(Floats(group->obs() + 3, 3) == std::vector<float>{1, 1, 1});  // still its observation, not a reset's

  // Step 2: the finished row carries no flag, reward 0; env 1's agent 2 finishes (its action 1 after it would be
  // ignored: agent 1 of env 0 chooses 0 and stays done).
  step({0, 0, 0, 0, 0, 1});
  CHECK(Bytes(group->terminated(), 6) == B{0, 0, 0, 0, 0, 1});
  CHECK(Floats(group->reward(), 6) == std::vector<float>{2, 0, 2, 2, 2, 2});
  CHECK(Bytes(group->active(), 6) == B{1, 0, 1, 1, 1, 0});
  CHECK(group->team_reward()[0] == 2.0f);

  // Step 3: env 0's other agents finish together: every agent done ends the env as a team termination, every row
  // flagged (the earlier finisher's reward still 0), reset, all active again. Env 1 goes on.
  step({1, 1, 1, 0, 0, 1});
  CHECK(Bytes(group->terminated(), 6) == B{1, 1, 1, 0, 0, 0});
  CHECK(Bytes(group->truncated(), 6) == none);
  CHECK(Floats(group->reward(), 6) == std::vector<float>{3, 0, 3, 3, 3, 0});
  CHECK(Bytes(group->active(), 6) == B{1, 1, 1, 1, 1, 0});
  CHECK(Bytes(group->ended(), 2) == B{1, 0});
  REQUIRE(group->finished().size() == 1);  // one per env, the team's return: 1 + 2 + 3
  CHECK(group->finished()[0].episode_return == 6.0f);
  CHECK(group->finished()[0].length == 3);
  CHECK(Floats(group->obs(), 3) == std::vector<float>{0, 0, 0});  // env 0 reset: t = 0

  // Steps 4-5: nothing new. Step 6: the time limit truncates env 1 with every row flagged truncated (whole envs,
  // each with its final observation) and env 1's agent 0 finishing on that very step is truncated with them.
  step({0, 0, 0, 0, 0, 0});
  step({0, 0, 0, 0, 0, 0});
  CHECK(Bytes(group->terminated(), 6) == none);
  CHECK(Floats(group->reward(), 6) == std::vector<float>{2, 2, 2, 5, 5, 0});
  step({0, 0, 0, 1, 0, 0});
  CHECK(Bytes(group->terminated(), 6) == none);
  CHECK(Bytes(group->truncated(), 6) == B{0, 0, 0, 1, 1, 1});
  CHECK(group->final_obs_index() == std::vector<int32_t>{3, 4, 5});
  CHECK(Floats(group->final_obs().data() + 6, 3) == std::vector<float>{2, 6, 1});  // agent 2's last observation
  CHECK(Floats(group->reward(), 6) == std::vector<float>{3, 3, 3, 6, 6, 0});
  CHECK(Bytes(group->active(), 6) == all_active);
  CHECK_FALSE(group->any_inactive());
  CHECK(Bytes(group->ended(), 2) == B{0, 1});
  REQUIRE(group->finished().size() == 1);
  CHECK(group->finished()[0].episode_return == 21.0f);  // 1 + ... + 6: the team's, whoever finished
  CHECK(group->finished()[0].length == 6);

  // A reset makes every row active again.
  step({1, 0, 0, 0, 0, 0});
  REQUIRE(group->any_inactive());
  group->Reset();
  CHECK(Bytes(group->active(), 6) == all_active);
  CHECK_FALSE(group->any_inactive());
}

TEST_CASE("EnvGroup: without agents_finish_early an env's agents share its end, and agents_done is never asked",
          "[multi_agent][group][finish_early]") {
  // The same env undeclared: action 1 changes nothing EnvGroup sees; the team ends at the time limit only.
  auto group = MakeGroup("TestFinishEarly-v0", {{"declared", 0}}, 1, 1);
  std::vector<int64_t> finish(3, 1);
  for (int t = 1; t < kTeamLimit + 2; ++t) {
    group->Step(finish.data(), nullptr);
    CHECK(Bytes(group->terminated(), 3) == std::vector<uint8_t>(3, 0));
    CHECK(Bytes(group->active(), 3) == std::vector<uint8_t>(3, 1));
    CHECK(Floats(group->reward(), 3) == std::vector<float>(3, static_cast<float>(t)));
  }
  CHECK_FALSE(group->any_inactive());
  // An env whose spec declares it must answer agents_done: refused at Create, by name.
  std::unique_ptr<EnvGroup> mute;
  const Status st = EnvGroup::Create("TestFinishEarlyMute-v0", {}, 1, 1, &mute);
  CHECK(st.code() == Status::Code::kInvalidArgument);
  CHECK_THAT(st.message(), Catch::Contains("declares agents_finish_early, but the env does not override "
                                           "Env::agents_done"));
}

TEST_CASE("EnvGroup: an agent that comes back after it finished is refused by name",
          "[multi_agent][group][finish_early]") {
  auto group = MakeGroup("TestFinishEarly-v0", {{"comeback", 1}}, 2, 1);
  std::vector<int64_t> actions{0, 0, 0, 0, 1, 0};
  group->Step(actions.data(), nullptr);
  REQUIRE(group->active()[4] == 0);
  std::fill(actions.begin(), actions.end(), 0);
  CHECK_THROWS_WITH(group->Step(actions.data(), nullptr),
                    Catch::Contains("TestFinishEarly-v0 (env 1 of the group): agents_done says agent 1 is not done, "
                                    "but it was at an earlier step"));
}

TEST_CASE("Normalizer: an agent's own end neither restarts its env's return nor scales its 0 rewards",
          "[multi_agent][normalizer][finish_early]") {
  // Two groups of one env with the same team rewards (t at step t, truncated at 6): in one, agent 0 finishes at
  // step 1 (its row terminated alone, then reward 0: the first row, which the return must not be read from).
  NormalizerOptions o;
  o.reward = true;
  o.gamma = 0.5;
  Normalizer early(o, 3), plain(o, 3);
  REQUIRE(early.AddGroup(1, kAgents) == 0);
  REQUIRE(plain.AddGroup(1, kAgents) == 0);
  auto g_early = MakeGroup("TestFinishEarly-v0", {}, 1, 1);
  auto g_plain = MakeGroup("TestFinishEarly-v0", {}, 1, 1);
  early.OnReset(0, *g_early);
  plain.OnReset(0, *g_plain);
  const std::vector<int64_t> first{1, 0, 0}, stay{0, 0, 0};
  for (int t = 1; t <= 8; ++t) {
    g_early->Step(t == 1 ? first.data() : stay.data(), nullptr);
    g_plain->Step(stay.data(), nullptr);
    early.OnStep(0, *g_early);
    plain.OnStep(0, *g_plain);
    INFO("step " << t);
    // The same returns G (restarted only when the env ended, after step 6), so the same statistics and scale.
    CHECK(early.pending_ret().count() == plain.pending_ret().count());
    CHECK(early.pending_ret().mean()[0] == Approx(plain.pending_ret().mean()[0]));
    CHECK(early.pending_ret().Variance(0) == Approx(plain.pending_ret().Variance(0)));
    CHECK(early.reward(0)[1] == plain.reward(0)[1]);
    CHECK(early.reward(0)[0] == (t >= 2 && t <= 6 ? 0.0f : plain.reward(0)[0]));  // inactive: 0, scaled 0
  }
  // By hand: G = 1, 2.5, 4.25, 6.125, 8.0625, 10.03125, then 1, 2.5 after the env's end.
  CHECK(plain.pending_ret().mean()[0] == Approx((1 + 2.5 + 4.25 + 6.125 + 8.0625 + 10.03125 + 1 + 2.5) / 8));
}

TEST_CASE("Normalizer: a finished agent's repeated observation is not counted", "[multi_agent][normalizer][finish_early]") {
  // Agent 0 finishes at step 1 and its env ends (the time limit) at step 6: steps 2-5 count 2 rows of 3.
  NormalizerOptions o;
  o.obs = true;
  Normalizer norm(o, 3);
  REQUIRE(norm.AddGroup(1, kAgents) == 0);
  auto group = MakeGroup("TestFinishEarly-v0", {}, 1, 1);
  norm.OnReset(0, *group);
  CHECK(norm.pending_obs().count() == 3);
  const std::vector<int64_t> first{1, 0, 0}, stay{0, 0, 0};
  int64_t want = 3;
  for (int t = 1; t <= 7; ++t) {
    group->Step(t == 1 ? first.data() : stay.data(), nullptr);
    norm.OnStep(0, *group);
    want += group->active()[0] ? 3 : 2;
    INFO("step " << t);
    CHECK(norm.pending_obs().count() == want);
  }
  // 3 at the reset, 2 after steps 1-5 (agent 0's row inactive), 3 after step 6 (the env ended and reset) and 7.
  CHECK(want == 3 + 5 * 2 + 3 + 3);
}

TEST_CASE("CheckHello: agents per env and the global state, protocol 1 is refused by name", "[multi_agent][wire]") {
  CHECK(kProtocolVersion == 3);
  Handshake hs;
  REQUIRE(CheckHello(TeamHello(), &hs).ok());
  CHECK(hs.group_size == 4);  // envs
  CHECK(hs.num_agents == 10);
  CHECK(hs.group_rows == 40);
  REQUIRE(hs.global_state.has_value());
  CHECK(*hs.global_state == Space::Box({3, 32, 32}, {0.f}, {1.f}));

  wire::Hello single = TeamHello();
  single.clear_num_agents();
  single.clear_global_state();
  REQUIRE(CheckHello(single, &hs).ok());
  CHECK(hs.num_agents == 1);  // absent: one agent per env, as every protocol-1 env
  CHECK(hs.group_rows == hs.group_size);
  CHECK_FALSE(hs.global_state.has_value());

  auto refused = [](const wire::Hello& h, const std::string& why) {
    Handshake out;
    const Status st = CheckHello(h, &out);
    REQUIRE_FALSE(st.ok());
    CHECK_THAT(st.message(), Catch::Contains(why));
  };
  wire::Hello h = TeamHello();
  h.set_protocol_version(1);  // a worker from before multi-agent envs
  refused(h, "protocol version 1 is not supported (expected 3)");
  h.set_protocol_version(2);  // a worker that sends a state per agent row
  refused(h, "protocol version 2 is not supported (expected 3)");
  h = TeamHello();
  h.set_num_envs(1u << 18);
  h.set_num_groups(1);
  h.set_num_agents(8);  // 2^21 rows
  refused(h, "num_envs x num_agents (262144 x 8) is more rows than one worker may have");
  h = TeamHello();
  ToWire(Space::Discrete(3), h.mutable_global_state());
  refused(h, "global state must be a float32 box");
  h = TeamHello();
  h.mutable_global_state()->add_shape(0);
  refused(h, "global state: box shape");
}

TEST_CASE("CheckStepGlobalState: [envs, state...] and a final state per truncated env",
          "[multi_agent][wire]") {
  // A group of 2 envs of 3 agents (6 rows), a [2, 2] state per env.
  const std::vector<int64_t> state_shape{2, 2};
  const std::vector<float> state(6 * 4, 0.5f);
  wire::StepRequest first;
  first.set_first(true);
  SetTensor(first.mutable_global_state(), DType::kFloat32, {2, 2, 2}, state.data(), 2 * 16);
  CHECK(CheckStepGlobalState(first, 6, 3, &state_shape).ok());

  wire::StepRequest step;
  step.set_seq(3);
  SetTensor(step.mutable_global_state(), DType::kFloat32, {2, 2, 2}, state.data(), 2 * 16);
  step.add_final_obs_index(3);
  step.add_final_obs_index(4);
  step.add_final_obs_index(5);
  SetTensor(step.mutable_final_global_state(), DType::kFloat32, {1, 2, 2}, state.data(), 16);
  CHECK(CheckStepGlobalState(step, 6, 3, &state_shape).ok());

  auto refused = [&](const wire::StepRequest& req, const std::vector<int64_t>* shape, const std::string& why) {
    const Status st = CheckStepGlobalState(req, 6, 3, shape);
    REQUIRE_FALSE(st.ok());
    CHECK_THAT(st.message(), Catch::Contains(why));
  };
  wire::StepRequest bad = step;
  bad.clear_global_state();
  refused(bad, &state_shape, "StepRequest.global_state: expected float32 [2, 2, 2]");
  bad = step;
  SetTensor(bad.mutable_global_state(), DType::kFloat32, {6, 2, 2}, state.data(), 6 * 16);  // per row (protocol 2)
  refused(bad, &state_shape, "StepRequest.global_state: expected float32 [2, 2, 2], got float32 [6, 2, 2]");
  bad = step;
  SetTensor(bad.mutable_final_global_state(), DType::kFloat32, {3, 2, 2}, state.data(), 3 * 16);  // per row
  refused(bad, &state_shape, "StepRequest.final_global_state: expected float32 [1, 2, 2]");
  bad = step;
  bad.add_final_obs_index(0);  // four final observations: not whole envs
  refused(bad, &state_shape, "4 entries are not whole envs of 3 agents");
  bad = step;
  bad.clear_final_obs_index();
  refused(bad, &state_shape, "final_global_state: sent without final_obs_index entries");
  refused(step, nullptr, "declared no global state");
  wire::StepRequest plain;
  CHECK(CheckStepGlobalState(plain, 6, 3, nullptr).ok());
}

TEST_CASE("MaxSessionMessageBytes counts the rows' global states", "[multi_agent][wire]") {
  const Space obs = Space::Box({5, 7, 7}, {0.f}, {1.f});
  const Space act = Space::Discrete(5);
  const int64_t plain = MaxSessionMessageBytes(40, obs, act);
  CHECK(MaxSessionMessageBytes(40, obs, act, std::nullopt) == plain);
  const int64_t with_state = MaxSessionMessageBytes(40, obs, act, Space::Box({3, 32, 32}, {0.f}, {1.f}));
  CHECK(with_state >= plain + 2 * 40 * 3 * 32 * 32 * 4);
}

// ===========================================================================
// The worker: a WorkerClient running uav_coverage against a stand-in learner

TEST_CASE("WorkerClient: a multi-agent Hello and requests that pass the learner's checks", "[multi_agent][worker]") {
  testing::StandInLearner learner;

  FarmConfig config;
  config.seed = 3;
  config.env.name = "uav_coverage";
  config.env.num_envs = 4;
  config.env.num_groups = 2;  // 2 envs x 3 agents = 6 rows per group
  config.env.options = {{"agents", 3}, {"grid", 6}, {"obstacles", 2}, {"window", 3}, {"max_steps", 3}};
  WorkerClient* client = learner.StartWorker(config);

  std::string identity;
  wire::Envelope in;
  wire::Hello hello;
  const Handshake hs = learner.AcceptHello(&identity, &hello);
  CHECK(hello.env_name() == "uav_coverage");
  CHECK(hs.num_agents == 3);
  CHECK(hs.group_rows == 6);
  CHECK(hs.observation.shape == std::vector<int64_t>{5, 3, 3});
  REQUIRE(hs.global_state.has_value());
  CHECK(hs.global_state->shape == std::vector<int64_t>{3, 6, 6});

  // Serve both groups "stay" until each has been truncated once (max_steps 3: at seq 3).
  std::vector<uint64_t> next_seq(2, 0);
  int truncated_requests = 0;
  int64_t replies = 0;
  while (truncated_requests < 2) {
    learner.ReceiveSkippingHeartbeats(&identity, &in);
    REQUIRE(in.has_step());
    const wire::StepRequest& req = in.step();
    const Status valid = CheckStepRequest(req, hs.group_rows, hs.observation.shape, next_seq);
    INFO(valid.ToString());
    REQUIRE(valid.ok());
    const Status state_valid = CheckStepGlobalState(req, hs.group_rows, hs.num_agents, &hs.global_state->shape);
    INFO(state_valid.ToString());
    REQUIRE(state_valid.ok());
    ++next_seq[req.group()];
    // One state per env, not per agent row (protocol 3).
    CHECK(req.global_state().shape(0) == 2);
    if (!req.first()) {
      // Staying never collides or covers: the team reward is 0 on all six rows.
      for (float r : FloatsOf(req.reward())) CHECK(r == 0.0f);
    }
    if (req.final_obs_index_size() > 0) {
      CHECK(req.seq() == 3);
      CHECK(std::vector<int32_t>(req.final_obs_index().begin(), req.final_obs_index().end()) ==
            std::vector<int32_t>{0, 1, 2, 3, 4, 5});
      CHECK(req.final_global_state().shape(0) == 2);  // one per truncated env
      REQUIRE(req.episodes_size() == 2);  // one per env, not per agent
      CHECK(req.episodes(0).length() == 3);
      ++truncated_requests;
    }
    wire::Envelope reply;
    auto* action = reply.mutable_action();
    action->set_group(req.group());
    action->set_seq(req.seq());
    const std::vector<int64_t> stay(6, 0);
    SetTensor(action->mutable_action(), DType::kInt64, {6}, stay.data(), stay.size() * sizeof(int64_t));
    learner.Send(identity, reply);
    ++replies;
  }
  const Status run_status = learner.StopAndJoin(identity);
  INFO(run_status.ToString());
  CHECK(run_status.ok());
  // Every reply, sent before Stop, stepped one group of 2 envs: env steps, not agent rows.
  CHECK(client->stats().env_steps == 2 * replies);
}

TEST_CASE("WorkerClient: env.decorrelate_episodes cuts each env's first episode and reports only whole ones",
          "[multi_agent][worker]") {
  testing::StandInLearner learner;
  FarmConfig config;
  config.seed = 5;
  config.env.name = "uav_coverage";
  config.env.num_envs = 16;
  config.env.num_groups = 1;  // 16 envs x 2 agents = 32 rows
  config.env.decorrelate_episodes = true;
  constexpr int kLimit = 6;
  config.env.options = {{"agents", 2}, {"grid", 6}, {"obstacles", 2}, {"window", 3}, {"max_steps", kLimit}};
  learner.StartWorker(config);
  std::string identity;
  wire::Envelope in;
  const Handshake hs = learner.AcceptHello(&identity);
  REQUIRE(hs.group_rows == 32);

  // Serve "stay" for 2 * kLimit steps: each env's first episode ends (truncated) at its cut, the next kLimit steps
  // later; only episodes of kLimit steps are reported.
  std::vector<std::vector<uint64_t>> ends(16);  // per env: the seqs of the requests that said it was truncated
  int64_t reported = 0;
  std::vector<uint64_t> next_seq(1, 0);
  for (int step = 0; step <= 2 * kLimit; ++step) {
    learner.ReceiveSkippingHeartbeats(&identity, &in);
    REQUIRE(in.has_step());
    const wire::StepRequest& req = in.step();
    REQUIRE(CheckStepRequest(req, hs.group_rows, hs.observation.shape, next_seq).ok());
    ++next_seq[0];
    for (int i = 0; i < req.final_obs_index_size(); i += 2) ends[req.final_obs_index(i) / 2].push_back(req.seq());
    for (const auto& ep : req.episodes()) CHECK(ep.length() == kLimit);
    reported += req.episodes_size();
    wire::Envelope reply;
    auto* action = reply.mutable_action();
    action->set_seq(req.seq());
    const std::vector<int64_t> stay(32, 0);
    SetTensor(action->mutable_action(), DType::kInt64, {32}, stay.data(), stay.size() * sizeof(int64_t));
    learner.Send(identity, reply);
  }
  CHECK(learner.StopAndJoin(identity).ok());
  std::set<uint64_t> first_ends;
  int64_t whole = 0;
  for (const auto& e : ends) {
    REQUIRE(!e.empty());
    CHECK(e[0] >= 1);
    CHECK(e[0] <= kLimit);
    first_ends.insert(e[0]);
    whole += e[0] == kLimit ? 1 : 0;  // a draw of the limit itself: a whole episode
    for (std::size_t k = 1; k < e.size(); ++k) CHECK(e[k] == e[k - 1] + kLimit);
    whole += static_cast<int64_t>(e.size()) - 1;
  }
  CHECK(first_ends.size() >= 3);  // spread over the episode, not all at the limit
  CHECK(reported == whole);

  // An env without a time limit has nothing to cut: refused at start, naming the key.
  FarmConfig unlimited;
  unlimited.env.name = "Debug-v0";
  unlimited.env.num_envs = 2;
  unlimited.env.num_groups = 1;
  unlimited.env.decorrelate_episodes = true;
  std::unique_ptr<WorkerClient> client;
  const Status refused = WorkerClient::Create(unlimited, 0, learner.endpoint(), &client);
  CHECK_THAT(refused.message(), Catch::Contains("env.decorrelate_episodes") && Catch::Contains("no time limit"));
}

TEST_CASE("WorkerClient: StepRequest.active is sent only while some agent has finished early",
          "[multi_agent][worker][finish_early]") {
  testing::StandInLearner learner;
  FarmConfig config;
  config.seed = 5;
  config.env.name = "uav_coverage";
  config.env.num_envs = 2;
  config.env.num_groups = 1;  // 2 envs x 3 agents = 6 rows
  // A battery of one move: the agent told to move once is done; max_steps 3 ends both envs at seq 3.
  config.env.options = {{"agents", 3}, {"grid", 6}, {"obstacles", 0}, {"window", 3}, {"max_steps", 3}, {"battery", 1}};
  learner.StartWorker(config);

  std::string identity;
  wire::Envelope in;
  const Handshake hs = learner.AcceptHello(&identity);
  CHECK(hs.observation.shape == std::vector<int64_t>{6, 3, 3});  // the battery channel

  std::vector<uint64_t> next_seq(1, 0);
  using B = std::vector<uint8_t>;
  auto bytes = [](const std::string& s) { return B(s.begin(), s.end()); };
  for (uint64_t seq = 0; seq <= 4; ++seq) {
    learner.ReceiveSkippingHeartbeats(&identity, &in);
    REQUIRE(in.has_step());
    const wire::StepRequest& req = in.step();
    INFO("seq " << req.seq());
    REQUIRE(req.seq() == seq);
    const Status valid = CheckStepRequest(req, hs.group_rows, hs.observation.shape, next_seq);
    INFO(valid.ToString());
    REQUIRE(valid.ok());
    REQUIRE(CheckStepWholeEnvs(req, hs.num_agents).ok());
    ++next_seq[0];
    if (seq == 0 || seq == 3 || seq == 4) {
      // Before any agent finished, and after both envs ended (time limit at seq 3: reset, every agent acts).
      CHECK(req.active().empty());
    } else {
      // Agent 1 of each env moved at seq 0 and used its battery: its row terminated alone at seq 1, then inactive
      // with reward 0 until the env's end.
      CHECK(bytes(req.active()) == B{1, 0, 1, 1, 0, 1});
      CHECK(bytes(req.terminated()) == (seq == 1 ? B{0, 1, 0, 0, 1, 0} : B(6, 0)));
      if (seq == 2) CHECK(FloatsOf(req.reward())[1] == 0.0f);
    }
    if (seq == 3) {
      CHECK(bytes(req.truncated()) == B(6, 1));
      CHECK(req.final_obs_index_size() == 6);
      CHECK(req.episodes_size() == 2);
    }
    wire::Envelope reply;
    auto* action = reply.mutable_action();
    action->set_group(0);
    action->set_seq(req.seq());
    std::vector<int64_t> actions(6, UavCoverage::kStay);
    if (seq == 0) actions[1] = actions[4] = UavCoverage::kUp;  // blocked at the border or not, a move uses the battery
    if (seq == 1) actions[1] = actions[4] = UavCoverage::kDown;  // ignored: those agents are done
    SetTensor(action->mutable_action(), DType::kInt64, {6}, actions.data(), actions.size() * sizeof(int64_t));
    learner.Send(identity, reply);
  }
  const Status run_status = learner.StopAndJoin(identity);
  INFO(run_status.ToString());
  CHECK(run_status.ok());
}

}  // namespace farm
