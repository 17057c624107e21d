#include "learner/train/rank_group.h"

// Debian's LibTorch and PyTorch's both build c10d with Gloo; its header declares the process group only under
// this macro (which their CMake configs do not export), and needs Gloo's headers (Debian: libgloo-dev, which
// scripts/farm installs). NCCL: with CUDA builds whose nccl.h is found (Debian's CUDA LibTorch with libnccl-dev,
// as the CUDA compile check has it; PyTorch's wheels).
#if __has_include(<gloo/algorithm.h>) && !defined(FARM_NO_GLOO)  // FARM_NO_GLOO: to check the build without
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO 1
#endif
#define FARM_HAVE_GLOO 1
#endif
#if defined(FARM_WITH_CUDA) && __has_include(<nccl.h>)
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL 1
#endif
#define FARM_HAVE_NCCL 1
#endif

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#ifdef FARM_HAVE_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#ifdef FARM_HAVE_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <chrono>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <utility>

namespace farm {
namespace {

// A non-negative integer variable, or an error naming it.
Status ReadInt(const std::function<std::optional<std::string>(const std::string&)>& env, const std::string& name,
               int min, int* out) {
  const std::optional<std::string> v = env(name);
  if (!v) return Status::InvalidArgument(name + " is not set");
  char* end = nullptr;
  const long value = std::strtol(v->c_str(), &end, 10);
  if (v->empty() || *end != '\0' || value < min || value > 1 << 20)
    return Status::InvalidArgument(name + "='" + *v + "': expected an integer >= " + std::to_string(min));
  *out = static_cast<int>(value);
  return Status::Ok();
}

}  // namespace

std::string FirstSlurmHost(const std::string& nodelist) {
  // Up to the first comma outside brackets; a bracket's first range's first number replaces the bracket.
  const size_t bracket = nodelist.find('[');
  const size_t comma = nodelist.find(',');
  if (bracket == std::string::npos || (comma != std::string::npos && comma < bracket))
    return nodelist.substr(0, comma);
  const size_t close = nodelist.find(']', bracket);
  const std::string inside = nodelist.substr(bracket + 1, close == std::string::npos ? std::string::npos
                                                                                       : close - bracket - 1);
  const size_t stop = inside.find_first_of(",-");
  return nodelist.substr(0, bracket) + inside.substr(0, stop);
}

Status ReadRankPlace(const std::function<std::optional<std::string>(const std::string&)>& env, RankPlace* out) {
  RankPlace place;
  if (env("WORLD_SIZE") || env("RANK")) {  // torchrun (or any launcher of its contract)
    place.source = "torchrun";
    if (Status s = ReadInt(env, "WORLD_SIZE", 1, &place.world_size); !s.ok()) return s;
    if (Status s = ReadInt(env, "RANK", 0, &place.rank); !s.ok()) return s;
    if (env("LOCAL_RANK")) {
      if (Status s = ReadInt(env, "LOCAL_RANK", 0, &place.local_rank); !s.ok()) return s;
    } else {
      place.local_rank = place.rank;
    }
    place.master_addr = env("MASTER_ADDR").value_or("127.0.0.1");
    place.master_port = kDefaultMasterPort;
    if (env("MASTER_PORT")) {
      if (Status s = ReadInt(env, "MASTER_PORT", 1, &place.master_port); !s.ok()) return s;
    }
  } else if (env("SLURM_PROCID") && env("SLURM_STEP_NUM_TASKS") && env("SLURM_STEP_NUM_TASKS") != "1") {
    // An srun step of several tasks. (A one-task step, such as the learner step of scripts/slurm/farm.sbatch,
    // or the batch script itself, is a single rank.)
    place.source = "slurm";
    if (Status s = ReadInt(env, "SLURM_STEP_NUM_TASKS", 1, &place.world_size); !s.ok()) return s;
    if (Status s = ReadInt(env, "SLURM_PROCID", 0, &place.rank); !s.ok()) return s;
    if (Status s = ReadInt(env, "SLURM_LOCALID", 0, &place.local_rank); !s.ok()) return s;
    const std::optional<std::string> nodes = env("SLURM_STEP_NODELIST") ? env("SLURM_STEP_NODELIST")
                                                                         : env("SLURM_JOB_NODELIST");
    place.master_addr = env("MASTER_ADDR") ? *env("MASTER_ADDR") : nodes ? FirstSlurmHost(*nodes) : "";
    if (place.master_addr.empty())
      return Status::InvalidArgument("Slurm step of several tasks: neither MASTER_ADDR nor SLURM_STEP_NODELIST is set");
    place.master_port = kDefaultMasterPort;
    if (env("MASTER_PORT")) {
      if (Status s = ReadInt(env, "MASTER_PORT", 1, &place.master_port); !s.ok()) return s;
    }
  }
  if (place.rank >= place.world_size)
    return Status::InvalidArgument("rank " + std::to_string(place.rank) + " is not below the world size " +
                                   std::to_string(place.world_size) + " (" + place.source + "'s environment)");
  if (place.master_port > 65535)
    return Status::InvalidArgument("MASTER_PORT=" + std::to_string(place.master_port) + ": expected 1..65535");
  *out = place;
  return Status::Ok();
}

Status ReadRankPlace(RankPlace* out) {
  return ReadRankPlace(
      [](const std::string& name) -> std::optional<std::string> {
        const char* v = std::getenv(name.c_str());
        if (v == nullptr) return std::nullopt;
        return std::string(v);
      },
      out);
}

bool NcclBuilt() {
#ifdef FARM_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

#ifndef FARM_HAVE_GLOO
// Without Gloo's headers the CPU collectives are not built; RankGroup::Create says so.
struct NoGloo {
  struct NoWork {
    bool wait(std::chrono::milliseconds) { return true; }
  };
  template <class... A>
  std::shared_ptr<NoWork> allreduce(A&&...) { throw std::logic_error("no Gloo"); }
  template <class... A>
  std::shared_ptr<NoWork> broadcast(A&&...) { throw std::logic_error("no Gloo"); }
  template <class... A>
  std::shared_ptr<NoWork> barrier(A&&...) { throw std::logic_error("no Gloo"); }
};
#endif

struct RankGroup::Impl {
  c10::intrusive_ptr<c10d::Store> store;
#ifdef FARM_HAVE_GLOO
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo;
#else
  std::unique_ptr<NoGloo> gloo;
#endif
#ifdef FARM_HAVE_NCCL
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> nccl;
#endif
  std::chrono::milliseconds timeout{0};
  bool device_cuda = false;

  // The process group that takes `t`: NCCL for CUDA tensors where it is the backend; Gloo otherwise, a CUDA
  // tensor through a CPU copy (one each way).
  template <class F>
  void With(torch::Tensor& t, F&& f) {
#ifdef FARM_HAVE_NCCL
    if (nccl && t.is_cuda()) {
      std::vector<torch::Tensor> ts{t};
      f(*nccl, ts);
      return;
    }
#endif
    if (t.is_cuda()) {
      std::vector<torch::Tensor> ts{t.to(torch::kCPU)};
      f(*gloo, ts);
      t.copy_(ts[0]);
      return;
    }
    std::vector<torch::Tensor> ts{t};
    f(*gloo, ts);
  }
};

RankGroup::RankGroup(std::unique_ptr<Impl> impl, int rank, int size, std::string backend)
    : impl_(std::move(impl)), rank_(rank), size_(size), backend_(std::move(backend)) {}

RankGroup::~RankGroup() = default;

Status RankGroup::Create(const RankPlace& place, const RankGroupOptions& options, std::unique_ptr<RankGroup>* out) {
  std::string backend = options.backend;
  if (backend != "auto" && backend != "gloo" && backend != "nccl")
    return Status::InvalidArgument("learner.dist_backend: expected auto, gloo or nccl, got '" + backend + "'");
  if (backend == "nccl" && !NcclBuilt())
    return Status::InvalidArgument("learner.dist_backend is nccl, but this LibTorch build has no NCCL (use gloo or auto)");
  if (backend == "nccl" && !options.device.is_cuda())
    return Status::InvalidArgument("learner.dist_backend is nccl, but the learner's device is the CPU (use gloo or auto)");
  if (backend == "auto") backend = options.device.is_cuda() && NcclBuilt() ? "nccl" : "gloo";
  if (options.timeout_s <= 0)
    return Status::InvalidArgument("learner.collective_timeout_s: expected > 0, got " +
                                   std::to_string(options.timeout_s));
#ifndef FARM_HAVE_GLOO
  (void)place;
  (void)out;
  return Status::InvalidArgument("learner ranks: this build has no Gloo headers (gloo/algorithm.h), so no collectives: "
                                 "install libgloo-dev (Debian) and build again");
#else

  auto impl = std::make_unique<Impl>();
  impl->timeout = std::chrono::milliseconds(static_cast<int64_t>(options.timeout_s * 1000));
  impl->device_cuda = options.device.is_cuda();
  try {
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<uint16_t>(place.master_port);
    store_options.isServer = place.rank == 0;
    store_options.numWorkers = static_cast<size_t>(place.world_size);
    store_options.waitWorkers = false;
    store_options.timeout = impl->timeout;
    auto tcp = c10::make_intrusive<c10d::TCPStore>(place.master_addr, store_options);
    impl->store = tcp;
    // Gloo always: the CPU collectives (and everything on a CPU learner).
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(impl->timeout);
    const bool loopback = place.master_addr == "127.0.0.1" || place.master_addr == "localhost";
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname != nullptr && *ifname != '\0') {
      gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
    } else if (loopback) {
      gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    } else {
      gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    }
    impl->gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(c10::make_intrusive<c10d::PrefixStore>("gloo", impl->store),
                                                             place.rank, place.world_size, gloo_options);
#ifdef FARM_HAVE_NCCL
    if (backend == "nccl") {
      auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
      nccl_options->timeout = impl->timeout;
      impl->nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(
          c10::make_intrusive<c10d::PrefixStore>("nccl", impl->store), place.rank, place.world_size, nccl_options);
    }
#endif
  } catch (const std::exception& e) {
    return Status::IoError("rank " + std::to_string(place.rank) + " of " + std::to_string(place.world_size) +
                           ": the rendezvous at " + place.master_addr + ":" + std::to_string(place.master_port) +
                           " failed: " + e.what());
  }
  out->reset(new RankGroup(std::move(impl), place.rank, place.world_size, backend));
  return Status::Ok();
#endif
}

void RankGroup::Run(const char* what, const std::function<void()>& call) {
  try {
    call();
  } catch (const std::exception& e) {
    throw RankError(std::string("rank ") + std::to_string(rank_) + " of " + std::to_string(size_) + ": " + what +
                    " failed (another rank died, hung past learner.collective_timeout_s, or took another path): " +
                    e.what());
  }
}

void RankGroup::AllReduceSum(torch::Tensor& t) {
  Run("all-reduce (sum)", [&] {
    impl_->With(t, [&](auto& pg, std::vector<torch::Tensor>& ts) { pg.allreduce(ts)->wait(impl_->timeout); });
  });
}

void RankGroup::AllReduceMax(torch::Tensor& t) {
  Run("all-reduce (max)", [&] {
    c10d::AllreduceOptions options;
    options.reduceOp = c10d::ReduceOp::MAX;
    impl_->With(t, [&](auto& pg, std::vector<torch::Tensor>& ts) { pg.allreduce(ts, options)->wait(impl_->timeout); });
  });
}

void RankGroup::Broadcast(torch::Tensor& t, int root) {
  Run("broadcast", [&] {
    c10d::BroadcastOptions options;
    options.rootRank = root;
    impl_->With(t, [&](auto& pg, std::vector<torch::Tensor>& ts) { pg.broadcast(ts, options)->wait(impl_->timeout); });
  });
}

std::string RankGroup::ShareFromRankZero(const std::string& key, const std::string& value) {
  std::string out;
  Run("sharing rank 0's value through the store", [&] {
    const std::string k = "farm/" + key;
    if (rank_ == 0) {
      impl_->store->set(k, std::vector<uint8_t>(value.begin(), value.end()));
      out = value;
    } else {
      const std::vector<uint8_t> got = impl_->store->get(k);
      out.assign(got.begin(), got.end());
    }
  });
  return out;
}

void RankGroup::Barrier() {
  Run("barrier", [&] { impl_->gloo->barrier()->wait(impl_->timeout); });
}

}  // namespace farm
