// The environment API. An environment family declares its option defaults,
// a spec (spaces, time limit) built from the resolved options, and its
// behaviour (reset/step), apart from one another (as EnvPool separates a
// default config from the spec built from it), and registers itself by name
// with FARM_REGISTER_ENV. Envs depend only on this header and common/space.h:
// never on transport, the learner or LibTorch.
//
// Threading: an Env instance is used by one thread at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "common/space.h"
#include "common/status.h"

namespace farm {

// Per-env options (from config `env.options`): a family's defaults, or the
// resolved set (user values over those defaults).
using EnvOptions = std::map<std::string, double>;

// What an env looks like for one resolved set of options.

struct EnvSpec {
  std::string name;
  Space observation;  // float32 box, per agent
  Space action;       // discrete or multi-discrete (int64), or a float32 box, per agent
  int max_episode_steps = 0;  // time limit applied by EnvGroup (0: none)
  std::optional<double> reward_threshold;  // "solved" return, when the env has one
  // Multi-agent envs: agents per env (>= 1). All agents share the spaces
  // above; reset/step write num_agents observations and step reads
  // num_agents actions, agent-major. Reward and termination are the team's.
  int num_agents = 1;
  // Agents that finish before their env ends (MAPPO's active masks): with
  // true, EnvGroup asks Env::agents_done after every step. An agent that is
  // done gets its row terminated on the step that ends it (a termination:
  // nothing is bootstrapped past it) while the env goes on; from then until
  // the env's end it is inactive (StepRequest.active 0): its action is
  // ignored, its reward is 0 and the learner leaves its row out of training.
  // The env ends as today (Env::step's terminated, the time limit) or when
  // every agent is done. For multi-agent envs; with one agent, its end is the
  // env's. False: agents_done is never called.
  bool agents_finish_early = false;
  // A float32 box describing the whole env (e.g. a map for a centralised
  // critic), written by Env::state after every reset and step. None: no state.
  std::optional<Space> global_state;
};

// One step's actions, read by Env::step. Exactly one of the pointers is set:
// `discrete` for discrete and multi-discrete spaces (num_agents * action.numel()
// int64: one per agent, or K per agent with component i in [0, nvec[i])),
// `continuous` for boxes (num_agents * action.numel() floats); agent a's at
// offset a * action.numel().
struct ActionRef {
  const int64_t* discrete = nullptr;
  const float* continuous = nullptr;
};

struct StepResult {
  float reward = 0;
  bool terminated = false;
};

class Env {
 public:
  virtual ~Env() = default;
  // Starts an episode; writes observation.numel() floats to obs (per agent,
  // agent-major, for num_agents > 1).
  virtual void reset(float* obs) = 0;
  // Advances one step; writes the next observation to obs. Truncation by the
  // time limit is not the env's business (EnvGroup does it).
  virtual StepResult step(const ActionRef& action, float* obs) = 0;
  // Only for specs with a global_state: writes global_state->numel() floats
  // describing the env as it is now (EnvGroup calls it after reset and step).
  // The default throws std::logic_error: a spec that declares a state must
  // come with an env that writes it.
  virtual void state(float* out) const;
  // Only for specs with agents_finish_early: writes num_agents bytes, 1 for
  // each agent whose part in the episode is over (it must stay 1 until the
  // next reset; EnvGroup refuses an agent that comes back), 0 for the others
  // (EnvGroup calls it after every step). A finished agent still gets its
  // slot of the observations written by step (its last one, or whatever the
  // env shows it) and an action, which the env must ignore. The default
  // throws std::logic_error, as state does.
  virtual void agents_done(uint8_t* out) const;
};

// A registered environment family. `default_options` names every option the
// family accepts, with its default. `spec` and `make` both get the resolved
// options (defaults with the user's values applied), so the spaces, time limit
// and threshold may follow them; `make` also gets a seed for the env's own RNG.
// Either may throw std::invalid_argument for an out-of-range option value
// (EnvGroup::Create reports it as InvalidArgument). For one set of resolved
// options, every env `make` builds must match what `spec` returns.
struct EnvFamily {
  EnvOptions default_options;
  std::function<EnvSpec(const EnvOptions& resolved)> spec;
  std::function<std::unique_ptr<Env>(const EnvOptions& resolved, uint64_t seed)> make;
};

class EnvRegistry {
 public:
  static EnvRegistry& Global();
  // Returns true so it can initialise a static (see FARM_REGISTER_ENV).
  bool Add(const std::string& name, EnvFamily family);
  const EnvFamily* Find(const std::string& name) const;
  std::vector<std::string> Names() const;

 private:
  std::map<std::string, EnvFamily> families_;
};

// Merges user options over a family's defaults; an option absent from the
// defaults is an error naming the env, the key and the known keys.
Status ResolveEnvOptions(const std::string& env_name, const EnvOptions& defaults,
                         const std::map<std::string, double>& user, EnvOptions* out);

}  // namespace farm

#define FARM_ENV_CONCAT_INNER(a, b) a##b
#define FARM_ENV_CONCAT(a, b) FARM_ENV_CONCAT_INNER(a, b)
// Registers an env family, at namespace scope in the env's .cpp:
//   FARM_REGISTER_ENV("CartPole-v1", EnvOptions{}, CartPoleSpec, MakeCartPole);
//   FARM_REGISTER_ENV("Debug-v0", DebugEnvDefaultOptions(), DebugEnvSpec, MakeDebugEnv);
// Pass the defaults as a call or a named variable: the commas of a braced list
// such as {{"a", 1}, {"b", 2}} would split the macro's arguments.
#define FARM_REGISTER_ENV(name, default_options, spec_fn, make_fn)                           \
  static const bool FARM_ENV_CONCAT(farm_env_registered_, __LINE__) =                       \
      ::farm::EnvRegistry::Global().Add(name, ::farm::EnvFamily{default_options, spec_fn, make_fn})
