// CUDA graphs for acting, the trainer's CUDA stream, stream synchronisation. The CUDA parts compile only
// against a CUDA LibTorch (FARM_WITH_CUDA); otherwise the same interface reports that CUDA is missing.
#include "learner/model/cuda_graph.h"

#include <ATen/autocast_mode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <optional>
#include <stdexcept>
#include <utility>

#ifdef FARM_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace farm {

bool BuiltWithCuda() {
#ifdef FARM_WITH_CUDA
  return true;
#else
  return false;
#endif
}

std::unique_lock<std::mutex> LockCudaGenerator(torch::Device device) {
  static std::mutex mutex;
  return device.is_cuda() ? std::unique_lock<std::mutex>(mutex) : std::unique_lock<std::mutex>();
}

int64_t GraphedActor::BucketRows(int64_t rows) {
  int64_t bucket = 16;
  while (bucket < rows) bucket *= 2;
  return bucket;
}

#ifdef FARM_WITH_CUDA

struct GraphedActor::Impl {
  struct Bucket {
    torch::Tensor input;  // [rows, obs_shape...] float32 on the device
    torch::Tensor state;  // [rows, state_shape...] float32 on the device; undefined without a global state
    ActOutput output;     // the captured forward's outputs (static buffers)
    std::unique_ptr<at::cuda::CUDAGraph> graph;
  };

  ActorCritic policy{nullptr};
  torch::Device device{torch::kCUDA};
  Precision precision = Precision::kFp32;
  std::vector<int64_t> obs_shape;
  std::vector<int64_t> state_shape;  // empty: no global state
  int64_t rows_per_state = 1;        // with a global state: the rows (agents) that share one
  bool deterministic = false;
  std::map<int64_t, Bucket> buckets;  // by units: rows, or envs with a state per env

  ActOutput Forward(const torch::Tensor& input, const torch::Tensor& state) {
    // The weight-cast cache must stay off while capturing: a cached cast would be a tensor the graph
    // reads but that no replay recomputes.
    const bool cache = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_cache_enabled(false);
    ActOutput out;
    {
      AutocastGuard autocast(device, precision);
      out = policy->Act(input, state, deterministic);
    }
    at::autocast::set_autocast_cache_enabled(cache);
    out.logp = out.logp.to(torch::kFloat32);
    out.value = out.value.to(torch::kFloat32);
    return out;
  }

  Bucket& Get(int64_t rows) {
    const int64_t units = BucketRows(rows / rows_per_state);
    auto it = buckets.find(units);
    if (it != buckets.end()) return it->second;
    Bucket bucket;
    std::vector<int64_t> shape{units * rows_per_state};
    shape.insert(shape.end(), obs_shape.begin(), obs_shape.end());
    bucket.input = torch::zeros(shape, torch::TensorOptions().dtype(torch::kFloat32).device(device));
    if (!state_shape.empty()) {
      std::vector<int64_t> sshape{units};
      sshape.insert(sshape.end(), state_shape.begin(), state_shape.end());
      bucket.state = torch::zeros(sshape, torch::TensorOptions().dtype(torch::kFloat32).device(device));
    }
    c10::cuda::CUDAGuard device_guard(device);
    // Capture on a side stream (CUDA forbids capturing the legacy default stream), after the work queued
    // on the current stream (the input's zero fill, weight copies) has finished.
    auto current = c10::cuda::getCurrentCUDAStream(device.index());
    current.synchronize();
    auto side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
    {
      c10::cuda::CUDAStreamGuard stream_guard(side);
      // Warm-up passes outside the capture: cuBLAS handles and workspaces, allocator growth.
      for (int i = 0; i < 3; ++i) (void)Forward(bucket.input, bucket.state);
      side.synchronize();
      bucket.graph = std::make_unique<at::cuda::CUDAGraph>();
      // Thread-local capture mode: the trainer thread's synchronisations stay legal during this capture.
      bucket.graph->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
      bucket.output = Forward(bucket.input, bucket.state);
      bucket.graph->capture_end();
    }
    side.synchronize();
    return buckets.emplace(units, std::move(bucket)).first->second;
  }
};

Status GraphedActor::Create(ActorCritic policy, torch::Device device, Precision precision,
                            std::vector<int64_t> obs_shape, bool deterministic, std::unique_ptr<GraphedActor>* out,
                            std::vector<int64_t> state_shape, int64_t rows_per_state) {
  if (rows_per_state < 1 || (state_shape.empty() && rows_per_state != 1))
    return Status::InvalidArgument(fmt::format(
        "learner.cuda_graphs: {} rows per global state (expected 1, or an env's agents with a global state)",
        rows_per_state));
  if (policy->has_global_state() == state_shape.empty())
    return Status::InvalidArgument(
        fmt::format("learner.cuda_graphs: the policy {} a global state, but the graphs were asked for {}",
                    policy->has_global_state() ? "has" : "has no",
                    state_shape.empty() ? std::string("none") : fmt::format("[{}]", fmt::join(state_shape, ", "))));
  if (!device.is_cuda())
    return Status::InvalidArgument(fmt::format(
        "learner.cuda_graphs: CUDA graphs need a CUDA device, but the learner runs on {} (set learner.cuda_graphs "
        "to false, or learner.device to auto or cuda)", device.str()));
  auto impl = std::make_unique<Impl>();
  impl->policy = std::move(policy);
  impl->device = device;
  impl->precision = precision;
  impl->obs_shape = std::move(obs_shape);
  impl->state_shape = std::move(state_shape);
  impl->rows_per_state = rows_per_state;
  impl->deterministic = deterministic;
  out->reset(new GraphedActor(std::move(impl)));
  return Status::Ok();
}

ActOutput GraphedActor::Act(const torch::Tensor& obs, const torch::Tensor& state) {
  const int64_t rows = obs.size(0);
  if (impl_->state_shape.empty() == state.defined())
    throw std::invalid_argument(state.defined() ? "GraphedActor::Act: a global state for a policy without one"
                                                : "GraphedActor::Act: the policy's critic needs the global state");
  const int64_t k = impl_->rows_per_state;
  if (rows % k != 0 || (state.defined() && state.size(0) != rows / k))
    throw std::invalid_argument(fmt::format("GraphedActor::Act: {} rows and {} global states ({} rows per state)",
                                            rows, state.defined() ? state.size(0) : 0, k));
  const auto generator_lock = LockCudaGenerator(impl_->device);  // the capture, the replay's draws
  Impl::Bucket& b = impl_->Get(rows);
  b.input.narrow(0, 0, rows).copy_(obs.reshape(b.input.narrow(0, 0, rows).sizes()), /*non_blocking=*/true);
  if (state.defined())
    b.state.narrow(0, 0, rows / k)
        .copy_(state.reshape(b.state.narrow(0, 0, rows / k).sizes()), /*non_blocking=*/true);
  b.graph->replay();
  ActOutput out;
  out.action = b.output.action.narrow(0, 0, rows);
  out.logp = b.output.logp.narrow(0, 0, rows);
  out.value = b.output.value.narrow(0, 0, rows);
  return out;
}

int GraphedActor::captured_graphs() const { return static_cast<int>(impl_->buckets.size()); }

struct ScopedCudaStream::Impl {
  torch::Device device{torch::kCUDA};
  std::optional<c10::cuda::CUDAStreamGuard> guard;
};

ScopedCudaStream::ScopedCudaStream(torch::Device device, bool high_priority) {
  if (!device.is_cuda()) return;
  impl_ = std::make_unique<Impl>();
  impl_->device = device;
  impl_->guard.emplace(c10::cuda::getStreamFromPool(high_priority, device.index()));
}

void ScopedCudaStream::Synchronize() {
  if (impl_) c10::cuda::getCurrentCUDAStream(impl_->device.index()).synchronize();
}

void SynchronizeCurrentStream(torch::Device device) {
  if (device.is_cuda()) c10::cuda::getCurrentCUDAStream(device.index()).synchronize();
}

struct DeviceSpan::Impl {
  torch::Device device{torch::kCUDA};
  cudaEvent_t begin = nullptr;
  cudaEvent_t end = nullptr;
  bool recorded = false;
};

namespace {
void CheckCuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(fmt::format("{}: {}", what, cudaGetErrorString(e)));
}
}  // namespace

DeviceSpan::DeviceSpan(torch::Device device) {
  if (!device.is_cuda()) return;
  impl_ = std::make_unique<Impl>();
  impl_->device = device;
  c10::cuda::CUDAGuard device_guard(device);
  CheckCuda(cudaEventCreate(&impl_->begin), "cudaEventCreate");
  CheckCuda(cudaEventCreate(&impl_->end), "cudaEventCreate");
}

void DeviceSpan::Begin() {
  if (!impl_) return;
  CheckCuda(cudaEventRecord(impl_->begin, c10::cuda::getCurrentCUDAStream(impl_->device.index()).stream()),
            "cudaEventRecord");
  impl_->recorded = false;
}

void DeviceSpan::End() {
  if (!impl_) return;
  CheckCuda(cudaEventRecord(impl_->end, c10::cuda::getCurrentCUDAStream(impl_->device.index()).stream()),
            "cudaEventRecord");
  impl_->recorded = true;
}

double DeviceSpan::Seconds() const {
  if (!impl_ || !impl_->recorded) return 0.0;
  float ms = 0.0f;
  // cudaErrorNotReady when the stream has not passed End yet: the caller did not synchronise; no figure then.
  if (cudaEventElapsedTime(&ms, impl_->begin, impl_->end) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0.0;
  }
  return 1e-3 * static_cast<double>(ms);
}

DeviceSpan::~DeviceSpan() {
  if (!impl_) return;
  cudaEventDestroy(impl_->begin);
  cudaEventDestroy(impl_->end);
}

#else  // !FARM_WITH_CUDA

struct GraphedActor::Impl {};

Status GraphedActor::Create(ActorCritic, torch::Device, Precision, std::vector<int64_t>, bool,
                            std::unique_ptr<GraphedActor>*, std::vector<int64_t>, int64_t) {
  return Status::InvalidArgument(
      "learner.cuda_graphs: this build's LibTorch has no CUDA (Debian's LibTorch is CPU-only); set "
      "learner.cuda_graphs to false, or build against a CUDA LibTorch");
}

ActOutput GraphedActor::Act(const torch::Tensor&, const torch::Tensor&) { return {}; }
int GraphedActor::captured_graphs() const { return 0; }

struct ScopedCudaStream::Impl {};
ScopedCudaStream::ScopedCudaStream(torch::Device, bool) {}
void ScopedCudaStream::Synchronize() {}
void SynchronizeCurrentStream(torch::Device) {}

struct DeviceSpan::Impl {};
DeviceSpan::DeviceSpan(torch::Device) {}
DeviceSpan::~DeviceSpan() = default;
void DeviceSpan::Begin() {}
void DeviceSpan::End() {}
double DeviceSpan::Seconds() const { return 0.0; }

#endif  // FARM_WITH_CUDA

GraphedActor::GraphedActor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GraphedActor::~GraphedActor() = default;
ScopedCudaStream::~ScopedCudaStream() = default;

}  // namespace farm
