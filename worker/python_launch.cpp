#include "worker/python_launch.h"

#include "common/config_files.h"
#include "worker/policy_split.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <poll.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

extern char** environ;

namespace farm {

namespace {

// --policy NAME ENDPOINT PATTERNS for each of config.policies, from "NAME=ENDPOINT,NAME=ENDPOINT".
Status PolicyLearnerArgs(const FarmConfig& config, const std::string& endpoints, std::vector<std::string>* out) {
  std::vector<PolicyEndpoint> parsed;
  if (auto s = ParsePolicyEndpoints(config, endpoints, /*allow_empty=*/true, &parsed); !s.ok()) return s;
  out->clear();
  for (std::size_t i = 0; i < parsed.size(); ++i)
    out->insert(out->end(), {"--policy", parsed[i].name, parsed[i].endpoint,
                             fmt::format("{}", fmt::join(config.policies[i].agents, ","))});
  return Status::Ok();
}

}  // namespace

Status PythonWorkerArgv(const FarmConfig& config, int index, const std::string& learner_endpoint,
                        const std::string& stats_file, const std::vector<std::string>& search_dirs,
                        std::vector<std::string>* argv, std::string* note) {
  const EnvConfig& env = config.env;
  std::string spec = env.python;
  const auto colon = spec.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == spec.size())
    return Status::InvalidArgument(fmt::format(
        "env.python: expected MODULE:FACTORY (a module name or a path to a .py file, then the function that makes "
        "one env), got '{}'",
        spec));
  std::string module = spec.substr(0, colon);
  std::string sys_path;  // for a module name: the folder the run found it in, put first on sys.path
  if (module.size() > 3 && module.compare(module.size() - 3, 3, ".py") == 0) {
    FileQuery q;
    q.key = "env.python";
    q.path = module;
    // What the run recorded is where it found this file: not for a spec naming another one (a --set env.python).
    if (std::filesystem::path(env.python_found).filename() == std::filesystem::path(module).filename())
      q.recorded = env.python_found;
    q.also = search_dirs;
    q.hint = fmt::format("set env.python to where the file is now (--set env.python=/path/to/{}{})",
                         std::filesystem::path(module).filename().string(), spec.substr(colon));
    std::string found;
    if (auto s = FindConfigFile(config, q, &found); !s.ok()) return Status::InvalidArgument(s.message());
    spec = found + spec.substr(colon);
  } else if (!env.python_found.empty()) {
    // A module name: the recorded folder, or where it is now that the run directory has moved, when it holds the
    // module (a.b: a/b.py, a/b/__init__.py or a namespace folder a/b).
    std::string rel = module;
    std::replace(rel.begin(), rel.end(), '.', '/');
    const std::vector<std::string> places = RecordedPlaces(config, env.python_found);
    for (const std::string& dir : places) {
      std::error_code ec;
      const std::filesystem::path base = std::filesystem::path(dir) / rel;
      if (std::filesystem::is_regular_file(base.string() + ".py", ec) || std::filesystem::is_directory(base, ec)) {
        sys_path = dir;
        break;
      }
    }
    if (sys_path.empty() && note != nullptr)
      *note = fmt::format("env.python: module '{}' is not in the folder the run found it in (looked in {}); "
                          "importing it from Python's own path (set env.python_found to the folder that holds it)",
                          module, fmt::join(places, ", "));
  }
  if (env.decorrelate_episodes)
    return Status::InvalidArgument(
        "env.decorrelate_episodes: the Python worker does not cut episodes (a Python env's time limit is its own); "
        "set it false for env.python");
  if (env.python_interpreter.empty())
    return Status::InvalidArgument(
        "env.python_interpreter: no interpreter chosen (empty means automatic: ChoosePythonInterpreter's choice "
        "goes here)");
  std::vector<std::string> learner = {"--learner", learner_endpoint};
  if (!config.policies.empty()) {
    if (auto s = PolicyLearnerArgs(config, learner_endpoint, &learner); !s.ok()) return s;
  }
  std::vector<std::string> a = {env.python_interpreter, "-m", "farm_worker"};
  a.insert(a.end(), learner.begin(), learner.end());
  a.insert(a.end(), {"--env-module",
                                spec,
                                "--num-envs",
                                std::to_string(env.num_envs),
                                "--groups",
                                std::to_string(env.num_groups),
                                "--seed",
                                std::to_string(config.seed),
                                "--index",
                                std::to_string(index),
                                "--give-up-s",
                                fmt::format("{}", config.transport.worker_give_up_s),
                                "--frame-stack",
                                std::to_string(env.frame_stack)});
  if (!sys_path.empty()) a.insert(a.end(), {"--sys-path", sys_path});
  if (env.normalize_obs || env.normalize_reward) {
    if (env.normalize_obs) a.push_back("--normalize-obs");
    if (env.normalize_reward) a.push_back("--normalize-reward");
    a.insert(a.end(), {"--obs-clip", fmt::format("{}", env.obs_clip), "--reward-clip",
                       fmt::format("{}", env.reward_clip), "--gamma", fmt::format("{}", config.ppo.gamma),
                       "--rollout-length", std::to_string(config.ppo.rollout_length)});
  }
  if (config.transport.curve) {
    const auto& t = config.transport;
    if (t.curve_worker_secret_key_file.empty() || t.curve_learner_public_key_file.empty())
      return Status::InvalidArgument(
          "transport.curve: a worker needs transport.curve_worker_secret_key_file and "
          "transport.curve_learner_public_key_file");
    a.insert(a.end(), {"--curve-worker-secret-key-file", t.curve_worker_secret_key_file,
                       "--curve-learner-public-key-file", t.curve_learner_public_key_file});
  }
  if (!stats_file.empty()) a.insert(a.end(), {"--stats-file", stats_file});
  *argv = std::move(a);
  return Status::Ok();
}

std::string PythonWorkerPythonPath(const std::string& package_dir) {
  const char* old = std::getenv("PYTHONPATH");
  const std::string rest = old ? old : "";
  std::error_code ec;
  if (package_dir.empty() || !std::filesystem::is_directory(package_dir + "/farm_worker", ec)) return rest;
  return rest.empty() ? package_dir : package_dir + ":" + rest;
}

Status ExecPythonWorker(const std::vector<std::string>& argv, const std::string& package_dir) {
  // The same value the probe ran with (ChoosePythonInterpreter's search.python_path).
  const std::string path = PythonWorkerPythonPath(package_dir);
  if (path.empty())
    unsetenv("PYTHONPATH");
  else
    setenv("PYTHONPATH", path.c_str(), 1);
  std::vector<char*> args;
  for (const auto& s : argv) args.push_back(const_cast<char*>(s.c_str()));
  args.push_back(nullptr);
  execvp(args[0], args.data());
  return Status::InvalidArgument(
      fmt::format("env.python_interpreter: cannot run '{}': {}", argv[0], std::strerror(errno)));
}

std::string CheckoutPythonPackageDir() { return FARM_PYTHON_PACKAGE_DIR; }

const std::vector<std::string>& PythonWorkerModules() {
  static const std::vector<std::string> modules = {"zmq", "google.protobuf", "numpy"};
  return modules;
}

std::string SystemPythonPath() {
  const char* p = std::getenv("FARM_SYSTEM_PYTHON");
  return p && *p ? p : "/usr/bin/python3";
}

namespace {

// The probe: one "key<TAB>value" line per fact, "done" last (so that an interpreter that exits half-way is told
// from one that answered). Any exception from an import counts as missing, not just ImportError: a broken numpy
// raises others.
constexpr const char* kProbeScript =
    "import sys\n"
    "print('executable\\t' + str(sys.executable))\n"
    "print('version\\t' + sys.version.split()[0])\n"
    "for m in sys.argv[1:]:\n"
    "    try:\n"
    "        __import__(m)\n"
    "    except Exception as e:\n"
    "        r = (str(e) or type(e).__name__).replace('\\n', ' ').replace('\\t', ' ')\n"
    "        print('missing\\t' + m + '\\t' + r)\n"
    "print('done')\n"
    "sys.stdout.flush()\n";

constexpr size_t kMaxProbeOutput = 64 * 1024;

// `name` looked up as execvp would (on PATH unless it holds a '/'). Empty, with *why, when there is no such
// executable file.
std::string FindExecutable(const std::string& name, std::string* why) {
  namespace fs = std::filesystem;
  std::error_code ec;
  auto executable = [&](const fs::path& p) { return fs::is_regular_file(p, ec) && access(p.c_str(), X_OK) == 0; };
  if (name.empty()) {
    *why = "no interpreter named";
    return "";
  }
  if (name.find('/') != std::string::npos) {
    const fs::path p = fs::absolute(fs::path(name), ec).lexically_normal();
    if (!fs::exists(p, ec)) {
      *why = "no such file";
      return "";
    }
    if (!executable(p)) {
      *why = fs::is_directory(p, ec) ? "is a directory" : "is not an executable file";
      return "";
    }
    return p.string();
  }
  const char* env_path = std::getenv("PATH");
  std::stringstream dirs(env_path ? env_path : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const fs::path p = fs::absolute(fs::path(dir.empty() ? "." : dir) / name, ec).lexically_normal();
    if (executable(p)) return p.string();
  }
  *why = fmt::format("not found on PATH ({})", env_path ? env_path : "unset");
  return "";
}

// `path`'s canonical form, or `path` when it has none.
std::string Canonical(const std::string& path) {
  std::error_code ec;
  const auto c = std::filesystem::canonical(path, ec);
  return ec ? path : c.string();
}

// This process's environment with PYTHONPATH replaced by `python_path` (removed when empty).
std::vector<std::string> ProbeEnvironment(const std::string& python_path) {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e)
    if (std::strncmp(*e, "PYTHONPATH=", 11) != 0) env.emplace_back(*e);
  if (!python_path.empty()) env.push_back("PYTHONPATH=" + python_path);
  return env;
}

std::vector<char*> CStrings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (auto& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// The last non-empty line of `text`, at most 300 characters.
std::string LastLine(const std::string& text) {
  std::string last;
  std::stringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  return last.size() > 300 ? last.substr(0, 300) + "..." : last;
}

}  // namespace

std::string PythonProbe::Describe() const {
  std::string d;
  if (interpreter.find('/') == std::string::npos)
    d = path.empty() ? interpreter : fmt::format("{} on PATH = {}", interpreter, path);
  else
    d = path.empty() ? interpreter : path;
  std::vector<std::string> facts;
  if (!executable.empty() && Canonical(executable) != Canonical(path.empty() ? interpreter : path))
    facts.push_back("runs " + executable);
  if (!version.empty()) facts.push_back("Python " + version);
  if (!facts.empty()) d += fmt::format(" ({})", fmt::join(facts, ", "));
  return d;
}

std::string PythonProbe::Problem() const {
  if (!error.empty()) return "cannot be run: " + error;
  std::vector<std::string> m;
  for (const auto& x : missing) m.push_back(fmt::format("{} ({})", x.module, x.reason));
  return m.empty() ? "has every module" : "lacks " + fmt::format("{}", fmt::join(m, ", "));
}

PythonProbe ProbePythonInterpreter(const std::string& interpreter, const std::vector<std::string>& modules,
                                   const std::string& python_path, double timeout_s) {
  PythonProbe probe;
  probe.interpreter = interpreter;
  std::string why;
  probe.path = FindExecutable(interpreter, &why);
  if (probe.path.empty()) {
    probe.error = why;
    return probe;
  }
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    probe.error = fmt::format("pipe: {}", std::strerror(errno));
    return probe;
  }
  // Child: stdin /dev/null, stdout and stderr the pipe (dup2 clears O_CLOEXEC on the copies).
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  std::vector<std::string> args = {probe.path, "-c", kProbeScript};
  args.insert(args.end(), modules.begin(), modules.end());
  std::vector<std::string> env = ProbeEnvironment(python_path);
  std::vector<char*> argv = CStrings(args), envp = CStrings(env);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, probe.path.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    probe.error = fmt::format("cannot start {}: {}", probe.path, std::strerror(rc));
    return probe;
  }
  // Read to EOF or the deadline, whichever comes first.
  std::string out;
  bool timed_out = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  char buf[4096];
  while (true) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd pfd{fds[0], POLLIN, 0};
    const int ready = poll(&pfd, 1, static_cast<int>(std::min<long long>(left.count(), 1 << 30)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) {
      probe.error = fmt::format("poll: {}", std::strerror(errno));
      break;
    }
    if (ready == 0) continue;  // the deadline is checked at the top
    const ssize_t n = read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      probe.error = fmt::format("read: {}", std::strerror(errno));
      break;
    }
    if (n == 0) break;  // EOF: every writer closed
    if (out.size() < kMaxProbeOutput) out.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  if (timed_out || !probe.error.empty()) kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    probe.error = fmt::format("did not answer within {} s (killed)", timeout_s);
    return probe;
  }
  if (!probe.error.empty()) return probe;
  bool done = false;
  std::stringstream in(out);
  for (std::string line; std::getline(in, line);) {
    const auto tab = line.find('\t');
    const std::string key = line.substr(0, tab);
    const std::string value = tab == std::string::npos ? "" : line.substr(tab + 1);
    if (key == "executable") {
      probe.executable = value;
    } else if (key == "version") {
      probe.version = value;
    } else if (key == "missing") {
      const auto t = value.find('\t');
      probe.missing.push_back({value.substr(0, t), t == std::string::npos ? "" : value.substr(t + 1)});
    } else if (line == "done") {
      done = true;
    }
  }
  if (!done) {
    const std::string last = LastLine(out);
    const std::string how = WIFSIGNALED(status) ? fmt::format("was killed by signal {}", WTERMSIG(status))
                                                : fmt::format("exited with status {}", WEXITSTATUS(status));
    probe.error = fmt::format("{} without answering the probe (is it a Python interpreter?){}", how,
                              last.empty() ? "" : ": " + last);
    probe.missing.clear();
  }
  return probe;
}

PythonSearch PythonSearch::FromEnvironment(const std::string& configured) {
  PythonSearch s;
  s.configured = configured;
  s.candidates = {"python3", SystemPythonPath()};
  s.python_path = PythonWorkerPythonPath(CheckoutPythonPackageDir());
  return s;
}

namespace {

// Debian's package and pip's distribution of a module the worker imports.
std::string DebianPackage(const std::string& module) {
  if (module == "zmq") return "python3-zmq";
  if (module == "google.protobuf") return "python3-protobuf";
  return "python3-" + module;
}
std::string PipName(const std::string& module) {
  if (module == "zmq") return "pyzmq";
  if (module == "google.protobuf") return "protobuf";
  return module;
}

// Debian's interpreters are /usr/bin's (a wrapper that runs one counts): their modules come from apt, and pip
// refuses to install into them.
bool IsDebianInterpreter(const PythonProbe& p) {
  for (const std::string& f : {p.path, p.executable})
    if (!f.empty() && (f.rfind("/usr/bin/", 0) == 0 || Canonical(f).rfind("/usr/bin/", 0) == 0)) return true;
  return false;
}

std::string FailureMessage(const PythonSearch& search, const std::vector<PythonProbe>& tried) {
  std::string m;
  const std::string needs = fmt::format("{}", fmt::join(search.modules, ", "));
  if (!search.configured.empty())
    m = fmt::format(
        "python: env.python_interpreter '{}' cannot run the Python worker (env.python), which imports {}:\n",
        search.configured, needs);
  else
    m = fmt::format(
        "python: no Python interpreter here can run the Python worker (env.python), which imports {}; tried:\n", needs);
  for (const auto& p : tried) m += fmt::format("  {}: {}\n", p.Describe(), p.Problem());
  m += "Fix it with either:\n";
  m += "  - an interpreter that has them: env.python_interpreter: /path/to/python in the config, or\n"
       "    --set env.python_interpreter=/path/to/python on the command line\n";
  std::vector<std::string> installs;
  for (const auto& p : tried) {
    if (!p.error.empty() || p.missing.empty()) continue;
    std::vector<std::string> pkgs;
    if (IsDebianInterpreter(p)) {
      for (const auto& x : p.missing) pkgs.push_back(DebianPackage(x.module));
      installs.push_back(fmt::format("sudo apt-get install -y {}   (for {})", fmt::join(pkgs, " "), p.path));
    } else {
      for (const auto& x : p.missing) pkgs.push_back(PipName(x.module));
      // pip of the interpreter that runs (a pyenv shim's real one).
      const std::string python = p.executable.empty() ? p.path : p.executable;
      installs.push_back(fmt::format("{} -m pip install {}   (for {})", python, fmt::join(pkgs, " "), p.path));
    }
  }
  if (installs.empty()) {
    m += "  - or Debian's interpreter with its packages: sudo apt-get install -y python3 python3-zmq "
         "python3-protobuf python3-numpy\n";
  } else {
    m += "  - or install what is missing: " + installs[0] + "\n";
    for (size_t i = 1; i < installs.size(); ++i) m += "    or: " + installs[i] + "\n";
  }
  m.pop_back();  // the last newline: the caller ends the line
  return m;
}

}  // namespace

Status ChoosePythonInterpreter(const PythonSearch& search, PythonChoice* choice) {
  choice->tried.clear();
  choice->interpreter.clear();
  choice->note.clear();
  if (!search.configured.empty()) {
    PythonProbe p = ProbePythonInterpreter(search.configured, search.modules, search.python_path, search.timeout_s);
    choice->tried.push_back(p);
    if (!p.usable()) return Status::InvalidArgument(FailureMessage(search, choice->tried));
    choice->interpreter = search.configured;
    choice->note = fmt::format("python: using {} (env.python_interpreter{})", p.path,
                               p.version.empty() ? "" : ", Python " + p.version);
    return Status::Ok();
  }
  for (const auto& c : search.candidates) {
    PythonProbe p = ProbePythonInterpreter(c, search.modules, search.python_path, search.timeout_s);
    choice->tried.push_back(p);
    if (!p.usable()) continue;
    // "python: using /usr/bin/python3 (Python 3.11.2; python3 on PATH = /x/bin/python3 lacks numpy)"
    std::vector<std::string> parts;
    if (choice->tried.size() == 1 && c.find('/') == std::string::npos) parts.push_back(c + " on PATH");
    if (!p.version.empty()) parts.push_back("Python " + p.version);
    for (size_t i = 0; i + 1 < choice->tried.size(); ++i) {
      const PythonProbe& s = choice->tried[i];
      std::vector<std::string> names;
      for (const auto& x : s.missing) names.push_back(x.module);
      parts.push_back(s.error.empty() ? fmt::format("{} lacks {}", s.Describe(), fmt::join(names, ", "))
                                      : fmt::format("{} cannot be run: {}", s.Describe(), s.error));
    }
    choice->interpreter = p.path;
    choice->note = fmt::format("python: using {} ({})", p.path, fmt::join(parts, "; "));
    return Status::Ok();
  }
  return Status::InvalidArgument(FailureMessage(search, choice->tried));
}

}  // namespace farm
