// Time-major trajectory storage for one rollout, in arenas that the trainer takes over.
#include "learner/train/trajectory_store.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <stdexcept>
#include <string>

namespace farm {

// ---------------------------------------------------------------- ArenaPool

namespace {
std::size_t PageRound(std::size_t bytes) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return std::max<std::size_t>(page, (bytes + page - 1) / page * page);
}
constexpr std::size_t kHugePageAdviseBytes = std::size_t{4} << 20;
}  // namespace

ArenaPool::~ArenaPool() {
  for (const Spare& s : spare_) ::munmap(s.data, s.capacity);
}

void* ArenaPool::Acquire(std::size_t bytes, std::size_t* capacity) {
  bytes = PageRound(bytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto best = spare_.end();
    for (auto it = spare_.begin(); it != spare_.end(); ++it)
      if (it->capacity >= bytes && it->capacity <= 2 * bytes && (best == spare_.end() || it->capacity < best->capacity))
        best = it;
    if (best != spare_.end()) {
      void* data = best->data;
      *capacity = best->capacity;
      spare_.erase(best);
      return data;
    }
  }
  void* data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (data == MAP_FAILED) throw std::bad_alloc();
  // Pages are committed as steps are written; huge pages make that a fault per 2 MiB instead of per 4 KiB.
  if (bytes >= kHugePageAdviseBytes) (void)::madvise(data, bytes, MADV_HUGEPAGE);
  *capacity = bytes;
  std::lock_guard<std::mutex> lock(mu_);
  mapped_ += static_cast<int64_t>(bytes);
  return data;
}

void ArenaPool::Release(void* data, std::size_t capacity) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (static_cast<int>(spare_.size()) < keep_) {
      spare_.push_back(Spare{data, capacity});
      return;
    }
    mapped_ -= static_cast<int64_t>(capacity);
  }
  ::munmap(data, capacity);
}

int64_t ArenaPool::mapped_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mapped_;
}

// ---------------------------------------------------------------- Arena

// One rollout's arrays for `rows` agent rows (`envs` envs), each field [T, rows, width] (states [T, envs,
// state_numel]; bootstrap [rows]), 64-byte aligned, in one mapping from the pool.
struct TrajectoryStore::Arena {
  Arena(std::shared_ptr<ArenaPool> pool, int64_t T, int64_t rows, int64_t envs, int64_t obs_numel,
        int64_t state_numel, int64_t action_numel, int64_t chunks, int64_t core_numel)
      : pool(std::move(pool)), rows(rows), envs(envs) {
    std::size_t offset = 0;
    auto take = [&](std::size_t bytes) {
      const std::size_t at = offset;
      offset += (bytes + 63) / 64 * 64;
      return at;
    };
    const auto n = static_cast<std::size_t>(T * rows);
    const std::size_t o_obs = take(n * static_cast<std::size_t>(obs_numel) * sizeof(float));
    const std::size_t o_state = take(static_cast<std::size_t>(T * envs * state_numel) * sizeof(float));
    const std::size_t o_action = take(n * static_cast<std::size_t>(action_numel) * 8);  // int64 or float
    const std::size_t o_logp = take(n * sizeof(float));
    const std::size_t o_value = take(n * sizeof(float));
    const std::size_t o_reward = take(n * sizeof(float));
    const std::size_t o_done = take(n * sizeof(float));
    const std::size_t o_active = take(n * sizeof(float));
    const std::size_t o_version = take(n * sizeof(int64_t));
    const std::size_t o_bootstrap = take(static_cast<std::size_t>(rows) * sizeof(float));
    const std::size_t o_core = take(static_cast<std::size_t>(chunks * rows * core_numel) * sizeof(float));
    base = static_cast<char*>(this->pool->Acquire(offset, &capacity));
    obs = reinterpret_cast<float*>(base + o_obs);
    state = reinterpret_cast<float*>(base + o_state);
    action = base + o_action;
    logp = reinterpret_cast<float*>(base + o_logp);
    value = reinterpret_cast<float*>(base + o_value);
    reward = reinterpret_cast<float*>(base + o_reward);
    done = reinterpret_cast<float*>(base + o_done);
    active = reinterpret_cast<float*>(base + o_active);
    version = reinterpret_cast<int64_t*>(base + o_version);
    bootstrap = reinterpret_cast<float*>(base + o_bootstrap);
    core = reinterpret_cast<float*>(base + o_core);
  }
  ~Arena() { pool->Release(base, capacity); }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  std::shared_ptr<ArenaPool> pool;
  const int64_t rows;
  const int64_t envs;
  int64_t alive_rows = 0;  // columns of groups still present (== rows: nothing to skip)
  char* base = nullptr;
  std::size_t capacity = 0;
  float* obs;
  float* state;
  char* action;  // int64 (categorical) or float (box), action_numel per step
  float* logp;
  float* value;
  float* reward;
  float* done;
  float* active;  // 1: the row's agent acted; 0: it had finished before its env ended
  int64_t* version;
  float* bootstrap;
  float* core;  // [chunks, rows, core_numel]: the core states at each chunk's start
};

// ---------------------------------------------------------------- TrajectoryStore

TrajectoryStore::TrajectoryStore(int64_t rollout_length, int64_t obs_numel, const Space& action, int64_t state_numel,
                                 int agents_per_env, int64_t core_numel, int64_t bptt)
    : T_(rollout_length),
      obs_numel_(obs_numel),
      integer_actions_(action.is_categorical()),
      action_numel_(action.numel()),
      action_shape_(action.shape),
      state_numel_(state_numel),
      agents_(std::max(agents_per_env, 1)),
      core_numel_(core_numel),
      bptt_(core_numel > 0 ? bptt : 0),
      pool_(std::make_shared<ArenaPool>()) {
  if (core_numel_ > 0 && (bptt_ <= 0 || T_ % bptt_ != 0))
    throw std::invalid_argument("TrajectoryStore: bptt " + std::to_string(bptt) + " must divide the rollout length " +
                                std::to_string(T_));
}

TrajectoryStore::~TrajectoryStore() = default;

std::shared_ptr<TrajectoryStore::Arena> TrajectoryStore::NewArena(int64_t rows) {
  return std::make_shared<Arena>(pool_, T_, rows, rows / agents_, obs_numel_, state_numel_, action_numel_,
                                 core_numel_ > 0 ? T_ / bptt_ : 0, core_numel_);
}

int TrajectoryStore::AddGroup(int rows) {
  if (rows <= 0 || rows % agents_ != 0)
    throw std::invalid_argument("TrajectoryStore::AddGroup: " + std::to_string(rows) + " rows are not whole envs of " +
                                std::to_string(agents_) + " agents");
  Group g;
  g.rows = rows;
  // A group joining while the others share an arena gets one of its own (its columns only); otherwise it is placed
  // with the others at the next record.
  if (shared_) {
    g.arena = NewArena(rows);
    g.arena->alive_rows = rows;
  }
  groups_.push_back(std::move(g));
  num_rows_ += rows;
  ++alive_groups_;
  return static_cast<int>(groups_.size()) - 1;
}

void TrajectoryStore::RemoveGroup(int group) {
  Group& g = groups_[group];
  if (!g.alive) return;
  if (g.steps == T_) --full_groups_;
  if (g.arena) g.arena->alive_rows -= g.rows;  // its columns are skipped from now on; nothing moves
  num_rows_ -= g.rows;
  g = Group{};
  g.alive = false;
  --alive_groups_;
}

void TrajectoryStore::PlaceGroups() {
  int64_t rows = 0;
  for (const Group& g : groups_)
    if (g.alive && !g.arena) rows += g.rows;
  if (rows == 0) return;
  shared_ = NewArena(rows);
  shared_->alive_rows = rows;
  int64_t col = 0;
  for (Group& g : groups_) {
    if (!g.alive || g.arena) continue;
    g.arena = shared_;
    g.col = col;
    g.env_col = col / agents_;
    col += g.rows;
  }
}

template <class U>
void TrajectoryStore::CopyRows(U* field, int64_t width, int64_t stride_rows, int64_t t, int64_t col, int64_t rows,
                               const U* src) {
  const auto bytes = sizeof(U) * static_cast<std::size_t>(rows * width);
  std::memcpy(field + (t * stride_rows + col) * width, src, bytes);
  copy_.record_bytes += static_cast<int64_t>(bytes);
}

void TrajectoryStore::RecordStep(int group, const float* obs, const void* actions, const float* logp,
                                 const float* value, int64_t policy_version, const float* states,
                                 bool inputs_written, const uint8_t* active) {
  RecordInputs(group, obs, states, inputs_written, active);
  RecordOutputs(group, actions, logp, value, policy_version);
}

void TrajectoryStore::RecordInputs(int group, const float* obs, const float* states, bool inputs_written,
                                   const uint8_t* active) {
  if (!groups_[group].arena) PlaceGroups();
  Group& g = groups_[group];
  Arena& a = *g.arena;
  const int64_t t = g.steps;
  float* acting = a.active + t * a.rows + g.col;
  if (active == nullptr) {
    std::fill_n(acting, g.rows, 1.0f);
  } else {
    for (int i = 0; i < g.rows; ++i) {
      acting[i] = active[i] ? 1.0f : 0.0f;
      inactive_rows_ += active[i] ? 0 : 1;
    }
  }
  copy_.record_bytes += static_cast<int64_t>(sizeof(float)) * g.rows;
  if (inputs_written) {
    copy_.record_bytes += static_cast<int64_t>(sizeof(float)) *
                          (g.rows * obs_numel_ + (state_numel_ > 0 ? g.rows / agents_ * state_numel_ : 0));
  } else {
    CopyRows(a.obs, obs_numel_, a.rows, t, g.col, g.rows, obs);
    if (state_numel_ > 0) CopyRows(a.state, state_numel_, a.envs, t, g.env_col, g.rows / agents_, states);
  }
}

void TrajectoryStore::RecordOutputs(int group, const void* actions, const float* logp, const float* value,
                                    int64_t policy_version, const float* core_state) {
  if (!groups_[group].arena) PlaceGroups();
  Group& g = groups_[group];
  Arena& a = *g.arena;
  const int64_t t = g.steps;
  if (integer_actions_) {
    CopyRows(reinterpret_cast<int64_t*>(a.action), action_numel_, a.rows, t, g.col, g.rows,
             static_cast<const int64_t*>(actions));
  } else {
    CopyRows(reinterpret_cast<float*>(a.action), action_numel_, a.rows, t, g.col, g.rows,
             static_cast<const float*>(actions));
  }
  CopyRows(a.logp, 1, a.rows, t, g.col, g.rows, logp);
  CopyRows(a.value, 1, a.rows, t, g.col, g.rows, value);
  std::fill_n(a.version + t * a.rows + g.col, g.rows, policy_version);
  if (core_numel_ > 0 && t % bptt_ == 0) {
    if (core_state == nullptr)
      throw std::invalid_argument("TrajectoryStore::RecordOutputs: step " + std::to_string(t) +
                                  " starts a chunk, but no core state was given");
    CopyRows(a.core, core_numel_, a.rows, t / bptt_, g.col, g.rows, core_state);
  }
  copy_.record_bytes += static_cast<int64_t>(sizeof(int64_t)) * g.rows;
  g.pending = true;
}

TrajectoryStore::StepInputs TrajectoryStore::NextStepInputs(int group, int ahead) {
  const Group& g = groups_[group];
  const int64_t t = g.steps + ahead;
  if (!g.alive || !g.arena || g.pending != (ahead == 1) || t >= T_) return {};
  Arena& a = *g.arena;
  StepInputs in;
  in.obs = a.obs + (t * a.rows + g.col) * obs_numel_;
  if (state_numel_ > 0) in.states = a.state + (t * a.envs + g.env_col) * state_numel_;
  return in;
}

void TrajectoryStore::RecordOutcome(int group, const float* reward, const uint8_t* terminated,
                                    const uint8_t* truncated) {
  Group& g = groups_[group];
  if (g.skip_outcome) {  // the step it completes was past the last rollout's cut
    g.skip_outcome = false;
    return;
  }
  Arena& a = *g.arena;
  const int64_t t = g.steps;
  CopyRows(a.reward, 1, a.rows, t, g.col, g.rows, reward);
  float* done = a.done + t * a.rows + g.col;
  for (int i = 0; i < g.rows; ++i) {
    done[i] = (terminated[i] || truncated[i]) ? 1.0f : 0.0f;
    max_abs_reward_ = std::max(max_abs_reward_, std::fabs(reward[i]));
  }
  copy_.record_bytes += static_cast<int64_t>(sizeof(float)) * g.rows;
  g.pending = false;
  if (++g.steps == T_) ++full_groups_;
}

void TrajectoryStore::AddReward(int group, int row, float bonus) {
  const Group& g = groups_[group];
  if (g.steps == 0) return;  // its last step fell past a cut (no completed step in this rollout)
  g.arena->reward[(g.steps - 1) * g.arena->rows + g.col + row] += bonus;
}

void TrajectoryStore::SetBootstrap(int group, const float* values) {
  const Group& g = groups_[group];
  std::memcpy(g.arena->bootstrap + g.col, values, sizeof(float) * static_cast<std::size_t>(g.rows));
  copy_.record_bytes += static_cast<int64_t>(sizeof(float)) * g.rows;
}

int64_t TrajectoryStore::bytes() const { return pool_->mapped_bytes(); }

int64_t TrajectoryStore::bytes_per_row_step() const {
  return static_cast<int64_t>(sizeof(float)) * obs_numel_ + 8 * action_numel_ + 4 * 5 + 8 +
         static_cast<int64_t>(sizeof(float)) * state_numel_ / agents_ +
         (core_numel_ > 0 ? static_cast<int64_t>(sizeof(float)) * core_numel_ / bptt_ : 0);
}

void SummarizeLag(LagStats* lag) {
  int64_t samples = 0;
  double sum = 0;
  for (const auto& [l, n] : lag->counts) {
    samples += n;
    sum += static_cast<double>(l) * static_cast<double>(n);
  }
  if (samples == 0) {
    lag->min = lag->p95 = lag->max = 0;
    lag->avg = 0;
    return;
  }
  lag->min = lag->counts.begin()->first;
  lag->max = lag->counts.rbegin()->first;
  lag->avg = sum / static_cast<double>(samples);
  int64_t seen = 0;
  for (const auto& [l, n] : lag->counts) {
    seen += n;
    if (20 * seen >= 19 * samples) {
      lag->p95 = l;
      break;
    }
  }
}

int64_t TrajectoryStore::CutLength(int64_t multiple) const {
  if (alive_groups_ == 0 || multiple <= 0) return 0;
  int64_t length = T_;
  for (const Group& g : groups_) {
    if (!g.alive) continue;
    // The last step whose value is recorded: its pending step's, else the one before its next (whose outcome is
    // in); a full group has its bootstrap.
    const int64_t valued = g.steps == T_ ? T_ : g.pending ? g.steps : g.steps - 1;
    length = std::min(length, valued);
  }
  return length <= 0 ? 0 : length / multiple * multiple;
}

Rollout TrajectoryStore::Take(const std::vector<int64_t>& obs_shape, int64_t current_version, LagStats* lag,
                              const std::vector<int64_t>& state_shape, int64_t length) {
  if (length <= 0) length = T_;
  const int64_t multiple = core_numel_ > 0 ? bptt_ : 1;
  if (length < T_ && (length > CutLength(multiple) || length % multiple != 0))
    throw std::invalid_argument("TrajectoryStore::Take: a rollout cut at " + std::to_string(length) +
                                " steps, where it can be cut at " + std::to_string(CutLength(multiple)) +
                                " at most, in multiples of " + std::to_string(multiple));
  const int64_t L = length;
  if (state_numel_ > 0 && !state_shape.empty()) {
    int64_t numel = 1;
    for (int64_t d : state_shape) numel *= d;
    if (numel != state_numel_)
      throw std::invalid_argument("TrajectoryStore::Take: state shape has " + std::to_string(numel) +
                                  " elements, but the store keeps " + std::to_string(state_numel_) + " per env");
  }
  const int64_t N = num_rows_;
  if (L < T_) {
    // A cut: each group bootstraps from the value it recorded at step L; what it acted on past L is left out.
    ++copy_.cut_takes;
    copy_.cut_steps += L;
    for (const Group& g : groups_) {
      if (!g.alive) continue;
      Arena& a = *g.arena;
      std::memcpy(a.bootstrap + g.col, a.value + L * a.rows + g.col, sizeof(float) * static_cast<std::size_t>(g.rows));
      copy_.cut_dropped_rows += (g.steps + (g.pending ? 1 : 0) - L) * g.rows;
    }
  }
  const int64_t E = N / agents_;
  ++copy_.takes;
  // The arena the groups share holds exactly the groups present, in order: it is the rollout. Otherwise (joins,
  // leaves since it was made) gather the groups present into a fresh one.
  bool whole = shared_ && shared_->rows == N && shared_->alive_rows == N;
  for (const Group& g : groups_)
    if (g.alive && g.arena != shared_) whole = false;
  std::shared_ptr<Arena> arena;
  if (whole) {
    arena = shared_;
    ++copy_.zero_copy_takes;
  } else {
    arena = NewArena(N);
    const std::size_t action_bytes = static_cast<std::size_t>(action_numel_) * 8;
    int64_t col = 0;
    int64_t gathered = 0;
    auto gather = [&](auto* dst, const auto* src, int64_t width, int64_t dst_rows, int64_t src_rows, int64_t dst_col,
                      int64_t src_col, int64_t rows, int64_t steps) {
      const auto bytes = sizeof(*dst) * static_cast<std::size_t>(rows * width);
      for (int64_t t = 0; t < steps; ++t)
        std::memcpy(dst + (t * dst_rows + dst_col) * width, src + (t * src_rows + src_col) * width, bytes);
      gathered += static_cast<int64_t>(bytes) * steps;
    };
    for (const Group& g : groups_) {
      if (!g.alive) continue;
      const Arena& s = *g.arena;
      gather(arena->obs, s.obs, obs_numel_, N, s.rows, col, g.col, g.rows, L);
      if (state_numel_ > 0) gather(arena->state, s.state, state_numel_, E, s.envs, col / agents_, g.env_col,
                                   g.rows / agents_, L);
      gather(arena->action, s.action, static_cast<int64_t>(action_bytes), N, s.rows, col, g.col, g.rows, L);
      gather(arena->logp, s.logp, 1, N, s.rows, col, g.col, g.rows, L);
      gather(arena->value, s.value, 1, N, s.rows, col, g.col, g.rows, L);
      gather(arena->reward, s.reward, 1, N, s.rows, col, g.col, g.rows, L);
      gather(arena->done, s.done, 1, N, s.rows, col, g.col, g.rows, L);
      gather(arena->active, s.active, 1, N, s.rows, col, g.col, g.rows, L);
      gather(arena->version, s.version, 1, N, s.rows, col, g.col, g.rows, L);
      gather(arena->bootstrap, s.bootstrap, 1, N, s.rows, col, g.col, g.rows, 1);
      if (core_numel_ > 0) gather(arena->core, s.core, core_numel_, N, s.rows, col, g.col, g.rows, L / bptt_);
      col += g.rows;
    }
    copy_.take_gather_bytes += gathered;
  }
  if (lag) {
    *lag = LagStats{};
    int64_t previous = std::numeric_limits<int64_t>::min();
    int64_t* run = nullptr;  // versions come in long runs of one value: one map lookup per run
    for (int64_t i = 0; i < L * N; ++i) {
      const int64_t l = current_version - arena->version[i];
      if (l != previous || run == nullptr) {
        run = &lag->counts[l];
        previous = l;
      }
      ++*run;
    }
    SummarizeLag(lag);
  }

  // Every tensor keeps the arena alive; the last one dropped gives it back to the pool.
  auto view = [&](void* data, std::vector<int64_t> shape, torch::Dtype dtype) {
    return torch::from_blob(data, shape, [arena](void*) {}, torch::TensorOptions().dtype(dtype));
  };
  const auto f32 = torch::kFloat32;
  std::vector<int64_t> shape{L, N};
  shape.insert(shape.end(), obs_shape.begin(), obs_shape.end());
  Rollout r;
  r.obs = view(arena->obs, shape, f32);
  r.rows_per_state = agents_;
  if (state_numel_ > 0) {
    std::vector<int64_t> sshape{L, E};
    if (state_shape.empty()) {
      sshape.push_back(state_numel_);
    } else {
      sshape.insert(sshape.end(), state_shape.begin(), state_shape.end());
    }
    r.states = view(arena->state, sshape, f32);
  }
  // [T, N] for a discrete space, [T, N, K] multi-discrete, [T, N, action numel] box (flat).
  std::vector<int64_t> ashape{L, N};
  if (!integer_actions_ || !action_shape_.empty()) ashape.push_back(action_numel_);
  r.actions = view(arena->action, ashape, integer_actions_ ? torch::kInt64 : f32);
  r.logp = view(arena->logp, {L, N}, f32);
  r.values = view(arena->value, {L, N}, f32);
  r.rewards = view(arena->reward, {L, N}, f32);
  r.dones = view(arena->done, {L, N}, f32);
  if (inactive_rows_ > 0) {  // some may lie past a cut, or in a group that left: the rollout's own decide
    torch::Tensor active = view(arena->active, {L, N}, f32);
    if ((active == 0).any().item<bool>()) r.active = std::move(active);
  }
  r.last_value = view(arena->bootstrap, {N}, f32);
  r.lag = current_version - view(arena->version, {L, N}, torch::kInt64);  // its own memory, not the arena's
  if (core_numel_ > 0) {
    r.core_states = view(arena->core, {L / bptt_, N, core_numel_}, f32);
    r.bptt = bptt_;
  }

  // Every group starts afresh, placed in a new shared arena at the next record.
  shared_.reset();
  for (auto& g : groups_) {
    if (!g.alive) continue;
    g.arena.reset();
    g.steps = 0;
    g.skip_outcome = g.pending;  // only after a cut: a full group has no step pending
    g.pending = false;
  }
  full_groups_ = 0;
  inactive_rows_ = 0;
  return r;
}

}  // namespace farm
