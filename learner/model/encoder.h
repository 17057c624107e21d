// The encoders that read an observation (the actor) or the critic's input (an observation or an env's global
// state) before the MLP trunk, and the trunk's own layers: what ppo.encoder, ppo.conv, ppo.impala_channels,
// ppo.activation and ppo.layer_norm describe. ActorCritic (policy.h) builds its networks from these functions;
// the memory estimate counts their activations; export walks the modules they make.
//
//   mlp:    the input flattened, straight into the trunk.
//   cnn:    for a [C, H, W] input: Conv 3x3 C->32 (padding 1) ReLU, Conv 3x3 stride 2 32->64 (padding 1) ReLU,
//           flatten, Linear -> hidden_sizes[0] ReLU (the farm's fixed small conv encoder).
//   conv:   for a [C, H, W] input: the layers of ppo.conv in order, each Conv(channels, kernel, stride, padding)
//           then the activation; flatten, Linear -> hidden_sizes[0], activation.
//   impala: for a [C, H, W] input, the IMPALA ResNet (Espeholt et al. 2018) as SEED RL, Sample Factory and
//           CleanRL's Procgen agents build it: per entry of ppo.impala_channels a stage of Conv 3x3 (padding 1),
//           MaxPool 3x3 stride 2 (padding 1) and two residual blocks x + Conv(ReLU(Conv(ReLU(x)))); then ReLU,
//           flatten, Linear -> hidden_sizes[0], ReLU.
// The trunk after an encoder is Linear layers of the remaining hidden sizes (all of them for mlp), each followed
// by LayerNorm when layer_norm is set and then the activation. Hidden layers are orthogonal with gain sqrt(2),
// biases zero (the reference PPO implementations' initialisation, whatever the activation), except in impala's
// residual stack, which must keep the stream's scale: each residual block starts as the identity (its second conv
// zero, as Goyal et al. 2017 and Fixup start a residual branch) and the stage convs, which read the stream and not
// a ReLU's output, take gain 1. With sqrt(2) everywhere the stream grew about 2.8x per stage: on uav_coverage's
// [3, 32, 32] global state 84-91% of the tanh trunk's outputs behind impala started saturated (encoder_test).
//
// Threading: free functions and plain data.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "common/space.h"
#include "common/status.h"

namespace farm {

enum class Encoder { kMlp, kCnn, kConv, kImpala };
inline constexpr int64_t kCnnChannels1 = 32;
inline constexpr int64_t kCnnChannels2 = 64;
const char* EncoderName(Encoder encoder);
// "mlp", "cnn", "conv" or "impala"; InvalidArgument naming `name` otherwise.
Status ParseEncoder(const std::string& name, Encoder* out);
// Whether the encoder reads a [C, H, W] input (every kind but mlp).
inline bool IsImageEncoder(Encoder encoder) { return encoder != Encoder::kMlp; }

enum class Activation { kTanh, kRelu, kElu, kSilu };
const char* ActivationName(Activation activation);
Status ParseActivation(const std::string& name, Activation* out);

struct ConvLayerSpec {
  int64_t channels = 0;
  int64_t kernel = 3;
  int64_t stride = 1;
  int64_t padding = 0;
  bool operator==(const ConvLayerSpec& o) const {
    return channels == o.channels && kernel == o.kernel && stride == o.stride && padding == o.padding;
  }
};

// Everything about the encoder and trunk besides the kind and the widths (hidden_sizes).
struct EncoderLayout {
  std::vector<ConvLayerSpec> conv;                 // conv only: at least one layer
  std::vector<int64_t> impala_channels{16, 32, 32};  // impala only: at least one stage
  Activation activation = Activation::kTanh;       // the trunk's, and the conv encoder's
  bool layer_norm = false;                         // LayerNorm after each hidden Linear of the trunk
};

// The [C, H, W] shape each layer of an image encoder's conv stack leaves on `input` (`what` names the input in
// errors: "observation", "global state"), last entry the stack's output. InvalidArgument naming the key, the
// shape and why for a kind that needs [C, H, W] on another shape, an empty ppo.conv or ppo.impala_channels, a
// non-positive entry, or a layer that leaves nothing (kernel larger than its padded input).
Status ImageEncoderShapes(Encoder kind, const EncoderLayout& layout, const Space& input, const char* what,
                          std::vector<std::vector<int64_t>>* shapes);

// The image encoder of `kind` on `input`, ending in a Linear to `features` and its activation; throws
// std::invalid_argument with ImageEncoderShapes' message when it cannot be built.
torch::nn::Sequential ImageEncoder(Encoder kind, const EncoderLayout& layout, const Space& input, int64_t features,
                                   const char* what);

// Appends the trunk's hidden layers (Linear [LayerNorm] activation per entry of `hidden_sizes`) to `seq`;
// returns the width they end with. Throws std::invalid_argument for a non-positive width.
int64_t AppendTrunk(torch::nn::Sequential& seq, int64_t in, const std::vector<int>& hidden_sizes,
                    const EncoderLayout& layout);

// Floats per row that an image encoder's conv stack holds for the backward pass (every conv, pool and block
// output, once); 0 for mlp or a shape it cannot take.
int64_t ImageEncoderFloats(Encoder kind, const EncoderLayout& layout, const Space& input);

// Floats per row of the largest unfolded input (im2col: in_channels x kernel^2 x output cells) among the image
// encoder's convolutions, which LibTorch's CPU convolution allocates for the whole batch; 0 for mlp.
int64_t ImageEncoderWorkspaceFloats(Encoder kind, const EncoderLayout& layout, const Space& input);

// IMPALA's residual block: x + conv1(relu(conv0(relu(x)))), both convs 3x3 with padding 1, `channels` wide;
// conv1 starts at zero (the block starts as the identity).
class ImpalaResidualImpl : public torch::nn::Module {
 public:
  explicit ImpalaResidualImpl(int64_t channels);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Conv2d conv0{nullptr};
  torch::nn::Conv2d conv1{nullptr};
};
TORCH_MODULE(ImpalaResidual);

}  // namespace farm
