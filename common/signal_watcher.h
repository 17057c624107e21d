// SignalWatcher: turns SIGINT/SIGTERM into a callback on an ordinary thread,
// where it may lock mutexes and log (a signal handler may do neither).
// Construct it before starting other threads: it blocks the signals in the
// constructing thread, and threads started afterwards inherit the mask.
//
// Threading: the callback runs on the watcher's own thread, at most once per signal.
#pragma once

#include <csignal>
#include <functional>
#include <thread>

namespace farm {

class SignalWatcher {
 public:
  explicit SignalWatcher(std::function<void(int signal)> on_signal);
  ~SignalWatcher();  // wakes and joins the watcher thread
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

 private:
  std::function<void(int)> on_signal_;
  sigset_t set_;
  std::thread thread_;
};

}  // namespace farm
