// common/files.h: atomic writes and RemoveTree.
#include "common/files.h"
#include "tests/file_size_limit.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <iterator>
#include <fstream>
#include <memory>
#include <string>

namespace fs = std::filesystem;
using namespace farm;

TEST_CASE("RemoveTree removes nested contents, does not follow links, accepts a missing path", "[files]") {
  const fs::path base = fs::temp_directory_path() / ("farm-files-test-" + std::to_string(::getpid()));
  const fs::path outside = base.string() + "-outside";
  fs::create_directories(base / "a" / "b");
  fs::create_directories(outside);
  REQUIRE(WriteFileAtomic((base / "a" / "b" / "f.txt").string(), "x").ok());
  REQUIRE(WriteFileAtomic((base / "top.txt").string(), "y").ok());
  REQUIRE(WriteFileAtomic((outside / "keep.txt").string(), "z").ok());
  fs::create_directory_symlink(outside, base / "link");

  REQUIRE(RemoveTree(base.string()).ok());
  CHECK_FALSE(fs::exists(base));
  CHECK(fs::exists(outside / "keep.txt"));  // the link went, not what it pointed to
  CHECK(RemoveTree(base.string()).ok());    // already gone
  REQUIRE(RemoveTree((outside / "keep.txt").string()).ok());  // a plain file
  CHECK_FALSE(fs::exists(outside / "keep.txt"));
  REQUIRE(RemoveTree(outside.string()).ok());
  CHECK_FALSE(fs::exists(outside));
}

TEST_CASE("WriteFileAtomic replaces the whole file and leaves no temp file", "[files]") {
  const fs::path dir = fs::temp_directory_path() / ("farm-files-atomic-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "f").string();
  REQUIRE(WriteFileAtomic(path, "first version, longer").ok());
  REQUIRE(WriteFileAtomic(path, "second").ok());
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text == "second");
  CHECK_FALSE(fs::exists(path + ".tmp"));
  CHECK_FALSE(WriteFileAtomic((dir / "missing-dir" / "f").string(), "x").ok());
  REQUIRE(RemoveTree(dir.string()).ok());
}

TEST_CASE("WriteFileAtomic writes a path without a directory part (the directory fsynced is .)", "[files]") {
  const std::string name = "farm-files-test-relative-" + std::to_string(::getpid()) + ".txt";
  REQUIRE(WriteFileAtomic(name, "relative\n").ok());
  std::ifstream in(name);
  std::string line;
  std::getline(in, line);
  CHECK(line == "relative");
  CHECK_FALSE(fs::exists(name + ".tmp"));
  fs::remove(name);
  // A directory that does not exist: the temp file cannot be created, and the error names it.
  const Status s = WriteFileAtomic("/nonexistent-farm-dir/x.txt", "x");
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains("/nonexistent-farm-dir/x.txt.tmp"));
}

TEST_CASE("DirectoryLock: one holder at a time, released when destroyed", "[files]") {
  const fs::path dir = fs::temp_directory_path() / ("farm-files-lock-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::unique_ptr<DirectoryLock> first, second;
  REQUIRE(DirectoryLock::Acquire(dir.string(), "x.lock", &first).ok());
  const Status busy = DirectoryLock::Acquire(dir.string(), "x.lock", &second);
  REQUIRE_FALSE(busy.ok());
  CHECK(second == nullptr);
  CHECK_THAT(busy.message(), Catch::Contains("x.lock is locked by another process"));
  first.reset();
  CHECK(DirectoryLock::Acquire(dir.string(), "x.lock", &second).ok());
  second.reset();
  CHECK_FALSE(DirectoryLock::Acquire((dir / "missing").string(), "x.lock", &second).ok());
  REQUIRE(RemoveTree(dir.string()).ok());
}

TEST_CASE("WriteFileAtomic on a full disk keeps the old file, removes its temp file and names the reason",
          "[files]") {
  const fs::path dir = fs::temp_directory_path() / ("farm-files-full-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "f").string();
  REQUIRE(WriteFileAtomic(path, "old").ok());
  Status s;
  {
    FileSizeLimit full(1000);  // files past 1000 bytes cannot grow (EFBIG, as ENOSPC would)
    s = WriteFileAtomic(path, std::string(5000, 'x'));
  }
  REQUIRE_FALSE(s.ok());
  CHECK(s.code() == Status::Code::kIoError);
  CHECK_THAT(s.message(), Catch::Contains(path + ".tmp") && Catch::Contains("write failed after 1000 of 5000 bytes") &&
                              Catch::Contains("File too large"));
  CHECK_FALSE(fs::exists(path + ".tmp"));
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text == "old");
  REQUIRE(WriteFileAtomic(path, std::string(5000, 'y')).ok());  // the limit is gone again
  REQUIRE(RemoveTree(dir.string()).ok());
}
