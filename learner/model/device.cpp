// Device selection.
#include "learner/model/device.h"

#include <fmt/format.h>

#include <cstdlib>

#ifdef FARM_WITH_CUDA
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

// OpenBLAS's functions, resolved at load time when an OpenBLAS is loaded (LibTorch's BLAS), null otherwise:
// its thread cap; reading its environment variables again; the wait its variable says; stopping its thread pool
// (what its fork handler calls; the next threaded call starts the pool again).
extern "C" void openblas_set_num_threads(int num_threads) __attribute__((weak));
extern "C" void openblas_read_env(void) __attribute__((weak));
extern "C" int openblas_thread_timeout(void) __attribute__((weak));
extern "C" int blas_thread_shutdown_(void) __attribute__((weak));

namespace farm {

std::optional<int64_t> CudaFreeBytes(const torch::Device& device) {
#ifdef FARM_WITH_CUDA
  if (!device.is_cuda()) return std::nullopt;
  c10::cuda::CUDAGuard guard(device);
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    (void)cudaGetLastError();  // cleared: the run goes on without the check
    return std::nullopt;
  }
  return static_cast<int64_t>(free_bytes);
#else
  (void)device;
  return std::nullopt;
#endif
}

void SetCpuThreads(int threads) {
  torch::set_num_threads(threads);
  if (openblas_set_num_threads != nullptr) openblas_set_num_threads(threads);
}

BlasWait ShortenBlasThreadWait() {
  constexpr const char* kVariable = "OPENBLAS_THREAD_TIMEOUT";
  using Outcome = BlasWait::Outcome;
  if (openblas_read_env == nullptr || openblas_thread_timeout == nullptr || blas_thread_shutdown_ == nullptr)
    return {Outcome::kNotOpenBlas, "BLAS: not OpenBLAS; its threads' wait left as it is"};
  if (const char* user = std::getenv(kVariable); user != nullptr)
    return {Outcome::kUserSet,
            fmt::format("BLAS: {}={} is set; OpenBLAS's idle threads wait as it says", kVariable, user)};
  const std::string value = std::to_string(kShortBlasWaitExponent);
  if (::setenv(kVariable, value.c_str(), /*overwrite=*/0) != 0)
    return {Outcome::kFailed, fmt::format("BLAS: could not set {}; OpenBLAS's idle threads spin about 0.1 s before "
                                          "they sleep", kVariable)};
  openblas_read_env();
  if (openblas_thread_timeout() != kShortBlasWaitExponent)
    return {Outcome::kFailed, fmt::format("BLAS: OpenBLAS did not take {}; its idle threads spin about 0.1 s before "
                                          "they sleep", kVariable)};
  blas_thread_shutdown_();
  return {Outcome::kShortened, fmt::format("BLAS: OpenBLAS's idle threads sleep after 2^{} cycles ({}={}), not 2^28 "
                                           "(about 0.1 s)", kShortBlasWaitExponent, kVariable, value)};
}

Status ResolveDevice(const std::string& name, torch::Device* out) {
  if (name == "auto") {
    *out = torch::cuda::is_available() ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
    return Status::Ok();
  }
  if (name == "cpu") {
    *out = torch::Device(torch::kCPU);
    return Status::Ok();
  }
  if (name.rfind("cuda", 0) == 0) {
    if (!torch::cuda::is_available())
      return Status::InvalidArgument(fmt::format("learner.device: '{}' requested but LibTorch sees no CUDA device "
                                                 "(use auto or cpu)", name));
    try {
      *out = torch::Device(name);
    } catch (const c10::Error&) {
      return Status::InvalidArgument(fmt::format("learner.device: cannot parse '{}' (expected cuda or cuda:N)", name));
    }
    if (out->index() >= static_cast<int>(torch::cuda::device_count()))
      return Status::InvalidArgument(fmt::format("learner.device: '{}' but only {} CUDA devices", name,
                                                 torch::cuda::device_count()));
    return Status::Ok();
  }
  return Status::InvalidArgument(fmt::format("learner.device: expected auto, cpu, cuda or cuda:N, got '{}'", name));
}

}  // namespace farm
