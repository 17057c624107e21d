// Where the files a config names are found, from its own folder or from a run directory alone.
//
// A relative path is looked for in the directory the program starts in, then beside the config file (env.python's
// .py file then in the checkout too). A run records in its config.yaml where each file was found, as an absolute
// path (the path keys themselves; env.python_found for the env's code, as the first Python worker found it), and
// the run directory's own absolute path (run_dir), so that whatever starts from the run directory alone (eval,
// --resume, --serve, export) finds them from any directory. When a recorded path is gone (the run directory moved
// to another folder or machine), the same place relative to the run directory is tried next (the project folder
// moved with it), then the folder beside the run directory and the run directory itself, then the places a
// relative path is looked for. A path that is found nowhere is an error naming the key, every place tried and
// what to set.
//
// Threading: free functions; they read the file system and the current directory.
#pragma once

#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"

namespace farm {

struct FileQuery {
  std::string key;                     // the config key, for the message ("ppo.actor_encoder_script")
  std::string path;                    // its value as the config gives it
  std::string recorded;                // where the run found it, when recorded apart from `path` (env.python_found):
                                       // tried after an absolute `path`, before a relative one is looked for
  std::vector<std::string> preferred;  // tried before anything else (a run directory's own copy of the file)
  std::vector<std::string> also;       // folders tried last for a relative path (the checkout, for env.python)
  bool directory = false;              // a directory is looked for (learner.init_from), not a file
  bool either = false;                 // a file or a directory (transport.curve_authorized_keys)
  std::string hint;                    // how to set it, when not "--set KEY=PATH"
};

// The places FindConfigFile tries, in order: absolute, normalised, each once.
std::vector<std::string> ConfigFileCandidates(const FarmConfig& config, const FileQuery& query);

// The first candidate that exists; NotFound naming the key, each place tried and how to set it.
Status FindConfigFile(const FarmConfig& config, const FileQuery& query, std::string* found);

// Where a recorded absolute path may be now (recorded first, then the moved run directory's places), for a
// recorded folder that is checked otherwise (env.python_found of a module name: the folder that holds it).
std::vector<std::string> RecordedPlaces(const FarmConfig& config, const std::string& recorded);

// The path keys the learner reads, found and made absolute in `config`: learner.init_from, the encoder scripts
// (for a run directory's config, the run directory's copies named `actor_copy` and `critic_copy` first) and, with
// transport.curve, the learner's secret key and the authorized keys; NotFound for one set and found nowhere. The
// workers' files (env.mujoco.model and the two CURVE keys) are made absolute too where they are found here (they are looked for again by each
// worker), so that the run's record is complete.
Status ResolveLearnerFiles(FarmConfig* config, const std::string& actor_copy, const std::string& critic_copy);

// The path keys a worker reads, found and made absolute: env.mujoco.model (ResolveEnvFiles) and, with
// transport.curve, its secret key and the learner's public key.
Status ResolveWorkerFiles(FarmConfig* config);

// The files the env itself reads, found and made absolute: env.mujoco.model. What builds envs from a config
// (farm-worker, farm-eval, farm-random) calls it.
Status ResolveEnvFiles(FarmConfig* config);

}  // namespace farm
