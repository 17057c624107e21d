// Maps learner.device (auto | cpu | cuda | cuda:N) to a torch::Device.
#pragma once

#include <torch/torch.h>

#include <string>

#include "common/status.h"

namespace farm {

// "auto" picks CUDA when LibTorch sees a GPU. Asking for CUDA without one is an error.
Status ResolveDevice(const std::string& name, torch::Device* out);

}  // namespace farm
