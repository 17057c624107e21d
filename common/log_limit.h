// Rate limiting for log lines that input from outside the process can trigger
// at any rate: a hostile or broken client can send bad messages as fast as
// the network allows, and one log line per message would flood the log.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>

namespace farm {

// How often a line of one kind may be written (as the learner's non-finite warnings).
constexpr std::chrono::seconds kLogRateInterval{10};

// At most one line per interval per kind; the lines dropped in between are
// counted and reported with the next line written. The clock is injectable,
// so that tests need no sleeps. Thread-safe.
class LogRateLimiter {
 public:
  using Clock = std::chrono::steady_clock;
  using Now = std::function<Clock::time_point()>;

  // `now` defaults to Clock::now. At most `max_kinds` kinds are tracked (a kind
  // is a key the caller chooses, such as a source location); lines of further
  // kinds share one, so that no input can grow the table without bound (a full
  // table first forgets the kinds whose interval is over with nothing dropped).
  explicit LogRateLimiter(Clock::duration interval = kLogRateInterval, Now now = {}, std::size_t max_kinds = 256);

  struct Decision {
    bool log = false;        // write this line
    int64_t suppressed = 0;  // when log: lines of this kind dropped since the last one written
    double since_s = 0;      // when log and suppressed > 0: seconds since that line
  };

  // Counts one line of `kind` and says whether to write it.
  Decision Allow(const std::string& kind);

  // What to append to a written line: "" when nothing was dropped, else
  // " (N more like it in the last S s not logged)".
  static std::string Suffix(const Decision& d);

 private:
  struct State {
    Clock::time_point last;  // when the last line of this kind was written
    int64_t suppressed = 0;
  };
  Clock::duration interval_;
  Now now_;
  std::size_t max_kinds_;
  std::mutex mu_;
  std::unordered_map<std::string, State> kinds_;
};

}  // namespace farm
