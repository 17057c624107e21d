// farm-eval: runs a trained run's latest policy (deterministically, or sampled with --sample) on fresh envs and reports
// episode returns. A C++ env is stepped here; a Python env's run (env.python) is evaluated by a serving learner
// and one worker started for it (tools/served_eval.h). Both report through Report.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <pthread.h>
#include <signal.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/config_files.h"
#include "learner/model/blas_kernel.h"
#include "learner/model/policy.h"
#include "learner/run/checkpoint.h"
#include "learner/run/eval_episodes.h"
#include "tools/served_eval.h"
#include "worker/env_group.h"
#include "worker/envs/mujoco/mujoco_env.h"
#include "worker/envs/mujoco/recording.h"
#include "worker/envs/mujoco/video.h"

namespace {

int Fail(const std::string& message, int code = 2) {
  fmt::print(stderr, "farm-eval: {}\n", message);
  return code;
}

// The JSON line on stdout and the human line on stderr, from the episodes' returns and lengths (non-empty).
// `policy`: the policy's name in a run with several policies (empty: the run's one policy).
void Report(const std::vector<double>& returns, const std::vector<double>& lengths, const std::string& env_name,
            const std::string& checkpoint, const farm::TrainingCounters& counters, uint64_t seed, bool sample,
            const std::string& policy = "") {
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
  const double stddev = std::sqrt(var / n);  // population std, as numpy's default
  const double min = *std::min_element(returns.begin(), returns.end());
  const double max = *std::max_element(returns.begin(), returns.end());

  nlohmann::ordered_json out = {{"episodes", returns.size()},
                                {"mean_return", mean},
                                {"std_return", stddev},
                                {"min", min},
                                {"max", max},
                                {"mean_length", mean_length},
                                {"checkpoint", checkpoint},
                                {"env_steps_trained", counters.env_steps},
                                {"env", env_name},
                                {"seed", seed},
                                {"actions", sample ? "sampled" : "deterministic"}};
  if (!policy.empty()) out["policy"] = policy;
  fmt::print("{}\n", out.dump());
  fmt::print(stderr,
             "farm-eval: {}{} over {} episodes: return {:.2f} ± {:.2f} (min {:.2f}, max {:.2f}), mean length {:.1f}; "
             "{} ({} env steps trained)\n",
             env_name, policy.empty() ? "" : ", policy " + policy, returns.size(), mean, stddev, min, max,
             mean_length, checkpoint, counters.env_steps);
}

}  // namespace

int main(int argc, char** argv) {
  // First: it may start this program again with a better OpenBLAS kernel; the serving learner and the worker a
  // Python env's evaluation starts inherit the choice.
  const farm::BlasKernelStart blas_kernel = farm::StartWithBestBlasKernel(argv);
  CLI::App app{
      "Rollout Farm evaluation: loads RUN_DIR's latest checkpoint, acts deterministically (argmax / Gaussian mean, "
      "box actions clipped to the bounds; --sample: sampled as in training) on fresh envs of the run's env, and "
      "prints one JSON line with the return statistics of N episodes (a human summary goes to stderr). A Python "
      "env's run (env.python) is served by farm-learner --serve to one farm-worker that this starts (both from "
      "this build tree)"};
  std::string run_dir;
  int episodes = 100;
  int num_envs = 16;
  uint64_t seed = 0;
  int64_t max_steps = 10'000'000;
  std::vector<std::string> overrides;
  app.add_option("RUN_DIR", run_dir, "training run directory (config.yaml, policy_spec.json, checkpoints/)")
      ->required();
  app.add_option("--episodes", episodes, "episodes to evaluate")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--envs", num_envs, "envs stepped together (env i runs about N/K of the episodes)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  auto* seed_opt = app.add_option("--seed", seed, "env seed (default: the run's seed)");
  app.add_option("--max-steps", max_steps, "give up after this many env steps in all")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--set", overrides,
                 "override a key of the run's config (e.g. a uav_coverage run on a larger map: --set "
                 "env.options.grid=48); repeatable")
      ->allow_extra_args(false);  // one key=value per --set, so RUN_DIR may follow
  std::vector<std::string> policy_overrides;
  app.add_option("--policy-set", policy_overrides,
                 "a run with several policies: override a key for one policy's serving learner, NAME:key=value (e.g. "
                 "prey:learner.random_actions=true: the prey act uniformly at random); repeatable")
      ->allow_extra_args(false);
  bool sample = false;
  app.add_flag("--sample", sample,
               "sample actions from the policy, as in training (LibTorch's generator seeded with the env seed), "
               "instead of its mode or mean");
  std::string video;
  farm::mujoco::VideoOptions video_options;
  app.add_option("--video", video,
                 "a MuJoCo env: render the first episode of the first env to this file (.gif, or .mp4 with ffmpeg on "
                 "PATH), offscreen, and write its bodies' heights and velocities over time beside it (.csv)");
  app.add_option("--camera", video_options.camera,
                 "--video: the model's camera to film with (default: its first camera, else one following the robot)");
  app.add_option("--video-size", video_options.width, "--video: width in pixels (height: 3/4 of it)")
      ->check(CLI::Range(16, 4096))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  video_options.height = video_options.width * 3 / 4;
  if (!video.empty()) {
    const std::string ext = std::filesystem::path(video).extension().string();
    if (ext != ".gif" && ext != ".mp4") return Fail(fmt::format("--video {}: expected a .gif or .mp4 file name", video));
  }
  fmt::print(stderr, "farm-eval: {}\n", blas_kernel.message);

  // A Python env's evaluation reads these signals from a signalfd (tools/served_eval.h): blocked in every thread,
  // so before LibTorch starts any; unblocked again in this thread for a C++ env.
  const sigset_t served_signals = farm::ServedEvalSignals();
  sigset_t old_mask;
  pthread_sigmask(SIG_BLOCK, &served_signals, &old_mask);

  // A run with several policies: its directory holds one run directory per policy, served together (one policy's
  // directory alone would be evaluated acting for every agent, the other policies' too).
  {
    const std::filesystem::path dir = std::filesystem::absolute(run_dir).lexically_normal();
    const std::filesystem::path base = dir.filename().empty() ? dir.parent_path() : dir;
    std::error_code ec;
    farm::FarmConfig up;
    const std::string parent = (base.parent_path() / "config.yaml").string();
    if (std::filesystem::is_regular_file(parent, ec) && farm::LoadConfig(parent, {}, &up).ok() &&
        std::any_of(up.policies.begin(), up.policies.end(),
                    [&](const farm::PolicyConfig& p) { return p.name == base.filename().string(); }))
      return Fail(fmt::format(
          "{} is one policy of a run with several policies ({} of them): evaluate them together, each acting for its "
          "own agents: farm-eval {}",
          run_dir, up.policies.size(), base.parent_path().string()));
    farm::FarmConfig whole;
    const std::string here = (base / "config.yaml").string();
    if (std::filesystem::is_regular_file(here, ec) && farm::LoadConfig(here, overrides, &whole).ok() &&
        !whole.policies.empty()) {
      if (!video.empty())
        return Fail(fmt::format("--video: {} is a run with several policies, served to a worker; --video films a "
                                "MuJoCo env that farm-eval steps itself (a run with one policy)",
                                run_dir));
      farm::ServedEvalOptions o;
      const std::string build = farm::SelfDir() + "/..";
      o.learner_bin = build + "/learner/farm-learner";
      o.worker_bin = build + "/worker/farm-worker";
      o.run_dir = base.string();
      o.episodes = episodes;
      num_envs = std::min(num_envs, episodes);
      o.num_envs = num_envs;
      o.num_groups = num_envs % whole.env.num_groups == 0 ? whole.env.num_groups : 1;
      o.seed = seed_opt->count() == 0 ? whole.seed : seed;
      o.max_steps = max_steps;
      o.sample = sample;
      o.overrides = overrides;
      for (const auto& p : whole.policies) o.policies.push_back(p.name);
      for (const auto& kv : policy_overrides) {
        const auto colon = kv.find(':');
        if (colon == std::string::npos ||
            std::find(o.policies.begin(), o.policies.end(), kv.substr(0, colon)) == o.policies.end())
          return Fail(fmt::format("--policy-set '{}': expected NAME:key=value with NAME one of the run's policies ({})",
                                  kv, fmt::join(o.policies, ", ")));
      }
      o.policy_overrides = policy_overrides;
      farm::ServedEvalResult r;
      if (auto s = farm::RunServedEval(o, &r); !s.ok()) return Fail(s.message(), 1);
      for (const auto& p : r.policies) {
        if (static_cast<int>(p.returns.size()) < episodes)
          return Fail(fmt::format("policy {}: only {} of {} episodes counted within {} env steps (--max-steps)",
                                  p.name, p.returns.size(), episodes, max_steps),
                      1);
        farm::TrainingCounters counters;
        std::string checkpoint;
        farm::ActorCritic policy{nullptr};
        farm::FarmConfig policy_config;
        if (auto s = farm::LoadPolicy((base / p.name).string(), &policy, &policy_config, &counters, &checkpoint);
            !s.ok())
          return Fail(s.message());
        Report(p.returns, p.lengths, r.env_name, checkpoint, counters, o.seed, sample, p.name);
      }
      return 0;
    }
  }
  if (!policy_overrides.empty())
    return Fail(fmt::format("--policy-set: {} is not a run with several policies (its config has no policies)",
                            run_dir));
  torch::set_num_threads(1);
  farm::ActorCritic policy{nullptr};
  farm::FarmConfig config;
  farm::TrainingCounters counters;
  std::string checkpoint;
  if (auto s = farm::LoadPolicy(run_dir, &policy, &config, &counters, &checkpoint); !s.ok()) return Fail(s.message());
  if (!overrides.empty()) {
    if (auto s = farm::LoadConfig(run_dir + "/config.yaml", overrides, &config); !s.ok()) return Fail(s.message());
  }
  if (seed_opt->count() == 0) seed = config.seed;
  num_envs = std::min(num_envs, episodes);  // more envs than episodes would step for nothing
  if (!config.env.python.empty()) {
    if (!video.empty())
      return Fail(fmt::format("--video: {} is a Python env ({}), stepped by a worker; --video films a MuJoCo env "
                              "that farm-eval steps itself",
                              config.env.name, config.env.python));
    // A Python env: served by farm-learner --serve to one farm-worker, both beside this binary in the build tree.
    farm::ServedEvalOptions o;
    const std::string build = farm::SelfDir() + "/..";
    o.learner_bin = build + "/learner/farm-learner";
    o.worker_bin = build + "/worker/farm-worker";
    o.run_dir = run_dir;
    o.episodes = episodes;
    o.num_envs = num_envs;
    o.num_groups = num_envs % config.env.num_groups == 0 ? config.env.num_groups : 1;
    o.seed = seed;
    o.max_steps = max_steps;
    o.sample = sample;
    o.overrides = overrides;
    farm::ServedEvalResult r;
    if (auto s = farm::RunServedEval(o, &r); !s.ok()) return Fail(s.message(), 1);
    if (static_cast<int>(r.returns.size()) < episodes)
      return Fail(fmt::format("only {} of {} episodes finished within {} env steps (--max-steps)", r.returns.size(),
                              episodes, max_steps),
                  1);
    Report(r.returns, r.lengths, r.env_name, checkpoint, counters, seed, sample);
    return 0;
  }
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  torch::manual_seed(seed);  // --sample's draws
  // env.normalize_obs: the policy acts on observations normalised with the checkpoint's statistics, frozen.
  std::optional<farm::ObsTransform> normalize;
  if (auto s = farm::LoadObsTransform(config, checkpoint, policy->observation_space().numel(), &normalize); !s.ok())
    return Fail(s.message());

  if (auto s = farm::ResolveEnvFiles(&config); !s.ok()) return Fail(s.message());
  std::unique_ptr<farm::EnvGroup> group;
  if (auto s = farm::EnvGroup::Create(config.env, num_envs, seed, &group); !s.ok()) return Fail(s.message());
  const farm::EnvSpec& spec = group->spec();
  if (spec.observation != policy->observation_space() || spec.action != policy->action_space())
    return Fail(fmt::format("env {} has observation {} and action {}, but the policy was trained on {} and {}",
                            spec.name, spec.observation.ToString(), spec.action.ToString(),
                            policy->observation_space().ToString(), policy->action_space().ToString()));

  // --video: env 0's first episode, state by state, from its reset to its end (the observer sees the last state
  // before the group resets the env).
  std::unique_ptr<farm::mujoco::EpisodeRecording> recording;
  bool recorded = false;
  if (!video.empty()) {
    const auto* sim = dynamic_cast<const farm::mujoco::MujocoEnv*>(&group->env(0));
    if (sim == nullptr)
      return Fail(fmt::format("--video: {} is not a MuJoCo env; videos are of MuJoCo envs' episodes", spec.name));
    recording = std::make_unique<farm::mujoco::EpisodeRecording>(sim->model_handle(), sim->dt());
    recording->Add(sim->data(), 0);
    group->SetStepObserver([&](int e, const farm::Env& env, float reward, bool ended) {
      if (e != 0 || recorded) return;
      recording->Add(static_cast<const farm::mujoco::MujocoEnv&>(env).data(), reward);
      recorded = ended;
    });
  }

  const farm::Space& action_space = spec.action;
  const bool discrete = action_space.is_categorical();  // int64 actions: discrete or multi-discrete
  // One row per agent (env-major); a single-agent env has a row per env. The shared policy acts on each row.
  const int rows = group->rows();
  std::vector<int64_t> obs_shape = {static_cast<int64_t>(rows)};
  obs_shape.insert(obs_shape.end(), spec.observation.shape.begin(), spec.observation.shape.end());
  torch::Tensor low, high;
  if (!discrete) {
    low = torch::tensor(action_space.low, torch::kFloat32);
    high = torch::tensor(action_space.high, torch::kFloat32);
  }

  // Episodes are spread evenly over the envs (env i contributes N/K, the first N%K one more), as
  // Stable-Baselines3's evaluate_policy does: taking whichever N episodes end first would favour short ones.
  std::vector<int> quota = farm::EpisodeQuota(episodes, num_envs);
  std::vector<double> returns;
  std::vector<double> lengths;
  returns.reserve(static_cast<std::size_t>(episodes));
  int64_t steps = 0;
  std::vector<float> normalized(normalize ? static_cast<std::size_t>(rows * spec.observation.numel()) : 0);
  // A recurrent policy's state per row: zero at every episode's start, carried between the row's steps.
  torch::Tensor core_state;
  if (policy->has_core()) core_state = torch::zeros({rows, policy->core_state_size()});
  {
    c10::InferenceMode guard;
    while (static_cast<int>(returns.size()) < episodes) {
      if (steps >= max_steps)
        return Fail(fmt::format("only {} of {} episodes finished within {} env steps (--max-steps)", returns.size(),
                                episodes, max_steps),
                    1);
      const float* raw = group->obs();
      if (normalize) {
        normalize->Apply(raw, normalized.data(), rows);
        raw = normalized.data();
      }
      const torch::Tensor obs = torch::from_blob(const_cast<float*>(raw), obs_shape, torch::kFloat32);
      const farm::ActOutput out = policy->Act(obs, {}, /*deterministic=*/!sample, /*with_value=*/false, {}, core_state);
      torch::Tensor action = out.action;
      if (core_state.defined()) core_state = out.core_state.clone();
      if (discrete) {
        action = action.to(torch::kInt64).contiguous();
        group->Step(action.data_ptr<int64_t>(), nullptr);
      } else {
        action =
            torch::clamp(action.reshape({rows, action_space.numel()}), low, high).to(torch::kFloat32).contiguous();
        group->Step(nullptr, action.data_ptr<float>());
      }
      steps += num_envs;
      if (core_state.defined()) {
        for (int r = 0; r < rows; ++r)
          if (group->terminated()[r] || group->truncated()[r]) core_state[r].zero_();
      }
      // finished() lists the ended episodes in env order; match them to the envs that ended (not to a first
      // row's flags: an agent that finished early terminates its row alone while its env goes on).
      std::size_t next = 0;
      for (int i = 0; i < num_envs; ++i) {
        if (!group->ended()[i]) continue;
        const farm::EpisodeStat& ep = group->finished().at(next++);
        if (quota[i] > 0) {
          --quota[i];
          returns.push_back(ep.episode_return);
          lengths.push_back(ep.length);
        }
      }
    }
  }

  Report(returns, lengths, spec.name, checkpoint, counters, seed, sample);
  if (recording) {
    // The table first: it needs no renderer, and says what the video shows where there can be none.
    const std::string trace = std::filesystem::path(video).replace_extension(".csv").string();
    if (auto s = recording->WriteTrace(trace); !s.ok()) return Fail(s.message(), 1);
    double episode_return = 0;
    for (int i = 0; i < recording->size(); ++i) episode_return += recording->reward(i);
    const std::string what = fmt::format("episode 1 of env 0 ({} steps, return {:.2f})", recording->size() - 1,
                                         episode_return);
    // A live line: a software renderer takes tens of milliseconds a frame.
    auto last = std::chrono::steady_clock::now() - std::chrono::seconds(10);
    video_options.progress = [&](int frame, int frames) {
      const auto now = std::chrono::steady_clock::now();
      if (frame < frames && now - last < std::chrono::seconds(1)) return;
      last = now;
      fmt::print(stderr, "\rfarm-eval: rendering {}: frame {} of {}{}", video, frame, frames, frame == frames ? "\n" : "");
    };
    if (auto s = farm::mujoco::WriteVideo(*recording, video, video_options); !s.ok())
      return Fail(fmt::format("{}; the bodies' heights and velocities of {} are in {}", s.message(), what, trace), 1);
    fmt::print(stderr, "farm-eval: {}: {} ({}x{}); the bodies' heights and velocities: {}\n", video, what,
               video_options.width, video_options.height, trace);
  }
  return 0;
}
