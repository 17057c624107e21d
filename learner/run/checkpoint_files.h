// A run's checkpoint files without LibTorch's headers: listing them, their checksums, the newest valid one, the
// config stored in one. For callers that only find or read checkpoints (farm-learner's main); the rest of the
// checkpoint API is learner/run/checkpoint.h, which includes this. Defined in checkpoint.cpp.
//
// Threading: free functions; they read files only.
#pragma once

#include <cstdint>
#include <string>
#include <system_error>
#include <vector>

#include "common/status.h"

namespace farm {

// The config text stored in a checkpoint ("config_yaml"); NotFound when the
// checkpoint predates it. Reads nothing else (no policy needed).
Status ReadCheckpointConfig(const std::string& path, std::string* yaml);

// Checkpoint files in `dir` (ckpt-*.pt), newest first.
std::vector<std::string> ListCheckpoints(const std::string& dir, std::error_code* error = nullptr);

// CRC32C of a whole file (SaveCheckpoint records it in <checkpoint>.crc32c).
Status FileCrc32c(const std::string& path, uint32_t* crc);

// The newest checkpoint whose checksum matches its .crc32c file. Checkpoints
// passed over (truncated, corrupt, unchecked) are described in `skipped`.
Status FindLatestValidCheckpoint(const std::string& dir, std::string* path, std::vector<std::string>* skipped);

}  // namespace farm
