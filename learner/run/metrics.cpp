// Episode windows, metrics rows, the progress line and atomic file writes.
#include "learner/run/metrics.h"

#include <fmt/format.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
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

void EpisodeWindow::Restore(const std::vector<double>& returns, const std::vector<int64_t>& lengths, int64_t total) {
  returns_.clear();
  lengths_.clear();
  sum_return_ = 0;
  sum_length_ = 0;
  const std::size_t n = std::min(returns.size(), lengths.size());
  for (std::size_t i = n > size_ ? n - size_ : 0; i < n; ++i) {
    returns_.push_back(returns[i]);
    lengths_.push_back(lengths[i]);
    sum_return_ += returns[i];
    sum_length_ += static_cast<double>(lengths[i]);
  }
  total_ = std::max<int64_t>(total, static_cast<int64_t>(returns_.size()));
}

double EpisodeWindow::mean_return() const {
  return returns_.empty() ? 0.0 : sum_return_ / static_cast<double>(returns_.size());
}

double EpisodeWindow::mean_length() const {
  return lengths_.empty() ? 0.0 : sum_length_ / static_cast<double>(lengths_.size());
}

MetricsWriter::~MetricsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

Status MetricsWriter::Open(const std::string& path) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) return Status::IoError(fmt::format("{}: cannot open for writing: {}", path, std::strerror(errno)));
  path_ = path;
  return Status::Ok();
}

Status MetricsWriter::Write(const nlohmann::json& row) {
  if (fd_ < 0) return Status::IoError("metrics.jsonl is not open");
  const std::string line = row.dump() + "\n";
  const off_t before = ::lseek(fd_, 0, SEEK_END);
  std::size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;
      if (before >= 0 && done > 0 && ::ftruncate(fd_, before) != 0) {
        return Status::IoError(fmt::format("{}: a row could not be written ({}) and the part written could not "
                                           "be removed ({})",
                                           path_, std::strerror(err), std::strerror(errno)));
      }
      return Status::IoError(fmt::format("{}: a row could not be written: {}", path_, std::strerror(err)));
    }
    done += static_cast<std::size_t>(n);
  }
  return Status::Ok();
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


}  // namespace farm
