#include "learner/train/gradient_reducer.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <utility>

#include "common/tensorboard.h"  // Crc32c
#include "learner/train/adam_state.h"

namespace farm {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Broadcasts `t` in place from rank 0, through a contiguous copy when it is not contiguous.
void BroadcastInPlace(RankGroup& group, torch::Tensor t) {
  if (t.is_contiguous()) {
    group.Broadcast(t, 0);
    return;
  }
  torch::Tensor c = t.contiguous();
  group.Broadcast(c, 0);
  t.copy_(c);
}

}  // namespace

RankReducer::RankReducer(std::shared_ptr<RankGroup> group, int check_every)
    : group_(std::move(group)), check_every_(check_every) {
  if (!group_) throw std::invalid_argument("RankReducer: no rank group");
  if (check_every_ < 0) throw std::invalid_argument("RankReducer: check_every must be >= 0");
}

void RankReducer::Synchronise(torch::nn::Module& module, torch::optim::Adam& optimizer,
                              const std::vector<torch::Tensor>& params) {
  BroadcastModule(module);
  BroadcastAdam(optimizer, params);
}

void RankReducer::AfterUpdate(const std::vector<torch::Tensor>& params, int64_t update) {
  if (check_every_ > 0 && update % check_every_ == 0) CheckParameters(params, update);
}

void RankReducer::Count(int64_t bytes, double seconds) {
  ++traffic_.calls;
  traffic_.bytes += bytes;
  traffic_.seconds += seconds;
}

ReducerTraffic RankReducer::TakeTraffic() { return std::exchange(traffic_, ReducerTraffic{}); }

void RankReducer::BroadcastModule(torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  const auto start = std::chrono::steady_clock::now();
  int64_t bytes = 0;
  for (torch::Tensor& p : module.parameters()) {
    BroadcastInPlace(*group_, p.detach());
    bytes += p.numel() * static_cast<int64_t>(p.element_size());
  }
  for (torch::Tensor& b : module.buffers()) {
    BroadcastInPlace(*group_, b.detach());
    bytes += b.numel() * static_cast<int64_t>(b.element_size());
  }
  Count(bytes, SecondsSince(start));
}

void RankReducer::BroadcastAdam(torch::optim::Adam& optimizer, const std::vector<torch::Tensor>& params) {
  torch::NoGradGuard no_grad;
  const auto start = std::chrono::steady_clock::now();
  const int64_t n = static_cast<int64_t>(params.size());
  // Which params have state on rank 0, and their step counts.
  torch::Tensor steps = torch::full({n}, -1.0, torch::kFloat64);
  for (int64_t i = 0; i < n; ++i) {
    if (const auto* s = FindAdamState(optimizer, params[i])) steps[i] = static_cast<double>(s->step());
  }
  group_->Broadcast(steps, 0);
  int64_t bytes = steps.numel() * 8;
  auto& state = optimizer.state();
  for (int64_t i = 0; i < n; ++i) {
    const torch::Tensor& p = params[i];
    const double step = steps[i].item<double>();
    const auto key = AdamStateKey(state, p);
    if (step < 0) {
      state.erase(key);
      continue;
    }
    torch::optim::AdamParamState* s = FindAdamState(optimizer, p);
    if (s == nullptr) {
      auto fresh = std::make_unique<torch::optim::AdamParamState>();
      fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
      fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
      s = fresh.get();
      state[key] = std::move(fresh);
    }
    s->step(static_cast<int64_t>(step));
    BroadcastInPlace(*group_, s->exp_avg());
    BroadcastInPlace(*group_, s->exp_avg_sq());
    bytes += 2 * p.numel() * static_cast<int64_t>(p.element_size());
  }
  Count(bytes, SecondsSince(start));
}

GradientReducer::Reduced RankReducer::ReduceGradients(const std::vector<torch::Tensor>& params, int64_t samples,
                                                         bool flag) {
  torch::NoGradGuard no_grad;
  const auto start = std::chrono::steady_clock::now();
  if (params.empty()) throw std::invalid_argument("RankReducer::ReduceGradients: no parameters");
  int64_t total = 2;  // the samples and the flag ride at the end
  for (const auto& p : params) total += p.numel();
  const auto options = params.front().options().requires_grad(false);
  if (!buffer_.defined() || buffer_.numel() != total || buffer_.device() != params.front().device() ||
      buffer_.scalar_type() != params.front().scalar_type())
    buffer_ = torch::empty({total}, options);
  const auto weight = static_cast<double>(samples);
  int64_t at = 0;
  for (const auto& p : params) {
    torch::Tensor slot = buffer_.slice(0, at, at + p.numel());
    if (p.grad().defined() && samples > 0) {
      torch::mul_out(slot, p.grad().reshape({-1}), weight);
    } else {
      slot.zero_();
    }
    at += p.numel();
  }
  buffer_.slice(0, at, at + 2).copy_(torch::tensor({weight, flag ? 1.0 : 0.0}, torch::kFloat64).to(options));
  group_->AllReduceSum(buffer_);
  const Reduced out = Tail(at);
  const double scale = out.samples > 0 ? 1.0 / out.samples : 0.0;
  at = 0;
  for (const auto& p : params) {
    const torch::Tensor slot = buffer_.slice(0, at, at + p.numel()).view(p.sizes());
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    torch::mul_out(p.mutable_grad(), slot, scale);
    at += p.numel();
  }
  Count(total * static_cast<int64_t>(buffer_.element_size()), SecondsSince(start));
  return out;
}

GradientReducer::Reduced RankReducer::Tail(int64_t at) {
  const torch::Tensor tail = buffer_.slice(0, at, at + 2).to(torch::kCPU, torch::kFloat64);
  Reduced out;
  out.samples = tail[0].item<double>();
  out.any_flag = tail[1].item<double>() > 0;
  return out;
}

GradientReducer::Reduced RankReducer::ReduceFlat(float* grads, int64_t n, int64_t samples, bool flag) {
  const auto start = std::chrono::steady_clock::now();
  if (n <= 0) throw std::invalid_argument("RankReducer::ReduceFlat: no gradients");
  const int64_t total = n + 2;  // the samples and the flag ride at the end
  if (!buffer_.defined() || buffer_.numel() != total || !buffer_.device().is_cpu() ||
      buffer_.scalar_type() != torch::kFloat32)
    buffer_ = torch::empty({total}, torch::kFloat32);
  float* b = buffer_.data_ptr<float>();
  const auto weight = static_cast<float>(samples);
  if (samples > 0) {
    for (int64_t i = 0; i < n; ++i) b[i] = grads[i] * weight;
  } else {
    std::fill(b, b + n, 0.0f);
  }
  b[n] = weight;
  b[n + 1] = flag ? 1.0f : 0.0f;
  group_->AllReduceSum(buffer_);
  const Reduced out = Tail(n);
  const float scale = out.samples > 0 ? static_cast<float>(1.0 / out.samples) : 0.0f;
  for (int64_t i = 0; i < n; ++i) grads[i] = b[i] * scale;
  Count(total * 4, SecondsSince(start));
  return out;
}

double RankReducer::WeightedMean(double value, double weight) {
  const std::vector<double> s = Sum({value * weight, weight});
  return s[1] > 0 ? s[0] / s[1] : 0.0;
}

std::vector<double> RankReducer::Sum(const std::vector<double>& values) {
  const auto start = std::chrono::steady_clock::now();
  torch::Tensor t = torch::tensor(values, torch::kFloat64);
  group_->AllReduceSum(t);
  Count(t.numel() * 8, SecondsSince(start));
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
}

int64_t RankReducer::Checksum(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> flat;
  for (const auto& p : params) flat.push_back(p.detach().to(torch::kCPU).reshape({-1}));
  const torch::Tensor all = torch::cat(flat).contiguous();
  return Crc32c(all.data_ptr(), static_cast<std::size_t>(all.numel()) * all.element_size());
}

void RankReducer::CheckParameters(const std::vector<torch::Tensor>& params, int64_t update) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t mine = Checksum(params);
  last_checksum_ = mine;
  torch::Tensor t = torch::tensor({mine, -mine}, torch::kLong);
  group_->AllReduceMax(t);
  Count(16, SecondsSince(start));
  const int64_t highest = t[0].item<int64_t>(), lowest = -t[1].item<int64_t>();
  if (highest != lowest)
    throw RankError("the ranks' parameters differ after update " + std::to_string(update) + " (checksums from " +
                    std::to_string(lowest) + " to " + std::to_string(highest) + "; rank " +
                    std::to_string(rank()) + " has " + std::to_string(mine) + ")");
}

}  // namespace farm
