// One-pass helpers for the learner's admission of a StepRequest (common/wire.h has the checks themselves):
// copying a float tensor's bytes while looking for a NaN or an infinity, and looking at the other fields.
#pragma once

#include <cstdint>
#include <string>

#include "common/wire.h"

namespace farm {

// Copies the floats of `bytes` (any alignment) to `dst` while looking for a non-finite one, a chunk of
// 16 KiB at a time (scanned, then copied while in the L1 cache): the source is read from memory once. Returns
// the index of the first non-finite float (the copy stops at its chunk: `dst` is then partly written), or -1
// when all are finite and `bytes.size()` bytes were copied.
int64_t CopyUntilNonFinite(const std::string& bytes, void* dst);

// FindNonFinite over every field but obs and global_state (reward, final_obs, final_global_state, the
// episodes' returns): for a request whose obs and global_state CopyUntilNonFinite found finite.
bool FindNonFiniteBesidesObsAndState(const wire::StepRequest& req, NonFinite* first);

}  // namespace farm
