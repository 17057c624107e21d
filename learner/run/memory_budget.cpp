#include "learner/run/memory_budget.h"

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <fstream>
#include <sstream>

namespace farm {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

std::string Mib(int64_t bytes) { return fmt::format("{:.1f}", static_cast<double>(bytes) / kMiB); }

std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  return s;
}

// The cgroup paths of this process from /proc/self/cgroup: the v2 one ("0::/path") and the v1 memory one.
void CgroupPaths(const std::string& proc_self, std::string* v2, std::string* v1_memory) {
  const auto text = ReadFile(proc_self + "/cgroup");
  if (!text) return;
  std::istringstream lines(*text);
  std::string line;
  while (std::getline(lines, line)) {
    const auto a = line.find(':');
    const auto b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    if (line.compare(0, a, "0") == 0 && controllers.empty()) *v2 = path;
    std::istringstream names(controllers);
    std::string name;
    while (std::getline(names, name, ','))
      if (name == "memory") *v1_memory = path;
  }
}

// A field of a cgroup's memory.stat ("inactive_file 123"); 0 when missing.
int64_t MemoryStat(const std::string& stat_path, const std::string& key) {
  const auto text = ReadFile(stat_path);
  if (!text) return 0;
  std::istringstream lines(*text);
  std::string name;
  int64_t value = 0;
  while (lines >> name >> value)
    if (name == key) return value;
  return 0;
}

// What counts against the limit of the cgroup directory `dir`: its usage less the page cache the kernel reclaims
// first; 0 when unreadable.
int64_t CgroupUsed(const std::string& dir, bool v2) {
  if (auto text = ReadFile(dir + (v2 ? "/memory.current" : "/memory.usage_in_bytes")))
    if (auto v = ParseCgroupLimit(*text)) {
      // v1 names its hierarchical figure total_inactive_file.
      const int64_t cache = MemoryStat(dir + "/memory.stat", v2 ? "inactive_file" : "total_inactive_file");
      return std::max<int64_t>(0, *v - cache);
    }
  return 0;
}

// The limit in `file` under `dir` that leaves the least room (limit less that cgroup's usage), from the cgroup at
// `path` up to the root: a parent's limit holds for its children, and siblings use it too. Inside a container's
// cgroup namespace the process's own cgroup is the root, and a path that is not under `dir` (the host's path
// with the container's tree mounted) ends at the root too.
std::optional<MemoryLimit> TightestCgroupLimit(const std::string& dir, std::string path, const std::string& file,
                                               const std::string& label, bool v2) {
  std::optional<MemoryLimit> best;
  int64_t best_room = 0;
  while (true) {
    while (!path.empty() && path.back() == '/') path.pop_back();
    const std::string level = dir + path;
    if (auto text = ReadFile(level + "/" + file))
      if (auto bytes = ParseCgroupLimit(*text)) {
        const int64_t room = *bytes - CgroupUsed(level, v2);
        if (!best || room < best_room) {
          best = MemoryLimit{*bytes, label + " (" + level + "/" + file + ")"};
          best_room = room;
        }
      }
    const auto slash = path.rfind('/');
    if (path.empty() || slash == std::string::npos) return best;
    path = path.substr(0, slash);
  }
}

std::optional<MemoryLimit> CgroupLimit(const std::string& sys_root, const std::string& proc_self) {
  std::string v2, v1;
  CgroupPaths(proc_self, &v2, &v1);
  if (!v2.empty() || ReadFile(sys_root + "/memory.max"))
    if (auto limit = TightestCgroupLimit(sys_root, v2, "memory.max", "cgroup memory.max", true)) return limit;
  return TightestCgroupLimit(sys_root + "/memory", v1, "memory.limit_in_bytes", "cgroup memory.limit_in_bytes",
                             false);
}

}  // namespace

std::string RunMemory::Describe() const {
  const std::string kept = allocator > 0 ? fmt::format(", allocator {}", Mib(allocator)) : std::string();
  if (on_gpu)
    return fmt::format("{} MiB of host memory (store{}) and {} MiB on the GPU (update {}, model {}, optimizer {}, "
                       "activations {})",
                       Mib(host()), kept.empty() ? "" : " and allocator", Mib(gpu()), Mib(update), Mib(model),
                       Mib(optimizer), Mib(activations));
  return fmt::format("{} MiB (store {}, update {}, model {}, optimizer {}, activations {}{})", Mib(total()),
                     Mib(store), Mib(update), Mib(model), Mib(optimizer), Mib(activations), kept);
}

int64_t NetworkActivationFloats(const std::vector<int>& hidden_sizes, int64_t output_width, int64_t encoder_floats,
                                bool layer_norm) {
  int64_t widths = output_width + encoder_floats;
  for (int h : hidden_sizes) widths += (layer_norm ? 2 : 1) * static_cast<int64_t>(h);
  return widths;
}

int64_t CoreActivationFloats(int gates, int64_t size) { return (gates + 3) * size; }

RunMemory EstimateRunMemory(const RunMemoryInputs& in, const PpoConfig& ppo, bool async, bool on_gpu) {
  RunMemory m;
  m.on_gpu = on_gpu;
  m.allocator = in.allocator_kept;
  const int64_t param_bytes = in.parameters * 4;
  m.model = 2 * param_bytes;      // acting and training copies
  m.optimizer = 3 * param_bytes;  // gradients, Adam's first and second moments
  const int64_t rollout = in.rows * ppo.rollout_length * in.bytes_per_row_step;
  m.store = (async ? 2 : 1) * rollout;
  // Recurrent states, host memory: each row's (CoreStates) and the acting batch's copy of them.
  m.store += 2 * in.rows * in.core_state_floats * 4;
  // The update's inputs (observations, states, actions, old log-probs and values on its device) and its own
  // advantages and returns: at most one more rollout's worth.
  m.update = rollout + in.rows * ppo.rollout_length * 8;
  // With a core, the update also lays the rollout out in chunks of bptt steps (MakeChunks, learner/train/
  // ppo_chunks.h): a copy of it, its observations and states included.
  if (in.core_state_floats > 0) m.update += rollout;
  const int64_t minibatch_rows = (in.rows * ppo.rollout_length + ppo.num_minibatches - 1) / ppo.num_minibatches;
  const int64_t k = std::max<int64_t>(1, in.rows_per_state);
  const int64_t minibatch_states = (minibatch_rows + k - 1) / k;
  // Outputs, what autograd keeps for the backward, and the gradients flowing back: three floats a width.
  m.activations = (minibatch_rows * (in.activation_floats_per_row * 3 + in.minibatch_floats_per_row) +
                   minibatch_states * (in.activation_floats_per_state * 3 + in.minibatch_floats_per_state)) *
                  4;
  return m;
}

std::optional<int64_t> ParseCgroupLimit(const std::string& text) {
  const std::string t = Trim(text);
  if (t.empty() || t == "max") return std::nullopt;
  try {
    std::size_t used = 0;
    const long long v = std::stoll(t, &used);
    if (used != t.size() || v <= 0 || v >= (int64_t{1} << 62)) return std::nullopt;
    return static_cast<int64_t>(v);
  } catch (const std::exception&) {
    return std::nullopt;  // unreadable: treated as no limit
  }
}

std::optional<MemoryLimit> DetectMemoryLimit(const std::string& sys_root, const std::string& proc_self) {
  std::optional<MemoryLimit> best = CgroupLimit(sys_root, proc_self);
  rlimit rl{};
  if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    const MemoryLimit as{static_cast<int64_t>(std::min<rlim_t>(rl.rlim_cur, static_cast<rlim_t>(INT64_MAX))),
                         "RLIMIT_AS (ulimit -v)"};
    // The one that leaves less room wins.
    if (!best || as.bytes - ProcessMemoryUsed(as, sys_root, proc_self) <
                     best->bytes - ProcessMemoryUsed(*best, sys_root, proc_self))
      best = as;
  }
  return best;
}

int64_t ProcessMemoryUsed(const MemoryLimit& limit, const std::string& sys_root, const std::string& proc_self) {
  if (limit.source.rfind("cgroup ", 0) == 0) {
    // The limit file's directory holds the usage beside it: memory.current (v2) or memory.usage_in_bytes (v1).
    const auto open = limit.source.find('('), close = limit.source.rfind(')');
    if (open != std::string::npos && close != std::string::npos && close > open) {
      const std::string file = limit.source.substr(open + 1, close - open - 1);
      const std::string dir = file.substr(0, file.rfind('/'));
      const bool v2 = file.size() >= 11 && file.compare(file.size() - 11, 11, "/memory.max") == 0;
      return CgroupUsed(dir, v2);
    }
    (void)sys_root;
    return 0;
  }
  const auto status = ReadFile(proc_self + "/status");
  if (!status) return 0;
  std::istringstream lines(*status);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("VmSize:", 0) == 0) {
      std::istringstream fields(line.substr(7));
      int64_t kib = 0;
      if (fields >> kib) return kib * 1024;
    }
  }
  return 0;
}

int64_t AddressSpacePerThread() {
  rlimit rl{};
  int64_t stack = int64_t{8} << 20;
  if (getrlimit(RLIMIT_STACK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    stack = static_cast<int64_t>(std::min<rlim_t>(rl.rlim_cur, rlim_t{1} << 40));
  return stack + (int64_t{64} << 20);
}

std::optional<MemoryBudget> ResolveMemoryBudget(int64_t budget_mb, const std::optional<MemoryLimit>& limit,
                                                int64_t used, int threads_to_come) {
  if (budget_mb > 0) return MemoryBudget{budget_mb * 1024 * 1024, "learner.memory_budget_mb"};
  if (budget_mb < 0 || !limit) return std::nullopt;
  const bool address_space = limit->source.rfind("RLIMIT_AS", 0) == 0;
  const int64_t threads = address_space ? threads_to_come * AddressSpacePerThread() : 0;
  return MemoryBudget{std::max<int64_t>(0, limit->bytes - used - threads),
                      fmt::format("{} of {} MiB less the {} MiB in use when the run was built{} "
                                  "(learner.memory_budget_mb: 0)",
                                  limit->source, Mib(limit->bytes), Mib(used),
                                  threads > 0 ? fmt::format(" and {} MiB for the {} threads it starts", Mib(threads),
                                                            threads_to_come)
                                              : std::string())};
}

Status CheckRunMemory(const RunMemory& need, const std::optional<MemoryBudget>& budget, const std::string& what,
                      const std::optional<MemoryBudget>& gpu_free) {
  if (budget && need.host() > budget->bytes)
    return Status::InvalidArgument(fmt::format(
        "{} needs about {} but the memory budget is {} MiB ({}); lower env.num_envs, ppo.rollout_length or the "
        "worker count, or raise learner.memory_budget_mb (-1: no check)",
        what, need.Describe(), Mib(budget->bytes), budget->source));
  if (gpu_free && need.on_gpu && need.gpu() > gpu_free->bytes)
    return Status::InvalidArgument(fmt::format(
        "{} needs about {} but the GPU has {} MiB free ({}); lower env.num_envs, ppo.rollout_length, the worker "
        "count or the minibatch size (more ppo.num_minibatches), or learner.memory_budget_mb -1 for no check",
        what, need.Describe(), Mib(gpu_free->bytes), gpu_free->source));
  return Status::Ok();
}

}  // namespace farm
