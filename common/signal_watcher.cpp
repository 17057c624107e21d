// sigwait-based signal handling.
#include "common/signal_watcher.h"

#include <pthread.h>

namespace farm {

SignalWatcher::SignalWatcher(std::function<void(int)> on_signal) : on_signal_(std::move(on_signal)) {
  sigemptyset(&set_);
  sigaddset(&set_, SIGINT);
  sigaddset(&set_, SIGTERM);
  sigaddset(&set_, SIGUSR1);  // private wake-up for the destructor
  pthread_sigmask(SIG_BLOCK, &set_, nullptr);
  thread_ = std::thread([this] {
    while (true) {
      int sig = 0;
      if (sigwait(&set_, &sig) != 0) continue;
      if (sig == SIGUSR1) return;
      on_signal_(sig);
    }
  });
}

SignalWatcher::~SignalWatcher() {
  pthread_kill(thread_.native_handle(), SIGUSR1);
  thread_.join();
}

}  // namespace farm
