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

// The free memory of a CUDA device (cudaMemGetInfo); none on the CPU, without CUDA, or when it cannot be read.
std::optional<int64_t> CudaFreeBytes(const torch::Device& device);

}  // namespace farm
