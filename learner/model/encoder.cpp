// Encoders and trunks from their descriptions (encoder.h).
#include "learner/model/encoder.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <stdexcept>

namespace farm {
namespace {

constexpr double kHiddenGain = 1.41421356237309504880;  // sqrt(2)

torch::nn::Linear OrthogonalLinear(int64_t in, int64_t out) {
  torch::nn::Linear linear(in, out);
  torch::NoGradGuard no_grad;
  torch::nn::init::orthogonal_(linear->weight, kHiddenGain);
  torch::nn::init::zeros_(linear->bias);
  return linear;
}

torch::nn::Conv2d OrthogonalConv(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding) {
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(in, out, kernel).stride(stride).padding(padding));
  torch::NoGradGuard no_grad;
  torch::nn::init::orthogonal_(conv->weight, kHiddenGain);  // on the weight's [out, in * k * k] view
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

Status ImageEncoderShapes(Encoder kind, const EncoderLayout& layout, const Space& input, const char* what,
                          std::vector<std::vector<int64_t>>* shapes) {
  shapes->clear();
  if (kind == Encoder::kMlp) return Status::Ok();
  const std::string key = std::string("ppo.encoder ") + EncoderName(kind);
  if (input.shape.size() != 3 || input.numel() <= 0)
    return Status::InvalidArgument(fmt::format("{} needs a [C, H, W] {}, got {} (use ppo.encoder: mlp)", key, what,
                                               input.ToString()));
  std::vector<int64_t> shape = input.shape;
  // One layer on `shape`: its output, or an error naming the layer when it leaves nothing.
  const auto layer = [&](const std::string& name, int64_t channels, int64_t kernel, int64_t stride,
                         int64_t padding) -> Status {
    if (channels <= 0 || kernel <= 0 || stride <= 0 || padding < 0)
      return Status::InvalidArgument(fmt::format("{}: channels {}, kernel {} and stride {} must be positive and "
                                                 "padding {} at least 0",
                                                 name, channels, kernel, stride, padding));
    const int64_t h = OutSize(shape[1], kernel, stride, padding), w = OutSize(shape[2], kernel, stride, padding);
    if (h <= 0 || w <= 0)
      return Status::InvalidArgument(fmt::format("{}: kernel {} with padding {} does not fit the {} {} it gets "
                                                 "(from the {} {}): nothing would be left; use a smaller kernel or "
                                                 "stride, or more padding",
                                                 name, kernel, padding, what, ShapeText(shape), what,
                                                 ShapeText(input.shape)));
    shape = {channels, h, w};
    shapes->push_back(shape);
    return Status::Ok();
  };
  switch (kind) {
    case Encoder::kCnn:
      if (auto s = layer(key + " (first conv)", kCnnChannels1, 3, 1, 1); !s.ok()) return s;
      return layer(key + " (second conv)", kCnnChannels2, 3, 2, 1);
    case Encoder::kConv:
      if (layout.conv.empty())
        return Status::InvalidArgument(
            "ppo.conv: the conv encoder needs at least one layer, e.g. [{channels: 32, kernel: 3, stride: 1, "
            "padding: 1}]");
      for (std::size_t i = 0; i < layout.conv.size(); ++i) {
        const ConvLayerSpec& c = layout.conv[i];
        if (auto s = layer(fmt::format("ppo.conv[{}]", i), c.channels, c.kernel, c.stride, c.padding); !s.ok())
          return s;
      }
      return Status::Ok();
    case Encoder::kImpala:
      if (layout.impala_channels.empty())
        return Status::InvalidArgument("ppo.impala_channels: the impala encoder needs at least one stage, e.g. [16, "
                                       "32, 32]");
      for (std::size_t i = 0; i < layout.impala_channels.size(); ++i) {
        const std::string name = fmt::format("ppo.impala_channels[{}]", i);
        if (auto s = layer(name + " (conv)", layout.impala_channels[i], 3, 1, 1); !s.ok()) return s;
        if (auto s = layer(name + " (max-pool)", layout.impala_channels[i], 3, 2, 1); !s.ok()) return s;
      }
      return Status::Ok();
    case Encoder::kMlp: break;
  }
  return Status::Ok();
}

int64_t ImageEncoderWorkspaceFloats(Encoder kind, const EncoderLayout& layout, const Space& input) {
  std::vector<std::vector<int64_t>> shapes;
  if (!ImageEncoderShapes(kind, layout, input, "input", &shapes).ok() || shapes.empty()) return 0;
  // Each convolution's input channels and kernel, in the order ImageEncoderShapes lists their outputs (impala:
  // a stage's conv, then its pool, whose blocks' convs are 3x3 on the pooled shape).
  int64_t channels = input.shape[0], largest = 0;
  const auto conv = [&](int64_t in, int64_t kernel, const std::vector<int64_t>& out) {
    largest = std::max(largest, in * kernel * kernel * out[1] * out[2]);
  };
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const std::vector<int64_t>& out = shapes[i];
    if (kind == Encoder::kConv) {
      conv(channels, layout.conv[i].kernel, out);
    } else if (kind == Encoder::kImpala && i % 2 == 1) {
      conv(out[0], 3, out);  // the residual blocks' convs
    } else {
      conv(channels, 3, out);  // cnn's and impala's stage convs are 3x3
    }
    channels = out[0];
  }
  return largest;
}

ImpalaResidualImpl::ImpalaResidualImpl(int64_t channels) {
  conv0 = register_module("conv0", OrthogonalConv(channels, channels, 3, 1, 1));
  conv1 = register_module("conv1", OrthogonalConv(channels, channels, 3, 1, 1));
}

torch::Tensor ImpalaResidualImpl::forward(const torch::Tensor& x) {
  return x + conv1->forward(torch::relu(conv0->forward(torch::relu(x))));
}

torch::nn::Sequential ImageEncoder(Encoder kind, const EncoderLayout& layout, const Space& input, int64_t features,
                                   const char* what) {
  std::vector<std::vector<int64_t>> shapes;
  if (auto s = ImageEncoderShapes(kind, layout, input, what, &shapes); !s.ok())
    throw std::invalid_argument("ActorCritic: " + s.message());
  if (kind == Encoder::kMlp) throw std::invalid_argument("ActorCritic: the mlp encoder has no image stack");
  if (features <= 0)
    throw std::invalid_argument(fmt::format("ActorCritic: the {} encoder needs hidden_sizes with a positive first "
                                            "width (its features), got {}",
                                            EncoderName(kind), features));
  torch::nn::Sequential seq;
  int64_t channels = input.shape[0];
  Activation last = Activation::kRelu;  // after the Linear: the conv encoder's activation, ReLU for the others
  switch (kind) {
    case Encoder::kCnn:
      seq->push_back(OrthogonalConv(channels, kCnnChannels1, 3, 1, 1));
      seq->push_back(torch::nn::ReLU());
      seq->push_back(OrthogonalConv(kCnnChannels1, kCnnChannels2, 3, 2, 1));
      seq->push_back(torch::nn::ReLU());
      break;
    case Encoder::kConv:
      for (const ConvLayerSpec& c : layout.conv) {
        seq->push_back(OrthogonalConv(channels, c.channels, c.kernel, c.stride, c.padding));
        PushActivation(seq, layout.activation);
        channels = c.channels;
      }
      last = layout.activation;
      break;
    case Encoder::kImpala:
      for (int64_t out : layout.impala_channels) {
        seq->push_back(OrthogonalConv(channels, out, 3, 1, 1));
        seq->push_back(torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(3).stride(2).padding(1)));
        seq->push_back(ImpalaResidual(out));
        seq->push_back(ImpalaResidual(out));
        channels = out;
      }
      seq->push_back(torch::nn::ReLU());
      break;
    case Encoder::kMlp: break;
  }
  const std::vector<int64_t>& out = shapes.back();
  seq->push_back(torch::nn::Flatten());
  seq->push_back(OrthogonalLinear(out[0] * out[1] * out[2], features));
  PushActivation(seq, last);
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
  std::vector<std::vector<int64_t>> shapes;
  if (!ImageEncoderShapes(kind, layout, input, "input", &shapes).ok()) return 0;
  int64_t floats = 0;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const int64_t numel = shapes[i][0] * shapes[i][1] * shapes[i][2];
    // impala: every second shape is a stage's pooled output, which its two residual blocks keep (two convs and
    // a sum each).
    floats += kind == Encoder::kImpala && i % 2 == 1 ? 7 * numel : numel;
  }
  return floats;
}

}  // namespace farm
