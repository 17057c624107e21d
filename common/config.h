// Typed, YAML-backed configuration. Every key has a default and a rule; an
// unknown key, a wrong type or an out-of-range value is an error that names
// the source (file or --set override), the key and what was expected.
//
// A config struct lists its fields once, in visit(); the same list drives
// parsing, validation and dumping (the resolved config written to run_dir).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace farm {

// What a numeric or string field may hold. Empty rule: anything of the type.
struct Rule {
  std::optional<double> min;
  std::optional<double> max;
  bool min_exclusive = false;
  std::vector<std::string> one_of;

  static Rule AtLeast(double v) { Rule r; r.min = v; return r; }
  static Rule Positive() { Rule r; r.min = 0; r.min_exclusive = true; return r; }
  static Rule Between(double lo, double hi) { Rule r; r.min = lo; r.max = hi; return r; }
  static Rule OneOf(std::vector<std::string> v) { Rule r; r.one_of = std::move(v); return r; }
  std::string Describe() const;  // "a value >= 1", "one of: sync, async", ...
};

struct EnvConfig {
  std::string name = "CartPole-v1";
  int num_envs = 8;    // per worker
  int num_groups = 2;  // double buffering: one group steps while the other waits
  std::map<std::string, double> options;  // env-specific, checked against the env's spec

  template <class V> void visit(V& v) {
    v("name", name);
    v("num_envs", num_envs, Rule::AtLeast(1));
    v("num_groups", num_groups, Rule::Between(1, 64));
    v("options", options);
  }
};

struct TransportConfig {
  // Learner's bind address; "*" as port picks a free one (written to run_dir/learner.endpoint).
  std::string bind = "tcp://127.0.0.1:*";
  int64_t max_message_bytes = 64ll << 20;
  double worker_give_up_s = 60;  // a worker exits when the learner is silent this long
  double heartbeat_interval_s = 1.0;  // a side with nothing to send for this long sends a Heartbeat
  double heartbeat_timeout_s = 10.0;  // the learner drops a worker silent for this long

  template <class V> void visit(V& v) {
    v("bind", bind);
    v("max_message_bytes", max_message_bytes, Rule::AtLeast(1024));
    v("worker_give_up_s", worker_give_up_s, Rule::Positive());
    v("heartbeat_interval_s", heartbeat_interval_s, Rule::Positive());
    v("heartbeat_timeout_s", heartbeat_timeout_s, Rule::Positive());
  }
};

struct BatcherConfig {
  int max_rows = 4096;       // rows (env observations) per inference batch
  int64_t max_wait_us = 2000;  // after the first request, wait at most this long for more
  int queue_capacity = 1024;   // requests queued before the I/O thread blocks

  template <class V> void visit(V& v) {
    v("max_rows", max_rows, Rule::AtLeast(1));
    v("max_wait_us", max_wait_us, Rule::AtLeast(0));
    v("queue_capacity", queue_capacity, Rule::AtLeast(1));
  }
};

struct LearnerConfig {
  std::string device = "auto";  // auto | cpu | cuda | cuda:N
  int threads = 1;              // intra-op threads for LibTorch
  int checkpoint_every = 50;    // updates between checkpoints (0: only at the end)
  int keep_checkpoints = 5;     // newest checkpoints kept (0: all)
  double progress_interval_s = 1.0;
  int min_workers = 1;          // workers that must join before acting
  std::string precision = "fp32";  // fp32 | fp16 (CUDA, with loss scaling) | bf16 (CUDA or CPU autocast)
  bool cuda_graphs = false;        // replay fixed-shape inference with CUDA graphs (not available yet: rejected)
  bool train = true;               // false: act with the initial (or loaded) policy, never update
  bool random_actions = false;     // uniform random actions, no model: measures transport alone
  std::string init_from;           // a run directory: start from its latest policy (serving, fine-tuning)
  bool resume = false;             // continue run_dir from its latest checkpoint: policy, optimizer, counters
  bool deterministic = false;      // act with the mode (discrete) or mean (box) instead of sampling

  template <class V> void visit(V& v) {
    v("device", device);
    v("precision", precision, Rule::OneOf({"fp32", "fp16", "bf16"}));
    v("cuda_graphs", cuda_graphs);
    v("train", train);
    v("random_actions", random_actions);
    v("init_from", init_from);
    v("resume", resume);
    v("deterministic", deterministic);
    v("threads", threads, Rule::AtLeast(1));
    v("checkpoint_every", checkpoint_every, Rule::AtLeast(0));
    v("keep_checkpoints", keep_checkpoints, Rule::AtLeast(0));
    v("progress_interval_s", progress_interval_s, Rule::Positive());
    v("min_workers", min_workers, Rule::AtLeast(1));
  }
};

struct PpoConfig {
  int rollout_length = 32;  // steps per env per rollout (T)
  double gamma = 0.99;
  double gae_lambda = 0.95;
  double lr = 2.5e-4;
  bool anneal_lr = true;
  int num_minibatches = 4;
  int update_epochs = 4;
  bool norm_adv = true;
  double clip_coef = 0.2;
  bool clip_vloss = true;
  double ent_coef = 0.01;
  double vf_coef = 0.5;
  double max_grad_norm = 0.5;
  std::optional<double> target_kl;  // stop the epochs early when approx KL exceeds it
  std::vector<int> hidden_sizes = {64, 64};
  bool bootstrap_truncated = true;  // add gamma * V(final obs) to the reward of truncated steps

  template <class V> void visit(V& v) {
    v("rollout_length", rollout_length, Rule::AtLeast(1));
    v("gamma", gamma, Rule::Between(0, 1));
    v("gae_lambda", gae_lambda, Rule::Between(0, 1));
    v("lr", lr, Rule::Positive());
    v("anneal_lr", anneal_lr);
    v("num_minibatches", num_minibatches, Rule::AtLeast(1));
    v("update_epochs", update_epochs, Rule::AtLeast(1));
    v("norm_adv", norm_adv);
    v("clip_coef", clip_coef, Rule::Positive());
    v("clip_vloss", clip_vloss);
    v("ent_coef", ent_coef, Rule::AtLeast(0));
    v("vf_coef", vf_coef, Rule::AtLeast(0));
    v("max_grad_norm", max_grad_norm, Rule::Positive());
    v("target_kl", target_kl, Rule::Positive());
    v("hidden_sizes", hidden_sizes, Rule::AtLeast(1));
    v("bootstrap_truncated", bootstrap_truncated);
  }
};

struct FarmConfig {
  std::string name = "cartpole";
  uint64_t seed = 1;
  std::string run_dir;  // empty: runs/<name>-<timestamp>
  std::string mode = "sync";  // sync: exact on-policy; async: act on a snapshot while updating
  int64_t total_env_steps = 500000;
  double max_wall_seconds = 0;  // stop after this long (0: no limit)
  std::optional<double> target_return;  // "solved" when the 100-episode mean reaches it
  bool stop_at_target = false;

  EnvConfig env;
  TransportConfig transport;
  BatcherConfig batcher;
  LearnerConfig learner;
  PpoConfig ppo;

  template <class V> void visit(V& v) {
    v("name", name);
    v("seed", seed);
    v("run_dir", run_dir);
    v("mode", mode, Rule::OneOf({"sync", "async"}));
    v("total_env_steps", total_env_steps, Rule::AtLeast(1));
    v("max_wall_seconds", max_wall_seconds, Rule::AtLeast(0));
    v("target_return", target_return);
    v("stop_at_target", stop_at_target);
    v("env", env);
    v("transport", transport);
    v("batcher", batcher);
    v("learner", learner);
    v("ppo", ppo);
  }
};

// Loads `path` (empty: defaults only), then applies each "a.b.c=value"
// override in order (value is parsed as YAML: 1e-3, true, [64, 64]).
Status LoadConfig(const std::string& path, const std::vector<std::string>& overrides, FarmConfig* out);

// Same, from YAML text; `source` names it in error messages.
Status ParseConfig(const std::string& yaml_text, const std::string& source, FarmConfig* out);

// Checks that span several keys (e.g. num_envs divisible by num_groups).
Status ValidateConfig(const FarmConfig& config);

// The resolved config as YAML (every key, defaults included).
std::string DumpConfig(const FarmConfig& config);

}  // namespace farm
