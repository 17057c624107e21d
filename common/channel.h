// Channel: a bounded, closeable FIFO between threads. Close() wakes every
// waiter; Send and Receive then fail with Status::Closed (items still queued
// are dropped: a closed channel means "stop now").
//
// Threading: any number of senders and receivers.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>

#include "common/status.h"

namespace farm {

template <class T>
class Channel {
 public:
  explicit Channel(std::size_t capacity) : capacity_(capacity) {}
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  Status Send(T item) {
    std::unique_lock<std::mutex> lock(mu_);
    not_full_.wait(lock, [&] { return closed_ || items_.size() < capacity_; });
    if (closed_) return Status::Closed("channel closed");
    items_.push_back(std::move(item));
    not_empty_.notify_one();
    return Status::Ok();
  }

  Status Receive(T* out) {
    std::unique_lock<std::mutex> lock(mu_);
    not_empty_.wait(lock, [&] { return closed_ || !items_.empty(); });
    if (closed_) return Status::Closed("channel closed");
    *out = std::move(items_.front());
    items_.pop_front();
    not_full_.notify_one();
    return Status::Ok();
  }

  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    not_full_.notify_all();
    not_empty_.notify_all();
  }

 private:
  const std::size_t capacity_;
  std::mutex mu_;
  std::condition_variable not_full_;
  std::condition_variable not_empty_;
  std::deque<T> items_;  // GUARDED_BY(mu_)
  bool closed_ = false;  // GUARDED_BY(mu_)
};

}  // namespace farm
