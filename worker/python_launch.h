// farm-worker for a config with env.python: the command line of the Python worker (worker/python, module
// farm_worker) that runs in its place, with the config's settings (envs, groups, seed, normalisation, frame
// stacking, CURVE keys, give-up time), so that scripts/farm, its cluster mode and docker-compose start Python
// workers exactly as they start farm-worker; and the choice of the interpreter that runs it (env.python_interpreter,
// empty: the first of python3 on PATH and Debian's /usr/bin/python3 that can import what the worker needs).
//
// Threading: free functions, no state of their own; ChoosePythonInterpreter and ProbePythonInterpreter start and
// reap a child process (they read PATH, PYTHONPATH and FARM_SYSTEM_PYTHON, and must not race a setenv).
#pragma once

#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"

namespace farm {

// argv for execvp (argv[0] is env.python_interpreter, which must be set: ChoosePythonInterpreter's choice).
// With config.policies, `learner_endpoint` is "NAME=ENDPOINT,NAME=ENDPOINT", one per policy, and the worker gets
// --policy NAME ENDPOINT PATTERNS for each; InvalidArgument naming a policy without an endpoint or an unknown one.
// InvalidArgument naming env.python when it is not MODULE:FACTORY, or when a .py file it names is not found. A .py
// path is looked for where the run found it (env.python_found, and where that is now if the run directory moved),
// then, relative, in the current directory, beside the config file and in each of `search_dirs` in order
// (farm-worker passes the checkout this binary was built from), and made absolute (common/config_files.h). A module
// name with env.python_found: that folder, or where it is now, goes first on the worker's sys.path (--sys-path);
// when the module is not there, `note` (if given) says so and Python's own path is left to find it.
Status PythonWorkerArgv(const FarmConfig& config, int index, const std::string& learner_endpoint,
                        const std::string& stats_file, const std::vector<std::string>& search_dirs,
                        std::vector<std::string>* argv, std::string* note = nullptr);

// Replaces this process with the Python worker (PYTHONPATH gets `package_dir` first, when it exists, so that a
// checkout's package is found without pip install). Returns only on failure, with the reason.
Status ExecPythonWorker(const std::vector<std::string>& argv, const std::string& package_dir);

// worker/python of the source tree this binary was built from.
std::string CheckoutPythonPackageDir();

// The PYTHONPATH the Python worker gets: `package_dir` first when it holds farm_worker, then the PYTHONPATH of
// this process (empty: none). ExecPythonWorker sets it; the probe runs with it.
std::string PythonWorkerPythonPath(const std::string& package_dir);

// The modules the Python worker (worker/python/farm_worker) imports: zmq (the transport), google.protobuf (the
// messages) and numpy (multi-agent envs, vectorised envs and the numpy groups; the examples' envs).
const std::vector<std::string>& PythonWorkerModules();

// The Debian interpreter the automatic choice falls back to: $FARM_SYSTEM_PYTHON when set (for tests), else
// /usr/bin/python3.
std::string SystemPythonPath();

// What one interpreter was found to be.
struct PythonProbe {
  std::string interpreter;  // as named: "python3", "/opt/venv/bin/python"
  std::string path;         // the file run: `interpreter` looked up on PATH; empty when not found
  std::string executable;   // its sys.executable (a pyenv shim's real interpreter); empty when it did not answer
  std::string version;      // its Python version, e.g. "3.11.2"
  std::string error;        // why it could not be asked (not found, not executable, timed out, exit status)
  struct Missing {
    std::string module;  // "numpy"
    std::string reason;  // its import error: "No module named 'numpy'"
  };
  std::vector<Missing> missing;  // each module it could not import

  bool usable() const { return error.empty() && missing.empty(); }
  // "python3 (/usr/bin/python3, Python 3.11.2)": the name, the resolved path and what it said it is.
  std::string Describe() const;
  // "lacks numpy (No module named 'numpy')" or "cannot be run: ...".
  std::string Problem() const;
};

// Runs `interpreter` (looked up on PATH unless it holds a '/') as `INTERPRETER -c SCRIPT MODULE...` with
// PYTHONPATH=`python_path` (none when empty; the rest of the environment is this process's), the script trying to
// import each module. posix_spawn and a pipe (no shell); after `timeout_s` the child is killed and the probe
// reports the timeout. Never throws; every failure is in the returned probe's `error`.
PythonProbe ProbePythonInterpreter(const std::string& interpreter, const std::vector<std::string>& modules,
                                   const std::string& python_path, double timeout_s);

// What ChoosePythonInterpreter looks at. FromEnvironment fills `candidates` and `python_path` as farm-worker has
// them: python3 on PATH, then SystemPythonPath(); PythonWorkerPythonPath(CheckoutPythonPackageDir()).
struct PythonSearch {
  std::string configured;               // env.python_interpreter; empty: the first usable of `candidates`
  std::vector<std::string> candidates;  // tried in order when `configured` is empty
  std::vector<std::string> modules = PythonWorkerModules();
  std::string python_path;  // the PYTHONPATH the worker will get
  double timeout_s = 30;    // per interpreter (numpy's import on a loaded machine can take seconds)

  static PythonSearch FromEnvironment(const std::string& configured);
};

struct PythonChoice {
  std::string interpreter;         // for env.python_interpreter: `configured` as given, else the chosen probe's path
  std::string note;                // one line that says the choice: "python: using /usr/bin/python3 (...)"
  std::vector<PythonProbe> tried;  // every interpreter asked, in order
};

// The interpreter for the Python worker. `configured` set: that one, when it can import every module. Empty: the
// first of `candidates` that can. Otherwise InvalidArgument with one message (several lines) that names each
// interpreter tried (its path), what it lacks or why it could not be run, and the fixes (env.python_interpreter
// in the config or --set; the Debian packages for a /usr/bin interpreter, pip for others). `choice->tried` is
// filled either way.
Status ChoosePythonInterpreter(const PythonSearch& search, PythonChoice* choice);

}  // namespace farm
