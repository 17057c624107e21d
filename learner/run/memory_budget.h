// What a run is expected to hold in memory, and the budget it must fit (issue 19, memory pressure).
//
// EstimateRunMemory sizes a run from what the first Hello fixes (the policy's parameters, the bytes a row
// records per step) and the rows of the workers joined so far: the acting and training copies of the policy,
// gradients and Adam's moments, the trajectory arenas (one rollout in sync mode, two in async mode: one
// recorded while the other trains), the update's copy of a rollout, and one minibatch's activations. It is an
// upper estimate, not a measurement: the learner checks it at every Hello against learner.memory_budget_mb, or,
// when that is 0, against the process's own limit (DetectMemoryLimit: a cgroup's memory.max or
// memory.limit_in_bytes, RLIMIT_AS) less what the process holds at the first Hello, before the run is built.
// A run that cannot fit is
// refused at its first Hello with the figures (the run stops in order, exit status 1); a worker whose rows
// would not fit is refused, and the run trains on with the others.
//
// Threading: plain values and functions; DetectMemoryLimit and ProcessMemoryUsed read /proc and /sys.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"

namespace farm {

struct RunMemory {
  int64_t model = 0;        // the acting and training copies of the policy
  int64_t optimizer = 0;    // gradients and Adam's two moments
  int64_t store = 0;        // trajectory arenas (host memory, always)
  int64_t update = 0;       // the update's copy of a rollout (inputs, advantages, returns); with a core, its chunks too
  int64_t activations = 0;  // one minibatch's forward and backward
  int64_t allocator = 0;    // freed host memory the allocator keeps for reuse (RunMemoryInputs::allocator_kept)
  bool on_gpu = false;      // the policy on a GPU: model, optimizer, update and activations are in its memory
  int64_t total() const { return model + optimizer + store + update + activations + allocator; }
  int64_t host() const { return on_gpu ? store + allocator : total(); }
  int64_t gpu() const { return on_gpu ? total() - store - allocator : 0; }
  // "1234.5 MiB (store 1000.0, update 200.0, model 1.2, optimizer 2.4, activations 30.9, allocator 128.0)" (no
  // allocator part when it is 0); on a GPU the host's and the GPU's parts apart.
  std::string Describe() const;
};

struct RunMemoryInputs {
  int64_t parameters = 0;                 // the policy's parameter count (actor, critic, log-std)
  int64_t bytes_per_row_step = 0;         // TrajectoryStore::bytes_per_row_step
  int64_t rows = 0;                       // agent rows of the workers joined, this one included
  // What one agent row's forward leaves for the backward (NetworkActivationFloats, with a core
  // CoreActivationFloats): the actor's, and the critic's when it reads the row's own observation.
  int64_t activation_floats_per_row = 0;
  int64_t core_state_floats = 0;          // with a recurrent core: floats of state per row (0 without)
  // Floats per row that a minibatch holds once, not three times as activations: its gathered inputs (observation
  // and global state) and an image encoder's convolution workspace (ImageEncoderWorkspaceFloats).
  int64_t minibatch_floats_per_row = 0;
  // A centralised critic reads one global state per `rows_per_state` rows (an env's agents), and a minibatch's
  // critic runs once per state (PpoTrainer samples an env's agents together): its activations, and its gathered
  // state and workspace, count per state, not per row. 1 and zeros without a global state.
  int64_t rows_per_state = 1;
  int64_t activation_floats_per_state = 0;
  int64_t minibatch_floats_per_state = 0;
  // Freed memory the learner's allocator keeps for reuse rather than give back (common/resources.h: up to its trim
  // threshold per thread arena, for the threads that make the run's tensors), whatever the run's size. Measured:
  // 16 Python uav_coverage workers with a GRU peaked 138 MiB higher with it than with glibc's default threshold.
  int64_t allocator_kept = 0;
};

// With a recurrent core (kind gru: 3 gates, lstm: 4) of `size` units: floats one row-step of one network's
// unrolled core (the actor's, or the critic's with ppo.critic_core) keeps for the backward (the gates'
// pre-activations, the state and the output).
int64_t CoreActivationFloats(int gates, int64_t size);

// Floats one input's forward through one network (the actor, or the critic) leaves for the backward: every
// hidden width (twice with layer norm: its output too), the output width (the action head's, or the value's 1),
// and `encoder_floats`, its encoder's maps (learner/model/encoder.h's ImageEncoderFloats, or what a TorchScript
// encoder recorded).
int64_t NetworkActivationFloats(const std::vector<int>& hidden_sizes, int64_t output_width, int64_t encoder_floats,
                                bool layer_norm = false);

RunMemory EstimateRunMemory(const RunMemoryInputs& in, const PpoConfig& ppo, bool async, bool on_gpu = false);

struct MemoryLimit {
  int64_t bytes = 0;
  std::string source;  // "cgroup memory.max (/sys/fs/cgroup/...)", "RLIMIT_AS (ulimit -v)"
};

// A cgroup limit file's content: "max" (v2) or a figure of 2^62 and more (v1's "unlimited") is none.
std::optional<int64_t> ParseCgroupLimit(const std::string& text);

// The process's memory limit that leaves the least room (limit less ProcessMemoryUsed): its cgroup's or any
// ancestor's (v2, then v1; a parent's limit holds for its children and their siblings use it too) and
// RLIMIT_AS; none when none is set. `sys_root` and `proc_self` are
// for tests.
std::optional<MemoryLimit> DetectMemoryLimit(const std::string& sys_root = "/sys/fs/cgroup",
                                             const std::string& proc_self = "/proc/self");

// What counts against `limit` already: for a cgroup limit, the usage of the cgroup that sets it (memory.current
// or memory.usage_in_bytes) less the page cache the kernel reclaims first (memory.stat's inactive_file, as
// container runtimes count a working set); for RLIMIT_AS the process's VmSize; 0 when unreadable.
int64_t ProcessMemoryUsed(const MemoryLimit& limit, const std::string& sys_root = "/sys/fs/cgroup",
                          const std::string& proc_self = "/proc/self");

// Address space a thread reserves under RLIMIT_AS: its stack (RLIMIT_STACK, 8 MiB when unlimited) and a malloc
// arena (glibc reserves 64 MiB for each arena a new thread may get).
int64_t AddressSpacePerThread();

// The budget a run's estimate must fit: learner.memory_budget_mb when positive; when 0, the process's limit less
// `used` (ProcessMemoryUsed, measured at the first Hello before the run is built) and, under RLIMIT_AS, less
// the address space of the `threads_to_come` the run starts after that (AddressSpacePerThread each); none when
// -1 or when no limit is set. `source` says which, for messages.
struct MemoryBudget {
  int64_t bytes = 0;
  std::string source;
};
std::optional<MemoryBudget> ResolveMemoryBudget(int64_t budget_mb, const std::optional<MemoryLimit>& limit,
                                                int64_t used, int threads_to_come = 0);

// Ok, or InvalidArgument naming the estimate, its parts, the budget and where it comes from. `what`: "the run"
// or "the run with worker w-3". The host's part is checked against `budget`; on a GPU its part against
// `gpu_free` (the device's free memory when the run was built; none: not checked).
Status CheckRunMemory(const RunMemory& need, const std::optional<MemoryBudget>& budget, const std::string& what,
                      const std::optional<MemoryBudget>& gpu_free = std::nullopt);

}  // namespace farm
