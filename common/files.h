// Durable file writes: whoever reads a run's files sees the old version or
// the new one, never half of one, even after a crash.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"

namespace farm {

// Writes `text` to `path` via WriteTempFile(`path`.tmp) and CommitFile. On any failure (a full disk: ENOSPC, a file size
// limit: EFBIG) `path` is untouched, the temp file removed, and the error names the file and the OS's reason.
Status WriteFileAtomic(const std::string& path, const std::string& text);

// Writes `text` to `tmp` (created or truncated), not yet durable: CommitFile moves it into place. On failure
// `tmp` is removed and the error names it and the OS's reason.
Status WriteTempFile(const std::string& tmp, const std::string& text);

// Makes a finished temp file durable and moves it into place: SyncFile, rename
// over `path`, then SyncParentDirectory (so the rename survives a power
// loss too). On failure before the rename the temp file is removed.
Status CommitFile(const std::string& tmp, const std::string& path);

// fsync(2) of a file, and of the directory that holds `path` (which makes renames in it durable). A delayed
// write error (ENOSPC on a filesystem that allocates late, EDQUOT, EIO) shows here; the error names the file.
Status SyncFile(const std::string& path);
Status SyncParentDirectory(const std::string& path);

// Removes `path` and, for a directory, everything under it (symbolic links are removed, not followed).
// A missing path is not an error. Use this rather than std::filesystem::remove_all in code that links
// LibTorch: PyTorch's wheels export their own copy of remove_all from libtorch.so, which the dynamic linker
// binds in preference to libstdc++'s and which crashes when called from a program built with another
// libstdc++ (seen with torch 2.11: a call through a null pointer).
Status RemoveTree(const std::string& path);

// An exclusive lock on a directory: flock(2) on DIR/NAME (created empty if missing, never removed), held until
// the object is destroyed or the process ends, however it ends (kill -9 included), so a crashed holder never
// leaves a stale lock. A second lock on the same directory, from another process or this one, fails at once
// (IoError, "... is locked by another process"). Threading: not shared; create and destroy it on one thread.
class DirectoryLock {
 public:
  static Status Acquire(const std::string& dir, const std::string& name, std::unique_ptr<DirectoryLock>* out);
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

 private:
  explicit DirectoryLock(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace farm
