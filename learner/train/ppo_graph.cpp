// The PPO minibatch step over static buffers, eager or replayed from a CUDA graph (learner/train/ppo_graph.h).
#include "learner/train/ppo_graph.h"

#include <ATen/autocast_mode.h>
#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "learner/model/cuda_graph.h"
#include "learner/train/adam_state.h"

#ifdef FARM_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace farm {
namespace {

// Eager steps before the capture (on the side stream the capture uses): cuBLAS handles and workspaces,
// the autograd engine's device thread and the allocator reach their steady state.
constexpr int kWarmupSteps = 3;

std::vector<torch::Tensor> OptimizerParams(torch::optim::Adam& optimizer) {
  std::vector<torch::Tensor> params;
  for (auto& group : optimizer.param_groups())
    for (auto& p : group.params()) params.push_back(p);
  return params;
}

bool SameShape(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  return !a.defined() || (a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type());
}

}  // namespace

Status GraphedPpoStep::Check(torch::optim::Adam& optimizer) {
  const auto& first = static_cast<const torch::optim::AdamOptions&>(optimizer.param_groups().front().options());
  for (auto& group : optimizer.param_groups()) {
    const auto& o = static_cast<const torch::optim::AdamOptions&>(group.options());
    if (o.weight_decay() != 0 || o.amsgrad())
      return Status::InvalidArgument("the graphed update's Adam has no weight decay and no amsgrad");
    if (o.betas() != first.betas() || o.eps() != first.eps())
      return Status::InvalidArgument("the graphed update needs one set of Adam betas and eps");
  }
  return Status::Ok();
}

bool GraphedPpoStep::HasOptimizerState(torch::optim::Adam& optimizer) {
  int64_t step = -1;
  for (const auto& p : OptimizerParams(optimizer)) {
    const torch::optim::AdamParamState* s = FindAdamState(optimizer, p);
    if (!s || (step >= 0 && s->step() != step)) return false;
    step = s->step();
  }
  return step >= 0;
}

struct GraphedPpoStep::Impl {
  ActorCritic policy{nullptr};
  PpoConfig config;
  Precision precision = Precision::kFp32;
  torch::optim::Adam* optimizer = nullptr;
  bool capture = false;
  torch::Device device{torch::kCPU};
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;

  // What the program reads and writes: held here so that no storage the graph uses is freed.
  std::vector<torch::Tensor> params, grads, exp_avg, exp_avg_sq;
  Batch full;                // the update's batch
  torch::Tensor unit_idx;    // int64 [units per minibatch]
  torch::Tensor arange_k;    // int64 [k]
  int64_t k = 1;
  torch::Tensor lr;          // float64 scalar
  torch::Tensor step;        // float64 scalar: Adam's step count
  torch::Tensor stat_sums;   // float64 [6]
  torch::Tensor grad_norm_sum;
  torch::Tensor taken;       // float64 scalar: steps taken (a minibatch with no acting row takes none)
  torch::Tensor last_kl;     // float32 scalar
  int64_t host_step = 0;     // the step count at Begin
  int warmups = 0;
  int captures = 0;
#ifdef FARM_WITH_CUDA
  std::unique_ptr<at::cuda::CUDAGraph> graph;
#endif

  void DropGraph() {
#ifdef FARM_WITH_CUDA
    graph.reset();
#endif
    warmups = 0;
  }

  // Binds the parameters, their gradients and Adam moments; a change of any tensor drops the graph.
  void BindOptimizerState() {
    std::vector<torch::Tensor> p = OptimizerParams(*optimizer), g, m, v;
    int64_t count = -1;
    for (auto& t : p) {
      if (!t.grad().defined()) t.mutable_grad() = torch::zeros_like(t);
      g.push_back(t.grad());
      torch::optim::AdamParamState* s = FindAdamState(*optimizer, t);
      if (!s) throw std::logic_error("GraphedPpoStep: Adam has no state for a parameter (GraphedPpoStep::Check)");
      m.push_back(s->exp_avg());
      v.push_back(s->exp_avg_sq());
      count = s->step();
    }
    const auto same = [](const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
      if (a.size() != b.size()) return false;
      for (size_t i = 0; i < a.size(); ++i)
        if (!a[i].is_same(b[i])) return false;
      return true;
    };
    if (!same(p, params) || !same(g, grads) || !same(m, exp_avg) || !same(v, exp_avg_sq)) DropGraph();
    params = std::move(p);
    grads = std::move(g);
    exp_avg = std::move(m);
    exp_avg_sq = std::move(v);
    host_step = count;
  }

  // One minibatch step, from unit_idx to updated parameters and accumulated statistics. No host
  // synchronisation and no shape that depends on data: a CUDA graph can record it.
  void Program() {
    PpoLoss loss;
    {
      // A cached weight cast would be a tensor the graph reads but no replay recomputes.
      const bool cache = at::autocast::is_autocast_cache_enabled();
      at::autocast::set_autocast_cache_enabled(false);
      loss = MinibatchLoss(*policy, full, unit_idx, k, arange_k, precision, config);
      at::autocast::set_autocast_cache_enabled(cache);
    }
    {
      torch::NoGradGuard no_grad;
      for (auto& g : grads) g.zero_();
    }
    loss.total.backward();  // accumulates into the bound gradients in place

    torch::NoGradGuard no_grad;
    // A minibatch with no acting row (every agent in it had finished) takes no step, as on the LibTorch path: its
    // gradient is 0, but Adam's moments would still move the parameters. Decided on the device (go: 1 or 0), so
    // that the graph keeps one shape: with go = 0 the moments keep their values (times 1, plus the 0 gradient),
    // the parameters theirs, and nothing adds to the step count or the sums.
    const torch::Tensor go =
        (full.active.index_select(0, UnitRows(unit_idx, k, arange_k)).sum() > 0).to(torch::kFloat64);
    grad_norm_sum.add_(ClipGradNormOnDevice(params, config.max_grad_norm) * go);
    // torch::optim::Adam's arithmetic with the step count and learning rate as device tensors.
    step.add_(go);
    taken.add_(go);
    const torch::Tensor step_size = lr * go / (1 - torch::pow(beta1, step));
    const torch::Tensor bias2_sqrt = (1 - torch::pow(beta2, step)).sqrt();
    const torch::Tensor keep1 = 1 - (1 - beta1) * go;  // beta1 for a step, 1 for none
    const torch::Tensor keep2 = 1 - (1 - beta2) * go;
    for (size_t i = 0; i < params.size(); ++i) {
      exp_avg[i].mul_(keep1).add_(grads[i], 1 - beta1);
      exp_avg_sq[i].mul_(keep2).addcmul_(grads[i], grads[i], 1 - beta2);
      const torch::Tensor denom = (exp_avg_sq[i].sqrt() / bias2_sqrt).add_(eps);
      params[i].sub_((exp_avg[i] / denom).mul_(step_size));
    }
    stat_sums.add_(LossStats(loss) * go);
    last_kl.copy_(torch::where(go > 0, loss.approx_kl, last_kl));
  }
};

GraphedPpoStep::GraphedPpoStep(ActorCritic policy, const PpoConfig& config, Precision precision,
                               torch::optim::Adam* optimizer, bool capture)
    : impl_(std::make_unique<Impl>()) {
  if (!optimizer) throw std::invalid_argument("GraphedPpoStep: no optimizer");
  impl_->policy = std::move(policy);
  impl_->config = config;
  impl_->precision = precision;
  impl_->optimizer = optimizer;
  impl_->capture = capture;
  const std::vector<torch::Tensor> params = impl_->policy->parameters();
  if (params.empty()) throw std::invalid_argument("GraphedPpoStep: the policy has no parameters");
  impl_->device = params.front().device();
  if (capture && (!BuiltWithCuda() || !impl_->device.is_cuda()))
    throw std::invalid_argument(fmt::format("GraphedPpoStep: capturing a CUDA graph needs a CUDA build and device "
                                            "(the policy is on {})", impl_->device.str()));
  const auto& o = static_cast<const torch::optim::AdamOptions&>(optimizer->param_groups().front().options());
  impl_->beta1 = std::get<0>(o.betas());
  impl_->beta2 = std::get<1>(o.betas());
  impl_->eps = o.eps();
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64).device(impl_->device);
  impl_->lr = torch::zeros({}, f64);
  impl_->step = torch::zeros({}, f64);
  impl_->stat_sums = torch::zeros({6}, f64);
  impl_->grad_norm_sum = torch::zeros({}, f64);
  impl_->taken = torch::zeros({}, f64);
  impl_->last_kl = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat32).device(impl_->device));
}

GraphedPpoStep::~GraphedPpoStep() = default;

void GraphedPpoStep::Begin(const Batch& batch, int64_t rows_per_state, int64_t units_per_minibatch, double lr) {
  Impl& m = *impl_;
  if (rows_per_state < 1 || units_per_minibatch < 1)
    throw std::invalid_argument("GraphedPpoStep::Begin: rows_per_state and units_per_minibatch must be positive");
  const bool same = SameShape(batch.obs, m.full.obs) && SameShape(batch.states, m.full.states) &&
                    SameShape(batch.actions, m.full.actions) && SameShape(batch.logp, m.full.logp) &&
                    SameShape(batch.values, m.full.values) && SameShape(batch.advantages, m.full.advantages) &&
                    SameShape(batch.returns, m.full.returns) && SameShape(batch.returns, m.full.active) &&
                    m.k == rows_per_state && m.unit_idx.defined() &&
                    m.unit_idx.size(0) == units_per_minibatch;
  if (!same) {
    m.DropGraph();
    const auto like = [](const torch::Tensor& t) { return t.defined() ? torch::empty_like(t) : torch::Tensor(); };
    m.full = Batch{like(batch.obs),    like(batch.states),     like(batch.actions), like(batch.logp),
                   like(batch.values), like(batch.advantages), like(batch.returns), like(batch.returns)};
    m.k = rows_per_state;
    const auto i64 = torch::TensorOptions().dtype(torch::kLong).device(m.device);
    m.unit_idx = torch::zeros({units_per_minibatch}, i64);
    m.arange_k = torch::arange(rows_per_state, i64);
  }
  const auto load = [](torch::Tensor& dst, const torch::Tensor& src) {
    if (dst.defined()) dst.copy_(src, /*non_blocking=*/true);
  };
  load(m.full.obs, batch.obs);
  load(m.full.states, batch.states);
  load(m.full.actions, batch.actions);
  load(m.full.logp, batch.logp);
  load(m.full.values, batch.values);
  load(m.full.advantages, batch.advantages);
  load(m.full.returns, batch.returns);
  if (batch.active.defined()) {
    load(m.full.active, batch.active);
  } else {
    m.full.active.fill_(1);  // every row acted
  }
  m.BindOptimizerState();
  m.lr.fill_(lr);
  m.step.fill_(static_cast<double>(m.host_step));
  m.stat_sums.zero_();
  m.grad_norm_sum.zero_();
  m.taken.zero_();
}

void GraphedPpoStep::Step(const torch::Tensor& unit_idx) {
  Impl& m = *impl_;
  if (unit_idx.dim() != 1 || unit_idx.size(0) != m.unit_idx.size(0))
    throw std::invalid_argument(fmt::format("GraphedPpoStep::Step: {} unit indices, expected {}", unit_idx.numel(),
                                            m.unit_idx.size(0)));
  m.unit_idx.copy_(unit_idx, /*non_blocking=*/true);
  if (!m.capture) {
    m.Program();
    return;
  }
#ifdef FARM_WITH_CUDA
  // The step draws no random numbers, but captures and replays touch the default CUDA generator's state.
  const auto generator_lock = LockCudaGenerator(m.device);
  if (m.graph) {
    m.graph->replay();
    return;
  }
  c10::cuda::CUDAGuard device_guard(m.device);
  // Warm-up and capture on a side stream (capturing the legacy default stream is not allowed), after the
  // current stream's copies into the buffers.
  auto current = c10::cuda::getCurrentCUDAStream(m.device.index());
  current.synchronize();
  auto side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, m.device.index());
  {
    c10::cuda::CUDAStreamGuard stream_guard(side);
    if (m.warmups < kWarmupSteps) {
      m.Program();
      ++m.warmups;
    } else {
      auto graph = std::make_unique<at::cuda::CUDAGraph>();
      graph->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
      m.Program();
      graph->capture_end();
      m.graph = std::move(graph);
      ++m.captures;
      m.graph->replay();  // the capture ran nothing: this is the step
    }
  }
  side.synchronize();
#endif
}

torch::Tensor GraphedPpoStep::last_approx_kl() const { return impl_->last_kl; }

GraphedPpoStep::Sums GraphedPpoStep::End() {
  Impl& m = *impl_;
  const auto taken = static_cast<int64_t>(m.taken.item<double>());  // the update's one read of the device
  m.host_step += taken;
  for (const auto& p : m.params) FindAdamState(*m.optimizer, p)->step(m.host_step);
  return Sums{m.stat_sums.clone(), m.grad_norm_sum.clone(), taken};
}

int GraphedPpoStep::captures() const { return impl_->captures; }

}  // namespace farm
