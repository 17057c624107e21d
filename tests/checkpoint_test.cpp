// Checkpoints: checksums, retention of the newest K, falling back past a
// truncated file, and the run state (generators, episode window, config) that
// --resume continues from, including checkpoints written before it existed.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <chrono>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include <ATen/CPUGeneratorImpl.h>

#include "common/files.h"
#include "learner/run/checkpoint.h"
#include "learner/run/checkpoint_writer.h"
#include "learner/run/metrics.h"
#include "tests/file_size_limit.h"

// LibTorch pulls in glog, whose CHECK would replace Catch's: include Catch last.
#undef CHECK
#include <catch2/catch.hpp>

using namespace farm;

TEST_CASE("checkpoints keep the newest K and a corrupt one is passed over", "[checkpoint]") {
  torch::manual_seed(12);
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("farm-ckpt-test-" + std::to_string(::getpid()))).string();
  (void)RemoveTree(dir);  // not std::filesystem::remove_all: see RemoveTree
  ActorCritic policy(Space::Box({3}, {-1.f}, {1.f}), Space::Discrete(2), std::vector<int>{8});
  torch::optim::Adam adam(policy->parameters(), torch::optim::AdamOptions(1e-3));
  for (int64_t u = 1; u <= 4; ++u) {
    TrainingCounters c{u * 100, u, u, 0, 0.0};
    REQUIRE(SaveCheckpoint(dir, policy, adam, c, nullptr, nullptr, /*keep=*/2).ok());
  }
  const auto all = ListCheckpoints(dir);
  REQUIRE(all.size() == 2);
  CHECK(std::filesystem::path(all[0]).filename() == "ckpt-00000004.pt");
  CHECK(std::filesystem::path(all[1]).filename() == "ckpt-00000003.pt");
  CHECK_FALSE(std::filesystem::exists(dir + "/ckpt-00000001.pt.crc32c"));

  std::string path;
  std::vector<std::string> skipped;
  REQUIRE(FindLatestValidCheckpoint(dir, &path, &skipped).ok());
  CHECK(path == all[0]);
  CHECK(skipped.empty());

  // Truncate the newest: its checksum no longer matches, the previous one is used.
  std::filesystem::resize_file(all[0], std::filesystem::file_size(all[0]) / 2);
  REQUIRE(FindLatestValidCheckpoint(dir, &path, &skipped).ok());
  CHECK(path == all[1]);
  REQUIRE(skipped.size() == 1);
  CHECK_THAT(skipped[0], Catch::Contains("ckpt-00000004.pt") && Catch::Contains("does not match"));
  TrainingCounters back;
  REQUIRE(LoadCheckpoint(path, policy, &adam, &back).ok());
  CHECK(back.updates == 3);
  CHECK(back.env_steps == 300);

  // Nothing valid left.
  std::ofstream(all[1] + ".crc32c") << "00000000\n";
  skipped.clear();
  const auto none = FindLatestValidCheckpoint(dir, &path, &skipped);
  CHECK(none.code() == Status::Code::kNotFound);
  CHECK(skipped.size() == 2);
  (void)RemoveTree(dir);  // not std::filesystem::remove_all: see RemoveTree
}

namespace {

// The next `n` draws of `generator` (uniform floats).
std::vector<float> Draw(torch::Generator& generator, int n) {
  const torch::Tensor t = torch::rand({n}, generator);
  return std::vector<float>(t.data_ptr<float>(), t.data_ptr<float>() + n);
}

}  // namespace

TEST_CASE("a checkpoint's run state round-trips: generators continue, window, target, config", "[checkpoint]") {
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("farm-ckpt-state-test-" + std::to_string(::getpid()))).string();
  (void)RemoveTree(dir);  // not std::filesystem::remove_all: see RemoveTree
  ActorCritic policy(Space::Box({3}, {-1.f}, {1.f}), Space::Discrete(2), std::vector<int>{8});
  torch::optim::Adam adam(policy->parameters(), torch::optim::AdamOptions(1e-3));

  // Generators part-way through their streams; what they would draw next is the reference.
  torch::Generator trainer = at::make_generator<at::CPUGeneratorImpl>(11);
  torch::Generator actions = at::make_generator<at::CPUGeneratorImpl>(12);
  (void)Draw(trainer, 37);
  (void)Draw(actions, 5);
  torch::manual_seed(13);
  torch::Generator cpu = at::detail::getDefaultCPUGenerator();
  (void)Draw(cpu, 3);
  RunState state;
  state.rng[kRngTrainer] = GeneratorState(trainer);
  state.rng[kRngRandomActions] = GeneratorState(actions);
  state.rng[kRngTorchCpu] = GeneratorState(cpu);
  const auto trainer_next = Draw(trainer, 8);
  const auto actions_next = Draw(actions, 8);
  const auto cpu_next = Draw(cpu, 8);

  EpisodeWindow window(100);
  for (int i = 0; i < 130; ++i) window.Add(10.0 + i, 20 + i);  // more than the window holds
  state.has_episode_window = true;
  state.episode_returns = window.returns();
  state.episode_lengths = window.lengths();
  state.solved_at_steps = 4096;
  state.solved_at_seconds = 12.5;
  state.solved_at_unix = 1.7e9;
  FarmConfig config;
  config.ppo.lr = 1e-3;
  state.config_yaml = DumpConfig(config);
  state.has_policy_lag = true;
  state.lag_counts = {{0, 900}, {1, 95}, {3, 5}};
  state.lag_dropped = 17;
  state.has_critic_watch = true;
  state.critic_constant_updates = 12;
  state.critic_reported_at = 5;
  TrainingCounters c{1000, 7, 7, window.total_episodes(), 33.0};
  std::string path;
  REQUIRE(SaveCheckpoint(dir, policy, adam, c, &path, nullptr, 0, &state).ok());

  TrainingCounters back;
  RunState loaded;
  REQUIRE(LoadCheckpoint(path, policy, &adam, &back, nullptr, &loaded).ok());
  CHECK(loaded.missing.empty());
  CHECK(back.episodes == 130);
  CHECK(back.wall_seconds == 33.0);
  // Fresh generators, seeded otherwise, continue the saved streams exactly once restored.
  torch::Generator trainer2 = at::make_generator<at::CPUGeneratorImpl>(99);
  torch::Generator actions2 = at::make_generator<at::CPUGeneratorImpl>(98);
  REQUIRE(loaded.rng.count(kRngTrainer) == 1);
  REQUIRE(SetGeneratorState(trainer2, loaded.rng[kRngTrainer], kRngTrainer).ok());
  REQUIRE(SetGeneratorState(actions2, loaded.rng[kRngRandomActions], kRngRandomActions).ok());
  torch::manual_seed(97);
  REQUIRE(SetGeneratorState(cpu, loaded.rng[kRngTorchCpu], kRngTorchCpu).ok());
  CHECK(Draw(trainer2, 8) == trainer_next);
  CHECK(Draw(actions2, 8) == actions_next);
  CHECK(Draw(cpu, 8) == cpu_next);
  CHECK(loaded.rng.count(kRngTorchCuda) == 0);
  // A state of the wrong size is refused with the generator's name.
  const Status bad = SetGeneratorState(trainer2, torch::zeros({3}, torch::kUInt8), kRngTrainer);
  CHECK_FALSE(bad.ok());
  CHECK_THAT(bad.message(), Catch::Contains("trainer"));

  // The window: the newest 100 episodes, in order; the episode count is the counters'.
  REQUIRE(loaded.has_episode_window);
  CHECK(loaded.episode_returns == window.returns());
  CHECK(loaded.episode_lengths == window.lengths());
  EpisodeWindow restored(100);
  restored.Restore(loaded.episode_returns, loaded.episode_lengths, back.episodes);
  CHECK(restored.count() == 100);
  CHECK(restored.total_episodes() == 130);
  CHECK(restored.mean_return() == window.mean_return());
  CHECK(restored.mean_length() == window.mean_length());
  restored.Add(1000.0, 1);  // and it goes on sliding
  window.Add(1000.0, 1);
  CHECK(restored.mean_return() == window.mean_return());
  CHECK(restored.total_episodes() == 131);

  REQUIRE(loaded.solved_at_steps);
  CHECK(*loaded.solved_at_steps == 4096);
  CHECK(*loaded.solved_at_seconds == 12.5);
  CHECK(*loaded.solved_at_unix == 1.7e9);
  CHECK(loaded.config_yaml == state.config_yaml);
  std::string yaml;
  REQUIRE(ReadCheckpointConfig(path, &yaml).ok());
  FarmConfig parsed;
  REQUIRE(ParseConfig(yaml, path, &parsed).ok());
  CHECK(parsed.ppo.lr == 1e-3);
  REQUIRE(loaded.has_policy_lag);
  CHECK(loaded.lag_counts == state.lag_counts);
  CHECK(loaded.lag_dropped == 17);
  REQUIRE(loaded.has_critic_watch);
  CHECK(loaded.critic_constant_updates == 12);
  CHECK(loaded.critic_reported_at == std::optional<int64_t>(5));

  // Not solved: stored as such.
  RunState unsolved;
  c.updates = 8;
  REQUIRE(SaveCheckpoint(dir, policy, adam, c, &path, nullptr, 0, &unsolved).ok());
  REQUIRE(LoadCheckpoint(path, policy, &adam, &back, nullptr, &loaded).ok());
  CHECK_FALSE(loaded.solved_at_steps);
  CHECK_FALSE(loaded.has_episode_window);
  CHECK_FALSE(loaded.has_critic_watch);
  // A watch with nothing reported round-trips as such.
  unsolved.has_critic_watch = true;
  unsolved.critic_constant_updates = 3;
  c.updates = 10;
  REQUIRE(SaveCheckpoint(dir, policy, adam, c, &path, nullptr, 0, &unsolved).ok());
  REQUIRE(LoadCheckpoint(path, policy, &adam, &back, nullptr, &loaded).ok());
  REQUIRE(loaded.has_critic_watch);
  CHECK(loaded.critic_constant_updates == 3);
  CHECK_FALSE(loaded.critic_reported_at);

  // A checkpoint written without any run state (as older versions did) still loads; what it lacks is listed.
  c.updates = 9;
  REQUIRE(SaveCheckpoint(dir, policy, adam, c, &path).ok());
  REQUIRE(LoadCheckpoint(path, policy, &adam, &back, nullptr, &loaded).ok());
  CHECK(back.updates == 9);
  CHECK(loaded.rng.empty());
  CHECK_FALSE(loaded.has_episode_window);
  CHECK_FALSE(loaded.has_policy_lag);
  CHECK_FALSE(loaded.has_critic_watch);
  CHECK(loaded.config_yaml.empty());
  CHECK(loaded.missing.size() == 4);  // rng, episode_window, solved_at, config_yaml
  CHECK(ReadCheckpointConfig(path, &yaml).code() == Status::Code::kNotFound);
  (void)RemoveTree(dir);  // not std::filesystem::remove_all: see RemoveTree
}

TEST_CASE("a checkpoint on a full disk fails naming the file, the previous one stays latest and valid",
          "[checkpoint]") {
  torch::manual_seed(3);
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("farm-ckpt-full-" + std::to_string(::getpid()))).string();
  (void)RemoveTree(dir);
  ActorCritic policy(Space::Box({3}, {-1.f}, {1.f}), Space::Discrete(2), std::vector<int>{64, 64});
  torch::optim::Adam adam(policy->parameters(), torch::optim::AdamOptions(1e-3));
  REQUIRE(SaveCheckpoint(dir, policy, adam, TrainingCounters{100, 1, 1, 0, 0.0}, nullptr, nullptr, /*keep=*/1).ok());
  const auto size = std::filesystem::file_size(dir + "/ckpt-00000001.pt");
  Status s;
  {
    FileSizeLimit full(size / 2);  // the next checkpoint cannot be written whole
    s = SaveCheckpoint(dir, policy, adam, TrainingCounters{200, 2, 2, 0, 0.0}, nullptr, nullptr, /*keep=*/1);
  }
  REQUIRE_FALSE(s.ok());
  CHECK(s.code() == Status::Code::kIoError);
  CHECK_THAT(s.message(), Catch::Contains("ckpt-00000002.pt") && Catch::Contains("File too large"));
  // Nothing half-written, nothing pruned to make room (keep=1 would have deleted the first after a success).
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  CHECK(files == std::vector<std::string>{"ckpt-00000001.pt", "ckpt-00000001.pt.crc32c", "latest"});
  std::string path;
  std::vector<std::string> skipped;
  REQUIRE(FindLatestValidCheckpoint(dir, &path, &skipped).ok());
  CHECK(std::filesystem::path(path).filename() == "ckpt-00000001.pt");
  CHECK(skipped.empty());
  // Space again: the next one is written as usual, and keep=1 prunes the old one now.
  REQUIRE(SaveCheckpoint(dir, policy, adam, TrainingCounters{300, 3, 3, 0, 0.0}, nullptr, nullptr, 1).ok());
  CHECK(ListCheckpoints(dir).size() == 1);
  (void)RemoveTree(dir);
}

TEST_CASE("MetricsWriter: a row that does not fit is cut off again, the file keeps whole lines only",
          "[checkpoint][metrics]") {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("farm-metrics-full-" + std::to_string(::getpid()) + ".jsonl")).string();
  std::filesystem::remove(path);
  MetricsWriter w;
  REQUIRE(w.Open(path).ok());
  REQUIRE(w.Write(nlohmann::json{{"update", 1}, {"pad", std::string(50, 'a')}}).ok());
  const auto one_row = std::filesystem::file_size(path);
  Status s;
  {
    FileSizeLimit full(one_row + 20);  // room for 20 bytes of the next row, not all of it
    s = w.Write(nlohmann::json{{"update", 2}, {"pad", std::string(50, 'b')}});
  }
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains(path) && Catch::Contains("File too large"));
  CHECK(std::filesystem::file_size(path) == one_row);
  REQUIRE(w.Write(nlohmann::json{{"update", 3}}).ok());  // the next row goes in as usual
  std::ifstream in(path);
  std::string line;
  std::vector<int> updates;
  while (std::getline(in, line)) updates.push_back(nlohmann::json::parse(line)["update"].get<int>());
  CHECK(updates == std::vector<int>{1, 3});
  std::filesystem::remove(path);
}

namespace {
std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
std::string TempDir(const std::string& tag) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("farm-" + tag + "-" + std::to_string(::getpid()))).string();
  (void)RemoveTree(dir);
  return dir;
}
CheckpointBytes Bytes(int update) {
  return CheckpointBytes{"ckpt-0000000" + std::to_string(update) + ".pt", "data " + std::to_string(update)};
}
// A CheckpointWriter's before_write hook whose first call blocks until Release(): a slow disk, with no sleeps.
struct FirstWriteBlocks {
  std::promise<void> started, release;
  std::shared_future<void> release_f = release.get_future().share();
  std::atomic<int> writes{0};
  std::function<void()> Hook() {
    return [this] {
      if (writes.fetch_add(1) == 0) {
        started.set_value();
        release_f.wait();
      }
    };
  }
  void WaitStarted() { started.get_future().wait(); }
  void Release() { release.set_value(); }
};
}  // namespace

TEST_CASE("CheckpointWriter: writes in order off the caller's thread, a newer checkpoint replaces one still waiting",
          "[checkpoint]") {
  const std::string dir = TempDir("ckpt-writer");
  FirstWriteBlocks disk;
  std::atomic<int> announced{0};
  std::vector<CheckpointWriter::Written> done;
  int64_t skipped = 0;
  {
    CheckpointWriter writer(dir, /*keep=*/0, [&] { ++announced; }, disk.Hook());
    writer.Submit(Bytes(1));
    disk.WaitStarted();  // checkpoint 1 is being written (and blocked)
    CHECK(writer.in_flight_seconds() > 0);
    writer.Submit(Bytes(2));  // waits
    writer.Submit(Bytes(3));  // replaces 2, which is never written
    CHECK(writer.skipped() == 1);
    CHECK_FALSE(std::filesystem::exists(dir + "/ckpt-00000001.pt"));
    CHECK(writer.TakeResults().empty());
    disk.Release();
    done = writer.Drain();  // 1, then 3
    writer.Submit(Bytes(5));
    writer.Submit(Bytes(6));  // 5 may be written or replaced: the writer is not blocked any more
    std::string path;
    REQUIRE(writer.WriteNow(Bytes(7), &path).ok());
    CHECK(path == dir + "/ckpt-00000007.pt");
    CHECK(writer.in_flight_seconds() == 0);
    for (auto& r : writer.Drain()) done.push_back(std::move(r));
    skipped = writer.skipped();
  }
  // The periodic ones in order; WriteNow's outcome is its return value.
  REQUIRE(done.size() >= 2);
  CHECK(done[0].name == "ckpt-00000001.pt");
  CHECK(done[1].name == "ckpt-00000003.pt");
  for (const auto& r : done) {
    CHECK(r.status.ok());
    CHECK(r.path == dir + "/" + r.name);
  }
  CHECK(announced.load() == static_cast<int>(done.size()));
  CHECK(static_cast<int64_t>(done.size()) + skipped == 5);  // every periodic one: written or replaced
  CHECK(std::filesystem::exists(dir + "/ckpt-00000001.pt"));
  CHECK_FALSE(std::filesystem::exists(dir + "/ckpt-00000002.pt"));
  CHECK(std::filesystem::exists(dir + "/ckpt-00000003.pt.crc32c"));
  CHECK(ReadAll(dir + "/latest") == "ckpt-00000007.pt\n");
  (void)RemoveTree(dir);
}

TEST_CASE("CheckpointWriter: the final checkpoint drops a waiting periodic one and is written next", "[checkpoint]") {
  const std::string dir = TempDir("ckpt-writer-final");
  FirstWriteBlocks disk;
  CheckpointWriter writer(dir, 0, {}, disk.Hook());
  writer.Submit(Bytes(1));
  disk.WaitStarted();
  writer.Submit(Bytes(2));  // waiting behind 1 when the stop comes
  std::future<Status> final_status = std::async(std::launch::async, [&] { return writer.WriteNow(Bytes(3), nullptr); });
  // WriteNow drops 2 before it waits for 1: skipped() says so while 1 is still blocked.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (writer.skipped() == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(writer.skipped() == 1);
  disk.Release();
  REQUIRE(final_status.get().ok());
  const auto done = writer.Drain();
  REQUIRE(done.size() == 1);
  CHECK(done[0].name == "ckpt-00000001.pt");
  CHECK(writer.skipped() == 1);
  CHECK(disk.writes.load() == 2);  // 1 and 3
  CHECK_FALSE(std::filesystem::exists(dir + "/ckpt-00000002.pt"));
  CHECK(ReadAll(dir + "/latest") == "ckpt-00000003.pt\n");
  (void)RemoveTree(dir);
}

TEST_CASE("CheckpointWriter: concurrent WriteNow calls are each written and each told their own outcome",
          "[checkpoint]") {
  const std::string dir = TempDir("ckpt-writer-now");
  {
    CheckpointWriter writer(dir, 0);
    std::vector<std::future<std::pair<Status, std::string>>> calls;
    for (int u = 1; u <= 6; ++u)
      calls.push_back(std::async(std::launch::async, [&writer, u] {
        std::string path;
        Status s = writer.WriteNow(Bytes(u), &path);
        return std::make_pair(s, path);
      }));
    for (int u = 1; u <= 6; ++u) {
      auto [s, path] = calls[u - 1].get();
      CHECK(s.ok());
      CHECK(path == dir + "/ckpt-0000000" + std::to_string(u) + ".pt");
      CHECK(ReadAll(path) == "data " + std::to_string(u));
    }
  }
  (void)RemoveTree(dir);
}

TEST_CASE("CheckpointWriter: a write that fails or throws is an outcome, never std::terminate", "[checkpoint]") {
  const std::string base = TempDir("ckpt-writer-fail");
  std::filesystem::create_directories(base);
  SECTION("a failed write, periodic and final") {
    std::ofstream(base + "/checkpoints") << "a file where the directory should be";
    std::promise<void> announced;
    CheckpointWriter writer(base + "/checkpoints", 0, [&] { announced.set_value(); });
    writer.Submit(CheckpointBytes{"ckpt-00000001.pt", "x"});
    announced.get_future().wait();
    const auto done = writer.TakeResults();
    REQUIRE(done.size() == 1);
    CHECK_FALSE(done[0].status.ok());
    CHECK_THAT(done[0].status.message(), Catch::Contains(base + "/checkpoints"));
    CHECK_FALSE(writer.WriteNow(CheckpointBytes{"ckpt-00000002.pt", "y"}, nullptr).ok());
  }
  SECTION("an exception on the writer's thread (a filesystem error, an allocation)") {
    std::atomic<int> calls{0};
    CheckpointWriter writer(base + "/checkpoints", 0, {}, [&] {
      if (calls.fetch_add(1) % 2 == 0) throw std::filesystem::filesystem_error("directory_iterator::operator++",
                                                                             std::make_error_code(std::errc::io_error));
      throw std::bad_alloc();
    });
    writer.Submit(CheckpointBytes{"ckpt-00000001.pt", "x"});
    const auto done = writer.Drain();
    REQUIRE(done.size() == 1);
    CHECK_FALSE(done[0].status.ok());
    CHECK_THAT(done[0].status.message(), Catch::Contains("ckpt-00000001.pt: writing failed") &&
                                             Catch::Contains("directory_iterator"));
    const Status s = writer.WriteNow(CheckpointBytes{"ckpt-00000002.pt", "y"}, nullptr);
    CHECK_FALSE(s.ok());
    CHECK_THAT(s.message(), Catch::Contains("out of memory"));
    CHECK_FALSE(writer.WriteNow(CheckpointBytes{"ckpt-00000003.pt", "z"}, nullptr).ok());  // and the next
  }
  (void)RemoveTree(base);
}

TEST_CASE("a checkpoint directory that cannot be listed is an error, not an empty or older list", "[checkpoint]") {
  const std::string base = TempDir("ckpt-list");
  std::filesystem::create_directories(base);
  std::ofstream(base + "/checkpoints") << "a file where the directory should be";
  std::error_code ec;
  CHECK(ListCheckpoints(base + "/checkpoints", &ec).empty());
  CHECK(ec);  // ENOTDIR
  std::string found;
  const Status s = FindLatestValidCheckpoint(base + "/checkpoints", &found, nullptr);
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains("cannot list the checkpoints"));
  CHECK(ListCheckpoints(base + "/missing", &ec).empty());
  CHECK_FALSE(ec);  // a missing directory holds no checkpoints
  (void)RemoveTree(base);
}

TEST_CASE("WriteCheckpoint: a checkpoint of the same name that cannot be written leaves the one there", "[checkpoint]") {
  const std::string dir = TempDir("ckpt-same-name");
  std::string path;
  REQUIRE(WriteCheckpoint(dir, CheckpointBytes{"ckpt-00000005.pt", "periodic"}, 0, &path).ok());
  SECTION("its checksum cannot be written") {
    std::filesystem::create_directories(path + ".crc32c.tmp");  // open(O_WRONLY) fails: EISDIR
    CHECK_FALSE(WriteCheckpoint(dir, CheckpointBytes{"ckpt-00000005.pt", "final"}, 0, nullptr).ok());
    CHECK(ReadAll(path) == "periodic");
  }
  SECTION("`latest` cannot be written") {
    std::filesystem::create_directories(dir + "/latest.tmp");
    CHECK_FALSE(WriteCheckpoint(dir, CheckpointBytes{"ckpt-00000005.pt", "final"}, 0, nullptr).ok());
    CHECK(ReadAll(path) == "final");  // written in full with its checksum; `latest` named it already
  }
  SECTION("a new name whose `latest` cannot be written is removed again") {
    std::filesystem::create_directories(dir + "/latest.tmp");
    CHECK_FALSE(WriteCheckpoint(dir, CheckpointBytes{"ckpt-00000006.pt", "next"}, 0, nullptr).ok());
    CHECK_FALSE(std::filesystem::exists(dir + "/ckpt-00000006.pt"));
  }
  std::string found;
  std::vector<std::string> skipped;
  REQUIRE(FindLatestValidCheckpoint(dir, &found, &skipped).ok());  // the pair that is there matches
  CHECK(found == path);
  CHECK(skipped.empty());
  CHECK(ReadAll(dir + "/latest") == "ckpt-00000005.pt\n");
  (void)RemoveTree(dir);
}
