// farm-worker for a config with env.python: the command line of the Python worker (worker/python, module
// farm_worker) that runs in its place, with the config's settings (envs, groups, seed, normalisation, frame
// stacking, CURVE keys, give-up time), so that scripts/farm, its cluster mode and docker-compose start Python
// workers exactly as they start farm-worker.
//
// Threading: free functions, no state.
#pragma once

#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"

namespace farm {

// argv for execvp (argv[0] is env.python_interpreter). InvalidArgument naming env.python when it is not
// MODULE:FACTORY, or when a .py file it names is not found. A relative .py path is looked for in the current
// directory, then in each of `search_dirs` in order (farm-worker passes the config file's directory and the
// checkout this binary was built from), and made absolute.
Status PythonWorkerArgv(const FarmConfig& config, int index, const std::string& learner_endpoint,
                        const std::string& stats_file, const std::vector<std::string>& search_dirs,
                        std::vector<std::string>* argv);

// Replaces this process with the Python worker (PYTHONPATH gets `package_dir` first, when it exists, so that a
// checkout's package is found without pip install). Returns only on failure, with the reason.
Status ExecPythonWorker(const std::vector<std::string>& argv, const std::string& package_dir);

// worker/python of the source tree this binary was built from.
std::string CheckoutPythonPackageDir();

}  // namespace farm
