// Portable random draws for environments: the same numbers for a seed on every
// standard library (std::uniform_real_distribution differs between them).
#pragma once

#include <cmath>
#include <cstdint>
#include <random>

namespace farm {

// SplitMix64 (Steele et al.): a bijective mixer, so nearby inputs give
// unrelated seeds. Used to derive env and group seeds from the run's seed.
inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in [lo, hi) from the top 53 bits of one draw.
inline double UniformReal(std::mt19937_64& rng, double lo, double hi) {
  const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
  return lo + (hi - lo) * u;
}

// A standard normal draw (Box-Muller on two UniformReal draws), the same on every standard library, unlike
// std::normal_distribution.
inline double StandardNormal(std::mt19937_64& rng) {
  const double u1 = 1.0 - UniformReal(rng, 0.0, 1.0);  // in (0, 1]: log(u1) is finite
  const double u2 = UniformReal(rng, 0.0, 1.0);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace farm
