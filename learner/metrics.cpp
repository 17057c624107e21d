// Episode windows, metrics rows, the progress line and atomic file writes.
#include "learner/metrics.h"

#include <fmt/format.h>
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


}  // namespace farm
