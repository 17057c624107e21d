#include "learner/checkpoint_writer.h"

namespace farm {
namespace {
int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

CheckpointWriter::CheckpointWriter(std::string dir, int keep, Done on_done, std::function<void()> before_write)
    : dir_(std::move(dir)), keep_(keep), on_done_(std::move(on_done)), before_write_(std::move(before_write)) {
  thread_ = std::thread([this] { Loop(); });
}

CheckpointWriter::~CheckpointWriter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void CheckpointWriter::Submit(CheckpointBytes bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (waiting_) ++skipped_;  // the disk is behind: the newer checkpoint replaces the one not yet started
    waiting_ = Item{std::move(bytes), false};
  }
  cv_.notify_all();
}

Status CheckpointWriter::WriteNow(CheckpointBytes bytes, std::string* path) {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t ticket = finals_done_ + 1;
  final_ = Item{std::move(bytes), true};
  cv_.notify_all();
  cv_.wait(lock, [&] { return finals_done_ >= ticket; });
  if (path) *path = final_path_;
  return final_status_;
}

double CheckpointWriter::in_flight_seconds() const {
  const int64_t started = started_ns_.load();
  return started == 0 ? 0.0 : static_cast<double>(NowNs() - started) / 1e9;
}

void CheckpointWriter::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return closed_ || waiting_ || final_; });
    Item item;
    if (waiting_) {  // queued before any final one: written first
      item = std::move(*waiting_);
      waiting_.reset();
    } else if (final_) {
      item = std::move(*final_);
      final_.reset();
    } else {
      return;  // closed, nothing left
    }
    lock.unlock();
    started_ns_.store(NowNs());
    if (before_write_) before_write_();
    std::string path;
    const Status s = WriteCheckpoint(dir_, item.bytes, keep_, &path);
    started_ns_.store(0);
    if (!item.final && on_done_) on_done_(s, path, item.bytes.name);
    lock.lock();
    if (item.final) {
      final_status_ = s;
      final_path_ = path;
      ++finals_done_;
      cv_.notify_all();
    }
  }
}

}  // namespace farm
