// MultiCue-v0 (a multi-discrete action env) and EnvGroup's handling of multi-discrete actions: layout per
// agent row, range checks per component, and the errors that name the component.
#include <catch2/catch.hpp>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "worker/env.h"
#include "worker/env_group.h"
#include "worker/envs/multi_cue.h"

namespace farm {
namespace {

std::unique_ptr<EnvGroup> MakeGroup(const std::map<std::string, double>& options, int n, uint64_t seed) {
  std::unique_ptr<EnvGroup> group;
  const Status s = EnvGroup::Create("MultiCue-v0", options, n, seed, &group);
  INFO(s.ToString());
  REQUIRE(s.ok());
  return group;
}

// The cues an observation shows: the hot index of each component's one-hot block.
std::vector<int64_t> Cues(const float* obs, const std::vector<int64_t>& nvec) {
  std::vector<int64_t> cues;
  int64_t offset = 1;
  for (int64_t n : nvec) {
    int64_t hot = -1, count = 0;
    for (int64_t j = 0; j < n; ++j)
      if (obs[offset + j] == 1.0f) hot = j, ++count;
    REQUIRE(count == 1);
    cues.push_back(hot);
    offset += n;
  }
  return cues;
}

}  // namespace

TEST_CASE("MultiCue-v0: spec follows the options", "[env][multi_discrete]") {
  auto group = MakeGroup({}, 1, 0);
  const EnvSpec& spec = group->spec();
  CHECK(spec.action == Space::MultiDiscrete({2, 3, 4}));
  CHECK(spec.observation.shape == std::vector<int64_t>{10});
  CHECK(spec.reward_threshold == 8.0);
  auto uniform = MakeGroup({{"components", 5}, {"choices", 3}, {"spread", 0}, {"length", 2}}, 1, 0);
  CHECK(uniform->spec().action == Space::MultiDiscrete({3, 3, 3, 3, 3}));
  CHECK(uniform->spec().observation.numel() == 16);

  std::unique_ptr<EnvGroup> bad;
  Status s = EnvGroup::Create("MultiCue-v0", {{"components", 0}}, 1, 0, &bad);
  CHECK_THAT(s.message(), Catch::Contains("'components' must be a whole number in [1, 64], got 0"));
  s = EnvGroup::Create("MultiCue-v0", {{"choices", 1.5}}, 1, 0, &bad);
  CHECK_THAT(s.message(), Catch::Contains("'choices'"));
}

TEST_CASE("MultiCue-v0: reward is the fraction of components matched, episodes end after length steps",
          "[env][multi_discrete]") {
  const std::vector<int64_t> nvec{2, 3, 4};
  auto group = MakeGroup({{"length", 3}}, 2, 7);
  const int64_t obs_numel = group->obs_numel();
  for (int step = 0; step < 3; ++step) {
    // Env 0 answers every cue; env 1 answers component 0 right and the others wrong.
    std::vector<int64_t> actions;
    const std::vector<int64_t> c0 = Cues(group->obs(), nvec);
    const std::vector<int64_t> c1 = Cues(group->obs() + obs_numel, nvec);
    CHECK(group->obs()[0] == Approx(step / 3.0));
    actions.insert(actions.end(), c0.begin(), c0.end());
    actions.push_back(c1[0]);
    actions.push_back((c1[1] + 1) % 3);
    actions.push_back((c1[2] + 1) % 4);
    group->Step(actions.data(), nullptr);
    CHECK(group->reward()[0] == Approx(1.0));
    CHECK(group->reward()[1] == Approx(1.0 / 3.0));
    CHECK(static_cast<bool>(group->terminated()[0]) == (step == 2));
  }
  REQUIRE(group->finished().size() == 2);
  CHECK(group->finished()[0].episode_return == Approx(3.0));
  CHECK(group->finished()[1].episode_return == Approx(1.0));
  CHECK(group->finished()[0].length == 3);
}

TEST_CASE("MultiCue-v0: cues cover every choice of every component", "[env][multi_discrete]") {
  const std::vector<int64_t> nvec{2, 3, 4};
  auto group = MakeGroup({{"length", 1000}}, 4, 3);
  std::vector<std::vector<int>> seen(nvec.size());
  for (std::size_t i = 0; i < nvec.size(); ++i) seen[i].assign(static_cast<std::size_t>(nvec[i]), 0);
  const std::vector<int64_t> zeros(4 * nvec.size(), 0);
  for (int step = 0; step < 200; ++step) {
    for (int e = 0; e < 4; ++e) {
      const std::vector<int64_t> cues = Cues(group->obs() + e * group->obs_numel(), nvec);
      for (std::size_t i = 0; i < nvec.size(); ++i) ++seen[i][static_cast<std::size_t>(cues[i])];
    }
    group->Step(zeros.data(), nullptr);
  }
  // 800 draws per component: each of n choices about 800 / n times.
  for (std::size_t i = 0; i < nvec.size(); ++i)
    for (int count : seen[i]) CHECK(count > 800 / nvec[i] / 2);
}

TEST_CASE("EnvGroup: a multi-discrete action out of range names its row and component", "[env][multi_discrete]") {
  auto group = MakeGroup({}, 2, 0);
  std::vector<int64_t> actions{0, 0, 0, 1, 2, 3};
  group->Step(actions.data(), nullptr);  // every component at its largest legal value in env 1
  actions[4] = 3;                        // env 1, component 1 has 3 choices
  CHECK_THROWS_WITH(group->Step(actions.data(), nullptr),
                    Catch::Contains("env 1 got action 3 in component 1, expected [0, 3)"));
  actions[4] = 0;
  actions[0] = -1;
  CHECK_THROWS_AS(group->Step(actions.data(), nullptr), std::out_of_range);
  CHECK_THROWS_AS(group->Step(nullptr, nullptr), std::invalid_argument);
}

}  // namespace farm
