// Admission of workers and of their requests.
#include "learner/serve/worker_registry.h"

#include <algorithm>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace farm {
namespace {

using Clock = std::chrono::steady_clock;

// How often sanitize mode may warn about one worker's non-finite values.
constexpr std::chrono::seconds kNonFiniteWarnInterval{10};
// Queue slots kept for what is not a group's request (Hellos, heartbeats of unknown workers).
constexpr int kQueueSlotsForControl = 16;

std::string StateName(const std::optional<Space>& state) { return state ? state->ToString() : std::string("none"); }

}  // namespace

WorkerRegistry::WorkerRegistry(const FarmConfig& config) : config_(config) {}

Status WorkerRegistry::CheckHello(const std::string& identity, const wire::Hello& h,
                                  const NormalizerOptions& normalization, Handshake* hs) const {
  if (auto s = farm::CheckHello(h, hs); !s.ok()) return s;
  if (auto s = NormalizerOptions::CheckMatches(h.normalization(), normalization); !s.ok()) return s;
  // A message over the limit would not be refused but lost (ZeroMQ drops the connection): refuse the layout.
  if (const int64_t largest = MaxSessionMessageBytes(hs->group_rows, hs->observation, hs->action, hs->global_state) +
                              (normalization.any() ? MaxNormalizerStatsBytes(hs->observation.numel()) : 0);
      largest > config_.transport.max_message_bytes)
    return Status::InvalidArgument(
        fmt::format("{} envs per group with observation {} may need {}-byte messages, more than the learner's "
                    "transport.max_message_bytes ({}); raise it, or use more env.num_groups",
                    hs->group_size, hs->observation.ToString(), largest, config_.transport.max_message_bytes));
  if (workers_.count(identity)) return Status::InvalidArgument("this worker id already said hello");
  // Each group has at most one request in flight: the queue must hold one per group, or the I/O thread would
  // have to refuse requests that follow the rules.
  const int groups = total_groups_ + static_cast<int>(hs->num_groups);
  if (groups > config_.batcher.queue_capacity - kQueueSlotsForControl)
    return Status::InvalidArgument(fmt::format(
        "this worker's {} groups would make {} groups in the run, more than batcher.queue_capacity ({}) less {} "
        "slots kept for control messages; raise batcher.queue_capacity on the learner",
        hs->num_groups, groups, config_.batcher.queue_capacity, kQueueSlotsForControl));
  if (!run_) return Status::Ok();
  if (h.env_name() != run_->env_name || hs->observation != run_->observation || hs->action != run_->action)
    return Status::InvalidArgument(fmt::format(
        "env {} with observation {} and action {} does not match this run's {} ({}, {})", h.env_name(),
        hs->observation.ToString(), hs->action.ToString(), run_->env_name, run_->observation.ToString(),
        run_->action.ToString()));
  if (hs->num_agents != run_->num_agents || hs->global_state != run_->global_state)
    return Status::InvalidArgument(fmt::format(
        "env {} has {} agent(s) per env and global state {}, but this run's workers have {} and {}", h.env_name(),
        hs->num_agents,
        StateName(hs->global_state), run_->num_agents, StateName(run_->global_state)));
  return Status::Ok();
}

WorkerState& WorkerRegistry::Add(const std::string& identity, const Handshake& hs, std::vector<int> store_groups) {
  WorkerState ws;
  ws.identity = identity;
  ws.group_rows = static_cast<int>(hs.group_rows);  // a multi-agent env's agents are rows of their own
  ws.group_envs = static_cast<int>(hs.group_size);
  ws.store_group = std::move(store_groups);
  ws.next_seq.assign(hs.num_groups, 0);
  ws.acted.assign(hs.num_groups, 0);
  total_groups_ += static_cast<int>(hs.num_groups);
  return workers_.insert_or_assign(identity, std::move(ws)).first->second;
}

std::optional<WorkerState> WorkerRegistry::Remove(const std::string& identity) {
  const auto it = workers_.find(identity);
  if (it == workers_.end()) return std::nullopt;
  std::optional<WorkerState> out = std::move(it->second);
  workers_.erase(it);
  total_groups_ -= static_cast<int>(out->next_seq.size());
  return out;
}

WorkerState* WorkerRegistry::Find(const std::string& identity) {
  const auto it = workers_.find(identity);
  return it == workers_.end() ? nullptr : &it->second;
}

WorkerConnection WorkerConnection::Of(const std::string& identity) {
  const auto dash = identity.rfind("-c");
  if (dash != std::string::npos && dash > 0) {
    const std::string digits = identity.substr(dash + 2);
    if (!digits.empty() && digits.size() <= 18 &&
        std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return {identity.substr(0, dash), std::stoll(digits)};
  }
  return {identity, 0};
}

std::vector<std::string> WorkerRegistry::OtherConnections(const std::string& identity) const {
  const WorkerConnection self = WorkerConnection::Of(identity);
  std::vector<std::pair<int64_t, std::string>> found;
  for (const auto& [id, ws] : workers_) {
    if (id == identity) continue;
    const WorkerConnection other = WorkerConnection::Of(id);
    if (other.process == self.process) found.emplace_back(other.connection, id);
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& [n, id] : found) out.push_back(std::move(id));
  return out;
}

Status WorkerRegistry::CheckStep(const WorkerState& ws, const wire::StepRequest& req) const {
  // The checks themselves need no LibTorch (common/wire.h), so tests/fuzz feeds them arbitrary bytes.
  if (auto s = CheckStepRequest(req, ws.group_rows, run_->observation.shape, ws.next_seq); !s.ok()) return s;
  if (auto s = CheckStepGlobalState(req, ws.group_rows, run_->num_agents,
                                    run_->global_state ? &run_->global_state->shape : nullptr);
      !s.ok())
    return s;
  // Truncated envs' final observations (and states) come as whole envs: the critic runs once per env.
  if (auto s = CheckStepWholeEnvs(req, run_->num_agents); !s.ok()) return s;
  if (!req.first() && !ws.acted[req.group()])
    return Status::Protocol(fmt::format("group {}: step results before the learner sent actions", req.group()));
  return Status::Ok();
}

void WorkerRegistry::Accept(WorkerState& ws, const wire::StepRequest& req) {
  ws.acted[req.group()] = 0;
  ++ws.next_seq[req.group()];
}

Status WorkerRegistry::AdmitNonFinite(WorkerState& ws, wire::StepRequest* req, int64_t* sanitized) {
  *sanitized = 0;
  NonFinite first;
  if (!FindNonFinite(*req, &first)) return Status::Ok();
  const bool in_state = first.field == "StepRequest.global_state" || first.field == "StepRequest.final_global_state";
  const std::string where =
      first.ToString(first.field == "StepRequest.obs" || first.field == "StepRequest.final_obs" ? run_->observation.numel()
                     : in_state && run_->global_state                                          ? run_->global_state->numel()
                                                                                                : 1);
  if (config_.learner.non_finite == "reject")
    return Status::InvalidArgument(fmt::format(
        "worker {}: non-finite value {}; request refused, nothing recorded (learner.non_finite: reject; 'sanitize' "
        "would replace such values by 0)",
        ws.identity, where));
  const int64_t replaced = SanitizeNonFinite(req);
  *sanitized = replaced;
  ws.non_finite_unreported += replaced;
  const auto now = Clock::now();
  if (!ws.last_non_finite_warning || now - *ws.last_non_finite_warning >= kNonFiniteWarnInterval) {
    spdlog::warn("worker {}: replaced {} non-finite value(s) by 0 {} (this one: {}; learner.non_finite: sanitize)",
                 ws.identity, ws.non_finite_unreported,
                 ws.last_non_finite_warning
                     ? fmt::format("in the last {:.0f} s",
                                   std::chrono::duration<double>(now - *ws.last_non_finite_warning).count())
                     : std::string("in its first such request"),
                 where);
    ws.non_finite_unreported = 0;
    ws.last_non_finite_warning = now;
  }
  return Status::Ok();
}

}  // namespace farm
