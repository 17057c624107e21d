// CheckpointWriter: writes checkpoints (learner/checkpoint.h's WriteCheckpoint: temp file, fsync, rename,
// checksum, `latest`, pruning) on a thread of its own, so that a slow disk (fsync on a loaded or network
// filesystem) delays neither the next PPO update nor serving. The trainer serialises a checkpoint into memory
// (fast) and hands the bytes over; each periodic write's outcome goes to `on_done`.
//
// At most one periodic checkpoint waits while another is written: a newer one replaces it (the older is never
// written; skipped() counts them), so a disk that cannot keep up costs checkpoints, not memory. WriteNow (the
// final checkpoint) waits for the write in flight and any waiting one, then writes its own, in order: `latest`
// always names the newest checkpoint written.
//
// Threading: Submit, WriteNow, in_flight_seconds and skipped may be called from any thread; writes happen on
// the writer's thread, which also calls `on_done` (for Submit's checkpoints only). The destructor writes what is
// waiting, then joins.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "common/status.h"
#include "learner/checkpoint.h"

namespace farm {

class CheckpointWriter {
 public:
  // on_done(status, path, bytes.name) after each periodic write. before_write (tests, benchmarks: a slow disk)
  // runs on the writer's thread before each write.
  using Done = std::function<void(const Status& status, const std::string& path, const std::string& name)>;
  CheckpointWriter(std::string dir, int keep, Done on_done, std::function<void()> before_write = {});
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Queues a periodic checkpoint and returns at once.
  void Submit(CheckpointBytes bytes);
  // Writes `bytes` after everything queued before it, and returns how it went.
  Status WriteNow(CheckpointBytes bytes, std::string* path);
  // How long the write in flight has taken so far (0 when none): the status line shows a write that is behind.
  double in_flight_seconds() const;
  // Periodic checkpoints replaced by a newer one before they were written.
  int64_t skipped() const { return skipped_.load(); }

 private:
  struct Item {
    CheckpointBytes bytes;
    bool final = false;
  };
  void Loop();

  const std::string dir_;
  const int keep_;
  const Done on_done_;
  const std::function<void()> before_write_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Item> waiting_;  // GUARDED_BY(mu_): the next periodic checkpoint
  std::optional<Item> final_;    // GUARDED_BY(mu_): WriteNow's, written after `waiting_`
  bool closed_ = false;          // GUARDED_BY(mu_)
  uint64_t finals_done_ = 0;     // GUARDED_BY(mu_)
  Status final_status_;          // GUARDED_BY(mu_)
  std::string final_path_;       // GUARDED_BY(mu_)
  std::atomic<int64_t> started_ns_{0};  // steady-clock time the write in flight began; 0: none
  std::atomic<int64_t> skipped_{0};
  std::thread thread_;
};

}  // namespace farm
