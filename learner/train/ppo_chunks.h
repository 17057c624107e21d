// The PPO update's view of a rollout for a policy with a recurrent core: the
// T steps of each row cut into T / bptt chunks of bptt steps, every chunk a
// sequence that the update re-runs through the core from the state the
// acting policy had at its start (TrajectoryStore keeps it), zeroing the
// state where an episode starts inside the chunk. Minibatches are whole
// chunks; with k rows sharing a global state (an env's agents), whole runs of
// k chunks, so that the critic sees each env's state sequence once.
//
// Threading: plain data and free functions.
#pragma once

#include <torch/torch.h>

#include "common/config.h"
#include "learner/model/amp.h"
#include "learner/model/policy.h"
#include "learner/train/ppo_loss.h"
#include "learner/train/rollout.h"

namespace farm {

// Every field is step-major within a chunk: [L, C * N, ...] (L = bptt, C = T / L chunks of N rows; column
// c * N + n is chunk c of row n), on the policy's device.
struct PpoChunks {
  int64_t steps = 0;      // L
  int64_t columns = 0;    // C * N
  torch::Tensor obs;      // [L, C * N, obs...]
  torch::Tensor states;   // [L, C * N / k, state...] (undefined without a global state)
  torch::Tensor actions;  // [L, C * N] or [L, C * N, A]
  torch::Tensor logp, values, advantages, returns;  // [L, C * N]
  torch::Tensor starts;   // [L, C * N] 1 where an episode starts at that step (the previous one ended)
  torch::Tensor core0;    // [C * N, core state]: each chunk's state before its first step
  torch::Tensor active;   // [L, C * N] Rollout::active (undefined: every row acted)
};

// Throws std::invalid_argument when the rollout has no core states or its bptt does not divide T.
PpoChunks MakeChunks(const Rollout& rollout, const Advantages& gae, torch::Device device);

// [T, N, rest...] -> [L, (T / L) * N, rest...] (column c * N + n = step c * L + l of row n), on `device`; and back.
torch::Tensor ToChunks(const torch::Tensor& t, int64_t L, torch::Device device);
torch::Tensor FromChunks(const torch::Tensor& chunked, int64_t T);

// [L, C * N, ...] -> [L * M, ...] for the M columns `columns`: time-major rows, as EvaluateSequence takes them.
torch::Tensor PickColumns(const torch::Tensor& t, const torch::Tensor& columns);

// The policy over the chunk runs `unit_idx` (their columns `column_idx`, from UnitRows), re-run through the
// core from each chunk's stored state: the forward in `precision`, its outputs float32 [L * M]. Both the
// minibatch loss and V-trace's pass at the update's start evaluate chunks through it.
EvalOutput EvaluateChunkUnits(ActorCriticImpl& policy, const PpoChunks& chunks, const torch::Tensor& unit_idx,
                              const torch::Tensor& column_idx, Precision precision);

// The policy's log-probs and values on every step of every chunk (no gradient), float32 [L, C * N] each, run
// over slices of the chunk runs as ChunkMinibatchLoss runs a minibatch.
std::pair<torch::Tensor, torch::Tensor> EvaluateChunks(ActorCriticImpl& policy, const PpoChunks& chunks, int64_t k,
                                                       Precision precision);

// One minibatch's loss over the chunk runs `unit_idx` (unit u: columns u * k .. u * k + k - 1), as MinibatchLoss
// does it for rows.
PpoLoss ChunkMinibatchLoss(ActorCriticImpl& policy, const PpoChunks& chunks, const torch::Tensor& unit_idx, int64_t k,
                           const torch::Tensor& arange_k, Precision precision, const PpoConfig& config);

}  // namespace farm
