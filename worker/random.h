// Portable random draws for environments: the same numbers for a seed on every
// standard library (std::uniform_real_distribution differs between them).
#pragma once

#include <cstdint>
#include <random>

namespace farm {

// Uniform in [lo, hi) from the top 53 bits of one draw.
inline double UniformReal(std::mt19937_64& rng, double lo, double hi) {
  const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
  return lo + (hi - lo) * u;
}

}  // namespace farm
