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
  // The learners: the run's one, or one per policy (config.policies, which ValidateConfig has checked: normalisation
  // off), each to get its agents' rows. ZeroMQ would throw on connecting to an endpoint CheckEndpoint refuses, or
  // take a port past 65535 modulo 65536.
  std::vector<PolicyEndpoint> endpoints;
  if (config.policies.empty()) {
    endpoints.push_back({"", learner_endpoint});
  } else if (auto s = ParsePolicyEndpoints(config, learner_endpoint, /*allow_empty=*/false, &endpoints); !s.ok()) {
    return s;
  }
  for (const auto& e : endpoints)
    if (auto s = CheckEndpoint(e.endpoint, /*bind=*/false); !s.ok())
      return Status::InvalidArgument(
          (e.name.empty() ? std::string("the learner's endpoint (--learner): ")
                          : fmt::format("the endpoint of policy {}'s learner (--learner): ", e.name)) +
          s.message());
  std::unique_ptr<WorkerClient> w(new WorkerClient());
  w->config_ = config;
  if (auto s = LoadCurveClientKeys(config.transport, &w->curve_); !s.ok()) return s;
  if (w->curve_) spdlog::info("CURVE on; this worker's public key: {}", w->curve_->own.public_key);
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  // Unique across hosts and containers (where every worker may be PID 1).
  w->base_identity_ = fmt::format("worker-{}-{}-{}", host, index, ::getpid());
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
  } catch (const std::bad_alloc&) {
    return Status::InvalidArgument(
        fmt::format("out of memory building {}; lower env.num_envs, env.frame_stack or the env's size options "
                    "(env.options)",
                    building));
  }
  // Several policies: each one's agents, by index.
  std::vector<std::vector<int>> agents;
  if (!config.policies.empty()) {
    if (auto s = AssignAgentIndices(config.policies, w->groups_[0]->num_agents(), &agents); !s.ok()) return s;
  }
  for (std::size_t i = 0; i < endpoints.size(); ++i) {
    auto link = std::make_unique<Link>();
    link->policy = endpoints[i].name;
    link->endpoint = endpoints[i].endpoint;
    int64_t rows = w->groups_[0]->rows();
    if (!agents.empty()) {
      link->rows = std::make_unique<PolicyRows>(link->policy, agents[i], *w->groups_[0]);
      rows = link->rows->rows();
    }
    const NormalizerOptions normalizer_options = NormalizerOptions::FromConfig(config);
    if (normalizer_options.any()) {
      try {
        link->normalizer = std::make_unique<Normalizer>(normalizer_options, w->groups_[0]->obs_numel());
        for (const auto& group : w->groups_)
          link->normalizer->AddGroup(group->size(), link->rows ? link->rows->num_agents() : group->num_agents());
      } catch (const std::bad_alloc&) {
        return Status::InvalidArgument(fmt::format(
            "out of memory building the normaliser's buffers ({} groups of {} rows); lower env.num_envs",
            w->groups_.size(), rows));
      }
    }
    link->obs_shape = {rows};  // every request carries one whole group, a row per (this policy's) agent
    const auto& obs_shape = w->groups_[0]->spec().observation.shape;
    link->obs_shape.insert(link->obs_shape.end(), obs_shape.begin(), obs_shape.end());
    link->identity = w->LinkIdentity(*link, 0);
    link->next_seq.assign(w->groups_.size(), 0);
    link->waiting.assign(w->groups_.size(), 0);
    link->sent_at.resize(w->groups_.size());
    w->links_.push_back(std::move(link));
  }
  if (!agents.empty()) {  // policies (even one): the actions are gathered per group before it steps
    const EnvGroup& g0 = *w->groups_[0];
    const auto numel = static_cast<std::size_t>(g0.rows() * g0.spec().action.numel());
    if (g0.spec().action.is_categorical())
      w->discrete_actions_.assign(w->groups_.size(), std::vector<int64_t>(numel));
    else
      w->continuous_actions_.assign(w->groups_.size(), std::vector<float>(numel));
  }
  w->awaited_.assign(w->groups_.size(), 0);
  w->stats_.round_trip_us.reserve(kMaxRoundTripSamples);
  for (auto& link : w->links_)
    link->dealer = WatchedDealer::Connect(w->ctx_, link->identity, link->endpoint, config.transport, w->curve_.get());
  *out = std::move(w);
  return Status::Ok();
}

WorkerClient::~WorkerClient() = default;

Status WorkerClient::SendHello(Link& link, std::chrono::milliseconds timeout) {
  const EnvSpec& spec = groups_[0]->spec();
  wire::Envelope env;
  auto* hello = env.mutable_hello();
  hello->set_protocol_version(kProtocolVersion);
  hello->set_worker_id(link.identity);
  hello->set_env_name(spec.name);
  hello->set_num_envs(static_cast<uint32_t>(config_.env.num_envs));
  hello->set_num_groups(static_cast<uint32_t>(groups_.size()));
  ToWire(spec.observation, hello->mutable_observation());
  ToWire(spec.action, hello->mutable_action());
  // Several policies: this policy's agents per env.
  hello->set_num_agents(static_cast<uint32_t>(link.rows ? link.rows->num_agents() : spec.num_agents));
  if (spec.global_state) ToWire(*spec.global_state, hello->mutable_global_state());
  if (link.normalizer) link.normalizer->options().ToWire(hello->mutable_normalization());
  zmq::socket_t& socket = link.dealer.socket();
  socket.set(zmq::sockopt::sndtimeo, static_cast<int>(timeout.count()));
  const bool sent = SendEnvelope(socket, env, &scratch_);
  socket.set(zmq::sockopt::sndtimeo, static_cast<int>(config_.transport.worker_give_up_s * 1000));
  if (!sent)
    return Status::IoError(fmt::format("cannot reach {} within {:.1f} s", link.Who(),
                                       static_cast<double>(timeout.count()) / 1000));
  link.last_sent = Clock::now();
  return Status::Ok();
}

Status WorkerClient::OnWelcome(Link& link, const wire::Envelope& reply) {
  if (reply.has_stop()) return Status::Closed("learner is stopping: " + reply.stop().reason());
  if (!reply.has_welcome())
    return Status::Protocol(fmt::format("expected Welcome from {}, got message type {}", link.Who(),
                                        static_cast<int>(reply.body_case())));
  if (!reply.welcome().accepted())
    return Status::InvalidArgument(
        (link.policy.empty() ? std::string("learner") : fmt::format("the learner of policy {}", link.policy)) +
        " refused this worker: " + reply.welcome().error());
  // The run's statistics so far (a rejoin, a resumed run, a served policy): normalise as the others do.
  if (link.normalizer && reply.welcome().has_normalizer()) {
    if (auto s = link.normalizer->ApplyGlobal(reply.welcome().normalizer()); !s.ok())
      return Status::Protocol("Welcome: " + s.message());
  }
  link.last_heard = Clock::now();
  return Status::Ok();
}

// Every learner's Hello first, then their Welcomes, so that the learners build their runs together; a learner that
// has welcomed this worker gets heartbeats while the others build theirs (it would drop a worker silent for
// transport.heartbeat_timeout_s).
Status WorkerClient::Handshake(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (auto& link : links_)
    if (auto s = SendHello(*link, timeout); !s.ok()) return s;
  const auto interval = std::chrono::milliseconds(
      std::max<int64_t>(1, static_cast<int64_t>(config_.transport.heartbeat_interval_s * 1000)));
  wire::Envelope heartbeat;
  heartbeat.mutable_heartbeat();
  std::vector<uint8_t> welcomed(links_.size(), 0);
  std::size_t waiting = links_.size();
  for (std::size_t i = 0; waiting > 0; i = (i + 1) % links_.size()) {
    if (welcomed[i]) continue;
    Link& link = *links_[i];
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0)
      return Status::IoError(fmt::format("no answer from {} within {:.1f} s", link.Who(),
                                         static_cast<double>(timeout.count()) / 1000));
    wire::Envelope reply;
    Status status;
    // With one learner, one wait for the whole timeout; with several, a heartbeat interval at a time.
    const auto wait = links_.size() == 1 ? left : std::min(left, interval);
    if (ReceiveEnvelope(link.dealer, wait, &reply, &status)) {
      if (!status.ok()) return status;
      if (auto s = OnWelcome(link, reply); !s.ok()) return s;
      welcomed[i] = 1;
      --waiting;
    }
    const auto now = Clock::now();
    for (std::size_t j = 0; j < links_.size(); ++j) {
      if (!welcomed[j] || waiting == 0 || now - links_[j]->last_sent < interval) continue;
      if (!SendEnvelope(links_[j]->dealer.socket(), heartbeat, &scratch_))
        return Status::IoError(fmt::format("{} stopped taking messages", links_[j]->Who()));
      links_[j]->last_sent = now;
    }
  }
  return Status::Ok();
}

Status WorkerClient::SendStep(int g, bool first) {
  // Several policies: each learner's rows of the group, checked (a policy whose agents have all finished while
  // the env goes on is refused) before any is sent.
  for (auto& link : links_) {
    if (link->rows)
      if (auto s = link->rows->Gather(*groups_[g]); !s.ok()) return s;
    // Normalisation: the rows this learner gets, counted in its statistics.
    if (link->normalizer) {
      const NormalizerInput in =
          link->rows ? link->rows->ForNormalizer(*groups_[g]) : NormalizerInput::Of(*groups_[g]);
      if (first)
        link->normalizer->OnReset(g, in);
      else
        link->normalizer->OnStep(g, in);
    }
  }
  for (auto& link : links_) SendStepTo(*link, g, first);
  awaited_[g] = static_cast<int>(links_.size());
  if (!first)
    for (const auto& ep : groups_[g]->finished()) stats_.episodes += ep.cut ? 0 : 1;
  if (!send_failed_) ++stats_.messages;  // one per group step, whatever the learners
  return Status::Ok();
}

void WorkerClient::SendStepTo(Link& link, int g, bool first) {
  const EnvGroup& group = *groups_[g];
  const PolicyRows* rows = link.rows.get();
  const auto n = static_cast<int64_t>(rows ? rows->rows() : group.rows());

  auto* req = out_.mutable_step();
  req->Clear();
  req->set_group(static_cast<uint32_t>(g));
  req->set_seq(link.next_seq[g]++);
  req->set_first(first);
  const std::size_t obs_bytes = static_cast<std::size_t>(n * group.obs_numel()) * sizeof(float);
  // With normalisation the normalised observations and scaled rewards; the episodes' returns stay raw. Several
  // policies: this policy's rows.
  // A part the normaliser leaves raw is read from its source: the group's, or this policy's gathered rows.
  const Normalizer* norm = link.normalizer.get();
  const bool norm_obs = norm != nullptr && norm->options().obs;
  const bool norm_reward = norm != nullptr && norm->options().reward;
  const float* obs = norm_obs ? norm->obs(g) : rows ? rows->obs() : group.obs();
  const float* reward = norm_reward ? norm->reward(g) : rows ? rows->reward() : group.reward();
  const uint8_t* terminated = rows ? rows->terminated() : group.terminated();
  const uint8_t* truncated = rows ? rows->truncated() : group.truncated();
  const bool any_inactive = rows ? rows->any_inactive() : group.any_inactive();
  const uint8_t* active = rows ? rows->active() : group.active();
  const std::vector<float>& final_obs = norm_obs ? norm->final_obs(g) : rows ? rows->final_obs() : group.final_obs();
  const std::vector<int32_t>& idx = rows ? rows->final_obs_index() : group.final_obs_index();
  const int64_t agents = rows ? rows->num_agents() : group.num_agents();
  SetTensor(req->mutable_obs(), DType::kFloat32, link.obs_shape, obs, obs_bytes);
  if (group.state_numel() > 0) {  // one state per env
    std::vector<int64_t> shape{group.size()};
    shape.insert(shape.end(), group.spec().global_state->shape.begin(), group.spec().global_state->shape.end());
    SetTensor(req->mutable_global_state(), DType::kFloat32, shape, group.global_state(),
              static_cast<std::size_t>(group.size() * group.state_numel()) * sizeof(float));
  }
  if (!first) {
    SetTensor(req->mutable_reward(), DType::kFloat32, {n}, reward, static_cast<std::size_t>(n) * sizeof(float));
    req->set_terminated(terminated, static_cast<std::size_t>(n));
    req->set_truncated(truncated, static_cast<std::size_t>(n));
    // Only while some agent has finished early: absent, every row acts, so other envs' requests are unchanged.
    if (any_inactive) req->set_active(active, static_cast<std::size_t>(n));
    if (!idx.empty()) {
      req->mutable_final_obs_index()->Assign(idx.begin(), idx.end());
      std::vector<int64_t> shape{static_cast<int64_t>(idx.size())};
      shape.insert(shape.end(), group.spec().observation.shape.begin(), group.spec().observation.shape.end());
      SetTensor(req->mutable_final_obs(), DType::kFloat32, shape, final_obs.data(), final_obs.size() * sizeof(float));
      if (group.state_numel() > 0) {  // one final state per truncated env
        shape.resize(1);
        shape[0] = static_cast<int64_t>(idx.size()) / agents;
        shape.insert(shape.end(), group.spec().global_state->shape.begin(), group.spec().global_state->shape.end());
        SetTensor(req->mutable_final_global_state(), DType::kFloat32, shape, group.final_global_state().data(),
                  group.final_global_state().size() * sizeof(float));
      }
    }
    // The team's return of each episode that ended: every policy's.
    for (const auto& ep : group.finished()) {
      if (ep.cut) continue;  // a first episode cut short (env.decorrelate_episodes): its return is not the policy's
      auto* e = req->add_episodes();
      e->set_episode_return(ep.episode_return);
      e->set_length(ep.length);
    }
    // Once per rollout (ppo.rollout_length requests) per group, at the request that completes the group's
    // part of it: this worker's statistics since its last delta. The reply brings the run's merged ones,
    // which in sync mode hold every worker's delta of that rollout.
    if (link.normalizer && !link.normalizer->frozen() &&
        req->seq() % static_cast<uint64_t>(config_.ppo.rollout_length) == 0)
      link.normalizer->TakeDelta(req->mutable_stats_delta());
  }
  if (!SendEnvelope(link.dealer.socket(), out_, &scratch_)) {
    send_failed_ = true;  // reported by the loop
    failed_link_ = link.Who();
    return;
  }
  link.sent_at[g] = link.last_sent = Clock::now();
  link.waiting[g] = 1;
}

Status WorkerClient::OnAction(Link& link, const wire::ActionReply& reply) {
  const auto g = static_cast<std::size_t>(reply.group());
  if (g >= groups_.size() || !link.waiting[g] || reply.seq() + 1 != link.next_seq[g])
    return Status::Protocol(fmt::format("unexpected ActionReply for group {} seq {}{}", reply.group(), reply.seq(),
                                        link.policy.empty() ? "" : " from the learner of policy " + link.policy));
  EnvGroup& group = *groups_[g];
  const Space& action = group.spec().action;
  const PolicyRows* rows = link.rows.get();
  const auto n = static_cast<int64_t>(rows ? rows->rows() : group.rows());  // one action per agent row
  link.waiting[g] = 0;
  if (link.normalizer && reply.has_normalizer()) {
    if (auto s = link.normalizer->ApplyGlobal(reply.normalizer()); !s.ok())
      return Status::Protocol("ActionReply: " + s.message());
  }
  if (stats_.round_trip_us.size() < kMaxRoundTripSamples)
    stats_.round_trip_us.push_back(
        std::chrono::duration<float, std::micro>(Clock::now() - link.sent_at[g]).count());
  std::vector<int64_t> shape{n};
  shape.insert(shape.end(), action.shape.begin(), action.shape.end());
  const int64_t* discrete = nullptr;
  const float* continuous = nullptr;
  if (action.is_categorical()) {
    // Discrete: int64 [rows]; multi-discrete: int64 [rows, K], component i in [0, nvec[i]).
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
    discrete = a;
  } else {
    if (auto s = CheckTensor(reply.action(), DType::kFloat32, shape, "ActionReply.action"); !s.ok()) return s;
    continuous = reinterpret_cast<const float*>(reply.action().data().data());
  }
  // Several policies: this policy's actions into the group's; the group steps once every learner has acted.
  if (rows) {
    if (discrete) rows->Scatter(discrete, discrete_actions_[g].data());
    if (continuous) rows->Scatter(continuous, continuous_actions_[g].data());
    if (--awaited_[g] > 0) return Status::Ok();
    discrete = discrete ? discrete_actions_[g].data() : nullptr;
    continuous = continuous ? continuous_actions_[g].data() : nullptr;
  }
  awaited_[g] = 0;
  group.Step(discrete, continuous);
  stats_.env_steps += group.size();  // env steps, whatever the agents per env
  return SendStep(static_cast<int>(g), /*first=*/false);
}

double WorkerStats::RoundTripPercentile(double q) const {
  if (round_trip_us.empty()) return 0;
  std::vector<float> v = round_trip_us;
  const auto k = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

Status WorkerClient::Run() {
  const auto start = Clock::now();
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
  stats_.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return status;
}

Status WorkerClient::StartGroups() {
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    for (auto& link : links_) {
      link->next_seq[g] = 0;
      link->waiting[g] = 0;
    }
    groups_[g]->Reset();
    // A new draw per start (connection_ counts the restarts), from the group's own seed.
    if (config_.env.decorrelate_episodes)
      groups_[g]->DecorrelateEpisodes(MixSeed(group_seeds_[g], static_cast<uint64_t>(connection_) + 1));
    if (auto s = SendStep(static_cast<int>(g), /*first=*/true); !s.ok()) return s;
  }
  // The learners' silence counts from here (resetting the envs may take a while).
  for (auto& link : links_) link->last_heard = Clock::now();
  return Status::Ok();
}

std::string WorkerClient::LinkIdentity(const Link& link, int connection) const {
  // The learner reads the connection from the last "-cN" (WorkerConnection::Of): with a policy's name in the
  // identity (each socket's monitor is named after it) the suffix is there from the start, whatever the name.
  if (link.policy.empty()) return connection == 0 ? base_identity_ : fmt::format("{}-c{}", base_identity_, connection);
  return fmt::format("{}-{}-c{}", base_identity_, link.policy, connection);
}

// Fresh sockets and handshakes with every learner, with exponential backoff, until worker_give_up_s; then the
// episodes start over (the learners kept nothing of them).
Status WorkerClient::Reconnect(const Link& failed, const std::string& why) {
  spdlog::warn("{}: {} {}; reconnecting{}", failed.identity, failed.Who(), why,
               links_.size() > 1 ? " to every policy's learner" : "");
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(config_.transport.worker_give_up_s));
  auto backoff = std::chrono::milliseconds(100);
  while (!stop_requested_.load()) {
    // A new identity per attempt: a late Welcome for an abandoned attempt must not reach this socket.
    ++connection_;
    for (auto& link : links_) {
      link->identity = LinkIdentity(*link, connection_);
      link->dealer = WatchedDealer();  // drops what the old socket held (and its monitor) before the new one connects
      link->dealer = WatchedDealer::Connect(ctx_, link->identity, link->endpoint, config_.transport, curve_.get());
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) break;
    const Status s = Handshake(std::min(left, std::max(backoff, std::chrono::milliseconds(1000))));
    if (s.ok()) {
      ++stats_.reconnects;
      for (auto& link : links_) spdlog::info("{}: reconnected to {}", link->identity, link->Who());
      send_failed_ = false;
      return StartGroups();
    }
    if (s.code() != Status::Code::kIoError) return s;  // refused or a protocol error: retrying will not help
    std::this_thread::sleep_for(std::min(backoff, std::chrono::duration_cast<std::chrono::milliseconds>(
                                                      deadline - Clock::now())));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
  }
  if (stop_requested_.load()) return Status::Closed("stop requested");
  return Status::IoError(fmt::format("could not reach {} again within {} s; giving up", failed.Who(),
                                     config_.transport.worker_give_up_s));
}

Status WorkerClient::Loop() {
  const auto give_up_ms =
      std::chrono::milliseconds(static_cast<int64_t>(config_.transport.worker_give_up_s * 1000));
  if (auto s = Handshake(give_up_ms); !s.ok()) return s;
  for (auto& link : links_) {
    spdlog::info("{}: connected to {} ({} envs of {} in {} groups{})", link->identity, link->Who(),
                 config_.env.num_envs, config_.env.name, groups_.size(),
                 link->rows ? fmt::format(", agents {}", fmt::join(link->rows->agents(), ", ")) : std::string());
  }
  if (auto s = StartGroups(); !s.ok()) return s;
  const auto interval = std::chrono::milliseconds(
      std::max<int64_t>(1, static_cast<int64_t>(config_.transport.heartbeat_interval_s * 1000)));
  const auto silent_limit = std::chrono::duration<double>(config_.transport.heartbeat_timeout_s);
  wire::Envelope in;
  wire::Envelope heartbeat;
  heartbeat.mutable_heartbeat();
  std::vector<zmq::pollitem_t> items;
  while (!stop_requested_.load()) {
    if (send_failed_)
      return Status::IoError(fmt::format("{} stopped taking messages for {} s; giving up", failed_link_,
                                         config_.transport.worker_give_up_s));
    // The sockets change when they are connected to again: the poll set is built from them each time round.
    items.clear();
    for (auto& link : links_) items.push_back({link->dealer.socket().handle(), 0, ZMQ_POLLIN, 0});
    try {
      zmq::poll(items, interval);
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;  // a signal: loop re-checks stop_requested_
      throw;
    }
    const auto now = Clock::now();
    Link* reconnect = nullptr;
    std::string why;
    for (std::size_t i = 0; i < links_.size() && !reconnect; ++i) {
      Link& link = *links_[i];
      if (!(items[i].revents & ZMQ_POLLIN)) {
        // Waiting (e.g. while the learner updates): say we are alive. A learner that does not answer heartbeats
        // is gone (crashed, restarted): reconnect, until worker_give_up_s.
        if (now - link.last_heard > silent_limit) {
          reconnect = &link;
          why = "stopped answering";
        } else if (now - link.last_sent >= interval) {
          if (!SendEnvelope(link.dealer.socket(), heartbeat, &scratch_)) {
            send_failed_ = true;
            failed_link_ = link.Who();
          }
          link.last_sent = now;
        }
        continue;
      }
      Status status;
      bool got = false;
      try {
        got = ReceiveEnvelope(link.dealer.socket(), std::chrono::milliseconds(0), &in, &status);
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) break;  // a signal: loop re-checks stop_requested_
        throw;
      }
      if (!got) continue;
      link.last_heard = Clock::now();
      if (!status.ok()) return status;
      switch (in.body_case()) {
        case wire::Envelope::kAction:
          if (auto s = OnAction(link, in.action()); !s.ok()) return s;
          break;
        case wire::Envelope::kStop:
          spdlog::info("{}: {} says stop ({})", link.identity, link.policy.empty() ? "learner" : link.Who(),
                       in.stop().reason());
          return Status::Ok();
        case wire::Envelope::kHeartbeat:
          break;
        case wire::Envelope::kError:
          if (in.error().code() == wire::Error::UNKNOWN_WORKER) {
            // Every message this identity still has in flight gets the same answer; the new socket never sees them.
            reconnect = &link;
            why = "does not know this worker (" + in.error().message() + ")";
            break;
          }
          return Status::Protocol(
              (link.policy.empty() ? std::string("learner") : fmt::format("the learner of policy {}", link.policy)) +
              " reported an error: " + in.error().message());
        default:
          return Status::Protocol(fmt::format("unexpected message type {} from {}", static_cast<int>(in.body_case()),
                                              link.Who()));
      }
    }
    if (reconnect) {
      if (auto s = Reconnect(*reconnect, why); !s.ok()) return s;
    }
  }
  return Status::Closed("stop requested");
}

}  // namespace farm
