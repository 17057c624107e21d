// The fixed handshake the fuzz target checks messages against, and the valid
// messages its seed corpus starts from (wire_fuzz_seeds writes them).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/wire.h"

namespace farm::fuzz {

// A worker with 6 envs in 2 groups of 3, observations [2, 3], 4 discrete actions
// (the worker side also checks continuous actions of shape [2]); requests are
// also checked as from a multi-agent worker of the same layout (below).
inline constexpr uint32_t kNumEnvs = 6;
inline constexpr uint32_t kNumGroups = 2;
inline constexpr int64_t kGroupSize = 3;
inline const std::vector<int64_t> kObsShape{2, 3};
inline constexpr int64_t kObsNumel = 6;
inline constexpr int64_t kNumActions = 4;
inline const std::vector<int64_t> kBoxActionShape{2};
// The seq each group expects next: group 0 has not started, group 1 is at step 7.
inline const std::vector<uint64_t> kNextSeq{0, 7};
// The same layout for a multi-agent env: 2 agents per env, so 6 rows per group, and a global state of
// shape [5] per env (protocol 3).
inline constexpr uint32_t kNumAgents = 2;
inline constexpr int64_t kGroupRows = kGroupSize * kNumAgents;
inline const std::vector<int64_t> kStateShape{5};
inline constexpr int64_t kStateNumel = 5;

inline Space ObservationSpace() { return Space::Box(kObsShape, {-1.0f}, {1.0f}); }
inline Space BoxActionSpace() { return Space::Box(kBoxActionShape, {-2.0f, -1.0f}, {2.0f, 1.0f}); }

// One valid envelope per message kind, named for the seed file.
inline std::vector<std::pair<std::string, wire::Envelope>> SeedMessages() {
  std::vector<std::pair<std::string, wire::Envelope>> out;
  auto add = [&](const std::string& name) -> wire::Envelope& { return out.emplace_back(name, wire::Envelope{}).second; };

  auto hello = [&](const std::string& name, const Space& action) {
    auto* h = add(name).mutable_hello();
    h->set_protocol_version(kProtocolVersion);
    h->set_worker_id("worker-0-1234");
    h->set_env_name("Debug-v0");
    h->set_num_envs(kNumEnvs);
    h->set_num_groups(kNumGroups);
    ToWire(ObservationSpace(), h->mutable_observation());
    ToWire(action, h->mutable_action());
  };
  hello("hello_discrete", Space::Discrete(kNumActions));
  hello("hello_box", BoxActionSpace());
  hello("hello_multi_agent", Space::Discrete(kNumActions));
  out.back().second.mutable_hello()->set_num_agents(kNumAgents);
  ToWire(Space::Box(kStateShape, {-1.0f}, {1.0f}), out.back().second.mutable_hello()->mutable_global_state());

  std::vector<float> obs(static_cast<std::size_t>(kGroupSize * kObsNumel));
  for (std::size_t i = 0; i < obs.size(); ++i) obs[i] = 0.1f * static_cast<float>(i);
  {
    auto* s = add("step_first").mutable_step();
    s->set_group(0);
    s->set_seq(0);
    s->set_first(true);
    SetTensor(s->mutable_obs(), DType::kFloat32, {kGroupSize, 2, 3}, obs.data(), obs.size() * sizeof(float));
  }
  {
    auto* s = add("step_truncated").mutable_step();
    s->set_group(1);
    s->set_seq(kNextSeq[1]);
    SetTensor(s->mutable_obs(), DType::kFloat32, {kGroupSize, 2, 3}, obs.data(), obs.size() * sizeof(float));
    const std::vector<float> reward{1.0f, 0.0f, -1.0f};
    SetTensor(s->mutable_reward(), DType::kFloat32, {kGroupSize}, reward.data(), reward.size() * sizeof(float));
    s->set_terminated(std::string("\x01\x00\x00", 3));
    s->set_truncated(std::string("\x00\x01\x01", 3));
    s->add_final_obs_index(1);
    s->add_final_obs_index(2);
    SetTensor(s->mutable_final_obs(), DType::kFloat32, {2, 2, 3}, obs.data(), 2 * kObsNumel * sizeof(float));
    auto* ep = s->add_episodes();
    ep->set_episode_return(12.5f);
    ep->set_length(40);
  }
  {
    // Env 1 of the group was truncated: its two agent rows (2 and 3) have final observations and states.
    std::vector<float> rows_obs(static_cast<std::size_t>(kGroupRows * kObsNumel), 0.25f);
    std::vector<float> state(static_cast<std::size_t>(kGroupSize * kStateNumel));
    for (int64_t e = 0; e < kGroupSize; ++e)
      for (int64_t j = 0; j < kStateNumel; ++j) state[static_cast<std::size_t>(e * kStateNumel + j)] = e + 0.1f * j;
    auto* s = add("step_multi_agent").mutable_step();
    s->set_group(1);
    s->set_seq(kNextSeq[1]);
    SetTensor(s->mutable_obs(), DType::kFloat32, {kGroupRows, 2, 3}, rows_obs.data(), rows_obs.size() * 4);
    const std::vector<float> reward(static_cast<std::size_t>(kGroupRows), 0.5f);
    SetTensor(s->mutable_reward(), DType::kFloat32, {kGroupRows}, reward.data(), reward.size() * 4);
    s->set_terminated(std::string(static_cast<std::size_t>(kGroupRows), '\0'));
    s->set_truncated(std::string("\0\0\1\1\0\0", 6));
    s->add_final_obs_index(2);
    s->add_final_obs_index(3);
    SetTensor(s->mutable_final_obs(), DType::kFloat32, {2, 2, 3}, rows_obs.data(), 2 * kObsNumel * 4);
    SetTensor(s->mutable_global_state(), DType::kFloat32, {kGroupSize, kStateNumel}, state.data(), state.size() * 4);
    SetTensor(s->mutable_final_global_state(), DType::kFloat32, {1, kStateNumel}, state.data() + kStateNumel,
              kStateNumel * 4);
  }
  {
    auto* a = add("action_discrete").mutable_action();
    const std::vector<int64_t> act{0, 3, 1};
    a->set_group(1);
    a->set_seq(6);
    a->set_policy_version(2);
    SetTensor(a->mutable_action(), DType::kInt64, {kGroupSize}, act.data(), act.size() * sizeof(int64_t));
  }
  {
    auto* a = add("action_box").mutable_action();
    const std::vector<float> act{0.5f, -0.5f, 1.0f, 0.0f, -2.0f, 1.0f};
    SetTensor(a->mutable_action(), DType::kFloat32, {kGroupSize, 2}, act.data(), act.size() * sizeof(float));
  }
  {
    auto* w = add("welcome").mutable_welcome();
    w->set_accepted(true);
    w->set_policy_version(3);
  }
  add("stop").mutable_stop()->set_reason("reached total_env_steps (100000)");
  {
    auto* e = add("error").mutable_error();
    e->set_message("group 1: seq 9 out of order (expected 7)");
    e->set_seq(9);
    e->set_group(1);
  }
  add("heartbeat").mutable_heartbeat();

  // Near the receivers' limits, so that mutations start close to where sizes overflow.
  {
    wire::Envelope e = out[0].second;  // hello_discrete
    auto* obs_space = e.mutable_hello()->mutable_observation();
    obs_space->clear_shape();
    obs_space->add_shape(int64_t{1} << 31);
    obs_space->add_shape(int64_t{1} << 31);
    out.emplace_back("hello_huge_shape", std::move(e));
  }
  {
    wire::Envelope e = out[0].second;
    e.mutable_hello()->set_num_envs(kMaxEnvsPerWorker);
    e.mutable_hello()->set_num_groups(1);
    out.emplace_back("hello_many_envs", std::move(e));
  }
  {
    wire::Envelope e = out[4].second;  // step_truncated
    e.mutable_step()->mutable_final_obs()->set_shape(0, int64_t{1} << 40);
    out.emplace_back("step_huge_final_obs", std::move(e));
  }
  // Appended, so that the indices above stay put: a multi-discrete action space (nvec [2, 3, 4]).
  hello("hello_multi_discrete", Space::MultiDiscrete({2, 3, 4}));
  return out;
}

}  // namespace farm::fuzz
