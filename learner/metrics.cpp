// Episode windows, metrics rows, the progress line and atomic file writes.
#include "learner/metrics.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace farm {

void EpisodeWindow::Add(double episode_return, int64_t length) {
  returns_.push_back(episode_return);
  lengths_.push_back(length);
  sum_return_ += episode_return;
  sum_length_ += static_cast<double>(length);
  ++total_;
  if (returns_.size() > size_) {
    sum_return_ -= returns_.front();
    sum_length_ -= static_cast<double>(lengths_.front());
    returns_.pop_front();
    lengths_.pop_front();
  }
}

double EpisodeWindow::mean_return() const {
  return returns_.empty() ? 0.0 : sum_return_ / static_cast<double>(returns_.size());
}

double EpisodeWindow::mean_length() const {
  return lengths_.empty() ? 0.0 : sum_length_ / static_cast<double>(lengths_.size());
}

Status MetricsWriter::Open(const std::string& path) {
  out_.open(path, std::ios::out | std::ios::app);
  if (!out_) return Status::IoError(fmt::format("{}: cannot open for writing: {}", path, std::strerror(errno)));
  return Status::Ok();
}

void MetricsWriter::Write(const nlohmann::json& row) {
  out_ << row.dump() << '\n';
  out_.flush();
}

ProgressLine::ProgressLine() : tty_(::isatty(STDERR_FILENO) == 1) {}

void ProgressLine::Show(const std::string& text) {
  if (tty_) {
    fmt::print(stderr, "\r\033[K{}", text);
    drawn_ = true;
  } else {
    fmt::print(stderr, "{}\n", text);
  }
  std::fflush(stderr);
}

void ProgressLine::Finish() {
  if (tty_ && drawn_) fmt::print(stderr, "\n");
  drawn_ = false;
}

Status WriteFileAtomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::IoError(fmt::format("{}: cannot create: {}", tmp, std::strerror(errno)));
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return Status::IoError(fmt::format("{}: write failed: {}", tmp, std::strerror(err)));
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0)
    return Status::IoError(fmt::format("{}: fsync/close failed: {}", tmp, std::strerror(errno)));
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return Status::IoError(fmt::format("rename {} -> {} failed: {}", tmp, path, std::strerror(errno)));
  return Status::Ok();
}

}  // namespace farm
