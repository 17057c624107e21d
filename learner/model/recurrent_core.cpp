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

torch::Tensor RecurrentCoreImpl::Cell(const torch::Tensor& gi, const torch::Tensor& state) {
  if (kind_ == CoreKind::kGru) {
    const torch::Tensor gh = torch::addmm(bias_hh_, state, weight_hh_.t());
    const auto i = gi.chunk(3, 1);
    const auto h = gh.chunk(3, 1);
    const torch::Tensor r = torch::sigmoid(i[0] + h[0]);
    const torch::Tensor z = torch::sigmoid(i[1] + h[1]);
    const torch::Tensor n = torch::tanh(i[2] + r * h[2]);
    return n + z * (state - n);  // (1 - z) * n + z * h
  }
  const torch::Tensor h = state.narrow(1, 0, size_);
  const torch::Tensor c = state.narrow(1, size_, size_);
  const auto g = (gi + torch::addmm(bias_hh_, h, weight_hh_.t())).chunk(4, 1);
  const torch::Tensor c_next = torch::sigmoid(g[1]) * c + torch::sigmoid(g[0]) * torch::tanh(g[2]);
  const torch::Tensor h_next = torch::sigmoid(g[3]) * torch::tanh(c_next);
  return torch::cat({h_next, c_next}, 1);
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
  for (int64_t t = 0; t < steps; ++t) {
    if (keep.defined()) state = state * keep[t];
    state = Cell(gi[t], state).to(torch::kFloat32);
    outputs.push_back(state.narrow(1, 0, size_));
  }
  if (last_state) *last_state = state;
  return torch::stack(outputs);
}

}  // namespace farm
