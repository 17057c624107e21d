// Liveness: when each admitted worker was last heard from, recorded by the
// I/O thread as its messages arrive. A worker is judged silent by what
// reached the learner, never by when a busy inference thread got round to
// it: a slow learner does not drop healthy workers.
//
// ThreadActivity: what one thread is doing and since when, so that another
// thread can say when it stalls (which thread, in what, for how long).
//
// A learner that was itself stopped (SIGSTOP, a paused VM, a host starved
// of CPU) heard nothing while it was: its I/O thread reports every turn of
// its loop (Listening(): when it started waiting, for how long at most, and
// when the wait ended), and the time it was not running (a wait that ended
// late, or a late start of the next wait) is credited to every admitted
// worker, so that the learner's own silence is never counted as theirs. A
// stop of kStoppedAtLeast or more gives every worker a whole
// heartbeat timeout from the learner's waking: a worker that took the
// learner for gone is connecting again (WorkerClient's backoff), and its new
// connection replaces the old one when its Hello arrives.
// Silence is measured up to the I/O thread's latest turn, so a check made on
// waking, before the I/O thread has turned, drops no one either.
//
// Threading: both are thread-safe. Liveness: the I/O thread calls Heard()
// for every message and Listening() at every turn; the inference thread
// calls Admit(), Forget() and SilentFor(). ThreadActivity: its own thread calls Begin()/End(), any
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
  // The I/O thread waited for messages from `waited_from` for at most `wait`, and is listening again at `now`.
  // The time it did not run since its previous turn (the wait's overrun, and the time between that turn and
  // `waited_from`), when over kNotRunningSlack, is credited to every admitted worker and returned in seconds
  // (0 normally).
  double Listening(Clock::time_point waited_from, Clock::duration wait, Clock::time_point now);
  // Shorter stretches are the scheduler's ordinary delays, not a stopped learner.
  static constexpr std::chrono::milliseconds kNotRunningSlack{250};
  // A stretch this long is a stopped learner: every worker counts as heard when it wakes.
  static constexpr std::chrono::seconds kStoppedAtLeast{1};
  // Admitted workers not heard from for more than `seconds` of the learner's listening, up to `now` (or up to
  // the I/O thread's latest turn, when that is earlier).
  std::vector<std::string> SilentFor(double seconds, Clock::time_point now) const;
  std::size_t size() const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, Clock::time_point> last_heard_;  // GUARDED_BY(mu_)
  std::optional<Clock::time_point> last_listening_;                // GUARDED_BY(mu_); none before the first turn
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
