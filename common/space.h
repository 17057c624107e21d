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

// Three kinds, as Gymnasium's Discrete, MultiDiscrete and Box:
//   discrete        one int64 in [0, n); shape {}.
//   multi-discrete  K int64s, component i in [0, nvec[i]) (e.g. a move and a
//                   tool chosen together); shape {K}.
//   box             float32 tensor of `shape` within [low, high].
// The first two are *categorical*: the policy has one categorical head per
// component, and their actions travel as int64 [rows, shape...].
struct Space {
  enum class Kind { kDiscrete, kBox, kMultiDiscrete };

  Kind kind = Kind::kBox;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;  // {} for a discrete space, {K} for a multi-discrete one
  int64_t n = 0;               // number of choices, discrete only
  std::vector<int64_t> nvec;   // multi-discrete only: choices per component, K entries
  std::vector<float> low;      // box only: flattened bounds, numel() entries
  std::vector<float> high;

  static Space Discrete(int64_t n);
  // Throws std::invalid_argument for an empty nvec or an entry <= 0.
  static Space MultiDiscrete(std::vector<int64_t> nvec);
  // Bounds given per element (numel() entries) or as one value for all.
  static Space Box(std::vector<int64_t> shape, std::vector<float> low, std::vector<float> high);

  bool is_discrete() const { return kind == Kind::kDiscrete; }
  bool is_multi_discrete() const { return kind == Kind::kMultiDiscrete; }
  bool is_box() const { return kind == Kind::kBox; }
  // Discrete or multi-discrete: int64 actions, categorical heads.
  bool is_categorical() const { return kind != Kind::kBox; }
  // Choices per categorical component: {n} (discrete), nvec (multi-discrete); {} for a box.
  std::vector<int64_t> categories() const;
  // Width of a policy head for this action space: the sum of categories() (one logit per choice) for a
  // categorical space, numel() (one mean per element) for a box.
  int64_t head_size() const;
  // Elements per sample: 1 for a discrete space, K for a multi-discrete one, prod(shape) for a box.
  int64_t numel() const;
  std::string ToString() const;
  bool operator==(const Space& other) const;
  bool operator!=(const Space& other) const { return !(*this == other); }
};

}  // namespace farm
