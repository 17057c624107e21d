// Helpers shared by the tests of EnvGroup and of what a worker sends: a group that exists or a failed test,
// and an env's buffers or a message's tensors read back as plain vectors.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/wire.h"
#include "worker/env_group.h"

namespace farm::testing {

// EnvGroup::Create (frame_stack k), or the test stops with Create's message.
inline std::unique_ptr<EnvGroup> MakeGroup(const std::string& name, const std::map<std::string, double>& options,
                                           int n, uint64_t seed, int frame_stack = 1) {
  std::unique_ptr<EnvGroup> group;
  EnvGroupOptions group_options;
  group_options.frame_stack = frame_stack;
  const Status s = EnvGroup::Create(name, options, n, seed, group_options, &group);
  INFO(s.ToString());
  REQUIRE(s.ok());
  return group;
}

// n floats from p, e.g. Floats(group->obs() + row * numel, numel) for one row.
inline std::vector<float> Floats(const float* p, int64_t n) { return std::vector<float>(p, p + n); }

// A float32 wire tensor's elements.
inline std::vector<float> FloatsOf(const wire::Tensor& t) {
  std::vector<float> out(t.data().size() / sizeof(float));
  std::memcpy(out.data(), t.data().data(), out.size() * sizeof(float));
  return out;
}

// A wire tensor's shape.
inline std::vector<int64_t> ShapeOf(const wire::Tensor& t) {
  return std::vector<int64_t>(t.shape().begin(), t.shape().end());
}

}  // namespace farm::testing
