// The ranks of a data-parallel run (DD-PPO: one learner per device, gradients averaged every minibatch): where
// this process stands among them (torchrun's or Slurm's environment), the rendezvous, and the collectives between
// the ranks' trainers, on PyTorch's c10d (a TCPStore for the rendezvous; Gloo for CPU tensors, NCCL for CUDA
// tensors where the LibTorch build has it).
//
// Threading: a RankGroup is used by one thread at a time (the trainer's). Every rank must make the same sequence
// of collective calls; a call that does not complete within the group's timeout (a rank died, hung or took another
// path) throws RankError on every rank still running.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/status.h"

namespace farm {

// Where this process stands among the ranks.
struct RankPlace {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;          // its index among the ranks of its machine (the device it takes: cuda:local_rank)
  std::string master_addr;     // the rendezvous: rank 0's TCPStore
  int master_port = 0;
  std::string source = "single";  // "torchrun", "slurm" or "single"
};

// The default rendezvous port when the environment names none (torchrun's).
inline constexpr int kDefaultMasterPort = 29500;

// Reads torchrun's contract (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), else Slurm's inside an srun
// step of several tasks (SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID, the first host of SLURM_STEP_NODELIST;
// MASTER_ADDR and MASTER_PORT when set), else a single rank. `env` returns a variable's value or nullopt. An error
// names the variable, its value and what was expected.
Status ReadRankPlace(const std::function<std::optional<std::string>(const std::string&)>& env, RankPlace* out);
// The same on this process's environment.
Status ReadRankPlace(RankPlace* out);

// The first host of a Slurm node list: "gpu[03-07,9],cpu1" -> "gpu03"; "node7" -> "node7".
std::string FirstSlurmHost(const std::string& nodelist);

// A collective failed: a rank died or hung (the timeout), or the transport broke. The message names the call.
class RankError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct RankGroupOptions {
  std::string backend = "auto";   // auto (NCCL for a CUDA device where built, Gloo otherwise) | gloo | nccl
  double timeout_s = 300;         // rendezvous and each collective
  torch::Device device{torch::kCPU};  // where the tensors given to the collectives live
};

class RankGroup {
 public:
  // The rendezvous: rank 0 serves the store at place.master_addr:master_port, every rank waits there until all
  // world_size have joined (or the timeout). Errors: a bad backend name, NCCL asked for where it is not built or
  // on a CPU device, a rendezvous that fails.
  static Status Create(const RankPlace& place, const RankGroupOptions& options, std::unique_ptr<RankGroup>* out);
  ~RankGroup();
  RankGroup(const RankGroup&) = delete;
  RankGroup& operator=(const RankGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& backend() const { return backend_; }

  // In place, on every rank: the element-wise sum (max) over the ranks. `t` is contiguous, on the group's device
  // (Gloo also takes CPU tensors on a CUDA group: they are reduced where they are).
  void AllReduceSum(torch::Tensor& t);
  void AllReduceMax(torch::Tensor& t);
  // In place: every rank gets root's values.
  void Broadcast(torch::Tensor& t, int root = 0);
  // Returns when every rank has called it.
  void Barrier();
  // Rank 0's `value` under `key`, on every rank (through the rendezvous store; the others wait for it up to the
  // timeout). Each key once per run.
  std::string ShareFromRankZero(const std::string& key, const std::string& value);

 private:
  struct Impl;
  explicit RankGroup(std::unique_ptr<Impl> impl, int rank, int size, std::string backend);
  void Run(const char* what, const std::function<void()>& call);

  std::unique_ptr<Impl> impl_;
  int rank_;
  int size_;
  std::string backend_;
};

// Whether this LibTorch build has the NCCL process group.
bool NcclBuilt();

}  // namespace farm
