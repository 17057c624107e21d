// CheckpointWriter: writes checkpoints (learner/run/checkpoint.h's WriteCheckpoint: temp file, fsync, rename,
// checksum, `latest`, pruning) on a thread of its own, so that a slow disk (fsync on a loaded or network
// filesystem) delays neither the next PPO update nor serving. The trainer serialises a checkpoint into memory
// (fast) and hands the bytes over.
//
// At most one periodic checkpoint waits while another is written: a newer one replaces it (the older is never
// written; skipped() counts them), so a disk that cannot keep up costs checkpoints, not memory. WriteNow (the
// final checkpoint) drops a waiting periodic one (it would be older: skipped), waits for the write in flight,
// then writes its own: `latest` always names the newest checkpoint written.
//
// Each periodic write's outcome is kept until TakeResults or Drain takes it; `on_written` says there is one.
// A write that throws (a filesystem error while listing, an allocation) is an outcome like any failed write,
// never std::terminate.
//
// Threading: Submit, WriteNow, TakeResults, Drain, in_flight_seconds and skipped may be called from any thread
// (concurrent WriteNow calls are written one after the other). Writes happen on the writer's thread, which also
// calls `on_written`. The destructor writes what is waiting, then joins.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "learner/run/checkpoint.h"

namespace farm {

class CheckpointWriter {
 public:
  // How a periodic checkpoint's write went: `path` when written, `name` the checkpoint's file name.
  struct Written {
    Status status;
    std::string path;
    std::string name;
  };
  // on_written() after each periodic write (on the writer's thread; it must not call back into the writer).
  // before_write (tests, benchmarks: a slow disk) runs on the writer's thread before each write.
  CheckpointWriter(std::string dir, int keep, std::function<void()> on_written = {},
                   std::function<void()> before_write = {});
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Queues a periodic checkpoint and returns at once.
  void Submit(CheckpointBytes bytes);
  // Writes `bytes` once the write in flight is done (a waiting periodic one is dropped), and returns how it went.
  Status WriteNow(CheckpointBytes bytes, std::string* path);
  // The periodic writes' outcomes not yet taken, oldest first.
  std::vector<Written> TakeResults();
  // Waits until nothing is waiting or being written, then TakeResults (at shutdown: no outcome is lost).
  std::vector<Written> Drain();
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
  Status Write(const Item& item, std::string* path);

  const std::string dir_;
  const int keep_;
  const std::function<void()> on_written_;
  const std::function<void()> before_write_;
  std::mutex write_now_mu_;  // one WriteNow at a time
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Item> waiting_;    // GUARDED_BY(mu_): the next periodic checkpoint
  std::optional<Item> final_;      // GUARDED_BY(mu_): WriteNow's
  bool writing_ = false;           // GUARDED_BY(mu_): an item has been taken and is being written
  bool closed_ = false;            // GUARDED_BY(mu_)
  uint64_t finals_done_ = 0;       // GUARDED_BY(mu_)
  Status final_status_;            // GUARDED_BY(mu_)
  std::string final_path_;         // GUARDED_BY(mu_)
  std::vector<Written> results_;   // GUARDED_BY(mu_): periodic outcomes not yet taken
  std::atomic<int64_t> started_ns_{0};  // steady-clock time the write in flight began; 0: none
  std::atomic<int64_t> skipped_{0};
  std::thread thread_;
};

}  // namespace farm
