// The fused CPU PPO update's loss terms and their gradients by hand (the notation is at the top of
// ppo_fused.cpp): advantage normalisation, the clipped surrogate with the entropy bonus, the value loss.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "learner/train/ppo_fused.h"
#include "learner/train/ppo_fused_impl.h"

namespace farm {

using fused_detail::kHalfLog2Pi;

// Over the rows that acted (every row without a mask); a left-out row's advantage is never read.
void FusedPpoUpdate::NormalizeAdvantages(Workspace& ws) const {
  if (!config_.norm_adv) return;
  const double rows = static_cast<double>(ws.acting);
  double mean = 0;
  for (int64_t i = 0; i < ws.rows; ++i) mean += ws.weight[i] * ws.advantage[i];
  mean /= rows;
  double denom = 1.0;
  if (ws.acting > 1) {
    double ss = 0;
    for (int64_t i = 0; i < ws.rows; ++i) ss += ws.weight[i] * (ws.advantage[i] - mean) * (ws.advantage[i] - mean);
    denom = std::sqrt(ss / (rows - 1)) + kAdvantageEps;
  }
  for (float& a : ws.advantage) a = static_cast<float>((a - mean) / denom);
}

// The policy's part of the loss (clipped surrogate, entropy bonus) and its gradient with respect to the actor's
// output (ws.actor.g.back()) and log_std (box). stats: policy loss, entropy, approx KL, old approx KL and clip
// fraction (means over the rows that acted) into stats[0], [2], [3], [4], [5]. A left-out row (weight 0) is skipped:
// its gradient is 0 and nothing of it (an inf log-prob, say) is read.
void FusedPpoUpdate::PolicyLoss(Workspace& ws, double* stats) {
  const int64_t rows = ws.rows;
  const int64_t dim = head_dim_;
  const double inv_rows = 1.0 / static_cast<double>(ws.acting);
  const float inv_b = static_cast<float>(inv_rows);
  const float clip = static_cast<float>(config_.clip_coef);
  const float ent_grad = static_cast<float>(-config_.ent_coef * inv_rows);  // dLoss/dH_i
  const float* head = ws.actor.y.back().data();
  float* head_grad = ws.actor.g.back().data();
  const float* log_std = discrete_ ? nullptr : log_std_.data_ptr<float>();
  std::vector<float>& l = ws.logp_all;
  std::vector<float>& prob = ws.probs;
  std::vector<float>& inv_std = ws.probs;  // box: exp(-log_std) per dimension

  double box_entropy = 0, log_std_sum = 0;
  if (!discrete_) {
    for (int64_t d = 0; d < dim; ++d) {
      box_entropy += log_std[d] + 0.5 + kHalfLog2Pi;
      log_std_sum += log_std[d];
      inv_std[d] = std::exp(-log_std[d]);
      log_std_grad_[d] = 0;
    }
  }

  double pg_sum = 0, ent_sum = 0, kl_sum = 0, old_kl_sum = 0, clipped = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const float* z = head + i * dim;
    float* gz = head_grad + i * dim;
    if (ws.weight[i] == 0) {
      std::fill(gz, gz + dim, 0.0f);
      continue;
    }
    // Log-prob and entropy of the row.
    float logp, entropy;
    if (discrete_) {
      // Independent components: the row's log-prob and entropy are sums over its segments of the head.
      logp = 0;
      entropy = 0;
      const int64_t* actions = ws.action.data() + i * static_cast<int64_t>(segments_.size());
      int64_t offset = 0;
      for (std::size_t s = 0; s < segments_.size(); ++s) {
        const int64_t n = segments_[s];
        const float* zs = z + offset;
        float max = zs[0];
        for (int64_t k = 1; k < n; ++k) max = std::max(max, zs[k]);
        float sum = 0;
        for (int64_t k = 0; k < n; ++k) sum += std::exp(zs[k] - max);
        const float log_sum = std::log(sum);
        float h = 0;
        for (int64_t k = 0; k < n; ++k) {
          l[offset + k] = zs[k] - max - log_sum;
          prob[offset + k] = std::exp(l[offset + k]);
          h -= prob[offset + k] * l[offset + k];
        }
        ws.seg_entropy[s] = h;
        entropy += h;
        logp += l[offset + actions[s]];
        offset += n;
      }
    } else {
      const float* a = ws.action_box.data() + i * dim;
      float sq = 0;
      for (int64_t d = 0; d < dim; ++d) {
        const float e = (a[d] - z[d]) * inv_std[d];
        sq += e * e;
      }
      logp = static_cast<float>(-0.5 * sq - log_std_sum - kHalfLog2Pi * static_cast<double>(dim));
      entropy = static_cast<float>(box_entropy);
    }
    ent_sum += entropy;

    // Clipped surrogate and its gradient with respect to logp.
    const float log_ratio = logp - ws.old_logp[i];
    const float ratio = std::exp(log_ratio);
    old_kl_sum += -log_ratio;
    kl_sum += (ratio - 1.0f) - log_ratio;
    if (std::abs(ratio - 1.0f) > clip) clipped += 1;
    const float adv = ws.advantage[i];
    const bool inside = ratio >= 1.0f - clip && ratio <= 1.0f + clip;
    const float clamped = std::min(std::max(ratio, 1.0f - clip), 1.0f + clip);
    const float unclipped_term = -adv * ratio;
    const float clipped_term = -adv * clamped;
    pg_sum += std::max(unclipped_term, clipped_term);
    const float to_unclipped = unclipped_term > clipped_term ? 1.0f : unclipped_term == clipped_term ? 0.5f : 0.0f;
    const float dpg_dratio = -adv * (to_unclipped + (1.0f - to_unclipped) * (inside ? 1.0f : 0.0f));
    const float logp_grad = dpg_dratio * ratio * inv_b;

    // Gradient with respect to the head's outputs.
    if (discrete_) {
      // Per segment: dlogp/dz = onehot(a) - p, dH/dz = -p (l + H_segment).
      const int64_t* actions = ws.action.data() + i * static_cast<int64_t>(segments_.size());
      int64_t offset = 0;
      for (std::size_t s = 0; s < segments_.size(); ++s) {
        const int64_t a = offset + actions[s];
        const float h = ws.seg_entropy[s];
        for (int64_t k = offset; k < offset + segments_[s]; ++k)
          gz[k] = logp_grad * ((k == a ? 1.0f : 0.0f) - prob[k]) + ent_grad * (-prob[k] * (l[k] + h));
        offset += segments_[s];
      }
    } else {
      const float* a = ws.action_box.data() + i * dim;
      for (int64_t d = 0; d < dim; ++d) {
        const float e = (a[d] - z[d]) * inv_std[d];
        gz[d] = logp_grad * e * inv_std[d];
        log_std_grad_[d] += logp_grad * (e * e - 1.0f);
      }
    }
  }
  if (!discrete_) {
    for (int64_t d = 0; d < dim; ++d) log_std_grad_[d] += static_cast<float>(-config_.ent_coef);  // dH/ds_d = 1
  }
  stats[0] = pg_sum * inv_rows;
  stats[2] = ent_sum * inv_rows;
  stats[3] = kl_sum * inv_rows;
  stats[4] = old_kl_sum * inv_rows;
  stats[5] = clipped * inv_rows;
}

// The value loss and its gradient with respect to the critic's output (ws.critic.g.back()); its mean over the
// rows that acted into stats[1] (a left-out row: gradient 0).
void FusedPpoUpdate::ValueLoss(Workspace& ws, double* stats) const {
  const int64_t rows = ws.rows;
  const double inv_rows = 1.0 / static_cast<double>(ws.acting);
  const float scale = static_cast<float>(config_.vf_coef * inv_rows);
  const float clip = static_cast<float>(config_.clip_coef);
  const float* value = ws.critic.y.back().data();
  float* value_grad = ws.critic.g.back().data();
  double sum = 0;
  for (int64_t i = 0; i < rows; ++i) {
    if (ws.weight[i] == 0) {
      value_grad[i] = 0;
      continue;
    }
    const float v = value[i];
    const float err = v - ws.ret[i];
    float dvl_dv;  // d(vl_i)/dv, vl_i = 0.5 * max(...)
    if (config_.clip_vloss) {
      const float dv = v - ws.old_value[i];
      const float clipped_err = ws.old_value[i] + std::min(std::max(dv, -clip), clip) - ws.ret[i];
      const float sq = err * err, clipped_sq = clipped_err * clipped_err;
      sum += std::max(sq, clipped_sq);
      const float to_unclipped = sq > clipped_sq ? 1.0f : sq == clipped_sq ? 0.5f : 0.0f;
      const bool inside = dv >= -clip && dv <= clip;
      dvl_dv = to_unclipped * err + (1.0f - to_unclipped) * (inside ? clipped_err : 0.0f);
    } else {
      sum += err * err;
      dvl_dv = err;
    }
    value_grad[i] = scale * dvl_dv;
  }
  stats[1] = 0.5 * sum * inv_rows;
}

}  // namespace farm
