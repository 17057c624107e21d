// Data-parallel learners (learner/train/rank_group.h, gradient_reducer.h): where a process stands among the ranks
// (torchrun's and Slurm's environments), and two ranks over Gloo on the loopback, each a thread of this process
// with its own trainer: their update equals one learner's on the union of their data, with unequal sample counts;
// their parameters and Adam state stay bit-identical over updates of several minibatches (empty ones included);
// a diverged parameter and a rank that stops calling are errors, not hangs.
#include <torch/torch.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <chrono>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/config.h"
#include "common/running_stats.h"
#include "learner/train/rank_agreement.h"
#include "learner/model/policy.h"
#include "learner/train/adam_state.h"
#include "learner/train/gradient_reducer.h"
#include "learner/train/ppo.h"
#include "learner/train/rank_group.h"
#include "learner/train/rollout_preemption.h"
#include "tests/ppo_test_util.h"

// LibTorch includes glog, whose one-argument CHECK would silently replace Catch's: include Catch last.
#undef CHECK
#include <catch2/catch.hpp>

namespace farm {
namespace {

constexpr int64_t kObsDim = 6;

// A TCP port that nothing listens on now (the kernel's pick for port 0).
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  socklen_t len = sizeof(addr);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::function<std::optional<std::string>(const std::string&)> Env(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

ActorCritic MakePolicy(uint64_t seed) {
  torch::manual_seed(seed);
  return ActorCritic(Space::Box({kObsDim}, {-1}, {1}), Space::Discrete(4), std::vector<int>{32, 32});
}

// `fused`: ppo.fused_update, "off" (the LibTorch update) or "on" (the fused CPU update, which must then run).
PpoConfig Config(int num_minibatches, int epochs, const std::string& fused = "off") {
  PpoConfig c;
  c.num_minibatches = num_minibatches;
  c.update_epochs = epochs;
  c.lr = 3e-3;
  c.fused_update = fused;
  c.graph_update = "off";
  c.anneal_lr = false;
  return c;
}

// The rollouts' envs side by side: one rollout of N0 + N1 envs.
Rollout Union(const Rollout& a, const Rollout& b) {
  Rollout r;
  const auto cat = [](const torch::Tensor& x, const torch::Tensor& y, int64_t dim) { return torch::cat({x, y}, dim); };
  r.obs = cat(a.obs, b.obs, 1);
  r.actions = cat(a.actions, b.actions, 1);
  r.logp = cat(a.logp, b.logp, 1);
  r.values = cat(a.values, b.values, 1);
  r.rewards = cat(a.rewards, b.rewards, 1);
  r.dones = cat(a.dones, b.dones, 1);
  r.last_value = cat(a.last_value, b.last_value, 0);
  if (a.active.defined() || b.active.defined()) {
    const auto mask = [](const Rollout& x) { return x.active.defined() ? x.active : torch::ones_like(x.rewards); };
    r.active = cat(mask(a), mask(b), 1);
  }
  return r;
}

// Agents that finish early in `r`: every other row stops acting from a step of its own on, half of them
// terminated alone at their last step.
void FinishSomeAgents(Rollout* r) {
  const int64_t T = r->rewards.size(0), N = r->rewards.size(1);
  r->active = torch::ones({T, N});
  r->dones = r->dones.clone();
  for (int64_t n = 0; n < N; n += 2) {
    const int64_t last = (3 * n + 2) % (T - 1);
    r->active.narrow(0, last + 1, T - last - 1).select(1, n).zero_();
    r->dones.narrow(0, last, T - last).select(1, n).zero_();
    if (n % 4 == 0) r->dones[last][n] = 1;
  }
}

// The rendezvous port of the last RunRanks (its store serves other clients too: RolloutPreemption).
int last_port = 0;

// Runs `body(rank, group)` on `world` threads joined by a Gloo group on the loopback; rethrows the first error.
void RunRanks(int world, double timeout_s, const std::function<void(int, std::shared_ptr<RankGroup>)>& body) {
  const int port = FreePort();
  last_port = port;
  std::vector<std::exception_ptr> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        RankPlace place;
        place.rank = r;
        place.world_size = world;
        place.master_addr = "127.0.0.1";
        place.master_port = port;
        RankGroupOptions options;
        options.backend = "gloo";
        options.timeout_s = timeout_s;
        std::unique_ptr<RankGroup> group;
        const Status s = RankGroup::Create(place, options, &group);
        if (!s.ok()) throw std::runtime_error(s.message());
        body(r, std::shared_ptr<RankGroup>(std::move(group)));
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

torch::Tensor Flat(PpoTrainer& trainer) {
  ActorCritic policy = trainer.policy();
  return testing::FlatParameters(policy);
}

const torch::optim::AdamParamState& AdamOf(PpoTrainer& trainer, const torch::Tensor& p) {
  const auto* s = FindAdamState(trainer.optimizer(), p);
  if (s == nullptr) throw std::logic_error("no Adam state");
  return *s;
}

TEST_CASE("torchrun's and Slurm's environments say where a rank stands", "[ranks]") {
  RankPlace p;
  REQUIRE(ReadRankPlace(Env({}), &p).ok());
  CHECK(p.world_size == 1);
  CHECK(p.source == "single");

  REQUIRE(ReadRankPlace(Env({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "n1"},
                             {"MASTER_PORT", "29511"}}),
                        &p)
              .ok());
  CHECK(p.source == "torchrun");
  CHECK(p.rank == 3);
  CHECK(p.world_size == 4);
  CHECK(p.local_rank == 1);
  CHECK(p.master_addr == "n1");
  CHECK(p.master_port == 29511);

  // An srun step of several tasks; one task (the learner step of farm.sbatch, the batch script) is one rank.
  REQUIRE(ReadRankPlace(Env({{"SLURM_PROCID", "5"}, {"SLURM_STEP_NUM_TASKS", "8"}, {"SLURM_LOCALID", "1"},
                             {"SLURM_STEP_NODELIST", "gpu[03-04,9]"}}),
                        &p)
              .ok());
  CHECK(p.source == "slurm");
  CHECK(p.rank == 5);
  CHECK(p.world_size == 8);
  CHECK(p.local_rank == 1);
  CHECK(p.master_addr == "gpu03");
  CHECK(p.master_port == kDefaultMasterPort);
  REQUIRE(ReadRankPlace(Env({{"SLURM_PROCID", "0"}, {"SLURM_STEP_NUM_TASKS", "1"}, {"SLURM_NTASKS", "5"}}), &p).ok());
  CHECK(p.world_size == 1);

  // Errors name the variable and its value.
  Status s = ReadRankPlace(Env({{"RANK", "x"}, {"WORLD_SIZE", "2"}}), &p);
  CHECK_THAT(s.message(), Catch::Contains("RANK='x'"));
  s = ReadRankPlace(Env({{"RANK", "2"}, {"WORLD_SIZE", "2"}}), &p);
  CHECK_THAT(s.message(), Catch::Contains("not below the world size 2"));
  s = ReadRankPlace(Env({{"RANK", "0"}}), &p);
  CHECK_THAT(s.message(), Catch::Contains("WORLD_SIZE is not set"));
  s = ReadRankPlace(Env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}), &p);
  CHECK_THAT(s.message(), Catch::Contains("MASTER_PORT=70000"));

  CHECK(FirstSlurmHost("node7") == "node7");
  CHECK(FirstSlurmHost("a1,b[1-2]") == "a1");
  CHECK(FirstSlurmHost("gpu[12,14-15],cpu1") == "gpu12");
}

TEST_CASE("two ranks update as one learner on the union of their data, with unequal sample counts", "[ranks]") {
  const int64_t steps = 16, envs0 = 6, envs1 = 2;  // 96 and 32 samples
  // Both update paths that take ranks: the LibTorch update, and the fused CPU update through its flat buffer.
  const std::string path = GENERATE(as<std::string>{}, "off", "on");
  INFO("ppo.fused_update=" << path);
  const PpoConfig config = Config(/*num_minibatches=*/1, /*epochs=*/3, path);
  ActorCritic acting = MakePolicy(1);
  torch::manual_seed(7);
  std::vector<Rollout> part0, part1;
  for (int u = 0; u < 3; ++u) {
    part0.push_back(testing::ActedRollout(acting, torch::randn({steps * envs0, kObsDim}), {}, steps, envs0));
    part1.push_back(testing::ActedRollout(acting, torch::randn({steps * envs1, kObsDim}), {}, steps, envs1));
  }
  // The single learner, and the ranks (rank 1 starts from other parameters: rank 0's reach it).
  PpoTrainer single(MakePolicy(1), config, /*seed=*/1);
  std::vector<std::unique_ptr<PpoTrainer>> ranks;
  ranks.push_back(std::make_unique<PpoTrainer>(MakePolicy(1), config, 1));
  ranks.push_back(std::make_unique<PpoTrainer>(MakePolicy(2), config, 2));
  const torch::Tensor initial = Flat(*ranks[0]);
  REQUIRE_FALSE(torch::equal(initial, Flat(*ranks[1])));

  std::vector<PpoStats> single_stats;
  for (int u = 0; u < 3; ++u) single_stats.push_back(single.Update(Union(part0[u], part1[u]), 0.0));

  std::vector<std::vector<PpoStats>> rank_stats(2);
  std::vector<ReducerTraffic> traffic(2);
  RunRanks(2, 60, [&](int r, std::shared_ptr<RankGroup> group) {
    ranks[r]->SetReducer(std::make_shared<RankReducer>(group, /*check_every=*/1));
    for (int u = 0; u < 3; ++u) rank_stats[r].push_back(ranks[r]->Update(r == 0 ? part0[u] : part1[u], 0.0));
    traffic[r] = ranks[r]->reducer()->TakeTraffic();
  });

  const torch::Tensor want = Flat(single);
  const std::string want_path = path == "on" ? "fused" : "libtorch";
  CHECK(single.last_update_path() == want_path);
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK(ranks[r]->last_update_path() == want_path);
    const torch::Tensor got = Flat(*ranks[r]);
    CHECK(testing::RelativeDiff(got, want) < 2e-5);
    CHECK((got - initial).abs().max().item<double>() > 1e-3);  // it moved far beyond the tolerance
    CHECK(rank_stats[r][2].epochs == single_stats[2].epochs);
    CHECK(rank_stats[r][2].learning_rate == Approx(single_stats[2].learning_rate));
    // One all-reduce per minibatch of every parameter's gradient and two figures, plus the small sums.
    CHECK(traffic[r].bytes > 3 * 3 * want.numel() * 4);
  }
  // Bit-identical across the ranks: parameters and Adam's moments and steps.
  CHECK(torch::equal(Flat(*ranks[0]), Flat(*ranks[1])));
  const auto p0 = ranks[0]->policy()->parameters(), p1 = ranks[1]->policy()->parameters();
  for (size_t i = 0; i < p0.size(); ++i) {
    CHECK(AdamOf(*ranks[0], p0[i]).step() == AdamOf(*ranks[1], p1[i]).step());
    CHECK(torch::equal(AdamOf(*ranks[0], p0[i]).exp_avg(), AdamOf(*ranks[1], p1[i]).exp_avg()));
    CHECK(torch::equal(AdamOf(*ranks[0], p0[i]).exp_avg_sq(), AdamOf(*ranks[1], p1[i]).exp_avg_sq()));
    CHECK(testing::RelativeDiff(AdamOf(*ranks[0], p0[i]).exp_avg(),
                                AdamOf(single, single.policy()->parameters()[i]).exp_avg()) < 1e-4);
  }
}

TEST_CASE("two ranks on the fused update, a box action space, and a rank whose every sample is too old", "[ranks]") {
  // Rank 1's samples all lag beyond ppo.max_policy_lag: it trains on nothing of its own, yet takes its part in every
  // step of rank 0's (empty minibatches through the flat buffer), and both end where one learner on the union does.
  const int64_t steps = 16, envs0 = 4, envs1 = 3;
  PpoConfig config = Config(/*num_minibatches=*/1, /*epochs=*/3, "on");
  config.max_policy_lag = 2;
  const auto make = [](uint64_t seed) {
    torch::manual_seed(seed);
    return ActorCritic(Space::Box({kObsDim}, {-1}, {1}), Space::Box({2}, {-1}, {1}), std::vector<int>{32, 32});
  };
  ActorCritic acting = make(1);
  torch::manual_seed(13);
  Rollout part0 = testing::ActedRollout(acting, torch::randn({steps * envs0, kObsDim}), {}, steps, envs0);
  Rollout part1 = testing::ActedRollout(acting, torch::randn({steps * envs1, kObsDim}), {}, steps, envs1);
  part0.lag = torch::zeros({steps, envs0}, torch::kLong);
  part1.lag = torch::full({steps, envs1}, 5, torch::kLong);
  Rollout both = Union(part0, part1);
  both.lag = torch::cat({part0.lag, part1.lag}, 1);
  PpoTrainer single(make(1), config, 1);
  const torch::Tensor initial = Flat(single);
  const PpoStats want_stats = single.Update(both, 0.0);
  REQUIRE(single.last_update_path() == std::string("fused"));
  REQUIRE(want_stats.lag_dropped == steps * envs1);
  std::vector<std::unique_ptr<PpoTrainer>> ranks;
  ranks.push_back(std::make_unique<PpoTrainer>(make(1), config, 1));
  ranks.push_back(std::make_unique<PpoTrainer>(make(2), config, 2));
  std::vector<PpoStats> got(2);
  RunRanks(2, 60, [&](int r, std::shared_ptr<RankGroup> group) {
    ranks[r]->SetReducer(std::make_shared<RankReducer>(group, 1));
    got[r] = ranks[r]->Update(r == 0 ? part0 : part1, 0.0);
  });
  const torch::Tensor want = Flat(single);
  CHECK((want - initial).abs().max().item<double>() > 1e-3);
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK(ranks[r]->last_update_path() == std::string("fused"));
    CHECK(testing::RelativeDiff(Flat(*ranks[r]), want) < 2e-5);
    CHECK(got[r].learning_rate == Approx(want_stats.learning_rate));
    CHECK(got[r].epochs == want_stats.epochs);
  }
  CHECK(got[1].samples == 0);
  CHECK(got[0].grad_norm == got[1].grad_norm);  // the clip saw one gradient on both ranks
  CHECK(torch::equal(Flat(*ranks[0]), Flat(*ranks[1])));
}

TEST_CASE("two ranks with finished agents update as one learner on the union, masks and all", "[ranks][active]") {
  const int64_t steps = 16, envs0 = 6, envs1 = 4;
  const std::string path = GENERATE(as<std::string>{}, "off", "on");
  INFO("ppo.fused_update=" << path);
  const PpoConfig config = Config(/*num_minibatches=*/1, /*epochs=*/2, path);
  ActorCritic acting = MakePolicy(1);
  torch::manual_seed(9);
  Rollout part0 = testing::ActedRollout(acting, torch::randn({steps * envs0, kObsDim}), {}, steps, envs0);
  Rollout part1 = testing::ActedRollout(acting, torch::randn({steps * envs1, kObsDim}), {}, steps, envs1);
  FinishSomeAgents(&part0);
  FinishSomeAgents(&part1);
  PpoTrainer single(MakePolicy(1), config, /*seed=*/1);
  const PpoStats want_stats = single.Update(Union(part0, part1), 0.0);
  REQUIRE(want_stats.masked_rows > 20);
  std::vector<std::unique_ptr<PpoTrainer>> ranks;
  ranks.push_back(std::make_unique<PpoTrainer>(MakePolicy(1), config, 1));
  ranks.push_back(std::make_unique<PpoTrainer>(MakePolicy(1), config, 2));
  std::vector<PpoStats> stats(2);
  RunRanks(2, 60, [&](int r, std::shared_ptr<RankGroup> group) {
    ranks[r]->SetReducer(std::make_shared<RankReducer>(group, /*check_every=*/1));
    stats[r] = ranks[r]->Update(r == 0 ? part0 : part1, 0.0);
  });
  // The advantages normalised over the acting rows of both ranks, each minibatch's gradient weighted by its acting
  // rows: the union's update.
  CHECK(ranks[0]->last_update_path() == std::string(path == "on" ? "fused" : "libtorch"));
  CHECK(testing::RelativeDiff(Flat(*ranks[0]), Flat(single)) < 2e-5);
  CHECK(torch::equal(Flat(*ranks[0]), Flat(*ranks[1])));
  CHECK(stats[0].masked_rows + stats[1].masked_rows == want_stats.masked_rows);
}

TEST_CASE("two ranks with a GRU core and V-trace update as one learner on the union of their chunks", "[ranks]") {
  // Chunks of 4 steps through the core, V-trace's targets from the policy at the update's start, advantage moments
  // over both ranks; rank 1 has a third of rank 0's envs.
  const int64_t T = 8, L = 4, envs0 = 6, envs1 = 2;
  PpoConfig config = Config(/*num_minibatches=*/1, /*epochs=*/2);
  config.advantage = "vtrace";
  PolicyOptions options;
  options.core = CoreKind::kGru;
  options.core_size = 8;
  const auto make = [&](uint64_t seed) {
    torch::manual_seed(seed);
    return ActorCritic(Space::Box({kObsDim}, {-1}, {1}), Space::Discrete(4), std::vector<int>{16}, options);
  };
  torch::manual_seed(21);
  const auto rollout = [&](int64_t envs, int64_t state_size) {
    Rollout r;
    r.obs = torch::randn({T, envs, kObsDim});
    r.actions = torch::randint(4, {T, envs}, torch::kLong);
    r.logp = torch::full({T, envs}, std::log(0.25f)) + 0.1f * torch::randn({T, envs});
    r.values = torch::randn({T, envs});
    r.rewards = torch::randn({T, envs});
    r.dones = (torch::rand({T, envs}) < 0.2).to(torch::kFloat32);
    r.last_value = torch::randn({envs});
    r.core_states = 0.1f * torch::randn({T / L, envs, state_size});
    r.bptt = L;
    return r;
  };
  PpoTrainer single(make(1), config, 1);
  const int64_t state_size = single.policy()->core_state_size();
  const Rollout r0 = rollout(envs0, state_size), r1 = rollout(envs1, state_size);
  Rollout both = Union(r0, r1);
  both.core_states = torch::cat({r0.core_states, r1.core_states}, 1);
  both.bptt = L;
  std::vector<std::unique_ptr<PpoTrainer>> ranks;
  ranks.push_back(std::make_unique<PpoTrainer>(make(1), config, 1));
  ranks.push_back(std::make_unique<PpoTrainer>(make(2), config, 2));
  const torch::Tensor initial = Flat(single);
  const PpoStats want_stats = single.Update(both, 0.0);
  std::vector<PpoStats> got(2);
  RunRanks(2, 60, [&](int r, std::shared_ptr<RankGroup> group) {
    ranks[r]->SetReducer(std::make_shared<RankReducer>(group, 1));
    got[r] = ranks[r]->Update(r == 0 ? r0 : r1, 0.0);
  });
  const torch::Tensor want = Flat(single);
  CHECK((want - initial).abs().max().item<double>() > 1e-3);
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK(testing::RelativeDiff(Flat(*ranks[r]), want) < 2e-5);
    CHECK(got[r].vtrace);
  }
  CHECK(torch::equal(Flat(*ranks[0]), Flat(*ranks[1])));
  CHECK(got[0].samples + got[1].samples == want_stats.samples);
}

TEST_CASE("ranks stay bit-identical over many minibatches, empty ones and target_kl stops", "[ranks]") {
  // Rank 1 has 3 envs x 8 steps = 24 samples for 32 minibatches: most of its minibatches are empty.
  const std::string path = GENERATE(as<std::string>{}, "off", "on");
  INFO("ppo.fused_update=" << path);
  PpoConfig config = Config(/*num_minibatches=*/32, /*epochs=*/4, path);
  config.target_kl = 0.002;
  ActorCritic acting = MakePolicy(3);
  torch::manual_seed(11);
  const Rollout r0 = testing::ActedRollout(acting, torch::randn({32 * 16, kObsDim}), {}, 32, 16);
  const Rollout r1 = testing::ActedRollout(acting, torch::randn({8 * 3, kObsDim}), {}, 8, 3);
  std::vector<std::unique_ptr<PpoTrainer>> ranks;
  ranks.push_back(std::make_unique<PpoTrainer>(MakePolicy(3), config, 1));
  ranks.push_back(std::make_unique<PpoTrainer>(MakePolicy(4), config, 2));
  std::vector<std::vector<PpoStats>> stats(2);
  std::vector<int64_t> checksums(2);
  RunRanks(2, 60, [&](int r, std::shared_ptr<RankGroup> group) {
    ranks[r]->SetReducer(std::make_shared<RankReducer>(group, /*check_every=*/1));
    for (int u = 0; u < 4; ++u) stats[r].push_back(ranks[r]->Update(r == 0 ? r0 : r1, 0.0));
    checksums[r] = ranks[r]->reducer()->last_checksum();
  });
  CHECK(ranks[1]->last_update_path() == std::string(path == "on" ? "fused" : "libtorch"));
  CHECK(torch::equal(Flat(*ranks[0]), Flat(*ranks[1])));
  CHECK(checksums[0] == checksums[1]);
  for (size_t u = 0; u < stats[0].size(); ++u) {
    INFO("update " << u);
    CHECK(stats[0][u].epochs == stats[1][u].epochs);  // target_kl decided over both ranks
  }
  // target_kl stopped early at least once, so the agreement above was tested.
  bool stopped_early = false;
  for (const auto& s : stats[0]) stopped_early |= s.epochs < config.update_epochs;
  CHECK(stopped_early);
}

TEST_CASE("a stop request on one rank stops every rank after the same minibatch", "[ranks]") {
  const std::string path = GENERATE(as<std::string>{}, "off", "on");
  INFO("ppo.fused_update=" << path);
  const PpoConfig config = Config(/*num_minibatches=*/8, /*epochs=*/4, path);
  ActorCritic acting = MakePolicy(5);
  torch::manual_seed(12);
  const Rollout r0 = testing::ActedRollout(acting, torch::randn({16 * 8, kObsDim}), {}, 16, 8);
  const Rollout r1 = testing::ActedRollout(acting, torch::randn({16 * 4, kObsDim}), {}, 16, 4);
  std::vector<std::unique_ptr<PpoTrainer>> ranks;
  ranks.push_back(std::make_unique<PpoTrainer>(MakePolicy(5), config, 1));
  ranks.push_back(std::make_unique<PpoTrainer>(MakePolicy(5), config, 2));
  std::atomic<bool> stop{true};
  std::vector<PpoStats> stats(2);
  RunRanks(2, 60, [&](int r, std::shared_ptr<RankGroup> group) {
    ranks[r]->SetReducer(std::make_shared<RankReducer>(group, 1));
    stats[r] = ranks[r]->Update(r == 0 ? r0 : r1, 0.0, r == 1 ? &stop : nullptr);
  });
  CHECK(ranks[0]->last_update_path() == std::string(path == "on" ? "fused" : "libtorch"));
  CHECK(stats[0].cancelled);
  CHECK(stats[1].cancelled);
  CHECK(stats[0].epochs == 1);
  CHECK(torch::equal(Flat(*ranks[0]), Flat(*ranks[1])));
}

TEST_CASE("the normaliser's statistics merged across ranks are the union's moments", "[ranks]") {
  // Three ranks with 50, 0 and 200 samples of 3 elements at different scales; the merge against the moments of all
  // 250 samples added to one set, and the same bits on every rank.
  std::mt19937 gen(5);
  std::normal_distribution<float> normal;
  const std::vector<int> counts{50, 0, 200};
  std::vector<std::vector<float>> data(3);
  RunningMoments all(3);
  std::vector<RunningMoments> mine(3, RunningMoments(3));
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < counts[r] * 3; ++i) data[r].push_back(normal(gen) * static_cast<float>(r + 1) + 10.0f * r);
    mine[r].AddRows(data[r].data(), counts[r]);
    all.AddRows(data[r].data(), counts[r]);
  }
  std::vector<RunningMoments> merged(3);
  RunRanks(3, 60, [&](int r, std::shared_ptr<RankGroup> group) { merged[r] = MergeAcrossRanks(*group, mine[r], 3); });
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r);
    REQUIRE(merged[r].count() == 250);
    for (int i = 0; i < 3; ++i) {
      CHECK(merged[r].mean()[i] == Approx(all.mean()[i]).epsilon(1e-12));
      CHECK(merged[r].m2()[i] == Approx(all.m2()[i]).epsilon(1e-10));
      CHECK(merged[r].mean()[i] == merged[0].mean()[i]);  // bit for bit on every rank
      CHECK(merged[r].m2()[i] == merged[0].m2()[i]);
    }
  }
}

TEST_CASE("diverged parameters and a rank that stops calling are errors that name them, within the timeout",
          "[ranks]") {
  SECTION("a parameter that differs") {
    std::vector<std::string> errors(2);
    std::vector<ActorCritic> nets{MakePolicy(8), MakePolicy(8)};  // the global generator: not in the threads
    RunRanks(2, 30, [&](int r, std::shared_ptr<RankGroup> group) {
      RankReducer reducer(group, 1);
      std::vector<torch::Tensor> params = nets[r]->parameters();
      reducer.CheckParameters(params, 1);  // the same
      if (r == 1) {
        torch::NoGradGuard no_grad;
        params[0].view(-1)[0] += 1e-6f;
      }
      try {
        reducer.CheckParameters(params, 17);
      } catch (const RankError& e) {
        errors[r] = e.what();
      }
    });
    for (const auto& e : errors) CHECK_THAT(e, Catch::Contains("differ after update 17"));
  }
  SECTION("a rank that stops calling") {
    std::string error;
    double waited = 0;
    RunRanks(2, 2.0, [&](int r, std::shared_ptr<RankGroup> group) {
      RankReducer reducer(group);
      reducer.Sum({1.0});
      if (r == 1) {
        // Rank 1 waits without calling (hung), then leaves.
        std::this_thread::sleep_for(std::chrono::seconds(4));
        return;
      }
      const auto start = std::chrono::steady_clock::now();
      try {
        reducer.Sum({1.0});
      } catch (const RankError& e) {
        error = e.what();
      }
      waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    });
    CHECK_THAT(error, Catch::Contains("rank 0 of 2: all-reduce (sum) failed"));
    CHECK(waited < 3.5);  // the 2 s timeout, not rank 1's 4 s
  }
}

TEST_CASE("a resumed rank's share of the run's env steps adds up to them", "[ranks]") {
  CHECK(RankShare(7, 0, 3) == 3);
  CHECK(RankShare(7, 1, 3) == 2);
  CHECK(RankShare(7, 2, 3) == 2);
  CHECK(RankShare(8, 1, 2) == 4);
  CHECK(RankShare(5, 0, 1) == 5);
  int64_t sum = 0;
  for (int r = 0; r < 5; ++r) sum += RankShare(123456789, r, 5);
  CHECK(sum == 123456789);
}

TEST_CASE("sync_fraction: the share of ranks whose full rollouts end the others'", "[ranks]") {
  CHECK(RolloutPreemption::NeededRanks(0.5, 2) == 1);
  CHECK(RolloutPreemption::NeededRanks(1.0, 2) == 2);
  CHECK(RolloutPreemption::NeededRanks(0.6, 5) == 3);  // DD-PPO's 0.6
  CHECK(RolloutPreemption::NeededRanks(0.75, 4) == 3);
  CHECK(RolloutPreemption::NeededRanks(0.01, 8) == 1);
  CHECK(RolloutPreemption::NeededRanks(0.51, 2) == 2);
  // Two ranks counting full rollouts in the rendezvous store: rank 1 learns when rank 0's is full, for that index
  // only; with sync_fraction 1 it takes both.
  std::vector<std::vector<int>> seen(2);
  RunRanks(2, 30, [&](int r, std::shared_ptr<RankGroup> group) {
    RankPlace place;
    place.rank = r;
    place.world_size = 2;
    place.master_addr = "127.0.0.1";
    place.master_port = last_port;
    std::unique_ptr<RolloutPreemption> half, all;
    REQUIRE(RolloutPreemption::Create(place, 0.5, 30, &half).ok());
    REQUIRE(RolloutPreemption::Create(place, 1.0, 30, &all).ok());
    const auto poll = [](RolloutPreemption& p, int64_t index) {
      std::this_thread::sleep_for(RolloutPreemption::kPollInterval * 2);
      bool ready = false;
      REQUIRE(p.OthersReady(index, &ready).ok());
      return ready ? 1 : 0;
    };
    group->Barrier();
    if (r == 1) seen[r].push_back(poll(*half, 0));  // nobody full yet
    group->Barrier();
    if (r == 0) {
      REQUIRE(half->MarkFull(0).ok());
      REQUIRE(all->MarkFull(7).ok());
    }
    group->Barrier();
    if (r == 1) {
      seen[r].push_back(poll(*half, 0));  // rank 0's is full
      seen[r].push_back(poll(*half, 1));  // not the next one
      seen[r].push_back(poll(*all, 7));   // one of two is not enough
      REQUIRE(all->MarkFull(7).ok());
      seen[r].push_back(poll(*all, 7));
    }
    group->Barrier();
  });
  CHECK(seen[1] == std::vector<int>{0, 1, 0, 0, 1});
}

TEST_CASE("sync_fraction is refused where it cannot work, naming the keys", "[ranks]") {
  FarmConfig c;
  c.learner.sync_fraction = 0.6;
  CHECK(ValidateConfig(c).ok());
  c.mode = "async";
  CHECK_THAT(ValidateConfig(c).message(), Catch::Contains("learner.sync_fraction (0.6) preempts stragglers in mode: sync"));
  c.mode = "sync";
  c.ppo.core = "gru";
  c.ppo.rollout_length = 64;
  c.ppo.bptt = 0;
  CHECK_THAT(ValidateConfig(c).message(), Catch::Contains("ppo.bptt must be at most half of ppo.rollout_length (64)"));
  c.ppo.bptt = 32;
  CHECK(ValidateConfig(c).ok());
  FarmConfig bad;
  CHECK_THAT(ParseConfig("learner:\n  sync_fraction: 1.5\n", "test", &bad).message(),
             Catch::Contains("learner.sync_fraction"));
}

}  // namespace
}  // namespace farm
