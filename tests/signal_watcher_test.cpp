// common/signal_watcher.h: signals become callbacks; a late repeat ends the process.
// Each case runs in a forked child, whose exit status says what happened.
#include "common/signal_watcher.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>
#include <thread>

using farm::SignalWatcher;

namespace {

// Runs body() in a child process and returns its wait status.
template <class F>
int InChild(F body) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    body();
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return status;
}

void SleepFor(std::chrono::milliseconds d) { std::this_thread::sleep_for(d); }

}  // namespace

TEST_CASE("each signal reaches the callback, a quick repeat does not end the process", "[signal]") {
  const int status = InChild([] {
    std::atomic<int> seen{0};
    {
      SignalWatcher watcher([&](int) { seen.fetch_add(1); });
      std::raise(SIGINT);
      SleepFor(std::chrono::milliseconds(100));
      std::raise(SIGTERM);  // as a launcher forwarding the terminal's Ctrl-C
      SleepFor(std::chrono::milliseconds(300));
    }
    ::_exit(seen.load() == 2 ? 7 : 8);
  });
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 7);
}

TEST_CASE("a repeat well after the first signal ends a process whose stop is stuck", "[signal]") {
  const int status = InChild([] {
    std::atomic<int> seen{0};
    SignalWatcher watcher([&](int) { seen.fetch_add(1); });  // a shutdown that never finishes
    std::raise(SIGINT);
    // kForceAfter counts from when the watcher took the first signal, which a busy machine may delay.
    for (int i = 0; seen.load() == 0; ++i) {
      if (i == 1000) ::_exit(10);  // not taken within 10 s
      SleepFor(std::chrono::milliseconds(10));
    }
    SleepFor(SignalWatcher::kForceAfter + std::chrono::milliseconds(300));
    std::raise(SIGINT);
    SleepFor(std::chrono::milliseconds(3000));
    ::_exit(9);  // still alive: the repeat did nothing
  });
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGINT);
}

TEST_CASE("a hang-up stops like SIGTERM, unless SIGHUP was ignored (nohup)", "[signal]") {
  const int status = InChild([] {
    std::signal(SIGHUP, SIG_DFL);  // as in a terminal, even when the tests run under nohup
    std::atomic<int> seen{0};
    {
      SignalWatcher watcher([&](int sig) { seen.store(sig); });
      std::raise(SIGHUP);  // a process without the watcher would end here
      for (int i = 0; seen.load() == 0 && i < 1000; ++i) SleepFor(std::chrono::milliseconds(10));
    }
    ::_exit(seen.load() == SIGHUP ? 7 : 8);
  });
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 7);

  const int ignored = InChild([] {
    std::signal(SIGHUP, SIG_IGN);
    {
      SignalWatcher watcher([](int) { ::_exit(8); });
      struct sigaction now {};
      sigaction(SIGHUP, nullptr, &now);
      if (now.sa_handler != SIG_IGN) ::_exit(9);
    }
    struct sigaction after {};
    sigaction(SIGHUP, nullptr, &after);
    ::_exit(after.sa_handler == SIG_IGN ? 7 : 10);  // still ignored once the watcher is gone
  });
  REQUIRE(WIFEXITED(ignored));
  CHECK(WEXITSTATUS(ignored) == 7);
}
