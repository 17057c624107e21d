// Checkpoints: checksums, retention of the newest K, and falling back past a
// truncated file.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "learner/checkpoint.h"

// LibTorch pulls in glog, whose CHECK would replace Catch's: include Catch last.
#undef CHECK
#include <catch2/catch.hpp>

using namespace farm;

TEST_CASE("checkpoints keep the newest K and a corrupt one is passed over", "[checkpoint]") {
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("farm-ckpt-test-" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(dir);
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
  std::filesystem::remove_all(dir);
}
