// Files of the repository in the tests: a path under the source tree, and a config of it loaded or the test stops
// with LoadConfig's message. The root is this header's folder's parent (tests/..), wherever the build is.
#pragma once

#include <catch2/catch.hpp>

#include <string>

#include "common/config.h"
#include "common/status.h"

namespace farm::testing {

// The repository's root joined with a relative path, e.g. RepoPath("configs/cartpole.yaml").
inline std::string RepoPath(const std::string& relative) {
  const std::string header = __FILE__;
  return header.substr(0, header.rfind("/tests/")) + "/" + relative;
}

// LoadConfig of a repository file with no overrides; REQUIREs that it loads.
inline FarmConfig LoadRepoConfig(const std::string& relative) {
  FarmConfig config;
  const Status loaded = LoadConfig(RepoPath(relative), {}, &config);
  INFO(relative << ": " << loaded.ToString());
  REQUIRE(loaded.ok());
  return config;
}

}  // namespace farm::testing
