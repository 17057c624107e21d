// Acting: the inference half of the learner for one batch of requests. It
// gathers every request's observations (and the final observations of
// truncated envs, and with a centralised critic the global states) into
// preallocated buffers (pinned on CUDA), runs one forward pass of the acting
// policy (eagerly or replayed from CUDA graphs) or draws uniform random
// actions (learner.random_actions), and encodes each request's reply,
// clipping box actions to their bounds. With state-dependent exploration
// (ppo.sde) it draws each env's noise matrix, held for ppo.sde_sample_freq of
// the env's steps: a function of (run seed, worker, group, row, seq /
// sde_sample_freq), so nothing is stored per env. With a recurrent core
// (ppo.core) it gathers every row's state from CoreStates into the batch and
// hands the states after the step back when the request is answered.
//
// Threading: owned by the inference thread.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "common/config.h"
#include "common/space.h"
#include "farm.pb.h"
#include "learner/model/amp.h"
#include "learner/model/cuda_graph.h"
#include "learner/model/policy.h"
#include "learner/serve/core_states.h"
#include "learner/serve/work.h"

namespace farm {

class Acting {
 public:
  // The policy acts for `observation` rows; `state` is the run's global state (and `num_agents` rows share
  // one), used when the policy's critic reads it. `policy` (null with random_actions) lives on `device`.
  Acting(const FarmConfig& config, torch::Device device, Precision precision, const Space& observation,
         const Space& action, const std::optional<Space>& state, uint32_t num_agents, ActorCritic policy,
         std::unique_ptr<GraphedActor> graphed, bool recording);

  // Actions, log-probs and values for a batch: rows are every request's observations in order, then every
  // request's final observations (truncated envs) in order.
  struct Output {
    torch::Tensor action;  // int64 [rows] or [rows, K], float [rows, ...] (unclipped); on the CPU
    torch::Tensor logp;    // float [rows]
    torch::Tensor value;   // float [rows] (zeros when not needed)
    torch::Tensor core_state;  // with a core: float [rows, core state] after the step; on the CPU
    // CUDA: of the forward's wall time, the part spent waiting for the device's results (the one
    // synchronisation), and the device's own time for the batch (CUDA events: copies in, forward, copies out);
    // both 0 on the CPU.
    double wait_seconds = 0;
    double device_seconds = 0;
  };
  // The rows of `steps` (requests and final observations).
  static int64_t Rows(const std::vector<Work*>& steps);
  // Gather copies the batch's inputs into the preallocated buffers (host memory, pinned on CUDA); Launch then
  // queues the forward on them (or draws random actions), and Finish waits for its outputs. On CUDA the thread
  // is free between Launch and Finish while the device computes; on the CPU Launch does all the work. Act is
  // Launch then Finish.
  void Gather(const std::vector<Work*>& steps, int64_t rows);
  void Launch(int64_t rows);
  Output Finish();
  Output Act(int64_t rows) {
    Launch(rows);
    return Finish();
  }

  // One forward pass at the largest batch, so that the first requests do not pay for allocator growth, kernel
  // selection or lazy initialisation; on CUDA (eager) one at every padded batch size, so that cuDNN's benchmark
  // mode times its algorithms for each before the first request rather than during the run.
  void WarmUp();

  // The reply to `req` from rows [row, row + rows) of `out`.
  void EncodeReply(const wire::StepRequest& req, const Output& out, int64_t row, int64_t rows, int64_t version,
                   wire::ActionReply* reply) const;

  ActorCritic& policy() { return policy_; }

  // With a core (null without): every row's state.
  const CoreStates* core_states() const { return core_states_.get(); }
  // The gathered state before the step of the batch's row `row` (Gather's order), [core state] floats; null
  // without a core.
  const float* CoreInput(int64_t row) const;
  // `w` (rows [row, row + w.rows) of `out`) was answered: its rows' states advance.
  void CommitCoreState(const Work& w, const Output& out, int64_t row);
  // A worker is gone: its rows' states are dropped.
  void DropCoreStates(const std::string& identity) {
    if (core_states_) core_states_->Drop(identity);
  }

 private:
  // CUDA's eager forward pads a batch of `units` (rows, or envs) to one of a few sizes.
  static int64_t PaddedRows(int64_t units);
  // The rows that share one global state in the gathered batch: an env's agents when states are gathered
  // (training, or graphs captured with the critic), else 1.
  int64_t RowsPerState() const;
  Output RandomActions(int64_t rows);
  Output Forward(int64_t rows);  // Launch's work: the outputs, on the host once the stream has passed them
  // sde: every request's noise matrices into batch_noise_ (the final observations' and the padding's are zero).
  void GatherSdeNoise(const std::vector<Work*>& steps);

  const FarmConfig config_;
  const torch::Device device_;
  const Precision precision_;
  const Space observation_;
  const Space action_;
  const std::optional<Space> state_;
  const uint32_t num_agents_;
  const bool use_state_;  // the policy's critic reads the global state
  const bool recording_;
  std::vector<int64_t> obs_shape_, state_shape_;
  ActorCritic policy_;
  std::unique_ptr<GraphedActor> graphed_;
  torch::Generator random_gen_;
  torch::Tensor batch_obs_;    // preallocated, grown as needed
  torch::Tensor batch_state_;  // the same for global states
  int64_t padded_rows_ = 0;     // rows of the gathered batch, padding included
  torch::Tensor batch_states_view_;  // the gathered states of the batch (undefined when not needed)
  const bool sde_;                   // the policy samples with held noise matrices (ppo.sde, not deterministic)
  torch::Tensor batch_noise_;        // sde: [rows, latent, action numel] standard normals, preallocated
  std::unique_ptr<CoreStates> core_states_;  // with a core
  torch::Tensor batch_core_;         // with a core: [rows, core state], the states before the step, preallocated
  DeviceSpan span_;                  // CUDA: the device's time for each batch
  Output pending_;                   // launched, not finished
  bool launched_ = false;

 public:
  // learner.random_actions' generator, whose state a checkpoint keeps.
  torch::Generator& random_generator() { return random_gen_; }
};

}  // namespace farm
