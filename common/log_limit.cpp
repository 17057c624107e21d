#include "common/log_limit.h"

#include <fmt/format.h>

#include <iterator>

namespace farm {

LogRateLimiter::LogRateLimiter(Clock::duration interval, Now now, std::size_t max_kinds)
    : interval_(interval), now_(now ? std::move(now) : Now([] { return Clock::now(); })),
      max_kinds_(max_kinds < 1 ? 1 : max_kinds) {}

LogRateLimiter::Decision LogRateLimiter::Allow(const std::string& kind) {
  const Clock::time_point t = now_();
  std::lock_guard<std::mutex> lock(mu_);
  // Kinds beyond the limit share the last slot, so that no input can grow the table. A full table first
  // forgets the kinds that have nothing to report (their interval over, no line dropped).
  static const std::string kOther = "\x01other";
  auto it = kinds_.find(kind);
  if (it == kinds_.end()) {
    if (kinds_.size() + 1 >= max_kinds_) {
      for (auto i = kinds_.begin(); i != kinds_.end();) {
        const bool idle = i->first != kOther && i->second.suppressed == 0 && t - i->second.last >= interval_;
        i = idle ? kinds_.erase(i) : std::next(i);
      }
    }
    const bool full = kinds_.size() + 1 >= max_kinds_;
    it = full ? kinds_.find(kOther) : kinds_.end();
    if (it == kinds_.end()) {  // the first line of its kind (or of the shared slot)
      kinds_.emplace(full ? kOther : kind, State{t, 0});
      return Decision{true, 0, 0};
    }
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
