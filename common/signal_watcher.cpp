// Self-pipe signal handling.
#include "common/signal_watcher.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <optional>
#include <stdexcept>

namespace farm {
namespace {

int g_write_fd = -1;  // the pipe's write end while a watcher exists

extern "C" void OnSignal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  if (g_write_fd >= 0) (void)!::write(g_write_fd, &b, 1);  // async-signal-safe
  errno = saved;
}

}  // namespace

SignalWatcher::SignalWatcher(std::function<void(int)> on_signal) : on_signal_(std::move(on_signal)) {
  if (::pipe2(pipe_, O_CLOEXEC) != 0) throw std::runtime_error("SignalWatcher: pipe2 failed");
  g_write_fd = pipe_[1];
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  struct sigaction hup {};
  sigaction(SIGHUP, nullptr, &hup);
  watch_hangup_ = hup.sa_handler != SIG_IGN;  // under nohup, a hang-up is not a reason to stop
  if (watch_hangup_) sigaction(SIGHUP, &sa, nullptr);
  thread_ = std::thread([this] {
    using Clock = std::chrono::steady_clock;
    std::optional<Clock::time_point> first;
    while (true) {
      unsigned char b = 0;
      const ssize_t n = ::read(pipe_[0], &b, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0 || b == 0) return;  // 0: the destructor's wake-up
      const auto now = Clock::now();
      if (first && now - *first >= kForceAfter) {
        // The graceful stop asked for by the first signal has not ended the process: end it now.
        std::signal(b, SIG_DFL);
        std::raise(b);
      }
      if (!first) first = now;
      on_signal_(b);
    }
  });
}

SignalWatcher::~SignalWatcher() {
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  if (watch_hangup_) signal(SIGHUP, SIG_DFL);
  g_write_fd = -1;
  const unsigned char quit = 0;
  (void)!::write(pipe_[1], &quit, 1);
  thread_.join();
  ::close(pipe_[0]);
  ::close(pipe_[1]);
}

}  // namespace farm
