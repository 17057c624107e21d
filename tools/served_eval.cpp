// farm-eval's path for a Python env's run, and for a run with several policies: the serving learners and one worker
// as child processes (tools/served_eval.h).
#include "tools/served_eval.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/files.h"

namespace farm {
namespace {

using Clock = std::chrono::steady_clock;

// The last lines of a child's log, for an error message.
std::string LogTail(const std::string& path, int lines = 15) {
  std::ifstream in(path);
  std::vector<std::string> all;
  for (std::string line; std::getline(in, line);) all.push_back(line);
  std::string out;
  for (std::size_t i = all.size() > static_cast<std::size_t>(lines) ? all.size() - lines : 0; i < all.size(); ++i)
    out += "\n  | " + all[i];
  return out.empty() ? fmt::format(" ({} is empty)", path) : fmt::format(" (the end of {}):{}", path, out);
}

// A child process: argv[0] executed with stdout and stderr to `log`, the signals in `unblock` unblocked (the
// caller blocks them for its signalfd; a child must not inherit that), and PR_SET_PDEATHSIG SIGTERM, so that it dies with this process (a learner then still
// stops in order). Killed (SIGKILL) and reaped on destruction when it is still running.
class Child {
 public:
  static Status Start(std::string what, const std::vector<std::string>& argv, const std::string& log,
                      const sigset_t& unblock, std::unique_ptr<Child>* out) {
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (log_fd < 0) return Status::IoError(fmt::format("{}: cannot open for writing: {}", log, std::strerror(errno)));
    int exec_pipe[2];  // the child writes errno here when exec fails; closed by a successful exec
    if (::pipe2(exec_pipe, O_CLOEXEC) != 0) {
      ::close(log_fd);
      return Status::IoError(fmt::format("pipe: {}", std::strerror(errno)));
    }
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) {
      const int err = errno;
      ::close(log_fd);
      ::close(exec_pipe[0]);
      ::close(exec_pipe[1]);
      return Status::IoError(fmt::format("cannot start {}: fork: {}", what, std::strerror(err)));
    }
    if (pid == 0) {  // only async-signal-safe calls from here to exec
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) ::_exit(127);  // farm-eval died before prctl took effect
      ::dup2(log_fd, STDOUT_FILENO);
      ::dup2(log_fd, STDERR_FILENO);
      ::sigprocmask(SIG_UNBLOCK, &unblock, nullptr);
      ::execv(args[0], args.data());
      const int err = errno;
      (void)!::write(exec_pipe[1], &err, sizeof err);
      ::_exit(127);
    }
    ::close(log_fd);
    ::close(exec_pipe[1]);
    int err = 0;
    ssize_t n;
    do n = ::read(exec_pipe[0], &err, sizeof err);
    while (n < 0 && errno == EINTR);
    ::close(exec_pipe[0]);
    std::unique_ptr<Child> child(new Child(std::move(what), pid, log));
    if (n > 0) {
      child->Reap(/*block=*/true);
      return Status::IoError(fmt::format("cannot start {}: {}: {}", child->what_, argv[0], std::strerror(err)));
    }
    *out = std::move(child);
    return Status::Ok();
  }

  ~Child() {
    if (!exited_) {
      ::kill(pid_, SIGKILL);
      Reap(/*block=*/true);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  // True once it has exited (reaped here; `block`: waits for it).
  bool Reap(bool block = false) {
    if (exited_) return true;
    pid_t r;
    do r = ::waitpid(pid_, &status_, block ? 0 : WNOHANG);
    while (r < 0 && errno == EINTR);
    if (r == pid_ || (r < 0 && errno == ECHILD)) exited_ = true;
    return exited_;
  }
  void Signal(int sig) {
    if (!exited_) ::kill(pid_, sig);
  }
  bool ok() const { return exited_ && WIFEXITED(status_) && WEXITSTATUS(status_) == 0; }
  // "farm-learner exited with status 2", with its log's last lines.
  std::string Describe() const {
    const std::string how = !exited_              ? "is still running"
                            : WIFEXITED(status_)  ? fmt::format("exited with status {}", WEXITSTATUS(status_))
                            : WIFSIGNALED(status_) ? fmt::format("was killed by signal {}", WTERMSIG(status_))
                                                   : "ended";
    return fmt::format("{} (pid {}) {}{}", what_, pid_, how, LogTail(log_));
  }

 private:
  Child(std::string what, pid_t pid, std::string log) : what_(std::move(what)), pid_(pid), log_(std::move(log)) {}

  const std::string what_;
  const pid_t pid_;
  const std::string log_;
  bool exited_ = false;
  int status_ = 0;
};

// SIGCHLD, SIGINT, SIGTERM and SIGHUP blocked in this thread and read from a signalfd, and the temporary
// directory watched with inotify; both restored and closed on destruction.
class Events {
 public:
  Status Open(const std::string& watch_dir) {
    mask_ = ServedEvalSignals();
    if (::pthread_sigmask(SIG_BLOCK, &mask_, &old_mask_) != 0) return Status::Internal("pthread_sigmask failed");
    blocked_ = true;
    sfd_ = ::signalfd(-1, &mask_, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd_ < 0) return Status::IoError(fmt::format("signalfd: {}", std::strerror(errno)));
    ifd_ = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    if (ifd_ < 0 || ::inotify_add_watch(ifd_, watch_dir.c_str(), IN_MOVED_TO | IN_CLOSE_WRITE) < 0)
      return Status::IoError(fmt::format("inotify on {}: {}", watch_dir, std::strerror(errno)));
    return Status::Ok();
  }
  ~Events() {
    if (sfd_ >= 0) ::close(sfd_);
    if (ifd_ >= 0) ::close(ifd_);
    if (blocked_) {
      // A termination signal that arrived after the last Wait is kept pending: delivered (default action)
      // once unblocked, after the children are gone.
      ::pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
    }
  }
  const sigset_t& mask() const { return mask_; }

  struct Event {
    bool timeout = false;
    bool child = false;    // SIGCHLD: some child changed state
    int terminate = 0;     // SIGINT, SIGTERM or SIGHUP received
    bool file = false;     // a file was written or moved into the watched directory
  };
  // Waits until `deadline` for signals or files.
  Event Wait(Clock::time_point deadline) {
    Event ev;
    pollfd fds[2] = {{sfd_, POLLIN, 0}, {ifd_, POLLIN, 0}};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      ev.timeout = true;
      return ev;
    }
    const int n = ::poll(fds, 2, static_cast<int>(std::min<int64_t>(left, 60'000)));
    if (n <= 0) {
      ev.timeout = Clock::now() >= deadline;
      return ev;
    }
    signalfd_siginfo info;
    while (::read(sfd_, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
      if (info.ssi_signo == SIGCHLD) ev.child = true;
      else ev.terminate = static_cast<int>(info.ssi_signo);
    }
    alignas(inotify_event) char buf[4096];
    while (::read(ifd_, buf, sizeof buf) > 0) ev.file = true;
    return ev;
  }

 private:
  sigset_t mask_{};
  sigset_t old_mask_{};
  bool blocked_ = false;
  int sfd_ = -1;
  int ifd_ = -1;
};

// A private temporary directory, removed with what it holds on destruction.
class TempDir {
 public:
  Status Create() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/farm-eval.XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr)
      return Status::IoError(fmt::format("cannot create a temporary directory {}: {}", tmpl, std::strerror(errno)));
    path_ = tmpl;
    return Status::Ok();
  }
  ~TempDir() {  // not std::filesystem::remove_all: see RemoveTree (common/files.h)
    if (!path_.empty()) (void)RemoveTree(path_);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// `--set key=value` for each of `sets`.
void AddSets(const std::vector<std::string>& sets, std::vector<std::string>* argv) {
  for (const auto& kv : sets) {
    argv->push_back("--set");
    argv->push_back(kv);
  }
}

std::string SignalName(int sig) {
  return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : sig == SIGHUP ? "SIGHUP" : std::to_string(sig);
}

}  // namespace

sigset_t ServedEvalSignals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, sig);
  return set;
}

std::string SelfDir() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : exe.parent_path().string();
}

Status RunServedEval(const ServedEvalOptions& o, ServedEvalResult* result) {
  TempDir tmp;
  if (auto s = tmp.Create(); !s.ok()) return s;
  Events events;
  if (auto s = events.Open(tmp.path()); !s.ok()) return s;

  // The serving learners: the run's policy (or each policy's), no training, deterministic unless --sample; one
  // worker suffices; each stops after N counted episodes (learner.eval_episodes) or --max-steps env steps.
  struct Served {
    std::string name;  // the policy's; empty: the run's one policy
    std::string run_dir, serve_dir, endpoint_file, log, endpoint;
    std::unique_ptr<Child> child;
    bool termed = false;  // sent SIGTERM after the worker's end (several policies): its status is not a failure
    std::string what() const { return name.empty() ? "the serving learner" : "the serving learner of policy " + name; }
  };
  std::vector<Served> served;
  if (o.policies.empty()) {
    served.push_back({"", o.run_dir, tmp.path() + "/serve", tmp.path() + "/endpoint", tmp.path() + "/learner.log", "",
                      nullptr, false});
  } else {
    for (const auto& name : o.policies)
      served.push_back({name, o.run_dir + "/" + name, tmp.path() + "/serve-" + name, tmp.path() + "/endpoint-" + name,
                        tmp.path() + "/learner-" + name + ".log", "", nullptr, false});
  }
  // Whole episodes only: a run trained with env.decorrelate_episodes has it in its config.
  const std::vector<std::string> common_sets = {"seed=" + std::to_string(o.seed), "env.decorrelate_episodes=false"};
  for (auto& l : served) {
    std::vector<std::string> argv = {o.learner_bin, "--serve", l.run_dir, "--endpoint-file", l.endpoint_file};
    const std::vector<std::string> learner_sets = {"run_dir=" + l.serve_dir,
                                                   "learner.eval_episodes=" + std::to_string(o.episodes),
                                                   std::string("learner.deterministic=") + (o.sample ? "false" : "true"),
                                                   "total_env_steps=" + std::to_string(o.max_steps),
                                                   "learner.min_workers=1",
                                                   "max_wall_seconds=0",
                                                   "learner.progress_interval_s=3600",
                                                   "transport.bind=tcp://127.0.0.1:*"};
    AddSets(common_sets, &argv);
    AddSets(o.overrides, &argv);
    for (const auto& kv : o.policy_overrides)
      if (!l.name.empty() && kv.rfind(l.name + ":", 0) == 0) AddSets({kv.substr(l.name.size() + 1)}, &argv);
    AddSets(learner_sets, &argv);
    if (auto s = Child::Start("farm-learner --serve", argv, l.log, events.mask(), &l.child); !s.ok()) return s;
  }

  // Until each listens (it writes its endpoint file atomically: a rename into the watched directory).
  const auto terminated = [](int sig) {
    return Status::Closed(fmt::format("stopped by {}; the serving learner and the worker were stopped",
                                       SignalName(sig)));
  };
  const auto listen_deadline = Clock::now() + std::chrono::seconds(120);
  for (auto& l : served) {
    while (l.endpoint.empty()) {
      std::ifstream in(l.endpoint_file);
      if (in && std::getline(in, l.endpoint) && !l.endpoint.empty()) break;
      l.endpoint.clear();
      const auto ev = events.Wait(listen_deadline);
      if (ev.terminate) return terminated(ev.terminate);
      if (ev.timeout) return Status::Internal(l.what() + " did not listen within 120 s" + LogTail(l.log));
      for (auto& other : served)
        if (ev.child && other.child->Reap())
          return Status::Internal(other.what() + " stopped before listening: " + other.child->Describe());
    }
  }

  // One worker with K envs: farm-worker steps the run's C++ env, or execs the Python worker for its env.python (with
  // several policies, --learner NAME=ENDPOINT for each).
  std::string learner_arg;
  for (const auto& l : served)
    learner_arg += (learner_arg.empty() ? "" : ",") + (l.name.empty() ? l.endpoint : l.name + "=" + l.endpoint);
  std::vector<std::string> worker_argv = {o.worker_bin, "--config", o.run_dir + "/config.yaml", "--learner",
                                          learner_arg};
  std::vector<std::string> worker_sets = {"env.num_envs=" + std::to_string(o.num_envs),
                                          "env.num_groups=" + std::to_string(o.num_groups)};
  AddSets(common_sets, &worker_argv);
  AddSets(o.overrides, &worker_argv);
  AddSets(worker_sets, &worker_argv);
  std::unique_ptr<Child> worker;
  if (auto s = Child::Start("farm-worker", worker_argv, tmp.path() + "/worker.log",
                            events.mask(), &worker);
      !s.ok())
    return s;

  // Until every learner stops (N episodes, --max-steps, or a failure). The worker may end first: after a
  // learner's Stop (status 0), the learners are then finishing their summaries. With several policies each counts the
  // same episodes and stops by itself; one still running 60 s after the worker's end (it missed the last episodes)
  // is sent SIGTERM and reports what it counted, and 30 s after that it fails the evaluation. With one, a learner
  // still running 60 s after the worker's end fails it. A worker that fails (non-zero) fails the evaluation at once
  // (the learners would wait for workers that never come).
  const auto all_reaped = [&] {
    bool all = true;
    for (auto& l : served) all = l.child->Reap() && all;
    return all;
  };
  auto learner_deadline = Clock::now() + std::chrono::hours(24 * 365);
  bool termed = false;
  while (!all_reaped()) {
    const auto ev = events.Wait(learner_deadline);
    if (ev.terminate) return terminated(ev.terminate);
    if (ev.timeout) {
      if (!termed && !o.policies.empty() && worker->Reap() && worker->ok()) {
        for (auto& l : served) {
          if (l.child->Reap()) continue;
          l.child->Signal(SIGTERM);
          l.termed = true;
        }
        termed = true;
        learner_deadline = Clock::now() + std::chrono::seconds(30);
        continue;
      }
      std::string states;
      for (auto& l : served) states += l.what() + ": " + l.child->Describe() + "; ";
      return Status::Internal("the serving learners did not stop within 60 s of the worker's end: " + states +
                              worker->Describe());
    }
    if (ev.child && worker->Reap()) {
      if (!worker->ok())
        return Status::Internal("the worker stopped before the evaluation's episodes had ended: " +
                                worker->Describe());
      learner_deadline = std::min(learner_deadline, Clock::now() + std::chrono::seconds(60));
    }
  }
  // The learners have told the worker to stop: it should end within seconds.
  const auto worker_deadline = Clock::now() + std::chrono::seconds(30);
  while (!worker->Reap()) {
    const auto ev = events.Wait(worker_deadline);
    if (ev.terminate) return terminated(ev.terminate);
    if (ev.timeout) {
      worker->Signal(SIGKILL);
      worker->Reap(/*block=*/true);
      return Status::Internal("the worker did not stop within 30 s of the serving learner: " + worker->Describe());
    }
  }
  for (auto& l : served)
    if (!l.child->ok() && !l.termed) return Status::Internal(l.what() + " failed: " + l.child->Describe());
  if (!worker->ok()) return Status::Internal("the worker failed: " + worker->Describe());

  // Each learner's counted episodes, and the env's name from the first one's summary.
  for (auto& l : served) {
    ServedEvalResult::Policy p;
    p.name = l.name;
    nlohmann::json summary;
    try {
      std::ifstream in(l.serve_dir + "/summary.json");
      summary = nlohmann::json::parse(in);
      if (result->env_name.empty()) result->env_name = summary.value("env", std::string());
    } catch (const nlohmann::json::exception& e) {
      return Status::Internal(fmt::format("{}/summary.json of {}: {}", l.serve_dir, l.what(), e.what()));
    }
    std::ifstream in(l.serve_dir + "/episodes.jsonl");
    if (!in) return Status::IoError(fmt::format("{}/episodes.jsonl: cannot read it", l.serve_dir));
    int line_no = 0;
    for (std::string line; std::getline(in, line);) {
      ++line_no;
      try {
        const auto row = nlohmann::json::parse(line);
        p.returns.push_back(row.at("return").get<double>());
        p.lengths.push_back(row.at("length").get<double>());
      } catch (const nlohmann::json::exception& e) {
        return Status::InvalidArgument(fmt::format("{}/episodes.jsonl line {}: {}", l.serve_dir, line_no, e.what()));
      }
    }
    if (!l.name.empty()) result->policies.push_back(p);
    if (result->returns.empty() && result->lengths.empty()) {
      result->returns = p.returns;
      result->lengths = p.lengths;
    }
  }
  return Status::Ok();
}

}  // namespace farm
