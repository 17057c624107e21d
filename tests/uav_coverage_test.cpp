// Tests for uav_coverage (worker/envs/uav_coverage.h): its spec and options,
// seeded layouts, moves, blocking by the border, obstacles and other agents,
// coverage paid once per cell to the whole team, the observation window and
// the global state, and its runs through EnvGroup. No LibTorch.
#include "worker/envs/uav_coverage.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/config.h"
#include "tests/repo_files.h"
#include "worker/env.h"
#include "worker/env_group.h"

namespace farm {
namespace {

using Cells = std::vector<std::pair<int, int>>;

constexpr int64_t kStay = UavCoverage::kStay, kUp = UavCoverage::kUp, kDown = UavCoverage::kDown,
                  kLeft = UavCoverage::kLeft, kRight = UavCoverage::kRight;

// Options over the defaults; cell_reward 1 and collision_penalty 0.5 keep the arithmetic exact.
EnvOptions Options(const EnvOptions& user) {
  EnvOptions o = UavCoverageDefaultOptions();
  o["cell_reward"] = 1;
  o["collision_penalty"] = 0.5;
  for (const auto& [k, v] : user) o[k] = v;
  return o;
}

// An env with `agents` agents on a grid x grid map, window `window`, no obstacles drawn.
struct Fixture {
  Fixture(int agents, int grid, int window = 3, int cover_radius = 0, uint64_t seed = 1)
      : options(Options({{"agents", agents},
                         {"grid", grid},
                         {"obstacles", 0},
                         {"window", window},
                         {"cover_radius", cover_radius}})),
        env(ParseUavCoverageOptions(options), seed),
        obs(static_cast<std::size_t>(agents) * UavCoverage::kObsChannels * window * window) {
    env.reset(obs.data());
  }
  StepResult Step(const std::vector<int64_t>& actions) {
    ActionRef a;
    a.discrete = actions.data();
    return env.step(a, obs.data());
  }
  Cells Positions() const {
    Cells out;
    for (int a = 0; a < static_cast<int>(options.at("agents")); ++a) out.push_back(env.AgentCell(a));
    return out;
  }
  EnvOptions options;
  UavCoverage env;
  std::vector<float> obs;
};

std::unique_ptr<EnvGroup> MakeGroup(const EnvOptions& options, int n, uint64_t seed) {
  std::unique_ptr<EnvGroup> group;
  const Status s = EnvGroup::Create("uav_coverage", options, n, seed, &group);
  INFO(s.ToString());
  REQUIRE(s.ok());
  return group;
}

Status CreateStatus(const EnvOptions& options) {
  std::unique_ptr<EnvGroup> group;
  return EnvGroup::Create("uav_coverage", options, 1, 0, &group);
}

// Element (c, i, j) of agent a's [5, w, w] observation.
float ObsAt(const std::vector<float>& obs, int w, int agent, int c, int i, int j) {
  return obs[static_cast<std::size_t>(((agent * UavCoverage::kObsChannels + c) * w + i) * w + j)];
}

}  // namespace

TEST_CASE("uav_coverage: registered with its defaults, the spec follows the options", "[uav]") {
  const EnvFamily* family = EnvRegistry::Global().Find("uav_coverage");
  REQUIRE(family != nullptr);
  CHECK(family->default_options == EnvOptions{{"agents", 10},
                                              {"grid", 32},
                                              {"obstacles", 40},
                                              {"window", 7},
                                              {"max_steps", 200},
                                              {"cover_radius", 0},
                                              {"cell_reward", 0.1},
                                              {"collision_penalty", 0.05},
                                              {"battery", 0}});
  auto group = MakeGroup({}, 2, 1);
  const EnvSpec& spec = group->spec();
  CHECK(spec.observation == Space::Box({5, 7, 7}, {0.0f}, {1.0f}));
  CHECK(spec.action == Space::Discrete(5));
  CHECK(spec.num_agents == 10);
  REQUIRE(spec.global_state.has_value());
  CHECK(*spec.global_state == Space::Box({3, 32, 32}, {0.0f}, {1.0f}));
  CHECK(spec.max_episode_steps == 200);
  CHECK(group->rows() == 20);
  CHECK(group->state_numel() == 3 * 32 * 32);
  CHECK_FALSE(spec.agents_finish_early);  // battery 0: unlimited, no agent finishes early

  auto small = MakeGroup({{"agents", 3}, {"grid", 8}, {"window", 5}, {"max_steps", 9}}, 1, 1);
  CHECK(small->spec().observation.shape == std::vector<int64_t>{5, 5, 5});
  CHECK(small->spec().global_state->shape == std::vector<int64_t>{3, 8, 8});
  CHECK(small->spec().num_agents == 3);
  CHECK(small->spec().max_episode_steps == 9);
}

TEST_CASE("uav_coverage: bad options are InvalidArgument naming the option and what it must be", "[uav]") {
  auto refused = [](const EnvOptions& options, const std::string& why) {
    const Status s = CreateStatus(options);
    INFO(s.ToString());
    REQUIRE(s.code() == Status::Code::kInvalidArgument);
    CHECK_THAT(s.message(), Catch::Contains(why));
  };
  refused({{"window", 4}}, "option 'window' must be odd");
  refused({{"grid", 1}}, "option 'grid' must be a whole number from 2 to 1024, got 1");
  refused({{"agents", 0}}, "option 'agents' must be a whole number");
  refused({{"agents", 2.5}}, "option 'agents' must be a whole number");
  refused({{"grid", 4}, {"agents", 10}, {"obstacles", 7}}, "'agents' + 'obstacles' (10 + 7) must fit on the 16 cells");
  refused({{"collision_penalty", -1}}, "option 'collision_penalty' must be a finite number >= 0");
  refused({{"max_steps", 0}}, "option 'max_steps'");
  refused({{"speed", 2}}, "unknown option 'speed'");
}

TEST_CASE("uav_coverage: reset draws obstacles and distinct free start cells, per seed and per episode", "[uav]") {
  const UavCoverageOptions o = ParseUavCoverageOptions(UavCoverageDefaultOptions());
  std::vector<float> obs(static_cast<std::size_t>(o.agents) * 5 * 7 * 7);
  auto layout = [&](UavCoverage& env) {
    Cells out;
    for (int r = 0; r < o.grid; ++r)
      for (int c = 0; c < o.grid; ++c)
        if (env.IsObstacle(r, c)) out.emplace_back(r, c);
    for (int a = 0; a < o.agents; ++a) out.push_back(env.AgentCell(a));
    return out;
  };
  UavCoverage env(o, 7);
  env.reset(obs.data());
  const Cells first = layout(env);
  REQUIRE(first.size() == static_cast<std::size_t>(o.obstacles + o.agents));
  const std::set<std::pair<int, int>> distinct(first.begin(), first.end());
  CHECK(distinct.size() == first.size());  // agents on distinct cells, none on an obstacle
  CHECK(env.free_cells() == o.grid * o.grid - o.obstacles);
  CHECK(env.covered_cells() == o.agents);  // radius 0: each start cell
  for (int a = 0; a < o.agents; ++a) CHECK(env.IsCovered(env.AgentCell(a).first, env.AgentCell(a).second));

  UavCoverage same(o, 7), other(o, 8);
  same.reset(obs.data());
  other.reset(obs.data());
  CHECK(layout(same) == first);
  CHECK(layout(other) != first);
  env.reset(obs.data());  // a new episode, a new map
  CHECK(layout(env) != first);
}

TEST_CASE("uav_coverage: the five moves, each new cell paid once", "[uav]") {
  Fixture f(1, 5);
  f.env.SetLayout({}, {{2, 2}}, f.obs.data());
  CHECK(f.env.covered_cells() == 1);
  struct Move {
    int64_t action;
    std::pair<int, int> cell;
    float reward;
  };
  const std::vector<Move> moves = {{kUp, {1, 2}, 1.0f},   {kRight, {1, 3}, 1.0f}, {kDown, {2, 3}, 1.0f},
                                   {kLeft, {2, 2}, 0.0f},  // back on the start cell: already covered
                                   {kStay, {2, 2}, 0.0f}, {kDown, {3, 2}, 1.0f},  {kUp, {2, 2}, 0.0f}};
  for (const Move& m : moves) {
    INFO("action " << m.action);
    const StepResult r = f.Step({m.action});
    CHECK(f.env.AgentCell(0) == m.cell);
    CHECK(r.reward == m.reward);
    CHECK_FALSE(r.terminated);
    CHECK(f.env.last_collisions() == 0);
  }
  CHECK(f.env.covered_cells() == 5);
}

TEST_CASE("uav_coverage: the border and obstacles block a move and cost the penalty", "[uav]") {
  Fixture f(1, 5);
  f.env.SetLayout({{0, 1}}, {{0, 0}}, f.obs.data());
  for (int64_t a : {kUp, kLeft, kRight}) {  // off the top, off the left, onto the obstacle at (0, 1)
    INFO("action " << a);
    const StepResult r = f.Step({a});
    CHECK(f.env.AgentCell(0) == std::make_pair(0, 0));
    CHECK(r.reward == -0.5f);
    CHECK(f.env.last_collisions() == 1);
  }
  CHECK(f.Step({kDown}).reward == 1.0f);
  CHECK(f.env.AgentCell(0) == std::make_pair(1, 0));
  CHECK_FALSE(f.env.IsCovered(0, 1));  // obstacles are never covered
}

TEST_CASE("uav_coverage: agents block each other by the documented rules", "[uav]") {
  SECTION("two agents moving onto one cell are both blocked") {
    Fixture f(2, 5);
    f.env.SetLayout({}, {{2, 1}, {2, 3}}, f.obs.data());
    const StepResult r = f.Step({kRight, kLeft});
    CHECK(f.Positions() == Cells{{2, 1}, {2, 3}});
    CHECK(f.env.last_collisions() == 2);
    CHECK(r.reward == -1.0f);
  }
  SECTION("two agents swapping cells are both blocked") {
    Fixture f(2, 5);
    f.env.SetLayout({}, {{2, 1}, {2, 2}}, f.obs.data());
    f.Step({kRight, kLeft});
    CHECK(f.Positions() == Cells{{2, 1}, {2, 2}});
    CHECK(f.env.last_collisions() == 2);
  }
  SECTION("moving onto an agent that stays is blocked; staying is not a collision") {
    Fixture f(2, 5);
    f.env.SetLayout({}, {{2, 1}, {2, 2}}, f.obs.data());
    f.Step({kRight, kStay});
    CHECK(f.Positions() == Cells{{2, 1}, {2, 2}});
    CHECK(f.env.last_collisions() == 1);
  }
  SECTION("a chain behind a blocked agent is blocked too") {
    Fixture f(3, 5);
    // Agent 2 at the right border tries to leave; 1 follows it, 0 follows 1.
    f.env.SetLayout({}, {{2, 2}, {2, 3}, {2, 4}}, f.obs.data());
    const StepResult r = f.Step({kRight, kRight, kRight});
    CHECK(f.Positions() == Cells{{2, 2}, {2, 3}, {2, 4}});
    CHECK(f.env.last_collisions() == 3);
    CHECK(r.reward == -1.5f);
  }
  SECTION("following into a cell that its agent leaves is allowed") {
    Fixture f(3, 5);
    f.env.SetLayout({}, {{2, 1}, {2, 2}, {2, 3}}, f.obs.data());
    const StepResult r = f.Step({kRight, kRight, kRight});
    CHECK(f.Positions() == Cells{{2, 2}, {2, 3}, {2, 4}});
    CHECK(f.env.last_collisions() == 0);
    CHECK(r.reward == 1.0f);  // only (2, 4) is new
  }
  SECTION("four agents rotating around a square all move") {
    Fixture f(4, 5);
    f.env.SetLayout({}, {{1, 1}, {1, 2}, {2, 2}, {2, 1}}, f.obs.data());
    f.Step({kRight, kDown, kLeft, kUp});
    CHECK(f.Positions() == Cells{{1, 2}, {2, 2}, {2, 1}, {1, 1}});
    CHECK(f.env.last_collisions() == 0);
  }
  SECTION("the outcome does not depend on the agents' order") {
    // A crowded 4x4 map, random moves: the same agents listed in reverse end in the same cells.
    std::mt19937_64 rng(3);
    for (int trial = 0; trial < 200; ++trial) {
      Fixture f(8, 4), g(8, 4);
      Cells start;
      std::vector<int> cells(16);
      for (int i = 0; i < 16; ++i) cells[i] = i;
      for (int i = 0; i < 8; ++i) {
        std::swap(cells[i], cells[i + static_cast<int>(rng() % static_cast<uint64_t>(16 - i))]);
        start.emplace_back(cells[i] / 4, cells[i] % 4);
      }
      std::vector<int64_t> actions(8);
      for (auto& a : actions) a = static_cast<int64_t>(rng() % 5);
      f.env.SetLayout({}, start, f.obs.data());
      g.env.SetLayout({}, Cells(start.rbegin(), start.rend()), g.obs.data());
      const StepResult rf = f.Step(actions);
      const StepResult rg = g.Step(std::vector<int64_t>(actions.rbegin(), actions.rend()));
      const Cells pf = f.Positions();
      const Cells pg = g.Positions();
      INFO("trial " << trial);
      CHECK(pf == Cells(pg.rbegin(), pg.rend()));
      CHECK(rf.reward == rg.reward);
    }
  }
}

TEST_CASE("uav_coverage: random play keeps the invariants, reward is new cells less blocked moves", "[uav]") {
  // 12 agents and 6 obstacles on 6x6: crowded, so every blocking rule fires.
  const EnvOptions options = Options({{"agents", 12}, {"grid", 6}, {"obstacles", 6}, {"window", 3}});
  UavCoverage env(ParseUavCoverageOptions(options), 11);
  std::vector<float> obs(12 * 5 * 3 * 3);
  env.reset(obs.data());
  std::mt19937_64 rng(5);
  const int dr[5] = {0, -1, 1, 0, 0}, dc[5] = {0, 0, 0, -1, 1};
  int64_t total_collisions = 0;
  for (int t = 0; t < 500; ++t) {
    std::vector<int64_t> actions(12);
    for (auto& a : actions) a = static_cast<int64_t>(rng() % 5);
    Cells before;
    for (int a = 0; a < 12; ++a) before.push_back(env.AgentCell(a));
    const int covered_before = env.covered_cells();
    ActionRef ref;
    ref.discrete = actions.data();
    const StepResult r = env.step(ref, obs.data());
    std::set<std::pair<int, int>> occupied;
    int blocked = 0;
    for (int a = 0; a < 12; ++a) {
      const auto cell = env.AgentCell(a);
      INFO("step " << t << " agent " << a);
      REQUIRE(occupied.insert(cell).second);  // never two agents on a cell
      REQUIRE_FALSE(env.IsObstacle(cell.first, cell.second));
      REQUIRE(env.IsCovered(cell.first, cell.second));
      const auto moved = std::make_pair(before[a].first + dr[actions[a]], before[a].second + dc[actions[a]]);
      REQUIRE((cell == moved || cell == before[a]));  // the intended move, or none
      if (actions[a] != kStay && cell == before[a]) ++blocked;
    }
    REQUIRE(env.last_collisions() == blocked);
    REQUIRE(env.last_new_cells() == env.covered_cells() - covered_before);
    REQUIRE(r.reward == static_cast<float>(1.0 * env.last_new_cells() - 0.5 * blocked));
    total_collisions += blocked;
    if (r.terminated) {
      REQUIRE(env.covered_cells() == env.free_cells());
      break;
    }
  }
  CHECK(total_collisions > 0);
}

TEST_CASE("uav_coverage: cover_radius covers the square around an agent, overlaps paid once", "[uav]") {
  Fixture f(2, 7, 3, /*cover_radius=*/1);
  f.env.SetLayout({{0, 0}}, {{1, 1}, {1, 3}}, f.obs.data());
  // (0..2) x (0..2) less the obstacle, and (0..2) x (2..4): 8 + 9 - 3 shared = 14.
  CHECK(f.env.covered_cells() == 14);
  // Both step down: rows 3 of columns 0..4 are new, once each, though both squares hold (3, 2).
  const StepResult r = f.Step({kDown, kDown});
  CHECK(f.env.last_new_cells() == 5);
  CHECK(r.reward == 5.0f);
}

TEST_CASE("uav_coverage: the observation window at a border", "[uav]") {
  // 3 agents on 6x6, window 3. Agent 0 in the top-left corner, agent 1 beside it, an obstacle below it.
  Fixture f(3, 6, 3);
  f.env.SetLayout({{1, 0}}, {{0, 0}, {0, 1}, {4, 4}}, f.obs.data());
  f.Step({kStay, kStay, kUp});  // agent 2 covers (3, 4); nothing else changes
  const int w = 3;
  // Agent 0's window spans rows -1..1 and columns -1..1.
  const float blocked[3][3] = {{1, 1, 1}, {1, 0, 0}, {1, 1, 0}};
  const float covered[3][3] = {{0, 0, 0}, {0, 1, 1}, {0, 0, 0}};
  const float others[3][3] = {{0, 0, 0}, {0, 0, 1}, {0, 0, 0}};
  for (int i = 0; i < w; ++i) {
    for (int j = 0; j < w; ++j) {
      INFO("window cell " << i << ", " << j);
      CHECK(ObsAt(f.obs, w, 0, 0, i, j) == blocked[i][j]);
      CHECK(ObsAt(f.obs, w, 0, 1, i, j) == covered[i][j]);
      CHECK(ObsAt(f.obs, w, 0, 2, i, j) == others[i][j]);
      CHECK(ObsAt(f.obs, w, 0, 3, i, j) == 0.0f);  // column 0 / 5
      CHECK(ObsAt(f.obs, w, 0, 4, i, j) == 0.0f);  // row 0 / 5
      // Agent 2 at (3, 4): rows 2..4, columns 3..5, all inside; it sees no one, its own cell covered.
      CHECK(ObsAt(f.obs, w, 2, 0, i, j) == 0.0f);
      CHECK(ObsAt(f.obs, w, 2, 1, i, j) == ((i == 1 && j == 1) || (i == 2 && j == 1) ? 1.0f : 0.0f));
      CHECK(ObsAt(f.obs, w, 2, 2, i, j) == 0.0f);
      CHECK(ObsAt(f.obs, w, 2, 3, i, j) == 4.0f / 5.0f);
      CHECK(ObsAt(f.obs, w, 2, 4, i, j) == 3.0f / 5.0f);
    }
  }
  // Agent 1 at (0, 1) sees agent 0 on its left.
  CHECK(ObsAt(f.obs, w, 1, 2, 1, 0) == 1.0f);
  CHECK(ObsAt(f.obs, w, 1, 3, 0, 0) == 1.0f / 5.0f);
}

TEST_CASE("uav_coverage: the global state is the whole map", "[uav]") {
  Fixture f(2, 4, 3);
  f.env.SetLayout({{3, 3}, {0, 2}}, {{0, 0}, {2, 1}}, f.obs.data());
  f.Step({kRight, kDown});  // agents to (0, 1) and (3, 1)
  std::vector<float> state(3 * 16, -1.0f);
  f.env.state(state.data());
  const std::set<int> obstacles = {3 * 4 + 3, 0 * 4 + 2};
  const std::set<int> covered = {0, 1, 2 * 4 + 1, 3 * 4 + 1};
  const std::set<int> agents = {1, 3 * 4 + 1};
  for (int c = 0; c < 16; ++c) {
    INFO("cell " << c);
    CHECK(state[c] == (obstacles.count(c) ? 1.0f : 0.0f));
    CHECK(state[16 + c] == (covered.count(c) ? 1.0f : 0.0f));
    CHECK(state[32 + c] == (agents.count(c) ? 1.0f : 0.0f));
  }
}

TEST_CASE("uav_coverage: terminates when every free cell is covered", "[uav]") {
  Fixture f(1, 2, 1);
  f.env.SetLayout({}, {{0, 0}}, f.obs.data());
  CHECK_FALSE(f.Step({kRight}).terminated);
  CHECK_FALSE(f.Step({kDown}).terminated);
  const StepResult last = f.Step({kLeft});
  CHECK(last.terminated);
  CHECK(last.reward == 1.0f);
  CHECK(f.env.covered_cells() == 4);
}

TEST_CASE("uav_coverage: a battery is used by moves, and a UAV whose battery is empty is done", "[uav][battery]") {
  // 2 UAVs on a 4 x 4 map, battery 2, window 1: observation channels 0-4 and the battery's, 5.
  const EnvOptions options = Options({{"agents", 2}, {"grid", 4}, {"obstacles", 0}, {"window", 1}, {"battery", 2}});
  const EnvSpec spec = UavCoverageSpec(options);
  CHECK(spec.observation == Space::Box({6, 1, 1}, {0.0f}, {1.0f}));
  CHECK(*spec.global_state == Space::Box({4, 4, 4}, {0.0f}, {1.0f}));
  CHECK(spec.agents_finish_early);
  UavCoverage env(ParseUavCoverageOptions(options), 1);
  REQUIRE(env.obs_channels() == 6);
  std::vector<float> obs(2 * 6), state(4 * 16);
  env.reset(obs.data());
  env.SetLayout({}, {{0, 0}, {3, 3}}, obs.data());
  auto step = [&](std::vector<int64_t> actions) {
    ActionRef a;
    a.discrete = actions.data();
    return env.step(a, obs.data());
  };
  auto done = [&] {
    std::vector<uint8_t> out(2, 7);
    env.agents_done(out.data());
    return out;
  };
  CHECK(done() == std::vector<uint8_t>{0, 0});
  CHECK(obs[5] == 1.0f);  // a full battery
  // Staying is free; a move blocked by the border uses a unit all the same (and is a collision).
  StepResult r = step({kStay, kDown});
  CHECK(env.battery_left(0) == 2);
  CHECK(env.battery_left(1) == 1);
  CHECK(r.reward == -0.5f);
  CHECK(obs[6 + 5] == 0.5f);
  r = step({kRight, kUp});  // UAV 1 flies its last move: done, after covering (2, 3)
  CHECK(r.reward == 2.0f);
  CHECK_FALSE(r.terminated);
  CHECK(done() == std::vector<uint8_t>{0, 1});
  CHECK(obs[6 + 5] == 0.0f);
  env.state(state.data());
  CHECK(state[3 * 16 + 1] == 0.5f);          // UAV 0 at (0, 1), half its battery left
  CHECK(state[3 * 16 + 2 * 4 + 3] == 0.0f);  // UAV 1 at (2, 3), none
  // A done UAV's moves are ignored: it stays, blocks its cell, covers nothing and collides with nothing.
  r = step({kStay, kLeft});
  CHECK(env.AgentCell(1) == std::pair<int, int>{2, 3});
  CHECK(r.reward == 0.0f);
  CHECK(env.last_collisions() == 0);
  CHECK(done() == std::vector<uint8_t>{0, 1});
  // The last UAV's battery runs out: every UAV done terminates the episode, with the map not covered.
  r = step({kDown, kStay});
  CHECK(r.terminated);
  CHECK(env.covered_cells() < env.free_cells());
  CHECK(done() == std::vector<uint8_t>{1, 1});
  // A reset refills every battery.
  env.reset(obs.data());
  CHECK(done() == std::vector<uint8_t>{0, 0});
  CHECK(env.battery_left(0) == 2);
  CHECK(obs[5] == 1.0f);
  // Bad values are refused by name.
  std::unique_ptr<EnvGroup> group;
  const Status st = EnvGroup::Create("uav_coverage", Options({{"battery", -1}}), 1, 0, &group);
  CHECK_THAT(st.message(), Catch::Contains("option 'battery' must be a whole number from 0"));
}

TEST_CASE("uav_coverage: with a battery, EnvGroup ends UAVs alone and the team when all are done",
          "[uav][group][battery]") {
  // 1 env x 3 UAVs on a 5 x 5 map, battery 1: each UAV is done after its first move.
  auto group = MakeGroup(
      Options({{"agents", 3}, {"grid", 5}, {"obstacles", 0}, {"window", 3}, {"battery", 1}, {"max_steps", 50}}), 1, 4);
  REQUIRE(group->spec().agents_finish_early);
  using B = std::vector<uint8_t>;
  auto bytes = [](const uint8_t* p) { return B(p, p + 3); };
  std::vector<int64_t> actions{kUp, kStay, kStay};
  group->Step(actions.data(), nullptr);
  CHECK(bytes(group->terminated()) == B{1, 0, 0});
  CHECK(bytes(group->active()) == B{0, 1, 1});
  const float first = group->reward()[0];
  CHECK(group->reward()[1] == first);  // the team's reward of the step that ended it
  actions = {kStay, kDown, kStay};
  group->Step(actions.data(), nullptr);
  CHECK(bytes(group->terminated()) == B{0, 1, 0});
  CHECK(bytes(group->active()) == B{0, 0, 1});
  CHECK(group->reward()[0] == 0.0f);
  CHECK(group->finished().empty());
  actions = {kStay, kStay, kLeft};
  group->Step(actions.data(), nullptr);
  CHECK(bytes(group->terminated()) == B{1, 1, 1});
  CHECK(group->reward()[0] == 0.0f);
  CHECK(group->reward()[1] == 0.0f);
  CHECK(group->reward()[2] == group->team_reward()[0]);
  CHECK(bytes(group->active()) == B{1, 1, 1});  // a new episode: every UAV flies again
  REQUIRE(group->finished().size() == 1);
  CHECK(group->finished()[0].length == 3);
}

TEST_CASE("uav_coverage: through EnvGroup the team reward is on every agent row, truncated at max_steps",
          "[uav][group]") {
  constexpr int kEnvs = 3, kAgents = 4, kSteps = 20;
  const EnvOptions options =
      Options({{"agents", kAgents}, {"grid", 8}, {"obstacles", 5}, {"window", 3}, {"max_steps", kSteps}});
  auto group = MakeGroup(options, kEnvs, 9);
  const int64_t state_numel = group->state_numel();
  REQUIRE(state_numel == 3 * 8 * 8);
  std::mt19937_64 rng(2);
  std::vector<int64_t> actions(kEnvs * kAgents);
  std::vector<double> returns(kEnvs, 0.0);
  for (int t = 1; t <= kSteps; ++t) {
    for (auto& a : actions) a = static_cast<int64_t>(rng() % 5);
    group->Step(actions.data(), nullptr);
    for (int e = 0; e < kEnvs; ++e) {
      INFO("step " << t << " env " << e);
      for (int a = 1; a < kAgents; ++a) {
        const int row = e * kAgents + a;
        REQUIRE(group->reward()[row] == group->reward()[e * kAgents]);
        REQUIRE(group->truncated()[row] == group->truncated()[e * kAgents]);
      }
      REQUIRE(group->terminated()[e * kAgents] == 0);  // random moves do not cover 59 cells in 20 steps
      returns[e] += group->reward()[e * kAgents];
    }
    if (t < kSteps) REQUIRE(group->final_obs_index().empty());
  }
  std::vector<int32_t> all_rows(kEnvs * kAgents);
  for (int r = 0; r < kEnvs * kAgents; ++r) all_rows[r] = r;
  CHECK(group->final_obs_index() == all_rows);
  CHECK(group->final_obs().size() == static_cast<std::size_t>(kEnvs * kAgents * group->obs_numel()));
  CHECK(group->final_global_state().size() == static_cast<std::size_t>(kEnvs * state_numel));  // one per env
  REQUIRE(group->finished().size() == static_cast<std::size_t>(kEnvs));
  for (int e = 0; e < kEnvs; ++e) {
    CHECK(group->finished()[e].length == kSteps);
    CHECK(group->finished()[e].episode_return == Approx(returns[e]));
    // The final state was the last step's map (coverage > start cells); the new one starts over.
    auto covered = [&](const float* state) { return std::count(state + 64, state + 128, 1.0f); };
    CHECK(covered(group->final_global_state().data() + e * state_numel) > kAgents);
    CHECK(covered(group->global_state() + e * state_numel) == kAgents);
  }
}

TEST_CASE("uav_coverage: same seed gives the same episodes, different seeds differ", "[uav][group]") {
  const EnvOptions options = Options({{"agents", 5}, {"grid", 10}, {"obstacles", 8}, {"max_steps", 50}});
  auto run = [&](uint64_t seed) {
    auto group = MakeGroup(options, 2, seed);
    std::mt19937_64 rng(4);
    std::vector<int64_t> actions(10);
    std::vector<float> trace(group->obs(), group->obs() + 10 * group->obs_numel());
    for (int t = 0; t < 120; ++t) {  // two resets per env on the way
      for (auto& a : actions) a = static_cast<int64_t>(rng() % 5);
      group->Step(actions.data(), nullptr);
      trace.insert(trace.end(), group->obs(), group->obs() + 10 * group->obs_numel());
      trace.insert(trace.end(), group->global_state(), group->global_state() + group->size() * group->state_numel());
      trace.insert(trace.end(), group->reward(), group->reward() + 10);
    }
    return trace;
  };
  const auto a = run(21);
  CHECK(run(21) == a);
  CHECK(run(22) != a);
}

TEST_CASE("uav_coverage: configs/uav_coverage.yaml loads and builds its env group", "[uav]") {
  const FarmConfig config = testing::LoadRepoConfig("configs/uav_coverage.yaml");
  CHECK(config.env.name == "uav_coverage");
  auto group = MakeGroup(config.env.options, config.env.num_envs / config.env.num_groups, config.seed);
  CHECK(group->spec().num_agents == 10);
}

}  // namespace farm
