// Checkpoints: checksums, retention of the newest K, falling back past a
// truncated file, and the run state (generators, episode window, config) that
// --resume continues from, including checkpoints written before it existed.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>

#include <ATen/CPUGeneratorImpl.h>

#include "common/files.h"
#include "learner/checkpoint.h"
#include "learner/checkpoint_writer.h"
#include "learner/metrics.h"
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

  // Not solved: stored as such.
  RunState unsolved;
  c.updates = 8;
  REQUIRE(SaveCheckpoint(dir, policy, adam, c, &path, nullptr, 0, &unsolved).ok());
  REQUIRE(LoadCheckpoint(path, policy, &adam, &back, nullptr, &loaded).ok());
  CHECK_FALSE(loaded.solved_at_steps);
  CHECK_FALSE(loaded.has_episode_window);

  // A checkpoint written without any run state (as older versions did) still loads; what it lacks is listed.
  c.updates = 9;
  REQUIRE(SaveCheckpoint(dir, policy, adam, c, &path).ok());
  REQUIRE(LoadCheckpoint(path, policy, &adam, &back, nullptr, &loaded).ok());
  CHECK(back.updates == 9);
  CHECK(loaded.rng.empty());
  CHECK_FALSE(loaded.has_episode_window);
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

TEST_CASE("CheckpointWriter: writes in order off the caller's thread, a newer checkpoint replaces one still waiting",
          "[checkpoint]") {
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("farm-ckpt-writer-" + std::to_string(::getpid()))).string();
  (void)RemoveTree(dir);
  // The first write blocks until released: a slow disk, with no sleeps in the test.
  std::promise<void> started, release;
  std::shared_future<void> release_f = release.get_future().share();
  std::atomic<int> writes{0};
  auto before_write = [&] {
    if (writes.fetch_add(1) == 0) {
      started.set_value();
      release_f.wait();
    }
  };
  std::mutex mu;
  std::vector<std::pair<std::string, bool>> done;  // GUARDED_BY(mu): name, ok
  auto bytes = [](int u) { return CheckpointBytes{"ckpt-0000000" + std::to_string(u) + ".pt", "data " + std::to_string(u)}; };
  {
    CheckpointWriter writer(dir, /*keep=*/0,
                            [&](const Status& s, const std::string& path, const std::string& name) {
                              std::lock_guard<std::mutex> lock(mu);
                              done.emplace_back(name, s.ok() && path == dir + "/" + name);
                            },
                            before_write);
    writer.Submit(bytes(1));
    started.get_future().wait();  // checkpoint 1 is being written (and blocked)
    CHECK(writer.in_flight_seconds() > 0);
    writer.Submit(bytes(2));  // waits
    writer.Submit(bytes(3));  // replaces 2, which is never written
    CHECK(writer.skipped() == 1);
    CHECK_FALSE(std::filesystem::exists(dir + "/ckpt-00000001.pt"));
    release.set_value();
    std::string path;
    REQUIRE(writer.WriteNow(bytes(4), &path).ok());  // after 1 and 3
    CHECK(path == dir + "/ckpt-00000004.pt");
    CHECK(writer.in_flight_seconds() == 0);
  }
  std::lock_guard<std::mutex> lock(mu);
  REQUIRE(done.size() == 2);  // the periodic ones: 1 and 3, in order; WriteNow's outcome is its return value
  CHECK(done[0] == std::make_pair(std::string("ckpt-00000001.pt"), true));
  CHECK(done[1] == std::make_pair(std::string("ckpt-00000003.pt"), true));
  CHECK(std::filesystem::exists(dir + "/ckpt-00000001.pt"));
  CHECK_FALSE(std::filesystem::exists(dir + "/ckpt-00000002.pt"));
  CHECK(std::filesystem::exists(dir + "/ckpt-00000003.pt.crc32c"));
  std::ifstream latest(dir + "/latest");
  std::string name;
  latest >> name;
  CHECK(name == "ckpt-00000004.pt");
  (void)RemoveTree(dir);
}

TEST_CASE("CheckpointWriter: a write that fails is reported, to on_done or by WriteNow", "[checkpoint]") {
  const std::string base = (std::filesystem::temp_directory_path() /
                            ("farm-ckpt-writer-fail-" + std::to_string(::getpid()))).string();
  (void)RemoveTree(base);
  std::filesystem::create_directories(base);
  std::ofstream(base + "/checkpoints") << "a file where the directory should be";
  std::promise<Status> periodic;
  CheckpointWriter writer(base + "/checkpoints", 0, [&](const Status& s, const std::string&, const std::string&) {
    periodic.set_value(s);
  });
  writer.Submit(CheckpointBytes{"ckpt-00000001.pt", "x"});
  const Status s = periodic.get_future().get();
  CHECK_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains(base + "/checkpoints"));
  CHECK_FALSE(writer.WriteNow(CheckpointBytes{"ckpt-00000002.pt", "y"}, nullptr).ok());
  (void)RemoveTree(base);
}
