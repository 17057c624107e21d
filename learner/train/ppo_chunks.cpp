// Chunks of bptt steps for the recurrent update, and a minibatch's loss over them.
#include "learner/train/ppo_chunks.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace farm {

torch::Tensor PickColumns(const torch::Tensor& t, const torch::Tensor& columns) {
  return t.index_select(1, columns).flatten(0, 1);
}

torch::Tensor ToChunks(const torch::Tensor& t, int64_t L, torch::Device device) {
  const int64_t T = t.size(0);
  std::vector<int64_t> split{T / L, L};
  std::vector<int64_t> merged{L, (T / L) * t.size(1)};
  for (int64_t d = 1; d < t.dim(); ++d) split.push_back(t.size(d));
  for (int64_t d = 2; d < t.dim(); ++d) merged.push_back(t.size(d));
  return t.detach().reshape(split).transpose(0, 1).reshape(merged).to(device);
}

torch::Tensor FromChunks(const torch::Tensor& chunked, int64_t T) {
  const int64_t L = chunked.size(0);
  const int64_t N = chunked.size(1) / (T / L);
  std::vector<int64_t> split{L, T / L, N};
  std::vector<int64_t> merged{T, N};
  for (int64_t d = 2; d < chunked.dim(); ++d) {
    split.push_back(chunked.size(d));
    merged.push_back(chunked.size(d));
  }
  return chunked.reshape(split).transpose(0, 1).reshape(merged);
}

PpoChunks MakeChunks(const Rollout& rollout, const Advantages& gae, torch::Device device) {
  const int64_t T = rollout.rewards.size(0);
  const int64_t N = rollout.rewards.size(1);
  const int64_t L = rollout.bptt;
  if (!rollout.core_states.defined() || L <= 0 || T % L != 0)
    throw std::invalid_argument("PpoTrainer::Update: the policy has a recurrent core, but the rollout has no core "
                                "states in chunks that divide its " + std::to_string(T) + " steps (bptt " +
                                std::to_string(L) + ")");
  if (rollout.core_states.dim() != 3 || rollout.core_states.size(0) != T / L || rollout.core_states.size(1) != N)
    throw std::invalid_argument("PpoTrainer::Update: core_states must be [" + std::to_string(T / L) + ", " +
                                std::to_string(N) + ", core state], got " + c10::str(rollout.core_states.sizes()));
  PpoChunks c;
  c.steps = L;
  c.columns = (T / L) * N;
  c.obs = ToChunks(rollout.obs, L, device);
  if (rollout.states.defined()) c.states = ToChunks(rollout.states, L, device);
  c.actions = ToChunks(rollout.actions, L, device);
  c.logp = ToChunks(rollout.logp, L, device).to(torch::kFloat32);
  c.values = ToChunks(rollout.values, L, device).to(torch::kFloat32);
  c.advantages = ToChunks(gae.advantages, L, device);
  c.returns = ToChunks(gae.returns, L, device);
  // An episode starts at step t when step t - 1 ended one. At a chunk's first step the stored state already is
  // zero for such a row (acting reset it), so zeroing it again changes nothing; the one exception, an agent that
  // finished alone without terminating (BootstrapFinishedAgents' done), has only left-out rows after it.
  const torch::Tensor dones = rollout.dones.detach().to(torch::kFloat32);
  const torch::Tensor starts = torch::cat({torch::zeros({1, N}, dones.options()), dones.narrow(0, 0, T - 1)});
  c.starts = ToChunks(starts, L, device);
  if (rollout.active.defined()) c.active = ToChunks(rollout.active, L, device).to(torch::kFloat32);
  c.core0 = rollout.core_states.detach().reshape({c.columns, rollout.core_states.size(2)}).to(device);
  return c;
}

EvalOutput EvaluateChunkUnits(ActorCriticImpl& policy, const PpoChunks& chunks, const torch::Tensor& unit_idx,
                              const torch::Tensor& column_idx, Precision precision) {
  EvalOutput eval;
  {
    AutocastGuard autocast(chunks.obs.device(), precision);
    const torch::Tensor states = chunks.states.defined() ? PickColumns(chunks.states, unit_idx) : torch::Tensor();
    eval = policy.EvaluateSequence(PickColumns(chunks.obs, column_idx), states, PickColumns(chunks.actions, column_idx),
                                   chunks.core0.index_select(0, column_idx), chunks.starts.index_select(1, column_idx));
  }
  eval.logp = eval.logp.to(torch::kFloat32);
  eval.value = eval.value.to(torch::kFloat32);
  eval.entropy = eval.entropy.to(torch::kFloat32);
  return eval;
}

std::pair<torch::Tensor, torch::Tensor> EvaluateChunks(ActorCriticImpl& policy, const PpoChunks& chunks, int64_t k,
                                                       Precision precision) {
  torch::NoGradGuard no_grad;
  const int64_t units = chunks.columns / k;
  const int64_t per_slice = std::max<int64_t>(1, 16384 / (k * chunks.steps));  // about 16k steps at a time
  const auto opts = torch::TensorOptions().dtype(torch::kLong).device(chunks.obs.device());
  const torch::Tensor arange_k = torch::arange(k, opts);
  std::vector<torch::Tensor> logps, values;
  for (int64_t u0 = 0; u0 < units; u0 += per_slice) {
    const torch::Tensor unit_idx = torch::arange(u0, std::min(units, u0 + per_slice), opts);
    const EvalOutput eval =
        EvaluateChunkUnits(policy, chunks, unit_idx, UnitRows(unit_idx, k, arange_k), precision);
    logps.push_back(eval.logp.view({chunks.steps, -1}));
    values.push_back(eval.value.view({chunks.steps, -1}));
  }
  return {torch::cat(logps, 1), torch::cat(values, 1)};
}

PpoLoss ChunkMinibatchLoss(ActorCriticImpl& policy, const PpoChunks& chunks, const torch::Tensor& unit_idx, int64_t k,
                           const torch::Tensor& arange_k, Precision precision, const PpoConfig& config) {
  const torch::Tensor idx = UnitRows(unit_idx, k, arange_k);
  EvalOutput eval = EvaluateChunkUnits(policy, chunks, unit_idx, idx, precision);
  eval.value = policy.NormalizedValue(eval.value);  // ppo.value_norm: the head's scale (unchanged without)
  return ComputePpoLoss(eval, PickColumns(chunks.logp, idx), PickColumns(chunks.values, idx),
                        PickColumns(chunks.advantages, idx), PickColumns(chunks.returns, idx), config,
                        chunks.active.defined() ? PickColumns(chunks.active, idx) : torch::Tensor());
}

}  // namespace farm
