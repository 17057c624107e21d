// Who was heard from when, and what a thread is busy with.
#include "learner/serve/liveness.h"

#include <algorithm>

namespace farm {

void Liveness::Admit(const std::string& identity, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  last_heard_[identity] = now;
}

void Liveness::Forget(const std::string& identity) {
  std::lock_guard<std::mutex> lock(mu_);
  last_heard_.erase(identity);
}

bool Liveness::Heard(const std::string& identity, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = last_heard_.find(identity);
  if (it == last_heard_.end()) return false;
  if (now > it->second) it->second = now;
  return true;
}

double Liveness::Listening(Clock::time_point waited_from, Clock::duration wait, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  Clock::duration lost = std::max(Clock::duration::zero(), now - waited_from - wait);
  if (last_listening_) lost += std::max(Clock::duration::zero(), waited_from - *last_listening_);
  if (!last_listening_ || now > *last_listening_) last_listening_ = now;
  if (lost <= kNotRunningSlack) return 0;
  const bool stopped = lost >= kStoppedAtLeast;
  for (auto& [identity, heard] : last_heard_) heard = stopped ? now : std::min(now, heard + lost);
  return std::chrono::duration<double>(lost).count();
}

std::vector<std::string> Liveness::SilentFor(double seconds, Clock::time_point now) const {
  std::vector<std::string> out;
  std::lock_guard<std::mutex> lock(mu_);
  if (last_listening_ && *last_listening_ < now) now = *last_listening_;
  for (const auto& [identity, heard] : last_heard_)
    if (std::chrono::duration<double>(now - heard).count() > seconds) out.push_back(identity);
  return out;
}

std::size_t Liveness::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_heard_.size();
}

void ThreadActivity::Begin(const char* what, Clock::time_point now) {
  since_ns_.store(std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count(),
                  std::memory_order_relaxed);
  what_.store(what, std::memory_order_release);
}

void ThreadActivity::End() { what_.store(nullptr, std::memory_order_release); }

std::optional<ThreadActivity::Busy> ThreadActivity::BusyAt(Clock::time_point now) const {
  const char* what = what_.load(std::memory_order_acquire);
  if (what == nullptr) return std::nullopt;
  const Clock::time_point since{std::chrono::nanoseconds(since_ns_.load(std::memory_order_relaxed))};
  return Busy{what, std::chrono::duration<double>(now - since).count()};
}

}  // namespace farm
