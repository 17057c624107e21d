// Observation and action spaces, shared by envs (which declare them) and the
// learner (which learns them from the worker's handshake).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace farm {

enum class DType { kFloat32, kFloat64, kInt32, kInt64, kUInt8 };

std::size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);

struct Space {
  enum class Kind { kDiscrete, kBox };

  Kind kind = Kind::kBox;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;  // {} for a discrete space
  int64_t n = 0;               // number of choices, discrete only
  std::vector<float> low;      // box only: flattened bounds, numel() entries
  std::vector<float> high;

  static Space Discrete(int64_t n);
  // Bounds given per element (numel() entries) or as one value for all.
  static Space Box(std::vector<int64_t> shape, std::vector<float> low, std::vector<float> high);

  bool is_discrete() const { return kind == Kind::kDiscrete; }
  // Elements per sample: 1 for a discrete space, prod(shape) for a box.
  int64_t numel() const;
  std::string ToString() const;
  bool operator==(const Space& other) const;
  bool operator!=(const Space& other) const { return !(*this == other); }
};

}  // namespace farm
