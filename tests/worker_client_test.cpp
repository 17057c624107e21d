// WorkerClient against a stand-in learner: how the farm-worker's client ends when an env's own code fails.
// No LibTorch.
#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/wire.h"
#include "tests/stand_in_learner.h"
#include "worker/env.h"
#include "worker/worker_client.h"

namespace farm {
namespace {

constexpr int kFailAtStep = 3;  // the env's step throws on its third step

// One float of observation (the step count); Discrete(2) actions; step kFailAtStep throws.
class FailingEnv : public Env {
 public:
  void reset(float* obs) override {
    t_ = 0;
    obs[0] = 0.0f;
  }
  StepResult step(const ActionRef&, float* obs) override {
    if (++t_ == kFailAtStep) throw std::runtime_error("sensor unplugged");
    obs[0] = static_cast<float>(t_);
    return StepResult{};
  }

 private:
  int t_ = 0;
};

EnvSpec FailingSpec(const EnvOptions&) {
  EnvSpec spec;
  spec.observation = Space::Box({1}, {0.0f}, {100.0f});
  spec.action = Space::Discrete(2);
  spec.max_episode_steps = 100;
  return spec;
}

FARM_REGISTER_ENV("TestFailing-v0", EnvOptions{}, FailingSpec,
                  [](const EnvOptions&, uint64_t) { return std::make_unique<FailingEnv>(); });

}  // namespace

TEST_CASE("WorkerClient: an env whose step throws ends Run with an internal error naming the env",
          "[worker]") {
  testing::StandInLearner learner;
  FarmConfig config;
  config.seed = 5;
  config.env.name = "TestFailing-v0";
  config.env.num_envs = 2;
  config.env.num_groups = 1;
  learner.StartWorker(config);

  std::string identity;
  wire::Envelope in;
  learner.AcceptHello(&identity);
  // Actions for seqs 0, 1 and 2: the envs' steps 1 and 2 succeed, step 3 throws.
  for (uint64_t seq = 0; seq < kFailAtStep; ++seq) {
    learner.ReceiveSkippingHeartbeats(&identity, &in);
    REQUIRE(in.has_step());
    CHECK(in.step().seq() == seq);
    wire::Envelope reply;
    auto* action = reply.mutable_action();
    action->set_group(0);
    action->set_seq(seq);
    const std::vector<int64_t> zeros(2, 0);
    SetTensor(action->mutable_action(), DType::kInt64, {2}, zeros.data(), zeros.size() * sizeof(int64_t));
    learner.Send(identity, reply);
  }
  const Status s = learner.Join();
  CHECK(s.code() == Status::Code::kInternal);
  CHECK_THAT(s.ToString(), Catch::Contains("env TestFailing-v0") && Catch::Contains("sensor unplugged"));
}

TEST_CASE("WorkerClient: a learner endpoint ZeroMQ cannot connect to is refused, naming it", "[worker]") {
  FarmConfig config;
  config.env.name = "TestFailing-v0";
  for (const char* bad : {"tcp://127.0.0.1:99999", "tcp://127.0.0.1", "tcp://127.0.0.1:0", "tcp://h:*",
                          "udp://127.0.0.1:5555", "127.0.0.1:5555", "tcp://:5555"}) {
    std::unique_ptr<WorkerClient> client;
    const Status s = WorkerClient::Create(config, 0, bad, &client);
    CHECK(s.code() == Status::Code::kInvalidArgument);
    CHECK_THAT(s.message(), Catch::Contains("--learner") && Catch::Contains(std::string("got '") + bad + "'"));
  }
  for (const char* good : {"tcp://127.0.0.1:5555", "tcp://[::1]:65535", "ipc:///tmp/farm.sock", "inproc://x"}) {
    std::unique_ptr<WorkerClient> client;
    const Status s = WorkerClient::Create(config, 0, good, &client);
    INFO(good << ": " << s.ToString());
    CHECK(s.ok());
  }
}

}  // namespace farm
