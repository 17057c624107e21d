#include "common/log_limit.h"

#include <fmt/format.h>

namespace farm {

LogRateLimiter::LogRateLimiter(Clock::duration interval, Now now, std::size_t max_kinds)
    : interval_(interval), now_(now ? std::move(now) : Now([] { return Clock::now(); })),
      max_kinds_(max_kinds < 1 ? 1 : max_kinds) {}

LogRateLimiter::Decision LogRateLimiter::Allow(const std::string& kind) {
  const Clock::time_point t = now_();
  std::lock_guard<std::mutex> lock(mu_);
  // Kinds beyond the limit share the last slot, so that no input can grow the table.
  static const std::string kOther = "\x01other";
  const bool full = kinds_.size() + 1 >= max_kinds_;
  auto it = kinds_.find(kind);
  if (it == kinds_.end() && full) it = kinds_.find(kOther);
  if (it == kinds_.end()) {  // the first line of its kind
    kinds_.emplace(full ? kOther : kind, State{t, 0});
    return Decision{true, 0, 0};
  }
  State& s = it->second;
  if (t - s.last < interval_) {
    ++s.suppressed;
    return Decision{};
  }
  Decision d{true, s.suppressed, std::chrono::duration<double>(t - s.last).count()};
  s.last = t;
  s.suppressed = 0;
  return d;
}

std::string LogRateLimiter::Suffix(const Decision& d) {
  if (d.suppressed == 0) return "";
  return fmt::format(" ({} more like it in the last {:.0f} s not logged)", d.suppressed, d.since_s);
}

}  // namespace farm
