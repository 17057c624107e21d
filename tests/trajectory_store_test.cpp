// TrajectoryStore: groups fill their columns of a time-major rollout.
#include "learner/train/trajectory_store.h"

#include <algorithm>
#include <vector>

#include "tests/store_test_util.h"

// LibTorch pulls in glog, whose CHECK would replace Catch's: include Catch last.
#undef CHECK
#include <catch2/catch.hpp>

using farm::LagStats;
using farm::Rollout;
using farm::Space;
using farm::TrajectoryStore;
using farm::testing::StepWithoutEnding;

TEST_CASE("groups record steps into their own columns and Take resets", "[store]") {
  TrajectoryStore store(/*T=*/2, /*obs_numel=*/2, Space::Discrete(4));
  const int a = store.AddGroup(2);
  const int b = store.AddGroup(1);
  REQUIRE(store.num_envs() == 3);

  const float obs_a0[] = {1, 2, 3, 4}, obs_b0[] = {5, 6};
  const int64_t act_a[] = {1, 0}, act_b[] = {1};
  const float logp_a[] = {-0.1f, -0.2f}, logp_b[] = {-0.3f};
  const float val_a[] = {0.5f, 0.6f}, val_b[] = {0.7f};
  const float rew_a[] = {1, 1}, rew_b[] = {2};
  const uint8_t no[] = {0, 0}, yes_no[] = {1, 0}, yes[] = {1};

  CHECK(store.max_abs_reward() == 0);
  store.RecordStep(a, obs_a0, act_a, logp_a, val_a, /*version=*/3);
  CHECK(store.pending(a));
  store.RecordOutcome(a, rew_a, yes_no, no);  // env 0 of a terminated
  CHECK_FALSE(store.pending(a));
  store.RecordStep(b, obs_b0, act_b, logp_b, val_b, 4);
  store.RecordOutcome(b, rew_b, no, yes);  // env of b truncated
  store.AddReward(b, 0, 0.25f);            // truncation bootstrap
  CHECK(store.max_abs_reward() == 2);      // as sent: the bootstrap's 0.25 not counted
  CHECK(store.steps(a) == 1);
  CHECK_FALSE(store.all_full());

  StepWithoutEnding(store, a, obs_a0, act_a, logp_a, val_a, rew_a, 4);
  CHECK(store.full(a));
  CHECK_FALSE(store.all_full());
  StepWithoutEnding(store, b, obs_b0, act_b, logp_b, val_b, rew_b, 4);
  REQUIRE(store.all_full());
  const float boot_a[] = {9, 8}, boot_b[] = {7};
  store.SetBootstrap(a, boot_a);
  store.SetBootstrap(b, boot_b);

  farm::LagStats lag;
  const auto r = store.Take({2}, /*current_version=*/5, &lag);
  REQUIRE(r.obs.sizes() == torch::IntArrayRef({2, 3, 2}));
  CHECK(r.obs[0][2][0].item<float>() == 5);  // b's column is 2
  CHECK(r.obs[1][1][1].item<float>() == 4);
  CHECK(r.actions[0][0].item<int64_t>() == 1);
  CHECK(r.actions[0][1].item<int64_t>() == 0);
  CHECK(r.dones[0][0].item<float>() == 1);
  CHECK(r.dones[0][1].item<float>() == 0);
  CHECK(r.dones[0][2].item<float>() == 1);
  CHECK(r.rewards[0][2].item<float>() == Approx(2.25));
  CHECK(r.logp[1][2].item<float>() == Approx(-0.3));
  CHECK(r.values[0][1].item<float>() == Approx(0.6));
  CHECK(r.last_value[0].item<float>() == 9);
  CHECK(r.last_value[2].item<float>() == 7);
  CHECK(lag.min == 1);
  CHECK(lag.max == 2);
  CHECK(lag.avg == Approx((2 + 2 + 1 + 1 + 1 + 1) / 6.0));
  CHECK(store.steps(a) == 0);
  CHECK_FALSE(store.all_full());
  // The largest |reward| is the run's, kept across rollouts.
  CHECK(store.max_abs_reward() == 2);
  const float negative[] = {-3, 0.5f};
  StepWithoutEnding(store, a, obs_a0, act_a, logp_a, val_a, negative, 6);
  CHECK(store.max_abs_reward() == 3);
  store.AddReward(a, 0, 10.0f);  // a bootstrap above every reward sent: not counted
  CHECK(store.max_abs_reward() == 3);
}

TEST_CASE("a group added mid-rollout keeps the others' data", "[store]") {
  TrajectoryStore store(3, 1, Space::Box({2}, {-1}, {1}));  // continuous actions of 2 floats
  const int a = store.AddGroup(1);
  const float obs[] = {42}, act[] = {0.5f, -0.5f}, lp[] = {-1}, v[] = {2}, rew[] = {1};
  StepWithoutEnding(store, a, obs, act, lp, v, rew);
  const int b = store.AddGroup(2);
  CHECK(store.steps(a) == 1);
  CHECK(store.steps(b) == 0);
  for (int t = 0; t < 2; ++t) {
    StepWithoutEnding(store, a, obs, act, lp, v, rew);
  }
  const float obs2[] = {7, 8}, act2[] = {1, 2, 3, 4}, lp2[] = {0, 0}, v2[] = {0, 0}, rew2[] = {0, 0};
  for (int t = 0; t < 3; ++t) {
    StepWithoutEnding(store, b, obs2, act2, lp2, v2, rew2);
  }
  REQUIRE(store.all_full());
  const auto r = store.Take({1}, 0, nullptr);
  CHECK(r.obs[0][0][0].item<float>() == 42);  // written before the relayout
  CHECK(r.obs[2][2][0].item<float>() == 8);
  REQUIRE(r.actions.sizes() == torch::IntArrayRef({3, 3, 2}));
  CHECK(r.actions[0][0][1].item<float>() == -0.5f);
  CHECK(r.actions[1][2][0].item<float>() == 3);
}

TEST_CASE("a removed group leaves the rollout and the others keep their data", "[store]") {
  // T = 2, obs of 2 floats, multi-discrete actions of 2 components: every field has a width > 1 somewhere.
  TrajectoryStore store(2, 2, Space::MultiDiscrete({3, 4}));
  const int a = store.AddGroup(1);
  const int b = store.AddGroup(2);
  const int c = store.AddGroup(1);
  REQUIRE(store.num_envs() == 4);
  const float lp[] = {0, 0}, v[] = {0, 0}, r[] = {1, 1};
  const uint8_t no[] = {0, 0};
  // Step 0 for everyone, then b's worker leaves in the middle of the rollout.
  const float oa0[] = {10, 11}, ob0[] = {20, 21, 22, 23}, oc0[] = {30, 31};
  const int64_t aa0[] = {1, 2}, ab0[] = {0, 0, 0, 0}, ac0[] = {2, 3};
  StepWithoutEnding(store, a, oa0, aa0, lp, v, r);
  StepWithoutEnding(store, b, ob0, ab0, lp, v, r);
  StepWithoutEnding(store, c, oc0, ac0, lp, v, r);
  store.RemoveGroup(b);
  CHECK(store.num_envs() == 2);
  const float oa1[] = {12, 13}, oc1[] = {32, 33};
  const int64_t aa1[] = {0, 1}, ac1[] = {1, 0};
  const float ra[] = {5}, rc[] = {7};
  const uint8_t yes[] = {1};
  store.RecordStep(a, oa1, aa1, lp, v, 1);
  store.RecordOutcome(a, ra, yes, no);
  StepWithoutEnding(store, c, oc1, ac1, lp, v, rc, 1);
  const float ba[] = {8}, bc[] = {9};
  store.SetBootstrap(a, ba);
  store.SetBootstrap(c, bc);
  REQUIRE(store.all_full());
  LagStats lag;
  const auto roll = store.Take({2}, 1, &lag);
  REQUIRE(roll.obs.sizes() == torch::IntArrayRef({2, 2, 2}));
  CHECK(torch::equal(roll.obs, torch::tensor({10.f, 11.f, 30.f, 31.f, 12.f, 13.f, 32.f, 33.f}).view({2, 2, 2})));
  CHECK(torch::equal(roll.actions, torch::tensor(std::vector<int64_t>{1, 2, 2, 3, 0, 1, 1, 0}).view({2, 2, 2})));
  CHECK(torch::equal(roll.rewards, torch::tensor({1.f, 1.f, 5.f, 7.f}).view({2, 2})));
  CHECK(torch::equal(roll.dones, torch::tensor({0.f, 0.f, 1.f, 0.f}).view({2, 2})));
  CHECK(torch::equal(roll.last_value, torch::tensor({8.f, 9.f})));
  CHECK(lag.min == 0);
  CHECK(lag.max == 1);
  // Workers that come and go (restarts, rejoins under new identities) do not grow the store.
  for (int i = 0; i < 100; ++i) store.RemoveGroup(store.AddGroup(64));
  CHECK(store.num_envs() == 2);
  CHECK(store.num_groups() == 103);
}

TEST_CASE("a removed group leaves the rollout and no longer blocks it", "[store]") {
  TrajectoryStore store(1, 1, Space::Discrete(2));
  const int a = store.AddGroup(1);
  const int b = store.AddGroup(2);
  const int c = store.AddGroup(1);
  const float o1[] = {1}, o2[] = {2, 3}, o3[] = {4}, lp[] = {0, 0}, v[] = {0, 0}, r[] = {1, 1};
  const int64_t act[] = {0, 1};
  StepWithoutEnding(store, a, o1, act, lp, v, r);
  store.RecordStep(b, o2, act, lp, v, 0);  // b's worker dies with its step pending
  StepWithoutEnding(store, c, o3, act, lp, v, r);
  CHECK_FALSE(store.all_full());
  store.RemoveGroup(b);
  REQUIRE(store.all_full());
  const float boot[] = {9};
  store.SetBootstrap(a, boot);
  store.SetBootstrap(c, boot);
  const auto roll = store.Take({1}, 0, nullptr);
  REQUIRE(roll.obs.sizes() == torch::IntArrayRef({1, 2, 1}));  // b's two columns are gone
  CHECK(roll.obs[0][0][0].item<float>() == 1);
  CHECK(roll.obs[0][1][0].item<float>() == 4);
  CHECK(roll.last_value.size(0) == 2);
  // Removing a full group keeps the count right.
  StepWithoutEnding(store, a, o1, act, lp, v, r);
  store.RemoveGroup(a);
  CHECK_FALSE(store.all_full());
  StepWithoutEnding(store, c, o3, act, lp, v, r);
  CHECK(store.all_full());
}

namespace {

// A uav_coverage-sized store (obs [5, 7, 7], 10 agents per env, a [3, 32, 32] state per env, T 64) with `groups`
// groups of 4 envs, every group one step in.
struct ScaleStore {
  static constexpr int kRows = 40;
  explicit ScaleStore(int groups) : store(64, 245, Space::Discrete(5), 3072, 10) {
    obs.assign(kRows * 245, 0.5f);
    state.assign(4 * 3072, 0.25f);
    for (int g = 0; g < groups; ++g) ids.push_back(store.AddGroup(kRows));
    for (int g : ids) Step(g);
  }
  void Step(int g) {
    static const uint8_t no[kRows] = {};
    store.RecordStep(g, obs.data(), act, small, small, 0, state.data());
    store.RecordOutcome(g, small, no, no);
  }
  TrajectoryStore store;
  std::vector<int> ids;
  std::vector<float> obs, state;
  int64_t act[kRows] = {};
  float small[kRows] = {};
};

int64_t CopiedBytes(const TrajectoryStore& s) {
  return s.copy_stats().record_bytes + s.copy_stats().take_gather_bytes;
}

}  // namespace

TEST_CASE("a join and a leave touch only the group's own data, however many groups are stored", "[store][scale]") {
  // What a join and a leave cost, measured with 4 and with 400 other groups (16 and 1,600 envs): the same.
  std::vector<int64_t> join_mapped;
  for (int others : {4, 400}) {
    ScaleStore s(others);
    const int64_t copied = CopiedBytes(s.store);
    const int64_t mapped = s.store.bytes();
    const int joined = s.store.AddGroup(ScaleStore::kRows);
    CHECK(CopiedBytes(s.store) == copied);  // nobody's data was copied, moved or zero-filled
    join_mapped.push_back(s.store.bytes() - mapped);
    s.store.RemoveGroup(s.ids[others / 2]);  // a leave in the middle of the columns
    s.store.RemoveGroup(joined);
    CHECK(CopiedBytes(s.store) == copied);
    CHECK(s.store.steps(s.ids[0]) == 1);  // the others' data is where it was
    CHECK(s.store.num_rows() == static_cast<int64_t>(others - 1) * ScaleStore::kRows);
  }
  // A join maps only its own arena: T x its rows, whatever is stored beside it.
  REQUIRE(join_mapped.size() == 2);
  CHECK(join_mapped[0] == join_mapped[1]);
  CHECK(join_mapped[0] >= 64 * ScaleStore::kRows * (245 * 4 + 8));
  CHECK(join_mapped[0] < 2 * 64 * ScaleStore::kRows * (245 * 4 + 8 + 4 * 4 + 8 + 3072 * 4 / 10) + 4096);
}

TEST_CASE("a steady run hands each rollout's arena to the trainer, copies nothing at Take and reuses arenas",
          "[store][scale]") {
  TrajectoryStore store(/*T=*/4, /*obs_numel=*/3, Space::Discrete(2), /*state_numel=*/2, /*agents_per_env=*/2);
  const int a = store.AddGroup(4);
  const int b = store.AddGroup(2);
  const float obs[12] = {}, state[4] = {1, 2, 3, 4}, small[4] = {};
  const int64_t act[4] = {};
  const uint8_t no[4] = {};
  auto fill = [&](std::initializer_list<int> groups) {
    for (int t = 0; t < 4; ++t)
      for (int g : groups) {
        store.RecordStep(g, obs, act, small, small, 0, state);
        store.RecordOutcome(g, small, no, no);
      }
    for (int g : groups) store.SetBootstrap(g, small);
    REQUIRE(store.all_full());
  };
  // The first rollout: both groups joined before the first step, so they share an arena from the start.
  fill({a, b});
  store.Take({3}, 0, nullptr, {2});
  CHECK(store.copy_stats().zero_copy_takes == 1);
  CHECK(store.copy_stats().take_gather_bytes == 0);
  int64_t mapped = 0;
  for (int i = 0; i < 10; ++i) {
    fill({a, b});
    const Rollout r = store.Take({3}, 0, nullptr, {2});
    CHECK(r.states.sizes() == torch::IntArrayRef({4, 3, 2}));
    CHECK(r.states[3][1][1].item<float>() == 4);  // group a, its env 1
    CHECK(r.states[3][2][1].item<float>() == 2);  // group b, its env 0
    if (i == 0) mapped = store.bytes();
    CHECK(store.bytes() == mapped);  // the trainer's rollout goes back to the pool: no new mappings
  }
  CHECK(store.copy_stats().zero_copy_takes == 11);
  CHECK(store.copy_stats().take_gather_bytes == 0);
  // A group joining mid-rollout gets its own arena; that rollout's Take gathers, the next is whole again.
  store.RecordStep(a, obs, act, small, small, 0, state);
  store.RecordOutcome(a, small, no, no);
  const int c = store.AddGroup(2);
  for (int t = 1; t < 4; ++t) {
    store.RecordStep(a, obs, act, small, small, 0, state);
    store.RecordOutcome(a, small, no, no);
  }
  store.SetBootstrap(a, small);
  fill({b, c});
  const Rollout gathered = store.Take({3}, 0, nullptr, {2});
  CHECK(gathered.obs.size(1) == 8);
  CHECK(store.copy_stats().take_gather_bytes > 0);
  const int64_t after_join = store.copy_stats().take_gather_bytes;
  fill({a, b, c});
  store.Take({3}, 0, nullptr, {2});
  CHECK(store.copy_stats().take_gather_bytes == after_join);
  CHECK(store.copy_stats().zero_copy_takes == 12);
}

// The learner copies a request's observations and states into the store at admission (NextStepInputs), in the
// same pass as its non-finite scan, and RecordStep then copies the rest: the rollout is the same as with
// RecordStep copying everything.
TEST_CASE("observations and states written ahead through NextStepInputs give the same rollout", "[store]") {
  const int64_t T = 3;
  TrajectoryStore plain(T, /*obs_numel=*/3, Space::Discrete(2), /*state_numel=*/2, /*agents_per_env=*/2);
  TrajectoryStore ahead(T, /*obs_numel=*/3, Space::Discrete(2), /*state_numel=*/2, /*agents_per_env=*/2);
  const int pa = plain.AddGroup(2), pb = plain.AddGroup(4);
  const int a = ahead.AddGroup(2), b = ahead.AddGroup(4);
  // No arena before the first record: nothing to write ahead into.
  CHECK(ahead.NextStepInputs(a, 0).obs == nullptr);
  const int64_t act[] = {1, 0, 1, 1};
  const float logp[] = {-0.1f, -0.2f, -0.3f, -0.4f}, val[] = {0.5f, 0.6f, 0.7f, 0.8f}, rew[] = {1, 2, 3, 4};
  const uint8_t no[4] = {};
  for (int64_t t = 0; t < T; ++t) {
    for (int g = 0; g < 2; ++g) {
      const int rows = g == 0 ? 2 : 4;
      std::vector<float> obs(static_cast<std::size_t>(rows * 3)), state(static_cast<std::size_t>(rows / 2 * 2));
      for (std::size_t i = 0; i < obs.size(); ++i) obs[i] = static_cast<float>(100 * t + 10 * g + static_cast<int64_t>(i));
      for (std::size_t i = 0; i < state.size(); ++i) state[i] = -static_cast<float>(100 * t + 10 * g + static_cast<int64_t>(i));
      if (t > 0) {
        // A step is pending: ahead 0 does not match; ahead 1 is where the next step goes.
        CHECK(ahead.NextStepInputs(g == 0 ? a : b, 0).obs == nullptr);
        const auto in = ahead.NextStepInputs(g == 0 ? a : b, 1);
        REQUIRE(in.obs != nullptr);
        REQUIRE(in.states != nullptr);
        std::copy(obs.begin(), obs.end(), in.obs);
        std::copy(state.begin(), state.end(), in.states);
        plain.RecordOutcome(g == 0 ? pa : pb, rew, no, no);
        ahead.RecordOutcome(g == 0 ? a : b, rew, no, no);
      }
      plain.RecordStep(g == 0 ? pa : pb, obs.data(), act, logp, val, t, state.data());
      // At t 0 the first record places the groups: the inputs go in with RecordStep.
      ahead.RecordStep(g == 0 ? a : b, t == 0 ? obs.data() : nullptr, act, logp, val, t,
                       t == 0 ? state.data() : nullptr, /*inputs_written=*/t > 0);
    }
  }
  for (int g : {a, b}) {
    ahead.RecordOutcome(g, rew, no, no);
    CHECK(ahead.NextStepInputs(g, 0).obs == nullptr);  // full: no next step in this rollout
  }
  for (int g : {pa, pb}) plain.RecordOutcome(g, rew, no, no);
  REQUIRE(plain.all_full());
  REQUIRE(ahead.all_full());
  CHECK(ahead.copy_stats().record_bytes == plain.copy_stats().record_bytes);
  const Rollout rp = plain.Take({3}, T, nullptr, {2});
  const Rollout ra = ahead.Take({3}, T, nullptr, {2});
  CHECK(torch::equal(ra.obs, rp.obs));
  CHECK(torch::equal(ra.states, rp.states));
  CHECK(torch::equal(ra.actions, rp.actions));
  CHECK(torch::equal(ra.rewards, rp.rewards));
  CHECK(rp.obs[2][5][2].item<float>() == 221);  // step 2, group b (10), its row 3 (column 5), element 2: 200 + 10 + 3 * 3 + 2
}

// learner.sync_fraction: a rank ends its rollout early. Group a has 5 whole steps, b 3 and a fourth pending (its
// outcome still to come), c all 8 and its bootstrap: every group has a value recorded at step 3, so the rollout can
// be cut there. Each group bootstraps from its own value at step 3, the steps past the cut are counted as left out,
// and b's outcome for its pending step is dropped when it comes.
TEST_CASE("a rollout cut early bootstraps every group from its value at the cut", "[store]") {
  TrajectoryStore store(/*T=*/8, /*obs_numel=*/1, Space::Discrete(3));
  const int a = store.AddGroup(1);
  const int b = store.AddGroup(2);
  const int c = store.AddGroup(1);
  CHECK(store.CutLength(1) == 0);  // nobody has acted
  const int64_t act[] = {1, 2};
  const float lp[] = {-0.5f, -0.5f}, rew[] = {1, 1};
  auto step = [&](int g, int t, bool complete) {
    const float obs[] = {100.0f * g + t, 100.0f * g + t + 0.5f};
    const float v[] = {10.0f * g + t, 10.0f * g + t + 0.5f};
    if (complete) {
      StepWithoutEnding(store, g, obs, act, lp, v, rew);
    } else {
      store.RecordStep(g, obs, act, lp, v, 0);
    }
  };
  for (int t = 0; t < 5; ++t) step(a, t, true);
  for (int t = 0; t < 3; ++t) step(b, t, true);
  step(b, 3, false);
  for (int t = 0; t < 8; ++t) step(c, t, true);
  const float boot_c[] = {-7};
  store.SetBootstrap(c, boot_c);

  // Values recorded: a's at steps 0..4 (its step 4 is complete; a cut at 5 would need the value of step 5), b's at
  // 0..3 (its pending step), c's everywhere.
  CHECK(store.CutLength(1) == 3);
  CHECK(store.CutLength(2) == 2);
  CHECK(store.CutLength(3) == 3);
  LagStats lag;
  CHECK_THROWS_WITH(store.Take({1}, 0, &lag, {}, 4), Catch::Contains("at 3 at most"));
  const Rollout r = store.Take({1}, /*current_version=*/0, &lag, {}, /*length=*/3);
  REQUIRE(r.obs.sizes() == torch::IntArrayRef({3, 4, 1}));
  REQUIRE(r.values.sizes() == torch::IntArrayRef({3, 4}));
  CHECK(r.obs[2][0][0].item<float>() == 2);       // a, step 2
  CHECK(r.obs[1][2][0].item<float>() == 101.5f);  // b's second row, step 1
  CHECK(r.obs[2][3][0].item<float>() == 202);     // c, step 2
  CHECK(r.last_value[0].item<float>() == 3);      // a's value at step 3
  CHECK(r.last_value[1].item<float>() == 13);     // b's, from its pending step
  CHECK(r.last_value[2].item<float>() == 13.5f);
  CHECK(r.last_value[3].item<float>() == 23);     // c's at step 3, not its bootstrap at 8
  CHECK(lag.counts.at(0) == 12);
  const auto& stats = store.copy_stats();
  CHECK(stats.cut_takes == 1);
  CHECK(stats.cut_steps == 3);
  CHECK(stats.cut_dropped_rows == (5 - 3) * 1 + (4 - 3) * 2 + (8 - 3) * 1);
  CHECK(store.steps(a) == 0);
  CHECK(store.steps(b) == 0);
  CHECK_FALSE(store.pending(b));

  // b's outcome for its step 3 comes now: dropped, as is a truncation bonus on it. Its next step starts the rollout.
  const uint8_t no[] = {0, 0};
  const float late[] = {50, 50};
  store.RecordOutcome(b, late, no, no);
  store.AddReward(b, 0, 1000.0f);
  CHECK(store.steps(b) == 0);
  CHECK_FALSE(store.pending(b));
  for (int t = 0; t < 8; ++t) {
    step(a, 10 + t, true);
    step(b, 10 + t, true);
    step(c, 10 + t, true);
  }
  const float boot[] = {0, 0};
  for (int g : {a, b, c}) store.SetBootstrap(g, boot);
  REQUIRE(store.all_full());
  const Rollout next = store.Take({1}, 0, &lag);
  REQUIRE(next.obs.sizes() == torch::IntArrayRef({8, 4, 1}));
  CHECK(next.obs[0][1][0].item<float>() == 110);  // b's first step of this rollout
  CHECK(next.rewards[0][1].item<float>() == 1);    // its own reward, not the dropped outcome's
  CHECK(next.rewards.sum().item<float>() == 32);
  CHECK(store.copy_stats().cut_takes == 1);
}

TEST_CASE("with a core a rollout is cut at a chunk's start", "[store]") {
  TrajectoryStore store(/*T=*/8, /*obs_numel=*/1, Space::Discrete(2), 0, 1, /*core_numel=*/2, /*bptt=*/2);
  const int a = store.AddGroup(1);
  const int64_t act[] = {1};
  const float obs[] = {1}, lp[] = {-1}, rew[] = {1}, core[] = {0.25f, 0.75f};
  const uint8_t no[] = {0};
  for (int t = 0; t < 6; ++t) {
    const float v[] = {static_cast<float>(t)};
    store.RecordInputs(a, obs);
    store.RecordOutputs(a, act, lp, v, 0, core);
    if (t < 5) store.RecordOutcome(a, rew, no, no);
  }
  // Step 5 pending: values at 0..5, so a cut at 5 in steps, 4 in chunks of 2.
  CHECK(store.CutLength(1) == 5);
  CHECK(store.CutLength(2) == 4);
  LagStats lag;
  CHECK_THROWS_WITH(store.Take({1}, 0, &lag, {}, 3), Catch::Contains("multiples of 2"));
  const Rollout r = store.Take({1}, 0, &lag, {}, 4);
  REQUIRE(r.core_states.sizes() == torch::IntArrayRef({2, 1, 2}));
  CHECK(r.core_states[1][0][1].item<float>() == 0.75f);
  CHECK(r.bptt == 2);
  CHECK(r.last_value[0].item<float>() == 4);
}
