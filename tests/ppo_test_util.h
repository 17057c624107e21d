// Helpers shared by the tests that train policies and hold update paths or encoders to each other (ppo_fused_test,
// ppo_graph_test, vtrace_test, encoder_test, scripted_encoder_test).
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <vector>

#include "learner/model/policy.h"
#include "learner/train/ppo.h"

namespace farm::testing {

// A rollout of `steps` x `envs` rows acted by `net` on `obs` [steps * envs, obs...] (and `states` [steps * envs,
// state...] when its critic takes them), so that the first ratios are 1; random rewards, dones (10%) and
// bootstrap values from the default CPU generator. Every tensor on the CPU; `net` acts on `device`.
// `states`: [steps * envs / k, state...], one per run of k rows (an env's agents), or undefined.
inline Rollout ActedRollout(ActorCritic& net, const torch::Tensor& obs, const torch::Tensor& states, int64_t steps,
                            int64_t envs, torch::Device device = torch::kCPU, int64_t k = 1) {
  c10::InferenceMode inference;
  const ActOutput act = net->Act(obs.to(device), states.defined() ? states.to(device) : states);
  const auto shaped = [&](const torch::Tensor& rows, int64_t columns) {
    std::vector<int64_t> shape{steps, columns};
    shape.insert(shape.end(), rows.sizes().begin() + 1, rows.sizes().end());
    return rows.reshape(shape).cpu();
  };
  Rollout r;
  r.obs = shaped(obs, envs);
  if (states.defined()) {
    r.states = shaped(states, envs / k);
    r.rows_per_state = k;
  }
  r.actions = act.action.dim() == 1 ? act.action.reshape({steps, envs}).cpu() : shaped(act.action, envs);
  r.logp = act.logp.reshape({steps, envs}).cpu();
  r.values = act.value.reshape({steps, envs}).cpu();
  r.rewards = torch::randn({steps, envs});
  r.dones = (torch::rand({steps, envs}) < 0.1).to(torch::kFloat32);
  r.last_value = torch::randn({envs});
  return r;
}

// Every parameter of `policy`, flattened and concatenated in order (a copy).
inline torch::Tensor FlatParameters(ActorCritic& policy) {
  std::vector<torch::Tensor> flat;
  for (const auto& p : policy->parameters()) flat.push_back(p.detach().flatten().clone());
  return torch::cat(flat);
}

// max |a - b| / max(max |b|, 1): relative to the tensor's scale, absolute for tensors near zero.
inline double RelativeDiff(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = std::max(b.abs().max().item<double>(), 1.0);
  return (a - b).abs().max().item<double>() / scale;
}

}  // namespace farm::testing
