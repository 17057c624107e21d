// Several policies for a C++ env (worker/policy_split.h): agents assigned to policies by index patterns, each
// policy's rows of a group gathered (observations, rewards, flags, active masks, final observations) and its
// learner's actions scattered back to the right agents, and a policy whose agents have all finished while the env
// goes on refused by name. A test env writes, for each agent, its index, the step and the action it got last, so
// that a row read from the wrong agent or an action sent to the wrong one shows.
#include <fmt/format.h>

#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "tests/repo_files.h"
#include "worker/env.h"
#include "worker/env_group.h"
#include "worker/policy_split.h"

#include <catch2/catch.hpp>

namespace farm {
namespace {

constexpr int kAgents = 4;
constexpr int kLimit = 5;  // the time limit: envs are truncated after 5 steps

// Agent a sees [a, step, its last action]; the team's reward is the sum of the actions; agent 3 is done after
// `done_at` steps (0: never), while the others go on to the time limit.
class SplitEnv : public Env {
 public:
  explicit SplitEnv(int done_at) : done_at_(done_at) {}
  void reset(float* obs) override {
    step_ = 0;
    last_.assign(kAgents, -1);
    Write(obs);
  }
  StepResult step(const ActionRef& action, float* obs) override {
    ++step_;
    float reward = 0;
    for (int a = 0; a < kAgents; ++a) {
      last_[a] = action.discrete[a];
      reward += static_cast<float>(action.discrete[a]);
    }
    Write(obs);
    return {reward, false};
  }
  void state(float* out) const override { out[0] = static_cast<float>(step_); }
  void agents_done(uint8_t* out) const override {
    for (int a = 0; a < kAgents; ++a) out[a] = a == 3 && done_at_ > 0 && step_ >= done_at_;
  }

 private:
  void Write(float* obs) const {
    for (int a = 0; a < kAgents; ++a) {
      obs[3 * a] = static_cast<float>(a);
      obs[3 * a + 1] = static_cast<float>(step_);
      obs[3 * a + 2] = static_cast<float>(last_[a]);
    }
  }
  int done_at_;
  int step_ = 0;
  std::vector<int64_t> last_;
};

EnvOptions SplitDefaults() { return {{"done_at", 0}}; }
EnvSpec SplitSpec(const EnvOptions& o) {
  EnvSpec spec;
  spec.name = "PolicySplitTest-v0";
  spec.observation = Space::Box({3}, {-10.f}, {10.f});
  spec.action = Space::Discrete(5);
  spec.max_episode_steps = kLimit;
  spec.num_agents = kAgents;
  spec.agents_finish_early = true;
  spec.global_state = Space::Box({1}, {0.f}, {10.f});
  (void)o;
  return spec;
}
std::unique_ptr<Env> MakeSplit(const EnvOptions& o, uint64_t) {
  return std::make_unique<SplitEnv>(static_cast<int>(o.at("done_at")));
}
FARM_REGISTER_ENV("PolicySplitTest-v0", SplitDefaults(), SplitSpec, MakeSplit);

PolicyConfig Policy(const std::string& name, std::vector<std::string> agents) {
  PolicyConfig p;
  p.name = name;
  p.agents = std::move(agents);
  return p;
}

std::unique_ptr<EnvGroup> Group(int done_at) {
  std::unique_ptr<EnvGroup> group;
  REQUIRE(EnvGroup::Create("PolicySplitTest-v0", {{"done_at", done_at}}, 2, 1, &group).ok());
  group->Reset();
  return group;
}

TEST_CASE("AssignAgentIndices: the first policy whose pattern matches an agent's index takes it", "[policy_split]") {
  std::vector<std::vector<int>> owned;
  REQUIRE(AssignAgentIndices({Policy("a", {"0", "2"}), Policy("b", {"*"})}, kAgents, &owned).ok());
  CHECK(owned == std::vector<std::vector<int>>{{0, 2}, {1, 3}});
  REQUIRE(AssignAgentIndices({Policy("low", {"[0-1]"}), Policy("high", {"[2-9]"})}, kAgents, &owned).ok());
  CHECK(owned == std::vector<std::vector<int>>{{0, 1}, {2, 3}});

  Status s = AssignAgentIndices({Policy("a", {"0", "1"}), Policy("b", {"2"})}, kAgents, &owned);
  CHECK_THAT(s.message(), Catch::Contains("agent '3' belongs to no policy") && Catch::Contains("'0' to '3'") &&
                              Catch::Contains("b: [2]"));
  s = AssignAgentIndices({Policy("all", {"*"}), Policy("late", {"3"})}, kAgents, &owned);
  CHECK_THAT(s.message(), Catch::Contains("policy 'late' ([3]) matches none"));
  s = AssignAgentIndices({Policy("a", {"*"}), Policy("far", {"7"})}, kAgents, &owned);
  CHECK_THAT(s.message(), Catch::Contains("policy 'far'"));
}

TEST_CASE("ParsePolicyEndpoints: one NAME=ENDPOINT per policy, in the config's order", "[policy_split]") {
  FarmConfig c;
  c.policies = {Policy("a", {"0"}), Policy("b", {"*"})};
  std::vector<PolicyEndpoint> out;
  REQUIRE(ParsePolicyEndpoints(c, "b=tcp://h:2,a=tcp://h:1", false, &out).ok());
  REQUIRE(out.size() == 2);
  CHECK((out[0].name == "a" && out[0].endpoint == "tcp://h:1" && out[1].name == "b" && out[1].endpoint == "tcp://h:2"));
  CHECK_THAT(ParsePolicyEndpoints(c, "a=tcp://h:1", false, &out).message(),
             Catch::Contains("no endpoint for policy 'b'"));
  CHECK_THAT(ParsePolicyEndpoints(c, "a=x,c=y", false, &out).message(), Catch::Contains("no policy 'c'"));
  CHECK_THAT(ParsePolicyEndpoints(c, "a=x,a=y", false, &out).message(), Catch::Contains("'a' given twice"));
  CHECK_THAT(ParsePolicyEndpoints(c, "ipc:///tmp/x", false, &out).message(), Catch::Contains("expected NAME=ENDPOINT"));
  CHECK_THAT(ParsePolicyEndpoints(c, "tcp://h", false, &out).message(), Catch::Contains("one tcp://HOST:PORT"));
  CHECK_THAT(ParsePolicyEndpoints(c, "tcp://h:65535", false, &out).message(),
             Catch::Contains("ports 65535 to 65536"));
  CHECK_THAT(ParsePolicyEndpoints(c, "", false, &out).message(), Catch::Contains("no endpoint for policy 'a'"));
  REQUIRE(ParsePolicyEndpoints(c, "", true, &out).ok());
  CHECK((out.size() == 2 && out[0].endpoint.empty()));
}

TEST_CASE("ParsePolicyEndpoints: one tcp://HOST:PORT is the i-th policy's learner on PORT + i", "[policy_split]") {
  FarmConfig c;
  c.policies = {Policy("talk", {"0"}), Policy("hear", {"1"}), Policy("rest", {"*"})};
  std::vector<PolicyEndpoint> out;
  REQUIRE(ParsePolicyEndpoints(c, "tcp://learner:5555", false, &out).ok());
  REQUIRE(out.size() == 3);
  CHECK((out[0].name == "talk" && out[0].endpoint == "tcp://learner:5555"));
  CHECK((out[1].name == "hear" && out[1].endpoint == "tcp://learner:5556"));
  CHECK((out[2].name == "rest" && out[2].endpoint == "tcp://learner:5557"));
  REQUIRE(ParsePolicyEndpoints(c, "tcp://[::1]:7000", false, &out).ok());
  CHECK(out[2].endpoint == "tcp://[::1]:7002");
}

TEST_CASE("PolicyRows: each policy reads its own agents' rows and its actions reach them", "[policy_split]") {
  auto group = Group(0);
  PolicyRows even("even", {0, 2}, *group);
  PolicyRows odd("odd", {1, 3}, *group);
  REQUIRE(even.rows() == 4);  // 2 envs x 2 agents
  for (int t = 0; t <= kLimit; ++t) {
    REQUIRE(even.Gather(*group).ok());
    REQUIRE(odd.Gather(*group).ok());
    INFO("step " << t);
    for (int e = 0; e < 2; ++e) {
      for (int j = 0; j < 2; ++j) {
        const float* row = even.obs() + (e * 2 + j) * 3;
        const float* other = odd.obs() + (e * 2 + j) * 3;
        CHECK(row[0] == 2 * j);  // agents 0 and 2
        CHECK(other[0] == 2 * j + 1);  // agents 1 and 3
        // Each agent got the action its policy chose for it: even's row r chose r + 1, odd's row r chose 4 - r.
        const int step = t % kLimit;  // the envs were truncated and reset after step 5
        CHECK(row[1] == step);
        CHECK(row[2] == (step == 0 ? -1 : e * 2 + j + 1));
        CHECK(other[2] == (step == 0 ? -1 : 4 - (e * 2 + j)));
      }
    }
    if (t > 0) {
      // The team's reward on every row: even's 1+2 (env 0) or 3+4 (env 1), odd's 4+3 or 2+1.
      CHECK(even.reward()[0] == 10.f);
      CHECK(even.reward()[2] == 10.f);
      CHECK(odd.reward()[3] == 10.f);
    }
    if (t == kLimit) {
      // Truncated: both envs' rows, in the policy's numbering, with the observations before the reset.
      CHECK(even.final_obs_index() == std::vector<int32_t>{0, 1, 2, 3});
      CHECK(odd.truncated()[1] == 1);
      REQUIRE(odd.final_obs().size() == 4 * 3);
      CHECK(odd.final_obs()[3 * 3 + 0] == 3);  // env 1's agent 3
      CHECK(odd.final_obs()[3 * 3 + 1] == kLimit);
      CHECK(group->final_obs_index().size() == 8);
    } else {
      CHECK(even.final_obs_index().empty());
    }
    std::vector<int64_t> actions(group->rows(), -7);
    const std::vector<int64_t> even_actions{1, 2, 3, 4};
    const std::vector<int64_t> odd_actions{4, 3, 2, 1};
    even.Scatter(even_actions.data(), actions.data());
    odd.Scatter(odd_actions.data(), actions.data());
    // Env-major rows of the group: env 0 agents 0-3, then env 1's.
    CHECK(actions == std::vector<int64_t>{1, 4, 2, 3, 3, 2, 4, 1});
    group->Step(actions.data(), nullptr);
  }
}

TEST_CASE("PolicyRows: an agent that finishes early is inactive in its policy's rows, and a policy all of whose "
          "agents finished while the env goes on is refused",
          "[policy_split]") {
  auto group = Group(2);  // agent 3 is done after 2 steps
  PolicyRows mixed("mixed", {2, 3}, *group);
  PolicyRows alone("alone", {3}, *group);
  std::vector<int64_t> actions(group->rows(), 0);
  REQUIRE(mixed.Gather(*group).ok());
  REQUIRE(alone.Gather(*group).ok());
  group->Step(actions.data(), nullptr);
  group->Step(actions.data(), nullptr);  // agent 3's row terminated, the others go on
  REQUIRE(mixed.Gather(*group).ok());
  CHECK(mixed.terminated()[1] == 1);
  CHECK(mixed.terminated()[0] == 0);
  CHECK(mixed.active()[1] == 0);
  CHECK(mixed.active()[0] == 1);
  CHECK(mixed.any_inactive());
  const Status s = alone.Gather(*group);
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains("every agent of policy 'alone' (agents 3) has finished while the env goes "
                                          "on (for agents 0, 1, 2)"));
}

TEST_CASE("PolicyRows: a policy's normaliser counts and normalises its own agents' rows only", "[policy_split]") {
  auto group = Group(/*done_at=*/3);  // agent 3 finishes after 3 steps: its rows stop counting
  PolicyRows low("low", {0, 1}, *group);
  PolicyRows high("high", {2, 3}, *group);
  NormalizerOptions o;
  o.obs = o.reward = true;
  o.gamma = 0.5;
  Normalizer n_low(o, 3), n_high(o, 3);
  n_low.AddGroup(2, 2);
  n_high.AddGroup(2, 2);
  REQUIRE(low.Gather(*group).ok());
  REQUIRE(high.Gather(*group).ok());
  n_low.OnReset(0, low.ForNormalizer(*group));
  n_high.OnReset(0, high.ForNormalizer(*group));
  // high's rows, env-major: agent 2 of env 0, agent 3 of env 0, agent 2 of env 1, agent 3 of env 1.
  int64_t agent3_rows = 2;  // the reset's
  std::vector<int64_t> actions(static_cast<std::size_t>(group->rows()), 1);  // a team reward of 4 per step
  for (int t = 1; t <= 4; ++t) {
    group->Step(actions.data(), nullptr);
    REQUIRE(low.Gather(*group).ok());
    REQUIRE(high.Gather(*group).ok());
    n_low.OnStep(0, low.ForNormalizer(*group));
    n_high.OnStep(0, high.ForNormalizer(*group));
    agent3_rows += high.any_inactive() ? high.active()[1] + high.active()[3] : 2;
  }
  REQUIRE(agent3_rows < 10);  // agent 3 stopped acting within the 4 steps
  // Each policy's statistics are its acting agents': element 0 is the agent's index, 0 and 1 for `low`, 2 and 3 for
  // `high` (a group-wide normaliser would hold every agent's rows, with a mean near 1.5).
  CHECK(n_low.pending_obs().count() == 5 * 4);
  CHECK(n_low.pending_obs().mean()[0] == Approx(0.5));
  const int64_t high_rows = 10 + agent3_rows;  // agent 2's: 2 envs x 5 observations
  CHECK(n_high.pending_obs().count() == high_rows);
  CHECK(n_high.pending_obs().mean()[0] ==
        Approx((2.0 * 10 + 3.0 * static_cast<double>(agent3_rows)) / static_cast<double>(high_rows)));
  // Normalised with those statistics: `low`'s agent 0 below its mean, agent 1 above, by the same amount.
  const float* out = n_low.obs(0);
  CHECK(out[0] < 0.f);
  CHECK(out[0] == Approx(-out[3]));
  // Both scale the team's reward by the same running return (the env's, not a row's): equal scaled rewards.
  CHECK(n_low.pending_ret().count() == 4 * 2);
  CHECK(n_high.pending_ret().count() == 4 * 2);
  CHECK(n_low.reward(0)[0] == Approx(n_high.reward(0)[0]));
  CHECK(n_low.reward(0)[0] != Approx(4.f));  // scaled, not raw
}

TEST_CASE("policy_split: configs/uav_teams.yaml gives UAVs 0-4 to team_a and 5-9 to team_b", "[policy_split]") {
  const FarmConfig config = testing::LoadRepoConfig("configs/uav_teams.yaml");
  REQUIRE(config.policies.size() == 2);
  std::vector<std::vector<int>> owned;
  REQUIRE(AssignAgentIndices(config.policies, static_cast<int>(config.env.options.at("agents")), &owned).ok());
  CHECK(owned == std::vector<std::vector<int>>{{0, 1, 2, 3, 4}, {5, 6, 7, 8, 9}});
  std::vector<PolicyEndpoint> endpoints;
  REQUIRE(ParsePolicyEndpoints(config, "tcp://learner:5555", false, &endpoints).ok());
  CHECK((endpoints[0].endpoint == "tcp://learner:5555" && endpoints[1].endpoint == "tcp://learner:5556"));
}

}  // namespace
}  // namespace farm
