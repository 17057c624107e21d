// farm-export: writes a run's latest policy as a TorchScript module (deterministic actor only), optionally with
// a check file of sample inputs and this code's actions for them, so another runtime can verify the export.
#include <fmt/format.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/config.h"
#include "learner/model/export.h"
#include "learner/model/policy.h"
#include "learner/run/checkpoint.h"
#include "learner/run/metrics.h"

namespace {

int Fail(const std::string& message, int code = 2) {
  fmt::print(stderr, "farm-export: {}\n", message);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Rollout Farm export: saves RUN_DIR's latest policy as a TorchScript module. Its forward(obs) takes a tensor "
      "[B, obs_shape...], obs_shape as in RUN_DIR/policy_spec.json: with env.frame_stack > 1 each row is the env's "
      "last frame_stack observations concatenated along the first axis, oldest first (the caller stacks them, as "
      "the workers do); observations go in raw (with env.normalize_obs the module normalises them). It returns the "
      "deterministic action: int64 [B] (argmax) for a discrete action space, int64 [B, K] (the argmax of each "
      "component) for a multi-discrete one, float32 [B, action_shape...] (the Gaussian mean clamped to the bounds) "
      "for a box. Load it with torch.jit.load(OUT) in Python or torch::jit::load in C++"};
  std::string run_dir, out_path, check_file;
  int samples = 64;
  uint64_t seed = 0;
  app.add_option("RUN_DIR", run_dir, "training run directory (config.yaml, policy_spec.json, checkpoints/)")
      ->required();
  app.add_option("OUT", out_path, "TorchScript file to write (e.g. policy.pt)")->required();
  app.add_option("--check-file", check_file,
                 "also write JSON {\"inputs\": [[...]...], \"actions\": [...], \"obs_shape\": [...], "
                 "\"action_kind\": ...}: random observations (one flattened row each) and this code's "
                 "deterministic actions for them (box actions clamped to the bounds)");
  app.add_option("--samples", samples, "observations in the check file")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--seed", seed, "seed of the check file's observations (standard normal)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  torch::set_num_threads(1);
  farm::ActorCritic policy{nullptr};
  farm::FarmConfig config;
  farm::TrainingCounters counters;
  std::string checkpoint;
  if (auto s = farm::LoadPolicy(run_dir, &policy, &config, &counters, &checkpoint); !s.ok()) return Fail(s.message());
  // env.normalize_obs: the module normalises raw observations itself, with the checkpoint's statistics.
  std::optional<farm::ObsTransform> normalize;
  if (auto s = farm::LoadObsTransform(config, checkpoint, policy->observation_space().numel(), &normalize); !s.ok())
    return Fail(s.message());
  if (auto s = farm::ExportTorchScript(*policy, out_path, normalize ? &*normalize : nullptr); !s.ok())
    return Fail(s.message(), 1);
  fmt::print(stderr, "farm-export: wrote {} from {} ({} env steps trained; observation {}, action {})\n", out_path,
             checkpoint, counters.env_steps, policy->observation_space().ToString(), policy->action_space().ToString());

  if (check_file.empty()) return 0;
  const farm::Space& obs_space = policy->observation_space();
  const farm::Space& action_space = policy->action_space();
  std::vector<int64_t> shape = {static_cast<int64_t>(samples)};
  shape.insert(shape.end(), obs_space.shape.begin(), obs_space.shape.end());
  torch::manual_seed(seed);
  const torch::Tensor inputs = torch::randn(shape, torch::kFloat32);
  torch::Tensor actions;
  {
    c10::InferenceMode guard;
    torch::Tensor policy_in = inputs;  // raw observations, as the module takes them
    if (normalize) {
      policy_in = inputs.clone();
      normalize->Apply(inputs.data_ptr<float>(), policy_in.data_ptr<float>(), samples);
    }
    if (policy->has_core()) {
      // The samples are one env's steps, in order, its state carried from each to the next and zeroed at
      // `episode_start` (a new episode), as a caller of the exported module steps it.
      std::vector<torch::Tensor> steps;
      torch::Tensor state = torch::zeros({1, policy->core_state_size()});
      for (int64_t i = 0; i < samples; ++i) {
        if (i == samples / 2) state.zero_();
        const farm::ActOutput out =
            policy->Act(policy_in.narrow(0, i, 1), {}, /*deterministic=*/true, /*with_value=*/false, {}, state);
        steps.push_back(out.action);
        state = out.core_state;
      }
      actions = torch::cat(steps);
    } else {
      actions = policy->Act(policy_in, /*deterministic=*/true).action;
    }
    if (action_space.is_box()) {
      actions = torch::clamp(actions.reshape({samples, action_space.numel()}),
                             torch::tensor(action_space.low, torch::kFloat32),
                             torch::tensor(action_space.high, torch::kFloat32));
    }
  }
  nlohmann::json j;
  j["obs_shape"] = obs_space.shape;
  j["action_kind"] = action_space.is_discrete() ? "discrete" : action_space.is_multi_discrete() ? "multi_discrete" : "box";
  j["action_shape"] = action_space.shape;
  j["checkpoint"] = checkpoint;
  // With a core: the samples are one env's steps in order, a new episode from `episode_start` on.
  if (policy->has_core()) j["episode_start"] = samples / 2;
  const torch::Tensor rows = inputs.reshape({samples, obs_space.numel()}).contiguous();
  j["inputs"] = nlohmann::json::array();
  for (int64_t i = 0; i < samples; ++i) {
    const float* row = rows.data_ptr<float>() + i * obs_space.numel();
    std::vector<double> values(row, row + obs_space.numel());
    j["inputs"].push_back(values);
  }
  j["actions"] = nlohmann::json::array();
  if (action_space.is_discrete()) {
    const torch::Tensor a = actions.to(torch::kInt64).contiguous();
    for (int64_t i = 0; i < samples; ++i) j["actions"].push_back(a.data_ptr<int64_t>()[i]);
  } else if (action_space.is_multi_discrete()) {
    const torch::Tensor a = actions.to(torch::kInt64).contiguous();
    const int64_t k = action_space.numel();
    for (int64_t i = 0; i < samples; ++i)
      j["actions"].push_back(std::vector<int64_t>(a.data_ptr<int64_t>() + i * k, a.data_ptr<int64_t>() + (i + 1) * k));
  } else {
    const torch::Tensor a = actions.to(torch::kFloat32).contiguous();
    for (int64_t i = 0; i < samples; ++i) {
      const float* row = a.data_ptr<float>() + i * action_space.numel();
      j["actions"].push_back(std::vector<double>(row, row + action_space.numel()));
    }
  }
  if (auto s = farm::WriteFileAtomic(check_file, j.dump() + "\n"); !s.ok()) return Fail(s.message(), 1);
  fmt::print(stderr, "farm-export: wrote {} ({} samples)\n", check_file, samples);
  return 0;
}
