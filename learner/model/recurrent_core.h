// RecurrentCore: a policy's memory (ppo.core): a GRU or LSTM cell between the
// encoder and the heads, with the same arithmetic as torch.nn.GRUCell and
// torch.nn.LSTMCell (gate order r, z, n and i, f, g, o), written out so that
// a sequence's input projections run as one matrix product and a state can be
// zeroed inside a sequence (an episode start) without leaving the loop.
//
// A row's state is one float vector of state_size() values: h for a GRU,
// h then c for an LSTM. Zero is the state before an episode's first step.
//
// Threading: a module is not thread-safe (as ActorCritic, which owns it).
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>

#include "common/status.h"

namespace farm {

enum class CoreKind { kNone, kGru, kLstm };
const char* CoreName(CoreKind kind);
// "none", "gru" or "lstm"; InvalidArgument naming `name` otherwise.
Status ParseCore(const std::string& name, CoreKind* out);

class RecurrentCoreImpl : public torch::nn::Module {
 public:
  // Throws std::invalid_argument for kNone or a non-positive width. Weights orthogonal (gain 1, per gate
  // block), as CleanRL's recurrent PPO initialises its LSTM; biases zero, or with max_timescale > 2 the chrono
  // initialisation of the gates that keep the state (timescales up to max_timescale steps; recurrent_core.cpp).
  RecurrentCoreImpl(CoreKind kind, int64_t input_size, int64_t size, int64_t max_timescale = 0);

  CoreKind kind() const { return kind_; }
  int64_t input_size() const { return input_; }
  int64_t output_size() const { return size_; }
  // Floats of state per row: size (gru) or 2 * size (lstm).
  int64_t state_size() const { return kind_ == CoreKind::kLstm ? 2 * size_ : size_; }

  // One step: x [B, input], state [B, state_size] -> (output [B, size], next state [B, state_size]).
  std::pair<torch::Tensor, torch::Tensor> Step(const torch::Tensor& x, const torch::Tensor& state);
  // L steps of B sequences: x [L, B, input], state0 [B, state_size]; `starts` [L, B] (any dtype, nonzero: the
  // state is zeroed before that step; undefined: never). Returns the outputs [L, B, size]; `last_state`, when
  // given, gets the state after the last step.
  torch::Tensor Unroll(const torch::Tensor& x, const torch::Tensor& state0, const torch::Tensor& starts,
                       torch::Tensor* last_state = nullptr);
  // Two cores over inputs of the same shape with the same episode starts (the actor's and the critic's): the
  // outputs of a.Unroll(xa, state_a, starts) and b.Unroll(xb, state_b, starts), computed as one batch of two,
  // which halves the update's kernels on its sequential path. Cores of different kinds or widths are unrolled
  // one after the other.
  static std::pair<torch::Tensor, torch::Tensor> UnrollPair(RecurrentCoreImpl& a, RecurrentCoreImpl& b,
                                                            const torch::Tensor& xa, const torch::Tensor& xb,
                                                            const torch::Tensor& state_a, const torch::Tensor& state_b,
                                                            const torch::Tensor& starts);

 private:
  // The next state from a step's input projection `gi` [B, gates * size] and the state.
  torch::Tensor Cell(const torch::Tensor& gi, const torch::Tensor& state);

  CoreKind kind_;
  int64_t input_;
  int64_t size_;
  torch::Tensor weight_ih_, weight_hh_, bias_ih_, bias_hh_;
};
TORCH_MODULE(RecurrentCore);

// K GRUs' unrolls over L steps of B sequences, forward and backward written out for the CPU in float32: one node
// in the autograd graph for the whole chunk instead of a dozen per step, the products by cpu_kernels.h's Gemm
// and the gates by its vectorised tanh (sigmoid(x) = (1 + tanh(x / 2)) / 2). The same arithmetic as the cell
// stepped through autograd, to rounding. gi [K, L, B, 3S]: every step's input projection (bias_ih in); state0
// [K, B, S]; weight_hh [K, 3S, S]; bias_hh [K, 3S]; keep [L, B] float (0 where the state is zeroed before the
// step: an episode start; undefined: never). Returns the outputs [K, L, B, S] (the state after each step).
// Unroll and UnrollPair use it for a GRU whose tensors are float32 on the CPU; any other case (CUDA, an autocast
// dtype, an LSTM) takes the stepwise path.
torch::Tensor FusedGruUnroll(const torch::Tensor& gi, const torch::Tensor& state0, const torch::Tensor& weight_hh,
                             const torch::Tensor& bias_hh, const torch::Tensor& keep);

}  // namespace farm
