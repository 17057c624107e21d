#include "common/space.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>

namespace farm {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return 4;
    case DType::kFloat64: return 8;
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
    case DType::kUInt8: return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kUInt8: return "uint8";
  }
  return "?";
}

Space Space::Discrete(int64_t n) {
  if (n <= 0) throw std::invalid_argument(fmt::format("Discrete space needs n > 0, got {}", n));
  Space s;
  s.kind = Kind::kDiscrete;
  s.dtype = DType::kInt64;
  s.n = n;
  return s;
}

Space Space::MultiDiscrete(std::vector<int64_t> nvec) {
  if (nvec.empty()) throw std::invalid_argument("MultiDiscrete space needs at least one component");
  for (std::size_t i = 0; i < nvec.size(); ++i)
    if (nvec[i] <= 0)
      throw std::invalid_argument(fmt::format("MultiDiscrete space needs nvec[i] > 0, got nvec[{}] = {}", i, nvec[i]));
  Space s;
  s.kind = Kind::kMultiDiscrete;
  s.dtype = DType::kInt64;
  s.shape = {static_cast<int64_t>(nvec.size())};
  s.nvec = std::move(nvec);
  return s;
}

Space Space::Box(std::vector<int64_t> shape, std::vector<float> low, std::vector<float> high) {
  Space s;
  s.kind = Kind::kBox;
  s.dtype = DType::kFloat32;
  s.shape = std::move(shape);
  const auto numel = s.numel();
  auto expand = [numel](std::vector<float> v, const char* what) {
    if (v.size() == 1 && numel != 1) v.assign(static_cast<std::size_t>(numel), v[0]);
    if (static_cast<int64_t>(v.size()) != numel)
      throw std::invalid_argument(fmt::format("Box {} has {} entries, expected 1 or {}", what, v.size(), numel));
    return v;
  };
  s.low = expand(std::move(low), "low");
  s.high = expand(std::move(high), "high");
  return s;
}

std::vector<int64_t> Space::categories() const {
  if (kind == Kind::kDiscrete) return {n};
  if (kind == Kind::kMultiDiscrete) return nvec;
  return {};
}

int64_t Space::head_size() const {
  if (kind == Kind::kBox) return numel();
  int64_t sum = 0;
  for (int64_t c : categories()) sum += c;
  return sum;
}

int64_t Space::numel() const {
  if (kind == Kind::kDiscrete) return 1;
  if (kind == Kind::kMultiDiscrete) return static_cast<int64_t>(nvec.size());
  int64_t n_el = 1;
  for (auto d : shape) n_el *= d;
  return n_el;
}

std::string Space::ToString() const {
  if (kind == Kind::kDiscrete) return fmt::format("Discrete({})", n);
  if (kind == Kind::kMultiDiscrete) return fmt::format("MultiDiscrete([{}])", fmt::join(nvec, ", "));
  return fmt::format("Box({}, shape=[{}])", dtype_name(dtype), fmt::join(shape, ", "));
}

bool Space::operator==(const Space& o) const {
  return kind == o.kind && dtype == o.dtype && shape == o.shape && n == o.n && nvec == o.nvec && low == o.low && high == o.high;
}

}  // namespace farm
