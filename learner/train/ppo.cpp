// PPO as CleanRL's ppo.py does it: GAE, per-epoch shuffled minibatches, clipped surrogate and value loss,
// entropy bonus, global grad-norm clip, linear LR annealing, optional target-KL early stop.
#include "learner/train/ppo.h"

#include <spdlog/spdlog.h>

#include "learner/model/cuda_graph.h"
#include "learner/train/gradient_reducer.h"
#include "learner/train/ppo_chunks.h"
#include "learner/train/ppo_fused.h"
#include "learner/train/ppo_graph.h"
#include "learner/train/value_norm.h"
#include "learner/train/vtrace.h"
#include "common/update_paths.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>

namespace farm {
namespace {

constexpr double kAdamEps = 1e-5;

// Minibatch statistics accumulated as one tensor (one op per minibatch, one host sync per update).
enum StatIndex : int64_t { kPolicyLoss, kValueLoss, kEntropy, kApproxKl, kOldApproxKl, kClipFraction, kNumStats };

// The loss statistics from their per-minibatch means (float64 [kNumStats], any device): one host sync.
void SetMeans(const torch::Tensor& means, PpoStats* stats) {
  const torch::Tensor host = means.cpu();
  const double* m = host.data_ptr<double>();
  stats->policy_loss = m[kPolicyLoss];
  stats->value_loss = m[kValueLoss];
  stats->entropy = m[kEntropy];
  stats->approx_kl = m[kApproxKl];
  stats->old_approx_kl = m[kOldApproxKl];
  stats->clip_fraction = m[kClipFraction];
}

// How well the rollout's values (as acted) predicted its returns: explained variance 1 - var(y - pred) / var(y)
// (population variances; NaN when the returns do not vary, where it is undefined), and the spread of each.
void SetValueFit(const torch::Tensor& pred, const torch::Tensor& y, PpoStats* stats) {
  // The three variances in one read from the device (this runs once per update).
  const torch::Tensor v =
      torch::stack({y.var(/*unbiased=*/false), (y - pred).var(/*unbiased=*/false), pred.var(/*unbiased=*/false)})
          .to(torch::kCPU, torch::kDouble);
  const double var_y = v[0].item<double>();
  stats->explained_variance =
      var_y == 0 ? std::numeric_limits<double>::quiet_NaN() : 1.0 - v[1].item<double>() / var_y;
  stats->value_std = std::sqrt(v[2].item<double>());
  stats->return_std = std::sqrt(var_y);
}

// The units (rows; runs of k rows; chunks with their k columns) whose every sample's lag is at most
// max_lag, as int64 indices; undefined when all are (or there is no max_lag, or the rollout has no lags).
torch::Tensor UnitsWithinLag(const Rollout& rollout, int64_t k, bool recurrent, std::optional<int> max_lag) {
  if (!max_lag || !rollout.lag.defined()) return {};
  torch::Tensor lag = rollout.lag.to(torch::kCPU, torch::kLong);
  // Per unit, its oldest sample: rows [T * N] -> [units, k]; chunks [L, C * N] -> [C * N / k, k * L].
  const torch::Tensor per_unit = recurrent ? std::get<0>(ToChunks(lag, rollout.bptt, torch::kCPU).max(0))
                                                 .view({-1, k})
                                                 .amax(1)
                                           : lag.flatten().view({-1, k}).amax(1);
  const torch::Tensor within = per_unit <= *max_lag;
  if (within.all().item<bool>()) return {};
  return within.nonzero().flatten();
}

}  // namespace

namespace {

torch::Device PolicyDevice(const ActorCritic& policy) {
  const std::vector<torch::Tensor> params = policy->parameters();
  if (params.empty()) throw std::invalid_argument("PpoTrainer: the policy has no parameters");
  return params.front().device();
}

LossScaler::Options ScalerOptions(Precision precision) {
  LossScaler::Options options;
  options.enabled = precision == Precision::kFp16;  // bf16 has fp32's exponent range: no scaling needed
  return options;
}

}  // namespace

PpoTrainer::PpoTrainer(ActorCritic policy, const PpoConfig& config, uint64_t seed, Precision precision)
    : policy_(std::move(policy)),
      config_(config),
      precision_(precision),
      device_(PolicyDevice(policy_)),
      optimizer_(std::make_unique<torch::optim::Adam>(policy_->parameters(),
                                                      torch::optim::AdamOptions(config.lr).eps(kAdamEps))),
      scaler_(ScalerOptions(precision)),
      generator_(at::make_generator<at::CPUGeneratorImpl>(seed)),
      reducer_(std::make_shared<OneRankReducer>()) {
  if (auto s = CheckPrecision(precision_, device_); !s.ok()) throw std::invalid_argument("PpoTrainer: " + s.message());
  const std::string& mode = config_.fused_update;
  if (mode != "auto" && mode != "on" && mode != "off")
    throw std::invalid_argument("PpoTrainer: ppo.fused_update must be auto, on or off, got '" + mode + "'");
  if (policy_->value_normalised()) {
    ValueNormalizer::Mode m;
    if (auto s = ValueNormalizer::ParseMode(config_.value_norm, &m); !s.ok())
      throw std::invalid_argument("PpoTrainer: " + s.message() + " (the policy was built with value normalisation)");
    value_norm_ = std::make_unique<ValueNormalizer>(policy_, m);
  } else if (config_.value_norm != "none") {
    throw std::invalid_argument("PpoTrainer: ppo.value_norm is " + config_.value_norm +
                                ", but the policy was built without value normalisation (PolicyOptions::value_norm)");
  }
  const std::string& graph = config_.graph_update;
  if (graph != "auto" && graph != "on" && graph != "off")
    throw std::invalid_argument("PpoTrainer: ppo.graph_update must be auto, on or off, got '" + graph + "'");
  needs_ = PolicyNeeds();
  ChoosePaths();
}

UpdateNeeds PpoTrainer::PolicyNeeds() const {
  UpdateNeeds n;
  const PolicyOptions& o = policy_->options();
  if (policy_->has_core()) n.Ask(UpdateNeed::kCore, std::string("ppo.core=") + CoreName(o.core));
  if (policy_->has_global_state()) n.Ask(UpdateNeed::kCentralisedCritic, "a critic on the env's global state");
  if (value_norm_) n.Ask(UpdateNeed::kValueNorm, "ppo.value_norm=" + config_.value_norm);
  if (o.sde) n.Ask(UpdateNeed::kSde, "ppo.sde");
  if (o.has_encoder_script()) n.Ask(UpdateNeed::kEncoderScript, "ppo.actor_encoder_script or ppo.critic_encoder_script");
  if (policy_->encoder() != Encoder::kMlp) n.Ask(UpdateNeed::kEncoder, EncoderName(policy_->encoder()));
  if (o.layout.activation != Activation::kTanh)
    n.Ask(UpdateNeed::kActivation, std::string("ppo.activation is ") + ActivationName(o.layout.activation));
  if (o.layout.layer_norm) n.Ask(UpdateNeed::kLayerNorm, "ppo.layer_norm is true");
  if (precision_ == Precision::kBf16) n.Ask(UpdateNeed::kBf16, "learner.precision=bf16");
  if (precision_ == Precision::kFp16) n.Ask(UpdateNeed::kFp16, "learner.precision=fp16");
  if (device_.is_cuda()) n.Ask(UpdateNeed::kCuda, "learner.device=" + device_.str());
  return n;
}

void PpoTrainer::ChoosePaths() {
  // The fused update: the table (common/update_paths.h), then its own check of the policy's layout.
  const std::string& mode = config_.fused_update;
  Status fused = mode == "off" ? Status::InvalidArgument("ppo.fused_update is off") : CheckUpdatePath(UpdatePath::kFused, needs_);
  if (fused.ok()) fused = CheckFusedUpdate(*policy_);
  if (!fused.ok() && mode == "on")
    throw std::invalid_argument("PpoTrainer: " + fused.message() +
                                " (ppo.fused_update is on: set it to auto to fall back to the LibTorch update)");
  if (!fused.ok()) {
    if (fused_ && mode == "auto") spdlog::info("ppo.fused_update=auto: the LibTorch update, since {}", fused.message());
    fused_.reset();
  } else if (!fused_) {
    fused_ = std::make_unique<FusedPpoUpdate>(policy_, config_);
  }
  // The graphed step, for the LibTorch path: the table, then Adam's options.
  const std::string& graph = config_.graph_update;
  use_graph_ = false;
  if (fused_ || graph == "off") {
    graphed_.reset();
    return;
  }
  Status s = CheckUpdatePath(UpdatePath::kGraphed, needs_);
  if (s.ok()) s = GraphedPpoStep::Check(*optimizer_);
  if (graph == "auto" && device_.is_cuda() && !s.ok())
    spdlog::info("ppo.graph_update=auto: the LibTorch update, since {}", s.message());
  if (graph == "on" && !s.ok())
    throw std::invalid_argument("PpoTrainer: " + s.message() + " (ppo.graph_update is on: set it to auto or off)");
  use_graph_ = s.ok() && (graph == "on" || device_.is_cuda());
  if (!use_graph_) graphed_.reset();
}

int PpoTrainer::graph_captures() const { return graphed_ ? graphed_->captures() : 0; }

void PpoTrainer::SetReducer(std::shared_ptr<GradientReducer> reducer) {
  if (!reducer) throw std::invalid_argument("PpoTrainer::SetReducer: no reducer");
  if (reducer->alone()) {
    needs_.Drop(UpdateNeed::kRanks);
  } else {
    needs_.Ask(UpdateNeed::kRanks, std::to_string(reducer->size()) + " learner ranks");
  }
  reducer_ = std::move(reducer);
  synced_ = false;
  ChoosePaths();
}

PpoTrainer::~PpoTrainer() = default;

// What PlanUpdate decides before any data moves.
struct PpoTrainer::Plan {
  int64_t steps = 0, envs = 0, batch = 0;
  int64_t k = 1;              // rows per state: minibatches take whole runs of k rows (units)
  bool recurrent = false;     // units are chunks of rollout.bptt steps through the core
  int64_t units = 0;          // T * N / k, or T * N / k / bptt with a core
  int64_t units_kept = 0;     // within ppo.max_policy_lag
  torch::Tensor kept;         // their indices on the device (undefined: all)
  int64_t num_minibatches = 0;
  torch::Device device{torch::kCPU};
};

// The rollout on the device, flattened to rows (and chunks, with a core), with its advantages and targets.
struct PpoTrainer::Batch {
  PpoRows rows;
  PpoChunks chunks;
  bool advantages_normalised = false;  // over every rank's rollout (ranks): the minibatches do not normalise again
  // The acting values and the returns at the returns' scale, for the explained variance (the rows' are normalised
  // with ppo.value_norm).
  torch::Tensor fit_values, fit_returns;
};

PpoTrainer::Plan PpoTrainer::PlanUpdate(const Rollout& rollout, double progress, PpoStats* stats) const {
  if (!rollout.rewards.defined() || rollout.rewards.dim() != 2) {
    throw std::invalid_argument("PpoTrainer::Update: rewards must be [T, N]");
  }
  Plan plan;
  const int64_t steps = plan.steps = rollout.rewards.size(0);
  const int64_t envs = plan.envs = rollout.rewards.size(1);
  const int64_t batch = plan.batch = steps * envs;
  if (batch == 0) throw std::invalid_argument("PpoTrainer::Update: empty rollout");
  if (!rollout.obs.defined() || rollout.obs.dim() < 2 || rollout.obs.size(0) != steps || rollout.obs.size(1) != envs) {
    throw std::invalid_argument("PpoTrainer::Update: obs must be [T, N, obs...] with T=" + std::to_string(steps) +
                                ", N=" + std::to_string(envs));
  }
  if (!rollout.actions.defined() || rollout.actions.dim() < 2 || rollout.actions.size(0) != steps ||
      rollout.actions.size(1) != envs) {
    throw std::invalid_argument("PpoTrainer::Update: actions must be [T, N] or [T, N, A]");
  }
  RequireShape(rollout.logp, rollout.rewards.sizes(), "PpoTrainer::Update: logp");
  // k rows per state: sample whole runs of k rows (units), so that each minibatch's critic sees each state once.
  const int64_t k = plan.k = rollout.states.defined() ? rollout.rows_per_state : 1;
  if (k < 1 || envs % k != 0)
    throw std::invalid_argument("PpoTrainer::Update: rows_per_state " + std::to_string(k) + " must divide N=" +
                                std::to_string(envs));
  if (policy_->has_global_state() != rollout.states.defined() ||
      (rollout.states.defined() &&
       (rollout.states.dim() < 2 || rollout.states.size(0) != steps || rollout.states.size(1) != envs / k))) {
    throw std::invalid_argument(policy_->has_global_state()
                                    ? "PpoTrainer::Update: the critic takes a global state: states must be [T, N / "
                                      "rows_per_state, state...] with T=" + std::to_string(steps) + ", N=" +
                                      std::to_string(envs) + ", rows_per_state=" + std::to_string(k)
                                    : "PpoTrainer::Update: states given, but the policy has no global state");
  }
  // With a core the units are chunks of rollout.bptt steps (runs of k of them): T / bptt per row.
  plan.recurrent = policy_->has_core();
  plan.units = plan.recurrent && rollout.bptt > 0 ? batch / k / rollout.bptt : batch / k;
  plan.device = policy_->parameters().front().device();

  stats->learning_rate = config_.anneal_lr ? config_.lr * (1.0 - std::clamp(progress, 0.0, 1.0)) : config_.lr;
  // ppo.max_policy_lag: the units the loss keeps (undefined: all), and the learning rate scaled by their share.
  const torch::Tensor kept_host = UnitsWithinLag(rollout, k, plan.recurrent, config_.max_policy_lag);
  plan.units_kept = kept_host.defined() ? kept_host.size(0) : plan.units;
  plan.kept = kept_host.defined() ? kept_host.to(plan.device) : torch::Tensor();
  stats->samples = plan.units_kept * (batch / plan.units);
  stats->lag_dropped = batch - stats->samples;
  if (rollout.active.defined()) {
    RequireShape(rollout.active, rollout.rewards.sizes(), "PpoTrainer::Update: active");
    if (config_.active_masks) stats->masked_rows = (rollout.active.detach() == 0).sum().item<int64_t>();
  }
  // The learning rate scaled by the share of samples kept (over every rank's samples). Minibatches of near-equal
  // size (they differ by at most one unit) that cover the whole batch every epoch; ranks take the same number of
  // minibatches on every rank (a rank with fewer units than minibatches takes empty ones: its gradient counts for
  // nothing in them).
  // (kept rows / rows is exactly kept units / units for one rank: the same real quotient, rounded once.)
  const int64_t rows_per_unit = batch / plan.units;
  const std::vector<double> sums =
      reducer_->Sum({static_cast<double>(plan.units_kept * rows_per_unit), static_cast<double>(batch)});
  stats->learning_rate *= sums[1] > 0 ? sums[0] / sums[1] : 0.0;
  plan.num_minibatches = reducer_->alone() ? std::min<int64_t>(config_.num_minibatches, plan.units_kept)
                                           : config_.num_minibatches;
  return plan;
}

PpoTrainer::Batch PpoTrainer::Prepare(const Rollout& acted, const Plan& plan, PpoStats* stats) {
  const torch::Device device = plan.device;
  // Agents that finished before their env ended: their last step is an end of its own, and nothing after it flows
  // back. With ppo.active_masks off their rows then train as if they acted (every figure below reads them too).
  Rollout rollout = BootstrapFinishedAgents(acted, config_.gamma, config_.bootstrap_truncated);
  // From here on the mask is always there (ones where every agent acted, or with ppo.active_masks off): the loss,
  // the advantage moments and the counts of every path have one arithmetic.
  if (!config_.active_masks || !rollout.active.defined()) rollout.active = torch::ones_like(rollout.rewards);
  const Advantages gae = ComputeGae(rollout.rewards, rollout.values, rollout.dones, rollout.last_value,
                                    config_.gamma, config_.gae_lambda);
  // Flatten T x N into one batch; detach so that the rollout never enters the graph.
  const auto flat = [&](const torch::Tensor& t) { return t.detach().flatten(0, 1).to(device); };
  Batch b;
  b.rows = PpoRows{flat(rollout.obs),
                   rollout.states.defined() ? flat(rollout.states) : torch::Tensor(),
                   flat(rollout.actions),
                   flat(rollout.logp).to(torch::kFloat32),
                   flat(rollout.values).to(torch::kFloat32),
                   flat(gae.advantages),
                   flat(gae.returns),
                   flat(rollout.active).to(torch::kFloat32)};
  if (plan.recurrent) b.chunks = MakeChunks(rollout, gae, device);

  // V-trace: the advantages and targets of the policy as it is at the update's start (vtrace.h says why once), in
  // place of GAE's in the rows and the chunks, for every epoch and every update path.
  if (config_.advantage == "vtrace") {
    VtraceCorrection vtrace(rollout, config_);
    Advantages a;
    if (plan.recurrent) {
      const auto [logp, value] = EvaluateChunks(*policy_, b.chunks, plan.k, precision_);
      a = vtrace.Compute(FromChunks(logp, plan.steps), FromChunks(value, plan.steps));
      b.chunks.advantages.copy_(ToChunks(a.advantages, rollout.bptt, device));
      b.chunks.returns.copy_(ToChunks(a.returns, rollout.bptt, device));
    } else {
      const auto [logp, value] = EvaluateRows(*policy_, b.rows, plan.k, precision_);
      a = vtrace.Compute(logp.view({plan.steps, plan.envs}), value.view({plan.steps, plan.envs}));
    }
    b.rows.advantages.copy_(a.advantages.flatten());
    b.rows.returns.copy_(a.returns.flatten());  // the explained variance's targets too
    const VtraceStats v = vtrace.stats();
    stats->vtrace = true;
    stats->vtrace_ratio = v.ratio_mean;
    stats->vtrace_rho_clipped = v.rho_clipped;
    stats->vtrace_c_clipped = v.c_clipped;
  }
  // The rows of finished agents predict nothing the explained variance should see.
  const torch::Tensor acting = b.rows.active > 0;
  b.fit_values = b.rows.values.masked_select(acting);
  b.fit_returns = b.rows.returns.masked_select(acting);
  if (value_norm_) NormaliseValues(&b, stats);
  // Ranks normalise the advantages once per update over every rank's rollout (DD-PPO), a learner alone per minibatch.
  if (!reducer_->alone() && config_.norm_adv) NormaliseAcrossRanks(plan, &b);
  return b;
}

void PpoTrainer::NormaliseValues(Batch* b, PpoStats* stats) {
  std::vector<double> m = ValueNormalizer::Moments(b->fit_returns);  // the acting rows' returns
  m = reducer_->Sum(m);  // every rank's returns: the statistics stay one set
  value_norm_->Update(m[0], m[1], m[2]);
  // Out of place: fit_values and fit_returns keep the returns' scale.
  b->rows.values = policy_->NormalizedValue(b->rows.values);
  b->rows.returns = policy_->NormalizedValue(b->rows.returns);
  if (b->chunks.values.defined()) {
    b->chunks.values = policy_->NormalizedValue(b->chunks.values);
    b->chunks.returns = policy_->NormalizedValue(b->chunks.returns);
  }
  stats->value_norm = true;
  stats->value_norm_mean = value_norm_->mean();
  stats->value_norm_std = value_norm_->std();
}

void PpoTrainer::NormaliseAcrossRanks(const Plan& plan, Batch* b) {
  // The moments of the kept samples' advantages over every rank: (adv - mean) / (unbiased std + eps), the
  // arithmetic ComputePpoLoss applies to a minibatch, applied to the rows and the chunks alike.
  // Rows of finished agents (Rollout::active) count for nothing, as in the minibatch's own normalisation.
  torch::Tensor kept_adv, kept_active;
  if (!plan.kept.defined()) {
    kept_adv = b->rows.advantages;
    kept_active = b->rows.active;
  } else {
    const torch::Tensor arange_k = torch::arange(plan.k, torch::TensorOptions().dtype(torch::kLong).device(plan.device));
    const torch::Tensor idx = UnitRows(plan.kept, plan.k, arange_k);
    kept_adv = plan.recurrent ? b->chunks.advantages.index_select(1, idx) : b->rows.advantages.index_select(0, idx);
    kept_active = plan.recurrent ? b->chunks.active.index_select(1, idx) : b->rows.active.index_select(0, idx);
  }
  const torch::Tensor a = kept_adv.to(torch::kFloat64);
  const torch::Tensor w = kept_active.to(torch::kFloat64);
  const torch::Tensor local = torch::stack({w.sum(), (a * w).sum(), (a.square() * w).sum()}).cpu();
  const std::vector<double> m = reducer_->Sum({local[0].item<double>(), local[1].item<double>(), local[2].item<double>()});
  const double n = m[0];
  if (n < 1) return;
  const double mean = m[1] / n;
  const double var = n > 1 ? std::max(0.0, (m[2] - n * mean * mean) / (n - 1)) : 0.0;
  const double denom = n > 1 ? std::sqrt(var) + kAdvantageEps : 1.0;
  b->rows.advantages.sub_(mean).div_(denom);
  if (b->chunks.advantages.defined()) b->chunks.advantages.sub_(mean).div_(denom);
  b->advantages_normalised = true;
}

void PpoTrainer::RunFused(const Batch& b, const Plan& plan, PpoStats* stats, const std::atomic<bool>* cancel) {
  const PpoRows& rows = b.rows;
  PpoBatch batch_in{rows.obs,    rows.actions, rows.logp,   rows.values,
                    rows.advantages, rows.returns, rows.active, b.advantages_normalised};
  if (plan.kept.defined()) {  // rows (the fused update has k = 1): the kept ones alone
    for (torch::Tensor* t : {&batch_in.obs, &batch_in.actions, &batch_in.logp, &batch_in.values,
                             &batch_in.advantages, &batch_in.returns, &batch_in.active})
      if (t->defined()) *t = t->index_select(0, plan.kept);
  }
  fused_->Run(batch_in, generator_, *optimizer_, *reducer_, stats, cancel);
}

bool PpoTrainer::RunGraphed(const Batch& b, const Plan& plan, PpoStats* stats, const std::atomic<bool>* cancel) {
  // The graphed step needs minibatches of one size, and Adam's state (made by a first LibTorch update).
  if (plan.recurrent || plan.kept.defined() || !use_graph_ || plan.units % plan.num_minibatches != 0 ||
      !GraphedPpoStep::HasOptimizerState(*optimizer_))
    return false;
  if (!graphed_)
    graphed_ = std::make_unique<GraphedPpoStep>(policy_, config_, precision_, optimizer_.get(), plan.device.is_cuda());
  const int64_t per_minibatch = plan.units / plan.num_minibatches;
  graphed_->Begin(b.rows, plan.k, per_minibatch, stats->learning_rate);
  for (int epoch = 0; epoch < config_.update_epochs; ++epoch) {
    const torch::Tensor perm = Permutation(plan.units_kept, plan.device);
    for (int64_t mb = 0; mb < plan.num_minibatches; ++mb) {
      graphed_->Step(perm.slice(0, mb * per_minibatch, (mb + 1) * per_minibatch));
      if (cancel && cancel->load(std::memory_order_relaxed)) {
        stats->cancelled = true;
        break;
      }
    }
    ++stats->epochs;
    if (stats->cancelled) break;
    if (config_.target_kl && graphed_->last_approx_kl().item<double>() > *config_.target_kl) break;
  }
  const GraphedPpoStep::Sums sums = graphed_->End();
  if (sums.steps == 0) return true;  // every minibatch without an acting row: no step, no statistics
  SetMeans(sums.stats / static_cast<double>(sums.steps), stats);
  stats->grad_norm = sums.grad_norm.item<double>() / static_cast<double>(sums.steps);
  ++graphed_updates_;
  return true;
}

void PpoTrainer::RunMinibatches(const Batch& b, const Plan& plan, PpoStats* stats, const std::atomic<bool>* cancel) {
  const torch::Device device = plan.device;
  const std::vector<torch::Tensor> params = policy_->parameters();
  torch::Tensor stat_sums = torch::zeros({kNumStats}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
  const torch::Tensor arange_k = torch::arange(plan.k, torch::TensorOptions().dtype(torch::kLong).device(device));
  double grad_norm_sum = 0;
  // On CUDA the grad norms add up on the device (no sync per minibatch); read once at the end.
  torch::Tensor grad_norm_device = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
  int64_t minibatches_with_loss = 0;  // ranks: a rank's empty minibatches have no loss of their own
  int64_t steps_run = 0;  // minibatches whose optimizer step ran (fp16 skips steps with inf/NaN grads)
  PpoConfig loss_config = config_;
  if (b.advantages_normalised) loss_config.norm_adv = false;  // done over every rank's rollout in Prepare
  // Each unit's acting rows (a unit is k rows, or k chunk columns of L steps), once per update; an epoch's order of
  // them is summed into one prefix sum read once, from which each minibatch's count comes without indexing its mask.
  const torch::Tensor unit_acting =
      (plan.recurrent ? b.chunks.active.sum(0) : b.rows.active).view({-1, plan.k}).sum(1).to(torch::kLong);
  for (int epoch = 0; epoch < config_.update_epochs; ++epoch) {
    const torch::Tensor perm = Permutation(plan.units_kept, device);
    // int64 [units_kept + 1] on the host: acting rows of the epoch's first i units.
    const torch::Tensor order = plan.kept.defined() ? plan.kept.index_select(0, perm) : perm;
    const torch::Tensor acting_prefix =
        torch::cat({torch::zeros({1}, unit_acting.options()), unit_acting.index_select(0, order).cumsum(0)}).cpu();
    const int64_t* acting_before = acting_prefix.data_ptr<int64_t>();
    torch::Tensor last_approx_kl;
    int64_t last_samples = 0;
    for (int64_t mb = 0; mb < plan.num_minibatches; ++mb) {
      const int64_t begin = mb * plan.units_kept / plan.num_minibatches;
      const int64_t end = (mb + 1) * plan.units_kept / plan.num_minibatches;
      const torch::Tensor drawn = perm.slice(0, begin, end);
      const torch::Tensor unit_idx = plan.kept.defined() ? plan.kept.index_select(0, drawn) : drawn;
      // The rows that count: the minibatch's loss is their mean.
      const int64_t acting = acting_before[end] - acting_before[begin];
      // Nothing acts in it: no step (Adam's momentum would still move the parameters), no statistics. Ranks still
      // take their part in the others' step.
      if (acting == 0 && reducer_->alone()) continue;
      optimizer_->zero_grad();
      PpoLoss loss;
      if (end > begin) {
        loss = plan.recurrent
                   ? ChunkMinibatchLoss(*policy_, b.chunks, unit_idx, plan.k, arange_k, precision_, loss_config)
                   : MinibatchLoss(*policy_, b.rows, unit_idx, plan.k, arange_k, precision_, loss_config);
        // Backward outside the autocast region (as PyTorch recommends); the scaler is the identity unless fp16.
        scaler_.Scale(loss.total).backward();
      }
      // Ranks: the scaled gradients (every rank's scale is the same), so an inf/NaN of one rank reaches all and every
      // rank skips the same steps; a stop request of any rank stops every rank after this step.
      const bool stop_requested =
          reducer_->ReduceGradients(params, acting, cancel && cancel->load(std::memory_order_relaxed)).any_flag;
      last_samples = acting;
      // Unscale before clipping so the clip sees the true gradient norm; an inf/NaN grad skips clip and step.
      if (scaler_.Unscale(params)) {
        if (device.is_cuda()) {
          grad_norm_device += ClipGradNormOnDevice(params, config_.max_grad_norm);
        } else {
          grad_norm_sum += torch::nn::utils::clip_grad_norm_(params, config_.max_grad_norm);
        }
      }
      if (scaler_.Step(*optimizer_)) {
        ++steps_run;
      } else {
        ++stats->skipped_steps;
      }
      scaler_.Update();

      if (loss.total.defined()) {
        stat_sums += LossStats(loss);
        ++minibatches_with_loss;
      }
      last_approx_kl = loss.approx_kl;
      if (stop_requested) {
        stats->cancelled = true;
        break;
      }
    }
    ++stats->epochs;
    if (stats->cancelled) break;
    // As CleanRL: after each epoch, stop when the last minibatch's approx KL (measured just before its step,
    // so with the policy updated by the rest of the epoch) exceeds the target. Ranks: the KL of the union of
    // their last minibatches, so that all stop together.
    if (config_.target_kl) {
      const double kl = reducer_->WeightedMean(last_approx_kl.defined() ? last_approx_kl.item<double>() : 0.0,
                                               static_cast<double>(last_samples));
      if (kl > *config_.target_kl) break;
    }
  }
  if (device.is_cuda()) grad_norm_sum += grad_norm_device.item<double>();
  if (minibatches_with_loss > 0) SetMeans(stat_sums / static_cast<double>(minibatches_with_loss), stats);
  stats->grad_norm = steps_run > 0 ? grad_norm_sum / static_cast<double>(steps_run) : 0.0;
}

torch::Tensor PpoTrainer::Permutation(int64_t units, const torch::Device& device) {
  // On CUDA drawn on the device (LibTorch's default CUDA generator, seeded by torch::manual_seed): a host
  // randperm of a large batch plus its copy cost more than the epoch.
  if (!device.is_cuda()) return torch::randperm(units, generator_, torch::kLong);
  const auto generator_lock = LockCudaGenerator(device);  // the inference thread may be capturing
  return torch::randperm(units, torch::TensorOptions().dtype(torch::kLong).device(device));
}

PpoStats PpoTrainer::Update(const Rollout& rollout, double progress, const std::atomic<bool>* cancel) {
  PpoStats stats;
  if (!synced_) {
    // Rank 0's parameters and Adam state on every rank, before the first update that uses the reducer.
    reducer_->Synchronise(*policy_, *optimizer_, policy_->parameters());
    synced_ = true;
  }
  const Plan plan = PlanUpdate(rollout, progress, &stats);
  // Every sample too old: nothing to train on (a rank still takes its part in the other ranks' steps).
  if (plan.units_kept == 0 && reducer_->alone()) return stats;
  for (auto& group : optimizer_->param_groups()) {
    static_cast<torch::optim::AdamOptions&>(group.options()).lr(stats.learning_rate);
  }
  const Batch batch = Prepare(rollout, plan, &stats);
  // The path was chosen for the policy and the ranks (ChoosePaths); the graphed step also needs the rollout's
  // minibatches to be of one size.
  if (fused_) {
    RunFused(batch, plan, &stats, cancel);
    last_path_ = UpdatePathId(UpdatePath::kFused);
  } else if (RunGraphed(batch, plan, &stats, cancel)) {
    last_path_ = UpdatePathId(UpdatePath::kGraphed);
  } else {
    RunMinibatches(batch, plan, &stats, cancel);
    last_path_ = UpdatePathId(UpdatePath::kLibtorch);
  }
  stats.loss_scale = scaler_.scale();
  SetValueFit(batch.fit_values, batch.fit_returns, &stats);
  ++updates_;
  reducer_->AfterUpdate(policy_->parameters(), updates_);
  return stats;
}

}  // namespace farm
