// A full disk, as a test can make one without root: RLIMIT_FSIZE caps the size any file of this process may
// reach, so writes past it fail with EFBIG as they would with ENOSPC (SIGXFSZ, which would kill the process, is
// ignored while the limit is on). The soft limit and the signal's disposition are restored on destruction.
// Threading: the limit is process-wide; use it in tests that run nothing else at the same time.
#pragma once

#include <sys/resource.h>

#include <csignal>
#include <cstdint>

namespace farm {

class FileSizeLimit {
 public:
  explicit FileSizeLimit(uint64_t bytes) {
    getrlimit(RLIMIT_FSIZE, &saved_);
    old_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    rlimit limit = saved_;
    limit.rlim_cur = static_cast<rlim_t>(bytes);
    setrlimit(RLIMIT_FSIZE, &limit);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &saved_);
    std::signal(SIGXFSZ, old_handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  rlimit saved_{};
  void (*old_handler_)(int) = SIG_DFL;
};

}  // namespace farm
