// Observation normalisation and reward scaling above the workers: the
// statistics in checkpoints and in the exported TorchScript module (compared
// with the C++ path), and end to end in one process: two real WorkerClients
// and a real learner, whose workers end with the same statistics; then a
// resumed learner and a serving one hand the checkpoint's statistics to a
// joining worker, and a worker that does not normalise is refused by name.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <torch/script.h>
#include <vector>
#include <zmq.hpp>

#include "common/files.h"
#include "common/running_stats.h"
#include "common/transport.h"
#include "common/wire.h"
#include "learner/learner.h"
#include "learner/model/export.h"
#include "learner/model/policy.h"
#include "learner/run/checkpoint.h"
#include "worker/worker_client.h"

// LibTorch pulls in glog, whose CHECK would replace Catch's: include Catch last.
#undef CHECK
#include <catch2/catch.hpp>

using namespace farm;

namespace {

std::string TempDir(const std::string& name) {
  static int counter = 0;
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("farm-norm-" + name + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++)))
                              .string();
  (void)RemoveTree(dir);  // not std::filesystem::remove_all: see RemoveTree
  return dir;
}

// Moments of `rows` random rows with offsets and scales far from 0 and 1.
RunningMoments SomeMoments(int64_t dim, int64_t rows, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> data(static_cast<std::size_t>(dim * rows));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < dim; ++i) data[r * dim + i] = 5.0f * static_cast<float>(i) - 3.0f + (0.5f + i) * n(rng);
  RunningMoments m(dim);
  m.AddRows(data.data(), rows);
  return m;
}

void CheckSame(const RunningMoments& a, const RunningMoments& b) {
  CHECK(a.count() == b.count());
  CHECK(a.mean() == b.mean());
  CHECK(a.m2() == b.m2());
}

}  // namespace

TEST_CASE("checkpoints hold the normaliser's statistics and the tools read them", "[normalizer][checkpoint]") {
  torch::manual_seed(4);
  const std::string dir = TempDir("ckpt");
  ActorCritic policy(Space::Box({3}, {-1.f, -1.f, -8.f}, {1.f, 1.f, 8.f}), Space::Box({1}, {-2.f}, {2.f}),
                     std::vector<int>{8});
  torch::optim::Adam adam(policy->parameters(), torch::optim::AdamOptions(1e-3));
  RunState state;
  state.has_normalizer = true;
  state.normalizer_obs = SomeMoments(3, 50, 1);
  state.normalizer_ret = SomeMoments(1, 20, 2);
  std::string path;
  REQUIRE(SaveCheckpoint(dir, policy, adam, TrainingCounters{100, 1, 1, 0, 0.0}, &path, nullptr, 0, &state).ok());

  RunState back;
  TrainingCounters c;
  REQUIRE(LoadCheckpoint(path, policy, &adam, &c, nullptr, &back).ok());
  REQUIRE(back.has_normalizer);
  CheckSame(back.normalizer_obs, state.normalizer_obs);
  CheckSame(back.normalizer_ret, state.normalizer_ret);
  for (const auto& m : back.missing) CHECK(m.find("normalizer") == std::string::npos);

  RunningMoments obs, ret;
  REQUIRE(ReadCheckpointNormalizer(path, &obs, &ret).ok());
  CheckSame(obs, state.normalizer_obs);
  FarmConfig config;
  std::optional<ObsTransform> t;
  REQUIRE(LoadObsTransform(config, path, 3, &t).ok());
  CHECK_FALSE(t.has_value());  // env.normalize_obs off: raw observations
  config.env.normalize_obs = true;
  config.env.obs_clip = 4;
  REQUIRE(LoadObsTransform(config, path, 3, &t).ok());
  REQUIRE(t.has_value());
  const ObsTransform want = ObsTransform::From(state.normalizer_obs, 4);
  CHECK(t->mean == want.mean);
  CHECK(t->std == want.std);
  CHECK(t->clip == 4.0f);
  Status s = LoadObsTransform(config, path, 5, &t);
  CHECK_THAT(s.message(), Catch::Contains("normalizer.obs has 3 elements, but observations have 5"));

  // Off: empty moments round-trip too (a run without normalisation still stores the entry).
  RunState off;
  off.has_normalizer = true;
  off.normalizer_obs.Reset(0);
  off.normalizer_ret.Reset(0);
  REQUIRE(SaveCheckpoint(dir, policy, adam, TrainingCounters{200, 2, 2, 0, 0.0}, &path, nullptr, 0, &off).ok());
  REQUIRE(ReadCheckpointNormalizer(path, &obs, &ret).ok());
  CHECK(obs.dim() == 0);
  CHECK(ret.empty());

  // A checkpoint without the entry (as written before it existed, or without a run state): has_normalizer
  // false (not "missing": a run without normalisation needs none), and the tools say why they cannot go on
  // when the run normalised.
  REQUIRE(SaveCheckpoint(dir, policy, adam, TrainingCounters{300, 3, 3, 0, 0.0}, &path).ok());
  s = ReadCheckpointNormalizer(path, &obs, &ret);
  CHECK(s.code() == Status::Code::kNotFound);
  s = LoadObsTransform(config, path, 3, &t);
  CHECK(s.code() == Status::Code::kNotFound);
  CHECK_THAT(s.message(), Catch::Contains("no normaliser statistics") && Catch::Contains("env.normalize_obs"));
  RunState none;
  REQUIRE(LoadCheckpoint(path, policy, &adam, &c, nullptr, &none).ok());
  CHECK_FALSE(none.has_normalizer);
  for (const auto& m : none.missing) CHECK(m.find("normalizer") == std::string::npos);
  (void)RemoveTree(dir);
}

TEST_CASE("the exported module normalises raw observations as the workers do", "[normalizer][export]") {
  torch::manual_seed(5);
  const std::string dir = TempDir("export");
  std::filesystem::create_directories(dir);
  const RunningMoments moments = SomeMoments(3, 200, 3);
  const ObsTransform transform = ObsTransform::From(moments, 2.5);
  // Raw observations around the statistics' means, some far enough out to be clipped.
  std::mt19937_64 rng(9);
  std::normal_distribution<float> n(0.0f, 1.0f);
  const int64_t rows = 64;
  torch::Tensor raw = torch::empty({rows, 3});
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < 3; ++i)
      raw[r][i] = transform.mean[i] + transform.std[i] * 2.0f * n(rng) + (r % 8 == 0 ? 40.0f : 0.0f);
  torch::Tensor normalized = raw.clone();
  transform.Apply(raw.data_ptr<float>(), normalized.data_ptr<float>(), rows);
  CHECK(normalized.abs().max().item<float>() == 2.5f);  // the clip is reached

  for (const bool discrete : {true, false}) {
    INFO((discrete ? "discrete" : "box"));
    const Space action = discrete ? Space::Discrete(4) : Space::Box({2}, {-0.3f, -1.f}, {0.3f, 1.f});
    ActorCritic policy(Space::Box({3}, {-10.f, -10.f, -10.f}, {10.f, 10.f, 10.f}), action, std::vector<int>{16, 16});
    policy->eval();
    const std::string path = dir + (discrete ? "/discrete.pt" : "/box.pt");
    REQUIRE(ExportTorchScript(*policy, path, &transform).ok());
    torch::jit::Module module = torch::jit::load(path);
    torch::Tensor exported, expected;
    {
      c10::InferenceMode guard;
      exported = module.forward({raw}).toTensor();
      expected = policy->Act(normalized, /*deterministic=*/true).action;
      if (!discrete)
        expected = torch::clamp(expected, torch::tensor(action.low), torch::tensor(action.high));
    }
    if (discrete) {
      CHECK(torch::equal(exported, expected));
    } else {
      CHECK(torch::allclose(exported, expected, 1e-5, 1e-6));
    }
    // The buffers hold the workers' float32 mean and std.
    const torch::Tensor mean = module.attr("obs_mean").toTensor();
    const torch::Tensor std = module.attr("obs_std").toTensor();
    CHECK(std::vector<float>(mean.data_ptr<float>(), mean.data_ptr<float>() + 3) == transform.mean);
    CHECK(std::vector<float>(std.data_ptr<float>(), std.data_ptr<float>() + 3) == transform.std);
    // Without the normaliser the module takes the policy's inputs as they are.
    REQUIRE(ExportTorchScript(*policy, path).ok());
    torch::jit::Module plain = torch::jit::load(path);
    {
      c10::InferenceMode guard;
      const torch::Tensor a = plain.forward({normalized}).toTensor();
      if (discrete) {
        CHECK(torch::equal(a, expected));
      } else {
        CHECK(torch::allclose(a, expected, 1e-5, 1e-6));
      }
    }
  }
  // A normaliser of the wrong size is refused.
  ActorCritic policy(Space::Box({2}, {-1.f, -1.f}, {1.f, 1.f}), Space::Discrete(2), std::vector<int>{4});
  const Status s = ExportTorchScript(*policy, dir + "/bad.pt", &transform);
  CHECK_THAT(s.message(), Catch::Contains("normaliser has 3 elements"));
  (void)RemoveTree(dir);
}

namespace {

// A learner running in a thread of its own until it stops by itself or is asked to.
class RunningLearner {
 public:
  explicit RunningLearner(const FarmConfig& config) {
    REQUIRE(ValidateConfig(config).ok());
    const Status created = Learner::Create(config, &learner_);
    INFO(created.ToString());
    REQUIRE(created.ok());
    thread_ = std::thread([this] { status_ = learner_->Run(&summary_); });
  }
  ~RunningLearner() { Stop(); }
  void Stop() {
    if (!thread_.joinable()) return;
    learner_->RequestStop("test done");
    thread_.join();
  }
  void Join() { thread_.join(); }
  const std::string& endpoint() const { return learner_->endpoint(); }
  const nlohmann::json& summary() const { return summary_; }
  const Status& status() const { return status_; }

 private:
  std::unique_ptr<Learner> learner_;
  std::thread thread_;
  Status status_;
  nlohmann::json summary_;
};

FarmConfig PendulumConfig(const std::string& run_dir) {
  FarmConfig config;
  config.seed = 4;
  config.run_dir = run_dir;
  config.env.name = "Pendulum-v1";
  config.env.num_envs = 2;
  config.env.num_groups = 2;
  config.env.normalize_obs = true;
  config.env.normalize_reward = true;
  config.ppo.rollout_length = 16;
  config.ppo.gamma = 0.9;
  config.ppo.num_minibatches = 2;
  config.ppo.update_epochs = 1;
  config.ppo.hidden_sizes = {16};
  config.learner.min_workers = 2;  // both join before anyone acts: every rollout has both workers' deltas
  config.learner.checkpoint_every = 0;
  config.learner.progress_interval_s = 3600;
  config.learner.device = "cpu";
  config.total_env_steps = 2 * 2 * 16 * 5;  // 5 rollouts of 2 workers x 2 envs x 16 steps
  return config;
}

// A Hello from a worker of PendulumConfig's env, with `normalization` when given.
wire::Envelope PendulumHello(const std::string& id, const std::optional<NormalizerOptions>& normalization) {
  wire::Envelope e;
  auto* h = e.mutable_hello();
  h->set_protocol_version(kProtocolVersion);
  h->set_worker_id(id);
  h->set_env_name("Pendulum-v1");
  h->set_num_envs(2);
  h->set_num_groups(2);
  ToWire(Space::Box({3}, {-1.f, -1.f, -8.f}, {1.f, 1.f, 8.f}), h->mutable_observation());
  ToWire(Space::Box({1}, {-2.f}, {2.f}), h->mutable_action());
  if (normalization) normalization->ToWire(h->mutable_normalization());
  return e;
}

wire::Envelope HelloAndWelcome(const std::string& endpoint, const wire::Envelope& hello) {
  zmq::context_t ctx(1);
  TransportConfig tc;
  zmq::socket_t sock = MakeDealer(ctx, hello.hello().worker_id(), endpoint, tc);
  std::string scratch;
  REQUIRE(SendEnvelope(sock, hello, &scratch));
  wire::Envelope reply;
  Status s;
  REQUIRE(ReceiveEnvelope(sock, std::chrono::seconds(20), &reply, &s));
  REQUIRE(s.ok());
  REQUIRE(reply.has_welcome());
  return reply;
}

}  // namespace

TEST_CASE("two workers and a learner: one set of statistics, checkpointed, resumed and served",
          "[normalizer][e2e]") {
  const std::string run_dir = TempDir("e2e");
  const FarmConfig config = PendulumConfig(run_dir);
  std::unique_ptr<WorkerClient> a, b;
  {
    RunningLearner learner(config);
    REQUIRE(WorkerClient::Create(config, 0, learner.endpoint(), &a).ok());
    REQUIRE(WorkerClient::Create(config, 1, learner.endpoint(), &b).ok());
    Status sa, sb;
    std::thread ta([&] { sa = a->Run(); });
    std::thread tb([&] { sb = b->Run(); });
    ta.join();
    tb.join();
    learner.Join();
    INFO(sa.ToString() << " / " << sb.ToString() << " / " << learner.status().ToString());
    REQUIRE(sa.ok());
    REQUIRE(sb.ok());
    REQUIRE(learner.status().ok());
    CHECK(learner.summary()["protocol_errors"] == 0);
    CHECK(learner.summary()["env_steps"] == 320);
  }
  // Both workers end with the statistics of the last rollout boundary: every request of rollouts 1-4 (each
  // group's reset and 64 steps, 2 x 2 x 65 observations and 2 x 2 x 64 returns), merged by the learner.
  const Normalizer* na = a->normalizer();
  const Normalizer* nb = b->normalizer();
  REQUIRE(na != nullptr);
  REQUIRE(nb != nullptr);
  CHECK(na->obs_view().count() == 260);
  CHECK(na->ret_view().count() == 256);
  CheckSame(na->obs_view(), nb->obs_view());
  CheckSame(na->ret_view(), nb->ret_view());
  // Pendulum's cos and sin in [-1, 1], angular velocity in [-8, 8]: sane statistics.
  for (int i = 0; i < 3; ++i) {
    CHECK(std::abs(na->obs_view().mean()[i]) < 8.0);
    CHECK(na->obs_view().Variance(i) > 0.0);
  }

  // The final checkpoint holds everything merged, the fifth boundary's deltas too (2 x 2 x 81, 2 x 2 x 80).
  std::string latest;
  REQUIRE(FindLatestValidCheckpoint(run_dir + "/checkpoints", &latest, nullptr).ok());
  RunningMoments obs, ret;
  REQUIRE(ReadCheckpointNormalizer(latest, &obs, &ret).ok());
  CHECK(obs.count() == 324);
  CHECK(ret.count() == 320);

  {
    // --resume: a joining worker gets the checkpoint's statistics in its Welcome, to go on with.
    FarmConfig resume = config;
    resume.learner.resume = true;
    resume.learner.min_workers = 1;
    resume.total_env_steps = int64_t{1} << 40;
    RunningLearner learner(resume);
    const wire::Envelope welcome =
        HelloAndWelcome(learner.endpoint(), PendulumHello("resumed", NormalizerOptions::FromConfig(config)));
    REQUIRE(welcome.welcome().accepted());
    REQUIRE(welcome.welcome().has_normalizer());
    CHECK_FALSE(welcome.welcome().normalizer().frozen());
    RunningMoments got_obs, got_ret;
    REQUIRE(FromWire(welcome.welcome().normalizer().obs(), 3, "obs", &got_obs).ok());
    REQUIRE(FromWire(welcome.welcome().normalizer().ret(), 1, "ret", &got_ret).ok());
    CheckSame(got_obs, obs);
    CheckSame(got_ret, ret);
    // A worker that does not normalise (an old one, the Python worker) is refused, saying why.
    const wire::Envelope refused = HelloAndWelcome(learner.endpoint(), PendulumHello("raw", std::nullopt));
    CHECK_FALSE(refused.welcome().accepted());
    CHECK_THAT(refused.welcome().error(), Catch::Contains("env.normalize_obs false (learner: true)"));
  }
  {
    // --serve: the trained policy's statistics, frozen.
    FarmConfig serve = config;
    serve.run_dir = TempDir("serve");
    serve.learner.init_from = run_dir;
    serve.learner.train = false;
    serve.learner.min_workers = 1;
    serve.total_env_steps = int64_t{1} << 40;
    RunningLearner learner(serve);
    const wire::Envelope welcome =
        HelloAndWelcome(learner.endpoint(), PendulumHello("client", NormalizerOptions::FromConfig(config)));
    REQUIRE(welcome.welcome().accepted());
    CHECK(welcome.welcome().normalizer().frozen());
    RunningMoments got_obs, got_ret;
    REQUIRE(FromWire(welcome.welcome().normalizer().obs(), 3, "obs", &got_obs).ok());
    CheckSame(got_obs, obs);
    learner.Stop();
    (void)RemoveTree(serve.run_dir);
  }
  {
    // Fine-tuning a normalising run's policy without normalisation is refused by name.
    FarmConfig raw = config;
    raw.run_dir = TempDir("raw");
    raw.learner.init_from = run_dir;
    raw.env.normalize_obs = false;
    raw.env.normalize_reward = false;
    raw.learner.min_workers = 1;
    RunningLearner learner(raw);
    const wire::Envelope welcome = HelloAndWelcome(learner.endpoint(), PendulumHello("w", std::nullopt));
    CHECK_FALSE(welcome.welcome().accepted());
    CHECK_THAT(welcome.welcome().error(),
               Catch::Contains("learner.init_from") && Catch::Contains("env.normalize_obs true"));
    learner.Stop();
    (void)RemoveTree(raw.run_dir);
  }
  (void)RemoveTree(run_dir);
}
