// An encoder written in PyTorch (issue 31, ppo.actor_encoder_script / ppo.critic_encoder_script): a TorchScript
// module, made in Python with torch.jit.script(module).save(path), that maps a batch of inputs [B, shape...]
// (float32) to features [B, F]. The farm adds what it owns after it (trunk, core, heads).
//
// Its parameters and buffers become this module's own (the same tensors, registered under their names with '.'
// made '_'), so the optimizer trains them, checkpoints hold them, CopyFrom copies them and to(device) moves them
// (nn::Module::to sets their data in place, which the script's attributes share).
//
// Threading: as any module, not thread-safe; the acting and training policies each load their own copy.
#pragma once

#include <torch/script.h>
#include <torch/torch.h>

#include <array>
#include <string>

#include "common/space.h"
#include "common/status.h"

namespace farm {

// The run directory's copies of the scripts, as policy_spec.json names them (relative to its directory).
inline constexpr char kActorEncoderScriptFile[] = "actor_encoder.pt";
inline constexpr char kCriticEncoderScriptFile[] = "critic_encoder.pt";

// The two encoder scripts in one list: the config key, the path (empty: the built-in encoder) and the name of
// the run directory's copy.
struct EncoderScript {
  const char* key;
  std::string path;
  const char* run_file;
};
inline std::array<EncoderScript, 2> EncoderScripts(const std::string& actor_path, const std::string& critic_path) {
  return {{{"ppo.actor_encoder_script", actor_path, kActorEncoderScriptFile},
           {"ppo.critic_encoder_script", critic_path, kCriticEncoderScriptFile}}};
}

// Whether `path` loads as a TorchScript module: InvalidArgument naming `key` (the config key) and the path, and
// LibTorch's reason, when it does not. The learner checks before it opens the run directory.
Status CheckEncoderScript(const std::string& path, const std::string& key);
// Copies the script at `path` to `dest` (temp file, fsync, rename); nothing when they are the same file.
Status CopyEncoderScript(const std::string& path, const std::string& dest);

class ScriptedEncoderImpl : public torch::nn::Module {
 public:
  // Loads `path` and runs it on a probe batch of two zero inputs shaped as `input`. Throws std::invalid_argument
  // naming `key` (the config key), the path and the shapes when the file cannot be loaded, the forward fails,
  // or its output is not [2, F] floating point with F > 0.
  ScriptedEncoderImpl(const std::string& path, const Space& input, const std::string& key);

  torch::Tensor forward(const torch::Tensor& x);
  void train(bool on = true) override;

  int64_t features() const { return features_; }
  // Floats per input row that a training forward keeps for the backward pass: the outputs of the operations
  // autograd records from the features back to the parameters, measured at construction on probe batches of 1
  // and 3 rows (their difference over 2: what grows with the batch). At least features(). For the memory
  // estimate, which cannot see inside a script otherwise.
  int64_t activation_floats() const { return activation_floats_; }
  const std::string& path() const { return path_; }
  // The script itself (its attributes are this module's parameters), for export.
  torch::jit::Module& script() { return script_; }

 private:
  torch::jit::Module script_;
  std::string path_;
  int64_t features_ = 0;
  int64_t activation_floats_ = 0;
};
TORCH_MODULE(ScriptedEncoder);

}  // namespace farm
