// GRU and LSTM cells, stepped one at a time (acting) or unrolled over a chunk with resets (the update).
#include "learner/model/recurrent_core.h"

#include <stdexcept>

namespace farm {

const char* CoreName(CoreKind kind) {
  switch (kind) {
    case CoreKind::kGru:
      return "gru";
    case CoreKind::kLstm:
      return "lstm";
    case CoreKind::kNone:
      break;
  }
  return "none";
}

Status ParseCore(const std::string& name, CoreKind* out) {
  if (name == "none") {
    *out = CoreKind::kNone;
  } else if (name == "gru") {
    *out = CoreKind::kGru;
  } else if (name == "lstm") {
    *out = CoreKind::kLstm;
  } else {
    return Status::InvalidArgument("core: expected none, gru or lstm, got '" + name + "'");
  }
  return Status::Ok();
}

RecurrentCoreImpl::RecurrentCoreImpl(CoreKind kind, int64_t input_size, int64_t size)
    : kind_(kind), input_(input_size), size_(size) {
  if (kind == CoreKind::kNone) throw std::invalid_argument("RecurrentCore: the kind must be gru or lstm");
  if (input_size <= 0 || size <= 0)
    throw std::invalid_argument("RecurrentCore: widths must be positive, got input " + std::to_string(input_size) +
                                " and size " + std::to_string(size));
  const int64_t gates = kind == CoreKind::kGru ? 3 : 4;
  weight_ih_ = register_parameter("weight_ih", torch::empty({gates * size, input_size}));
  weight_hh_ = register_parameter("weight_hh", torch::empty({gates * size, size}));
  bias_ih_ = register_parameter("bias_ih", torch::zeros({gates * size}));
  bias_hh_ = register_parameter("bias_hh", torch::zeros({gates * size}));
  torch::NoGradGuard no_grad;
  for (int64_t g = 0; g < gates; ++g) {
    torch::Tensor ih = weight_ih_.narrow(0, g * size, size);
    torch::Tensor hh = weight_hh_.narrow(0, g * size, size);
    ih.copy_(torch::nn::init::orthogonal_(torch::empty_like(ih), 1.0));
    hh.copy_(torch::nn::init::orthogonal_(torch::empty_like(hh), 1.0));
  }
}

namespace {

// h . W^T + b for a state [B, S] (weights [G, S], bias [G]) or a stack of them [K, B, S] (weights [K, G, S],
// bias [K, 1, G]).
torch::Tensor Project(const torch::Tensor& bias, const torch::Tensor& x, const torch::Tensor& weight) {
  return x.dim() == 2 ? torch::addmm(bias, x, weight.t()) : torch::baddbmm(bias, x, weight.transpose(1, 2));
}

// One step of `kind` on the last dimension: the step's input projection `gi` [..., G * size] and the state
// [..., state size] (any leading dimensions) give the next state.
torch::Tensor CellStep(CoreKind kind, int64_t size, const torch::Tensor& gi, const torch::Tensor& state,
                       const torch::Tensor& weight_hh, const torch::Tensor& bias_hh) {
  if (kind == CoreKind::kGru) {
    const torch::Tensor gh = Project(bias_hh, state, weight_hh);
    // r and z in one sigmoid: fewer kernels on the update's sequential path.
    const auto rz = torch::sigmoid(gi.narrow(-1, 0, 2 * size) + gh.narrow(-1, 0, 2 * size)).chunk(2, -1);
    const torch::Tensor n = torch::tanh(gi.narrow(-1, 2 * size, size) + rz[0] * gh.narrow(-1, 2 * size, size));
    return n + rz[1] * (state - n);  // (1 - z) * n + z * h
  }
  const torch::Tensor h = state.narrow(-1, 0, size);
  const torch::Tensor c = state.narrow(-1, size, size);
  const torch::Tensor g = gi + Project(bias_hh, h, weight_hh);
  const auto fi = torch::sigmoid(g.narrow(-1, 0, 2 * size)).chunk(2, -1);  // i, f
  const torch::Tensor c_next = fi[1] * c + fi[0] * torch::tanh(g.narrow(-1, 2 * size, size));
  const torch::Tensor h_next = torch::sigmoid(g.narrow(-1, 3 * size, size)) * torch::tanh(c_next);
  return torch::cat({h_next, c_next}, -1);
}

}  // namespace

torch::Tensor RecurrentCoreImpl::Cell(const torch::Tensor& gi, const torch::Tensor& state) {
  return CellStep(kind_, size_, gi, state, weight_hh_, bias_hh_);
}

std::pair<torch::Tensor, torch::Tensor> RecurrentCoreImpl::Step(const torch::Tensor& x, const torch::Tensor& state) {
  if (state.dim() != 2 || state.size(0) != x.size(0) || state.size(1) != state_size())
    throw std::invalid_argument("RecurrentCore::Step: the state must be [" + std::to_string(x.size(0)) + ", " +
                                std::to_string(state_size()) + "], got " + c10::str(state.sizes()));
  // Under autocast the products may come back in a lower precision: the state stays float32.
  const torch::Tensor next = Cell(torch::addmm(bias_ih_, x, weight_ih_.t()), state.to(torch::kFloat32))
                                 .to(torch::kFloat32);
  return {next.narrow(1, 0, size_), next};
}

torch::Tensor RecurrentCoreImpl::Unroll(const torch::Tensor& x, const torch::Tensor& state0,
                                        const torch::Tensor& starts, torch::Tensor* last_state) {
  if (x.dim() != 3) throw std::invalid_argument("RecurrentCore::Unroll: x must be [L, B, input]");
  const int64_t steps = x.size(0);
  const int64_t batch = x.size(1);
  if (state0.dim() != 2 || state0.size(0) != batch || state0.size(1) != state_size())
    throw std::invalid_argument("RecurrentCore::Unroll: state0 must be [" + std::to_string(batch) + ", " +
                                std::to_string(state_size()) + "], got " + c10::str(state0.sizes()));
  if (starts.defined() && (starts.dim() != 2 || starts.size(0) != steps || starts.size(1) != batch))
    throw std::invalid_argument("RecurrentCore::Unroll: starts must be [" + std::to_string(steps) + ", " +
                                std::to_string(batch) + "], got " + c10::str(starts.sizes()));
  // Every step's input projection in one product: [L * B, gates * size].
  const torch::Tensor gi = torch::addmm(bias_ih_, x.reshape({steps * batch, input_}), weight_ih_.t())
                               .view({steps, batch, -1});
  // keep[t] = 0 where an episode starts at t (the state is zeroed first), else 1.
  const torch::Tensor keep = starts.defined() ? (starts == 0).to(torch::kFloat32).unsqueeze(-1) : torch::Tensor();
  torch::Tensor state = state0.to(torch::kFloat32);
  std::vector<torch::Tensor> outputs;
  outputs.reserve(static_cast<std::size_t>(steps));
  // unbind, not gi[t]: each select's backward would zero-fill a gradient the size of all of gi, step after step
  // (L^2 work, and fresh pages each time); unbind's stacks the steps' gradients once.
  const std::vector<torch::Tensor> step_gi = gi.unbind(0);
  for (int64_t t = 0; t < steps; ++t) {
    if (keep.defined()) state = state * keep[t];
    state = Cell(step_gi[static_cast<std::size_t>(t)], state).to(torch::kFloat32);
    outputs.push_back(state.narrow(1, 0, size_));
  }
  if (last_state) *last_state = state;
  return torch::stack(outputs);
}

std::pair<torch::Tensor, torch::Tensor> RecurrentCoreImpl::UnrollPair(RecurrentCoreImpl& a, RecurrentCoreImpl& b,
                                                                      const torch::Tensor& xa, const torch::Tensor& xb,
                                                                      const torch::Tensor& state_a,
                                                                      const torch::Tensor& state_b,
                                                                      const torch::Tensor& starts) {
  if (a.kind_ != b.kind_ || a.input_ != b.input_ || a.size_ != b.size_ || xa.sizes() != xb.sizes() ||
      state_a.sizes() != state_b.sizes())
    return {a.Unroll(xa, state_a, starts), b.Unroll(xb, state_b, starts)};
  if (xa.dim() != 3) throw std::invalid_argument("RecurrentCore::UnrollPair: x must be [L, B, input]");
  const int64_t steps = xa.size(0);
  const int64_t batch = xa.size(1);
  if (state_a.dim() != 2 || state_a.size(0) != batch || state_a.size(1) != a.state_size())
    throw std::invalid_argument("RecurrentCore::UnrollPair: the states must be [" + std::to_string(batch) + ", " +
                                std::to_string(a.state_size()) + "], got " + c10::str(state_a.sizes()));
  if (starts.defined() && (starts.dim() != 2 || starts.size(0) != steps || starts.size(1) != batch))
    throw std::invalid_argument("RecurrentCore::UnrollPair: starts must be [" + std::to_string(steps) + ", " +
                                std::to_string(batch) + "], got " + c10::str(starts.sizes()));
  // The two cores as one batch of two: [2, ...] weights, inputs and states; every op covers both.
  const torch::Tensor weight_ih = torch::stack({a.weight_ih_, b.weight_ih_});
  const torch::Tensor weight_hh = torch::stack({a.weight_hh_, b.weight_hh_});
  const torch::Tensor bias_ih = torch::stack({a.bias_ih_, b.bias_ih_}).unsqueeze(1);
  const torch::Tensor bias_hh = torch::stack({a.bias_hh_, b.bias_hh_}).unsqueeze(1);
  const torch::Tensor x = torch::stack({xa.reshape({steps * batch, a.input_}), xb.reshape({steps * batch, a.input_})});
  const torch::Tensor gi = Project(bias_ih, x, weight_ih).view({2, steps, batch, -1});
  const torch::Tensor keep = starts.defined() ? (starts == 0).to(torch::kFloat32).unsqueeze(-1) : torch::Tensor();
  torch::Tensor state = torch::stack({state_a, state_b}).to(torch::kFloat32);
  std::vector<torch::Tensor> outputs;
  outputs.reserve(static_cast<std::size_t>(steps));
  const std::vector<torch::Tensor> step_gi = gi.unbind(1);  // as Unroll: one gradient stack, not one per step
  for (int64_t t = 0; t < steps; ++t) {
    if (keep.defined()) state = state * keep[t];
    state = CellStep(a.kind_, a.size_, step_gi[static_cast<std::size_t>(t)], state, weight_hh, bias_hh)
                .to(torch::kFloat32);
    outputs.push_back(state.narrow(-1, 0, a.size_));
  }
  const torch::Tensor out = torch::stack(outputs, 1);  // [2, L, B, size]
  return {out[0], out[1]};
}

}  // namespace farm
