// SignalWatcher: turns SIGINT, SIGTERM and SIGHUP (a closed terminal or ssh
// session) into a callback on an ordinary thread, where it may lock mutexes
// and log (a signal handler may do neither). A SIGHUP ignored when the watcher
// is made (`nohup`) stays ignored.
// The handler only writes the signal number to a pipe that the watcher
// thread reads, so it works whichever thread the kernel delivers the signal
// to (libraries such as OpenBLAS start threads before main).
//
// Any further signal of these at least kForceAfter after the first one ends
// the process as that signal does by default, without the callback: a second
// Ctrl-C gets out of a shutdown that is stuck. (One sooner is passed on: a
// launcher's SIGTERM right after the terminal's SIGINT must not cut the final
// checkpoint short.)
//
// Threading: one watcher per process; the callback runs on the watcher's own
// thread, once per signal received.
#pragma once

#include <chrono>
#include <functional>
#include <thread>

namespace farm {

class SignalWatcher {
 public:
  static constexpr std::chrono::milliseconds kForceAfter{2000};

  explicit SignalWatcher(std::function<void(int signal)> on_signal);
  ~SignalWatcher();  // restores the default handlers, wakes and joins the watcher thread
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

 private:
  std::function<void(int)> on_signal_;
  bool watch_hangup_ = false;  // SIGHUP was not ignored at construction
  int pipe_[2] = {-1, -1};
  std::thread thread_;
};

}  // namespace farm
