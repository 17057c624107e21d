// Liveness: when each admitted worker was last heard from, recorded by the
// I/O thread as its messages arrive. A worker is judged silent by what
// reached the learner, never by when a busy inference thread got round to
// it: a slow learner does not drop healthy workers.
//
// ThreadActivity: what one thread is doing and since when, so that another
// thread can say when it stalls (which thread, in what, for how long).
//
// Threading: both are thread-safe. Liveness: the I/O thread calls Heard()
// for every message; the inference thread calls Admit(), Forget() and
// SilentFor(). ThreadActivity: its own thread calls Begin()/End(), any
// thread reads BusyFor().
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace farm {

class Liveness {
 public:
  using Clock = std::chrono::steady_clock;

  // Starts `identity`'s clock at `now` (its Hello was accepted).
  void Admit(const std::string& identity, Clock::time_point now);
  void Forget(const std::string& identity);
  // A message from `identity` arrived at `now`; returns whether it is admitted.
  bool Heard(const std::string& identity, Clock::time_point now);
  // Admitted workers not heard from for more than `seconds` at `now`.
  std::vector<std::string> SilentFor(double seconds, Clock::time_point now) const;
  std::size_t size() const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, Clock::time_point> last_heard_;  // GUARDED_BY(mu_)
};

class ThreadActivity {
 public:
  using Clock = std::chrono::steady_clock;

  struct Busy {
    const char* what;
    double seconds;
  };
  // The thread starts `what` (a string literal: it is kept by pointer) at `now`.
  void Begin(const char* what, Clock::time_point now = Clock::now());
  void End();
  // The thread's own view, to resume an outer activity after an inner one (ActivityScope).
  const char* what() const { return what_.load(std::memory_order_relaxed); }
  Clock::time_point since() const { return Clock::time_point{std::chrono::nanoseconds(since_ns_.load())}; }
  // What the thread has been doing since when, at `now`; nullopt while idle.
  std::optional<Busy> BusyAt(Clock::time_point now) const;

 private:
  std::atomic<const char*> what_{nullptr};
  std::atomic<int64_t> since_ns_{0};  // steady_clock nanoseconds; written before what_
};

// Begin on construction; on destruction the activity it interrupted (if any) resumes, with its start time.
class ActivityScope {
 public:
  ActivityScope(ThreadActivity& activity, const char* what)
      : activity_(activity), outer_(activity.what()), outer_since_(activity.since()) {
    activity_.Begin(what);
  }
  ~ActivityScope() {
    if (outer_) {
      activity_.Begin(outer_, outer_since_);
    } else {
      activity_.End();
    }
  }
  ActivityScope(const ActivityScope&) = delete;
  ActivityScope& operator=(const ActivityScope&) = delete;

 private:
  ThreadActivity& activity_;
  const char* const outer_;
  const ThreadActivity::Clock::time_point outer_since_;
};

}  // namespace farm
