// Finding a parameter's state in torch::optim::Adam across LibTorch versions.
#pragma once

#include <torch/torch.h>

#include <sstream>
#include <string>
#include <type_traits>

namespace farm {

// The key of a parameter's entry in Optimizer::state(): LibTorch 1.x keys it by the TensorImpl address
// printed as a string (c10::guts::to_string), 2.x by the address itself. Chosen by the map's key type (a
// template, so that only this version's branch is compiled).
template <class StateMap>
typename StateMap::key_type AdamStateKey(const StateMap& /*state*/, const torch::Tensor& param) {
  using Key = typename StateMap::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream out;
    out << param.unsafeGetTensorImpl();
    return out.str();
  } else {
    return static_cast<Key>(param.unsafeGetTensorImpl());
  }
}

// Adam's state for `param`, or nullptr when it has none yet (Adam creates it on the first step).
inline torch::optim::AdamParamState* FindAdamState(torch::optim::Adam& optimizer, const torch::Tensor& param) {
  auto& state = optimizer.state();
  const auto it = state.find(AdamStateKey(state, param));
  if (it == state.end() || !it->second) return nullptr;
  return dynamic_cast<torch::optim::AdamParamState*>(it->second.get());
}

}  // namespace farm
