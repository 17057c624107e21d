// GRU and LSTM cells, stepped one at a time (acting) or unrolled over a chunk with resets (the update).
#include "learner/model/recurrent_core.h"

#include <stdexcept>
#include <vector>

#include "learner/model/cpu_kernels.h"

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

RecurrentCoreImpl::RecurrentCoreImpl(CoreKind kind, int64_t input_size, int64_t size, int64_t max_timescale)
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
  if (max_timescale > 2) {
    // Chrono initialisation (Tallec & Ollivier, ICLR 2018): each unit's gate starts with a timescale drawn
    // log-uniformly up to max_timescale steps, so that what an early step wrote can still reach a late one and
    // the gradient back to it does not vanish at the start. Zero biases leave every unit forgetting about half
    // its state per step. GRU: the update gate's bias log(U[1, T - 1]) (z = sigmoid(b) keeps the state);
    // LSTM: the forget gate's the same, the input gate's its negative.
    const torch::Tensor b = torch::log(torch::empty({size}).uniform_(1.0, static_cast<double>(max_timescale - 1)));
    if (kind == CoreKind::kGru) {
      bias_hh_.narrow(0, size, size).copy_(b);  // gates r, z, n
    } else {
      bias_hh_.narrow(0, 0, size).copy_(-b);  // gates i, f, g, o
      bias_hh_.narrow(0, size, size).copy_(b);
    }
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


// sigmoid(x) = (1 + tanh(x / 2)) / 2 in place, through the vectorised tanh.
void SigmoidInPlace(float* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) v[i] *= 0.5f;
  kernels::Tanh(v, n);
  for (int64_t i = 0; i < n; ++i) v[i] = 0.5f + 0.5f * v[i];
}

// The autograd node of FusedGruUnroll. Saved per step: the state the step read (after the reset), r, z, n and
// the hidden projection's n part (h W_hn^T + b_hn), each [K, L, B, S].
class GruUnrollFunction : public torch::autograd::Function<GruUnrollFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& gi_in,
                               const torch::Tensor& state0_in, const torch::Tensor& weight_hh_in,
                               const torch::Tensor& bias_hh_in, const torch::Tensor& keep_in) {
    const torch::Tensor gi = gi_in.contiguous(), weight_hh = weight_hh_in.contiguous();
    const torch::Tensor bias_hh = bias_hh_in.contiguous(), state0 = state0_in.contiguous();
    const torch::Tensor keep = keep_in.contiguous();
    const int64_t K = gi.size(0), L = gi.size(1), B = gi.size(2), G = gi.size(3), S = G / 3;
    const auto f32 = gi.options();
    torch::Tensor out = torch::empty({K, L, B, S}, f32);
    torch::Tensor prev = torch::empty({K, L, B, S}, f32), r_all = torch::empty({K, L, B, S}, f32);
    torch::Tensor z_all = torch::empty({K, L, B, S}, f32), n_all = torch::empty({K, L, B, S}, f32);
    torch::Tensor ghn_all = torch::empty({K, L, B, S}, f32);
    std::vector<float> wt(static_cast<size_t>(S * G)), gh(static_cast<size_t>(B * G)), h(static_cast<size_t>(B * S));
    const float* keep_p = keep.data_ptr<float>();
    for (int64_t k = 0; k < K; ++k) {
      // W_hh^T [S, 3S], rows contiguous, as Gemm reads its right-hand side.
      const float* w = weight_hh.data_ptr<float>() + k * G * S;
      for (int64_t g = 0; g < G; ++g)
        for (int64_t j = 0; j < S; ++j) wt[static_cast<size_t>(j * G + g)] = w[g * S + j];
      const float* b_hh = bias_hh.data_ptr<float>() + k * G;
      std::copy_n(state0.data_ptr<float>() + k * B * S, B * S, h.data());
      for (int64_t t = 0; t < L; ++t) {
        const int64_t at = (k * L + t) * B * S;
        for (int64_t b = 0; b < B; ++b)
          if (keep_p[t * B + b] == 0.0f) std::fill_n(h.data() + b * S, S, 0.0f);
        float* hp = prev.data_ptr<float>() + at;
        std::copy_n(h.data(), B * S, hp);
        kernels::Gemm(B, G, S, h.data(), S, 1, wt.data(), G, gh.data(), G, b_hh);
        float* r = r_all.data_ptr<float>() + at;
        float* z = z_all.data_ptr<float>() + at;
        float* n = n_all.data_ptr<float>() + at;
        float* ghn = ghn_all.data_ptr<float>() + at;
        const float* x = gi.data_ptr<float>() + (k * L + t) * B * G;
        for (int64_t b = 0; b < B; ++b) {
          const float* xb = x + b * G;
          const float* gb = gh.data() + b * G;
          for (int64_t j = 0; j < S; ++j) {
            r[b * S + j] = xb[j] + gb[j];
            z[b * S + j] = xb[S + j] + gb[S + j];
            ghn[b * S + j] = gb[2 * S + j];
          }
        }
        SigmoidInPlace(r, B * S);
        SigmoidInPlace(z, B * S);
        for (int64_t b = 0; b < B; ++b)
          for (int64_t j = 0; j < S; ++j) n[b * S + j] = x[b * G + 2 * S + j] + r[b * S + j] * ghn[b * S + j];
        kernels::Tanh(n, B * S);
        float* o = out.data_ptr<float>() + at;
        for (int64_t i = 0; i < B * S; ++i) {
          o[i] = n[i] + z[i] * (hp[i] - n[i]);  // (1 - z) n + z h
          h[static_cast<size_t>(i)] = o[i];
        }
      }
    }
    ctx->save_for_backward({weight_hh, prev, r_all, z_all, n_all, ghn_all});
    ctx->saved_data["keep"] = keep;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor weight_hh = saved[0], prev = saved[1], r_all = saved[2], z_all = saved[3];
    const torch::Tensor n_all = saved[4], ghn_all = saved[5];
    const torch::Tensor keep = ctx->saved_data["keep"].toTensor();
    const int64_t K = prev.size(0), L = prev.size(1), B = prev.size(2), S = prev.size(3), G = 3 * S;
    const auto f32 = prev.options();
    const torch::Tensor d_out = grads[0].defined() ? grads[0].contiguous() : torch::zeros_like(prev);
    torch::Tensor d_gi = torch::empty({K, L, B, G}, f32), d_state0 = torch::empty({K, B, S}, f32);
    torch::Tensor d_weight = torch::empty({K, G, S}, f32), d_bias = torch::empty({K, G}, f32);
    std::vector<float> dh(static_cast<size_t>(B * S)), d_prev(static_cast<size_t>(B * S));
    // The hidden projection's gradient at every step, [L * B, 3S]: one product for W_hh's gradient at the end.
    std::vector<float> d_gh(static_cast<size_t>(L * B * G));
    const float* keep_p = keep.data_ptr<float>();
    for (int64_t k = 0; k < K; ++k) {
      const float* w = weight_hh.data_ptr<float>() + k * G * S;
      std::fill(dh.begin(), dh.end(), 0.0f);
      for (int64_t t = L - 1; t >= 0; --t) {
        const int64_t at = (k * L + t) * B * S;
        const float* g_out = d_out.data_ptr<float>() + at;
        const float* hp = prev.data_ptr<float>() + at;
        const float* r = r_all.data_ptr<float>() + at;
        const float* z = z_all.data_ptr<float>() + at;
        const float* n = n_all.data_ptr<float>() + at;
        const float* ghn = ghn_all.data_ptr<float>() + at;
        float* dx = d_gi.data_ptr<float>() + (k * L + t) * B * G;
        float* dgh = d_gh.data() + t * B * G;
        for (int64_t b = 0; b < B; ++b) {
          for (int64_t j = 0; j < S; ++j) {
            const int64_t i = b * S + j;
            const float d = dh[static_cast<size_t>(i)] + g_out[i];
            const float dn = d * (1.0f - z[i]);
            const float dz = d * (hp[i] - n[i]);
            d_prev[static_cast<size_t>(i)] = d * z[i];
            const float dan = dn * (1.0f - n[i] * n[i]);
            const float dr = dan * ghn[i];
            const float dar = dr * r[i] * (1.0f - r[i]);
            const float daz = dz * z[i] * (1.0f - z[i]);
            dx[b * G + j] = dar;
            dx[b * G + S + j] = daz;
            dx[b * G + 2 * S + j] = dan;
            dgh[b * G + j] = dar;
            dgh[b * G + S + j] = daz;
            dgh[b * G + 2 * S + j] = dan * r[i];
          }
        }
        // Through h W_hh^T: dh_prev += d_gh W_hh ([B, 3S] x [3S, S]); then through the reset before the step.
        kernels::Gemm(B, S, G, dgh, G, 1, w, S, dh.data(), S, nullptr);
        for (int64_t b = 0; b < B; ++b) {
          const float kept = keep_p[t * B + b];
          for (int64_t j = 0; j < S; ++j) {
            const size_t i = static_cast<size_t>(b * S + j);
            dh[i] = (dh[i] + d_prev[i]) * kept;
          }
        }
      }
      std::copy(dh.begin(), dh.end(), d_state0.data_ptr<float>() + k * B * S);
      // W_hh's gradient: sum over steps and rows of d_gh^T h_prev ([3S, L * B] x [L * B, S]); its bias's, the sum.
      kernels::Gemm(G, S, L * B, d_gh.data(), 1, G, prev.data_ptr<float>() + k * L * B * S, S,
                    d_weight.data_ptr<float>() + k * G * S, S, nullptr);
      kernels::SumRows(d_gh.data(), L * B, G, d_bias.data_ptr<float>() + k * G);
    }
    return {d_gi, d_state0, d_weight, d_bias, torch::Tensor()};
  }
};

// Whether an unroll can take FusedGruUnroll: a GRU on float32 CPU tensors.
bool CanFuse(CoreKind kind, const torch::Tensor& gi, const torch::Tensor& state0) {
  return kind == CoreKind::kGru && gi.device().is_cpu() && gi.scalar_type() == torch::kFloat32 &&
         state0.scalar_type() == torch::kFloat32;
}

}  // namespace

torch::Tensor FusedGruUnroll(const torch::Tensor& gi, const torch::Tensor& state0, const torch::Tensor& weight_hh,
                             const torch::Tensor& bias_hh, const torch::Tensor& keep) {
  // Every input of an autograd Function must be defined (LibTorch 1.13): no resets is a keep of ones.
  return GruUnrollFunction::apply(gi, state0, weight_hh, bias_hh,
                                  keep.defined() ? keep : torch::ones({gi.size(1), gi.size(2)}, gi.options()));
}

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
  if (CanFuse(kind_, gi, state0)) {
    const torch::Tensor keep = starts.defined() ? (starts == 0).to(torch::kFloat32) : torch::Tensor();
    const torch::Tensor out =
        FusedGruUnroll(gi.unsqueeze(0), state0.unsqueeze(0), weight_hh_.unsqueeze(0), bias_hh_.unsqueeze(0), keep)[0];
    if (last_state) *last_state = out[steps - 1];
    return out;
  }
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
  if (CanFuse(a.kind_, gi, state_a) && state_b.scalar_type() == torch::kFloat32) {
    const torch::Tensor out = FusedGruUnroll(gi, torch::stack({state_a, state_b}), weight_hh, bias_hh.squeeze(1),
                                             starts.defined() ? (starts == 0).to(torch::kFloat32) : torch::Tensor());
    return {out[0], out[1]};
  }
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
