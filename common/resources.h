// This process's memory: its use, for metrics and benchmark reports, and how its allocator gives memory back.
#pragma once

#include <cstdint>
#include <string>

namespace farm {

double MaxRssMb();      // peak resident set since start (MiB)
double CurrentRssMb();  // resident set now (MiB)

// For a process that allocates the same large temporaries over and over (the learner: every batch's and every
// minibatch's tensors, a few hundred kB to a few MB each, thousands of times a second). With glibc's defaults a
// block over the mmap threshold (128 kB at first) is a fresh mapping each time, and freed memory at the top of a
// thread's arena is handed back to the kernel once it passes the trim threshold, so the next batch page-faults
// it all in again: measured on the learner's inference thread, a third of its time in page faults and madvise,
// and its forward 4-10x slower (records/performance-history.md, "Policies with memory"). This raises glibc's mmap
// threshold to 32 MiB (the ceiling its own dynamic threshold would reach) and its trim threshold to 64 MiB, so each
// arena keeps up to 64 MiB of freed memory for reuse. It does nothing when MALLOC_MMAP_THRESHOLD_,
// MALLOC_TRIM_THRESHOLD_ or MALLOC_TOP_PAD_ is set (the user's own choice) or without glibc. Call it once, early
// in main. Returns one line for the log saying what it did.
std::string KeepFreedMemoryForReuse();

// The freed memory each thread's allocator arena may keep after KeepFreedMemoryForReuse (its trim threshold, 64
// MiB), or 0 when that left glibc's defaults (the memory estimate counts it for the threads that make tensors).
int64_t FreedMemoryKeptPerArena();

}  // namespace farm
