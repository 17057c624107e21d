// Tests for the worked example of docs/ENVIRONMENTS.md, GridWalk-v0
// (examples/envs/grid_walk): registration from a library outside worker/, a
// spec that follows its options, the reset/step contract, and EnvGroup's
// time limit on a [C, H, W] observation. No LibTorch.
#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/config.h"
#include "examples/envs/grid_walk/grid_walk.h"
#include "tests/repo_files.h"
#include "worker/env.h"
#include "worker/env_group.h"

namespace farm_examples {
namespace {

using farm::ActionRef;
using farm::EnvGroup;
using farm::EnvRegistry;
using farm::EnvSpec;
using farm::Space;
using farm::Status;
using farm::StepResult;

constexpr int kSize = 5;
constexpr int kCells = kSize * kSize;
constexpr int kNumel = 2 * kCells;

std::unique_ptr<EnvGroup> MakeGroup(const std::map<std::string, double>& options, int n, uint64_t seed) {
  std::unique_ptr<EnvGroup> group;
  const Status s = EnvGroup::Create("GridWalk-v0", options, n, seed, &group);
  INFO(s.ToString());
  REQUIRE(s.ok());
  REQUIRE(group != nullptr);
  return group;
}

Status CreateStatus(const std::map<std::string, double>& options) {
  std::unique_ptr<EnvGroup> group;
  return EnvGroup::Create("GridWalk-v0", options, 1, 0, &group);
}

// Checks that obs (one env's [2, size, size] floats) is one-hot in each
// channel with the goal in the last cell, and returns the agent's (row, col).
std::pair<int, int> AgentCell(const float* obs, int size) {
  const int cells = size * size;
  int agent = -1;
  for (int k = 0; k < cells; ++k) {
    REQUIRE((obs[k] == 0.0f || obs[k] == 1.0f));
    REQUIRE(obs[cells + k] == (k == cells - 1 ? 1.0f : 0.0f));
    if (obs[k] == 1.0f) {
      REQUIRE(agent == -1);
      agent = k;
    }
  }
  REQUIRE(agent >= 0);
  return {agent / size, agent % size};
}

StepResult Move(GridWalk& env, int64_t action, float* obs) {
  ActionRef a;
  a.discrete = &action;
  return env.step(a, obs);
}

}  // namespace

TEST_CASE("GridWalk: registered from its own library, visible through EnvRegistry", "[example]") {
  const auto names = EnvRegistry::Global().Names();
  CHECK(std::find(names.begin(), names.end(), "GridWalk-v0") != names.end());
  const farm::EnvFamily* family = EnvRegistry::Global().Find("GridWalk-v0");
  REQUIRE(family != nullptr);  // the whole-archive link kept the registration
  CHECK(family->default_options == farm::EnvOptions{{"size", 5}});
}

TEST_CASE("GridWalk: the spec follows the size option", "[example]") {
  const farm::EnvFamily* family = EnvRegistry::Global().Find("GridWalk-v0");
  REQUIRE(family != nullptr);
  const EnvSpec spec = family->spec(family->default_options);
  CHECK(spec.name == "GridWalk-v0");
  CHECK(spec.observation.shape == std::vector<int64_t>{2, 5, 5});
  CHECK(spec.observation == Space::Box({2, 5, 5}, {0.0f}, {1.0f}));
  CHECK(spec.action == Space::Discrete(4));
  CHECK(spec.max_episode_steps == 50);
  REQUIRE(spec.reward_threshold.has_value());
  CHECK(*spec.reward_threshold == Approx(0.93));  // 8 steps from the far corner: 1 - 7 * 0.01

  // `env.options` reach the spec through EnvGroup, which sizes its buffers from it.
  auto group = MakeGroup({{"size", 7}}, 2, 1);
  CHECK(group->spec().observation.shape == std::vector<int64_t>{2, 7, 7});
  CHECK(group->obs_numel() == 2 * 7 * 7);
  REQUIRE(group->spec().reward_threshold.has_value());
  CHECK(*group->spec().reward_threshold == Approx(0.89));  // 12 steps: 1 - 11 * 0.01
  for (int i = 0; i < group->size(); ++i) AgentCell(group->obs() + i * 2 * 7 * 7, 7);

  auto smallest = MakeGroup({{"size", 2}}, 1, 1);
  CHECK(smallest->spec().observation.shape == std::vector<int64_t>{2, 2, 2});
}

TEST_CASE("GridWalk: unknown options and bad sizes are InvalidArgument", "[example]") {
  const Status unknown = CreateStatus({{"width", 5}});
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.code() == Status::Code::kInvalidArgument);
  CHECK_THAT(unknown.message(), Catch::Contains("GridWalk-v0"));
  CHECK_THAT(unknown.message(), Catch::Contains("width"));
  CHECK_THAT(unknown.message(), Catch::Contains("size"));  // lists the known options

  for (double bad : {1.0, 27.0, 2.5, -5.0}) {
    INFO("size " << bad);
    const Status s = CreateStatus({{"size", bad}});
    REQUIRE_FALSE(s.ok());
    CHECK(s.code() == Status::Code::kInvalidArgument);
    CHECK_THAT(s.message(), Catch::Contains("size"));
  }
}

TEST_CASE("GridWalk: reset draws every non-goal cell from the env's own seeded RNG", "[example]") {
  auto first_cell = [](uint64_t seed) {
    GridWalk env(kSize, seed);
    std::vector<float> obs(kNumel, -1.0f);  // reset must overwrite every float
    env.reset(obs.data());
    return AgentCell(obs.data(), kSize);
  };
  CHECK(first_cell(42) == first_cell(42));

  GridWalk env(kSize, 3);
  std::vector<float> obs(kNumel);
  std::set<std::pair<int, int>> seen;
  for (int k = 0; k < 2000; ++k) {
    env.reset(obs.data());
    seen.insert(AgentCell(obs.data(), kSize));
  }
  CHECK(seen.size() == kCells - 1);  // every cell but the goal
  CHECK(seen.count({kSize - 1, kSize - 1}) == 0);
}

TEST_CASE("GridWalk: walking to the goal terminates with return 1 - 0.01 * (steps - 1)", "[example]") {
  SECTION("from the top-left corner, by hand") {
    // 4 steps down, 4 right: 8 steps, the first 7 pay -0.01, the 8th +1,
    // so the return is 1 - 0.07 = 0.93.
    GridWalk env(kSize, 1);
    std::vector<float> obs(kNumel);
    env.SetAgent(0, 0, obs.data());
    const std::vector<int64_t> path = {GridWalk::kDown, GridWalk::kDown,  GridWalk::kDown,  GridWalk::kDown,
                                       GridWalk::kRight, GridWalk::kRight, GridWalk::kRight, GridWalk::kRight};
    double ret = 0;
    for (std::size_t t = 0; t < path.size(); ++t) {
      INFO("step " << t + 1);
      const StepResult r = Move(env, path[t], obs.data());
      ret += r.reward;
      const bool last = t + 1 == path.size();
      CHECK(r.terminated == last);
      CHECK(r.reward == (last ? 1.0f : -0.01f));
      const int row = std::min<int>(static_cast<int>(t) + 1, 4);
      const int col = t < 4 ? 0 : static_cast<int>(t) - 3;
      CHECK(AgentCell(obs.data(), kSize) == std::make_pair(row, col));
    }
    CHECK(ret == Approx(0.93));
  }

  SECTION("from a random start, through EnvGroup") {
    constexpr int kN = 4;
    auto group = MakeGroup({}, kN, 11);
    for (int i = 0; i < kN; ++i) {
      INFO("env " << i);
      // Walk env i down, then right; the others bump into the top wall meanwhile.
      const auto [row, col] = AgentCell(group->obs() + i * kNumel, kSize);
      const int steps = (kSize - 1 - row) + (kSize - 1 - col);
      REQUIRE(steps >= 1);
      for (int t = 1; t <= steps; ++t) {
        std::vector<int64_t> actions(kN, GridWalk::kUp);
        actions[i] = t <= kSize - 1 - row ? GridWalk::kDown : GridWalk::kRight;
        group->Step(actions.data(), nullptr);
        CHECK(group->terminated()[i] == (t == steps));
        CHECK(group->truncated()[i] == 0);
      }
      REQUIRE(group->finished().size() == 1);
      CHECK(group->finished()[0].length == steps);
      CHECK(group->finished()[0].episode_return == Approx(1.0 - 0.01 * (steps - 1)));
      CHECK(group->final_obs_index().empty());  // a termination carries no final observation
      AgentCell(group->obs() + i * kNumel, kSize);  // already reset: a fresh start, not the goal
      group->Reset();
    }
  }
}

TEST_CASE("GridWalk: walls keep the agent in the grid", "[example]") {
  GridWalk env(kSize, 1);
  std::vector<float> obs(kNumel);
  // Each corner but the goal, with the two moves into its walls.
  const std::vector<std::tuple<int, int, int64_t, int64_t>> corners = {
      {0, 0, GridWalk::kUp, GridWalk::kLeft},
      {0, kSize - 1, GridWalk::kUp, GridWalk::kRight},
      {kSize - 1, 0, GridWalk::kDown, GridWalk::kLeft},
  };
  for (const auto& [row, col, a, b] : corners) {
    for (int64_t action : {a, b}) {
      INFO("cell (" << row << ", " << col << "), action " << action);
      env.SetAgent(row, col, obs.data());
      const StepResult r = Move(env, action, obs.data());
      CHECK(AgentCell(obs.data(), kSize) == std::make_pair(row, col));
      CHECK(r.reward == -0.01f);
      CHECK_FALSE(r.terminated);
    }
  }
  // Many moves the same way end on the edge and stay there.
  env.SetAgent(2, 2, obs.data());
  for (int t = 0; t < 3 * kSize; ++t) Move(env, GridWalk::kLeft, obs.data());
  CHECK(AgentCell(obs.data(), kSize) == std::make_pair(2, 0));
  for (int t = 0; t < 3 * kSize; ++t) Move(env, GridWalk::kDown, obs.data());
  CHECK(AgentCell(obs.data(), kSize) == std::make_pair(kSize - 1, 0));
}

TEST_CASE("GridWalk: EnvGroup truncates at 50 steps, keeping the final observation", "[example]") {
  constexpr int kN = 3;
  auto group = MakeGroup({}, kN, 5);
  std::vector<int> start_col(kN);
  for (int i = 0; i < kN; ++i) start_col[i] = AgentCell(group->obs() + i * kNumel, kSize).second;

  // Always up: the goal is on the bottom row, so no episode ends by itself.
  const std::vector<int64_t> up(kN, GridWalk::kUp);
  for (int t = 1; t < 50; ++t) {
    group->Step(up.data(), nullptr);
    for (int i = 0; i < kN; ++i) {
      INFO("step " << t << " env " << i);
      REQUIRE(group->terminated()[i] == 0);
      REQUIRE(group->truncated()[i] == 0);
    }
    REQUIRE(group->finished().empty());
  }
  group->Step(up.data(), nullptr);  // step 50
  REQUIRE(group->final_obs_index() == std::vector<int32_t>{0, 1, 2});
  REQUIRE(group->final_obs().size() == static_cast<std::size_t>(kN * kNumel));
  REQUIRE(group->finished().size() == kN);
  for (int i = 0; i < kN; ++i) {
    INFO("env " << i);
    CHECK(group->truncated()[i] == 1);
    CHECK(group->terminated()[i] == 0);
    CHECK(group->reward()[i] == -0.01f);
    CHECK(group->finished()[i].length == 50);
    CHECK(group->finished()[i].episode_return == Approx(-0.5));  // 50 * -0.01
    // The last observation before the reset: on the top row, in the starting column.
    CHECK(AgentCell(group->final_obs().data() + i * kNumel, kSize) == std::make_pair(0, start_col[i]));
  }

  SECTION("reaching the goal on step 50 is a termination, not a truncation") {
    // Env 0 walks to the top-left corner and waits there until step 42, then
    // takes the 8 steps to the goal: 49 * -0.01 + 1 = 0.51.
    for (int t = 1; t <= 50; ++t) {
      std::vector<int64_t> actions(kN, GridWalk::kUp);
      const auto [row, col] = AgentCell(group->obs(), kSize);
      if (t <= 42) {
        actions[0] = row > 0 ? GridWalk::kUp : col > 0 ? GridWalk::kLeft : GridWalk::kUp;
      } else {
        REQUIRE((t > 43 || (row == 0 && col == 0)));
        actions[0] = t <= 46 ? GridWalk::kDown : GridWalk::kRight;
      }
      group->Step(actions.data(), nullptr);
    }
    CHECK(group->terminated()[0] == 1);
    CHECK(group->truncated()[0] == 0);
    CHECK(group->truncated()[1] == 1);
    CHECK(group->final_obs_index() == std::vector<int32_t>{1, 2});
    REQUIRE(group->finished().size() == kN);
    CHECK(group->finished()[0].length == 50);
    CHECK(group->finished()[0].episode_return == Approx(0.51));
  }
}

TEST_CASE("GridWalk: the example config loads and builds its env group", "[example]") {
  // The config sits beside the env.
  const farm::FarmConfig config = farm::testing::LoadRepoConfig("examples/envs/grid_walk/grid_walk.yaml");
  CHECK(config.env.name == "GridWalk-v0");
  CHECK(config.env.options == std::map<std::string, double>{{"size", 5}});
  auto group = MakeGroup(config.env.options, config.env.num_envs / config.env.num_groups, config.seed);
  CHECK(group->spec().observation.shape == std::vector<int64_t>{2, 5, 5});
  REQUIRE(config.target_return.has_value());
  CHECK(*config.target_return == Approx(*group->spec().reward_threshold));
}

TEST_CASE("GridWalk: the listings in docs/ENVIRONMENTS.md are the real code", "[example][doc]") {
  // Each listing is a fenced block after a line "<!-- from PATH -->"; its text
  // must occur verbatim in PATH (a whole file or an excerpt).
  auto read = [&](const std::string& path) {
    std::ifstream in(farm::testing::RepoPath(path));
    INFO(path);
    REQUIRE(in.good());
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  std::istringstream doc(read("docs/ENVIRONMENTS.md"));
  const std::string marker = "<!-- from ";
  int listings = 0;
  std::string line;
  while (std::getline(doc, line)) {
    if (line.rfind(marker, 0) != 0) continue;
    const std::string path = line.substr(marker.size(), line.find(" -->") - marker.size());
    REQUIRE(std::getline(doc, line));
    REQUIRE(line.rfind("```", 0) == 0);
    std::string body;
    while (std::getline(doc, line) && line != "```") body += line + "\n";
    INFO("listing " << listings + 1 << " from " << path << ":\n" << body);
    CHECK(read(path).find(body) != std::string::npos);
    ++listings;
  }
  CHECK(listings >= 6);
}

}  // namespace farm_examples
