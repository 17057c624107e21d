// Running moments (Welford per row, Chan et al.'s merge), the normalisation transforms, wire checks.
#include "common/running_stats.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace farm {

void RunningMoments::Reset(int64_t dim) {
  count_ = 0;
  mean_.assign(static_cast<std::size_t>(dim), 0.0);
  m2_.assign(static_cast<std::size_t>(dim), 0.0);
}

double RunningMoments::Variance(int64_t i) const {
  if (count_ == 0) return 1.0;
  return m2_[static_cast<std::size_t>(i)] / static_cast<double>(count_);
}

void RunningMoments::AddRows(const float* data, int64_t rows) {
  const auto d = static_cast<std::size_t>(dim());
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = data + static_cast<std::size_t>(r) * d;
    // A row holding NaN or Inf (an env gone wrong; the learner rejects or sanitizes it) would spoil the
    // statistics for the rest of the run: it is not counted.
    bool finite = true;
    for (std::size_t i = 0; i < d; ++i) finite = finite && std::isfinite(x[i]);
    if (!finite) continue;
    ++count_;
    const double inv = 1.0 / static_cast<double>(count_);
    for (std::size_t i = 0; i < d; ++i) {
      const double v = x[i];
      const double delta = v - mean_[i];
      mean_[i] += delta * inv;
      m2_[i] += delta * (v - mean_[i]);
    }
  }
}

void RunningMoments::Add(const double* sample) {
  const auto d = static_cast<std::size_t>(dim());
  for (std::size_t i = 0; i < d; ++i)
    if (!std::isfinite(sample[i])) return;
  ++count_;
  const double inv = 1.0 / static_cast<double>(count_);
  for (std::size_t i = 0; i < d; ++i) {
    const double delta = sample[i] - mean_[i];
    mean_[i] += delta * inv;
    m2_[i] += delta * (sample[i] - mean_[i]);
  }
}

void RunningMoments::Merge(const RunningMoments& other) {
  if (other.count_ == 0) return;
  if (count_ == 0) {
    *this = other;
    return;
  }
  if (other.dim() != dim())
    throw std::invalid_argument(fmt::format("RunningMoments::Merge: {} elements into {}", other.dim(), dim()));
  const double na = static_cast<double>(count_);
  const double nb = static_cast<double>(other.count_);
  const double n = na + nb;
  for (std::size_t i = 0; i < mean_.size(); ++i) {
    const double delta = other.mean_[i] - mean_[i];
    mean_[i] += delta * (nb / n);
    m2_[i] += other.m2_[i] + delta * delta * (na * nb / n);
  }
  count_ += other.count_;
}

Status RunningMoments::Make(int64_t count, std::vector<double> mean, std::vector<double> m2, RunningMoments* out) {
  if (count < 0) return Status::InvalidArgument(fmt::format("count must be >= 0, got {}", count));
  if (mean.size() != m2.size())
    return Status::InvalidArgument(
        fmt::format("mean and m2 must have one entry per element, got {} and {}", mean.size(), m2.size()));
  out->count_ = count;
  out->mean_ = std::move(mean);
  out->m2_ = std::move(m2);
  return Status::Ok();
}

ObsTransform ObsTransform::From(const RunningMoments& moments, double clip) {
  ObsTransform t;
  const auto d = static_cast<std::size_t>(moments.dim());
  t.mean.resize(d);
  t.std.resize(d);
  for (std::size_t i = 0; i < d; ++i) {
    t.mean[i] = moments.empty() ? 0.0f : static_cast<float>(moments.mean()[i]);
    t.std[i] = static_cast<float>(std::sqrt(moments.Variance(static_cast<int64_t>(i)) + kNormalizerEpsilon));
  }
  t.clip = static_cast<float>(clip);
  return t;
}

void ObsTransform::Apply(const float* in, float* out, int64_t rows) const {
  const std::size_t d = mean.size();
  const float lo = -clip;
  const float hi = clip;
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = in + static_cast<std::size_t>(r) * d;
    float* y = out + static_cast<std::size_t>(r) * d;
    for (std::size_t i = 0; i < d; ++i) y[i] = std::min(std::max((x[i] - mean[i]) / std[i], lo), hi);
  }
}

float ScaleReward(float reward, const RunningMoments& ret, double clip) {
  const double scaled = static_cast<double>(reward) / std::sqrt(ret.Variance(0) + kNormalizerEpsilon);
  return static_cast<float>(std::min(std::max(scaled, -clip), clip));
}

NormalizerOptions NormalizerOptions::FromConfig(const FarmConfig& config) {
  NormalizerOptions o;
  o.obs = config.env.normalize_obs;
  o.reward = config.env.normalize_reward;
  o.obs_clip = config.env.obs_clip;
  o.reward_clip = config.env.reward_clip;
  o.gamma = config.ppo.gamma;
  return o;
}

void NormalizerOptions::ToWire(wire::Normalization* out) const {
  out->set_normalize_obs(obs);
  out->set_normalize_reward(reward);
  out->set_obs_clip(obs_clip);
  out->set_reward_clip(reward_clip);
  out->set_gamma(gamma);
}

Status NormalizerOptions::CheckMatches(const wire::Normalization& w, const NormalizerOptions& l) {
  std::vector<std::string> diffs;
  if (w.normalize_obs() != l.obs)
    diffs.push_back(fmt::format("env.normalize_obs {} (learner: {})", w.normalize_obs(), l.obs));
  if (w.normalize_reward() != l.reward)
    diffs.push_back(fmt::format("env.normalize_reward {} (learner: {})", w.normalize_reward(), l.reward));
  // The other keys matter only for what is on.
  if (l.obs && w.normalize_obs() && w.obs_clip() != l.obs_clip)
    diffs.push_back(fmt::format("env.obs_clip {} (learner: {})", w.obs_clip(), l.obs_clip));
  if (l.reward && w.normalize_reward() && w.reward_clip() != l.reward_clip)
    diffs.push_back(fmt::format("env.reward_clip {} (learner: {})", w.reward_clip(), l.reward_clip));
  if (l.reward && w.normalize_reward() && w.gamma() != l.gamma)
    diffs.push_back(fmt::format("ppo.gamma {} (learner: {})", w.gamma(), l.gamma));
  if (diffs.empty()) return Status::Ok();
  return Status::InvalidArgument(fmt::format(
      "the worker's observation/reward preprocessing differs from the learner's: {}; give workers and learner the "
      "same config (a worker without normalisation support, such as the Python worker, sends none)",
      fmt::join(diffs, ", ")));
}

void ToWire(const RunningMoments& m, wire::RunningMoments* out) {
  out->set_count(m.count());
  out->mutable_mean()->Assign(m.mean().begin(), m.mean().end());
  out->mutable_m2()->Assign(m.m2().begin(), m.m2().end());
}

Status FromWire(const wire::RunningMoments& in, int64_t dim, const char* what, RunningMoments* out) {
  if (in.count() < 0) return Status::Protocol(fmt::format("{}.count: expected >= 0, got {}", what, in.count()));
  if (in.mean_size() != dim || in.m2_size() != dim)
    return Status::Protocol(fmt::format("{}: expected mean and m2 of {} entries each, got {} and {}", what, dim,
                                        in.mean_size(), in.m2_size()));
  for (int64_t i = 0; i < dim; ++i) {
    const double mean = in.mean(static_cast<int>(i));
    const double m2 = in.m2(static_cast<int>(i));
    if (!std::isfinite(mean))
      return Status::Protocol(fmt::format("{}.mean[{}]: expected a finite number, got {}", what, i, mean));
    if (!std::isfinite(m2) || m2 < 0)
      return Status::Protocol(fmt::format("{}.m2[{}]: expected a finite number >= 0, got {}", what, i, m2));
  }
  return RunningMoments::Make(in.count(), {in.mean().begin(), in.mean().end()}, {in.m2().begin(), in.m2().end()},
                              out);
}

Status CheckNormalizerStats(const wire::NormalizerStats& in, bool normalize_obs, int64_t obs_dim,
                            bool normalize_reward, const char* what, RunningMoments* obs, RunningMoments* ret) {
  if (in.has_obs() != normalize_obs)
    return Status::Protocol(fmt::format("{}.obs: {} (env.normalize_obs is {})", what,
                                        in.has_obs() ? "sent, but observations are not normalised" : "missing",
                                        normalize_obs));
  if (in.has_ret() != normalize_reward)
    return Status::Protocol(fmt::format("{}.ret: {} (env.normalize_reward is {})", what,
                                        in.has_ret() ? "sent, but rewards are not scaled" : "missing",
                                        normalize_reward));
  const std::string obs_what = std::string(what) + ".obs";
  const std::string ret_what = std::string(what) + ".ret";
  if (normalize_obs) {
    if (auto s = FromWire(in.obs(), obs_dim, obs_what.c_str(), obs); !s.ok()) return s;
  }
  if (normalize_reward) {
    if (auto s = FromWire(in.ret(), 1, ret_what.c_str(), ret); !s.ok()) return s;
  }
  return Status::Ok();
}

int64_t MaxNormalizerStatsBytes(int64_t obs_dim) {
  // Two packed doubles per element, plus the return's and the tags, counts and lengths.
  return 2 * (obs_dim + 1) * static_cast<int64_t>(sizeof(double)) + 128;
}

}  // namespace farm
