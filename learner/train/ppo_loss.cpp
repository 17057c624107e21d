// PPO's shared arithmetic (ppo_loss.h): GAE, the finished agents' bootstrap, the minibatch loss, the evaluation
// of rows, the device-side gradient clip.
#include "learner/train/ppo_loss.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace farm {

void RequireShape(const torch::Tensor& t, torch::IntArrayRef expected, const char* what) {
  if (!t.defined()) throw std::invalid_argument(std::string(what) + " is undefined");
  if (t.sizes() != expected) {
    throw std::invalid_argument(std::string(what) + " has shape " + c10::str(t.sizes()) + ", expected " +
                                c10::str(expected));
  }
}

Advantages ComputeGae(const torch::Tensor& rewards, const torch::Tensor& values, const torch::Tensor& dones,
                      const torch::Tensor& last_value, double gamma, double lambda) {
  if (!rewards.defined() || rewards.dim() != 2) throw std::invalid_argument("ComputeGae: rewards must be [T, N]");
  const int64_t steps = rewards.size(0);
  const int64_t envs = rewards.size(1);
  RequireShape(values, rewards.sizes(), "ComputeGae: values");
  RequireShape(dones, rewards.sizes(), "ComputeGae: dones");
  RequireShape(last_value, {envs}, "ComputeGae: last_value");

  // The recursion is sequential in T and tiny per step, so a scalar loop on the host beats T rounds of
  // [N]-sized tensor ops; float arithmetic, as the reference does it in float32 tensors.
  torch::NoGradGuard no_grad;
  const auto host = [](const torch::Tensor& t) { return t.detach().to(torch::kCPU, torch::kFloat32).contiguous(); };
  const torch::Tensor r = host(rewards), v = host(values), d = host(dones), last = host(last_value);
  torch::Tensor adv = torch::empty({steps, envs}, torch::kFloat32);
  const float* rp = r.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  const float* dp = d.data_ptr<float>();
  const float* lp = last.data_ptr<float>();
  float* ap = adv.data_ptr<float>();
  const auto g = static_cast<float>(gamma);
  const auto gl = static_cast<float>(gamma * lambda);
  for (int64_t n = 0; n < envs; ++n) {
    float next_value = lp[n];
    float next_adv = 0;
    for (int64_t t = steps - 1; t >= 0; --t) {
      const int64_t i = t * envs + n;
      const float not_done = 1.0f - dp[i];
      const float delta = rp[i] + g * next_value * not_done - vp[i];
      next_adv = delta + gl * not_done * next_adv;
      ap[i] = next_adv;
      next_value = vp[i];
    }
  }
  Advantages out;
  out.advantages = adv.to(rewards.device());
  out.returns = out.advantages + values.detach().to(torch::kFloat32);
  return out;
}

std::vector<std::pair<std::string, double>> PpoStats::Items() const {
  std::vector<std::pair<std::string, double>> items{
      {"policy_loss", policy_loss},
      {"value_loss", value_loss},
      {"entropy", entropy},
      {"approx_kl", approx_kl},
      {"old_approx_kl", old_approx_kl},
      {"clip_fraction", clip_fraction},
      {"explained_variance", explained_variance},
      {"value_std", value_std},
      {"return_std", return_std},
      {"learning_rate", learning_rate},
      {"grad_norm", grad_norm},
      {"loss_scale", loss_scale},
      {"skipped_steps", static_cast<double>(skipped_steps)},
      {"epochs", static_cast<double>(epochs)},
      {"samples", static_cast<double>(samples)},
      {"lag_dropped", static_cast<double>(lag_dropped)},
      {"masked_rows", static_cast<double>(masked_rows)},
  };
  if (value_norm) {
    items.push_back({"value_norm_mean", value_norm_mean});
    items.push_back({"value_norm_std", value_norm_std});
  }
  if (critic_saturation) items.push_back({"critic_saturation", *critic_saturation});
  if (vtrace) {
    items.push_back({"vtrace_ratio", vtrace_ratio});
    items.push_back({"vtrace_rho_clipped", vtrace_rho_clipped});
    items.push_back({"vtrace_c_clipped", vtrace_c_clipped});
  }
  return items;
}

PpoLoss ComputePpoLoss(const EvalOutput& eval, const torch::Tensor& old_logp, const torch::Tensor& old_values,
                       const torch::Tensor& advantages, const torch::Tensor& returns, const PpoConfig& config,
                       const torch::Tensor& mask) {
  // Every input is [B]: a stray [B, 1] would broadcast to [B, B] and silently train on nonsense.
  if (!eval.logp.defined() || eval.logp.dim() != 1) throw std::invalid_argument("ComputePpoLoss: logp must be [B]");
  const auto batch = eval.logp.sizes();
  RequireShape(eval.entropy, batch, "ComputePpoLoss: entropy");
  RequireShape(eval.value, batch, "ComputePpoLoss: value");
  RequireShape(old_logp, batch, "ComputePpoLoss: old_logp");
  RequireShape(old_values, batch, "ComputePpoLoss: old_values");
  RequireShape(advantages, batch, "ComputePpoLoss: advantages");
  RequireShape(returns, batch, "ComputePpoLoss: returns");
  if (mask.defined()) RequireShape(mask, batch, "ComputePpoLoss: mask");

  // One arithmetic whether or not agents finished: means over the rows that count (MAPPO's active masks:
  // sum(x * m) / sum(m)), every row when no mask is given. Without a host read, so that a CUDA graph can record it;
  // a minibatch with no row counting has every term 0.
  const torch::Tensor m = mask.defined() ? mask : torch::ones_like(old_logp);
  const torch::Tensor count = m.sum();
  const torch::Tensor denom = count.clamp_min(1);
  const auto mean = [&](const torch::Tensor& x) { return (x * m).sum() / denom; };
  // The rows left out enter every term as neutral inputs (ratio 1, advantage 0, the value its old one), chosen by
  // `where` so that no gradient reaches their own: a left-out row's inf would otherwise make 0 * inf a NaN.
  const torch::Tensor counts = m > 0;
  const auto pick = [&](const torch::Tensor& x, const torch::Tensor& otherwise) {
    return torch::where(counts, x, otherwise);
  };

  const double clip = config.clip_coef;
  PpoLoss loss;
  const torch::Tensor log_ratio = pick(eval.logp - old_logp, torch::zeros_like(old_logp));
  const torch::Tensor ratio = log_ratio.exp();
  {
    torch::NoGradGuard no_grad;
    loss.old_approx_kl = mean(-log_ratio);
    loss.approx_kl = mean((ratio - 1) - log_ratio);
    loss.clip_fraction = mean(((ratio - 1).abs() > clip).to(torch::kFloat32));
  }

  torch::Tensor adv = pick(advantages, torch::zeros_like(advantages));
  if (config.norm_adv) {
    // (adv - mean) / (unbiased std + eps) over the rows that count; one row is only centred (so 0): the unbiased
    // std of one sample is NaN.
    const torch::Tensor centred = adv - mean(adv);
    const torch::Tensor var = (centred.square() * m).sum() / (count - 1).clamp_min(1);
    adv = centred / (var.sqrt() + kAdvantageEps);
  }
  const torch::Tensor pg_unclipped = -adv * ratio;
  const torch::Tensor pg_clipped = -adv * torch::clamp(ratio, 1 - clip, 1 + clip);
  loss.policy_loss = mean(torch::max(pg_unclipped, pg_clipped));

  const torch::Tensor value = pick(eval.value, old_values);
  const torch::Tensor v_unclipped = (value - returns).square();
  if (config.clip_vloss) {
    const torch::Tensor v_clipped = old_values + torch::clamp(value - old_values, -clip, clip);
    loss.value_loss = 0.5 * mean(torch::max(v_unclipped, (v_clipped - returns).square()));
  } else {
    loss.value_loss = 0.5 * mean(v_unclipped);
  }
  loss.entropy = mean(pick(eval.entropy, torch::zeros_like(eval.entropy)));
  loss.total = loss.policy_loss - config.ent_coef * loss.entropy + config.vf_coef * loss.value_loss;
  return loss;
}

Rollout BootstrapFinishedAgents(const Rollout& rollout, double gamma, bool bootstrap) {
  if (!rollout.active.defined()) return rollout;
  RequireShape(rollout.active, rollout.rewards.sizes(), "BootstrapFinishedAgents: active");
  torch::NoGradGuard no_grad;
  const int64_t steps = rollout.rewards.size(0);
  Rollout r = rollout;
  if (steps < 2) return r;
  const auto host = [](const torch::Tensor& t) { return t.detach().to(torch::kCPU, torch::kFloat32).contiguous(); };
  const torch::Tensor active = host(rollout.active);
  // Acted at t, not at t + 1, and the episode went on: the agent's last step.
  const torch::Tensor done = host(rollout.dones);
  const torch::Tensor last = active.narrow(0, 0, steps - 1) * (1 - active.narrow(0, 1, steps - 1)) *
                             (1 - done.narrow(0, 0, steps - 1));
  if (!last.any().item<bool>()) return r;
  torch::Tensor rewards = host(rollout.rewards).clone();
  torch::Tensor dones = done.clone();
  if (bootstrap)
    rewards.narrow(0, 0, steps - 1).add_(last * static_cast<float>(gamma) * host(rollout.values).narrow(0, 1, steps - 1));
  dones.narrow(0, 0, steps - 1).add_(last);
  r.rewards = rewards.to(rollout.rewards.device());
  r.dones = dones.to(rollout.dones.device());
  return r;
}

torch::Tensor UnitRows(const torch::Tensor& unit_idx, int64_t k, const torch::Tensor& arange_k) {
  return k == 1 ? unit_idx : (unit_idx.unsqueeze(1) * k + arange_k).flatten();
}

EvalOutput EvaluateUnits(ActorCriticImpl& policy, const PpoRows& rows, const torch::Tensor& unit_idx,
                         const torch::Tensor& row_idx, Precision precision) {
  EvalOutput eval;
  {
    AutocastGuard autocast(rows.obs.device(), precision);
    const torch::Tensor states = rows.states.defined() ? rows.states.index_select(0, unit_idx) : torch::Tensor();
    eval = policy.Evaluate(rows.obs.index_select(0, row_idx), states, rows.actions.index_select(0, row_idx));
  }
  eval.logp = eval.logp.to(torch::kFloat32);
  eval.value = eval.value.to(torch::kFloat32);
  eval.entropy = eval.entropy.to(torch::kFloat32);
  return eval;
}

PpoLoss MinibatchLoss(ActorCriticImpl& policy, const PpoRows& rows, const torch::Tensor& unit_idx, int64_t k,
                      const torch::Tensor& arange_k, Precision precision, const PpoConfig& config) {
  const torch::Tensor idx = UnitRows(unit_idx, k, arange_k);
  EvalOutput eval = EvaluateUnits(policy, rows, unit_idx, idx, precision);
  eval.value = policy.NormalizedValue(eval.value);  // ppo.value_norm: the head's scale (unchanged without)
  return ComputePpoLoss(eval, rows.logp.index_select(0, idx), rows.values.index_select(0, idx),
                        rows.advantages.index_select(0, idx), rows.returns.index_select(0, idx), config,
                        rows.active.defined() ? rows.active.index_select(0, idx) : torch::Tensor());
}

std::pair<torch::Tensor, torch::Tensor> EvaluateRows(ActorCriticImpl& policy, const PpoRows& rows, int64_t k,
                                                     Precision precision) {
  torch::NoGradGuard no_grad;
  const int64_t units = rows.obs.size(0) / k;
  const int64_t per_slice = std::max<int64_t>(1, 16384 / k);  // about 16k rows at a time
  const auto opts = torch::TensorOptions().dtype(torch::kLong).device(rows.obs.device());
  const torch::Tensor arange_k = torch::arange(k, opts);
  std::vector<torch::Tensor> logps, values;
  for (int64_t u0 = 0; u0 < units; u0 += per_slice) {
    const torch::Tensor unit_idx = torch::arange(u0, std::min(units, u0 + per_slice), opts);
    const EvalOutput eval = EvaluateUnits(policy, rows, unit_idx, UnitRows(unit_idx, k, arange_k), precision);
    logps.push_back(eval.logp);
    values.push_back(eval.value);
  }
  return {torch::cat(logps), torch::cat(values)};
}

torch::Tensor LossStats(const PpoLoss& loss) {
  return torch::stack({loss.policy_loss.detach(), loss.value_loss.detach(), loss.entropy.detach(), loss.approx_kl,
                       loss.old_approx_kl, loss.clip_fraction})
      .to(torch::kFloat64);
}

torch::Tensor ClipGradNormOnDevice(const std::vector<torch::Tensor>& params, double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  std::vector<torch::Tensor> norms;
  for (const auto& p : params) {
    if (!p.grad().defined()) continue;
    grads.push_back(p.grad());
    norms.push_back(p.grad().norm(2).to(torch::kFloat32));
  }
  if (grads.empty()) return torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64));
  const torch::Tensor total = torch::stack(norms).norm(2);
  const torch::Tensor coef = (max_norm / (total + 1e-6)).clamp_max(1.0);
  for (auto& g : grads) g.mul_(coef);
  return total.to(torch::kFloat64);
}

}  // namespace farm
