// TorchScript export of a trained policy's deterministic actor, for serving
// without this code base (Python: torch.jit.load(path)(obs)).
#pragma once

#include <string>

#include "common/status.h"
#include "learner/policy.h"

namespace farm {

// Saves a torch::jit::Module "FarmPolicy" to `path` (temp file, fsync,
// rename). Its forward(obs) takes a tensor [B, obs_shape...] (any real dtype;
// converted to float32) and returns the deterministic action:
//   discrete: int64 [B], the argmax of the actor's logits (= Act(obs, true));
//   box:      float32 [B, action_shape...], the actor's mean clamped to the
//             space's bounds (registered as buffers "low" and "high").
// The actor's layers are parameters w0, b0, w1, b1, ... (copied to the CPU as
// float32), applied as tanh(x @ w.T + b) with no tanh after the last layer;
// the critic is not exported.
Status ExportTorchScript(ActorCriticImpl& policy, const std::string& path);

}  // namespace farm
