// Encoders and trunks from their descriptions (encoder.h).
#include "learner/model/encoder.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <optional>
#include <stdexcept>

namespace farm {
namespace {

constexpr double kHiddenGain = 1.41421356237309504880;  // sqrt(2): for a layer that reads a ReLU's output
constexpr double kStreamGain = 1.0;                        // for a layer that reads impala's residual stream

torch::nn::Linear OrthogonalLinear(int64_t in, int64_t out) {
  torch::nn::Linear linear(in, out);
  torch::NoGradGuard no_grad;
  torch::nn::init::orthogonal_(linear->weight, kHiddenGain);
  torch::nn::init::zeros_(linear->bias);
  return linear;
}

// gain 0: weights and bias zero.
torch::nn::Conv2d OrthogonalConv(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding,
                                 double gain = kHiddenGain) {
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(in, out, kernel).stride(stride).padding(padding));
  torch::NoGradGuard no_grad;
  if (gain == 0) {
    torch::nn::init::zeros_(conv->weight);
  } else {
    torch::nn::init::orthogonal_(conv->weight, gain);  // on the weight's [out, in * k * k] view
  }
  torch::nn::init::zeros_(conv->bias);
  return conv;
}

void PushActivation(torch::nn::Sequential& seq, Activation activation) {
  switch (activation) {
    case Activation::kTanh: seq->push_back(torch::nn::Tanh()); break;
    case Activation::kRelu: seq->push_back(torch::nn::ReLU()); break;
    case Activation::kElu: seq->push_back(torch::nn::ELU()); break;
    case Activation::kSilu: seq->push_back(torch::nn::SiLU()); break;
  }
}

// Output size of a convolution or pooling along one dimension; <= 0 when it leaves nothing.
int64_t OutSize(int64_t in, int64_t kernel, int64_t stride, int64_t padding) {
  return in + 2 * padding < kernel ? 0 : (in + 2 * padding - kernel) / stride + 1;
}

std::string ShapeText(const std::vector<int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

}  // namespace

const char* EncoderName(Encoder encoder) {
  switch (encoder) {
    case Encoder::kMlp: return "mlp";
    case Encoder::kCnn: return "cnn";
    case Encoder::kConv: return "conv";
    case Encoder::kImpala: return "impala";
  }
  return "?";
}

Status ParseEncoder(const std::string& name, Encoder* out) {
  for (Encoder e : {Encoder::kMlp, Encoder::kCnn, Encoder::kConv, Encoder::kImpala}) {
    if (name == EncoderName(e)) {
      *out = e;
      return Status::Ok();
    }
  }
  return Status::InvalidArgument("encoder: expected mlp, cnn, conv or impala, got '" + name + "'");
}

const char* ActivationName(Activation activation) {
  switch (activation) {
    case Activation::kTanh: return "tanh";
    case Activation::kRelu: return "relu";
    case Activation::kElu: return "elu";
    case Activation::kSilu: return "silu";
  }
  return "?";
}

Status ParseActivation(const std::string& name, Activation* out) {
  for (Activation a : {Activation::kTanh, Activation::kRelu, Activation::kElu, Activation::kSilu}) {
    if (name == ActivationName(a)) {
      *out = a;
      return Status::Ok();
    }
  }
  return Status::InvalidArgument("activation: expected tanh, relu, elu or silu, got '" + name + "'");
}

namespace {

// One layer of an image encoder's stack: what ImageEncoderShapes checks, ImageEncoder builds and the memory
// estimate counts, listed once.
struct PlannedLayer {
  bool pool = false;  // a max-pool (impala's), else a convolution
  int64_t in_channels = 0, channels = 0, kernel = 0, stride = 1, padding = 0;
  std::optional<Activation> activation;  // after a convolution, when one follows it
  bool residual_blocks = false;          // impala: two residual blocks of `channels` after this pool
  std::vector<int64_t> out;              // the [C, H, W] it leaves
};

Status PlanImageEncoder(Encoder kind, const EncoderLayout& layout, const Space& input, const char* what,
                        std::vector<PlannedLayer>* plan) {
  plan->clear();
  if (kind == Encoder::kMlp) return Status::Ok();
  const std::string key = std::string("ppo.encoder ") + EncoderName(kind);
  if (input.shape.size() != 3 || input.numel() <= 0)
    return Status::InvalidArgument(fmt::format("{} needs a [C, H, W] {}, got {} (use ppo.encoder: mlp)", key, what,
                                               input.ToString()));
  std::vector<int64_t> shape = input.shape;
  // One layer on `shape`: planned with its output, or an error naming the layer when it leaves nothing.
  const auto layer = [&](const std::string& name, PlannedLayer l) -> Status {
    if (l.channels <= 0 || l.kernel <= 0 || l.stride <= 0 || l.padding < 0)
      return Status::InvalidArgument(fmt::format("{}: channels {}, kernel {} and stride {} must be positive and "
                                                 "padding {} at least 0",
                                                 name, l.channels, l.kernel, l.stride, l.padding));
    const int64_t h = OutSize(shape[1], l.kernel, l.stride, l.padding);
    const int64_t w = OutSize(shape[2], l.kernel, l.stride, l.padding);
    if (h <= 0 || w <= 0)
      return Status::InvalidArgument(fmt::format("{}: kernel {} with padding {} does not fit the {} {} it gets "
                                                 "(from the {} {}): nothing would be left; use a smaller kernel or "
                                                 "stride, or more padding",
                                                 name, l.kernel, l.padding, what, ShapeText(shape), what,
                                                 ShapeText(input.shape)));
    l.in_channels = shape[0];
    shape = {l.channels, h, w};
    l.out = shape;
    plan->push_back(std::move(l));
    return Status::Ok();
  };
  const auto conv = [](int64_t channels, int64_t kernel, int64_t stride, int64_t padding,
                       std::optional<Activation> activation) {
    PlannedLayer l;
    l.channels = channels;
    l.kernel = kernel;
    l.stride = stride;
    l.padding = padding;
    l.activation = activation;
    return l;
  };
  switch (kind) {
    case Encoder::kCnn:
      if (auto s = layer(key + " (first conv)", conv(kCnnChannels1, 3, 1, 1, Activation::kRelu)); !s.ok()) return s;
      return layer(key + " (second conv)", conv(kCnnChannels2, 3, 2, 1, Activation::kRelu));
    case Encoder::kConv:
      if (layout.conv.empty())
        return Status::InvalidArgument(
            "ppo.conv: the conv encoder needs at least one layer, e.g. [{channels: 32, kernel: 3, stride: 1, "
            "padding: 1}]");
      for (std::size_t i = 0; i < layout.conv.size(); ++i) {
        const ConvLayerSpec& c = layout.conv[i];
        if (auto s = layer(fmt::format("ppo.conv[{}]", i), conv(c.channels, c.kernel, c.stride, c.padding,
                                                                 layout.activation));
            !s.ok())
          return s;
      }
      return Status::Ok();
    case Encoder::kImpala:
      if (layout.impala_channels.empty())
        return Status::InvalidArgument("ppo.impala_channels: the impala encoder needs at least one stage, e.g. [16, "
                                       "32, 32]");
      for (std::size_t i = 0; i < layout.impala_channels.size(); ++i) {
        const std::string name = fmt::format("ppo.impala_channels[{}]", i);
        if (auto s = layer(name + " (conv)", conv(layout.impala_channels[i], 3, 1, 1, std::nullopt)); !s.ok())
          return s;
        PlannedLayer pool = conv(layout.impala_channels[i], 3, 2, 1, std::nullopt);
        pool.pool = true;
        pool.residual_blocks = true;
        if (auto s = layer(name + " (max-pool)", std::move(pool)); !s.ok()) return s;
      }
      return Status::Ok();
    case Encoder::kMlp: break;
  }
  return Status::Ok();
}

}  // namespace

Status ImageEncoderShapes(Encoder kind, const EncoderLayout& layout, const Space& input, const char* what,
                          std::vector<std::vector<int64_t>>* shapes) {
  shapes->clear();
  std::vector<PlannedLayer> plan;
  if (auto s = PlanImageEncoder(kind, layout, input, what, &plan); !s.ok()) return s;
  for (const PlannedLayer& l : plan) shapes->push_back(l.out);
  return Status::Ok();
}

int64_t ImageEncoderWorkspaceFloats(Encoder kind, const EncoderLayout& layout, const Space& input) {
  std::vector<PlannedLayer> plan;
  if (!PlanImageEncoder(kind, layout, input, "input", &plan).ok()) return 0;
  int64_t largest = 0;
  for (const PlannedLayer& l : plan) {
    const int64_t cells = l.out[1] * l.out[2];
    if (!l.pool) largest = std::max(largest, l.in_channels * l.kernel * l.kernel * cells);
    if (l.residual_blocks) largest = std::max(largest, l.channels * 9 * cells);  // the blocks' 3x3 convs
  }
  return largest;
}

ImpalaResidualImpl::ImpalaResidualImpl(int64_t channels) {
  conv0 = register_module("conv0", OrthogonalConv(channels, channels, 3, 1, 1));
  conv1 = register_module("conv1", OrthogonalConv(channels, channels, 3, 1, 1, /*gain=*/0));  // the identity
}

torch::Tensor ImpalaResidualImpl::forward(const torch::Tensor& x) {
  return x + conv1->forward(torch::relu(conv0->forward(torch::relu(x))));
}

torch::nn::Sequential ImageEncoder(Encoder kind, const EncoderLayout& layout, const Space& input, int64_t features,
                                   const char* what) {
  std::vector<PlannedLayer> plan;
  if (auto s = PlanImageEncoder(kind, layout, input, what, &plan); !s.ok())
    throw std::invalid_argument("ActorCritic: " + s.message());
  if (kind == Encoder::kMlp) throw std::invalid_argument("ActorCritic: the mlp encoder has no image stack");
  if (features <= 0)
    throw std::invalid_argument(fmt::format("ActorCritic: the {} encoder needs hidden_sizes with a positive first "
                                            "width (its features), got {}",
                                            EncoderName(kind), features));
  torch::nn::Sequential seq;
  for (const PlannedLayer& l : plan) {
    if (l.pool) {
      seq->push_back(torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(l.kernel).stride(l.stride).padding(l.padding)));
    } else {
      // impala's stage convs read the stream (the observation, or the last stage's blocks), not a ReLU's output.
      const double gain = kind == Encoder::kImpala ? kStreamGain : kHiddenGain;
      seq->push_back(OrthogonalConv(l.in_channels, l.channels, l.kernel, l.stride, l.padding, gain));
    }
    if (l.activation) PushActivation(seq, *l.activation);
    if (l.residual_blocks) {
      seq->push_back(ImpalaResidual(l.channels));
      seq->push_back(ImpalaResidual(l.channels));
    }
  }
  if (kind == Encoder::kImpala) seq->push_back(torch::nn::ReLU());
  const std::vector<int64_t>& out = plan.back().out;
  seq->push_back(torch::nn::Flatten());
  seq->push_back(OrthogonalLinear(out[0] * out[1] * out[2], features));
  // After the Linear: the conv encoder's activation, ReLU for the others.
  PushActivation(seq, kind == Encoder::kConv ? layout.activation : Activation::kRelu);
  return seq;
}

int64_t AppendTrunk(torch::nn::Sequential& seq, int64_t in, const std::vector<int>& hidden_sizes,
                    const EncoderLayout& layout) {
  int64_t width = in;
  for (int hidden : hidden_sizes) {
    if (hidden <= 0)
      throw std::invalid_argument("ActorCritic: hidden sizes must be positive, got " + std::to_string(hidden));
    seq->push_back(OrthogonalLinear(width, hidden));
    if (layout.layer_norm) seq->push_back(torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden})));
    PushActivation(seq, layout.activation);
    width = hidden;
  }
  return width;
}

int64_t ImageEncoderFloats(Encoder kind, const EncoderLayout& layout, const Space& input) {
  std::vector<PlannedLayer> plan;
  if (!PlanImageEncoder(kind, layout, input, "input", &plan).ok()) return 0;
  int64_t floats = 0;
  for (const PlannedLayer& l : plan) {
    const int64_t numel = l.out[0] * l.out[1] * l.out[2];
    // A pool's two residual blocks keep two convs and a sum each besides the pool's output.
    floats += l.residual_blocks ? 7 * numel : numel;
  }
  return floats;
}

}  // namespace farm
