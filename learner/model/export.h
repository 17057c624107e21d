// TorchScript export of a trained policy's deterministic actor, for serving
// without this code base (Python: torch.jit.load(path)(obs)).
#pragma once

#include <string>

#include "common/running_stats.h"
#include "common/status.h"
#include "learner/model/policy.h"

namespace farm {

// Saves a torch::jit::Module "FarmPolicy" to `path` (temp file, fsync,
// rename). Its forward(obs) takes a tensor [B, obs_shape...] (any real dtype;
// converted to float32) and returns the deterministic action:
//   discrete: int64 [B], the argmax of the actor's logits (= Act(obs, true));
//   multi-discrete: int64 [B, K], the argmax of each component's logits;
//   box:      float32 [B, action_shape...], the actor's mean clamped to the
//             space's bounds (registered as buffers "low" and "high").
// The module's forward applies the actor's own layers, in order, written out in
// TorchScript: the encoder's (an image encoder, learner/model/encoder.h: conv,
// max-pool, IMPALA residual blocks, flatten; and with a core the trunk) as
// parameters enc<i>_w, enc<i>_b; a TorchScript encoder (ppo.actor_encoder_script) is a submodule enc<i> (a CPU
// float32 copy of the trained script, called on obs [B, shape...]); then the actor's trunk and head as
// actor<i>_w, actor<i>_b (Linear, LayerNorm), with the policy's activations
// between them and none after the head (all copied to the CPU as float32).
// The critic (and with it any global state) is not exported: the module acts
// on an agent's own observation.
// With `normalize` (a run with env.normalize_obs), forward first applies it to
// the raw observation, as the workers do: clamp((obs - obs_mean) / obs_std,
// -clip, clip), with buffers "obs_mean" and "obs_std" (float32, one entry per
// observation element), so that raw observations go in and actions come out.
// With a recurrent core (ppo.core, any encoder): forward(obs, state) returns
// (action, next_state), the state float32 [B, S] of the actor's core (S =
// core_size for gru, 2 * core_size for lstm: h then c; the critic's is not
// exported), and initial_state(batch) gives the zeros that start every
// episode. The core's weights are core_wih, core_whh, core_bih, core_bhh
// (torch.nn.GRUCell's and LSTMCell's gate layout), between the encoder and the
// head.
Status ExportTorchScript(ActorCriticImpl& policy, const std::string& path, const ObsTransform* normalize = nullptr);

}  // namespace farm
