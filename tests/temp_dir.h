// A fresh directory for a test (mkdtemp under the system temp dir), removed with everything in it when the
// object goes out of scope.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>

#include "common/files.h"

namespace farm::testing {

struct TempDir {
  explicit TempDir(const std::string& prefix = "farm-test") {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + pattern);
    path = pattern;
  }
  // Not std::filesystem::remove_all: PyTorch's wheel exports a broken one from libtorch.so (see RemoveTree).
  ~TempDir() { (void)RemoveTree(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string path;
};

}  // namespace farm::testing
