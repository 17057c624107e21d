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

// A bound of the health check of a robot of your own (MujocoConfig::healthy): a named body's height, or a
// named hinge or slide joint's position, within [min, max] (null: no bound on that side).
struct MujocoHealthBound {
  std::string body;   // the body's height: the z of its frame (its free joint's z in qpos, for the root)
  std::string joint;  // or a hinge or slide joint's position (qpos)
  std::optional<double> min;
  std::optional<double> max;

  template <class V> void visit(V& v) {
    v("body", body);
    v("joint", joint);
    v("min", min);
    v("max", max);
  }
};

// A MuJoCo robot of your own (docs/ENVIRONMENTS.md, "Your own robot"): env.name names it (not a built-in env's
// name), `model` is its MJCF file and the rest describes the task, as Gymnasium's locomotion tasks are described
// (worker/envs/mujoco/locomotion.h). Per step:
//   reward = forward_weight * the forward velocity + healthy_reward (while healthy, or always with
//            terminate_when_unhealthy) - ctrl_cost_weight * sum(action^2)
//            - contact_cost_weight * sum(clip(cfrc_ext, contact_force_min, contact_force_max)^2)
//   terminated = terminate_when_unhealthy and not healthy
// Names the model lacks (bodies, joints, sensors) are refused when a worker starts, naming what it has.
struct MujocoConfig {
  std::string model;  // the MJCF file; empty: env.name is a registered env, and the keys below are not used
  int frame_skip = 5;
  int max_episode_steps = 1000;  // 0: no time limit
  // The observation, its parts in this order: qpos (without its first qpos_skip entries), qvel (clipped to
  // +-qvel_clip when > 0), sensors (the readings of `sensors`, every sensor when empty), cfrc_ext (contact forces
  // of every body, clipped to the contact force range), cinert, cvel, qfrc_actuator.
  std::vector<std::string> observation = {"qpos", "qvel"};
  int qpos_skip = 2;  // 2: the root's x and y left out (a free joint), 1: x (a planar robot), 0: none
  double qvel_clip = 0;
  std::vector<std::string> sensors;
  double contact_force_min = -1;
  double contact_force_max = 1;
  std::string action = "clip";  // clip: a control in each actuator's ctrlrange; scale: [-1, 1] onto it
  // The forward velocity: of root_x (qpos[0]), of a body's centre of mass (forward_body), or of the
  // robot's centre of mass (mass_center).
  std::string forward = "body";
  std::string forward_body;  // with forward: body
  double forward_weight = 1;
  double healthy_reward = 1;
  double ctrl_cost_weight = 0;
  double contact_cost_weight = 0;
  bool terminate_when_unhealthy = true;
  std::vector<MujocoHealthBound> healthy;  // all must hold (and every qpos and qvel finite)
  double reset_noise_scale = 0.1;          // qpos0 + U(-s, s); qvel as reset_qvel_noise says
  std::string reset_qvel_noise = "uniform";  // uniform: U(-s, s); normal: s * N(0, 1)
  std::optional<double> reward_threshold;    // the return that counts as solved (null: none)

  template <class V> void visit(V& v) {
    v("model", model);
    v("frame_skip", frame_skip, Rule::AtLeast(1));
    v("max_episode_steps", max_episode_steps, Rule::AtLeast(0));
    v("observation", observation,
      Rule::OneOf({"qpos", "qvel", "sensors", "cfrc_ext", "cinert", "cvel", "qfrc_actuator"}));
    v("qpos_skip", qpos_skip, Rule::AtLeast(0));
    v("qvel_clip", qvel_clip, Rule::AtLeast(0));
    v("sensors", sensors);
    v("contact_force_min", contact_force_min);
    v("contact_force_max", contact_force_max);
    v("action", action, Rule::OneOf({"clip", "scale"}));
    v("forward", forward, Rule::OneOf({"root_x", "body", "mass_center"}));
    v("forward_body", forward_body);
    v("forward_weight", forward_weight);
    v("healthy_reward", healthy_reward);
    v("ctrl_cost_weight", ctrl_cost_weight, Rule::AtLeast(0));
    v("contact_cost_weight", contact_cost_weight, Rule::AtLeast(0));
    v("terminate_when_unhealthy", terminate_when_unhealthy);
    v("healthy", healthy);
    v("reset_noise_scale", reset_noise_scale, Rule::AtLeast(0));
    v("reset_qvel_noise", reset_qvel_noise, Rule::OneOf({"uniform", "normal"}));
    v("reward_threshold", reward_threshold);
  }
};

struct EnvConfig {
  std::string name = "CartPole-v1";
  int num_envs = 8;    // per worker
  int num_groups = 2;  // double buffering: one group steps while the other waits
  std::map<std::string, double> options;  // env-specific, checked against the env's spec
  // Preprocessing on the workers (worker/normalizer.h), with one set of statistics for the whole run (one per
  // policy with `policies`) that the learner merges, checkpoints and exports. normalize_obs: obs' = clip((obs - mean) / sqrt(var + 1e-8),
  // +-obs_clip) with running per-element statistics. normalize_reward: reward' = clip(reward / sqrt(var_G +
  // 1e-8), +-reward_clip), var_G that of each env's running discounted return G = ppo.gamma * G + reward.
  // Episode returns (mean_return_100, target_return) stay the env's raw returns.
  bool normalize_obs = false;
  bool normalize_reward = false;
  double obs_clip = 10;
  double reward_clip = 10;
  // Frame stacking on the workers (worker/env_group.h): each row's observation is the env's last frame_stack
  // observations, oldest first, concatenated along the first axis ([D] -> [k*D], [C, H, W] -> [k*C, H, W]),
  // every frame the reset observation after a reset. 1: off. Normalisation applies to the stacked observation;
  // the global state is not stacked. farm-eval stacks alike; a serving client must stack the same way.
  int frame_stack = 1;
  // Spread the envs over the course of their episodes (Sample Factory's decorrelation): each env's first episode
  // (and its first after a worker's restart) is truncated after a uniformly random number of steps up to the
  // env's time limit, so a rollout holds every stretch of the episodes instead of the same one of each. The cut
  // episodes are truncations (bootstrapped with ppo.bootstrap_truncated) and are not reported in the episode
  // statistics. C++ envs with a time limit only (refused at start otherwise); farm-eval never cuts.
  bool decorrelate_episodes = false;
  // A Python env (docs/ENVIRONMENTS.md, "Python environments"): MODULE:FACTORY, MODULE an importable module or
  // a path to a .py file (a relative one is looked for in the worker's directory, beside the config file, then
  // in the checkout), FACTORY() one env. Set, farm-worker
  // runs the Python worker (python_interpreter -m farm_worker) in its place with this config's settings, and
  // `name`/`options` are not used. Empty: the C++ env `name`.
  std::string python;
  // The interpreter that runs the Python worker. Empty (the default): the first of python3 on PATH and
  // /usr/bin/python3 that can import zmq, google.protobuf and numpy (worker/python_launch.h), the choice said at
  // start; set: that one, refused at start (farm-worker exits 2, naming the fixes) when it lacks a module.
  std::string python_interpreter;
  // A MuJoCo robot of your own, described here (MujocoConfig); env.mujoco.model empty: not used.
  MujocoConfig mujoco;
  // Where the run's Python worker found env.python's code when the run started: the absolute path of its .py file,
  // or, for a module name, the sys.path folder it was imported from. The learner writes it into the run
  // directory's config.yaml from the first worker's Hello; a worker started from a run directory (farm-eval,
  // --resume) looks there first (common/config_files.h). Empty in a config of your own.
  std::string python_found;

  template <class V> void visit(V& v) {
    v("name", name);
    v("python", python);
    v("python_interpreter", python_interpreter);
    v("python_found", python_found);
    v("num_envs", num_envs, Rule::AtLeast(1));
    v("num_groups", num_groups, Rule::Between(1, 64));
    v("options", options);
    v("normalize_obs", normalize_obs);
    v("normalize_reward", normalize_reward);
    v("obs_clip", obs_clip, Rule::Positive());
    v("reward_clip", reward_clip, Rule::Positive());
    v("frame_stack", frame_stack, Rule::Between(1, 64));  // kMaxFrameStack in worker/env_group.h
    v("decorrelate_episodes", decorrelate_episodes);
    v("mujoco", mujoco);
  }
};

struct TransportConfig {
  // Learner's bind address; "*" as port picks a free one (written to run_dir/learner.endpoint).
  std::string bind = "tcp://127.0.0.1:*";
  // Largest message either side accepts (ZMQ_MAXMSGSIZE on the learner's ROUTER and the workers' DEALERs):
  // ZeroMQ closes the connection of a peer that sends more. 64 MiB holds a group of 256 Atari-sized
  // observations (84x84x4 float32) with every env truncated at once; the learner refuses, at the
  // handshake, a worker whose largest message could exceed it (MaxSessionMessageBytes in common/wire.h).
  int64_t max_message_bytes = 64ll << 20;
  double worker_give_up_s = 60;  // a worker exits when the learner is silent this long
  double heartbeat_interval_s = 1.0;  // a side with nothing to send for this long sends a Heartbeat
  double heartbeat_timeout_s = 10.0;  // the learner drops a worker silent for this long
  // Security (docs/OPERATIONS.md, "Security: CURVE keys"). The learner binds a non-loopback address only
  // with curve or insecure. Keys are named by role, so learner and workers can share one config file.
  bool insecure = false;  // allow a non-loopback bind without CURVE: anyone who reaches it may join
  bool curve = false;     // CURVE encryption; the learner admits only the workers whose keys it lists
  std::string curve_learner_secret_key_file;  // learner: its secret key (NAME.key from scripts/farm keygen)
  std::string curve_authorized_keys;          // learner: a file of worker public keys, or a directory of *.pub
  std::string curve_learner_public_key_file;  // workers: the learner's public key (NAME.pub)
  std::string curve_worker_secret_key_file;   // workers: their own secret key

  template <class V> void visit(V& v) {
    v("bind", bind);
    v("max_message_bytes", max_message_bytes, Rule::Between(1024, 2147483647));  // protobuf parses < 2 GiB
    v("worker_give_up_s", worker_give_up_s, Rule::Positive());
    v("heartbeat_interval_s", heartbeat_interval_s, Rule::Positive());
    v("heartbeat_timeout_s", heartbeat_timeout_s, Rule::Positive());
    v("insecure", insecure);
    v("curve", curve);
    v("curve_learner_secret_key_file", curve_learner_secret_key_file);
    v("curve_authorized_keys", curve_authorized_keys);
    v("curve_learner_public_key_file", curve_learner_public_key_file);
    v("curve_worker_secret_key_file", curve_worker_secret_key_file);
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
  // Periodic checkpoints that may fail in a row (a full disk, an unwritable run_dir) before the run stops in
  // order with that reason rather than train on with nothing saved (0: never stop for it). Each failure is
  // logged with the file and the OS's reason and counted in summary.json's checkpoints_failed.
  int max_failed_checkpoints = 3;
  double progress_interval_s = 1.0;
  int min_workers = 1;          // workers that must join before acting
  std::string precision = "fp32";  // fp32 | fp16 (CUDA, with loss scaling) | bf16 (CUDA or CPU autocast)
  // The acting forward's precision: auto (as learner.precision), fp32, fp16 (CUDA) or bf16. Acting in bf16
  // while training in fp32 halves the forward's arithmetic; the behaviour policy's stored log-probs then come
  // from the bf16 forward, and PPO's ratio compares the fp32 policy with it (a difference of the order of bf16's
  // rounding, far inside the clip range).
  std::string acting_precision = "auto";
  bool cuda_graphs = false;        // CUDA only: replay inference from CUDA graphs (batches padded to powers of 2)
  // CUDA only: the inference thread acts on a high-priority stream of its own, so that the GPU schedules the
  // acting forward's kernels ahead of the concurrent PPO update's (false: a normal-priority stream).
  bool acting_high_priority = true;
  bool train = true;               // false: act with the initial (or loaded) policy, never update
  bool random_actions = false;     // uniform random actions, no model: measures transport alone
  std::string init_from;           // a run directory: start from its latest policy (serving, fine-tuning)
  bool resume = false;             // continue run_dir from its latest checkpoint: policy, optimizer, counters
  bool deterministic = false;      // act with the mode (discrete, per component) or mean (box) instead of sampling
  // Serving only (train false): evaluate, stopping once this many episodes have ended on the first worker's envs,
  // spread evenly over them (learner/run/eval_episodes.h), each written to run_dir/episodes.jsonl; 0: off.
  // farm-eval sets it for a Python env's run.
  int eval_episodes = 0;
  // NaN or +-Inf in a request's obs, reward, final_obs or episode returns: reject = answer it with an Error
  // and record nothing; sanitize = replace each by 0, record and act, and warn (once per worker per 10 s).
  std::string non_finite = "reject";
  // The log says when the inference thread has been busy in one thing (a batch, building the policy, a
  // checkpoint) for this long; the I/O thread keeps answering the workers meanwhile.
  double stall_warn_s = 5.0;
  // What the run is expected to hold (policy copies, optimizer, trajectory store, the update's copy, activations;
  // learner/run/memory_budget.h) must fit this many MiB, checked at every Hello: a run that cannot fit stops at its
  // first Hello, a worker that would not fit is refused. 0: the process's own limit (a cgroup's memory.max,
  // ulimit -v) less what it holds at the first Hello, no check without one; -1: no check. On CUDA the policy, optimizer,
  // update and activations are checked against the GPU's free memory instead. At most 2^40 MiB (1 EiB).
  int64_t memory_budget_mb = 0;
  static constexpr double kMaxMemoryBudgetMb = 1099511627776.0;
  // Several learner ranks (data-parallel, DD-PPO: started by torchrun, srun or `scripts/farm train --learners K`;
  // docs/OPERATIONS.md "Several GPUs and machines"). dist_backend: the collectives' engine: auto (NCCL for CUDA
  // where the LibTorch build has it, Gloo otherwise) | gloo | nccl. collective_timeout_s: the rendezvous and each
  // collective wait at most this long for the other ranks (a rank that died or hung stops the others in order
  // after it). rank_check_every: the ranks compare a checksum of their parameters every this many updates (0:
  // never); a difference stops the run naming the update. sync_fraction (sync mode; 0: off): DD-PPO's preemption
  // of stragglers: once this fraction of the ranks has a full rollout, the others end theirs at the step they have
  // reached, if that is at least a quarter of ppo.rollout_length (DD-PPO uses 0.6).
  std::string dist_backend = "auto";
  double collective_timeout_s = 300;
  int rank_check_every = 10;
  double sync_fraction = 0;

  template <class V> void visit(V& v) {
    v("device", device);
    v("precision", precision, Rule::OneOf({"fp32", "fp16", "bf16"}));
    v("acting_precision", acting_precision, Rule::OneOf({"auto", "fp32", "fp16", "bf16"}));
    v("cuda_graphs", cuda_graphs);
    v("acting_high_priority", acting_high_priority);
    v("train", train);
    v("random_actions", random_actions);
    v("init_from", init_from);
    v("resume", resume);
    v("deterministic", deterministic);
    v("eval_episodes", eval_episodes, Rule::AtLeast(0));
    v("non_finite", non_finite, Rule::OneOf({"reject", "sanitize"}));
    v("threads", threads, Rule::AtLeast(1));
    v("checkpoint_every", checkpoint_every, Rule::AtLeast(0));
    v("keep_checkpoints", keep_checkpoints, Rule::AtLeast(0));
    v("max_failed_checkpoints", max_failed_checkpoints, Rule::AtLeast(0));
    v("progress_interval_s", progress_interval_s, Rule::Positive());
    v("min_workers", min_workers, Rule::AtLeast(1));
    v("stall_warn_s", stall_warn_s, Rule::Positive());
    v("memory_budget_mb", memory_budget_mb, Rule::Between(-1, kMaxMemoryBudgetMb));
    v("dist_backend", dist_backend, Rule::OneOf({"auto", "gloo", "nccl"}));
    v("collective_timeout_s", collective_timeout_s, Rule::Positive());
    v("rank_check_every", rank_check_every, Rule::AtLeast(0));
    v("sync_fraction", sync_fraction, Rule::Between(0, 1));
  }
};

// One layer of ppo.conv (the conv encoder, learner/model/encoder.h): channels out, a square kernel, stride and
// padding.
struct ConvLayerConfig {
  int channels = 0;  // required
  int kernel = 3;
  int stride = 1;
  int padding = 0;

  template <class V> void visit(V& v) {
    v("channels", channels, Rule::AtLeast(1));
    v("kernel", kernel, Rule::AtLeast(1));
    v("stride", stride, Rule::AtLeast(1));
    v("padding", padding, Rule::AtLeast(0));
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
  // Box actions: the Gaussian's log-std starts here (0: std 1, CleanRL's and SB3's default); a negative value
  // starts with less noise (rl-zoo's log_std_init). Learned from then on, per action dimension.
  double log_std_init = 0.0;
  // Box actions: generalised state-dependent exploration (gSDE, Raffin et al. 2021; SB3's use_sde with
  // full_std). The action noise is z(s) . (W * sigma), z the actor's last hidden layer (detached), sigma =
  // exp(log_std) a learned [hidden, action] matrix and W standard normal, drawn per env and held for
  // sde_sample_freq of its steps; the log-prob is that of N(mean, sqrt(z^2 . sigma^2 + 1e-6)). Smooth,
  // state-dependent exploration (Pendulum's swing-up). The fused CPU update and learner.cuda_graphs do not
  // train/act with it (auto falls back to the LibTorch update; cuda_graphs is refused).
  bool sde = false;
  int sde_sample_freq = 4;  // env steps each env's noise matrix is held
  // How the actor reads its observation and the critic its input (learner/model/encoder.h): mlp (flattened);
  // for [C, H, W] inputs cnn (the farm's fixed 32/64-channel pair), conv (the layers of `conv`), or impala (the
  // IMPALA ResNet, a stage per entry of impala_channels). An image encoder ends in a Linear to hidden_sizes[0];
  // the trunk takes the rest. activation: the trunk's nonlinearity (and the conv encoder's); layer_norm: a
  // LayerNorm after each of the trunk's Linear layers. The fused CPU update knows only the tanh mlp without
  // layer norm (auto falls back to the LibTorch update).
  std::string encoder = "mlp";
  std::vector<ConvLayerConfig> conv;
  std::vector<int> impala_channels = {16, 32, 32};
  std::string activation = "tanh";
  bool layer_norm = false;
  // Encoders written in PyTorch (learner/model/scripted_encoder.h): a TorchScript file (torch.jit.script(m).save)
  // whose forward maps float32 [B, observation shape...] (the critic's: its input's shape) to features [B, F].
  // It replaces that network's built-in encoder; the trunk of every hidden size, the core and the heads follow.
  // The learner copies the file into the run directory (actor_encoder.pt, critic_encoder.pt), where
  // policy_spec.json names it for farm-eval, farm-export and serving. Empty: the built-in encoder.
  std::string actor_encoder_script;
  std::string critic_encoder_script;
  bool has_encoder_script() const { return !actor_encoder_script.empty() || !critic_encoder_script.empty(); }
  bool bootstrap_truncated = true;  // add gamma * V(final obs) to the reward of truncated steps
  // The fused CPU update (learner/train/ppo_fused.h): auto = use it when the policy is on the CPU in fp32 (the same
  // update as the LibTorch path, several times faster for small MLPs); on = require it (error otherwise);
  // off = always the LibTorch (autograd + torch::optim::Adam) path.
  std::string fused_update = "auto";
  // The graphed update (learner/train/ppo_graph.h): each minibatch step (forward, loss, backward, clip, Adam)
  // replayed from a CUDA graph instead of launched kernel by kernel. auto = on a CUDA device in fp32 or bf16
  // when the minibatches are of equal size; on = whenever it can run (on the CPU the same static step runs
  // without a graph: for tests); off = the LibTorch path. The first update of a run is always LibTorch's.
  std::string graph_update = "auto";
  // Memory (learner/model/recurrent_core.h): none, or a gru or lstm core of core_size units between the encoder
  // and the heads. The learner keeps each agent row's state (workers stay model-free); the update re-runs the
  // core over chunks of bptt steps from the state the acting policy had at each chunk's start. bptt must divide
  // rollout_length. critic_core: the critic has a core (and state) of its own, as MAPPO's; false: a feed-forward
  // critic. CUDA-graphed acting and the fused and graphed updates have no core (refused, or auto falls back).
  std::string core = "none";
  int core_size = 64;
  int bptt = 0;  // 0: the whole rollout (Sample Factory's default); else it must divide rollout_length
  bool critic_core = true;
  // How the cores' gate biases start: chrono (Tallec & Ollivier 2018: timescales drawn log-uniformly up to the
  // chunk length, so that long dependencies are learned at all; MemoryCue with a 64-step delay stays at chance
  // without it) or zero.
  std::string core_init = "chrono";
  // The steps the update trains through in one chunk: how far back a gradient reaches.
  int chunk_steps() const { return bptt > 0 ? bptt : rollout_length; }
  // Advantages and value targets (learner/train/vtrace.h): gae from the values at acting time (CleanRL's), or
  // vtrace, IMPALA's off-policy correction from the ratio of the policy being trained to the behaviour policy
  // (the log-probs stored at acting), computed once at the update's start, under the PPO clipped loss as in
  // Sample Factory's APPO; its lambda is gae_lambda. rho_bar clips the ratios of the TD terms, c_bar those of
  // the traces; the advantage of a step's own action takes no ratio (PPO's loss weights it already).
  std::string advantage = "gae";
  double vtrace_rho_bar = 1.0;
  double vtrace_c_bar = 1.0;
  // Samples acted on by a policy more than this many updates older than the one trained are left out of the
  // loss (whole units: an env's agents together, a whole chunk through the core when any of its steps is too
  // old), and the update's learning rate is scaled by the fraction of samples kept, as Sample Factory's
  // max_policy_lag. Every sample still informs the others' advantages and targets. Unset: off. The farm's
  // async lag is at most 1 (a rollout that fills while the trainer is busy waits for it), so 0 (train on
  // the current policy's samples alone) is the setting that drops anything today.
  std::optional<int> max_policy_lag;
  // Value normalisation (learner/train/value_norm.h), as MAPPO trains: none; running (MAPPO's ValueNorm: the critic
  // learns (return - mean) / std with running statistics, and its values are de-normalised wherever they are used);
  // popart (the same statistics, and the critic's last layer rescaled so that its de-normalised outputs do not
  // move with them). The fused CPU update has none: ppo.fused_update=auto falls back to the LibTorch update (the
  // CUDA-graph step takes it).
  std::string value_norm = "none";
  // Agents that finish before their env ends (StepRequest.active): true leaves their rows out of the policy, value
  // and entropy terms and of the advantage normalisation, as MAPPO's active masks (its default); false trains them
  // as if they acted (MAPPO's use_active_masks off). Either way an agent's last active step is an end of its own for
  // GAE and V-trace. The fused and graphed updates have no mask: a rollout with one takes the LibTorch update.
  bool active_masks = true;

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
    v("log_std_init", log_std_init, Rule::Between(-10, 2));
    v("sde", sde);
    v("sde_sample_freq", sde_sample_freq, Rule::AtLeast(1));
    v("encoder", encoder, Rule::OneOf({"mlp", "cnn", "conv", "impala"}));
    v("conv", conv);
    v("impala_channels", impala_channels, Rule::AtLeast(1));
    v("activation", activation, Rule::OneOf({"tanh", "relu", "elu", "silu"}));
    v("layer_norm", layer_norm);
    v("actor_encoder_script", actor_encoder_script);
    v("critic_encoder_script", critic_encoder_script);
    v("bootstrap_truncated", bootstrap_truncated);
    v("fused_update", fused_update, Rule::OneOf({"auto", "on", "off"}));
    v("graph_update", graph_update, Rule::OneOf({"auto", "on", "off"}));
    v("core", core, Rule::OneOf({"none", "gru", "lstm"}));
    v("core_size", core_size, Rule::AtLeast(1));
    v("bptt", bptt, Rule::AtLeast(0));
    v("core_init", core_init, Rule::OneOf({"chrono", "zero"}));
    v("critic_core", critic_core);
    v("advantage", advantage, Rule::OneOf({"gae", "vtrace"}));
    v("vtrace_rho_bar", vtrace_rho_bar, Rule::Positive());
    v("vtrace_c_bar", vtrace_c_bar, Rule::Positive());
    v("max_policy_lag", max_policy_lag, Rule::AtLeast(0));
    v("value_norm", value_norm, Rule::OneOf({"none", "running", "popart"}));
    v("active_masks", active_masks);
  }
};

// One policy of a run with several (the `policies:` list): the agents it acts for and trains, and how its learner
// differs from the run's. Each policy is served and trained by a farm-learner of its own (PolicyRunConfig), with run
// directory run_dir/NAME; the worker maps each agent to the first policy whose pattern matches its name (a C++
// env's agents, and a Python array env's, are named by index: worker/policy_split.h,
// worker/python/farm_worker/policies.py).
struct PolicyConfig {
  std::string name;                 // letters, digits, '_', '-', '.'; unique in the run
  std::vector<std::string> agents;  // agent names or fnmatch patterns ("adversary_*"); "0", "[0-4]" by index
  bool trainable = true;            // false: served only (learner.train false), e.g. a frozen opponent
  std::string init_from;            // a run directory (a policy's): start from its latest policy
  std::vector<std::string> set;     // this policy's learner's overrides, as --set: "ppo.lr=3e-4" (ppo, learner, batcher)

  template <class V> void visit(V& v) {
    v("name", name);
    v("agents", agents);
    v("trainable", trainable);
    v("init_from", init_from);
    v("set", set);
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
  // Several policies, each with a learner of its own (PolicyConfig); empty: one policy for every agent.
  std::vector<PolicyConfig> policies;

  // Not keys: where this config was read from (LoadConfig sets them), for finding the files it names
  // (common/config_files.h). source_dir: the config file's folder, absolute (empty: no file); in_run_dir: the file
  // is a run directory's config.yaml (its folder holds checkpoints/). given: the dotted keys the file and the
  // --set overrides gave, for the defaults that depend on other keys (kCoreDefaults).
  std::string source_dir;
  bool in_run_dir = false;
  std::vector<std::string> given;
  // Not a key: where learner.resume finds the checkpoints (the other ranks resume from rank 0's run directory);
  // empty: run_dir/checkpoints. ResumeCheckpoints() says which.
  std::string resume_checkpoints;
  std::string ResumeCheckpoints() const {
    return resume_checkpoints.empty() ? run_dir + "/checkpoints" : resume_checkpoints;
  }

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
    v("policies", policies);
  }
};

// The defaults of a policy with a core (ppo.core gru or lstm), for each of these keys the config does not give:
// chosen on the memory tasks (records/performance-history.md, "Policies with memory: the defaults"). A longer
// rollout, so that a chunk trained through (ppo.bptt: the whole rollout by default) spans long dependencies, and a
// larger learning rate than the MLP's.
struct CoreDefaults {
  int rollout_length = 128;
  double lr = 1e-3;
};
inline constexpr CoreDefaults kCoreDefaults{};

// Loads `path` (empty: defaults only), then applies each "a.b.c=value"
// override in order (value is parsed as YAML: 1e-3, true, [64, 64]); then, with a core, kCoreDefaults for the
// keys neither gave.
Status LoadConfig(const std::string& path, const std::vector<std::string>& overrides, FarmConfig* out);

// Sets config's source_dir and in_run_dir for a config read from `path` (LoadConfig does it; a config parsed from
// text another way, such as a checkpoint's, is given its run directory's config.yaml path).
void NoteConfigSource(const std::string& path, FarmConfig* config);

// Same, from YAML text; `source` names it in error messages.
Status ParseConfig(const std::string& yaml_text, const std::string& source, FarmConfig* out);

// Checks that span several keys (e.g. num_envs divisible by num_groups).
Status ValidateConfig(const FarmConfig& config);

// The config of policy `name`'s learner in a run with several policies: `run` with the policy's `set` overrides
// applied (then the core defaults, as LoadConfig), no `policies`, run_dir run.run_dir/NAME, name run.name-NAME,
// learner.train false when the policy is not trainable, learner.init_from its init_from when given. NotFound naming
// the run's policies when it has none of that name; InvalidArgument naming the override or key otherwise (run_dir
// must be set: the learners of a run share it).
Status PolicyRunConfig(const FarmConfig& run, const std::string& name, FarmConfig* out);

// The resolved config as YAML (every key, defaults included).
std::string DumpConfig(const FarmConfig& config);

}  // namespace farm
