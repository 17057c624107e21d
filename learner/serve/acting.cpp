// The forward pass for a batch of requests, and the replies' encoding.
#include "learner/serve/acting.h"

#include <ATen/CPUGeneratorImpl.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>

#include "common/wire.h"

namespace farm {

Acting::Acting(const FarmConfig& config, torch::Device device, Precision precision, const Space& observation,
               const Space& action, const std::optional<Space>& state, uint32_t num_agents, ActorCritic policy,
               std::unique_ptr<GraphedActor> graphed, bool recording)
    : config_(config),
      device_(device),
      precision_(precision),
      observation_(observation),
      action_(action),
      state_(state),
      num_agents_(std::max<uint32_t>(num_agents, 1)),
      use_state_(policy && policy->has_global_state()),
      recording_(recording),
      obs_shape_(observation.shape),
      policy_(std::move(policy)),
      graphed_(std::move(graphed)),
      random_gen_(at::make_generator<at::CPUGeneratorImpl>(config.seed)),
      sde_(policy_ && policy_->options().sde && !config.learner.deterministic && !config.learner.random_actions),
      span_(device) {
  if (use_state_) state_shape_ = policy_->options().global_state->shape;
  // Serving only (not recording) never runs the critic: the actor's part of the state is all there is to keep.
  if (policy_ && policy_->has_core() && !config.learner.random_actions)
    core_states_ = std::make_unique<CoreStates>(recording ? policy_->core_state_size()
                                                          : policy_->actor_core_state_size());
}

const float* Acting::CoreInput(int64_t row) const {
  if (!core_states_) return nullptr;
  return batch_core_.data_ptr<float>() + row * core_states_->state_size();
}

void Acting::CommitCoreState(const Work& w, const Output& out, int64_t row) {
  if (!core_states_) return;
  core_states_->Commit(w.identity, w.msg.step().group(), w.rows,
                       out.core_state.data_ptr<float>() + row * core_states_->state_size());
}

int64_t Acting::Rows(const std::vector<Work*>& steps) {
  int64_t rows = 0;
  for (const Work* w : steps) rows += w->rows + w->msg.step().final_obs_index_size();
  return rows;
}

void Acting::Launch(int64_t rows) {
  if (launched_) throw std::logic_error("Acting::Launch: the previous batch was not finished");
  pending_ = config_.learner.random_actions ? RandomActions(rows) : Forward(rows);
  launched_ = true;
}

Acting::Output Acting::Finish() {
  if (!launched_) throw std::logic_error("Acting::Finish: no batch launched");
  launched_ = false;
  Output out = std::move(pending_);
  pending_ = Output();
  if (device_.is_cuda() && !config_.learner.random_actions) {
    const auto t0 = std::chrono::steady_clock::now();
    SynchronizeCurrentStream(device_);
    out.wait_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    out.device_seconds = span_.Seconds();
  }
  return out;
}

Acting::Output Acting::RandomActions(int64_t rows) {
  Output out;
  if (action_.is_discrete()) {
    out.action = torch::randint(action_.n, {rows}, random_gen_, torch::kInt64);
  } else if (action_.is_multi_discrete()) {
    // Component i uniform in [0, nvec[i]): floor(u * nvec[i]), u in [0, 1) (clamped against rounding up).
    const auto& nvec = action_.nvec;
    const auto k = static_cast<int64_t>(nvec.size());
    const torch::Tensor n = torch::tensor(nvec, torch::kInt64);
    out.action = torch::minimum((torch::rand({rows, k}, random_gen_, torch::kFloat64) * n).to(torch::kInt64), n - 1);
  } else {
    std::vector<int64_t> shape{rows};
    shape.insert(shape.end(), action_.shape.begin(), action_.shape.end());
    auto low = torch::from_blob(const_cast<float*>(action_.low.data()), action_.shape, torch::kFloat32);
    auto high = torch::from_blob(const_cast<float*>(action_.high.data()), action_.shape, torch::kFloat32);
    out.action = low + (high - low) * torch::rand(shape, random_gen_, torch::kFloat32);
  }
  out.logp = torch::zeros({rows});
  out.value = torch::zeros({rows});
  return out;
}

int64_t Acting::PaddedRows(int64_t units) {
  if (units <= 32) return 32;
  // Four sizes per octave: at most a quarter more rows, and a few dozen shapes in all.
  int64_t octave = 1;
  while (octave * 2 <= units) octave *= 2;
  const int64_t step = octave / 4;
  return (units + step - 1) / step * step;
}

int64_t Acting::RowsPerState() const { return use_state_ && (recording_ || graphed_) ? num_agents_ : 1; }

void Acting::Gather(const std::vector<Work*>& steps, int64_t rows) {
  batch_states_view_ = torch::Tensor();
  padded_rows_ = rows;
  if (config_.learner.random_actions) return;
  const int64_t obs_numel = observation_.numel();
  // On CUDA the eager forward runs on a few batch sizes only (rows padded with zeros, in whole envs when states go
  // per env): cuDNN picks its algorithms once per shape (learner.device cuda sets its benchmark mode), and a
  // dynamic batcher would otherwise show it a new shape in nearly every batch. The CUDA graphs pad for themselves.
  const int64_t per = RowsPerState();
  if (device_.is_cuda() && !graphed_) padded_rows_ = PaddedRows(rows / per) * per;
  if (!batch_obs_.defined() || batch_obs_.size(0) < padded_rows_) {
    auto opts = torch::TensorOptions().dtype(torch::kFloat32);
    batch_obs_ = torch::empty({std::max<int64_t>(padded_rows_, config_.batcher.max_rows), obs_numel}, opts);
    if (device_.is_cuda()) batch_obs_ = batch_obs_.pin_memory();
  }
  float* dst = batch_obs_.data_ptr<float>();
  for (const Work* w : steps) {
    const auto& o = w->msg.step().obs().data();
    std::memcpy(dst, o.data(), o.size());
    dst += w->rows * obs_numel;
  }
  for (const Work* w : steps) {
    const auto& o = w->msg.step().final_obs().data();
    if (w->msg.step().final_obs_index_size() > 0) {
      std::memcpy(dst, o.data(), o.size());
      dst += w->msg.step().final_obs_index_size() * obs_numel;
    }
  }
  std::fill(dst, dst + (padded_rows_ - rows) * obs_numel, 0.0f);
  if (sde_) GatherSdeNoise(steps);
  if (core_states_) {
    const int64_t width = core_states_->state_size();
    if (!batch_core_.defined() || batch_core_.size(0) < padded_rows_) {
      batch_core_ = torch::empty({std::max<int64_t>(padded_rows_, config_.batcher.max_rows), width}, torch::kFloat32);
      if (device_.is_cuda()) batch_core_ = batch_core_.pin_memory();
    }
    // The requests' rows, then their final observations' (the truncated rows' states before the reset), as the
    // observations were gathered.
    float* cdst = batch_core_.data_ptr<float>();
    float* final_dst = cdst;
    for (const Work* w : steps) final_dst += w->rows * width;
    for (const Work* w : steps) {
      core_states_->Gather(w->identity, w->msg.step(), w->rows, cdst, final_dst);
      cdst += w->rows * width;
      final_dst += w->msg.step().final_obs_index_size() * width;
    }
    std::fill(final_dst, batch_core_.data_ptr<float>() + padded_rows_ * width, 0.0f);
  }
  // The critic's global states in the same order: each request's, then the final ones, one per env as they
  // come (the critic runs once per env, eagerly or in the CUDA graphs). Serving without training needs only the
  // actor: no states, no critic (the graphs were captured with them, so they keep them).
  if (use_state_ && (recording_ || graphed_)) {
    const int64_t state_numel = state_->numel();
    const int64_t state_rows = padded_rows_ / per;  // requests and final_obs_index hold whole envs
    if (!batch_state_.defined() || batch_state_.size(0) < state_rows) {
      auto opts = torch::TensorOptions().dtype(torch::kFloat32);
      batch_state_ =
          torch::empty({std::max<int64_t>(state_rows, config_.batcher.max_rows / per), state_numel}, opts);
      if (device_.is_cuda()) batch_state_ = batch_state_.pin_memory();
    }
    float* sdst = batch_state_.data_ptr<float>();
    const std::size_t env_bytes = sizeof(float) * static_cast<std::size_t>(state_numel);
    auto copy_envs = [&](const std::string& bytes, int64_t envs) {
      std::memcpy(sdst, bytes.data(), static_cast<std::size_t>(envs) * env_bytes);
      sdst += envs * state_numel;
    };
    for (const Work* w : steps) copy_envs(w->msg.step().global_state().data(), w->rows / num_agents_);
    for (const Work* w : steps)
      copy_envs(w->msg.step().final_global_state().data(), w->msg.step().final_obs_index_size() / num_agents_);
    std::fill(sdst, batch_state_.data_ptr<float>() + state_rows * state_numel, 0.0f);  // the padding
    std::vector<int64_t> sshape{state_rows};
    sshape.insert(sshape.end(), state_shape_.begin(), state_shape_.end());
    batch_states_view_ = batch_state_.narrow(0, 0, state_rows).view(sshape);
  }
}

void Acting::GatherSdeNoise(const std::vector<Work*>& steps) {
  const int64_t latent = policy_->sde_latent_size();
  const int64_t per_row = latent * action_.numel();
  if (!batch_noise_.defined() || batch_noise_.size(0) < padded_rows_) {
    batch_noise_ = torch::empty({std::max<int64_t>(padded_rows_, config_.batcher.max_rows), latent, action_.numel()},
                                torch::kFloat32);
    if (device_.is_cuda()) batch_noise_ = batch_noise_.pin_memory();
  }
  float* dst = batch_noise_.data_ptr<float>();
  const auto freq = static_cast<uint64_t>(config_.ppo.sde_sample_freq);
  auto split = [](uint64_t v) { return std::array<uint32_t, 2>{static_cast<uint32_t>(v), static_cast<uint32_t>(v >> 32)}; };
  for (const Work* w : steps) {
    const auto& step = w->msg.step();
    // One stream per request and sample period; each row takes its own stretch of it. The same (worker, group,
    // period) gives the same matrices, so an env keeps its noise for sde_sample_freq steps.
    const auto run = split(config_.seed);
    const auto worker = split(std::hash<std::string>{}(w->identity));
    const auto period = split(step.seq() / freq);
    std::seed_seq seed{run[0], run[1], worker[0], worker[1], step.group(), period[0], period[1]};
    std::mt19937_64 gen(seed);
    std::normal_distribution<float> normal;  // per request: it caches the second value of each pair it draws
    for (int64_t i = 0; i < w->rows * per_row; ++i) *dst++ = normal(gen);
  }
  // Final observations (their actions are never used) and the padding: no noise.
  float* end = batch_noise_.data_ptr<float>() + padded_rows_ * per_row;
  std::fill(dst, end, 0.0f);
}

Acting::Output Acting::Forward(int64_t rows) {
  torch::Tensor state = batch_states_view_;
  Output result;
  c10::InferenceMode guard;
  const int64_t padded = padded_rows_;  // Gather's (rows, or more with the padding)
  torch::Tensor obs = batch_obs_.narrow(0, 0, padded);
  std::vector<int64_t> shape{padded};
  shape.insert(shape.end(), obs_shape_.begin(), obs_shape_.end());
  const bool cuda = device_.is_cuda();
  span_.Begin();
  ActOutput out;
  if (graphed_) {
    out = graphed_->Act(obs.view(shape), state);  // copies the pinned rows in itself
  } else {
    // Per batch, not per thread: the cast cache must not outlive a weight update.
    AutocastGuard autocast(device_, precision_);
    if (cuda) {
      obs = obs.to(device_, /*non_blocking=*/true);
      if (state.defined()) state = state.to(device_, /*non_blocking=*/true);
    }
    const auto generator_lock = LockCudaGenerator(device_);  // sampling draws while the trainer may capture
    // Values are used only to train: a learner that only serves (learner.train false) skips the critic.
    torch::Tensor noise;
    if (sde_) noise = batch_noise_.narrow(0, 0, padded).to(device_, /*non_blocking=*/true);
    torch::Tensor core;
    if (core_states_) core = batch_core_.narrow(0, 0, padded).to(device_, /*non_blocking=*/true);
    out = policy_->Act(obs.view(shape), state, config_.learner.deterministic, /*with_value=*/recording_, noise,
                       core);
  }
  // The padding's rows are dropped before the copies back to the host. Undefined values only when serving a
  // centralised critic's policy without states: values are used only to train.
  torch::Tensor action = out.action.narrow(0, 0, rows);
  torch::Tensor logp = out.logp.narrow(0, 0, rows).to(torch::kFloat32);
  torch::Tensor value = out.value.defined() ? out.value.narrow(0, 0, rows).to(torch::kFloat32) : torch::Tensor();
  torch::Tensor core_state = out.core_state.defined() ? out.core_state.narrow(0, 0, rows) : torch::Tensor();
  if (!cuda) {
    if (core_state.defined()) result.core_state = core_state.contiguous();
    result.action = action.contiguous();
    result.logp = logp.contiguous();
    result.value = value.defined() ? value.contiguous() : torch::zeros({rows});
    return result;
  }
  // CUDA: the three copies into pinned host memory are queued behind the forward, and Finish waits once for all
  // of them (three blocking copies would wait three times).
  auto to_host = [](const torch::Tensor& t) {
    torch::Tensor host = torch::empty(t.sizes(), t.options().device(torch::kCPU).pinned_memory(true));
    host.copy_(t, /*non_blocking=*/true);
    return host;
  };
  result.action = to_host(action);
  result.logp = to_host(logp);
  result.value = value.defined() ? to_host(value) : torch::zeros({rows});
  if (core_state.defined()) result.core_state = to_host(core_state);
  span_.End();  // Finish waits for the stream to pass it
  return result;
}

void Acting::WarmUp() {
  if (!policy_) return;
  const auto t0 = std::chrono::steady_clock::now();
  // As Forward batches them: with a centralised critic, one state per env.
  const int64_t per = RowsPerState();
  const bool with_states = use_state_ && (recording_ || graphed_);  // as Gather: serving needs no critic
  c10::InferenceMode guard;
  auto forward = [&](int64_t units) {
    const int64_t rows = units * per;
    std::vector<int64_t> shape{rows};
    shape.insert(shape.end(), obs_shape_.begin(), obs_shape_.end());
    torch::Tensor state;
    if (with_states) {
      std::vector<int64_t> sshape{units};
      sshape.insert(sshape.end(), state_shape_.begin(), state_shape_.end());
      state = torch::zeros(sshape, torch::TensorOptions().device(device_));
    }
    if (graphed_) {
      // Captures the bucket's graph now rather than on the first batch that needs it.
      auto out = graphed_->Act(torch::zeros(shape, torch::TensorOptions().device(device_)), state);
      (void)out.action.to(torch::kCPU);
    } else {
      AutocastGuard autocast(device_, precision_);
      auto out = policy_->Act(torch::zeros(shape, torch::TensorOptions().device(device_)), state,
                              /*deterministic=*/false, /*with_value=*/recording_);
      (void)out.action.to(torch::kCPU);
    }
  };
  const int64_t max_units = std::max<int64_t>(1, config_.batcher.max_rows / per);
  // On CUDA, every size a batch can take: the eager forward's padded sizes (cuDNN's benchmark mode times its
  // algorithms once per shape), or the graphs' buckets (one capture each). On the CPU, the largest batch only.
  std::vector<int64_t> sizes;
  if (device_.is_cuda()) {
    for (int64_t u = 1; u <= max_units; ++u) {
      const int64_t size = graphed_ ? GraphedActor::BucketRows(u) : PaddedRows(u);
      if (sizes.empty() || sizes.back() != size) sizes.push_back(size);
    }
  } else {
    sizes.push_back(max_units);
  }
  for (int64_t units : sizes) forward(units);
  spdlog::info("warm-up: {} forward batch size(s) up to {} rows in {:.2f} s", sizes.size(), sizes.back() * per,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

void Acting::EncodeReply(const wire::StepRequest& req, const Output& out, int64_t row, int64_t rows,
                         int64_t version, wire::ActionReply* a) const {
  // Discrete: int64 [rows]; multi-discrete: int64 [rows, K]; box: float [rows, shape...].
  const int64_t action_numel = action_.numel();
  const bool integer = action_.is_categorical();
  const std::size_t action_bytes = integer ? sizeof(int64_t) : sizeof(float);
  const auto* act_ptr = static_cast<const uint8_t*>(out.action.data_ptr());
  a->set_group(req.group());
  a->set_seq(req.seq());
  a->set_policy_version(static_cast<uint64_t>(version));
  std::vector<int64_t> shape{rows};
  shape.insert(shape.end(), action_.shape.begin(), action_.shape.end());
  SetTensor(a->mutable_action(), integer ? DType::kInt64 : DType::kFloat32, shape,
            act_ptr + row * action_numel * static_cast<int64_t>(action_bytes),
            static_cast<std::size_t>(rows * action_numel) * action_bytes);
  if (!integer) {
    // The env gets the action clipped to its bounds; the store keeps the unclipped sample, whose log-prob the
    // PPO ratio needs.
    auto* o = reinterpret_cast<float*>(a->mutable_action()->mutable_data()->data());
    const auto& lo = action_.low;
    const auto& hi = action_.high;
    for (int64_t i = 0; i < rows * action_numel; ++i) {
      const auto k = static_cast<std::size_t>(i % action_numel);
      o[i] = std::min(std::max(o[i], lo[k]), hi[k]);
    }
  }
}

}  // namespace farm
