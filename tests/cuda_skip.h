// The GPU cases' skip, a helper and no test of its own: a case that needs a CUDA device returns with Catch's
// warning where there is none (CI, the 2-core development machine), and runs in full on the GPU machine
// (scripts/gpu_check.sh). A macro, so that the warning and the return are the case's own; include it after
// <catch2/catch.hpp>.
#pragma once

#include <torch/cuda.h>

// Returns from the enclosing case, with a warning, unless `cond` holds.
#define FARM_SKIP_UNLESS(cond)             \
  do {                                     \
    if (!(cond)) {                         \
      WARN("no CUDA device: skipped");     \
      return;                              \
    }                                      \
  } while (false)

// Returns from the enclosing case, with a warning, unless LibTorch sees a CUDA device.
#define FARM_SKIP_WITHOUT_CUDA() FARM_SKIP_UNLESS(torch::cuda::is_available())
