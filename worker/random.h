// Portable random draws for environments: the same numbers for a seed on every
// standard library (std::uniform_real_distribution differs between them).
#pragma once

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

}  // namespace farm
