// policy_spec.json, the file beside a run's checkpoints that says how to rebuild its policy (spaces, widths,
// encoder, global state): written when the learner creates the policy, read by LoadPolicy, farm-eval,
// farm-export and a serving learner.
//
// Threading: free functions, no state.
#pragma once

#include <string>
#include <vector>

#include "common/space.h"
#include "common/status.h"
#include "learner/model/policy.h"

namespace farm {

// policy_spec.json: what ActorCritic's constructor needs, written by the
// learner when it creates the policy:
//   {"observation": SPACE, "action": SPACE, "hidden_sizes": [64, 64],
//    "encoder": "mlp"|"cnn"|"conv"|"impala", "global_state": SPACE|null, "sde": true (only when set),
//    "core": "gru"|"lstm", "core_size": N, "critic_core": true|false (the three only with a core),
//    "conv": [{"channels", "kernel", "stride", "padding"}, ...] (encoder conv only),
//    "impala_channels": [16, 32, 32] (encoder impala only), "activation": "relu"|"elu"|"silu" (absent: tanh),
//    "layer_norm": true (absent: false),
//    "actor_encoder_script": "actor_encoder.pt", "critic_encoder_script": "critic_encoder.pt" (a TorchScript
//    encoder's file, relative to the spec's directory: ppo.*_encoder_script; absent: the built-in encoder)}
//   SPACE = {"kind": "discrete"|"multi_discrete"|"box", "shape": [..], "n": N,
//            "nvec": [..] (multi_discrete only), "low": [..], "high": [..]}
// A box's low/high hold numel() numbers each (n is 0); a discrete space has
// shape/low/high empty and n > 0; a multi_discrete one has shape [K], K nvec
// entries > 0, n 0 and low/high empty. JSON has no infinities: a non-finite bound is
// written as the string "inf", "-inf" or "nan". "global_state" is the
// centralised critic's input (null: the critic reads the observation); files
// without "encoder" or "global_state" (older runs) mean mlp and null; "sde"
// (state-dependent exploration: a [last hidden width, action] log-std, box
// actions only) is absent when false.
std::string PolicySpecJson(const Space& obs, const Space& action, const std::vector<int>& hidden,
                           const PolicyOptions& options = {});

// Parses PolicySpecJson's text; `source` (a file name) prefixes every error,
// which names the offending key and what was expected. With `options` null, a
// spec whose encoder or global state is not the default is an error (the
// caller could not rebuild that policy).
Status ParsePolicySpecJson(const std::string& text, const std::string& source, Space* obs, Space* action,
                           std::vector<int>* hidden, PolicyOptions* options = nullptr);

}  // namespace farm
