// FusedPpoUpdate's private parts, shared by ppo_fused.cpp (set-up, forward/backward, clip, Adam, Run) and
// ppo_fused_loss.cpp (the loss terms and their gradients). Not for other files.
//
// Threading: as FusedPpoUpdate (ppo_fused.h).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "learner/train/ppo_fused.h"

namespace farm {
namespace fused_detail {

constexpr double kClipNormEps = 1e-6;   // as clip_grad_norm_
constexpr float kHalfLog2Pi = 0.91893853320467274178f;
// Layers with fewer outputs than this (policy and value heads) run forward as row dot products with W;
// wider ones as a GEMM with W^T, kept transposed for it.
constexpr int64_t kNarrowLayer = 16;

}  // namespace fused_detail

struct FusedPpoUpdate::Layer {
  torch::Tensor weight, bias;  // the module's parameters [out, in], [out]
  int64_t in = 0, out = 0;
  bool narrow = false;  // out < kNarrowLayer: forward by row dot products with w
  // Per Run (a checkpoint load may give the parameters new storage):
  const float* w = nullptr;  // weight's data
  const float* b = nullptr;  // bias's data
  std::vector<float> w_t;    // W^T [in, out], for the forward GEMM of wide layers; refreshed every step
  float* grad_w = nullptr;   // slices of grads_
  float* grad_b = nullptr;
};

struct FusedPpoUpdate::Net {
  std::vector<Layer> layers;  // tanh after every layer but the last
};

// One parameter as Adam sees it.
struct FusedPpoUpdate::Param {
  torch::Tensor tensor;   // the module's parameter
  float* grad = nullptr;  // its slice of grads_
  int64_t numel = 0;
  // Per Run:
  torch::optim::AdamParamState* state = nullptr;
  const torch::optim::AdamOptions* options = nullptr;
};

// One network's activations and gradients for a minibatch of B rows.
struct FusedPpoUpdate::NetBuffers {
  std::vector<std::vector<float>> y;  // [B, out_l]: layer outputs (after tanh for hidden layers)
  std::vector<std::vector<float>> g;  // [B, out_l]: dLoss/d(pre-activation)
  std::vector<float> grad_t;          // dW^T [in, out] of a layer with few inputs (see BackwardNet)
};

// Preallocated buffers for one minibatch size.
struct FusedPpoUpdate::Workspace {
  int64_t rows = 0;
  std::vector<float> x;           // [B, obs_dim]
  std::vector<int64_t> action;    // [B, K] categorical: one choice per component
  std::vector<float> action_box;  // [B, A] box
  std::vector<float> old_logp, old_value, advantage, ret;
  // Per row 1 (acted) or 0 (finished: left out of every term), and the rows that acted; all ones without a mask.
  std::vector<float> weight;
  int64_t acting = 0;
  std::vector<float> logp_all;     // one row's log-softmax per component (categorical)
  std::vector<float> probs;        // and its exp (categorical); exp(-log_std) (box)
  std::vector<float> seg_entropy;  // one row's entropy per component (categorical)
  NetBuffers actor, critic;
};

}  // namespace farm
