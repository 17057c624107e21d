// The learner's inference thread, workers coming and going: Hellos (the first builds the run), --resume's
// counters and run state, the run state a checkpoint captures, and dropping silent workers.
#include "learner/learner_impl.h"

#include "common/resources.h"

namespace farm {
using namespace learner_internal;
namespace {

// A network's TorchScript encoder (ppo.*_encoder_script: the first module of its encoder), or null.
const ScriptedEncoderImpl* ScriptedEncoderOf(const torch::nn::Sequential& encoder) {
  return encoder && !encoder->is_empty() ? encoder->ptr(0)->as<ScriptedEncoderImpl>() : nullptr;
}

}  // namespace

// ---------------------------------------------------------------- Hellos

void Learner::Impl::OnHello(Work& w) {
  PhaseTimer timer(stats, Phase::kAdmit);
  const wire::Hello& h = w.msg.hello();
  wire::Envelope reply_msg;
  auto* welcome = reply_msg.mutable_welcome();
  auto refuse = [&](const std::string& why) {
    ++stats.errors;
    if (const auto d = reporting.error_log.Allow("refused " + w.identity); d.log)
      spdlog::warn("refused {}: {}{}", w.identity, why, LogRateLimiter::Suffix(d));
    welcome->set_accepted(false);
    welcome->set_error(why);
    Reply(w.identity, reply_msg);
  };
  Handshake hs;
  if (auto s = registry.CheckHello(w.identity, h, normalizer.options(), &hs); !s.ok()) return refuse(s.message());
  if (outcome.stopping) return refuse("the learner is stopping");
  // A worker process connecting again (WorkerConnection): its newest connection is the one it uses. A Hello of an
  // older connection than one admitted is an attempt the worker has given up on (queued while the learner did not
  // answer: stopped, or starved); older admitted connections went with the worker's old socket and are dropped as
  // replaced, not lost.
  const int64_t connection = WorkerConnection::Of(w.identity).connection;
  std::vector<std::string> replaced;
  for (const auto& other : registry.OtherConnections(w.identity)) {
    if (WorkerConnection::Of(other).connection > connection) {
      spdlog::info("ignored a Hello from {}: that worker has connected again since, as {}", w.identity, other);
      return;
    }
    replaced.push_back(other);
  }
  for (const auto& old : replaced)
    RemoveWorker(old, "it connected again as " + w.identity, Departure::kReplaced);
  const bool first = !registry.has_run();
  if (first) {
    ActivityScope busy(inference, "building the run from the first Hello (policy, CUDA graphs, warm-up, resume)");
    // Where a Python worker found the env's code: recorded in config.yaml (by ApplyResume's write when resuming,
    // below otherwise), so that eval and --resume find it from the run directory alone.
    const bool found_here = !h.env_source().empty() && h.env_source() != config.env.python_found;
    if (found_here) run_dir->RecordPythonFound(h.env_source());
    if (!BuildRunFrom(h, hs, refuse)) return;
    if (found_here && !config.learner.resume) {
      if (auto s = run_dir->WriteConfig(config); !s.ok()) spdlog::error("{}", s.message());
      spdlog::info("env.python found at {} (recorded in {})", h.env_source(), run_dir->file("config.yaml"));
    }
  }
  // The store grows by this worker's rows: the run with it must fit the memory budget (learner/run/memory_budget.h).
  // (The first Hello's check is BuildRunFrom's, before it writes anything.)
  if (!first) {
    if (auto s = CheckMemoryWith(static_cast<int64_t>(hs.num_groups) * hs.group_rows, "the run with worker " + w.identity);
        !s.ok())
      return refuse(s.message());
  }
  std::vector<int> groups;
  for (uint32_t g = 0; g < hs.num_groups; ++g) groups.push_back(collector.store().AddGroup(static_cast<int>(hs.group_rows)));
  const WorkerState& admitted = registry.Add(w.identity, hs, std::move(groups));
  if (eval && eval->SetWorker(w.identity, admitted.group_envs * static_cast<int>(admitted.store_group.size())))
    spdlog::info("evaluating {} episodes on the {} envs of {}", eval->episodes(),
                 admitted.group_envs * static_cast<int>(admitted.store_group.size()), w.identity);
  liveness.Admit(w.identity, Clock::now());
  ++stats.workers_joined;
  if (connection > 0) ++stats.rejoins;
  stats.last_join_seconds = stats.ProcessWall();
  welcome->set_accepted(true);
  welcome->set_policy_version(static_cast<uint64_t>(stats.version));
  welcome->set_heartbeat_interval_s(config.transport.heartbeat_interval_s);
  welcome->set_heartbeat_timeout_s(config.transport.heartbeat_timeout_s);
  if (normalizer.any()) normalizer.Fill(welcome->mutable_normalizer());  // a rejoin, a resume, a served policy
  Reply(w.identity, reply_msg);
  spdlog::info("worker {} joined: {} envs in {} groups ({} workers, {} agent rows)", w.identity, h.num_envs(),
               h.num_groups(), registry.size(), collector.store().num_rows());
  if (static_cast<int>(registry.size()) == config.learner.min_workers) ReleaseParked();
}

bool Learner::Impl::BuildRunFrom(const wire::Hello& h, const Handshake& hs,
                                 const std::function<void(const std::string&)>& refuse) {
  ResolveMemoryBudgets();
  RunParts parts;
  bool fatal = false;
  if (auto s = BuildRun(config, device, precision, acting_precision, h, hs, &normalizer, &parts, &fatal); !s.ok()) {
    if (fatal) FailStart(s.message());
    refuse(config.learner.resume && fatal && s.message().rfind("resume failed: ", 0) == 0
               ? "the learner could not resume: " + s.message().substr(15)
               : s.message());
    return false;
  }
  // Alone, a OneRankReducer; one rank of several, every minibatch's gradient averaged over the ranks
  // (learner/train/ppo.h SetReducer).
  try {
    parts.trainer->SetReducer(ranks->MakeReducer(config.learner.rank_check_every));
  } catch (const std::invalid_argument& e) {
    FailStart(e.what());
    refuse(e.what());
    return false;
  }
  const RunSpec spec = parts.spec;
  const bool use_state = parts.options.global_state.has_value();
  const int64_t core_numel = recording && parts.options.core != CoreKind::kNone ? parts.acting->core_state_size() : 0;
  collector.CreateStore(spec.observation.numel(), spec.action, use_state ? parts.options.global_state->numel() : 0,
                        static_cast<int>(spec.num_agents), core_numel);
  memory_inputs.parameters = 0;
  for (const auto& p : parts.acting->parameters()) memory_inputs.parameters += p.numel();
  memory_inputs.bytes_per_row_step = collector.store().bytes_per_row_step();
  // Per network, what its encoder holds for the backward pass and its largest convolution workspace. A TorchScript
  // encoder's activations are what autograd recorded on its probe batches (ScriptedEncoderImpl); its convolution
  // workspace is not known here.
  const Space& critic_input = use_state ? *parts.options.global_state : spec.observation;
  const auto encoder_floats = [&](bool actor, bool workspace) -> int64_t {
    const Space& input = actor ? spec.observation : critic_input;
    const torch::nn::Sequential encoder = actor ? parts.acting->actor_encoder() : parts.acting->critic_encoder();
    if (const auto* scripted = ScriptedEncoderOf(encoder)) return workspace ? 0 : scripted->activation_floats();
    return workspace ? ImageEncoderWorkspaceFloats(parts.options.encoder, parts.options.layout, input)
                     : ImageEncoderFloats(parts.options.encoder, parts.options.layout, input);
  };
  // Each network's forward, the actor's per agent row and the critic's per row or, with a global state, per state
  // of `num_agents` rows (memory_budget.h).
  const bool cores = parts.options.core != CoreKind::kNone;
  const int64_t core_floats =
      cores ? CoreActivationFloats(parts.options.core == CoreKind::kLstm ? 4 : 3, parts.options.core_size) : 0;
  const int64_t actor_floats = NetworkActivationFloats(parts.hidden, spec.action.head_size(), encoder_floats(true, false),
                                                       parts.options.layout.layer_norm) +
                               core_floats;
  const int64_t critic_floats =
      NetworkActivationFloats(parts.hidden, 1, encoder_floats(false, false), parts.options.layout.layer_norm) +
      (parts.options.critic_core ? core_floats : 0);
  const int64_t actor_inputs = spec.observation.numel() + encoder_floats(true, true);
  const int64_t critic_inputs = (use_state ? critic_input.numel() : 0) + encoder_floats(false, true);
  memory_inputs.rows_per_state = use_state ? spec.num_agents : 1;
  memory_inputs.activation_floats_per_row = actor_floats + (use_state ? 0 : critic_floats);
  memory_inputs.activation_floats_per_state = use_state ? critic_floats : 0;
  memory_inputs.minibatch_floats_per_row = actor_inputs + (use_state ? 0 : critic_inputs);
  memory_inputs.minibatch_floats_per_state = use_state ? critic_inputs : 0;
  if (cores) memory_inputs.core_state_floats = parts.acting->core_state_size();
  // The inference thread's and the trainer thread's arenas make the run's tensors.
  memory_inputs.allocator_kept = 2 * FreedMemoryKeptPerArena();
  // Before anything is written (a resume's config.yaml, policy_spec.json): a run that cannot fit leaves the run
  // directory as it was, and stops in order since no worker could join it.
  if (auto s = CheckMemoryWith(static_cast<int64_t>(hs.num_groups) * hs.group_rows, "the run"); !s.ok()) {
    FailStart(s.message());
    refuse(s.message());
    return false;
  }
  acting = std::make_unique<Acting>(config, device, acting_precision, spec.observation, spec.action, parts.options.global_state,
                                    spec.num_agents, parts.acting, std::move(parts.graphed), recording);
  acting->WarmUp();
  if (parts.resumed) ApplyResume(*parts.resumed, *parts.trainer);
  // The encoder scripts beside the spec that names them (policy_spec.h), for farm-eval, farm-export and serving.
  for (const EncoderScript& script :
       EncoderScripts(parts.options.actor_encoder_script, parts.options.critic_encoder_script))
    if (!script.path.empty())
      if (auto s = CopyEncoderScript(script.path, run_dir->file(script.run_file)); !s.ok())
        spdlog::error("{}", s.message());
  if (auto s = WriteFileAtomic(run_dir->file("policy_spec.json"),
                               PolicySpecJson(spec.observation, spec.action, parts.hidden, parts.options));
      !s.ok())
    spdlog::error("{}", s.message());  // eval/export will say the file is missing; training goes on
  trainer = std::make_unique<TrainerThread>(config, device, run_dir->checkpoints(), parts.training,
                                            std::move(parts.trainer), [this](std::shared_ptr<TrainResult> r) {
                                              Work done;
                                              done.kind = Work::Kind::kTrainerDone;
                                              done.result = std::move(r);
                                              (void)batcher.PushFront(std::move(done));  // closed: shutting down
                                            },
                                            [this] {
                                              Work done;
                                              done.kind = Work::Kind::kCheckpointDone;
                                              // Closed: shutting down; Run drains the writer's outcomes.
                                              (void)batcher.PushFront(std::move(done));
                                            });
  update.path = trainer->update_path();
  registry.SetRun(spec);
  stats.set_num_agents(spec.num_agents);
  // The encoders as they are: a TorchScript one named by its file and its features.
  const auto encoder_text = [&](const torch::nn::Sequential& encoder) -> std::string {
    if (const auto* scripted = ScriptedEncoderOf(encoder))
      return fmt::format("TorchScript {} ({} features)", scripted->path(), scripted->features());
    return EncoderName(parts.options.encoder);
  };
  // With a core, how far back the update's gradients reach: a dependency longer than a chunk cannot be learned.
  std::string memory;
  if (cores)
    memory = fmt::format("; a {} core of {} units{}: gradients reach back at most {} steps (ppo.bptt{})",
                         CoreName(parts.options.core), parts.options.core_size,
                         parts.options.critic_core ? " in the actor and in the critic" : " in the actor",
                         config.ppo.chunk_steps(),
                         config.ppo.bptt > 0 ? fmt::format(" {}", config.ppo.bptt)
                                             : fmt::format(" 0: the whole rollout of {}", config.ppo.rollout_length));
  spdlog::info("env {}: observation {}, action {}, {} agent(s) per env, global state {}; policy on {} (actor "
               "encoder {}, critic encoder {} on {}){}",
               spec.env_name, spec.observation.ToString(), spec.action.ToString(), spec.num_agents,
               spec.global_state ? spec.global_state->ToString() : std::string("none"), device.str(),
               encoder_text(parts.acting->actor_encoder()), encoder_text(parts.acting->critic_encoder()),
               use_state ? "the global state" : "the observation", memory);
  return true;
}

// The run's expected memory with `added_rows` more agent rows in the store, against the budget (only while
// recording: serving keeps no store). `what` names the run or the joining worker in the refusal.
// At the first Hello, before the run is built: what the process holds then (LibTorch, the sockets and their
// threads) is not room, and what the run will hold (policies, optimizer, a resumed checkpoint) is the estimate's
// to count, not the measurement's.
void Learner::Impl::ResolveMemoryBudgets() {
  rss_before_run_mb = CurrentRssMb();
  if (!recording || config.learner.memory_budget_mb < 0) return;
  const auto limit = DetectMemoryLimit();
  // Under RLIMIT_AS, the threads the run starts later reserve address space too: the trainer, the checkpoint
  // writer, and the trainer's own OpenMP team.
  memory_budget = ResolveMemoryBudget(config.learner.memory_budget_mb, limit, limit ? ProcessMemoryUsed(*limit) : 0,
                                      config.learner.threads + 1);
  if (memory_budget)
    spdlog::info("memory budget for the run: {:.1f} MiB ({})", static_cast<double>(memory_budget->bytes) / (1 << 20),
                 memory_budget->source);
  if (const auto free = CudaFreeBytes(device))
    gpu_budget = MemoryBudget{*free, fmt::format("{} free at the first Hello", device.str())};
}

Status Learner::Impl::CheckMemoryWith(int64_t added_rows, const std::string& what) {
  if (!recording) return Status::Ok();
  const bool first = !registry.has_run();
  RunMemoryInputs in = memory_inputs;
  in.rows = collector.store().num_rows() + added_rows;
  const RunMemory need = EstimateRunMemory(in, config.ppo, config.mode == "async", device.is_cuda());
  if (first)
    spdlog::info("expected memory with the first worker: {}, on top of the {:.1f} MiB the learner holds before the run",
                 need.Describe(), rss_before_run_mb);
  return CheckRunMemory(need, memory_budget, what, gpu_budget);
}

// Continues run_dir from the checkpoint BuildRun loaded: counters (env steps, updates, policy version, episodes,
// wall time) and run state (random generators, episode window, when the target was reached, the normaliser).
// What an older checkpoint lacks starts afresh, with a warning.
void Learner::Impl::RestoreProgress(const TrainingCounters& c, const RunState& state) {
  // The checkpoint counts the run's env steps; with ranks each takes its share, so that they add up to it again.
  stats.env_steps = ranks->ResumedEnvSteps(c.env_steps);
  update.handoff_env_steps = stats.env_steps;  // the schedule goes on from here
  stats.updates = c.updates;
  stats.version = c.policy_version;
  stats.set_wall_offset(c.wall_seconds);
  stats.window.Restore(state.episode_returns, state.episode_lengths, c.episodes);
  stats.solved_at_steps = state.solved_at_steps;
  stats.solved_at_seconds = state.solved_at_seconds;
  stats.solved_at_unix = state.solved_at_unix;
  stats.run_lag = {};
  stats.lag_dropped_total = 0;
  if (state.has_policy_lag) {
    LagStats lag;
    lag.counts = state.lag_counts;
    stats.AddLag(lag);
    stats.lag_dropped_total = state.lag_dropped;
  }
  critic_watch = CriticWatch();
  if (state.has_critic_watch)
    if (auto s = critic_watch.Restore({state.critic_constant_updates, state.critic_reported_at}); !s.ok())
      spdlog::warn("resume: {}; the critic watch starts afresh", s.message());
}

void Learner::Impl::ApplyResume(const RunParts::Resumed& r, PpoTrainer& ppo) {
  const TrainingCounters& c = r.counters;
  const RunState& state = r.state;
  RestoreProgress(c, state);
  normalizer.Restore(state, r.path);
  std::vector<std::string> missing = state.missing;
  auto restore = [&](const char* name, torch::Generator generator) {
    const auto it = state.rng.find(name);
    if (it == state.rng.end()) {
      if (!state.missing.empty() && state.missing.front().rfind("rng", 0) == 0) return;  // all of rng is missing
      missing.push_back(fmt::format("rng.{}", name));
      return;
    }
    if (auto s = SetGeneratorState(generator, it->second, name); !s.ok())
      spdlog::warn("resume: {}; it continues from the seed instead", s.message());
  };
  restore(kRngTrainer, ppo.generator());
  restore(kRngRandomActions, acting->random_generator());
  restore(kRngTorchCpu, at::detail::getDefaultCPUGenerator());
#ifdef FARM_WITH_CUDA
  if (device.is_cuda()) restore(kRngTorchCuda, at::globalContext().defaultGenerator(device));
#endif
  if (!missing.empty())
    spdlog::warn("resume: {} has no {} (written by an older version): {}", r.path, fmt::join(missing, ", "),
                 "those start afresh (generators from the seed, an empty window)");
  if (!state.config_yaml.empty()) {
    try {
      const auto changes = ConfigChanges(state.config_yaml, DumpConfig(config));
      if (!changes.empty())
        spdlog::info("resume: config keys changed since the checkpoint: {}", fmt::join(changes, "; "));
    } catch (const YAML::Exception& e) {
      spdlog::warn("resume: {}: the stored config is not valid YAML ({}); not compared", r.path, e.what());
    }
  }
  spdlog::info("resumed {}: {} env steps, {} updates, policy version {}, {} episodes (window of {}, mean return "
               "{}), {:.1f} s of wall time before",
               r.path, stats.env_steps, stats.updates, stats.version, stats.window.total_episodes(),
               stats.window.count(),
               stats.window.empty() ? std::string("-") : fmt::format("{:.2f}", stats.window.mean_return()),
               c.wall_seconds);
  // Only now that the checkpoint has loaded: the run's config with this session's overrides.
  if (auto s = run_dir->WriteConfig(config); !s.ok()) spdlog::error("{}", s.message());
}

// Everything but weights, optimizer and counters that a checkpoint needs to continue exactly (the trainer adds
// its generator's state).
RunState Learner::Impl::CaptureRunState() {
  RunState s;
  s.rng[kRngRandomActions] = GeneratorState(acting->random_generator());
  torch::Generator cpu = at::detail::getDefaultCPUGenerator();
  s.rng[kRngTorchCpu] = GeneratorState(cpu);
#ifdef FARM_WITH_CUDA
  if (device.is_cuda()) {
    torch::Generator cuda = at::globalContext().defaultGenerator(device);
    s.rng[kRngTorchCuda] = GeneratorState(cuda);
  }
#endif
  s.has_episode_window = true;
  s.episode_returns = stats.window.returns();
  s.episode_lengths = stats.window.lengths();
  s.solved_at_steps = stats.solved_at_steps;
  s.solved_at_seconds = stats.solved_at_seconds;
  s.solved_at_unix = stats.solved_at_unix;
  s.config_yaml = DumpConfig(config);
  normalizer.Capture(&s);
  s.has_policy_lag = true;
  s.lag_counts = stats.run_lag.counts;
  s.lag_dropped = stats.lag_dropped_total;
  s.has_critic_watch = true;
  const CriticWatch::State watch = critic_watch.state();
  s.critic_constant_updates = watch.constant_updates;
  s.critic_reported_at = watch.reported_at;
  return s;
}

void Learner::Impl::CheckWorkers() {
  const auto now = Clock::now();
  if (Seconds(now - reporting.last_worker_check) < 0.5 * config.transport.heartbeat_interval_s) return;
  reporting.last_worker_check = now;
  PhaseTimer timer(stats, Phase::kReport);
  const auto silent = liveness.SilentFor(config.transport.heartbeat_timeout_s, now);
  for (const auto& id : silent)
    RemoveWorker(id,
                 fmt::format("silent for more than {} s (transport.heartbeat_timeout_s: no message of it reached "
                             "the learner)",
                             config.transport.heartbeat_timeout_s),
                 Departure::kLost);
  if (silent.empty()) return;
  MaybeHandOff();  // without them, the rollout may be full
  UpdateReadyHint();
}

// Forgets a worker: its partial trajectories leave the rollout, its held requests are dropped, and the others go
// on. The caller hands the rollout off if it is now full (MaybeHandOff): not in the middle of a batch, whose
// requests taken so far are served first.
void Learner::Impl::RemoveWorker(const std::string& identity, const std::string& why, Departure departure) {
  liveness.Forget(identity);
  const std::optional<WorkerState> ws = registry.Remove(identity);
  if (!ws) return;
  for (int g : ws->store_group) collector.store().RemoveGroup(g);
  collector.DropParked(identity);
  if (acting) acting->DropCoreStates(identity);
  if (departure == Departure::kLost) {
    ++stats.workers_lost;
    spdlog::warn("dropped worker {}: {}; {} workers left", identity, why, registry.size());
  } else {
    ++stats.workers_replaced;
    spdlog::info("dropped worker {}: {}", identity, why);
  }
}

}  // namespace farm
