// Durable file writes.
#include "common/files.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace farm {

Status WriteFileAtomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  if (auto s = WriteTempFile(tmp, text); !s.ok()) return s;
  return CommitFile(tmp, path);
}

Status WriteTempFile(const std::string& tmp, const std::string& text) {
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::IoError(fmt::format("{}: cannot create: {}", tmp, std::strerror(errno)));
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      std::remove(tmp.c_str());  // a disk that filled up keeps nothing half-written
      return Status::IoError(fmt::format("{}: write failed after {} of {} bytes: {}", tmp, done, text.size(),
                                         std::strerror(err)));
    }
    done += static_cast<std::size_t>(n);
  }
  if (::close(fd) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return Status::IoError(fmt::format("{}: close failed: {}", tmp, std::strerror(err)));
  }
  return Status::Ok();
}

Status SyncFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::IoError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return Status::IoError(fmt::format("{}: fsync failed: {}", path, std::strerror(err)));
  return Status::Ok();
}

Status SyncParentDirectory(const std::string& path) {
  const std::string::size_type slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return Status::IoError(fmt::format("{}: cannot open directory: {}", dir, std::strerror(errno)));
  const int drc = ::fsync(dfd);
  const int derr = errno;
  ::close(dfd);
  if (drc != 0) return Status::IoError(fmt::format("{}: fsync of the directory failed: {}", dir, std::strerror(derr)));
  return Status::Ok();
}

Status CommitFile(const std::string& tmp, const std::string& path) {
  if (auto s = SyncFile(tmp); !s.ok()) {
    std::remove(tmp.c_str());
    return s;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    return Status::IoError(fmt::format("rename {} -> {} failed: {}", tmp, path, why));
  }
  // The rename itself is durable only once the directory is: without this, a power loss could leave the old
  // file (or none) behind although the new one was reported written.
  return SyncParentDirectory(path);
}

namespace {

int RemoveEntry(const char* path, const struct stat*, int type, struct FTW*) {
  return (type == FTW_DP ? ::rmdir(path) : ::unlink(path)) == 0 ? 0 : errno;
}

}  // namespace

Status RemoveTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::Ok();
    return Status::IoError(fmt::format("{}: cannot remove: {}", path, std::strerror(errno)));
  }
  // Depth first (contents before their directory), without following links, without leaving the device.
  const int rc = ::nftw(path.c_str(), RemoveEntry, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
  if (rc != 0) {
    const int err = rc > 0 ? rc : errno;
    return Status::IoError(fmt::format("{}: cannot remove: {}", path, std::strerror(err)));
  }
  return Status::Ok();
}

Status DirectoryLock::Acquire(const std::string& dir, const std::string& name,
                              std::unique_ptr<DirectoryLock>* out) {
  const std::string path = dir + "/" + name;
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return Status::IoError(fmt::format("{}: cannot open lock file: {}", path, std::strerror(errno)));
  int rc;
  do {
    rc = ::flock(fd, LOCK_EX | LOCK_NB);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int err = errno;
    ::close(fd);
    if (err == EWOULDBLOCK) return Status::IoError(fmt::format("{} is locked by another process", path));
    return Status::IoError(fmt::format("{}: cannot lock: {}", path, std::strerror(err)));
  }
  out->reset(new DirectoryLock(fd));
  return Status::Ok();
}

DirectoryLock::~DirectoryLock() { ::close(fd_); }  // releases the flock

}  // namespace farm
