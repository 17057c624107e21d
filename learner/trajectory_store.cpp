// Time-major trajectory storage for one rollout.
#include "learner/trajectory_store.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

namespace farm {

TrajectoryStore::TrajectoryStore(int64_t rollout_length, int64_t obs_numel, const Space& action,
                                 int64_t state_numel)
    : T_(rollout_length),
      obs_numel_(obs_numel),
      integer_actions_(action.is_categorical()),
      action_numel_(action.numel()),
      action_shape_(action.shape),
      state_numel_(state_numel) {}

namespace {
// Re-lays [T, old_n, width] as [T, new_n, width], keeping the data.
template <class U>
void Relayout(std::vector<U>& v, int64_t T, int64_t old_n, int64_t new_n, int64_t width) {
  std::vector<U> out(static_cast<std::size_t>(T * new_n * width));
  for (int64_t t = 0; t < T && old_n > 0; ++t)
    std::copy_n(v.begin() + t * old_n * width, old_n * width, out.begin() + t * new_n * width);
  v.swap(out);
}

// Drops columns [base, base + size) of [T, n, width], keeping the others in order.
template <class U>
void DropColumns(std::vector<U>& v, int64_t T, int64_t n, int64_t base, int64_t size, int64_t width) {
  std::vector<U> out(static_cast<std::size_t>(T * (n - size) * width));
  auto dst = out.begin();
  for (int64_t t = 0; t < T; ++t) {
    const auto row = v.begin() + t * n * width;
    dst = std::copy(row, row + base * width, dst);
    dst = std::copy(row + (base + size) * width, row + n * width, dst);
  }
  v.swap(out);
}
}  // namespace

void TrajectoryStore::Grow(int64_t n) {
  Relayout(obs_, T_, num_envs_, n, obs_numel_);
  if (state_numel_ > 0) Relayout(state_, T_, num_envs_, n, state_numel_);
  if (integer_actions_) {
    Relayout(disc_, T_, num_envs_, n, action_numel_);
  } else {
    Relayout(cont_, T_, num_envs_, n, action_numel_);
  }
  for (auto* v : {&logp_, &value_, &reward_, &done_}) Relayout(*v, T_, num_envs_, n, 1);
  Relayout(version_, T_, num_envs_, n, 1);
  bootstrap_.resize(static_cast<std::size_t>(n));
  num_envs_ = n;
}

int TrajectoryStore::AddGroup(int size) {
  Group g;
  g.base = num_envs_;
  g.size = size;
  Grow(num_envs_ + size);
  groups_.push_back(g);
  ++alive_groups_;
  return static_cast<int>(groups_.size()) - 1;
}

template <class U>
void TrajectoryStore::CopyRows(std::vector<U>& field, int64_t width, int64_t t, const Group& g, const U* src) {
  std::memcpy(field.data() + (t * num_envs_ + g.base) * width, src, sizeof(U) * static_cast<std::size_t>(g.size * width));
}

void TrajectoryStore::RecordStep(int group, const float* obs, const void* actions, const float* logp,
                                 const float* value, int64_t policy_version, const float* states) {
  Group& g = groups_[group];
  const int64_t t = g.steps;
  CopyRows(obs_, obs_numel_, t, g, obs);
  if (state_numel_ > 0) CopyRows(state_, state_numel_, t, g, states);
  if (integer_actions_) {
    CopyRows(disc_, action_numel_, t, g, static_cast<const int64_t*>(actions));
  } else {
    CopyRows(cont_, action_numel_, t, g, static_cast<const float*>(actions));
  }
  CopyRows(logp_, 1, t, g, logp);
  CopyRows(value_, 1, t, g, value);
  std::fill_n(version_.begin() + t * num_envs_ + g.base, g.size, policy_version);
  g.pending = true;
}

void TrajectoryStore::RecordOutcome(int group, const float* reward, const uint8_t* terminated,
                                    const uint8_t* truncated) {
  Group& g = groups_[group];
  const int64_t t = g.steps;
  CopyRows(reward_, 1, t, g, reward);
  float* done = done_.data() + t * num_envs_ + g.base;
  for (int i = 0; i < g.size; ++i) done[i] = (terminated[i] || truncated[i]) ? 1.0f : 0.0f;
  g.pending = false;
  if (++g.steps == T_) ++full_groups_;
}

void TrajectoryStore::RemoveGroup(int group) {
  Group& g = groups_[group];
  if (!g.alive) return;
  if (g.steps == T_) --full_groups_;
  // Free its columns now: workers that come and go (preempted, restarted, rejoining) must not grow the store.
  const int64_t base = g.base, size = g.size, n = num_envs_;
  DropColumns(obs_, T_, n, base, size, obs_numel_);
  if (state_numel_ > 0) DropColumns(state_, T_, n, base, size, state_numel_);
  if (integer_actions_) {
    DropColumns(disc_, T_, n, base, size, action_numel_);
  } else {
    DropColumns(cont_, T_, n, base, size, action_numel_);
  }
  for (auto* v : {&logp_, &value_, &reward_, &done_}) DropColumns(*v, T_, n, base, size, 1);
  DropColumns(version_, T_, n, base, size, 1);
  DropColumns(bootstrap_, 1, n, base, size, 1);
  num_envs_ = n - size;
  for (Group& other : groups_)
    if (other.alive && other.base > base) other.base -= size;
  g = Group{};
  g.alive = false;
  --alive_groups_;
}

void TrajectoryStore::AddReward(int group, int env, float bonus) {
  const Group& g = groups_[group];
  reward_[static_cast<std::size_t>((g.steps - 1) * num_envs_ + g.base + env)] += bonus;
}

void TrajectoryStore::SetBootstrap(int group, const float* values) {
  const Group& g = groups_[group];
  std::memcpy(bootstrap_.data() + g.base, values, sizeof(float) * static_cast<std::size_t>(g.size));
}

Rollout TrajectoryStore::Take(const std::vector<int64_t>& obs_shape, int64_t current_version, LagStats* lag,
                              const std::vector<int64_t>& state_shape) {
  const int64_t N = num_envs_;
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  auto i64 = torch::TensorOptions().dtype(torch::kInt64);
  std::vector<int64_t> shape{T_, N};
  shape.insert(shape.end(), obs_shape.begin(), obs_shape.end());
  Rollout r;
  r.obs = torch::from_blob(obs_.data(), shape, f32).clone();
  if (state_numel_ > 0) {
    std::vector<int64_t> sshape{T_, N};
    sshape.insert(sshape.end(), state_shape.begin(), state_shape.end());
    int64_t numel = 1;
    for (int64_t d : state_shape) numel *= d;
    if (state_shape.empty()) {
      sshape.push_back(state_numel_);
    } else if (numel != state_numel_) {
      throw std::invalid_argument("TrajectoryStore::Take: state shape has " + std::to_string(numel) +
                                  " elements, but the store keeps " + std::to_string(state_numel_) + " per row");
    }
    r.states = torch::from_blob(state_.data(), sshape, f32).clone();
  }
  // [T, N] for a discrete space, [T, N, K] multi-discrete, [T, N, action numel] box (flat, as before).
  std::vector<int64_t> ashape{T_, N};
  if (!integer_actions_ || !action_shape_.empty()) ashape.push_back(action_numel_);
  if (integer_actions_) {
    r.actions = torch::from_blob(disc_.data(), ashape, i64).clone();
  } else {
    r.actions = torch::from_blob(cont_.data(), ashape, f32).clone();
  }
  r.logp = torch::from_blob(logp_.data(), {T_, N}, f32).clone();
  r.values = torch::from_blob(value_.data(), {T_, N}, f32).clone();
  r.rewards = torch::from_blob(reward_.data(), {T_, N}, f32).clone();
  r.dones = torch::from_blob(done_.data(), {T_, N}, f32).clone();
  r.last_value = torch::from_blob(bootstrap_.data(), {N}, f32).clone();
  const torch::Tensor versions = torch::from_blob(version_.data(), {T_, N}, i64);
  if (lag) {
    const auto l = current_version - versions;
    *lag = LagStats{l.min().item<int64_t>(), l.to(torch::kFloat64).mean().item<double>(), l.max().item<int64_t>()};
  }
  for (auto& g : groups_) {
    if (!g.alive) continue;
    g.steps = 0;
    g.pending = false;
  }
  full_groups_ = 0;
  return r;
}

}  // namespace farm
