// The worker's loop: handshake, then answer every ActionReply by stepping that
// group and sending its results straight from the group's buffers.
#include "worker/worker_client.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <new>
#include <thread>

#include "common/protobuf_log.h"
#include "common/transport.h"
#include "common/wire.h"
#include "worker/random.h"

namespace farm {
namespace {

constexpr std::size_t kMaxRoundTripSamples = 1 << 20;

// One seed per (worker, group): SplitMix64 adds the golden-ratio step once more, so this is
// the index-th output of a SplitMix64 stream started at `seed`.
uint64_t MixSeed(uint64_t seed, uint64_t index) { return SplitMix64(seed + 0x9E3779B97F4A7C15ull * index); }

}  // namespace

Status WorkerClient::Create(const FarmConfig& config, int index, const std::string& learner_endpoint,
                            std::unique_ptr<WorkerClient>* out) {
  InstallProtobufLogHandler();  // before any thread parses a message
  // ZeroMQ would throw on connecting to it, or take a port past 65535 modulo 65536.
  if (auto s = CheckEndpoint(learner_endpoint, /*bind=*/false); !s.ok())
    return Status::InvalidArgument("the learner's endpoint (--learner): " + s.message());
  std::unique_ptr<WorkerClient> w(new WorkerClient());
  w->config_ = config;
  w->endpoint_ = learner_endpoint;
  if (auto s = LoadCurveClientKeys(config.transport, &w->curve_); !s.ok()) return s;
  if (w->curve_) spdlog::info("CURVE on; this worker's public key: {}", w->curve_->own.public_key);
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  // Unique across hosts and containers (where every worker may be PID 1).
  w->base_identity_ = fmt::format("worker-{}-{}-{}", host, index, ::getpid());
  w->identity_ = w->base_identity_;
  const int group_size = config.env.num_envs / config.env.num_groups;
  // A config may ask for more memory than the host has (large observations, envs with large internal state,
  // many groups): say what was being built and which keys to lower, rather than let std::bad_alloc end the
  // process. `building` names the step under way.
  std::string building = fmt::format("the spec of env {}", config.env.name);
  try {
    // ZeroMQ drops a peer whose message is over the limit (the request would be lost, not refused): check the
    // largest message this worker may send or receive against it now, from the spec alone, before the groups
    // allocate frames, stacks and final-observation buffers for a config that is refused anyway. The learner
    // checks the same at Hello.
    EnvGroupLayout layout;
    if (auto s = EnvGroup::Layout(config.env, group_size, &layout); !s.ok()) return s;
    if (config.env.decorrelate_episodes && layout.env_spec.max_episode_steps <= 0)
      return Status::InvalidArgument(fmt::format(
          "env.decorrelate_episodes: env {} has no time limit (max_episode_steps 0), so there is no episode length "
          "to cut at random; set it false",
          config.env.name));
    const NormalizerOptions normalizer_options = NormalizerOptions::FromConfig(config);
    const int64_t group_rows = layout.rows;  // envs x agents: the rows of every request
    const int64_t largest =
        MaxSessionMessageBytes(group_rows, layout.obs_numel, layout.env_spec.action, layout.state_numel) +
        (normalizer_options.any() ? MaxNormalizerStatsBytes(layout.obs_numel) : 0);
    const std::string observation =
        fmt::format("observation {}{}", ShapeString(layout.obs_shape),
                    layout.frame_stack > 1 ? fmt::format(", {} stacked frames", layout.frame_stack) : std::string());
    if (largest > config.transport.max_message_bytes)
      return Status::InvalidArgument(fmt::format(
          "transport.max_message_bytes: {} is too small for {} envs per group of {} ({}): a message may take up "
          "to {} bytes; raise it (learner and workers alike) or split env.num_envs into more env.num_groups",
          config.transport.max_message_bytes, group_size, config.env.name, observation, largest));

    // Per row: frames, stacked frames and reserved final observations; global states and final states.
    const int64_t buffer_bytes =
        group_rows *
        (layout.env_spec.observation.numel() + (layout.frame_stack > 1 ? layout.obs_numel : 0) + layout.obs_numel +
         2 * layout.state_numel) *
        static_cast<int64_t>(sizeof(float));
    for (int g = 0; g < config.env.num_groups; ++g) {
      building = fmt::format(
          "env group {} of {} ({} envs of {}, {} rows, {}: about {} MiB of buffers per group "
          "besides the envs' own state)",
          g + 1, config.env.num_groups, group_size, config.env.name, group_rows, observation, buffer_bytes >> 20);
      std::unique_ptr<EnvGroup> group;
      const uint64_t seed = MixSeed(config.seed, static_cast<uint64_t>(index) * 1000 + g);
      if (auto s = EnvGroup::Create(config.env, group_size, seed, &group); !s.ok()) return s;
      w->groups_.push_back(std::move(group));
      w->group_seeds_.push_back(seed);
    }
    if (normalizer_options.any()) {
      building = fmt::format("the normaliser's buffers ({} groups of {} rows, {})", config.env.num_groups, group_rows,
                             observation);
      w->normalizer_ = std::make_unique<Normalizer>(normalizer_options, layout.obs_numel);
      for (const auto& group : w->groups_) w->normalizer_->AddGroup(group->size(), group->num_agents());
    }
    w->obs_shape_ = {group_rows};  // every request carries one whole group, a row per agent
    w->obs_shape_.insert(w->obs_shape_.end(), layout.obs_shape.begin(), layout.obs_shape.end());
  } catch (const std::bad_alloc&) {
    return Status::InvalidArgument(
        fmt::format("out of memory building {}; lower env.num_envs, env.frame_stack or the env's size options "
                    "(env.options)",
                    building));
  }
  w->next_seq_.assign(w->groups_.size(), 0);
  w->waiting_.assign(w->groups_.size(), 0);
  w->sent_at_.resize(w->groups_.size());
  w->stats_.round_trip_us.reserve(kMaxRoundTripSamples);
  w->dealer_ = WatchedDealer::Connect(w->ctx_, w->identity_, learner_endpoint, config.transport, w->curve_.get());
  *out = std::move(w);
  return Status::Ok();
}

WorkerClient::~WorkerClient() = default;

Status WorkerClient::Handshake(std::chrono::milliseconds timeout) {
  const EnvSpec& spec = groups_[0]->spec();
  wire::Envelope env;
  auto* hello = env.mutable_hello();
  hello->set_protocol_version(kProtocolVersion);
  hello->set_worker_id(identity_);
  hello->set_env_name(spec.name);
  hello->set_num_envs(static_cast<uint32_t>(config_.env.num_envs));
  hello->set_num_groups(static_cast<uint32_t>(groups_.size()));
  ToWire(spec.observation, hello->mutable_observation());
  ToWire(spec.action, hello->mutable_action());
  hello->set_num_agents(static_cast<uint32_t>(spec.num_agents));
  if (spec.global_state) ToWire(*spec.global_state, hello->mutable_global_state());
  if (normalizer_) normalizer_->options().ToWire(hello->mutable_normalization());
  dealer_.socket().set(zmq::sockopt::sndtimeo, static_cast<int>(timeout.count()));
  const bool sent = SendEnvelope(dealer_.socket(), env, &scratch_);
  dealer_.socket().set(zmq::sockopt::sndtimeo, static_cast<int>(config_.transport.worker_give_up_s * 1000));
  if (!sent)
    return Status::IoError(fmt::format("cannot reach the learner at {} within {:.1f} s", endpoint_,
                                       static_cast<double>(timeout.count()) / 1000));

  wire::Envelope reply;
  Status status;
  if (!ReceiveEnvelope(dealer_, timeout, &reply, &status))
    return Status::IoError(fmt::format("no answer from the learner at {} within {:.1f} s", endpoint_,
                                       static_cast<double>(timeout.count()) / 1000));
  if (!status.ok()) return status;
  if (reply.has_stop()) return Status::Closed("learner is stopping: " + reply.stop().reason());
  if (!reply.has_welcome())
    return Status::Protocol(fmt::format("expected Welcome from the learner, got message type {}",
                                        static_cast<int>(reply.body_case())));
  if (!reply.welcome().accepted()) return Status::InvalidArgument("learner refused this worker: " + reply.welcome().error());
  // The run's statistics so far (a rejoin, a resumed run, a served policy): normalise as the others do.
  if (normalizer_ && reply.welcome().has_normalizer()) {
    if (auto s = normalizer_->ApplyGlobal(reply.welcome().normalizer()); !s.ok())
      return Status::Protocol("Welcome: " + s.message());
  }
  return Status::Ok();
}

void WorkerClient::SendStep(int g, bool first) {
  const EnvGroup& group = *groups_[g];
  const auto n = static_cast<int64_t>(group.rows());

  auto* req = out_.mutable_step();
  req->Clear();
  req->set_group(static_cast<uint32_t>(g));
  req->set_seq(next_seq_[g]++);
  req->set_first(first);
  const std::size_t obs_bytes = static_cast<std::size_t>(n * group.obs_numel()) * sizeof(float);
  // With normalisation the normalised observations and scaled rewards; the episodes' returns stay raw.
  const float* obs = normalizer_ ? normalizer_->obs(g) : group.obs();
  const float* reward = normalizer_ ? normalizer_->reward(g) : group.reward();
  const std::vector<float>& final_obs = normalizer_ ? normalizer_->final_obs(g) : group.final_obs();
  SetTensor(req->mutable_obs(), DType::kFloat32, obs_shape_, obs, obs_bytes);
  if (group.state_numel() > 0) {  // one state per env
    std::vector<int64_t> shape{group.size()};
    shape.insert(shape.end(), group.spec().global_state->shape.begin(), group.spec().global_state->shape.end());
    SetTensor(req->mutable_global_state(), DType::kFloat32, shape, group.global_state(),
              static_cast<std::size_t>(group.size() * group.state_numel()) * sizeof(float));
  }
  if (!first) {
    SetTensor(req->mutable_reward(), DType::kFloat32, {n}, reward, static_cast<std::size_t>(n) * sizeof(float));
    req->set_terminated(group.terminated(), static_cast<std::size_t>(n));
    req->set_truncated(group.truncated(), static_cast<std::size_t>(n));
    // Only while some agent has finished early: absent, every row acts, so other envs' requests are unchanged.
    if (group.any_inactive()) req->set_active(group.active(), static_cast<std::size_t>(n));
    const auto& idx = group.final_obs_index();
    if (!idx.empty()) {
      req->mutable_final_obs_index()->Assign(idx.begin(), idx.end());
      std::vector<int64_t> shape{static_cast<int64_t>(idx.size())};
      shape.insert(shape.end(), group.spec().observation.shape.begin(), group.spec().observation.shape.end());
      SetTensor(req->mutable_final_obs(), DType::kFloat32, shape, final_obs.data(), final_obs.size() * sizeof(float));
      if (group.state_numel() > 0) {  // one final state per truncated env
        shape.resize(1);
        shape[0] = static_cast<int64_t>(idx.size()) / group.num_agents();
        shape.insert(shape.end(), group.spec().global_state->shape.begin(), group.spec().global_state->shape.end());
        SetTensor(req->mutable_final_global_state(), DType::kFloat32, shape, group.final_global_state().data(),
                  group.final_global_state().size() * sizeof(float));
      }
    }
    for (const auto& ep : group.finished()) {
      if (ep.cut) continue;  // a first episode cut short (env.decorrelate_episodes): its return is not the policy's
      auto* e = req->add_episodes();
      e->set_episode_return(ep.episode_return);
      e->set_length(ep.length);
    }
    for (const auto& ep : group.finished()) stats_.episodes += ep.cut ? 0 : 1;
    // Once per rollout (ppo.rollout_length requests) per group, at the request that completes the group's
    // part of it: this worker's statistics since its last delta. The reply brings the run's merged ones,
    // which in sync mode hold every worker's delta of that rollout.
    if (normalizer_ && !normalizer_->frozen() && req->seq() % static_cast<uint64_t>(config_.ppo.rollout_length) == 0)
      normalizer_->TakeDelta(req->mutable_stats_delta());
  }
  if (!SendEnvelope(dealer_.socket(), out_, &scratch_)) {
    send_failed_ = true;  // reported by the loop
    return;
  }
  sent_at_[g] = std::chrono::steady_clock::now();
  waiting_[g] = 1;
  ++stats_.messages;
}

Status WorkerClient::OnAction(const wire::ActionReply& reply) {
  const auto g = static_cast<std::size_t>(reply.group());
  if (g >= groups_.size() || !waiting_[g] || reply.seq() + 1 != next_seq_[g])
    return Status::Protocol(fmt::format("unexpected ActionReply for group {} seq {}", reply.group(), reply.seq()));
  EnvGroup& group = *groups_[g];
  const Space& action = group.spec().action;
  const auto n = static_cast<int64_t>(group.rows());  // one action per agent row
  waiting_[g] = 0;
  if (normalizer_ && reply.has_normalizer()) {
    if (auto s = normalizer_->ApplyGlobal(reply.normalizer()); !s.ok())
      return Status::Protocol("ActionReply: " + s.message());
  }
  if (stats_.round_trip_us.size() < kMaxRoundTripSamples)
    stats_.round_trip_us.push_back(
        std::chrono::duration<float, std::micro>(std::chrono::steady_clock::now() - sent_at_[g]).count());
  if (action.is_categorical()) {
    // Discrete: int64 [rows]; multi-discrete: int64 [rows, K], component i in [0, nvec[i]).
    std::vector<int64_t> shape{n};
    shape.insert(shape.end(), action.shape.begin(), action.shape.end());
    if (auto s = CheckTensor(reply.action(), DType::kInt64, shape, "ActionReply.action"); !s.ok()) return s;
    const auto* a = reinterpret_cast<const int64_t*>(reply.action().data().data());
    const std::vector<int64_t> choices = action.categories();
    const auto k = static_cast<int64_t>(choices.size());
    for (int64_t i = 0; i < n * k; ++i) {
      const int64_t limit = choices[static_cast<std::size_t>(i % k)];
      if (a[i] < 0 || a[i] >= limit)
        return Status::Protocol(k == 1 ? fmt::format("action {} out of range [0, {})", a[i], limit)
                                       : fmt::format("action {} (component {} of row {}) out of range [0, {})", a[i],
                                                     i % k, i / k, limit));
    }
    group.Step(a, nullptr);
  } else {
    std::vector<int64_t> shape{n};
    shape.insert(shape.end(), action.shape.begin(), action.shape.end());
    if (auto s = CheckTensor(reply.action(), DType::kFloat32, shape, "ActionReply.action"); !s.ok()) return s;
    group.Step(nullptr, reinterpret_cast<const float*>(reply.action().data().data()));
  }
  if (normalizer_) normalizer_->OnStep(static_cast<int>(g), group);
  stats_.env_steps += group.size();  // env steps, whatever the agents per env
  SendStep(static_cast<int>(g), /*first=*/false);
  return Status::Ok();
}

double WorkerStats::RoundTripPercentile(double q) const {
  if (round_trip_us.empty()) return 0;
  std::vector<float> v = round_trip_us;
  const auto k = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

Status WorkerClient::Run() {
  const auto start = std::chrono::steady_clock::now();
  Status status;
  try {
    status = Loop();
  } catch (const zmq::error_t& e) {
    // A signal interrupted a blocking call outside the receive loop (e.g. during the handshake).
    status = (e.num() == EINTR && stop_requested_.load()) ? Status::Closed("stop requested")
                                                           : Status::IoError(fmt::format("ZeroMQ: {}", e.what()));
  } catch (const std::exception& e) {
    // An env's own code (its step or reset) threw, most likely; or the worker ran out of memory: stop, saying so.
    status = Status::Internal(fmt::format("stopped by an exception (from env {}'s step or reset, or the worker "
                                          "itself): {}",
                                          config_.env.name, e.what()));
  }
  stats_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return status;
}

void WorkerClient::StartGroups() {
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    next_seq_[g] = 0;
    waiting_[g] = 0;
    groups_[g]->Reset();
    // A new draw per start (connection_ counts the restarts), from the group's own seed.
    if (config_.env.decorrelate_episodes)
      groups_[g]->DecorrelateEpisodes(MixSeed(group_seeds_[g], static_cast<uint64_t>(connection_) + 1));
    if (normalizer_) normalizer_->OnReset(static_cast<int>(g), *groups_[g]);
    SendStep(static_cast<int>(g), /*first=*/true);
  }
}

// A fresh socket and handshake, with exponential backoff, until
// worker_give_up_s; then the episodes start over (the learner kept nothing).
Status WorkerClient::Reconnect(const std::string& why) {
  using Clock = std::chrono::steady_clock;
  spdlog::warn("{}: the learner at {} {}; reconnecting", identity_, endpoint_, why);
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(config_.transport.worker_give_up_s));
  auto backoff = std::chrono::milliseconds(100);
  while (!stop_requested_.load()) {
    // A new identity per attempt: a late Welcome for an abandoned attempt must not reach this socket.
    identity_ = fmt::format("{}-c{}", base_identity_, ++connection_);
    dealer_ = WatchedDealer();  // drops what the old socket held (and its monitor) before the new one connects
    dealer_ = WatchedDealer::Connect(ctx_, identity_, endpoint_, config_.transport, curve_.get());
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) break;
    const Status s = Handshake(std::min(left, std::max(backoff, std::chrono::milliseconds(1000))));
    if (s.ok()) {
      ++stats_.reconnects;
      spdlog::info("{}: reconnected to {}", identity_, endpoint_);
      send_failed_ = false;
      StartGroups();
      return Status::Ok();
    }
    if (s.code() != Status::Code::kIoError) return s;  // refused or a protocol error: retrying will not help
    std::this_thread::sleep_for(std::min(backoff, std::chrono::duration_cast<std::chrono::milliseconds>(
                                                      deadline - Clock::now())));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
  }
  if (stop_requested_.load()) return Status::Closed("stop requested");
  return Status::IoError(fmt::format("could not reach the learner at {} again within {} s; giving up", endpoint_,
                                     config_.transport.worker_give_up_s));
}

Status WorkerClient::Loop() {
  const auto give_up_ms =
      std::chrono::milliseconds(static_cast<int64_t>(config_.transport.worker_give_up_s * 1000));
  if (auto s = Handshake(give_up_ms); !s.ok()) return s;
  spdlog::info("{}: connected to {} ({} envs of {} in {} groups)", identity_, endpoint_, config_.env.num_envs,
               config_.env.name, groups_.size());
  StartGroups();
  using Clock = std::chrono::steady_clock;
  const auto interval = std::chrono::milliseconds(
      std::max<int64_t>(1, static_cast<int64_t>(config_.transport.heartbeat_interval_s * 1000)));
  auto last_heard = Clock::now();
  wire::Envelope in;
  wire::Envelope heartbeat;
  heartbeat.mutable_heartbeat();
  while (!stop_requested_.load()) {
    if (send_failed_)
      return Status::IoError(fmt::format("the learner at {} stopped taking messages for {} s; giving up", endpoint_,
                                         config_.transport.worker_give_up_s));
    Status status;
    bool got = false;
    try {
      got = ReceiveEnvelope(dealer_.socket(), interval, &in, &status);
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;  // a signal: loop re-checks stop_requested_
      throw;
    }
    if (!got) {
      // Waiting (e.g. while the learner updates): say we are alive. A learner that does not answer
      // heartbeats is gone (crashed, restarted): reconnect, until worker_give_up_s.
      if (Clock::now() - last_heard > std::chrono::duration<double>(config_.transport.heartbeat_timeout_s)) {
        if (auto s = Reconnect("stopped answering"); !s.ok()) return s;
        last_heard = Clock::now();
        continue;
      }
      if (!SendEnvelope(dealer_.socket(), heartbeat, &scratch_)) send_failed_ = true;
      continue;
    }
    last_heard = Clock::now();
    if (!status.ok()) return status;
    switch (in.body_case()) {
      case wire::Envelope::kAction:
        if (auto s = OnAction(in.action()); !s.ok()) return s;
        break;
      case wire::Envelope::kStop:
        spdlog::info("{}: learner says stop ({})", identity_, in.stop().reason());
        return Status::Ok();
      case wire::Envelope::kHeartbeat:
        break;
      case wire::Envelope::kError:
        if (in.error().code() == wire::Error::UNKNOWN_WORKER) {
          // Every message this identity still has in flight gets the same answer; the new socket never sees them.
          if (auto s = Reconnect("does not know this worker (" + in.error().message() + ")"); !s.ok()) return s;
          last_heard = Clock::now();
          break;
        }
        return Status::Protocol("learner reported an error: " + in.error().message());
      default:
        return Status::Protocol(fmt::format("unexpected message type {} from the learner",
                                            static_cast<int>(in.body_case())));
    }
  }
  return Status::Closed("stop requested");
}

}  // namespace farm
