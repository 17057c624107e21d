#include "learner/run/checkpoint_writer.h"

#include <spdlog/spdlog.h>

#include "learner/run/error_text.h"

namespace farm {
namespace {
int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

CheckpointWriter::CheckpointWriter(std::string dir, int keep, std::function<void()> on_written,
                                   std::function<void()> before_write)
    : dir_(std::move(dir)), keep_(keep), on_written_(std::move(on_written)), before_write_(std::move(before_write)) {
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
  std::lock_guard<std::mutex> one_at_a_time(write_now_mu_);
  std::unique_lock<std::mutex> lock(mu_);
  if (waiting_) {  // older than this one, and the stop should not wait for it: never written
    ++skipped_;
    waiting_.reset();
  }
  const uint64_t ticket = finals_done_ + 1;
  final_ = Item{std::move(bytes), true};
  cv_.notify_all();
  cv_.wait(lock, [&] { return finals_done_ >= ticket; });
  if (path) *path = final_path_;
  return final_status_;
}

std::vector<CheckpointWriter::Written> CheckpointWriter::TakeResults() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Written> out;
  out.swap(results_);
  return out;
}

std::vector<CheckpointWriter::Written> CheckpointWriter::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !waiting_ && !final_ && !writing_; });
  std::vector<Written> out;
  out.swap(results_);
  return out;
}

double CheckpointWriter::in_flight_seconds() const {
  const int64_t started = started_ns_.load();
  return started == 0 ? 0.0 : static_cast<double>(NowNs() - started) / 1e9;
}

Status CheckpointWriter::Write(const Item& item, std::string* path) {
  try {
    if (before_write_) before_write_();
    return WriteCheckpoint(dir_, item.bytes, keep_, path);
  } catch (const std::exception& e) {
    return Status::IoError(item.bytes.name + ": writing failed: " + ErrorText(e));
  } catch (...) {
    return Status::IoError(item.bytes.name + ": writing failed: an unknown exception");
  }
}

void CheckpointWriter::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return closed_ || waiting_ || final_; });
    Item item;
    if (final_) {  // WriteNow dropped any periodic one queued before it
      item = std::move(*final_);
      final_.reset();
    } else if (waiting_) {
      item = std::move(*waiting_);
      waiting_.reset();
    } else {
      return;  // closed, nothing left
    }
    writing_ = true;
    lock.unlock();
    started_ns_.store(NowNs());
    std::string path;
    const Status s = Write(item, &path);
    started_ns_.store(0);
    lock.lock();
    writing_ = false;
    if (item.final) {
      final_status_ = s;
      final_path_ = path;
      ++finals_done_;
    } else {
      results_.push_back(Written{s, path, item.bytes.name});
    }
    cv_.notify_all();
    if (!item.final && on_written_) {
      lock.unlock();
      try {
        on_written_();
      } catch (const std::exception& e) {  // the outcome stays queued: Drain hands it over at shutdown
        spdlog::warn("checkpoint {}: could not announce the write: {}", item.bytes.name, ErrorText(e));
      } catch (...) {
        spdlog::warn("checkpoint {}: could not announce the write: an unknown exception", item.bytes.name);
      }
      lock.lock();
    }
  }
}

}  // namespace farm
