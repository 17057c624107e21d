// policy_spec.json: writing and parsing (learner/model/policy_spec.h).
#include "learner/model/policy_spec.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>

#include "learner/model/scripted_encoder.h"

namespace farm {

namespace {

using nlohmann::json;

// Written in key order (kind first, observation before action), for people reading the file.
using ordered_json = nlohmann::ordered_json;

ordered_json BoundsJson(const std::vector<float>& values) {
  ordered_json out = ordered_json::array();
  for (float v : values) {
    if (std::isfinite(v)) {
      out.push_back(static_cast<double>(v));
    } else if (std::isnan(v)) {
      out.push_back("nan");
    } else {
      out.push_back(v > 0 ? "inf" : "-inf");
    }
  }
  return out;
}

ordered_json SpaceJson(const Space& space) {
  ordered_json j;
  j["kind"] = space.is_discrete() ? "discrete" : space.is_multi_discrete() ? "multi_discrete" : "box";
  j["shape"] = space.is_discrete() ? std::vector<int64_t>{} : space.shape;
  j["n"] = space.is_discrete() ? space.n : 0;
  if (space.is_multi_discrete()) j["nvec"] = space.nvec;
  j["low"] = space.is_box() ? BoundsJson(space.low) : ordered_json::array();
  j["high"] = space.is_box() ? BoundsJson(space.high) : ordered_json::array();
  return j;
}

Status ParseBounds(const json& j, const std::string& where, std::vector<float>* out) {
  if (!j.is_array())
    return Status::InvalidArgument(fmt::format("{}: expected an array of numbers, got {}", where, j.dump()));
  out->clear();
  for (std::size_t i = 0; i < j.size(); ++i) {
    const json& v = j[i];
    if (v.is_number()) {
      out->push_back(static_cast<float>(v.get<double>()));
    } else if (v.is_string() && (v == "inf" || v == "+inf")) {
      out->push_back(std::numeric_limits<float>::infinity());
    } else if (v.is_string() && v == "-inf") {
      out->push_back(-std::numeric_limits<float>::infinity());
    } else if (v.is_string() && v == "nan") {
      out->push_back(std::numeric_limits<float>::quiet_NaN());
    } else {
      return Status::InvalidArgument(
          fmt::format("{}[{}]: expected a number or \"inf\", \"-inf\", \"nan\", got {}", where, i, v.dump()));
    }
  }
  return Status::Ok();
}

Status ParseSpace(const json& j, const std::string& where, Space* out) {
  if (!j.is_object())
    return Status::InvalidArgument(
        fmt::format("{}: expected an object {{\"kind\", \"shape\", \"n\", \"nvec\", \"low\", "
                    "\"high\"}}, got {}",
                    where, j.dump()));
  for (const auto& item : j.items()) {
    const std::string& key = item.key();
    if (key != "kind" && key != "shape" && key != "n" && key != "nvec" && key != "low" && key != "high")
      return Status::InvalidArgument(
          fmt::format("{}: unknown key '{}' (expected kind, shape, n, nvec, low, high)", where, key));
  }
  if (!j.contains("kind") || !j["kind"].is_string())
    return Status::InvalidArgument(
        fmt::format("{}.kind: expected \"discrete\", \"multi_discrete\" or \"box\"", where));
  const std::string kind = j["kind"].get<std::string>();
  if (kind == "discrete") {
    if (!j.contains("n") || !j["n"].is_number_integer() || j["n"].get<int64_t>() <= 0)
      return Status::InvalidArgument(fmt::format("{}.n: expected an integer > 0 for a discrete space, got {}", where,
                                                 j.contains("n") ? j["n"].dump() : std::string("nothing")));
    for (const char* key : {"shape", "low", "high"}) {
      if (j.contains(key) && !(j[key].is_array() && j[key].empty()))
        return Status::InvalidArgument(
            fmt::format("{}.{}: expected [] for a discrete space, got {}", where, key, j[key].dump()));
    }
    if (j.contains("nvec"))
      return Status::InvalidArgument(fmt::format("{}.nvec: only a multi_discrete space has one", where));
    *out = Space::Discrete(j["n"].get<int64_t>());
    return Status::Ok();
  }
  if (kind == "multi_discrete") {
    const std::string bad = j.contains("nvec") ? j["nvec"].dump() : std::string("nothing");
    if (!j.contains("nvec") || !j["nvec"].is_array() || j["nvec"].empty())
      return Status::InvalidArgument(
          fmt::format("{}.nvec: expected a non-empty array of integers > 0 for a multi_discrete space, got {}",
                      where, bad));
    std::vector<int64_t> nvec;
    for (const json& c : j["nvec"]) {
      if (!c.is_number_integer() || c.get<int64_t>() <= 0)
        return Status::InvalidArgument(
            fmt::format("{}.nvec: expected a non-empty array of integers > 0 for a multi_discrete space, got {}",
                        where, bad));
      nvec.push_back(c.get<int64_t>());
    }
    const std::vector<int64_t> shape{static_cast<int64_t>(nvec.size())};
    if (j.contains("shape") && j["shape"] != json(shape))
      return Status::InvalidArgument(
          fmt::format("{}.shape: expected [{}] (one entry per nvec component), got {}", where, nvec.size(),
                      j["shape"].dump()));
    if (j.contains("n") && !(j["n"].is_number_integer() && j["n"].get<int64_t>() == 0))
      return Status::InvalidArgument(
          fmt::format("{}.n: expected 0 for a multi_discrete space, got {}", where, j["n"].dump()));
    for (const char* key : {"low", "high"}) {
      if (j.contains(key) && !(j[key].is_array() && j[key].empty()))
        return Status::InvalidArgument(
            fmt::format("{}.{}: expected [] for a multi_discrete space, got {}", where, key, j[key].dump()));
    }
    *out = Space::MultiDiscrete(std::move(nvec));
    return Status::Ok();
  }
  if (kind != "box")
    return Status::InvalidArgument(fmt::format(
        "{}.kind: expected \"discrete\", \"multi_discrete\" or \"box\", got \"{}\"", where, kind));
  if (j.contains("nvec"))
    return Status::InvalidArgument(fmt::format("{}.nvec: only a multi_discrete space has one", where));
  if (!j.contains("shape") || !j["shape"].is_array())
    return Status::InvalidArgument(fmt::format("{}.shape: expected an array of positive integers", where));
  std::vector<int64_t> shape;
  for (const json& d : j["shape"]) {
    if (!d.is_number_integer() || d.get<int64_t>() <= 0)
      return Status::InvalidArgument(
          fmt::format("{}.shape: expected an array of positive integers, got {}", where, j["shape"].dump()));
    shape.push_back(d.get<int64_t>());
  }
  if (j.contains("n") && !(j["n"].is_number_integer() && j["n"].get<int64_t>() == 0))
    return Status::InvalidArgument(fmt::format("{}.n: expected 0 for a box space, got {}", where, j["n"].dump()));
  std::vector<float> low, high;
  if (!j.contains("low")) return Status::InvalidArgument(fmt::format("{}.low: missing (a box needs bounds)", where));
  if (!j.contains("high")) return Status::InvalidArgument(fmt::format("{}.high: missing (a box needs bounds)", where));
  if (auto s = ParseBounds(j["low"], where + ".low", &low); !s.ok()) return s;
  if (auto s = ParseBounds(j["high"], where + ".high", &high); !s.ok()) return s;
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  if (static_cast<int64_t>(low.size()) != numel || static_cast<int64_t>(high.size()) != numel)
    return Status::InvalidArgument(fmt::format("{}: low and high need {} entries each (shape [{}]), got {} and {}",
                                               where, numel, fmt::join(shape, ", "), low.size(), high.size()));
  *out = Space::Box(std::move(shape), std::move(low), std::move(high));
  return Status::Ok();
}

// "conv", "impala_channels", "activation" and "layer_norm" (each absent: the default); a conv encoder needs "conv".
Status ParseLayout(const json& j, const std::string& source, Encoder encoder, EncoderLayout* layout) {
  const auto positive = [](const json& v, bool zero_ok) {
    return v.is_number_integer() && (zero_ok ? v.get<int64_t>() >= 0 : v.get<int64_t>() > 0);
  };
  if (j.contains("conv")) {
    const json& conv = j["conv"];
    const std::string expected = "expected an array of {\"channels\", \"kernel\", \"stride\", \"padding\"} objects";
    if (!conv.is_array()) return Status::InvalidArgument(fmt::format("{}: conv: {}, got {}", source, expected, conv.dump()));
    layout->conv.clear();
    for (const json& c : conv) {
      if (!c.is_object() || c.size() != 4 || !c.contains("channels") || !c.contains("kernel") || !c.contains("stride") ||
          !c.contains("padding") || !positive(c["channels"], false) || !positive(c["kernel"], false) ||
          !positive(c["stride"], false) || !positive(c["padding"], true))
        return Status::InvalidArgument(fmt::format("{}: conv: {} (positive integers, padding >= 0), got {}", source,
                                                   expected, c.dump()));
      layout->conv.push_back({c["channels"].get<int64_t>(), c["kernel"].get<int64_t>(), c["stride"].get<int64_t>(),
                              c["padding"].get<int64_t>()});
    }
  }
  if (encoder == Encoder::kConv && layout->conv.empty())
    return Status::InvalidArgument(fmt::format("{}: conv: the conv encoder needs its layers, got {}", source,
                                               j.contains("conv") ? j["conv"].dump() : "nothing"));
  if (j.contains("impala_channels")) {
    const json& c = j["impala_channels"];
    if (!c.is_array() || c.empty() || !std::all_of(c.begin(), c.end(), [&](const json& v) { return positive(v, false); }))
      return Status::InvalidArgument(
          fmt::format("{}: impala_channels: expected a non-empty array of positive integers, got {}", source, c.dump()));
    layout->impala_channels = c.get<std::vector<int64_t>>();
  }
  if (j.contains("activation")) {
    if (!j["activation"].is_string())
      return Status::InvalidArgument(
          fmt::format("{}: activation: expected tanh, relu, elu or silu, got {}", source, j["activation"].dump()));
    if (auto s = ParseActivation(j["activation"].get<std::string>(), &layout->activation); !s.ok())
      return Status::InvalidArgument(source + ": " + s.message());
  }
  if (j.contains("layer_norm")) {
    if (!j["layer_norm"].is_boolean())
      return Status::InvalidArgument(
          fmt::format("{}: layer_norm: expected true or false, got {}", source, j["layer_norm"].dump()));
    layout->layer_norm = j["layer_norm"].get<bool>();
  }
  return Status::Ok();
}

}  // namespace

std::string PolicySpecJson(const Space& obs, const Space& action, const std::vector<int>& hidden,
                           const PolicyOptions& options) {
  ordered_json j;
  j["observation"] = SpaceJson(obs);
  j["action"] = SpaceJson(action);
  j["hidden_sizes"] = hidden;
  j["encoder"] = EncoderName(options.encoder);
  j["global_state"] = options.global_state ? SpaceJson(*options.global_state) : ordered_json(nullptr);
  if (options.sde) j["sde"] = true;  // written only when set: older readers refuse an unknown key
  if (options.value_norm) j["value_norm"] = true;  // the same
  // The same for the layout (learner/model/encoder.h): what the encoder uses, and what is not the default.
  const EncoderLayout& layout = options.layout;
  if (options.encoder == Encoder::kConv) {
    ordered_json conv = ordered_json::array();
    for (const ConvLayerSpec& c : layout.conv)
      conv.push_back({{"channels", c.channels}, {"kernel", c.kernel}, {"stride", c.stride}, {"padding", c.padding}});
    j["conv"] = conv;
  }
  if (options.encoder == Encoder::kImpala) j["impala_channels"] = layout.impala_channels;
  if (layout.activation != Activation::kTanh) j["activation"] = ActivationName(layout.activation);
  if (layout.layer_norm) j["layer_norm"] = true;
  // Encoders written in PyTorch: the run directory's copy (the learner puts it there; scripted_encoder.h).
  if (!options.actor_encoder_script.empty()) j["actor_encoder_script"] = kActorEncoderScriptFile;
  if (!options.critic_encoder_script.empty()) j["critic_encoder_script"] = kCriticEncoderScriptFile;
  if (options.core != CoreKind::kNone) {  // the same
    j["core"] = CoreName(options.core);
    j["core_size"] = options.core_size;
    j["critic_core"] = options.critic_core;
  }
  return j.dump(2) + "\n";
}

Status ParsePolicySpecJson(const std::string& text, const std::string& source, Space* obs, Space* action,
                           std::vector<int>* hidden, PolicyOptions* options) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    return Status::InvalidArgument(fmt::format("{}: not valid JSON: {}", source, e.what()));
  }
  if (!j.is_object())
    return Status::InvalidArgument(
        fmt::format("{}: expected an object with observation, action and hidden_sizes", source));
  for (const auto& item : j.items()) {
    const std::string& key = item.key();
    static const std::vector<std::string> kKeys{"observation", "action",    "hidden_sizes",    "encoder",
                                                "global_state", "sde",       "core",            "core_size",
                                                "critic_core",  "conv",      "impala_channels", "activation",
                                                "layer_norm",   "actor_encoder_script", "critic_encoder_script",
                                                "value_norm"};
    if (std::find(kKeys.begin(), kKeys.end(), key) == kKeys.end())
      return Status::InvalidArgument(
          fmt::format("{}: unknown key '{}' (expected {})", source, key, fmt::join(kKeys, ", ")));
  }
  for (const char* key : {"observation", "action", "hidden_sizes"}) {
    if (!j.contains(key)) return Status::InvalidArgument(fmt::format("{}: missing key '{}'", source, key));
  }
  if (auto s = ParseSpace(j["observation"], source + ": observation", obs); !s.ok()) return s;
  if (!obs->is_box())
    return Status::InvalidArgument(fmt::format("{}: observation: expected a box, got {}", source, obs->ToString()));
  if (auto s = ParseSpace(j["action"], source + ": action", action); !s.ok()) return s;
  const json& h = j["hidden_sizes"];
  if (!h.is_array())
    return Status::InvalidArgument(
        fmt::format("{}: hidden_sizes: expected an array of positive integers, got {}", source, h.dump()));
  hidden->clear();
  for (const json& w : h) {
    if (!w.is_number_integer() || w.get<int64_t>() <= 0 || w.get<int64_t>() > std::numeric_limits<int>::max())
      return Status::InvalidArgument(
          fmt::format("{}: hidden_sizes: expected an array of positive integers, got {}", source, h.dump()));
    hidden->push_back(static_cast<int>(w.get<int64_t>()));
  }
  // Absent in files written before encoders and global states: the MLP on the observation.
  PolicyOptions parsed;
  if (j.contains("encoder")) {
    if (!j["encoder"].is_string())
      return Status::InvalidArgument(
          fmt::format("{}: encoder: expected \"mlp\", \"cnn\", \"conv\" or \"impala\", got {}", source,
                      j["encoder"].dump()));
    if (auto s = ParseEncoder(j["encoder"].get<std::string>(), &parsed.encoder); !s.ok())
      return Status::InvalidArgument(source + ": " + s.message());
  }
  if (auto s = ParseLayout(j, source, parsed.encoder, &parsed.layout); !s.ok()) return s;
  if (j.contains("global_state") && !j["global_state"].is_null()) {
    Space state;
    if (auto s = ParseSpace(j["global_state"], source + ": global_state", &state); !s.ok()) return s;
    if (!state.is_box())
      return Status::InvalidArgument(fmt::format("{}: global_state: expected a box, got {}", source, state.ToString()));
    parsed.global_state = std::move(state);
  }
  if (j.contains("value_norm")) {
    if (!j["value_norm"].is_boolean())
      return Status::InvalidArgument(
          fmt::format("{}: value_norm: expected true or false, got {}", source, j["value_norm"].dump()));
    parsed.value_norm = j["value_norm"].get<bool>();
  }
  if (j.contains("sde")) {
    if (!j["sde"].is_boolean())
      return Status::InvalidArgument(fmt::format("{}: sde: expected true or false, got {}", source, j["sde"].dump()));
    parsed.sde = j["sde"].get<bool>();
    if (parsed.sde && !action->is_box())
      return Status::InvalidArgument(
          fmt::format("{}: sde: state-dependent exploration needs a box action, got {}", source, action->ToString()));
  }
  for (const auto& [key, out] : {std::pair<const char*, std::string*>{"actor_encoder_script", &parsed.actor_encoder_script},
                                  {"critic_encoder_script", &parsed.critic_encoder_script}}) {
    if (!j.contains(key)) continue;
    if (!j[key].is_string() || j[key].get<std::string>().empty())
      return Status::InvalidArgument(fmt::format(
          "{}: {}: expected the file name of a TorchScript encoder beside the spec, got {}", source, key, j[key].dump()));
    *out = j[key].get<std::string>();
  }
  if (j.contains("core")) {
    if (!j["core"].is_string())
      return Status::InvalidArgument(
          fmt::format("{}: core: expected \"none\", \"gru\" or \"lstm\", got {}", source, j["core"].dump()));
    if (auto s = ParseCore(j["core"].get<std::string>(), &parsed.core); !s.ok())
      return Status::InvalidArgument(source + ": " + s.message());
    if (parsed.core != CoreKind::kNone) {
      if (!j.contains("core_size") || !j["core_size"].is_number_integer() || j["core_size"].get<int64_t>() <= 0)
        return Status::InvalidArgument(fmt::format("{}: core_size: expected a positive integer with core {}, got {}",
                                                   source, CoreName(parsed.core),
                                                   j.contains("core_size") ? j["core_size"].dump() : "nothing"));
      parsed.core_size = j["core_size"].get<int64_t>();
      if (j.contains("critic_core")) {
        if (!j["critic_core"].is_boolean())
          return Status::InvalidArgument(
              fmt::format("{}: critic_core: expected true or false, got {}", source, j["critic_core"].dump()));
        parsed.critic_core = j["critic_core"].get<bool>();
      }
    }
  }
  if (options) {
    *options = std::move(parsed);
  } else if (parsed.encoder != Encoder::kMlp || parsed.global_state || parsed.sde || parsed.core != CoreKind::kNone ||
             parsed.value_norm ||
             parsed.layout.activation != Activation::kTanh || parsed.layout.layer_norm ||
             parsed.has_encoder_script()) {
    return Status::InvalidArgument(fmt::format(
        "{}: the policy has encoder {} and {}{}, a {} trunk{}{}; this caller can only rebuild a tanh mlp policy "
        "without a global state or sde",
        source, EncoderName(parsed.encoder), parsed.global_state ? "a global state" : "no global state",
        std::string(parsed.sde ? ", with sde" : "") + (parsed.value_norm ? ", with value normalisation" : ""),
        ActivationName(parsed.layout.activation),
        parsed.layout.layer_norm ? " with layer norm" : "",
        parsed.has_encoder_script() ? ", a TorchScript encoder" : ""));
  }
  return Status::Ok();
}

}  // namespace farm
