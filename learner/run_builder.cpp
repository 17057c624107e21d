// The run the first Hello sizes: policies, graphs, trainer, a resumed checkpoint.
#include "learner/run_builder.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <vector>

namespace farm {

Status BuildRun(const FarmConfig& config, torch::Device device, Precision precision, Precision acting_precision,
                const wire::Hello& h,
                const Handshake& hs, RunNormalizer* normalizer, RunParts* out, bool* fatal) {
  *fatal = false;
  const Space& obs = hs.observation;
  const Space& act = hs.action;
  normalizer->Reset(obs.numel());
  out->hidden = config.ppo.hidden_sizes;
  // MAPPO: the critic reads the env's global state whenever it has one.
  if (auto s = ParseEncoder(config.ppo.encoder, &out->options.encoder); !s.ok())
    return Status::InvalidArgument("ppo." + s.message());
  if (auto s = ParseActivation(config.ppo.activation, &out->options.layout.activation); !s.ok())
    return Status::InvalidArgument("ppo." + s.message());
  out->options.layout.layer_norm = config.ppo.layer_norm;
  out->options.layout.conv.clear();
  for (const ConvLayerConfig& c : config.ppo.conv)
    out->options.layout.conv.push_back({c.channels, c.kernel, c.stride, c.padding});
  out->options.layout.impala_channels.assign(config.ppo.impala_channels.begin(), config.ppo.impala_channels.end());
  out->options.actor_encoder_script = config.ppo.actor_encoder_script;
  out->options.critic_encoder_script = config.ppo.critic_encoder_script;
  out->options.global_state = hs.global_state;
  out->options.log_std_init = config.ppo.log_std_init;
  out->options.sde = config.ppo.sde;
  out->options.value_norm = config.ppo.value_norm != "none";
  if (auto s = ParseCore(config.ppo.core, &out->options.core); !s.ok()) return Status::InvalidArgument("ppo." + s.message());
  out->options.core_size = config.ppo.core_size;
  out->options.critic_core = config.ppo.critic_core;
  out->options.core_timescale = config.ppo.core_init == "chrono" ? config.ppo.chunk_steps() : 0;
  ActorCritic initial{nullptr};
  if (!config.learner.init_from.empty()) {
    FarmConfig saved;
    std::string path;
    if (auto s = LoadPolicy(config.learner.init_from, &initial, &saved, nullptr, &path); !s.ok())
      return Status::InvalidArgument("learner.init_from: " + s.message());
    if (initial->observation_space() != obs || initial->action_space() != act)
      return Status::InvalidArgument(fmt::format(
          "learner.init_from: the policy in {} takes {} and acts in {}, but this worker's env has {} and {}",
          config.learner.init_from, initial->observation_space().ToString(), initial->action_space().ToString(),
          obs.ToString(), act.ToString()));
    if (auto s = normalizer->InitFrom(saved, path); !s.ok()) return Status::InvalidArgument("learner.init_from: " + s.message());
    // The saved architecture: widths, encoder and critic input. A critic on the observation serves (or fine-tunes)
    // an env with a state too, the state checked but unused; a critic on a state needs that state.
    const auto& saved_state = initial->options().global_state;
    if (saved_state && saved_state != hs.global_state)
      return Status::InvalidArgument(fmt::format(
          "learner.init_from: the policy in {} has a critic on the global state {}, but this worker's env has {}",
          config.learner.init_from, saved_state->ToString(),
          hs.global_state ? "global state " + hs.global_state->ToString() : std::string("no global state")));
    out->hidden = initial->hidden_sizes();
    out->options = initial->options();
    // The update's chunks and the acting's states follow the saved core; ValidateConfig checked ppo.bptt only
    // against ppo.core.
    if (out->options.core != CoreKind::kNone && config.learner.train &&
        (config.ppo.bptt > config.ppo.rollout_length || config.ppo.rollout_length % config.ppo.chunk_steps() != 0)) {
      *fatal = true;
      return Status::InvalidArgument(fmt::format(
          "learner.init_from: the policy in {} has a {} core; ppo.bptt ({}) must divide ppo.rollout_length ({})",
          config.learner.init_from, CoreName(out->options.core), config.ppo.bptt, config.ppo.rollout_length));
    }
    spdlog::info("starting from {} (encoder {}, critic on {}{})", path, EncoderName(out->options.encoder),
                 out->options.global_state ? "the global state" : "the observation",
                 out->options.sde ? ", state-dependent exploration" : "");
  }
  try {
    out->acting = ActorCritic(obs, act, out->hidden, out->options);
    out->training = ActorCritic(obs, act, out->hidden, out->options);
  } catch (const std::exception& e) {
    // The config cannot fit this env (e.g. ppo.encoder cnn on a vector observation): every worker would be.
    *fatal = true;
    return Status::InvalidArgument(fmt::format("cannot build the policy: {}", e.what()));
  }
  out->spec = RunSpec{h.env_name(), obs, act, hs.num_agents, hs.global_state};
  if (initial) out->training->CopyFrom(*initial);
  out->acting->CopyFrom(*out->training);
  out->acting->to(device);
  out->training->to(device);
  out->acting->eval();
  if (config.learner.cuda_graphs && !config.learner.random_actions) {
    if (out->options.core != CoreKind::kNone) {  // ValidateConfig's check, for an init_from policy
      *fatal = true;
      return Status::InvalidArgument(fmt::format(
          "learner.cuda_graphs cannot act with a recurrent core (the policy has a {} core); set "
          "learner.cuda_graphs=false",
          CoreName(out->options.core)));
    }
    if (out->options.sde && !config.learner.deterministic) {  // ValidateConfig's check, for an init_from policy
      *fatal = true;
      return Status::InvalidArgument(
          "learner.cuda_graphs cannot act with state-dependent exploration (the policy has sde); set "
          "learner.cuda_graphs=false");
    }
    if (!out->options.actor_encoder_script.empty()) {  // ValidateConfig's check, for an init_from policy
      *fatal = true;
      return Status::InvalidArgument(
          "learner.cuda_graphs does not capture a TorchScript encoder (the policy's actor has one); set "
          "learner.cuda_graphs=false");
    }
    const std::vector<int64_t> state_shape =
        out->options.global_state ? out->options.global_state->shape : std::vector<int64_t>{};
    // One state per env: the graphs' critic runs once per env, as the eager forward's does.
    const int64_t rows_per_state = state_shape.empty() ? 1 : std::max<int64_t>(hs.num_agents, 1);
    if (auto s = GraphedActor::Create(out->acting, device, acting_precision, obs.shape, config.learner.deterministic,
                                      &out->graphed, state_shape, rows_per_state);
        !s.ok()) {
      *fatal = true;
      return s;
    }
  }
  PpoConfig ppo = config.ppo;
  if (initial && out->options.value_norm != (ppo.value_norm != "none")) {
    if (config.learner.train) {
      *fatal = true;
      return Status::InvalidArgument(fmt::format(
          "learner.init_from: the policy in {} was trained {} value normalisation, but ppo.value_norm is {}: set "
          "ppo.value_norm to {}",
          config.learner.init_from, out->options.value_norm ? "with" : "without", ppo.value_norm,
          out->options.value_norm ? "running or popart" : "none"));
    }
    ppo.value_norm = out->options.value_norm ? "running" : "none";  // serving: the saved critic, never trained
  }
  try {
    out->trainer = std::make_unique<PpoTrainer>(out->training, ppo, config.seed, precision);
  } catch (const std::invalid_argument& e) {  // ppo.fused_update on for a policy it cannot train
    *fatal = true;
    return Status::InvalidArgument(e.what());
  }
  if (config.learner.resume) {
    RunParts::Resumed r;
    std::vector<std::string> skipped;
    Status s = FindLatestValidCheckpoint(config.ResumeCheckpoints(), &r.path, &skipped);
    for (const auto& why : skipped) spdlog::warn("resume: skipping {}; using an older checkpoint", why);
    if (s.ok())
      s = LoadCheckpoint(r.path, out->training, &out->trainer->optimizer(), &r.counters, &out->trainer->scaler(),
                         &r.state);
    if (!s.ok()) {
      *fatal = true;
      spdlog::error("resume: {}", s.message());
      return Status::InvalidArgument("resume failed: " + s.message());
    }
    torch::NoGradGuard no_grad;
    out->acting->CopyFrom(*out->training);
    out->resumed = std::move(r);
  }
  return Status::Ok();
}

}  // namespace farm
