// The run's memory estimate and budget (learner/run/memory_budget.h): the figures, the limits read from a cgroup
// and /proc (fake trees here), and the messages that name them.
#include "learner/run/memory_budget.h"
#include "learner/model/encoder.h"
#include "common/files.h"

#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#undef CHECK
#include <catch2/catch.hpp>

namespace farm {
namespace {

namespace fs = std::filesystem;

struct FakeTree {
  fs::path root = fs::temp_directory_path() / ("farm-memory-" + std::to_string(::getpid()) + "-" +
                                                 std::to_string(reinterpret_cast<uintptr_t>(this)));
  FakeTree() { fs::create_directories(root); }
  ~FakeTree() { (void)RemoveTree(root.string()); }  // not fs::remove_all: see RemoveTree (common/files.h)
  void Write(const std::string& rel, const std::string& text) {
    const fs::path p = root / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  std::string sys() const { return (root / "sys").string(); }
  std::string proc() const { return (root / "proc").string(); }
};

// RLIMIT_AS as it is for the test process (unlimited unless the test runs under ulimit -v).
bool AddressSpaceUnlimited() {
  rlimit rl{};
  return getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur == RLIM_INFINITY;
}

}  // namespace

TEST_CASE("EstimateRunMemory: the parts, each from its own inputs", "[memory]") {
  PpoConfig ppo;
  ppo.rollout_length = 100;
  ppo.num_minibatches = 4;
  RunMemoryInputs in;
  in.parameters = 1000;
  in.bytes_per_row_step = 50;
  in.rows = 16;
  in.activation_floats_per_row = 10;
  const RunMemory sync = EstimateRunMemory(in, ppo, /*async=*/false);
  CHECK(sync.model == 8000);      // two copies of 1000 floats
  CHECK(sync.optimizer == 12000); // gradients and two moments
  CHECK(sync.store == 16 * 100 * 50);
  CHECK(sync.update == 16 * 100 * 50 + 16 * 100 * 8);
  CHECK(sync.activations == 400 * 10 * 4 * 3);  // minibatches of 1600 / 4 rows
  RunMemoryInputs images = in;
  images.minibatch_floats_per_row = 7;  // the gathered inputs and a conv's workspace, held once
  CHECK(EstimateRunMemory(images, ppo, false).activations == 400 * (10 * 3 + 7) * 4);
  // A centralised critic: one state per 4 rows, its forward (100 floats) and its gathered state and workspace (20)
  // counted per state: 400 rows, 100 states per minibatch.
  RunMemoryInputs ctde = images;
  ctde.rows_per_state = 4;
  ctde.activation_floats_per_state = 100;
  ctde.minibatch_floats_per_state = 20;
  CHECK(EstimateRunMemory(ctde, ppo, false).activations == (400 * (10 * 3 + 7) + 100 * (100 * 3 + 20)) * 4);
  ctde.rows_per_state = 3;  // 400 rows are 134 states, the last one short
  CHECK(EstimateRunMemory(ctde, ppo, false).activations == (400 * (10 * 3 + 7) + 134 * (100 * 3 + 20)) * 4);
  CHECK(sync.total() == sync.model + sync.optimizer + sync.store + sync.update + sync.activations);
  RunMemoryInputs core = in;
  core.core_state_floats = 3;  // a core: the update's chunks are one more copy of the rollout
  CHECK(EstimateRunMemory(core, ppo, false).update == sync.update + 16 * 100 * 50);
  CHECK(EstimateRunMemory(core, ppo, false).store == sync.store + 2 * 16 * 3 * 4);  // the rows' states, twice
  RunMemoryInputs kept = in;
  kept.allocator_kept = 128 << 20;  // freed memory the allocator keeps: host memory, whatever the rows
  const RunMemory with_kept = EstimateRunMemory(kept, ppo, false);
  CHECK(with_kept.total() == sync.total() + (128 << 20));
  CHECK_THAT(with_kept.Describe(), Catch::EndsWith("activations 0.0, allocator 128.0)"));
  const RunMemory kept_gpu = EstimateRunMemory(kept, ppo, false, /*on_gpu=*/true);
  CHECK(kept_gpu.host() == kept_gpu.store + (128 << 20));
  CHECK(kept_gpu.gpu() == kept_gpu.total() - kept_gpu.host());
  const RunMemory async = EstimateRunMemory(in, ppo, /*async=*/true);
  CHECK(async.store == 2 * sync.store);  // one rollout recorded while the other trains
  CHECK_THAT(sync.Describe(), Catch::StartsWith("0.2 MiB (store 0.1, update 0.1, model 0.0"));
}

TEST_CASE("NetworkActivationFloats counts a network's widths and its encoder's conv maps", "[memory]") {
  // mlp [64, 64] with a 2-way head, and its critic: (64 + 64 + 2) + (64 + 64 + 1).
  CHECK(NetworkActivationFloats({64, 64}, 2, 0) == 130);
  CHECK(NetworkActivationFloats({64, 64}, 1, 0) == 129);
  CHECK(NetworkActivationFloats({64, 64}, 2, 0, /*layer_norm=*/true) == 130 + 128);  // each norm's output too
  // cnn on [5, 7, 7]: 32 x 7 x 7 and 64 x 4 x 4 per encoder, two encoders, plus the widths.
  const int64_t cnn = ImageEncoderFloats(Encoder::kCnn, {}, Space::Box({5, 7, 7}, {0.f}, {1.f}));
  CHECK(cnn == 32 * 49 + 64 * 16);
  CHECK(NetworkActivationFloats({128, 128}, 5, cnn) == 256 + 5 + 32 * 49 + 64 * 16);
  CHECK(ImageEncoderFloats(Encoder::kMlp, {}, Space::Box({5, 7, 7}, {0.f}, {1.f})) == 0);
  // impala [16]: conv 16x7x7, pool 16x4x4 kept by two residual blocks (two convs and a sum each, with the pool).
  EncoderLayout impala;
  impala.impala_channels = {16};
  CHECK(ImageEncoderFloats(Encoder::kImpala, impala, Space::Box({5, 7, 7}, {0.f}, {1.f})) == 16 * 49 + 7 * 16 * 16);
  // The largest unfolded conv input: cnn on [5, 7, 7]: the first conv, 5 x 3 x 3 x 49 (the second: 32 x 9 x 16).
  CHECK(ImageEncoderWorkspaceFloats(Encoder::kCnn, {}, Space::Box({5, 7, 7}, {0.f}, {1.f})) == 32 * 9 * 16);
  // The Nature stack on the seeds' [7, 50, 50]: the first conv, 7 x 8 x 8 x 11 x 11.
  EncoderLayout nature;
  nature.conv = {{32, 8, 4, 0}, {64, 4, 2, 0}, {64, 3, 1, 0}};
  CHECK(ImageEncoderWorkspaceFloats(Encoder::kConv, nature, Space::Box({7, 50, 50}, {0.f}, {1.f})) == 7 * 64 * 121);
  CHECK(ImageEncoderWorkspaceFloats(Encoder::kMlp, {}, Space::Box({5, 7, 7}, {0.f}, {1.f})) == 0);
}

TEST_CASE("ParseCgroupLimit: a figure, or none for max, unlimited and garbage", "[memory]") {
  CHECK(ParseCgroupLimit("536870912\n") == std::optional<int64_t>(536870912));
  CHECK_FALSE(ParseCgroupLimit("max\n"));
  CHECK_FALSE(ParseCgroupLimit("9223372036854771712\n"));  // cgroup v1's "unlimited"
  CHECK_FALSE(ParseCgroupLimit(""));
  CHECK_FALSE(ParseCgroupLimit("12abc"));
  CHECK_FALSE(ParseCgroupLimit("-1"));
}

TEST_CASE("DetectMemoryLimit reads the process's cgroup (v2, then v1) and ProcessMemoryUsed its usage",
          "[memory]") {
  if (!AddressSpaceUnlimited()) WARN("RLIMIT_AS is set for this test process: the tightest limit may be it");
  SECTION("cgroup v2, the process's own cgroup") {
    FakeTree t;
    t.Write("proc/cgroup", "0::/farm.slice/learner\n");
    t.Write("sys/farm.slice/learner/memory.max", "1073741824\n");
    t.Write("sys/farm.slice/learner/memory.current", "104857600\n");
    const auto limit = DetectMemoryLimit(t.sys(), t.proc());
    REQUIRE(limit);
    if (AddressSpaceUnlimited()) {
      CHECK(limit->bytes == 1073741824);
      CHECK_THAT(limit->source, Catch::Contains("memory.max") && Catch::Contains("farm.slice/learner"));
      CHECK(ProcessMemoryUsed(*limit, t.sys(), t.proc()) == 104857600);
    }
  }
  SECTION("cgroup v2 inside a container: the namespace's root") {
    FakeTree t;
    t.Write("proc/cgroup", "0::/\n");
    t.Write("sys/memory.max", "2147483648\n");
    const auto limit = DetectMemoryLimit(t.sys(), t.proc());
    REQUIRE(limit);
    if (AddressSpaceUnlimited()) CHECK(limit->bytes == 2147483648);
  }
  SECTION("cgroup v2 without a limit, v1 with one") {
    FakeTree t;
    t.Write("proc/cgroup", "12:memory:/docker/abc\n0::/\n");
    t.Write("sys/memory.max", "max\n");
    t.Write("sys/memory/docker/abc/memory.limit_in_bytes", "536870912\n");
    t.Write("sys/memory/docker/abc/memory.usage_in_bytes", "1048576\n");
    const auto limit = DetectMemoryLimit(t.sys(), t.proc());
    REQUIRE(limit);
    if (AddressSpaceUnlimited()) {
      CHECK(limit->bytes == 536870912);
      CHECK_THAT(limit->source, Catch::Contains("memory.limit_in_bytes"));
      CHECK(ProcessMemoryUsed(*limit, t.sys(), t.proc()) == 1048576);
    }
  }
  SECTION("cgroup v2: a parent's tighter limit, its usage less the reclaimable page cache") {
    FakeTree t;
    t.Write("proc/cgroup", "0::/farm.slice/learner\n");
    t.Write("sys/farm.slice/learner/memory.max", "max\n");
    t.Write("sys/farm.slice/memory.max", "536870912\n");
    t.Write("sys/memory.max", "1073741824\n");
    t.Write("sys/farm.slice/memory.current", "209715200\n");
    t.Write("sys/farm.slice/memory.stat", "anon 52428800\nfile 157286400\nactive_file 52428800\n"
                                          "inactive_file 104857600\n");
    const auto limit = DetectMemoryLimit(t.sys(), t.proc());
    REQUIRE(limit);
    if (AddressSpaceUnlimited()) {
      CHECK(limit->bytes == 536870912);
      CHECK_THAT(limit->source, Catch::Contains("farm.slice/memory.max"));
      CHECK(ProcessMemoryUsed(*limit, t.sys(), t.proc()) == 104857600);  // 200 MiB used, 100 MiB of it cache
    }
  }
  SECTION("cgroup v2: the level with the least room, not the smallest limit (siblings fill a parent)") {
    FakeTree t;
    t.Write("proc/cgroup", "0::/work/learner\n");
    t.Write("sys/work/learner/memory.max", "4294967296\n");       // 4 GiB, 0.5 GiB used
    t.Write("sys/work/learner/memory.current", "536870912\n");
    t.Write("sys/work/memory.max", "6442450944\n");               // 6 GiB, 5.8 GiB used by the siblings too
    t.Write("sys/work/memory.current", "6227702579\n");
    const auto limit = DetectMemoryLimit(t.sys(), t.proc());
    REQUIRE(limit);
    if (AddressSpaceUnlimited()) {
      CHECK(limit->bytes == 6442450944);
      CHECK_THAT(limit->source, Catch::Contains("/work/memory.max"));
      CHECK(limit->bytes - ProcessMemoryUsed(*limit, t.sys(), t.proc()) == 214748365);  // 0.2 GiB of room
    }
  }
  SECTION("cgroup v1: the hierarchy's tightest limit, usage less total_inactive_file") {
    FakeTree t;
    t.Write("proc/cgroup", "12:memory:/docker/abc\n");
    t.Write("sys/memory/docker/abc/memory.limit_in_bytes", "9223372036854771712\n");  // v1's unlimited
    t.Write("sys/memory/docker/memory.limit_in_bytes", "268435456\n");
    t.Write("sys/memory/docker/memory.usage_in_bytes", "73400320\n");
    t.Write("sys/memory/docker/memory.stat", "cache 1\ninactive_file 5\ntotal_inactive_file 20971520\n");
    const auto limit = DetectMemoryLimit(t.sys(), t.proc());
    REQUIRE(limit);
    if (AddressSpaceUnlimited()) {
      CHECK(limit->bytes == 268435456);
      CHECK(ProcessMemoryUsed(*limit, t.sys(), t.proc()) == 52428800);
    }
  }
  SECTION("no limit anywhere") {
    FakeTree t;
    t.Write("proc/cgroup", "0::/user.slice\n");
    t.Write("sys/user.slice/memory.max", "max\n");
    if (AddressSpaceUnlimited()) CHECK_FALSE(DetectMemoryLimit(t.sys(), t.proc()));
  }
  SECTION("RLIMIT_AS: the usage is the process's VmSize") {
    FakeTree t;
    t.Write("proc/status", "Name:\tfarm-learner\nVmPeak:\t 2000 kB\nVmSize:\t  1500 kB\nVmRSS:\t 100 kB\n");
    CHECK(ProcessMemoryUsed(MemoryLimit{1 << 30, "RLIMIT_AS (ulimit -v)"}, t.sys(), t.proc()) == 1500 * 1024);
  }
}

TEST_CASE("ResolveMemoryBudget and CheckRunMemory: which budget, and a message with the figures", "[memory]") {
  const MemoryLimit limit{1024ll << 20, "RLIMIT_AS (ulimit -v)"};
  auto explicit_budget = ResolveMemoryBudget(64, limit, 100ll << 20);
  REQUIRE(explicit_budget);
  CHECK(explicit_budget->bytes == 64ll << 20);  // the config's figure wins over the limit
  CHECK(explicit_budget->source == "learner.memory_budget_mb");
  auto automatic = ResolveMemoryBudget(0, limit, 100ll << 20);
  REQUIRE(automatic);
  CHECK(automatic->bytes == 924ll << 20);  // the limit less what was in use at start
  CHECK_THAT(automatic->source, Catch::Contains("RLIMIT_AS") && Catch::Contains("1024.0 MiB"));
  // Under RLIMIT_AS the threads the run starts later reserve address space; a cgroup counts what they touch.
  auto with_threads = ResolveMemoryBudget(0, limit, 100ll << 20, 3);
  REQUIRE(with_threads);
  CHECK(with_threads->bytes == (924ll << 20) - 3 * AddressSpacePerThread());
  CHECK(AddressSpacePerThread() >= (64ll << 20));
  CHECK_THAT(with_threads->source, Catch::Contains("for the 3 threads it starts"));
  auto cgroup = ResolveMemoryBudget(0, MemoryLimit{1024ll << 20, "cgroup memory.max (/x/memory.max)"}, 100ll << 20, 3);
  REQUIRE(cgroup);
  CHECK(cgroup->bytes == 924ll << 20);
  CHECK_FALSE(ResolveMemoryBudget(0, std::nullopt, 0));  // no limit: no check
  CHECK_FALSE(ResolveMemoryBudget(-1, limit, 0));        // -1: no check

  RunMemory need;
  need.store = 100ll << 20;
  need.update = 50ll << 20;
  CHECK(CheckRunMemory(need, automatic, "the run").ok());
  CHECK(CheckRunMemory(need, std::nullopt, "the run").ok());
  const Status s = CheckRunMemory(need, explicit_budget, "the run with worker w-3");
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains("the run with worker w-3 needs about 150.0 MiB (store 100.0, update 50.0") &&
                              Catch::Contains("memory budget is 64.0 MiB (learner.memory_budget_mb)"));

  // The policy on a GPU: only the store is host memory; the rest is checked against the GPU's free memory.
  need.on_gpu = true;
  need.store = 60ll << 20;
  CHECK(CheckRunMemory(need, explicit_budget, "the run").ok());  // 60 MiB of host memory fits 64
  const MemoryBudget gpu{40ll << 20, "cuda:0 at the first Hello"};
  const Status g = CheckRunMemory(need, explicit_budget, "the run", gpu);
  REQUIRE_FALSE(g.ok());
  CHECK_THAT(g.message(), Catch::Contains("60.0 MiB of host memory (store) and 50.0 MiB on the GPU (update 50.0") &&
                              Catch::Contains("the GPU has 40.0 MiB free (cuda:0 at the first Hello)"));
  need.store = 70ll << 20;
  CHECK_THAT(CheckRunMemory(need, explicit_budget, "the run", gpu).message(),
             Catch::Contains("memory budget is 64.0 MiB"));  // the host's part first
}

}  // namespace farm
