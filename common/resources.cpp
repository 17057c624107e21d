// Resident-set sizes from getrusage and /proc/self/statm (Linux); glibc's malloc thresholds.
#include "common/resources.h"

#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace farm {

double MaxRssMb() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;  // Linux reports KiB
}

double CurrentRssMb() {
  long pages = 0, resident = 0;
  if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1024.0 * 1024.0);
}

namespace {
std::atomic<int64_t> kept_per_arena{0};  // set once, early in main, before the threads that read it start
}  // namespace

int64_t FreedMemoryKeptPerArena() { return kept_per_arena.load(); }

std::string KeepFreedMemoryForReuse() {
#if defined(__GLIBC__)
  for (const char* user : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_"})
    if (std::getenv(user) != nullptr)
      return std::string("allocator: ") + user + " is set; glibc's thresholds left as the environment says";
  constexpr int kMmapThreshold = 32 << 20;
  constexpr int kTrimThreshold = 64 << 20;
  if (mallopt(M_MMAP_THRESHOLD, kMmapThreshold) != 1 || mallopt(M_TRIM_THRESHOLD, kTrimThreshold) != 1)
    return "allocator: glibc refused the mmap and trim thresholds; its defaults stay";
  kept_per_arena = kTrimThreshold;
  return "allocator: glibc mmap threshold 32 MiB, trim threshold 64 MiB (freed memory kept for reuse)";
#else
  return "allocator: not glibc; its defaults stay";
#endif
}

}  // namespace farm
