// The store and the parked requests.
#include "learner/serve/rollout_collector.h"

#include <algorithm>

namespace farm {

void RolloutCollector::CreateStore(int64_t obs_numel, const Space& action, int64_t state_numel, int agents_per_env,
                                   int64_t core_numel) {
  store_ = std::make_unique<TrajectoryStore>(config_.ppo.rollout_length, obs_numel, action, state_numel,
                                             agents_per_env, core_numel, config_.ppo.chunk_steps());
}

void RolloutCollector::DropParked(const std::string& identity) {
  parked_.erase(std::remove_if(parked_.begin(), parked_.end(), [&](const Work& w) { return w.identity == identity; }),
                parked_.end());
}

}  // namespace farm
