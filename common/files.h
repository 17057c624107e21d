// Durable file writes: whoever reads a run's files sees the old version or
// the new one, never half of one, even after a crash.
#pragma once

#include <string>

#include "common/status.h"

namespace farm {

// Writes `text` to `path` via `path`.tmp, fsync and rename.
Status WriteFileAtomic(const std::string& path, const std::string& text);

// Makes a finished temp file durable and moves it into place: fsync, then
// rename over `path`. On failure the temp file is removed.
Status CommitFile(const std::string& tmp, const std::string& path);

}  // namespace farm
