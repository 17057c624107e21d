// Evaluation of a Python env's run (env.python), and of any run with several policies (one serving learner per
// policy, the worker's agents mapped to them, each policy's episodes counted by its learner), for farm-eval: the C++
// tools cannot step a Python env, nor act for several policies in one process, so the run's policy is served by `farm-learner --serve RUN_DIR` with learner.eval_episodes=N, and one `farm-worker`
// (which execs the Python worker) steps K fresh envs against it; the learner writes the counted episodes to its
// run directory's episodes.jsonl (learner/run/eval_episodes.h: the same quota per env as farm-eval's C++ path)
// and stops once N have ended.
//
// data flow: farm-eval -> (fork/exec) farm-learner --serve, endpoint file -> farm-worker (the env) ->
//            episodes.jsonl -> returns
//
// Both children die with farm-eval (PR_SET_PDEATHSIG); any failure, or SIGINT/SIGTERM/SIGHUP, stops and reaps
// both before RunServedEval returns. Threading: call from the main thread. Its signals (ServedEvalSignals:
// SIGCHLD, SIGINT, SIGTERM, SIGHUP) are read from a signalfd, so every thread must block them: the caller blocks
// them first thing in main, before LibTorch can start threads (which inherit the mask), as farm-eval does.
#pragma once

#include <signal.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace farm {

struct ServedEvalOptions {
  std::string run_dir;
  std::string learner_bin;  // farm-learner
  std::string worker_bin;   // farm-worker
  int episodes = 100;
  int num_envs = 16;        // K: the worker's env.num_envs
  int num_groups = 1;       // the worker's env.num_groups (divides num_envs)
  uint64_t seed = 0;
  int64_t max_steps = 0;    // the learner's total_env_steps
  bool sample = false;
  std::vector<std::string> overrides;  // the user's --set, for both
  // A run with several policies (its config's `policies`): one serving learner per policy, for run_dir/NAME, and
  // the worker acting for each agent with its policy's; empty: run_dir's one policy.
  std::vector<std::string> policies;
  // Overrides for one policy's serving learner only, as "NAME:key=value" (e.g. prey:learner.random_actions=true,
  // the prey acting uniformly at random).
  std::vector<std::string> policy_overrides;
};

struct ServedEvalResult {
  std::vector<double> returns;  // a run with several policies: the first policy's (each policy's in `policies`)
  std::vector<double> lengths;
  std::string env_name;  // from the worker's Hello (the serving learner's summary.json)
  struct Policy {
    std::string name;
    std::vector<double> returns;  // the mean over the policy's agents of their summed rewards, per episode
    std::vector<double> lengths;
  };
  std::vector<Policy> policies;  // with several policies, in the config's order
};

Status RunServedEval(const ServedEvalOptions& options, ServedEvalResult* result);

// SIGCHLD, SIGINT, SIGTERM and SIGHUP.
sigset_t ServedEvalSignals();

// The directory of this executable (/proc/self/exe's).
std::string SelfDir();

}  // namespace farm
