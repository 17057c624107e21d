// Training statistics the learner reports: episode returns over a sliding
// window, the metrics file (JSON lines), the live progress line and the
// summary written atomically (common/files.h).
//
// Threading: not thread-safe; used by the learner's inference thread.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <deque>
#include <fstream>
#include <string>
#include <vector>

#include "common/files.h"
#include "common/status.h"

namespace farm {

class EpisodeWindow {
 public:
  explicit EpisodeWindow(std::size_t size = 100) : size_(size) {}
  void Add(double episode_return, int64_t length);
  bool empty() const { return returns_.empty(); }
  std::size_t count() const { return returns_.size(); }
  bool full() const { return returns_.size() == size_; }
  double mean_return() const;
  double mean_length() const;
  int64_t total_episodes() const { return total_; }
  // The window's episodes, oldest first (for checkpoints).
  std::vector<double> returns() const { return {returns_.begin(), returns_.end()}; }
  std::vector<int64_t> lengths() const { return {lengths_.begin(), lengths_.end()}; }
  // Replaces the contents: the window's episodes, oldest first (only the newest `size` are kept), and the
  // count of episodes ever added. `returns` and `lengths` must have one size.
  void Restore(const std::vector<double>& returns, const std::vector<int64_t>& lengths, int64_t total);

 private:
  std::size_t size_;
  std::deque<double> returns_;
  std::deque<int64_t> lengths_;
  double sum_return_ = 0;
  double sum_length_ = 0;
  int64_t total_ = 0;
};

// Appends one JSON object per line, flushed after each.
// metrics.jsonl: one JSON object per line, appended and flushed to the OS per row. A row that cannot be
// written whole (a full disk, a file size limit) is cut off again, so the file never holds half a line; Write
// says so and the next row is tried as usual. Threading: one thread (the learner's inference thread).
class MetricsWriter {
 public:
  MetricsWriter() = default;
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  Status Open(const std::string& path);
  Status Write(const nlohmann::json& row);

 private:
  int fd_ = -1;
  std::string path_;
};

// One status line, redrawn in place on a terminal, plain log lines otherwise.
class ProgressLine {
 public:
  ProgressLine();
  void Show(const std::string& text);
  void Finish();  // ends the in-place line

 private:
  bool tty_;
  bool drawn_ = false;
};


}  // namespace farm
