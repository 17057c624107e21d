// The fused CPU PPO update (see ppo_fused.h). Notation for one minibatch of B rows:
//
//   MLP layer l: y_l = act(y_{l-1} W_l^T + b_l), y_{-1} = x, act = tanh for hidden layers, identity for the
//   last. Backward, with g_l = dLoss/d(pre-activation of layer l), stored [B, out_l] row-major:
//     dW_l = g_l^T y_{l-1},  db_l = sum_rows(g_l),  g_{l-1} = (g_l W_l) * (1 - y_{l-1}^2)   (tanh' = 1 - tanh^2)
//
//   Loss = pg - ent_coef * H + vf_coef * vl, each a mean over the B rows (so every row gradient has a 1/B).
//   pg_i = max(-A_i r_i, -A_i clip(r_i, 1-c, 1+c)), r_i = exp(logp_i - old_logp_i), dr_i/dlogp_i = r_i.
//   Autograd's conventions, followed here: max() splits the gradient in half on a tie and otherwise sends it
//   all to the larger operand; clamp() passes it where lo <= x <= hi (inclusive) and blocks it elsewhere.
//   So dpg_i/dr_i = -A_i when the unclipped term wins or ties inside the clip range, else 0.
//   vl_i = 0.5 max((v-R)^2, (v_old + clip(v - v_old, -c, c) - R)^2) (or 0.5 (v-R)^2 without clip_vloss).
//
//   Categorical head on logits z: l = log_softmax(z), p = exp(l), logp = l_a, H = -sum_k p_k l_k.
//     dlogp/dz_k = [k == a] - p_k,   dH/dz_k = -p_k (l_k + H).
//   Gaussian head with mean mu and state-independent log-std s: e_d = (a_d - mu_d) exp(-s_d),
//     logp = -0.5 sum e_d^2 - sum s_d - D log sqrt(2 pi), H = sum (s_d + 0.5 + log sqrt(2 pi)) (no mu).
//     dlogp/dmu_d = e_d exp(-s_d),   dlogp/ds_d = e_d^2 - 1,   dH/ds_d = 1.
//
// Then, as LibTorch does it: clip_grad_norm_ (total = ||all grads||, g *= min(max_norm / (total + 1e-6), 1)),
// and Adam per parameter: m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2,
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
//
// The actor's and the critic's passes share nothing but the minibatch's observations: each runs forward,
// its part of the loss, and backward on its own buffers. The loss terms and their gradients are in
// ppo_fused_loss.cpp; the buffers both files use, in ppo_fused_impl.h.
#include "learner/train/ppo_fused.h"

#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include "learner/train/adam_state.h"
#include "learner/model/cpu_kernels.h"
#include "learner/train/ppo_fused_impl.h"

namespace farm {

using fused_detail::kClipNormEps;
using fused_detail::kNarrowLayer;

namespace {

bool IsCpuFloatContiguous(const torch::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == torch::kFloat32 && t.is_contiguous();
}

std::string Describe(const torch::Tensor& t) {
  if (!t.defined()) return "undefined";
  return std::string(c10::toString(t.scalar_type())) + " " + c10::str(t.sizes()) + " on " + t.device().str() +
         (t.is_contiguous() ? "" : ", non-contiguous");
}

// The Linear layers of an MLP Sequential laid out Linear, Tanh, ..., Linear (ActorCritic's Mlp).
Status MlpLayers(const std::shared_ptr<torch::nn::Module>& module, const char* name,
                 std::vector<torch::nn::Linear>* out) {
  auto* seq = module ? module->as<torch::nn::SequentialImpl>() : nullptr;
  if (seq == nullptr) return Status::InvalidArgument(std::string("the policy has no Sequential '") + name + "'");
  const std::size_t n = seq->size();
  if (n % 2 == 0) return Status::InvalidArgument(std::string(name) + " is not Linear, Tanh, ..., Linear");
  for (std::size_t i = 0; i < n; ++i) {
    const std::shared_ptr<torch::nn::Module> child = seq->ptr(i);
    if (i % 2 == 1) {
      if (child->as<torch::nn::TanhImpl>() == nullptr)
        return Status::InvalidArgument(std::string(name) + "." + std::to_string(i) + " is not Tanh");
      continue;
    }
    auto* linear = child->as<torch::nn::LinearImpl>();
    if (linear == nullptr || !linear->bias.defined())
      return Status::InvalidArgument(std::string(name) + "." + std::to_string(i) + " is not a Linear with bias");
    out->push_back(torch::nn::Linear(std::dynamic_pointer_cast<torch::nn::LinearImpl>(child)));
  }
  for (std::size_t l = 1; l < out->size(); ++l) {
    if ((*out)[l]->weight.size(1) != (*out)[l - 1]->weight.size(0))
      return Status::InvalidArgument(std::string(name) + ": layer widths do not chain");
  }
  return Status::Ok();
}

// dst[cols, rows] = src[rows, cols]^T.
void Transpose(const float* src, int64_t rows, int64_t cols, float* dst) {
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) dst[j * rows + i] = src[i * cols + j];
  }
}

}  // namespace

Status CheckFusedUpdate(ActorCriticImpl& policy) {
  // What the fused update takes (no core, no centralised critic, fp32 on the CPU, ...) is the update paths' table's
  // (common/update_paths.h), which PpoTrainer reads first; this checks the policy is laid out as the code expects.
  for (const auto& item : policy.named_parameters()) {
    if (!IsCpuFloatContiguous(item.value()))
      return Status::InvalidArgument("the fused update needs contiguous float32 CPU parameters; " + item.key() +
                                     " is " + Describe(item.value()));
  }
  if (!policy.named_buffers().is_empty()) return Status::InvalidArgument("the policy has buffers");
  std::vector<torch::nn::Linear> actor, critic;
  const auto children = policy.named_children();
  const auto* actor_module = children.find("actor");
  const auto* critic_module = children.find("critic");
  if (auto s = MlpLayers(actor_module ? *actor_module : nullptr, "actor", &actor); !s.ok()) return s;
  if (auto s = MlpLayers(critic_module ? *critic_module : nullptr, "critic", &critic); !s.ok()) return s;
  const Space& obs = policy.observation_space();
  const Space& act = policy.action_space();
  const int64_t head = act.head_size();
  if (actor.front()->weight.size(1) != obs.numel() || critic.front()->weight.size(1) != obs.numel() ||
      actor.back()->weight.size(0) != head || critic.back()->weight.size(0) != 1)
    return Status::InvalidArgument("the actor/critic shapes do not match the spaces");
  const std::size_t expected = 2 * (actor.size() + critic.size()) + (act.is_box() ? 1 : 0);
  if (policy.parameters().size() != expected)
    return Status::InvalidArgument("the policy has parameters besides the actor, the critic and log_std");
  return Status::Ok();
}

FusedPpoUpdate::FusedPpoUpdate(ActorCritic policy, const PpoConfig& config)
    : policy_(std::move(policy)), config_(config) {
  if (auto s = CheckFusedUpdate(*policy_); !s.ok())
    throw std::invalid_argument("FusedPpoUpdate: " + s.message());
  discrete_ = policy_->action_space().is_categorical();
  segments_ = policy_->action_space().categories();
  obs_dim_ = policy_->observation_space().numel();
  head_dim_ = policy_->action_space().head_size();

  const auto children = policy_->named_children();
  auto build = [&](const char* name) {
    std::vector<torch::nn::Linear> linears;
    if (auto s = MlpLayers(children[name], name, &linears); !s.ok()) throw std::invalid_argument(s.message());
    auto net = std::make_unique<Net>();
    for (auto& linear : linears) {
      Layer layer;
      layer.weight = linear->weight;
      layer.bias = linear->bias;
      layer.out = layer.weight.size(0);
      layer.in = layer.weight.size(1);
      layer.narrow = layer.out < kNarrowLayer;
      if (!layer.narrow) layer.w_t.resize(layer.in * layer.out);
      net->layers.push_back(std::move(layer));
    }
    return net;
  };
  actor_ = build("actor");
  critic_ = build("critic");
  if (!discrete_) log_std_ = policy_->named_parameters()["log_std"];

  // One flat gradient buffer in the module's parameter order; each parameter's gradient is a slice of it.
  const std::vector<torch::Tensor> params = policy_->parameters();
  int64_t total = 0;
  for (const auto& p : params) total += p.numel();
  grads_.assign(total, 0.0f);
  int64_t offset = 0;
  for (const auto& p : params) {
    Param param;
    param.tensor = p;
    param.grad = grads_.data() + offset;
    param.numel = p.numel();
    params_.push_back(param);
    for (Net* net : {actor_.get(), critic_.get()}) {
      for (Layer& layer : net->layers) {
        if (layer.weight.is_same(p)) layer.grad_w = param.grad;
        if (layer.bias.is_same(p)) layer.grad_b = param.grad;
      }
    }
    if (log_std_.defined() && log_std_.is_same(p)) log_std_grad_ = param.grad;
    offset += p.numel();
  }
}

// The second thread of a two-thread Run: runs one critic pass at a time, handed over under a mutex.
class FusedPpoUpdate::Helper {
 public:
  Helper() : thread_([this] { Loop(); }) {}
  ~Helper() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Helper(const Helper&) = delete;
  Helper& operator=(const Helper&) = delete;

  // Starts owner->CriticPass(*ws, stats) on the helper thread. One at a time: Wait() before the next.
  void Start(FusedPpoUpdate* owner, Workspace* ws, double* stats) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      owner_ = owner;
      ws_ = ws;
      stats_ = stats;
      pending_ = true;
    }
    cv_.notify_all();
  }

  // Blocks until the pass started last has finished; returns what it threw (null when nothing).
  std::exception_ptr Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !pending_; });
    return std::exchange(error_, nullptr);
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [this] { return stop_ || pending_; });
      if (stop_) return;
      lock.unlock();
      std::exception_ptr error;
      try {
        owner_->CriticPass(*ws_, stats_);
      } catch (...) {
        error = std::current_exception();  // handed to Wait(), rethrown on the trainer's thread
      }
      lock.lock();
      error_ = error;
      pending_ = false;
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool pending_ = false;
  FusedPpoUpdate* owner_ = nullptr;
  Workspace* ws_ = nullptr;
  double* stats_ = nullptr;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts once the members above exist
};

FusedPpoUpdate::~FusedPpoUpdate() = default;

// Per Run: parameter pointers (their storage may have changed since the last Run: checkpoint load, to()),
// and each parameter's Adam options and state, created as torch::optim::Adam::step would create it.
// Called outside InferenceMode: the Adam moments must stay ordinary tensors that Adam::step may update later.
void FusedPpoUpdate::Bind(torch::optim::Adam& optimizer) {
  for (Param& param : params_) {
    if (!IsCpuFloatContiguous(param.tensor))
      throw std::invalid_argument("FusedPpoUpdate: a parameter became " + Describe(param.tensor) +
                                  "; the fused update needs contiguous float32 CPU parameters");
    param.options = nullptr;
    param.state = nullptr;
  }
  for (Net* net : {actor_.get(), critic_.get()}) {
    for (Layer& layer : net->layers) {
      layer.w = layer.weight.data_ptr<float>();
      layer.b = layer.bias.data_ptr<float>();
    }
  }
  for (auto& group : optimizer.param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamOptions&>(group.options());
    for (const auto& p : group.params()) {
      for (Param& param : params_) {
        if (param.tensor.is_same(p)) param.options = &options;
      }
    }
  }
  auto& state = optimizer.state();
  torch::NoGradGuard no_grad;
  for (Param& param : params_) {
    if (param.options == nullptr)
      throw std::invalid_argument("FusedPpoUpdate: the optimizer does not hold every parameter of the policy");
    if (param.options->amsgrad() || param.options->weight_decay() != 0)
      throw std::invalid_argument("FusedPpoUpdate: Adam with amsgrad or weight decay is not implemented");
    const auto key = AdamStateKey(state, param.tensor);
    auto it = state.find(key);
    if (it == state.end()) {
      auto fresh = std::make_unique<torch::optim::AdamParamState>();
      fresh->step(0);
      fresh->exp_avg(torch::zeros_like(param.tensor, torch::MemoryFormat::Preserve));
      fresh->exp_avg_sq(torch::zeros_like(param.tensor, torch::MemoryFormat::Preserve));
      state[key] = std::move(fresh);
      it = state.find(key);
    }
    auto* adam = dynamic_cast<torch::optim::AdamParamState*>(it->second.get());
    if (adam == nullptr) throw std::invalid_argument("FusedPpoUpdate: the optimizer state is not Adam's");
    for (auto* moment : {&adam->exp_avg(), &adam->exp_avg_sq()}) {
      if (!moment->defined() || moment->numel() != param.numel)
        throw std::invalid_argument("FusedPpoUpdate: an Adam moment is " + Describe(*moment) + " for a parameter of " +
                                    std::to_string(param.numel) + " elements");
      if (!IsCpuFloatContiguous(*moment)) *moment = moment->to(torch::kCPU, torch::kFloat32).contiguous();
    }
    param.state = adam;
  }
}

FusedPpoUpdate::Workspace& FusedPpoUpdate::WorkspaceFor(int64_t rows) {
  auto it = workspaces_.find(rows);
  if (it != workspaces_.end()) return *it->second;
  // Minibatch sizes differ by at most one within an update; keep a few sizes for rollouts that vary.
  if (workspaces_.size() >= 4) workspaces_.clear();
  auto ws = std::make_unique<Workspace>();
  ws->rows = rows;
  ws->x.resize(rows * obs_dim_);
  if (discrete_) {
    ws->action.resize(rows * static_cast<int64_t>(segments_.size()));
  } else {
    ws->action_box.resize(rows * head_dim_);
  }
  ws->old_logp.resize(rows);
  ws->old_value.resize(rows);
  ws->advantage.resize(rows);
  ws->ret.resize(rows);
  ws->weight.resize(rows);
  ws->logp_all.resize(head_dim_);
  ws->probs.resize(head_dim_);
  ws->seg_entropy.resize(segments_.size());
  auto make = [&](const Net& net, NetBuffers* buffers) {
    int64_t grad_t = 0;
    for (const Layer& layer : net.layers) {
      buffers->y.emplace_back(rows * layer.out);
      buffers->g.emplace_back(rows * layer.out);
      grad_t = std::max(grad_t, layer.in * layer.out);
    }
    buffers->grad_t.resize(grad_t);
  };
  make(*actor_, &ws->actor);
  make(*critic_, &ws->critic);
  return *workspaces_.emplace(rows, std::move(ws)).first->second;
}

void FusedPpoUpdate::Gather(const PpoBatch& batch, const int64_t* index, Workspace& ws) const {
  const float* obs = batch.obs.data_ptr<float>();
  const float* logp = batch.logp.data_ptr<float>();
  const float* values = batch.values.data_ptr<float>();
  const float* adv = batch.advantages.data_ptr<float>();
  const float* ret = batch.returns.data_ptr<float>();
  const float* active = batch.active.defined() ? batch.active.data_ptr<float>() : nullptr;
  float* x = ws.x.data();
  ws.acting = 0;
  for (int64_t i = 0; i < ws.rows; ++i) {
    const int64_t r = index[i];
    std::copy(obs + r * obs_dim_, obs + (r + 1) * obs_dim_, x + i * obs_dim_);
    ws.old_logp[i] = logp[r];
    ws.old_value[i] = values[r];
    ws.advantage[i] = adv[r];
    ws.ret[i] = ret[r];
    ws.weight[i] = active == nullptr || active[r] > 0 ? 1.0f : 0.0f;
    ws.acting += ws.weight[i] > 0 ? 1 : 0;
  }
  if (discrete_) {
    const int64_t* actions = batch.actions.data_ptr<int64_t>();
    const auto k = static_cast<int64_t>(segments_.size());
    for (int64_t i = 0; i < ws.rows; ++i)
      std::copy(actions + index[i] * k, actions + (index[i] + 1) * k, ws.action.data() + i * k);
  } else {
    const float* actions = batch.actions.data_ptr<float>();
    for (int64_t i = 0; i < ws.rows; ++i)
      std::copy(actions + index[i] * head_dim_, actions + (index[i] + 1) * head_dim_,
                ws.action_box.data() + i * head_dim_);
  }
}

// W^T of every wide layer, for the forward GEMM; after every parameter change.
void FusedPpoUpdate::RefreshTransposedWeights() {
  for (Net* net : {actor_.get(), critic_.get()}) {
    for (Layer& layer : net->layers) {
      if (!layer.narrow) Transpose(layer.w, layer.out, layer.in, layer.w_t.data());
    }
  }
}

void FusedPpoUpdate::ForwardNet(const Net& net, NetBuffers& buffers, const float* x, int64_t rows) const {
  const std::size_t last = net.layers.size() - 1;
  for (std::size_t l = 0; l <= last; ++l) {
    const Layer& layer = net.layers[l];
    const float* input = l == 0 ? x : buffers.y[l - 1].data();
    float* y = buffers.y[l].data();
    if (layer.narrow) {
      kernels::GemmRowDot(rows, layer.out, layer.in, input, layer.in, layer.w, y, layer.out, layer.b);
    } else {
      kernels::Gemm(rows, layer.out, layer.in, input, layer.in, 1, layer.w_t.data(), layer.out, y, layer.out, layer.b);
    }
    if (l != last) kernels::Tanh(y, rows * layer.out);
  }
}

// Expects g.back() (the gradient at the network's output); fills the layers' gradients in grads_.
void FusedPpoUpdate::BackwardNet(const Net& net, NetBuffers& buffers, const float* x, int64_t rows) const {
  for (std::size_t l = net.layers.size(); l-- > 0;) {
    const Layer& layer = net.layers[l];
    const float* input = l == 0 ? x : buffers.y[l - 1].data();
    const float* g = buffers.g[l].data();
    // dW [out, in] = g^T input, a reduction over the rows. The GEMM vectorises along its output's rows, so a
    // layer with few inputs (the first: the observation) computes dW^T [in, out] = input^T g instead.
    if (layer.in < kNarrowLayer && layer.out >= kNarrowLayer) {
      kernels::Gemm(layer.in, layer.out, rows, input, 1, layer.in, g, layer.out, buffers.grad_t.data(), layer.out,
                    nullptr);
      Transpose(buffers.grad_t.data(), layer.in, layer.out, layer.grad_w);
    } else {
      kernels::Gemm(layer.out, layer.in, rows, g, 1, layer.out, input, layer.in, layer.grad_w, layer.in, nullptr);
    }
    kernels::SumRows(g, rows, layer.out, layer.grad_b);
    if (l > 0) {
      float* g_prev = buffers.g[l - 1].data();
      kernels::Gemm(rows, layer.in, layer.out, g, layer.out, 1, layer.w, layer.in, g_prev, layer.in, nullptr);
      kernels::MulTanhGrad(g_prev, buffers.y[l - 1].data(), rows * layer.in);
    }
  }
}

// Advantages normalised over the minibatch with the unbiased std (one row: only centred), as ComputePpoLoss.
void FusedPpoUpdate::CriticPass(Workspace& ws, double* stats) {
  ForwardNet(*critic_, ws.critic, ws.x.data(), ws.rows);
  ValueLoss(ws, stats);
  BackwardNet(*critic_, ws.critic, ws.x.data(), ws.rows);
}

void FusedPpoUpdate::ActorPass(Workspace& ws, double* stats) {
  ForwardNet(*actor_, ws.actor, ws.x.data(), ws.rows);
  PolicyLoss(ws, stats);
  BackwardNet(*actor_, ws.actor, ws.x.data(), ws.rows);
}

// clip_grad_norm_(all parameters, max_grad_norm); returns the norm before clipping.
double FusedPpoUpdate::ClipGradients() {
  const double total = std::sqrt(kernels::SumSquares(grads_.data(), static_cast<int64_t>(grads_.size())));
  const double coef = config_.max_grad_norm / (total + kClipNormEps);
  if (coef < 1.0) {
    const auto c = static_cast<float>(coef);
    for (float& g : grads_) g *= c;
  }
  return total;
}

// torch::optim::Adam::step's arithmetic, in float32 as its tensor ops do it.
void FusedPpoUpdate::AdamStep() {
  for (Param& param : params_) {
    torch::optim::AdamParamState& state = *param.state;
    const torch::optim::AdamOptions& options = *param.options;
    state.step(state.step() + 1);
    const double beta1 = std::get<0>(options.betas());
    const double beta2 = std::get<1>(options.betas());
    const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(state.step()));
    const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(state.step()));
    kernels::AdamCoefficients c;
    c.beta1 = static_cast<float>(beta1);
    c.one_minus_beta1 = static_cast<float>(1 - beta1);
    c.beta2 = static_cast<float>(beta2);
    c.one_minus_beta2 = static_cast<float>(1 - beta2);
    c.sqrt_bias_correction2 = static_cast<float>(std::sqrt(bias_correction2));
    c.eps = static_cast<float>(options.eps());
    c.step_size = static_cast<float>(options.lr() / bias_correction1);
    kernels::AdamUpdate(param.tensor.data_ptr<float>(), state.exp_avg().data_ptr<float>(),
                        state.exp_avg_sq().data_ptr<float>(), param.grad, param.numel, c);
  }
}

void FusedPpoUpdate::Run(const PpoBatch& input, torch::Generator& generator, torch::optim::Adam& optimizer,
                         GradientReducer& reducer, PpoStats* stats, const std::atomic<bool>* cancel) {
  const int64_t batch = input.logp.defined() ? input.logp.numel() : 0;
  // A rank may have nothing to train on (every sample too old) and still takes its part in the others' steps.
  if (batch == 0 && reducer.alone()) throw std::invalid_argument("FusedPpoUpdate: empty batch");
  Bind(optimizer);

  c10::InferenceMode inference;
  // The flat inputs as the loops read them (no copies in the common case: already float32 and contiguous).
  PpoBatch b;
  if (!input.obs.defined() || input.obs.numel() != batch * obs_dim_)
    throw std::invalid_argument("FusedPpoUpdate: observations have " +
                                (batch > 0 && input.obs.defined() ? std::to_string(input.obs.numel() / batch)
                                                                  : std::string("no")) +
                                " values per row, the policy takes " + std::to_string(obs_dim_));
  b.obs = input.obs.reshape({batch, obs_dim_}).to(torch::kFloat32).contiguous();
  if (discrete_) {
    const auto k = static_cast<int64_t>(segments_.size());
    b.actions = input.actions.reshape({batch, k}).to(torch::kLong).contiguous();
    const int64_t* a = b.actions.data_ptr<int64_t>();
    for (int64_t i = 0; i < batch * k; ++i)
      TORCH_CHECK(a[i] >= 0 && a[i] < segments_[static_cast<std::size_t>(i % k)], "FusedPpoUpdate: action ", a[i],
                  " is out of range [0, ", segments_[static_cast<std::size_t>(i % k)], ")",
                  k > 1 ? " in component " + std::to_string(i % k) : std::string());
  } else {
    b.actions = input.actions.reshape({batch, head_dim_}).to(torch::kFloat32).contiguous();
  }
  auto flat = [&](const torch::Tensor& t, const char* what) {
    if (!t.defined() || t.numel() != batch)
      throw std::invalid_argument(std::string("FusedPpoUpdate: ") + what + " must have one value per row");
    return t.reshape({batch}).to(torch::kFloat32).contiguous();
  };
  b.logp = flat(input.logp, "logp");
  b.values = flat(input.values, "values");
  b.advantages = flat(input.advantages, "advantages");
  b.returns = flat(input.returns, "returns");
  if (input.active.defined()) b.active = flat(input.active, "active");
  const bool normalise = config_.norm_adv && !input.advantages_normalised;

  // Ranks: the same number of minibatches on every rank (see PpoTrainer's plan).
  const int64_t num_minibatches =
      reducer.alone() ? std::min<int64_t>(config_.num_minibatches, batch) : config_.num_minibatches;
  const auto grad_count = static_cast<int64_t>(grads_.size());
  if (at::get_num_threads() >= 2 && !helper_) helper_ = std::make_unique<Helper>();
  Helper* helper = at::get_num_threads() >= 2 ? helper_.get() : nullptr;
  double sums[6] = {0, 0, 0, 0, 0, 0};
  double grad_norm_sum = 0;
  int64_t minibatches_run = 0;   // optimizer steps
  int64_t minibatches_loss = 0;  // of them, those with rows of this rank's (every one, alone)
  RefreshTransposedWeights();
  for (int epoch = 0; epoch < config_.update_epochs; ++epoch) {
    // The same draw from the same generator as the LibTorch path, so the minibatches are the same rows.
    const torch::Tensor perm = torch::randperm(batch, generator, torch::kLong);
    const int64_t* order = perm.data_ptr<int64_t>();
    double last_approx_kl = 0;
    int64_t last_rows = 0;
    for (int64_t mb = 0; mb < num_minibatches; ++mb) {
      const int64_t begin = mb * batch / num_minibatches;
      const int64_t end = (mb + 1) * batch / num_minibatches;
      const int64_t rows = end - begin;
      double mb_stats[6] = {0, 0, 0, 0, 0, 0};
      Workspace* gathered = nullptr;
      if (rows > 0) {
        gathered = &WorkspaceFor(rows);
        Gather(b, order + begin, *gathered);
      }
      // The rows that count: the minibatch's loss is their mean.
      const int64_t acting = gathered ? gathered->acting : 0;
      // Nothing acts in it: alone, no step (Adam's momentum would still move the parameters) and no statistics;
      // ranks still take their part in the others' step.
      if (acting == 0 && reducer.alone()) continue;
      if (acting == 0) {
        std::fill(grads_.begin(), grads_.end(), 0.0f);  // a rank's empty minibatch: its part is nothing
      } else {
        Workspace& ws = *gathered;
        if (normalise) NormalizeAdvantages(ws);
        // The passes write disjoint buffers, gradient slices and stats entries (critic: mb_stats[1]).
        if (helper != nullptr) {
          helper->Start(this, &ws, mb_stats);
          // The helper must be done with ws before anything leaves this scope, an exception included.
          std::exception_ptr actor_error;
          try {
            ActorPass(ws, mb_stats);
          } catch (...) {
            actor_error = std::current_exception();
          }
          const std::exception_ptr critic_error = helper->Wait();
          if (actor_error) std::rethrow_exception(actor_error);  // (the critic's, if any, has the same cause)
          if (critic_error) std::rethrow_exception(critic_error);
        } else {
          CriticPass(ws, mb_stats);
          ActorPass(ws, mb_stats);
        }
        for (int k = 0; k < 6; ++k) sums[k] += mb_stats[k];
        ++minibatches_loss;
      }
      // The flat gradient buffer, whole, through the reducer (ranks: one all-reduce; a stop request of any rank
      // stops every rank after this step).
      const bool stop =
          reducer.ReduceFlat(grads_.data(), grad_count, acting, cancel && cancel->load(std::memory_order_relaxed))
              .any_flag;
      grad_norm_sum += ClipGradients();
      AdamStep();
      RefreshTransposedWeights();
      last_approx_kl = mb_stats[3];
      last_rows = acting;
      ++minibatches_run;
      if (stop) {
        stats->cancelled = true;
        break;
      }
    }
    ++stats->epochs;
    if (stats->cancelled) break;
    // Ranks: the KL of the union of their last minibatches, so that all stop together.
    if (config_.target_kl &&
        reducer.WeightedMean(last_approx_kl, static_cast<double>(last_rows)) > *config_.target_kl)
      break;
  }
  if (minibatches_loss > 0) {
    const double n = static_cast<double>(minibatches_loss);
    stats->policy_loss = sums[0] / n;
    stats->value_loss = sums[1] / n;
    stats->entropy = sums[2] / n;
    stats->approx_kl = sums[3] / n;
    stats->old_approx_kl = sums[4] / n;
    stats->clip_fraction = sums[5] / n;
  }
  stats->grad_norm = minibatches_run > 0 ? grad_norm_sum / static_cast<double>(minibatches_run) : 0.0;
}

}  // namespace farm
