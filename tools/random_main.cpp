// farm-random: a uniform-random policy's episodes on one env, as a baseline
// for trained policies (no LibTorch; built on worker-only hosts too).
//
//   farm-random --env uav_coverage --episodes 100 --seed 1
//               --set env.options.cell_reward=1 --set env.options.collision_penalty=0
//
// prints one JSON line: the episodes' return (mean, population std, min, max)
// and length, and the stepping rate. With num_agents > 1 every agent draws its
// own action and the return is the team's. Episodes are spread evenly over the
// envs stepped together (env i runs episodes/K of them, the first
// episodes % K one more), as farm-eval does, so short episodes are not
// favoured. Deterministic for a seed.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/config_files.h"
#include "worker/env_group.h"
#include "worker/random.h"

namespace {

int Fail(const std::string& message, int code = 2) {
  fmt::print(stderr, "farm-random: {}\n", message);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Episode returns of a uniform-random policy on an env (one JSON line)"};
  std::string config_path;
  std::string env_name;
  int episodes = 100;
  int num_envs = 10;
  uint64_t seed = 1;
  int64_t max_steps = 100000000;
  std::vector<std::string> overrides;
  app.add_option("--config", config_path, "a run config: env.name and env.options come from it")
      ->check(CLI::ExistingFile);
  app.add_option("--env", env_name, "env name (overrides the config's env.name)");
  app.add_option("--episodes", episodes, "episodes to run")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--envs", num_envs, "envs stepped together")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--seed", seed, "seed of the envs and of the random actions")->capture_default_str();
  app.add_option("--max-steps", max_steps, "give up after this many env steps in all")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--set", overrides, "override a config key, e.g. --set env.options.cell_reward=1; repeatable")
      ->allow_extra_args(false);
  CLI11_PARSE(app, argc, argv);

  farm::FarmConfig config;
  if (!env_name.empty()) overrides.insert(overrides.begin(), "env.name=" + env_name);
  if (auto s = farm::LoadConfig(config_path, overrides, &config); !s.ok()) return Fail(s.message());
  num_envs = std::min(num_envs, episodes);  // more envs than episodes would step for nothing

  if (auto s = farm::ResolveEnvFiles(&config); !s.ok()) return Fail(s.message());
  std::unique_ptr<farm::EnvGroup> group;
  if (auto s = farm::EnvGroup::Create(config.env, num_envs, seed, &group); !s.ok()) return Fail(s.message());
  const farm::Space& act = group->spec().action;
  const int rows = group->rows();
  const int agents = group->num_agents();
  // Actions from their own engine, apart from the envs' seeds.
  std::mt19937_64 rng(farm::SplitMix64(seed ^ 0x5EED0A55ull));
  const bool integer = act.is_categorical();  // discrete or multi-discrete
  const std::vector<int64_t> choices = act.categories();
  std::vector<int64_t> discrete(integer ? static_cast<std::size_t>(rows * act.numel()) : 0);
  std::vector<float> continuous(integer ? 0 : static_cast<std::size_t>(rows * act.numel()));

  std::vector<int> quota(static_cast<std::size_t>(num_envs));
  for (int i = 0; i < num_envs; ++i) quota[i] = episodes / num_envs + (i < episodes % num_envs ? 1 : 0);
  std::vector<double> returns, lengths;
  returns.reserve(static_cast<std::size_t>(episodes));
  lengths.reserve(static_cast<std::size_t>(episodes));
  int64_t steps = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (static_cast<int>(returns.size()) < episodes) {
    if (steps >= max_steps)
      return Fail(fmt::format("only {} of {} episodes finished within {} env steps (--max-steps)", returns.size(),
                              episodes, max_steps),
                  1);
    if (integer) {
      for (std::size_t i = 0; i < discrete.size(); ++i)
        discrete[i] = static_cast<int64_t>(rng() % static_cast<uint64_t>(choices[i % choices.size()]));
    } else {
      for (std::size_t i = 0; i < continuous.size(); ++i) {
        const std::size_t k = i % static_cast<std::size_t>(act.numel());
        double lo = act.low[k], hi = act.high[k];
        if (!std::isfinite(lo) || !std::isfinite(hi)) lo = -1, hi = 1;  // unbounded: a unit box
        continuous[i] = static_cast<float>(farm::UniformReal(rng, lo, hi));
      }
    }
    group->Step(integer ? discrete.data() : nullptr, integer ? nullptr : continuous.data());
    steps += num_envs;
    // finished() lists the ended episodes in env order (an env's first row may be flagged while it goes on, when
    // its agent finished early: ended() says which envs ended).
    std::size_t next = 0;
    for (int e = 0; e < num_envs; ++e) {
      if (!group->ended()[e]) continue;
      const farm::EpisodeStat& ep = group->finished().at(next++);
      if (quota[e] > 0) {
        --quota[e];
        returns.push_back(ep.episode_return);
        lengths.push_back(ep.length);
      }
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  const double n = static_cast<double>(returns.size());
  double mean = 0, mean_length = 0;
  for (std::size_t i = 0; i < returns.size(); ++i) {
    mean += returns[i];
    mean_length += lengths[i];
  }
  mean /= n;
  mean_length /= n;
  double var = 0;
  for (double r : returns) var += (r - mean) * (r - mean);
  // The resolved options (defaults with the user's values), so the line says what was measured.
  farm::EnvOptions resolved;
  const farm::EnvFamily* family = farm::EnvRegistry::Global().Find(config.env.name);  // Create found it
  if (auto s = farm::ResolveEnvOptions(config.env.name, family->default_options, config.env.options, &resolved);
      !s.ok())
    return Fail(s.message());
  nlohmann::ordered_json options = nlohmann::ordered_json::object();
  for (const auto& [k, v] : resolved) options[k] = v;
  const nlohmann::ordered_json out = {
      {"env", config.env.name},
      {"options", options},
      {"num_agents", agents},
      {"episodes", returns.size()},
      {"seed", seed},
      {"envs", num_envs},
      {"mean_return", mean},
      {"std_return", std::sqrt(var / n)},  // population std, as farm-eval
      {"min_return", *std::min_element(returns.begin(), returns.end())},
      {"max_return", *std::max_element(returns.begin(), returns.end())},
      {"mean_length", mean_length},
      {"env_steps", steps},
      {"seconds", seconds},
      {"env_steps_per_second", seconds > 0 ? static_cast<double>(steps) / seconds : 0.0},
      {"agent_steps_per_second", seconds > 0 ? static_cast<double>(steps) * agents / seconds : 0.0}};
  fmt::print("{}\n", out.dump());
  return 0;
}
