// DynamicBatcher: a bounded, closeable queue whose consumer takes items in
// batches (TorchBeast's BatchingQueue, SEED RL's batcher). A batch is
// released when it holds max_rows rows, when `ready_items` items are queued,
// or max_wait after its first item arrived, whichever comes first.
//
// Threading: any number of producers (Push/TryPush/PushFront), one consumer
// (NextBatch). Close() wakes every waiter; afterwards Push and NextBatch fail
// with Status::Closed (NextBatch first drains nothing: pending items are dropped).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <vector>

#include "common/status.h"

namespace farm {

template <class T>
class DynamicBatcher {
 public:
  using Clock = std::chrono::steady_clock;
  // rows(item) counts the rows an item adds to a batch (0 allowed: control items).
  DynamicBatcher(int64_t max_rows, std::chrono::microseconds max_wait, std::size_t capacity,
                 std::function<int64_t(const T&)> rows)
      : max_rows_(max_rows), max_wait_(max_wait), capacity_(capacity), rows_(std::move(rows)) {}

  DynamicBatcher(const DynamicBatcher&) = delete;
  DynamicBatcher& operator=(const DynamicBatcher&) = delete;

  // Blocks while the queue holds `capacity` items (back-pressure).
  Status Push(T item) {
    std::unique_lock<std::mutex> lock(mu_);
    can_push_.wait(lock, [&] { return closed_ || queue_.size() < capacity_; });
    if (closed_) return Status::Closed("batcher closed");
    Enqueue(std::move(item), /*front=*/false);
    return Status::Ok();
  }

  // Never blocks: queues the item when there is room (true), else leaves it with the caller (false). Closed
  // when the batcher is closed (the item is then dropped).
  Status TryPush(T&& item, bool* queued) {
    std::lock_guard<std::mutex> lock(mu_);
    *queued = false;
    if (closed_) return Status::Closed("batcher closed");
    if (queue_.size() >= capacity_) return Status::Ok();
    Enqueue(std::move(item), /*front=*/false);
    *queued = true;
    return Status::Ok();
  }

  // Puts an item at the head, ignoring capacity, and releases the next batch
  // at once: for deferred items and control messages, which must never wait.
  Status PushFront(T item) {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return Status::Closed("batcher closed");
    Enqueue(std::move(item), /*front=*/true);
    return Status::Ok();
  }

  // Releases a batch as soon as this many items are queued (0: never early).
  void SetReadyItems(std::size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    ready_items_ = n;
    can_take_.notify_one();
  }

  // Waits for a batch and moves it into `out` (cleared first). Items are
  // taken in order while their rows fit in max_rows; the first always fits.
  Status NextBatch(std::vector<T>* out) { return NextBatch(out, std::chrono::milliseconds::max()); }

  // As above, but returns Ok with an empty batch when nothing arrives within
  // `idle` (so the consumer can do periodic work).
  Status NextBatch(std::vector<T>* out, std::chrono::milliseconds idle) {
    out->clear();
    std::unique_lock<std::mutex> lock(mu_);
    auto has_work = [&] { return closed_ || !queue_.empty(); };
    if (idle == std::chrono::milliseconds::max()) {
      can_take_.wait(lock, has_work);
    } else if (!can_take_.wait_for(lock, idle, has_work)) {
      return Status::Ok();
    }
    if (closed_) return Status::Closed("batcher closed");
    const auto deadline = queue_.front().arrival + max_wait_;
    can_take_.wait_until(lock, deadline, [&] {
      return closed_ || queued_rows_ >= max_rows_ || (ready_items_ > 0 && queue_.size() >= ready_items_);
    });
    if (closed_) return Status::Closed("batcher closed");
    int64_t rows = 0;
    while (!queue_.empty()) {
      const int64_t r = rows_(queue_.front().item);
      if (!out->empty() && rows + r > max_rows_) break;
      rows += r;
      queued_rows_ -= r;
      out->push_back(std::move(queue_.front().item));
      queue_.pop_front();
    }
    can_push_.notify_all();
    return Status::Ok();
  }

  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    can_push_.notify_all();
    can_take_.notify_all();
  }

  std::size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return queue_.size();
  }

 private:
  void Enqueue(T item, bool front) {
    queued_rows_ += rows_(item);
    if (front) {
      // Front items are due at once: their "arrival" is long past.
      queue_.push_front(Entry{std::move(item), Clock::time_point{}});
    } else {
      queue_.push_back(Entry{std::move(item), Clock::now()});
    }
    can_take_.notify_one();
  }

  const int64_t max_rows_;
  const std::chrono::microseconds max_wait_;
  const std::size_t capacity_;
  const std::function<int64_t(const T&)> rows_;

  mutable std::mutex mu_;
  std::condition_variable can_push_;
  std::condition_variable can_take_;
  struct Entry {
    T item;
    Clock::time_point arrival;
  };
  std::deque<Entry> queue_;         // GUARDED_BY(mu_)
  int64_t queued_rows_ = 0;         // GUARDED_BY(mu_)
  std::size_t ready_items_ = 0;     // GUARDED_BY(mu_)
  bool closed_ = false;             // GUARDED_BY(mu_)
};

}  // namespace farm
