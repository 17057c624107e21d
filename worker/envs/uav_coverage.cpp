// uav_coverage: multi-UAV grid coverage, registered as "uav_coverage". The
// rules are in the header.
#include "worker/envs/uav_coverage.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace farm {
namespace {

constexpr int kMaxGrid = 1024;

// Options arrive as doubles (YAML numbers).
int WholeOption(const EnvOptions& options, const char* key, int min, int max) {
  const auto it = options.find(key);
  if (it == options.end()) throw std::invalid_argument(fmt::format("option '{}' missing", key));
  const double v = it->second;
  if (!(v >= min && v <= max) || std::floor(v) != v)
    throw std::invalid_argument(
        fmt::format("option '{}' must be a whole number from {} to {}, got {}", key, min, max, v));
  return static_cast<int>(v);
}

double RealOption(const EnvOptions& options, const char* key, double min) {
  const auto it = options.find(key);
  if (it == options.end()) throw std::invalid_argument(fmt::format("option '{}' missing", key));
  const double v = it->second;
  if (!std::isfinite(v) || v < min)
    throw std::invalid_argument(fmt::format("option '{}' must be a finite number >= {}, got {}", key, min, v));
  return v;
}

// Row and column steps of the five actions.
constexpr int kDRow[UavCoverage::kNumActions] = {0, -1, 1, 0, 0};
constexpr int kDCol[UavCoverage::kNumActions] = {0, 0, 0, -1, 1};

}  // namespace

UavCoverageOptions ParseUavCoverageOptions(const EnvOptions& resolved) {
  UavCoverageOptions o;
  o.grid = WholeOption(resolved, "grid", 2, kMaxGrid);
  const int cells = o.grid * o.grid;
  o.agents = WholeOption(resolved, "agents", 1, cells);
  o.obstacles = WholeOption(resolved, "obstacles", 0, cells);
  if (o.agents + o.obstacles > cells)
    throw std::invalid_argument(
        fmt::format("options 'agents' + 'obstacles' ({} + {}) must fit on the {} cells of the "
                    "grid",
                    o.agents, o.obstacles, cells));
  o.window = WholeOption(resolved, "window", 1, 2 * o.grid + 1);
  if (o.window % 2 == 0)
    throw std::invalid_argument(fmt::format("option 'window' must be odd (the agent at its centre), got {}", o.window));
  o.max_steps = WholeOption(resolved, "max_steps", 1, 1000000000);
  o.cover_radius = WholeOption(resolved, "cover_radius", 0, o.grid);
  o.cell_reward = RealOption(resolved, "cell_reward", 0.0);
  o.collision_penalty = RealOption(resolved, "collision_penalty", 0.0);
  o.battery = WholeOption(resolved, "battery", 0, 1000000000);
  return o;
}

UavCoverage::UavCoverage(const UavCoverageOptions& options, uint64_t seed) : o_(options), rng_(seed) {
  const auto cells = static_cast<std::size_t>(o_.grid) * static_cast<std::size_t>(o_.grid);
  const auto agents = static_cast<std::size_t>(o_.agents);
  obstacle_.assign(cells, 0);
  covered_.assign(cells, 0);
  occupant_.assign(cells, -1);
  claims_.assign(cells, 0);
  cells_.resize(cells);
  pos_.assign(agents, 0);
  target_.assign(agents, 0);
  moving_.assign(agents, 0);
  revert_.assign(agents, 0);
  battery_left_.assign(agents, o_.battery);
}

int UavCoverage::CoverAround(int cell) {
  const int row = cell / o_.grid;
  const int col = cell % o_.grid;
  const int r = o_.cover_radius;
  int added = 0;
  for (int y = std::max(0, row - r); y <= std::min(o_.grid - 1, row + r); ++y) {
    for (int x = std::max(0, col - r); x <= std::min(o_.grid - 1, col + r); ++x) {
      const int c = Cell(y, x);
      if (obstacle_[c] || covered_[c]) continue;
      covered_[c] = 1;
      ++added;
    }
  }
  covered_count_ += added;
  return added;
}

void UavCoverage::StartCoverage() {
  std::fill(covered_.begin(), covered_.end(), 0);
  std::fill(occupant_.begin(), occupant_.end(), -1);
  covered_count_ = 0;
  free_cells_ = 0;
  for (uint8_t o : obstacle_) free_cells_ += o ? 0 : 1;
  for (int a = 0; a < o_.agents; ++a) {
    occupant_[pos_[a]] = a;
    CoverAround(pos_[a]);
  }
  last_collisions_ = 0;
  last_new_cells_ = 0;
  std::fill(battery_left_.begin(), battery_left_.end(), o_.battery);
}

void UavCoverage::reset(float* obs) {
  // Obstacles, then agents: the first obstacles + agents cells of a partial
  // Fisher-Yates shuffle (rng() % n: the same draws on every standard library).
  const int cells = o_.grid * o_.grid;
  for (int i = 0; i < cells; ++i) cells_[i] = i;
  const int drawn = o_.obstacles + o_.agents;
  for (int i = 0; i < drawn; ++i) {
    const int j = i + static_cast<int>(rng_() % static_cast<uint64_t>(cells - i));
    std::swap(cells_[i], cells_[j]);
  }
  std::fill(obstacle_.begin(), obstacle_.end(), 0);
  for (int i = 0; i < o_.obstacles; ++i) obstacle_[cells_[i]] = 1;
  for (int a = 0; a < o_.agents; ++a) pos_[a] = cells_[o_.obstacles + a];
  StartCoverage();
  WriteObs(obs);
}

StepResult UavCoverage::step(const ActionRef& action, float* obs) {
  const int n = o_.agents;
  int collisions = 0;
  // Intended moves; the border and obstacles block at once.
  const bool battery = o_.battery > 0;
  for (int a = 0; a < n; ++a) {
    const int64_t act = action.discrete[a];
    // EnvGroup checks actions against the spec; this catches direct callers.
    if (act < 0 || act >= kNumActions)
      throw std::out_of_range(
          fmt::format("uav_coverage: agent {} got action {}, expected [0, {})", a, act, kNumActions));
    const int row = pos_[a] / o_.grid + kDRow[act];
    const int col = pos_[a] % o_.grid + kDCol[act];
    moving_[a] = 0;
    target_[a] = pos_[a];
    if (act == kStay) continue;
    if (battery) {
      // A done UAV stays, whatever it is told (the learner leaves its rows out); a move uses a unit, blocked or not.
      if (battery_left_[a] == 0) continue;
      --battery_left_[a];
    }
    if (!Inside(row, col) || obstacle_[Cell(row, col)]) {
      ++collisions;
      continue;
    }
    moving_[a] = 1;
    target_[a] = Cell(row, col);
  }
  // Movers that share a target, and swapping pairs, are all blocked (judged on
  // the intended moves, so the order of the agents does not matter).
  for (int a = 0; a < n; ++a)
    if (moving_[a]) ++claims_[target_[a]];
  for (int a = 0; a < n; ++a) {
    revert_[a] = 0;
    if (!moving_[a]) continue;
    const int b = occupant_[target_[a]];
    const bool swap = b >= 0 && moving_[b] && target_[b] == pos_[a];
    revert_[a] = claims_[target_[a]] > 1 || swap;
  }
  for (int a = 0; a < n; ++a)
    if (moving_[a]) claims_[target_[a]] = 0;
  for (int a = 0; a < n; ++a) {
    if (!revert_[a]) continue;
    moving_[a] = 0;
    target_[a] = pos_[a];
    ++collisions;
  }
  // A move onto the cell of an agent that stays there is blocked, until no
  // more are: the blocked set only grows, so the result is order-free.
  for (bool changed = true; changed;) {
    changed = false;
    for (int a = 0; a < n; ++a) {
      if (!moving_[a]) continue;
      const int b = occupant_[target_[a]];
      if (b < 0 || moving_[b]) continue;
      moving_[a] = 0;
      target_[a] = pos_[a];
      ++collisions;
      changed = true;
    }
  }
  // Move: targets are now distinct, so vacate every mover's cell first.
  for (int a = 0; a < n; ++a)
    if (moving_[a]) occupant_[pos_[a]] = -1;
  int new_cells = 0;
  for (int a = 0; a < n; ++a) {
    pos_[a] = target_[a];
    occupant_[pos_[a]] = a;
    new_cells += CoverAround(pos_[a]);
  }
  last_collisions_ = collisions;
  last_new_cells_ = new_cells;
  WriteObs(obs);
  StepResult result;
  result.reward = static_cast<float>(o_.cell_reward * new_cells - o_.collision_penalty * collisions);
  result.terminated = covered_count_ == free_cells_;
  if (battery && !result.terminated)
    result.terminated = std::all_of(battery_left_.begin(), battery_left_.end(), [](int left) { return left == 0; });
  return result;
}

void UavCoverage::WriteObs(float* obs) const {
  const int w = o_.window;
  const int half = w / 2;
  const auto plane = static_cast<std::size_t>(w) * static_cast<std::size_t>(w);
  const auto last = static_cast<float>(o_.grid - 1);
  const int channels = obs_channels();
  for (int a = 0; a < o_.agents; ++a) {
    float* out = obs + static_cast<std::size_t>(a) * channels * plane;
    const int row = pos_[a] / o_.grid;
    const int col = pos_[a] % o_.grid;
    float* blocked = out;
    float* covered = out + plane;
    float* others = out + 2 * plane;
    for (int i = 0; i < w; ++i) {
      for (int j = 0; j < w; ++j) {
        const int y = row - half + i;
        const int x = col - half + j;
        const std::size_t k = static_cast<std::size_t>(i) * w + j;
        if (!Inside(y, x)) {
          blocked[k] = 1.0f;
          covered[k] = 0.0f;
          others[k] = 0.0f;
          continue;
        }
        const int c = Cell(y, x);
        blocked[k] = obstacle_[c] ? 1.0f : 0.0f;
        covered[k] = covered_[c] ? 1.0f : 0.0f;
        others[k] = occupant_[c] >= 0 && occupant_[c] != a ? 1.0f : 0.0f;
      }
    }
    std::fill(out + 3 * plane, out + 4 * plane, static_cast<float>(col) / last);
    std::fill(out + 4 * plane, out + 5 * plane, static_cast<float>(row) / last);
    if (o_.battery > 0)
      std::fill(out + 5 * plane, out + 6 * plane,
                static_cast<float>(battery_left_[a]) / static_cast<float>(o_.battery));
  }
}

void UavCoverage::state(float* out) const {
  const auto cells = static_cast<std::size_t>(o_.grid) * static_cast<std::size_t>(o_.grid);
  for (std::size_t c = 0; c < cells; ++c) {
    out[c] = obstacle_[c] ? 1.0f : 0.0f;
    out[cells + c] = covered_[c] ? 1.0f : 0.0f;
    out[2 * cells + c] = occupant_[c] >= 0 ? 1.0f : 0.0f;
  }
  if (o_.battery > 0) {
    float* left = out + 3 * cells;
    std::fill(left, left + cells, 0.0f);
    for (int a = 0; a < o_.agents; ++a)
      left[pos_[a]] = static_cast<float>(battery_left_[a]) / static_cast<float>(o_.battery);
  }
}

void UavCoverage::agents_done(uint8_t* out) const {
  for (int a = 0; a < o_.agents; ++a) out[a] = done(a) ? 1 : 0;
}

void UavCoverage::SetLayout(const std::vector<std::pair<int, int>>& obstacles,
                            const std::vector<std::pair<int, int>>& agents, float* obs) {
  if (static_cast<int>(agents.size()) != o_.agents)
    throw std::invalid_argument(fmt::format("SetLayout: {} agent cells for {} agents", agents.size(), o_.agents));
  std::vector<uint8_t> obstacle(obstacle_.size(), 0);
  for (const auto& [row, col] : obstacles) {
    if (!Inside(row, col))
      throw std::invalid_argument(fmt::format("SetLayout: obstacle ({}, {}) off the grid", row, col));
    obstacle[Cell(row, col)] = 1;
  }
  std::vector<uint8_t> taken(obstacle_.size(), 0);
  for (const auto& [row, col] : agents) {
    if (!Inside(row, col) || obstacle[Cell(row, col)] || taken[Cell(row, col)])
      throw std::invalid_argument(
          fmt::format("SetLayout: agent cell ({}, {}) is off the grid, an obstacle or taken", row, col));
    taken[Cell(row, col)] = 1;
  }
  obstacle_ = std::move(obstacle);
  for (int a = 0; a < o_.agents; ++a) pos_[a] = Cell(agents[a].first, agents[a].second);
  StartCoverage();
  WriteObs(obs);
}

std::pair<int, int> UavCoverage::AgentCell(int agent) const {
  return {pos_.at(agent) / o_.grid, pos_.at(agent) % o_.grid};
}

EnvOptions UavCoverageDefaultOptions() {
  const UavCoverageOptions d;
  return {{"agents", d.agents},           {"grid", d.grid},
          {"obstacles", d.obstacles},     {"window", d.window},
          {"max_steps", d.max_steps},     {"cover_radius", d.cover_radius},
          {"cell_reward", d.cell_reward}, {"collision_penalty", d.collision_penalty},
          {"battery", d.battery}};
}

EnvSpec UavCoverageSpec(const EnvOptions& resolved) {
  const UavCoverageOptions o = ParseUavCoverageOptions(resolved);
  EnvSpec spec;
  spec.name = "uav_coverage";
  const int extra = o.battery > 0 ? 1 : 0;  // the battery channels; none without one, so the spec is as it was
  spec.observation = Space::Box({UavCoverage::kObsChannels + extra, o.window, o.window}, {0.0f}, {1.0f});
  spec.action = Space::Discrete(UavCoverage::kNumActions);
  spec.max_episode_steps = o.max_steps;
  spec.num_agents = o.agents;
  spec.global_state = Space::Box({UavCoverage::kStateChannels + extra, o.grid, o.grid}, {0.0f}, {1.0f});
  spec.agents_finish_early = o.battery > 0;
  return spec;
}

std::unique_ptr<Env> MakeUavCoverage(const EnvOptions& resolved, uint64_t seed) {
  return std::make_unique<UavCoverage>(ParseUavCoverageOptions(resolved), seed);
}

FARM_REGISTER_ENV("uav_coverage", UavCoverageDefaultOptions(), UavCoverageSpec, MakeUavCoverage);

}  // namespace farm
