// Chunks of bptt steps for the recurrent update, and a minibatch's loss over them.
#include "learner/train/ppo_chunks.h"

#include <stdexcept>
#include <string>
#include <vector>

namespace farm {
namespace {

// [T, N, rest...] -> [L, C * N, rest...] with column c * N + n = step c * L + l of row n.
torch::Tensor Chunked(const torch::Tensor& t, int64_t L, torch::Device device) {
  const int64_t T = t.size(0);
  std::vector<int64_t> split{T / L, L};
  std::vector<int64_t> merged{L, (T / L) * t.size(1)};
  for (int64_t d = 1; d < t.dim(); ++d) split.push_back(t.size(d));
  for (int64_t d = 2; d < t.dim(); ++d) merged.push_back(t.size(d));
  return t.detach().reshape(split).transpose(0, 1).reshape(merged).to(device);
}

}  // namespace

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
  c.obs = Chunked(rollout.obs, L, device);
  if (rollout.states.defined()) c.states = Chunked(rollout.states, L, device);
  c.actions = Chunked(rollout.actions, L, device);
  c.logp = Chunked(rollout.logp, L, device).to(torch::kFloat32);
  c.values = Chunked(rollout.values, L, device).to(torch::kFloat32);
  c.advantages = Chunked(gae.advantages, L, device);
  c.returns = Chunked(gae.returns, L, device);
  // An episode starts at step t when step t - 1 ended one. At a chunk's first step the stored state already is
  // zero for such a row (acting reset it), so zeroing it again changes nothing.
  const torch::Tensor dones = rollout.dones.detach().to(torch::kFloat32);
  const torch::Tensor starts = torch::cat({torch::zeros({1, N}, dones.options()), dones.narrow(0, 0, T - 1)});
  c.starts = Chunked(starts, L, device);
  c.core0 = rollout.core_states.detach().reshape({c.columns, rollout.core_states.size(2)}).to(device);
  return c;
}

PpoLoss ChunkMinibatchLoss(ActorCriticImpl& policy, const PpoChunks& chunks, const torch::Tensor& unit_idx, int64_t k,
                           const torch::Tensor& arange_k, Precision precision, const PpoConfig& config) {
  const torch::Tensor idx = k == 1 ? unit_idx : (unit_idx.unsqueeze(1) * k + arange_k).flatten();
  // [L, M, ...] -> [L * M, ...]: time-major rows, as EvaluateSequence takes them.
  const auto pick = [&](const torch::Tensor& t, const torch::Tensor& columns) {
    return t.index_select(1, columns).flatten(0, 1);
  };
  AutocastGuard autocast(chunks.obs.device(), precision);
  const torch::Tensor states = chunks.states.defined() ? pick(chunks.states, unit_idx) : torch::Tensor();
  EvalOutput eval = policy.EvaluateSequence(pick(chunks.obs, idx), states, pick(chunks.actions, idx),
                                            chunks.core0.index_select(0, idx), chunks.starts.index_select(1, idx));
  eval.logp = eval.logp.to(torch::kFloat32);
  eval.value = eval.value.to(torch::kFloat32);
  eval.entropy = eval.entropy.to(torch::kFloat32);
  return ComputePpoLoss(eval, pick(chunks.logp, idx), pick(chunks.values, idx), pick(chunks.advantages, idx),
                        pick(chunks.returns, idx), config);
}

}  // namespace farm
