// Running statistics for observation normalisation and reward scaling
// (env.normalize_obs, env.normalize_reward): per-element count, mean and M2
// in float64, updated a batch at a time and merged exactly (Chan, Golub and
// LeVeque's parallel form of Welford's algorithm), so that each worker can
// gather a delta and the learner can add every worker's deltas into one set
// of statistics for the run. Also the normalisation itself and the wire
// conversions with their receiver-side checks. No LibTorch, no envs.
//
// Threading: plain values; one thread at a time per object.
#pragma once

#include <cstdint>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "farm.pb.h"

namespace farm {

// Added to the variance before its square root, as Stable-Baselines3's VecNormalize does.
inline constexpr double kNormalizerEpsilon = 1e-8;

class RunningMoments {
 public:
  RunningMoments() = default;
  explicit RunningMoments(int64_t dim) { Reset(dim); }

  // Forgets every sample; `dim` elements per sample.
  void Reset(int64_t dim);
  int64_t dim() const { return static_cast<int64_t>(mean_.size()); }
  int64_t count() const { return count_; }
  bool empty() const { return count_ == 0; }
  const std::vector<double>& mean() const { return mean_; }
  const std::vector<double>& m2() const { return m2_; }
  // Population variance of element i (M2 / count, as numpy's var); 1 while empty.
  double Variance(int64_t i) const;

  // Adds `rows` samples of dim() floats each, row-major (two passes over the batch, then a merge).
  void AddRows(const float* data, int64_t rows);
  // Adds one sample of dim() doubles.
  void Add(const double* sample);
  // Adds another set's samples (same dim; an empty set of any dim is a no-op, and this set, when
  // empty, takes the other's dim). Exact: merging the moments of two sets gives the moments of their union.
  void Merge(const RunningMoments& other);

  // Sets the moments directly (a stored or received set); sizes must match.
  static Status Make(int64_t count, std::vector<double> mean, std::vector<double> m2, RunningMoments* out);

 private:
  int64_t count_ = 0;
  std::vector<double> mean_;
  std::vector<double> m2_;
};

// The observation transform, precomputed from a set of moments as float32:
// out = clamp((x - mean) / std, -clip, clip) with std = sqrt(var + 1e-8), per element. The
// exported TorchScript module computes exactly this (the same float32 mean and std, subtraction,
// division, clamp).
struct ObsTransform {
  std::vector<float> mean;
  std::vector<float> std;
  float clip = 10;

  static ObsTransform From(const RunningMoments& moments, double clip);
  // `rows` rows of mean.size() floats; `in` and `out` may be the same buffer.
  void Apply(const float* in, float* out, int64_t rows) const;
};

// The reward transform: clamp(r / sqrt(var_G + 1e-8), -clip, clip), var_G the variance of the
// running discounted return (element 0 of `ret`).
float ScaleReward(float reward, const RunningMoments& ret, double clip);

// What a worker does to observations and rewards (config env.normalize_obs, normalize_reward, obs_clip,
// reward_clip; ppo.gamma for the running return). The worker applies it (worker/normalizer.h); the learner
// checks that every worker's matches its own.
struct NormalizerOptions {
  bool obs = false;
  bool reward = false;
  double obs_clip = 10;
  double reward_clip = 10;
  double gamma = 0.99;  // the discount of the running return (ppo.gamma)

  static NormalizerOptions FromConfig(const FarmConfig& config);
  bool any() const { return obs || reward; }
  // As the Hello carries it, and the learner's check of a Hello's against its own options: an error
  // naming each key that differs.
  void ToWire(wire::Normalization* out) const;
  static Status CheckMatches(const wire::Normalization& worker, const NormalizerOptions& learner);
};

// Wire conversions. FromWire checks what a receiver must not trust: count >= 0, mean and m2 of
// `dim` entries each, all finite, m2 >= 0; errors name `what` and say what was expected.
void ToWire(const RunningMoments& moments, wire::RunningMoments* out);
Status FromWire(const wire::RunningMoments& in, int64_t dim, const char* what, RunningMoments* out);

// The checks of a NormalizerStats message against a session: `obs` present exactly when
// `normalize_obs` (with obs_dim elements), `ret` exactly when `normalize_reward` (1 element).
// Fills the moments it finds (the others are left empty).
Status CheckNormalizerStats(const wire::NormalizerStats& in, bool normalize_obs, int64_t obs_dim,
                            bool normalize_reward, const char* what, RunningMoments* obs, RunningMoments* ret);

// An upper bound on the bytes a NormalizerStats adds to a message (obs of obs_dim elements and the return).
int64_t MaxNormalizerStatsBytes(int64_t obs_dim);

}  // namespace farm
