// V-trace targets and advantages: the backward recursion of IMPALA's section 4.1, as a host loop (as GAE's).
#include "learner/train/vtrace.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace farm {
namespace {

void Expect(const torch::Tensor& t, torch::IntArrayRef sizes, const char* what) {
  if (!t.defined() || t.sizes() != sizes)
    throw std::invalid_argument(std::string("ComputeVtrace: ") + what + " must be " + c10::str(sizes) + ", got " +
                                (t.defined() ? c10::str(t.sizes()) : std::string("undefined")));
}

torch::Tensor Host(const torch::Tensor& t) { return t.detach().to(torch::kCPU, torch::kFloat32).contiguous(); }

}  // namespace

Advantages ComputeVtrace(const torch::Tensor& log_rhos, const torch::Tensor& rewards, const torch::Tensor& values,
                         const torch::Tensor& dones, const torch::Tensor& last_value, const VtraceParams& params,
                         VtraceStats* stats) {
  if (!rewards.defined() || rewards.dim() != 2) throw std::invalid_argument("ComputeVtrace: rewards must be [T, N]");
  const int64_t steps = rewards.size(0);
  const int64_t envs = rewards.size(1);
  Expect(log_rhos, rewards.sizes(), "log_rhos");
  Expect(values, rewards.sizes(), "values");
  Expect(dones, rewards.sizes(), "dones");
  Expect(last_value, {envs}, "last_value");
  if (params.rho_bar < 0 || params.c_bar < 0)
    throw std::invalid_argument("ComputeVtrace: rho_bar and c_bar must be >= 0");
  torch::NoGradGuard no_grad;
  const torch::Tensor lr = Host(log_rhos), r = Host(rewards), v = Host(values), d = Host(dones), last = Host(last_value);
  torch::Tensor adv = torch::empty({steps, envs}, torch::kFloat32);
  torch::Tensor vs = torch::empty({steps, envs}, torch::kFloat32);
  const float* lrp = lr.data_ptr<float>();
  const float* rp = r.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  const float* dp = d.data_ptr<float>();
  const float* lp = last.data_ptr<float>();
  float* ap = adv.data_ptr<float>();
  float* sp = vs.data_ptr<float>();
  const auto gamma = static_cast<float>(params.gamma);
  const auto lambda = static_cast<float>(params.lambda);
  const auto rho_bar = static_cast<float>(params.rho_bar);
  const auto c_bar = static_cast<float>(params.c_bar);
  double ratio_sum = 0;
  int64_t rho_clipped = 0, c_clipped = 0;
  for (int64_t n = 0; n < envs; ++n) {
    float next_value = lp[n];  // V(x_{t+1})
    float next_vs = lp[n];     // v_{t+1}
    for (int64_t t = steps - 1; t >= 0; --t) {
      const int64_t i = t * envs + n;
      const float ratio = std::exp(lrp[i]);
      ratio_sum += ratio;
      rho_clipped += ratio > rho_bar;
      c_clipped += ratio > c_bar;
      const float rho = std::min(rho_bar, ratio);
      const float c = lambda * std::min(c_bar, ratio);
      const float not_done = 1.0f - dp[i];
      const float delta = rho * (rp[i] + gamma * not_done * next_value - vp[i]);
      // v_t - V(x_t) = delta_t + gamma c_t (v_{t+1} - V(x_{t+1})); nothing crosses an episode's end.
      const float vs_minus_v = delta + gamma * c * not_done * (next_vs - next_value);
      // A_t: a_t's own TD error, then the lambda-discounted correction from t + 1 on (vtrace.h says why no rho_t).
      ap[i] = (rp[i] + gamma * not_done * next_value - vp[i]) + gamma * lambda * not_done * (next_vs - next_value);
      sp[i] = vp[i] + vs_minus_v;
      next_value = vp[i];
      next_vs = sp[i];
    }
  }
  if (stats) {
    const double count = static_cast<double>(std::max<int64_t>(1, steps * envs));
    stats->ratio_mean = ratio_sum / count;
    stats->rho_clipped = static_cast<double>(rho_clipped) / count;
    stats->c_clipped = static_cast<double>(c_clipped) / count;
  }
  Advantages out;
  out.advantages = adv.to(rewards.device());
  out.returns = vs.to(rewards.device());
  return out;
}

VtraceCorrection::VtraceCorrection(const Rollout& rollout, const PpoConfig& config) {
  params_.gamma = config.gamma;
  params_.lambda = config.gae_lambda;
  params_.rho_bar = config.vtrace_rho_bar;
  params_.c_bar = config.vtrace_c_bar;
  behaviour_logp_ = Host(rollout.logp);
  rewards_ = Host(rollout.rewards);
  dones_ = Host(rollout.dones);
  last_value_ = Host(rollout.last_value);
}

Advantages VtraceCorrection::Compute(const torch::Tensor& target_logp, const torch::Tensor& values) {
  VtraceStats s;
  Advantages out = ComputeVtrace(Host(target_logp) - behaviour_logp_, rewards_, Host(values), dones_, last_value_,
                                 params_, &s);
  sums_.ratio_mean += s.ratio_mean;
  sums_.rho_clipped += s.rho_clipped;
  sums_.c_clipped += s.c_clipped;
  ++calls_;
  return out;
}

VtraceStats VtraceCorrection::stats() const {
  if (calls_ == 0) return {};
  const double n = calls_;
  return {sums_.ratio_mean / n, sums_.rho_clipped / n, sums_.c_clipped / n};
}

}  // namespace farm
