// The learner's inference thread, serving: a batch's dispatch, admitting requests, the forward pass and the
// replies, parking, handing full rollouts to the trainer and taking its results.
#include "common/non_finite.h"
#include "learner/learner_impl.h"

namespace farm {
using namespace learner_internal;

namespace {

// Recording: copies a request's observations and global states into the store, where RecordStep will want them
// once the request's step results are in, in the same pass as the non-finite scan over them, and scans the other
// fields. True when every value is finite and both were copied (RecordStep then copies the rest); false when the
// store has no place for them yet (no arena since the last hand-off, or a full group) or a value is not finite:
// the request then goes through AdmitNonFinite as any, and RecordStep copies everything, as before.
bool CopyInputsAhead(TrajectoryStore& store, const WorkerState& ws, const wire::StepRequest& req) {
  const TrajectoryStore::StepInputs in = store.NextStepInputs(ws.store_group[req.group()], req.first() ? 0 : 1);
  if (in.obs == nullptr || (in.states != nullptr) != req.has_global_state()) return false;
  NonFinite first;
  return CopyUntilNonFinite(req.obs().data(), in.obs) < 0 &&
         (in.states == nullptr || CopyUntilNonFinite(req.global_state().data(), in.states) < 0) &&
         !FindNonFiniteBesidesObsAndState(req, &first);
}

}  // namespace

// ---------------------------------------------------------------- requests

void Learner::Impl::OnStep(Work& w, std::vector<Work*>* steps) {
  PhaseTimer timer(stats, Phase::kAdmit);
  WorkerState* ws = registry.Find(w.identity);
  if (ws == nullptr) {
    ReplyError(w.identity, "StepRequest from a worker that never said hello (or was dropped as silent)",
               &w.msg.step(), wire::Error::UNKNOWN_WORKER);
    return;
  }
  const auto& req = w.msg.step();
  if (auto s = registry.CheckStep(*ws, req); !s.ok()) return ReplyError(w.identity, s.message(), &req);
  if (req.has_stats_delta())
    if (auto s = normalizer.Merge(req.stats_delta()); !s.ok()) return ReplyError(w.identity, s.message(), &req);
  int64_t sanitized = 0;
  // On the CPU the observations and states are read once: scanned and copied into the store together (or, when
  // that cannot be, scanned here and copied at serve). On CUDA they are copied into the store while the device
  // computes the batch's forward (RecordInputs), which hides the copy: on the H200 host, copying them here made
  // admission slower by more than the copy (records/performance-history.md, "The multi-agent map workload at
  // scale", runs 4 and 5).
  w.inputs_recorded = recording && !device.is_cuda() && collector.has_store() &&
                      CopyInputsAhead(collector.store(), *ws, req);
  if (!w.inputs_recorded) {
    if (auto s = registry.AdmitNonFinite(*ws, w.msg.mutable_step(), &sanitized); !s.ok()) {
      ++stats.non_finite_rejected;
      return ReplyError(w.identity, s.message(), &req);
    }
  }
  stats.non_finite_sanitized += sanitized;
  WorkerRegistry::Accept(*ws, req);
  if (!req.first()) ConsumeOutcome(*ws, req);
  steps->push_back(&w);
}

void Learner::Impl::ConsumeOutcome(const WorkerState& ws, const wire::StepRequest& req) {
  if (recording)
    collector.store().RecordOutcome(ws.store_group[req.group()],
                                    reinterpret_cast<const float*>(req.reward().data().data()),
                                    reinterpret_cast<const uint8_t*>(req.terminated().data()),
                                    reinterpret_cast<const uint8_t*>(req.truncated().data()));
  // Env steps, not agent rows: what users compare (agent_steps = env_steps x agents).
  stats.CountSteps(ws.group_envs);
  for (const auto& ep : req.episodes()) stats.window.Add(ep.episode_return(), ep.length());
  if (eval && eval->counts(ws.identity) && req.episodes_size() > 0) CountEvalEpisodes(ws, req);
  if (!stats.solved_at_steps && config.target_return && stats.window.full() &&
      stats.window.mean_return() >= *config.target_return) {
    stats.solved_at_steps = stats.env_steps;
    stats.solved_at_seconds = stats.Wall();
    stats.solved_at_unix = UnixNow();
    spdlog::info("target {} reached: mean return {:.1f} over 100 episodes at {} steps, {:.1f} s",
                 *config.target_return, stats.window.mean_return(), stats.env_steps, *stats.solved_at_seconds);
  }
}

// The evaluation's episodes in this step: episodes() lists them in env order, one per env that ended (a flag on
// every one of its agent rows: a row flagged alone is an agent that finished before its env, StepRequest.active).
void Learner::Impl::CountEvalEpisodes(const WorkerState& ws, const wire::StepRequest& req) {
  const int agents = ws.group_envs > 0 ? ws.group_rows / ws.group_envs : 1;
  const auto* terminated = reinterpret_cast<const uint8_t*>(req.terminated().data());
  const auto* truncated = reinterpret_cast<const uint8_t*>(req.truncated().data());
  int next = 0;
  for (int e = 0; e < ws.group_envs && next < req.episodes_size(); ++e) {
    bool ended = true;
    for (int a = 0; a < agents && ended; ++a) ended = terminated[e * agents + a] || truncated[e * agents + a];
    if (!ended) continue;
    const auto& ep = req.episodes(next++);
    const int env = static_cast<int>(req.group()) * ws.group_envs + e;
    if (auto s = eval->Add(env, ep.episode_return(), ep.length()); !s.ok()) {
      FailServing("learner.eval_episodes: " + s.message());
      return;
    }
  }
}

// One forward pass over every request's observations (and the final observations of truncated envs), then
// record, park or reply. On CUDA the observations go into the store while the device computes the forward.
void Learner::Impl::ServeSteps(std::vector<Work*>& steps) {
  const int64_t rows = Acting::Rows(steps);
  {
    PhaseTimer timer(stats, Phase::kGather);
    ActivityScope busy(inference, "gathering the batch");
    acting->Gather(steps, rows);
  }
  {
    PhaseTimer timer(stats, Phase::kForward);
    ActivityScope busy(inference, "the forward pass");
    acting->Launch(rows);
  }
  // Decided once for the batch, before the forward's results: which requests are parked and which recorded.
  const bool hold = collector.Hold(trainer_busy(), registry.size(), outcome.stopping);
  {
    PhaseTimer timer(stats, Phase::kServe);
    ActivityScope busy(inference, "recording the batch's observations");
    RecordInputs(steps, hold);
  }
  Acting::Output out;
  {
    PhaseTimer timer(stats, Phase::kForward);
    ActivityScope busy(inference, "the forward pass");
    out = acting->Finish();
  }
  stats.AddForwardDetail(out.wait_seconds, out.device_seconds);
  ++stats.batches;
  stats.batch_rows += rows;
  PhaseTimer timer(stats, Phase::kServe);
  ActivityScope busy(inference, "recording steps and replying");
  Respond(steps, out, hold);
}

// The observations of the requests that Respond will record (not parked: requests not held for an update, their
// group's rollout not full), into the store.
void Learner::Impl::RecordInputs(const std::vector<Work*>& steps, bool hold) {
  if (!recording || hold) return;
  TrajectoryStore& store = collector.store();
  for (const Work* w : steps) {
    const WorkerState& ws = *registry.Find(w->identity);  // steps come from admitted workers only
    const auto& req = w->msg.step();
    const int g = ws.store_group[req.group()];
    if (store.full(g)) continue;
    // Already in place when admission copied them in its non-finite scan (w->inputs_recorded).
    store.RecordInputs(g, reinterpret_cast<const float*>(req.obs().data().data()),
                       req.has_global_state() ? reinterpret_cast<const float*>(req.global_state().data().data())
                                              : nullptr,
                       w->inputs_recorded,
                       req.active().empty() ? nullptr : reinterpret_cast<const uint8_t*>(req.active().data()));
  }
}

void Learner::Impl::Respond(std::vector<Work*>& steps, const Acting::Output& out, bool hold) {
  const Space& action = registry.run().action;
  const int64_t action_numel = action.numel();
  const std::size_t action_bytes = action.is_categorical() ? sizeof(int64_t) : sizeof(float);
  const auto* act_ptr = static_cast<const uint8_t*>(out.action.data_ptr());
  const float* logp_ptr = out.logp.data_ptr<float>();
  const float* value_ptr = out.value.data_ptr<float>();
  TrajectoryStore* store = collector.has_store() ? &collector.store() : nullptr;

  int64_t row = 0;
  int64_t final_row = 0;
  for (const Work* w : steps) final_row += w->rows;
  wire::Envelope reply_msg;
  for (Work* w : steps) {
    const int64_t rows = w->rows;
    WorkerState& ws = *registry.Find(w->identity);  // steps come from admitted workers only
    const auto& req = w->msg.step();
    const int g = ws.store_group[req.group()];
    // Truncated envs: add gamma * V(final obs) (V(final global state) for a centralised critic) to the reward of
    // their last step.
    for (int32_t i : req.final_obs_index()) {
      if (recording && config.ppo.bootstrap_truncated && w->kind == Work::Kind::kStep)
        store->AddReward(g, i, static_cast<float>(config.ppo.gamma) * value_ptr[final_row]);
      ++final_row;
    }
    if (recording && store->full(g)) {
      store->SetBootstrap(g, value_ptr + row);
      collector.Park(std::move(*w));
    } else if (hold) {
      collector.Park(std::move(*w));
    } else {
      // The observations went in at admission or before the forward's results (RecordInputs).
      if (recording)
        store->RecordOutputs(g, act_ptr + row * action_numel * static_cast<int64_t>(action_bytes), logp_ptr + row,
                             value_ptr + row, stats.version, acting->CoreInput(row));
      acting->CommitCoreState(*w, out, row);  // with a recurrent core: the rows' states advance
      WorkerRegistry::MarkActed(ws, req.group());
      auto* a = reply_msg.mutable_action();
      acting->EncodeReply(req, out, row, rows, stats.version, a);
      // A request that brought a statistics delta gets the merged statistics back (about once per rollout).
      if (req.has_stats_delta() && normalizer.any()) {
        normalizer.Fill(a->mutable_normalizer());
      } else {
        a->clear_normalizer();
      }
      Reply(w->identity, reply_msg);
    }
    row += rows;
  }
}

// ---------------------------------------------------------------- the batch loop

void Learner::Impl::ProcessBatch(std::vector<Work>& batch) {
  std::vector<Work*> steps;
  steps.reserve(batch.size());
  const int64_t replaced_before = stats.workers_replaced;
  for (Work& w : batch) {
    switch (w.kind) {
      case Work::Kind::kHello:
        OnHello(w);
        break;
      case Work::Kind::kStop:
        if (!outcome.stopping) {
          outcome.stopping = true;
          outcome.stop_reason = RequestedStopReason();
        }
        break;
      case Work::Kind::kTrainerDone:
        OnTrainerDone(*w.result);
        break;
      case Work::Kind::kCheckpointDone:
        for (const auto& r : trainer->TakeCheckpointResults()) NoteCheckpoint(r.status, r.name);
        break;
      case Work::Kind::kHeartbeat: {
        // The I/O thread answers admitted workers' heartbeats itself; this one's worker was not admitted when it
        // arrived (it may have been since, in this batch).
        PhaseTimer timer(stats, Phase::kAdmit);
        if (!registry.Find(w.identity)) {
          ReplyError(w.identity, "Heartbeat from a worker that never said hello (or was dropped as silent)", nullptr,
                     wire::Error::UNKNOWN_WORKER);
          break;
        }
        wire::Envelope beat;
        beat.mutable_heartbeat();
        Reply(w.identity, beat);
        break;
      }
      case Work::Kind::kStep:
        OnStep(w, &steps);
        break;
      case Work::Kind::kReplay:
        if (registry.Find(w.identity)) steps.push_back(&w);  // else its worker was dropped meanwhile
        break;
    }
  }
  // A Hello that replaced a worker's older connection (OnHello) dropped that connection's state: its requests taken
  // earlier in this batch are not served (the worker has moved on to its new connection).
  if (stats.workers_replaced != replaced_before)
    steps.erase(std::remove_if(steps.begin(), steps.end(), [&](const Work* w) { return !registry.Find(w->identity); }),
                steps.end());
  if (!steps.empty()) ServeSteps(steps);
  {
    PhaseTimer timer(stats, Phase::kHandoff);
    MaybeHandOff();
  }
  CheckStop();
  PhaseTimer timer(stats, Phase::kReport);
  UpdateReadyHint();
  ShowProgress(false);
}

int64_t Learner::Impl::PreemptedLength() {
  int64_t length = 0;
  const bool can_cut = recording && collector.has_store() && !trainer_busy() && !outcome.stopping;
  const int chunk_steps = config.ppo.core != "none" ? config.ppo.chunk_steps() : 1;
  if (auto s = ranks->PreemptedLength(can_cut, collector.has_store() ? &collector.store() : nullptr, chunk_steps,
                                      &length);
      !s.ok()) {
    spdlog::error("{}", s.message());
    if (outcome.rank_failure.ok()) outcome.rank_failure = s;
    outcome.stop_reason = s.message();
    outcome.stopping = true;
    return 0;
  }
  return length;
}

RankLocal Learner::Impl::Local() const {
  RankLocal l;
  l.env_steps = stats.env_steps;
  l.handoff_env_steps = update.handoff_env_steps;
  l.workers = static_cast<int64_t>(registry.size());
  l.wall_seconds = stats.Wall();
  l.store = collector.has_store() ? &collector.store() : nullptr;
  return l;
}

void Learner::Impl::MaybeHandOff() {
  int64_t length = 0;  // a full rollout
  if (!collector.CanHandOff(trainer_busy(), outcome.stopping)) {
    length = PreemptedLength();
    if (length == 0) return;
  } else {
    ranks->OnFullRollout();
  }
  ActivityScope busy(inference, "taking a rollout for the trainer");
  const RunSpec& spec = registry.run();
  TrainJob job;
  LagStats lag;
  const std::vector<int64_t> state_shape =
      spec.global_state && acting->policy()->has_global_state() ? spec.global_state->shape : std::vector<int64_t>{};
  job.rollout = collector.store().Take(spec.observation.shape, stats.version, &lag, state_shape, length);
  if (state_shape.empty()) {
    job.rollout.states = torch::Tensor();  // a critic on the observation (init_from) trains without states
    job.rollout.rows_per_state = 1;        // units of one row: minibatches need not keep an env's agents
  }
  stats.AddLag(lag);
  // The schedule's progress when this rollout began (CleanRL: frac = 1 - (update - 1) / updates): the first update
  // runs at the full learning rate and the last one at lr / updates, not at 0.
  job.progress = std::min(1.0, static_cast<double>(update.handoff_env_steps) / static_cast<double>(config.total_env_steps));
  // Ranks: the trainer takes the schedule's progress from every rank's (the agreement), the same on all of them.
  ranks->PrepareJob(Local(), normalizer, &job);
  update.handoff_env_steps = stats.env_steps;
  job.version = stats.version;
  job.checkpoint = writes_checkpoints() && config.learner.checkpoint_every > 0 &&
                   (stats.updates + 1) % config.learner.checkpoint_every == 0;
  job.counters =
      TrainingCounters{stats.env_steps, stats.updates + 1, stats.version + 1, stats.window.total_episodes(), stats.Wall()};
  if (job.checkpoint) job.state = CaptureRunState();
  update.submitted_at = Clock::now();
  trainer->Submit(std::move(job));
  // async: keep acting with the current snapshot while the trainer works.
  if (config.mode == "async") ReleaseParked();
}

void Learner::Impl::ReleaseParked() {
  std::vector<Work> parked = collector.TakeParked();
  for (auto it = parked.rbegin(); it != parked.rend(); ++it)
    if (!batcher.PushFront(std::move(*it)).ok()) break;
}

void Learner::Impl::SubmitVote() {
  TrainJob job = ranks->Vote(Local(), !outcome.serve_failure.ok() || outcome.update_failed, normalizer);
  job.version = stats.version;
  update.submitted_at = Clock::now();
  trainer->Submit(std::move(job));
}

bool Learner::Impl::OnAgreement(const TrainResult& r) {
  const RankVerdict v = ranks->OnResult(r, normalizer, outcome.stopping);
  if (!v.rank_failure.ok() && outcome.rank_failure.ok()) outcome.rank_failure = v.rank_failure;
  if (v.stop) {
    if (!outcome.stopping || v.override_reason) outcome.stop_reason = v.reason;
    outcome.stopping = true;
  }
  return v.updated;
}

void Learner::Impl::OnTrainerDone(const TrainResult& r) {
  if (!OnAgreement(r)) {
    // A vote, or an update the ranks skipped to stop: nothing trained.
    trainer->Done();
    if (config.mode == "sync") ReleaseParked();
    return;
  }
  trainer->Done();
  ++stats.updates;
  stats.update_seconds_total += r.update_seconds;
  stats.last_update_seconds = r.update_seconds;
  stats.last_ppo = r.stats;
  if (const auto report = critic_watch.Observe(stats.updates, r.stats))
    spdlog::log(report->warning ? spdlog::level::warn : spdlog::level::info, "{}", report->text);
  if (collector.has_store())
    if (const auto report = critic_watch.ObserveScale(stats.updates, r.stats, collector.store().max_abs_reward(),
                                                      config.ppo.gamma))
      spdlog::warn("{}", report->text);
  stats.lag_dropped_total += r.stats.lag_dropped;
  stats.masked_rows_total += r.stats.masked_rows;
  update.path = r.update_path;
  update.graphed = r.graphed_updates;
  {
    PhaseTimer timer(stats, Phase::kHandoff);
    ActivityScope busy(inference, "copying the new weights into the acting policy");
    trainer->CopyWeightsTo(*acting->policy());
  }
  stats.version = r.version;
  if (r.cancelled)
    spdlog::info("update {} cut short by the stop ({} epoch(s) begun of {})", stats.updates, r.stats.epochs,
                 config.ppo.update_epochs);
  {
    PhaseTimer timer(stats, Phase::kReport);
    ActivityScope busy(inference, "writing metrics");
    const RunStats::Outside o = Outside();
    if (auto s = reporting.metrics.Write(stats.MetricsRow(o)); !s.ok()) NoteWriteError(s);
    reporting.tensorboard->AddScalars(stats.TensorBoardScalars(o), stats.env_steps, UnixNow());
    if (auto s = reporting.tensorboard->Flush(); !s.ok()) NoteWriteError(s);
  }
  if (r.checkpoint_due && !r.checkpoint.ok()) NoteCheckpoint(r.checkpoint, "of update " + std::to_string(stats.updates));
  if (r.failed) {
    outcome.stopping = true;
    outcome.update_failed = true;
    outcome.update_error = r.error;
    outcome.stop_reason = r.error.empty() ? "the PPO update failed (non-finite loss or parameters)"
                                          : "the PPO update failed: " + r.error;
  }
  PhaseTimer timer(stats, Phase::kHandoff);
  // Requests held for this update (sync), or a full rollout waiting for the trainer (async).
  if (collector.store().all_full()) {
    MaybeHandOff();
  } else if (config.mode == "sync") {
    ReleaseParked();
  }
}

void Learner::Impl::UpdateReadyHint() {
  // Every group not parked may be waiting in the queue: once all of them are, nobody else can arrive, so the
  // batch goes at once.
  const int active = registry.total_groups() - static_cast<int>(collector.parked());
  batcher.SetReadyItems(static_cast<std::size_t>(std::max(active, 1)));
}

// A row of metrics.jsonl or TensorBoard that could not be written: counted, said at most once per
// kLogRateInterval with the count since.
void Learner::Impl::NoteWriteError(const Status& s) {
  ++reporting.write_errors;
  if (const auto d = reporting.error_log.Allow("write"); d.log)
    spdlog::warn("{} (training goes on; {} write error(s) so far){}", s.message(), reporting.write_errors,
                 LogRateLimiter::Suffix(d));
}

// How a periodic checkpoint went. A failure is logged with the file and the OS's reason, and counted; after
// learner.max_failed_checkpoints in a row (0: never) the run stops in order rather than train on with nothing
// saved. The previous checkpoints are kept.
void Learner::Impl::NoteCheckpoint(const Status& s, const std::string& which) {
  if (s.ok()) {
    reporting.failed_checkpoints_in_a_row = 0;
    return;
  }
  ++reporting.checkpoints_failed;
  ++reporting.failed_checkpoints_in_a_row;
  const int limit = config.learner.max_failed_checkpoints;
  spdlog::error("checkpoint {} not written: {} ({} in a row; the previous checkpoints are kept{})", which,
                s.message(), reporting.failed_checkpoints_in_a_row,
                limit > 0 ? fmt::format("; the run stops after {} in a row, learner.max_failed_checkpoints", limit)
                          : std::string());
  if (limit > 0 && reporting.failed_checkpoints_in_a_row >= limit && !outcome.stopping) {
    reporting.stopped_for_checkpoints = true;
    RequestStop(fmt::format("{} checkpoints in a row could not be written (learner.max_failed_checkpoints); the last: "
                            "{}",
                            reporting.failed_checkpoints_in_a_row, s.message()));
  }
}

}  // namespace farm
