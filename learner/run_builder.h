// BuildRun: what the first accepted Hello sizes: the acting and training
// copies of the policy (from learner.init_from's checkpoint when set), the
// CUDA graphs of the acting forward (learner.cuda_graphs), the PPO trainer,
// and, with learner.resume, the latest valid checkpoint loaded into them.
//
// Threading: called on the inference thread, before the trainer thread exists.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "common/wire.h"
#include "learner/model/amp.h"
#include "learner/model/cuda_graph.h"
#include "learner/model/policy.h"
#include "learner/run/checkpoint.h"
#include "learner/run/run_normalizer.h"
#include "learner/serve/worker_registry.h"
#include "learner/train/ppo.h"

namespace farm {

struct RunParts {
  RunSpec spec;
  std::vector<int> hidden;
  PolicyOptions options;  // encoder; global_state set when the critic reads the env's state
  ActorCritic acting{nullptr};    // on the device, in eval mode
  std::unique_ptr<GraphedActor> graphed;
  ActorCritic training{nullptr};  // on the device
  std::unique_ptr<PpoTrainer> trainer;
  // learner.resume: the checkpoint loaded into `training` and the trainer, with what else it held.
  struct Resumed {
    std::string path;
    TrainingCounters counters;
    RunState state;
  };
  std::optional<Resumed> resumed;
};

// Builds the run for the first Hello (already checked into `hs`). A failure is either this worker's alone
// (`*fatal` false: it is refused, the next Hello may build the run) or the run's (`*fatal` true: every worker
// would fail the same way, the run stops). `normalizer` is sized and, with init_from, filled. `precision` trains,
// `acting_precision` acts (the CUDA graphs are captured in it).
Status BuildRun(const FarmConfig& config, torch::Device device, Precision precision, Precision acting_precision,
                const wire::Hello& hello,
                const Handshake& hs, RunNormalizer* normalizer, RunParts* out, bool* fatal);

}  // namespace farm
