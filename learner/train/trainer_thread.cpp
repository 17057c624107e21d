// The trainer thread: PPO updates and checkpoints.
#include "learner/train/trainer_thread.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>

#include "common/seconds.h"
#include "learner/model/cuda_graph.h"
#include "learner/model/device.h"
#include "learner/run/error_text.h"
#include "learner/train/critic_watch.h"

namespace farm {
namespace {
// FARM_TEST_SLOW_CHECKPOINT_MS=N: every checkpoint write waits N ms first (a slow disk, for tests and benchmarks).
std::function<void()> SlowDiskForTests() {
  const char* v = std::getenv("FARM_TEST_SLOW_CHECKPOINT_MS");
  const long ms = v ? std::strtol(v, nullptr, 10) : 0;
  if (ms <= 0) return {};
  spdlog::warn("FARM_TEST_SLOW_CHECKPOINT_MS={}: every checkpoint write waits {} ms (a simulated slow disk)", ms, ms);
  return [ms] { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); };
}

}  // namespace

TrainerThread::TrainerThread(const FarmConfig& config, torch::Device device, std::string checkpoint_dir,
                             ActorCritic training, std::unique_ptr<PpoTrainer> trainer,
                             std::function<void(std::shared_ptr<TrainResult>)> on_done,
                             std::function<void()> on_checkpoint_written)
    : config_(config),
      device_(device),
      checkpoint_dir_(std::move(checkpoint_dir)),
      training_(std::move(training)),
      trainer_(std::move(trainer)),
      on_done_(std::move(on_done)),
      writer_(checkpoint_dir_, config.learner.keep_checkpoints, std::move(on_checkpoint_written),
              SlowDiskForTests()) {
  thread_ = std::thread([this] { Loop(); });
}

TrainerThread::~TrainerThread() {
  cancel_.store(true);
  jobs_.Close();
  if (thread_.joinable()) thread_.join();
}

void TrainerThread::Submit(TrainJob job) {
  busy_ = true;
  cancel_.store(false);
  if (!jobs_.Send(std::move(job)).ok()) busy_ = false;  // closed: shutting down
}

bool TrainerThread::ParametersFinite() {
  torch::NoGradGuard no_grad;
  for (const auto& p : training_->parameters())
    if (!torch::isfinite(p).all().item<bool>()) return false;
  return true;
}

void TrainerThread::CopyWeightsTo(ActorCriticImpl& acting) {
  torch::NoGradGuard no_grad;
  acting.CopyFrom(*training_);
  // The trainer may start its next update (on its own stream) as soon as the next hand-off: the copies must
  // have read the training weights by then.
  SynchronizeCurrentStream(device_);
}

Status TrainerThread::FinalCheckpoint(const TrainingCounters& counters, RunState state, std::string* path) {
  state.rng[kRngTrainer] = GeneratorState(trainer_->generator());  // idle: no update in flight
  CheckpointBytes bytes;
  if (auto s = SerializeCheckpoint(training_, trainer_->optimizer(), counters, &trainer_->scaler(), &state, &bytes);
      !s.ok())
    return s;
  return writer_.WriteNow(std::move(bytes), path);  // after the periodic one being written, if any
}

std::string TrainerThread::update_path() const {
  return trainer_->last_update_path();
}

int64_t TrainerThread::graphed_updates() const { return trainer_->graphed_updates(); }

bool TrainerThread::AgreeWithRanks(RankGroup& group, TrainJob* job, TrainResult* result) {
  try {
    const RankAgreement a = Agree(group, job->figures);
    result->agreed = true;
    result->agreement = a;
    // The normaliser's statistics stay one set for the run: every rank's deltas since the last exchange.
    result->norm_obs = MergeAcrossRanks(group, job->norm_obs, job->norm_obs_dim);
    result->norm_ret = MergeAcrossRanks(group, job->norm_ret, job->norm_ret_dim);
    if (a.stop != kRankStopNone) {
      result->agreed_stop = fmt::format("rank {} is stopping ({}); the {} ranks stop together", a.first_stopping_rank,
                                        RankStopText(a.ranks[a.first_stopping_rank].stop), group.size());
    } else if (a.env_steps >= static_cast<double>(config_.total_env_steps)) {
      result->agreed_stop = fmt::format("reached total_env_steps ({}) over {} ranks", config_.total_env_steps,
                                        group.size());
    }
    if (job->vote_only || !result->agreed_stop.empty()) {
      result->updated = false;
      return false;
    }
    // The schedule's progress over every rank's env steps when their rollouts began: the same on every rank.
    job->progress = std::min(1.0, a.handoff_env_steps / static_cast<double>(config_.total_env_steps));
    // A checkpoint of this update counts the run's env steps, every rank's (rank 0 writes it; resumed, each rank
    // starts from its share).
    job->counters.env_steps = static_cast<int64_t>(a.env_steps);
    return true;
  } catch (const RankError& e) {
    result->error = e.what();
    result->rank_failed = true;
    result->updated = false;
    return false;
  }
}

void TrainerThread::Loop() {
  // OpenMP's thread count is a per-thread setting: set it here too, not only on the thread that built the run.
  SetCpuThreads(config_.learner.threads);  // LibTorch and OpenBLAS (learner/model/device.h)
  // On CUDA the update runs on its own stream, so that inference kernels need not queue behind it.
  ScopedCudaStream stream(device_);
  TrainJob job;
  while (jobs_.Receive(&job).ok()) {
    auto result = std::make_shared<TrainResult>();
    const auto t0 = std::chrono::steady_clock::now();
    GradientReducer* reducer = trainer_->reducer();
    if (RankGroup* group = reducer->group(); group != nullptr && !AgreeWithRanks(*group, &job, result.get())) {
      // A vote, a stop the ranks agreed on, or a failed collective: no update.
      result->version = job.version;
      job = TrainJob{};
      result->update_seconds = Seconds(std::chrono::steady_clock::now() - t0);
      result->update_path = update_path();
      result->graphed_updates = trainer_->graphed_updates();
      result->traffic = reducer->TakeTraffic();
      result->checksum = reducer->last_checksum();
      on_done_(std::move(result));
      continue;
    }
    try {
      if (device_.is_cuda()) {
        for (auto* t : {&job.rollout.obs, &job.rollout.actions, &job.rollout.logp, &job.rollout.values,
                        &job.rollout.rewards, &job.rollout.dones, &job.rollout.last_value})
          *t = t->to(device_);
        if (job.rollout.states.defined()) job.rollout.states = job.rollout.states.to(device_);
        if (job.rollout.active.defined()) job.rollout.active = job.rollout.active.to(device_);
      }
      result->stats = trainer_->Update(job.rollout, job.progress, &cancel_);
      result->cancelled = result->stats.cancelled;
      if (std::isfinite(result->stats.policy_loss))
        result->stats.critic_saturation = RolloutCriticSaturation(*training_, job.rollout);
      // The inference thread copies the new weights on its own stream once it hears of this result (and an
      // asynchronous CUDA error of the update surfaces here).
      stream.Synchronize();
      // A diverged update (the run stops on it) is never saved: `latest` stays on the last good checkpoint.
      // The parameters are checked only when a checkpoint is due (a device-to-host sync).
      if (std::isfinite(result->stats.policy_loss) && job.checkpoint && !ParametersFinite()) {
        spdlog::error("PPO update {}: non-finite parameters", job.counters.updates);
        result->stats.policy_loss = std::nan("");
      }
      if (job.checkpoint && std::isfinite(result->stats.policy_loss)) {
        job.counters.policy_version = job.version + 1;
        job.state.rng[kRngTrainer] = GeneratorState(trainer_->generator());  // as the next update will find it
        // A failed checkpoint (a full disk, say) is reported to the inference thread, which counts it and stops
        // the run after learner.max_failed_checkpoints in a row; the previous checkpoints stay as they were.
        result->checkpoint_due = true;
        // Serialised here (the weights are this thread's until the result is taken), written by the writer.
        CheckpointBytes bytes;
        result->checkpoint = SerializeCheckpoint(training_, trainer_->optimizer(), job.counters, &trainer_->scaler(),
                                                 &job.state, &bytes);
        if (result->checkpoint.ok()) writer_.Submit(std::move(bytes));
      }
    } catch (const RankError& e) {
      // A collective failed: another rank died or hung. The parameters are finite and every step taken was the
      // ranks' (the run stops; rank 0 writes its final checkpoint).
      result->error = e.what();
      result->rank_failed = true;
    } catch (const std::exception& e) {
      // Any exception is a failed update: the run stops on it, with no checkpoint after it, never by std::terminate.
      result->error = ErrorText(e);
      spdlog::error("PPO update failed: {}", result->error);
      result->stats.policy_loss = std::nan("");
    }
    result->failed = !std::isfinite(result->stats.policy_loss);
    result->traffic = reducer->TakeTraffic();
    result->checksum = reducer->last_checksum();
    // The rollout's arena goes back to the store's pool now, not when the next job arrives: in sync mode the
    // next rollout is recorded into it.
    result->version = job.version + 1;
    job = TrainJob{};
    result->update_seconds = Seconds(std::chrono::steady_clock::now() - t0);
    result->update_path = update_path();
    result->graphed_updates = trainer_->graphed_updates();
    on_done_(std::move(result));
  }
}

}  // namespace farm
