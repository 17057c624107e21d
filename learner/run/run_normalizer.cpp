// The run's normaliser statistics.
#include "learner/run/run_normalizer.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace farm {

RunNormalizer::RunNormalizer(const FarmConfig& config, bool recording)
    : config_(config), options_(NormalizerOptions::FromConfig(config)), recording_(recording) {}

void RunNormalizer::Reset(int64_t obs_numel) {
  obs_.Reset(options_.obs ? obs_numel : 0);
  ret_.Reset(options_.reward ? 1 : 0);
  Rebase();
}

void RunNormalizer::Rebase() {
  agreed_obs_ = obs_;
  agreed_ret_ = ret_;
  local_obs_.Reset(obs_.dim());
  local_ret_.Reset(ret_.dim());
}

void RunNormalizer::TakeForRanks(RunningMoments* obs, RunningMoments* ret) {
  *obs = local_obs_;
  *ret = local_ret_;
  local_obs_.Reset(obs_.dim());
  local_ret_.Reset(ret_.dim());
}

void RunNormalizer::ApplyRanks(const RunningMoments& obs, const RunningMoments& ret) {
  if (!recording_) return;
  agreed_obs_.Merge(obs);
  agreed_ret_.Merge(ret);
  obs_ = agreed_obs_;
  obs_.Merge(local_obs_);
  ret_ = agreed_ret_;
  ret_.Merge(local_ret_);
}

Status RunNormalizer::InitFrom(const FarmConfig& saved, const std::string& checkpoint) {
  if (saved.env.normalize_obs != config_.env.normalize_obs)
    return Status::InvalidArgument(fmt::format(
        "the policy in {} was trained with env.normalize_obs {}, but this run has {}: it would see observations "
        "unlike those it learned from",
        config_.learner.init_from, saved.env.normalize_obs, config_.env.normalize_obs));
  if (!options_.any()) return Status::Ok();
  RunningMoments obs, ret;
  if (auto s = ReadCheckpointNormalizer(checkpoint, &obs, &ret); !s.ok()) {
    if (s.code() != Status::Code::kNotFound || options_.obs) return s;
    return Status::Ok();
  }
  if (options_.obs) {
    if (obs.dim() != obs_.dim())
      return Status::InvalidArgument(fmt::format("{}: normalizer.obs has {} elements, the observation {}", checkpoint,
                                                 obs.dim(), obs_.dim()));
    obs_ = std::move(obs);
  }
  if (options_.reward && ret.dim() == 1) ret_ = std::move(ret);
  Rebase();
  spdlog::info("normaliser statistics from {}: {} observations, {} returns{}", checkpoint, obs_.count(), ret_.count(),
               recording_ ? "" : " (frozen)");
  return Status::Ok();
}

Status RunNormalizer::Merge(const wire::NormalizerStats& delta) {
  RunningMoments obs, ret;
  if (auto s = CheckNormalizerStats(delta, options_.obs, obs_.dim(), options_.reward, "StepRequest.stats_delta", &obs,
                                    &ret);
      !s.ok())
    return s;
  if (!recording_) return Status::Ok();  // frozen: serving a trained policy's statistics as they are
  obs_.Merge(obs);
  ret_.Merge(ret);
  local_obs_.Merge(obs);
  local_ret_.Merge(ret);
  return Status::Ok();
}

void RunNormalizer::Fill(wire::NormalizerStats* out) const {
  out->Clear();
  if (options_.obs) ToWire(obs_, out->mutable_obs());
  if (options_.reward) ToWire(ret_, out->mutable_ret());
  out->set_frozen(!recording_);
}

void RunNormalizer::Restore(const RunState& state, const std::string& path) {
  if (!options_.any()) return;
  if (!state.has_normalizer) {
    spdlog::warn("resume: {} holds no normaliser statistics (written before checkpoints stored them); they start "
                 "afresh",
                 path);
    return;
  }
  // What the checkpoint's run normalised (its config may have differed): restored where the sizes agree.
  const bool obs_ok = !options_.obs || state.normalizer_obs.dim() == obs_.dim();
  const bool ret_ok = !options_.reward || state.normalizer_ret.dim() == ret_.dim();
  if (obs_ok && options_.obs) obs_ = state.normalizer_obs;
  if (ret_ok && options_.reward) ret_ = state.normalizer_ret;
  Rebase();
  if (!obs_ok || !ret_ok)
    spdlog::warn("resume: {} holds no {} statistics (its run did not normalise them); they start afresh", path,
                 !obs_ok ? "observation" : "return");
}

void RunNormalizer::Capture(RunState* state) const {
  state->has_normalizer = true;  // empty moments when normalisation is off
  state->normalizer_obs = obs_;
  state->normalizer_ret = ret_;
}

}  // namespace farm
