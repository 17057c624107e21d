// Checkpoints: policy, optimizer, counters and (optionally) the fp16 loss
// scaler's state and the run state that --resume continues from (random
// generators, episode window, config text) in one LibTorch archive, written
// atomically (temp file, fsync, rename). Also the run's policy_spec.json (the
// spaces and widths that rebuild the ActorCritic) and LoadPolicy, which
// rebuilds a run's latest policy for the tools (farm-eval, farm-export).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "common/config.h"
#include "common/running_stats.h"
#include "common/space.h"
#include "common/status.h"
#include "learner/run/checkpoint_files.h"
#include "learner/model/amp.h"
#include "learner/model/policy.h"
#include "learner/model/policy_spec.h"

namespace farm {

struct TrainingCounters {
  int64_t env_steps = 0;
  int64_t updates = 0;
  int64_t policy_version = 0;
  int64_t episodes = 0;
  double wall_seconds = 0;
};

// What a run needs besides weights, optimizer and counters to continue where
// a checkpoint left it: the random generators' states, the 100-episode window,
// when the target was first reached, and the config that produced it.
struct RunState {
  // Generator name -> Generator::get_state() (uint8, CPU). The learner's names: kRngTrainer,
  // kRngRandomActions, kRngTorchCpu, kRngTorchCuda.
  std::map<std::string, torch::Tensor> rng;
  bool has_episode_window = false;
  std::vector<double> episode_returns;  // the window, oldest first
  std::vector<int64_t> episode_lengths;
  std::optional<int64_t> solved_at_steps;  // first time the 100-episode mean reached target_return
  std::optional<double> solved_at_seconds;
  std::optional<double> solved_at_unix;
  std::string config_yaml;  // the run's resolved config (DumpConfig); empty: not stored
  // env.normalize_obs / normalize_reward: the run's merged statistics (moments of 0 elements for what is off),
  // stored under "normalizer". A checkpoint without one loads with has_normalizer false (not in `missing`).
  bool has_normalizer = false;
  RunningMoments normalizer_obs;
  RunningMoments normalizer_ret;
  // The run's policy lag so far (summary.json's policy_lag_mean, _p95_run, _max_run), as samples per lag, and the
  // samples ppo.max_policy_lag left out; stored under "policy_lag". Without it (older checkpoints) has_policy_lag
  // is false (not in `missing`): those figures start afresh.
  bool has_policy_lag = false;
  std::map<int64_t, int64_t> lag_counts;
  int64_t lag_dropped = 0;
  // The critic watch (learner/train/critic_watch.h): constant updates in a row, and the update whose warning
  // stands, as of the update before the checkpoint's (a periodic checkpoint's state is taken as its update
  // starts); stored under "critic_watch". Without it (older checkpoints) has_critic_watch is false (not in
  // `missing`): the watch starts afresh.
  bool has_critic_watch = false;
  int64_t critic_constant_updates = 0;
  std::optional<int64_t> critic_reported_at;
  // Filled by LoadCheckpoint: what the checkpoint lacks (written by an older version), e.g. "rng.trainer".
  std::vector<std::string> missing;
};

inline constexpr const char* kRngTrainer = "trainer";                // PpoTrainer's minibatch shuffling
inline constexpr const char* kRngRandomActions = "random_actions";  // the learner's learner.random_actions
inline constexpr const char* kRngTorchCpu = "torch_cpu";            // LibTorch's default CPU generator (sampling)
inline constexpr const char* kRngTorchCuda = "torch_cuda";          // the learner device's default CUDA generator

// A generator's state, taken under its lock (a copy: later draws do not change it).
torch::Tensor GeneratorState(torch::Generator& generator);
// Sets a generator's state from GeneratorState's tensor; `what` names it in errors.
Status SetGeneratorState(torch::Generator& generator, const torch::Tensor& state, const std::string& what);

// Writes dir/ckpt-<updates>.pt (temp file, fsync, rename), its CRC32C in
// ckpt-<updates>.pt.crc32c, and points dir/latest at it. A non-null `scaler`
// is stored under "loss_scaler", a non-null `state` under "rng",
// "episode_window", "solved_at" and "config_yaml". keep > 0: only the newest
// `keep` remain.
Status SaveCheckpoint(const std::string& dir, ActorCritic& policy, torch::optim::Optimizer& optimizer,
                      const TrainingCounters& counters, std::string* written_path = nullptr,
                      const LossScaler* scaler = nullptr, int keep = 0, const RunState* state = nullptr);

// SaveCheckpoint in two steps, so that the disk can be left to another thread (learner/run/checkpoint_writer.h):
// SerializeCheckpoint reads the policy and optimizer into memory (needs them idle; no file is touched), and
// WriteCheckpoint writes those bytes as SaveCheckpoint does (checksum, `latest`, pruning to `keep`).
struct CheckpointBytes {
  std::string name;  // ckpt-<updates>.pt
  std::string data;
};
Status SerializeCheckpoint(ActorCritic& policy, torch::optim::Optimizer& optimizer, const TrainingCounters& counters,
                           const LossScaler* scaler, const RunState* state, CheckpointBytes* out);
Status WriteCheckpoint(const std::string& dir, const CheckpointBytes& bytes, int keep, std::string* written_path);

// Loads a checkpoint written by SaveCheckpoint into `policy` and `optimizer`
// (same architecture) and `counters`. A non-null `scaler` gets the stored
// "loss_scaler" state; a checkpoint without one (older, or saved without a
// scaler) leaves `scaler` as it is. A non-null `state` gets what the
// checkpoint holds of a RunState; the entries it lacks (an older version
// wrote it) are listed in state->missing, not an error.
Status LoadCheckpoint(const std::string& path, ActorCritic& policy, torch::optim::Optimizer* optimizer,
                      TrainingCounters* counters, LossScaler* scaler = nullptr, RunState* state = nullptr);

// The counters and run state of the checkpoint at `path`, without its policy or optimizer: a resumed learner's
// figures from its start, before the first worker's Hello builds the policy. Generator states are read on the CPU.
Status ReadCheckpointProgress(const std::string& path, TrainingCounters* counters, RunState* state);
// The normaliser statistics stored in a checkpoint ("normalizer"); NotFound when it holds none (written
// before checkpoints stored them). Reads nothing else.
Status ReadCheckpointNormalizer(const std::string& path, RunningMoments* obs, RunningMoments* ret);

// For the tools (farm-eval, farm-export): with config.env.normalize_obs, the observation transform of the
// checkpoint at `path` (its statistics, config.env.obs_clip) for observations of `obs_numel` elements;
// nullopt without. An error names the checkpoint and what it lacks.
Status LoadObsTransform(const FarmConfig& config, const std::string& path, int64_t obs_numel,
                        std::optional<ObsTransform>* out);

// Rebuilds a run's latest policy on the CPU: reads run_dir/config.yaml into
// `config`, run_dir/policy_spec.json (spaces, widths, encoder, global state),
// and the checkpoint named by
// run_dir/checkpoints/latest (its counters into `counters`, its weights into a
// new `policy`; the optimizer state is skipped). Errors name the missing or
// corrupt file and what was expected. `checkpoint_path` (optional) receives the
// checkpoint's path. `counters` may be null.
Status LoadPolicy(const std::string& run_dir, ActorCritic* policy, FarmConfig* config, TrainingCounters* counters,
                  std::string* checkpoint_path = nullptr);

}  // namespace farm
