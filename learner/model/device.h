// Maps learner.device (auto | cpu | cuda | cuda:N) to a torch::Device; sets the CPU thread counts.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>

#include "common/status.h"

namespace farm {

// "auto" picks CUDA when LibTorch sees a GPU. Asking for CUDA without one is an error.
Status ResolveDevice(const std::string& name, torch::Device* out);

// torch::set_num_threads(threads) for the calling thread's ATen ops, and the same cap on OpenBLAS's own
// thread pool when LibTorch's BLAS is OpenBLAS (Debian's: ATen does not pass its setting on, and OpenBLAS
// otherwise runs one busy-waiting thread per core for every mid-sized GEMM: on a 2-core machine shared with
// workers that made the acting forward at batch 256 five times slower). OpenBLAS's cap is process-wide.
void SetCpuThreads(int threads);

// OpenBLAS's helper threads (its pthreads build: LibTorch's BLAS on Debian) busy-wait, calling sched_yield, for
// 2^28 cycles (about 0.1 s) after each job before they sleep, so with learner.threads > 1 they never sleep
// between the GEMMs of a forward or backward pass, and take the cores from ATen's own threads and from workers.
// This makes them sleep after 2^20 cycles (OPENBLAS_THREAD_TIMEOUT=20, under half a millisecond: awake across a
// pass's back-to-back products, asleep between acting batches; a job wakes them) and restarts OpenBLAS's pool so
// that the wait takes effect (the pool comes back at the next threaded call, as after a fork). uav_coverage, 16
// workers, learner.threads 2: mlp 5,939-6,132 env steps/s against 5,280-5,419 with the default wait, a GRU
// 2,176-2,242 against 2,163-2,174 (records/performance-history.md, "CPU: the 2-core development machine"). Nothing
// changes when the environment sets OPENBLAS_THREAD_TIMEOUT (the user's choice wins) or the BLAS is not OpenBLAS.
// Call once, early in main, before any other thread uses BLAS. Returns what it did, and a line for the log.
struct BlasWait {
  enum class Outcome {
    kShortened,    // OpenBLAS's idle threads now sleep after 2^kShortBlasWaitExponent cycles
    kUserSet,      // OPENBLAS_THREAD_TIMEOUT was set by the user: left as it is
    kNotOpenBlas,  // LibTorch's BLAS is not OpenBLAS (or lacks the functions): nothing to do
    kFailed,       // setenv failed, or OpenBLAS did not take the variable: its threads still spin about 0.1 s
  };
  Outcome outcome;
  std::string message;
};
inline constexpr int kShortBlasWaitExponent = 20;
BlasWait ShortenBlasThreadWait();

// The free memory of a CUDA device (cudaMemGetInfo); none on the CPU, without CUDA, or when it cannot be read.
std::optional<int64_t> CudaFreeBytes(const torch::Device& device);

}  // namespace farm
