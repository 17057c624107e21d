// A critic stuck on one value, noticed and named.
#include "learner/train/critic_watch.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

namespace farm {

std::optional<CriticWatch::Report> CriticWatch::Observe(int64_t update, const PpoStats& stats) {
  // Returns that do not vary (or a cancelled, empty update) say nothing about the critic: the count holds.
  if (!(stats.return_std > 0) || !std::isfinite(stats.value_std)) return std::nullopt;
  const double spread = stats.value_std / stats.return_std;
  if (spread >= kConstantSpread) {
    constant_updates_ = 0;
    if (!reported_at_ || spread < kVaryingSpread) return std::nullopt;
    const int64_t since = *reported_at_;
    reported_at_.reset();
    return Report{
        false, fmt::format("the critic's values vary again at update {} (value_std {:.3g} against return_std {:.3g}, "
                           "explained variance {:.3f}; reported constant at update {})",
                           update, stats.value_std, stats.return_std, stats.explained_variance, since)};
  }
  if (++constant_updates_ != kUpdates || reported_at_) return std::nullopt;
  reported_at_ = update;
  return Report{
      true,
      fmt::format(
          "the critic has given every row the same value for {} updates in a row (update {}: value_std {:.3g} against "
          "return_std {:.3g}, explained variance {:.3f}): most likely every unit of one of its hidden layers is "
          "saturated or dead for every input (a tanh at +-1, a ReLU below zero), so no gradient reaches the layers "
          "below it and the actor trains without a baseline. It may come back or not; a lower ppo.lr takes smaller "
          "steps (docs/PERFORMANCE.md, \"When the learner warns about the critic\")",
          kUpdates, update, stats.value_std, stats.return_std, stats.explained_variance)};
}

std::optional<CriticWatch::Report> CriticWatch::ObserveScale(int64_t update, const PpoStats& stats,
                                                            double max_abs_reward, double gamma) {
  if (stats.cancelled || !(max_abs_reward > 0) || !std::isfinite(max_abs_reward) || !(gamma < 1) || gamma < 0)
    return std::nullopt;
  const double bound = max_abs_reward / (1 - gamma);
  // A NaN or infinite spread is beyond any bound too.
  if (!(stats.value_std <= bound)) {
    ++unbounded_updates_;
  } else {
    unbounded_updates_ = 0;
  }
  if (unbounded_updates_ < kUpdates || unbounded_reported_) return std::nullopt;
  unbounded_reported_ = true;
  return Report{
      true,
      fmt::format(
          "the critic's values are diverging: for {} updates in a row their spread exceeded any return the run's "
          "rewards allow (update {}: value_std {:.3g}, return_std {:.3g}, against max |reward| {:.3g} / (1 - gamma "
          "{:g}) = {:.3g}). Most likely the critic feeds its own values back through bootstrapped targets: an "
          "episode's last observation (the time limit's bootstrap, ppo.bootstrap_truncated) or an agent's that "
          "drifts to states it never trained on. Try ppo.bootstrap_truncated: false, ppo.value_norm: running or a "
          "lower ppo.lr (docs/PERFORMANCE.md, \"When the learner warns about the critic\")",
          kUpdates, update, stats.value_std, stats.return_std, max_abs_reward, gamma, bound)};
}

std::optional<double> RolloutCriticSaturation(ActorCriticImpl& policy, const Rollout& rollout, int64_t max_rows) {
  const torch::Tensor& input = policy.has_global_state() ? rollout.states : rollout.obs;
  if (!input.defined() || input.dim() < 2 || input.size(0) * input.size(1) == 0 || max_rows <= 0) return std::nullopt;
  const torch::Tensor rows = input.flatten(0, 1);  // [T, N or envs, ...] -> [T * N, ...]
  const int64_t n = rows.size(0);
  const torch::Tensor pick =
      n <= max_rows ? rows
                    : rows.index_select(0, torch::linspace(0, static_cast<double>(n - 1), max_rows,
                                                           torch::TensorOptions().dtype(torch::kDouble))
                                               .to(torch::kLong)
                                               .to(rows.device()));
  return policy.CriticSaturation(pick);
}

Status CriticWatch::Restore(const State& state) {
  if (state.constant_updates < 0 || state.constant_updates > std::numeric_limits<int>::max() ||
      (state.reported_at && *state.reported_at < 0))
    return Status::InvalidArgument(
        fmt::format("critic_watch: {} constant updates, reported at update {}: expected "
                    "counts >= 0",
                    state.constant_updates, state.reported_at.value_or(0)));
  constant_updates_ = static_cast<int>(state.constant_updates);
  reported_at_ = state.reported_at;
  return Status::Ok();
}

}  // namespace farm
