// Config parsing: defaults, overrides, and the error messages users see.
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <functional>

#include "common/config.h"

using farm::FarmConfig;

namespace {
farm::Status Parse(const std::string& text, FarmConfig* c) { return farm::ParseConfig(text, "test.yaml", c); }
}  // namespace

TEST_CASE("defaults are the reference PPO settings", "[config]") {
  FarmConfig c;
  REQUIRE(farm::ParseConfig("", "empty.yaml", &c).ok());
  CHECK(c.ppo.gamma == 0.99);
  CHECK(c.ppo.clip_coef == 0.2);
  CHECK(c.ppo.hidden_sizes == std::vector<int>{64, 64});
  CHECK(c.mode == "sync");
  CHECK(farm::ValidateConfig(c).ok());
}

TEST_CASE("values are read into their sections", "[config]") {
  FarmConfig c;
  auto s = Parse("name: x\nmode: async\nppo:\n  lr: 1e-3\n  hidden_sizes: [32, 16]\nenv:\n  num_envs: 16\n"
                 "  options: {length: 5}\ntarget_return: 475\n",
                 &c);
  REQUIRE(s.ok());
  CHECK(c.name == "x");
  CHECK(c.mode == "async");
  CHECK(c.ppo.lr == Approx(1e-3));
  CHECK(c.ppo.hidden_sizes == std::vector<int>{32, 16});
  CHECK(c.env.num_envs == 16);
  CHECK(c.env.options.at("length") == 5);
  REQUIRE(c.target_return);
  CHECK(*c.target_return == 475);
}

TEST_CASE("an unknown key names the file, the key and the known keys", "[config]") {
  FarmConfig c;
  auto s = Parse("ppo:\n  lrr: 0.1\n", &c);
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains("test.yaml") && Catch::Contains("ppo.lrr") &&
                              Catch::Contains("unknown key") && Catch::Contains("gae_lambda"));
  auto top = Parse("bogus: 1\n", &c);
  REQUIRE_FALSE(top.ok());
  CHECK_THAT(top.message(), Catch::Contains("bogus") && Catch::Contains("total_env_steps"));
}

TEST_CASE("a wrong type names the key, what was expected and what was seen", "[config]") {
  FarmConfig c;
  auto s = Parse("ppo:\n  update_epochs: many\n", &c);
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains("ppo.update_epochs") && Catch::Contains("expected an integer") &&
                              Catch::Contains("'many'"));
  auto b = Parse("ppo:\n  norm_adv: 3\n", &c);
  REQUIRE_FALSE(b.ok());
  CHECK_THAT(b.message(), Catch::Contains("ppo.norm_adv") && Catch::Contains("true or false"));
  auto list = Parse("ppo:\n  hidden_sizes: 64\n", &c);
  REQUIRE_FALSE(list.ok());
  CHECK_THAT(list.message(), Catch::Contains("ppo.hidden_sizes") && Catch::Contains("expected a list"));
  auto section = Parse("ppo: 3\n", &c);
  REQUIRE_FALSE(section.ok());
  CHECK_THAT(section.message(), Catch::Contains("ppo") && Catch::Contains("expected a mapping"));
  auto boolean_as_int = Parse("env:\n  num_envs: true\n", &c);
  REQUIRE_FALSE(boolean_as_int.ok());
  CHECK_THAT(boolean_as_int.message(), Catch::Contains("env.num_envs"));
}

TEST_CASE("out-of-range values say the allowed range", "[config]") {
  FarmConfig c;
  auto s = Parse("ppo:\n  gamma: 1.5\n", &c);
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains("ppo.gamma") && Catch::Contains("[0, 1]") && Catch::Contains("1.5"));
  auto m = Parse("mode: fast\n", &c);
  REQUIRE_FALSE(m.ok());
  CHECK_THAT(m.message(), Catch::Contains("mode") && Catch::Contains("one of: sync, async"));
  auto n = Parse("env:\n  num_envs: 0\n", &c);
  REQUIRE_FALSE(n.ok());
  CHECK_THAT(n.message(), Catch::Contains("env.num_envs") && Catch::Contains(">= 1"));
  auto h = Parse("ppo:\n  hidden_sizes: [64, 0]\n", &c);
  REQUIRE_FALSE(h.ok());
  CHECK_THAT(h.message(), Catch::Contains("ppo.hidden_sizes[1]"));
  for (const char* k : {"0", "65"}) {
    auto f = Parse(std::string("env:\n  frame_stack: ") + k + "\n", &c);
    REQUIRE_FALSE(f.ok());
    CHECK_THAT(f.message(), Catch::Contains("env.frame_stack") && Catch::Contains("[1, 64]") && Catch::Contains(k));
  }
  auto fs = Parse("env:\n  frame_stack: 2.5\n", &c);
  REQUIRE_FALSE(fs.ok());
  CHECK_THAT(fs.message(), Catch::Contains("env.frame_stack"));
  auto ls = Parse("ppo:\n  log_std_init: 3\n", &c);
  REQUIRE_FALSE(ls.ok());
  CHECK_THAT(ls.message(), Catch::Contains("ppo.log_std_init") && Catch::Contains("[-10, 2]"));
  REQUIRE(Parse("ppo:\n  log_std_init: -2\n", &c).ok());
  CHECK(c.ppo.log_std_init == -2.0);
  // State-dependent exploration: the period is at least one step; neither the fused update nor CUDA graphs have it.
  REQUIRE(Parse("ppo:\n  sde: true\n  sde_sample_freq: 8\n", &c).ok());
  CHECK(c.ppo.sde);
  CHECK(c.ppo.sde_sample_freq == 8);
  auto sf = Parse("ppo:\n  sde: true\n  sde_sample_freq: 0\n", &c);
  REQUIRE_FALSE(sf.ok());
  CHECK_THAT(sf.message(), Catch::Contains("ppo.sde_sample_freq") && Catch::Contains(">= 1"));
  REQUIRE(Parse("ppo:\n  sde: true\n  fused_update: \"on\"\nlearner:\n  device: cpu\n", &c).ok());
  CHECK_THAT(farm::ValidateConfig(c).message(), Catch::Contains("ppo.fused_update=on cannot train ppo.sde"));
  FarmConfig g;
  REQUIRE(Parse("ppo:\n  sde: true\nlearner:\n  cuda_graphs: true\n", &g).ok());
  CHECK_THAT(farm::ValidateConfig(g).message(), Catch::Contains("learner.cuda_graphs cannot act with ppo.sde"));
  g.learner.deterministic = true;  // serving the mean needs no noise
  CHECK(farm::ValidateConfig(g).ok());
  c = FarmConfig();
  // MiB to bytes must not overflow: at most 2^40 MiB.
  auto mb = Parse("learner:\n  memory_budget_mb: 9007199254740992\n", &c);
  REQUIRE_FALSE(mb.ok());
  CHECK_THAT(mb.message(), Catch::Contains("learner.memory_budget_mb") && Catch::Contains("1099511627776"));
  REQUIRE(Parse("learner:\n  memory_budget_mb: 1099511627776\n", &c).ok());
}

TEST_CASE("malformed YAML reports the line", "[config]") {
  FarmConfig c;
  auto s = Parse("ppo:\n  lr: [1, 2\n", &c);
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains("test.yaml") && Catch::Contains("line"));
}

TEST_CASE("a config file without keys (empty, or only comments) is refused, naming it", "[config]") {
  for (const char* text : {"", "\n\n", "# only a comment\n", "---\n", "{}\n"}) {
    const std::string path = "config_test_empty_" + std::to_string(::getpid()) + ".yaml";
    {
      std::ofstream out(path);
      out << text;
    }
    FarmConfig c;
    const auto s = farm::LoadConfig(path, {}, &c);
    std::remove(path.c_str());
    INFO("file text: '" << text << "'");
    CHECK(s.code() == farm::Status::Code::kInvalidArgument);
    CHECK_THAT(s.message(), Catch::Contains(path + ": no config keys"));
  }
}

TEST_CASE("overrides (--set) apply over the file and are checked the same way", "[config]") {
  const std::string path = "config_test_tmp.yaml";
  {
    std::ofstream out(path);
    out << "ppo:\n  lr: 0.01\n  update_epochs: 3\n";
  }
  FarmConfig c;
  auto s = farm::LoadConfig(path, {"ppo.lr=1e-3", "ppo.hidden_sizes=[8, 8]", "stop_at_target=false"}, &c);
  REQUIRE(s.ok());
  CHECK(c.ppo.lr == Approx(1e-3));
  CHECK(c.ppo.update_epochs == 3);
  CHECK(c.ppo.hidden_sizes == std::vector<int>{8, 8});

  FarmConfig d;
  auto bad = farm::LoadConfig(path, {"ppo.lrr=1"}, &d);
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.message(), Catch::Contains("--set ppo.lrr=1") && Catch::Contains("unknown key"));
  auto no_eq = farm::LoadConfig(path, {"ppo.lr"}, &d);
  REQUIRE_FALSE(no_eq.ok());
  CHECK_THAT(no_eq.message(), Catch::Contains("KEY=VALUE"));
  auto type = farm::LoadConfig(path, {"env.num_envs=lots"}, &d);
  REQUIRE_FALSE(type.ok());
  CHECK_THAT(type.message(), Catch::Contains("env.num_envs") && Catch::Contains("'lots'"));
  std::remove(path.c_str());

  auto missing = farm::LoadConfig("does/not/exist.yaml", {}, &d);
  REQUIRE_FALSE(missing.ok());
  CHECK_THAT(missing.message(), Catch::Contains("does/not/exist.yaml"));
}

TEST_CASE("cross-key validation", "[config]") {
  FarmConfig c;
  REQUIRE(Parse("env:\n  num_envs: 7\n  num_groups: 2\n", &c).ok());
  auto s = farm::ValidateConfig(c);
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains("env.num_envs (7)") && Catch::Contains("env.num_groups (2)"));
  FarmConfig d;
  REQUIRE(Parse("stop_at_target: true\n", &d).ok());
  CHECK_FALSE(farm::ValidateConfig(d).ok());
  FarmConfig ev;
  REQUIRE(Parse("learner:\n  eval_episodes: 20\n", &ev).ok());
  auto eval_train = farm::ValidateConfig(ev);
  REQUIRE_FALSE(eval_train.ok());
  CHECK_THAT(eval_train.message(), Catch::Contains("learner.eval_episodes (20)") && Catch::Contains("learner.train=false"));
  ev.learner.train = false;
  CHECK(farm::ValidateConfig(ev).ok());
  ev.env.decorrelate_episodes = true;  // its cut episodes go unreported: evaluation would miscount
  const auto eval_cut = farm::ValidateConfig(ev);
  REQUIRE_FALSE(eval_cut.ok());
  CHECK_THAT(eval_cut.message(), Catch::Contains("env.decorrelate_episodes=false") && Catch::Contains("eval_episodes"));
  FarmConfig e;
  REQUIRE(Parse("learner:\n  device: tpu\n", &e).ok());
  auto dev = farm::ValidateConfig(e);
  REQUIRE_FALSE(dev.ok());
  CHECK_THAT(dev.message(), Catch::Contains("learner.device") && Catch::Contains("'tpu'"));
}

TEST_CASE("the dumped config parses back to the same values", "[config]") {
  FarmConfig c;
  REQUIRE(
      Parse("ppo:\n  lr: 0.000123\n  target_kl: 0.02\nenv:\n  options: {length: 7}\n  frame_stack: 4\nrun_dir: a/b\n",
            &c)
          .ok());
  const std::string text = farm::DumpConfig(c);
  FarmConfig back;
  auto s = farm::ParseConfig(text, "dump", &back);
  INFO(text);
  REQUIRE(s.ok());
  CHECK(back.ppo.lr == c.ppo.lr);
  REQUIRE(back.ppo.target_kl);
  CHECK(*back.ppo.target_kl == Approx(0.02));
  CHECK(back.env.options == c.env.options);
  CHECK(back.env.frame_stack == 4);
  CHECK(back.run_dir == "a/b");
  CHECK(!back.target_return);
  CHECK(farm::DumpConfig(back) == text);
}

TEST_CASE("transport.bind needs a port from 0 to 65535 or *", "[config]") {
  for (const char* good : {"tcp://127.0.0.1:*", "tcp://0.0.0.0:5555", "tcp://[::1]:65535", "tcp://eth0:0",
                           "ipc:///tmp/farm.sock", "inproc://x"}) {
    FarmConfig c;
    c.transport.bind = good;
    CHECK(farm::ValidateConfig(c).ok());
  }
  // ZeroMQ binds port 99999 as 34463; without a port the address used to be refused as "not a loopback address".
  for (const char* bad : {"tcp://127.0.0.1:99999", "tcp://127.0.0.1", "tcp://[::1]", "tcp://127.0.0.1:", "tcp://h:5x",
                          "tcp://h:-1", "tcp://h:1234567", "tcp://:5555"}) {
    FarmConfig c;
    c.transport.bind = bad;
    const auto s = farm::ValidateConfig(c);
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.message(), Catch::Contains("transport.bind: expected tcp://HOST:PORT with PORT a number from 0 to "
                                            "65535 or * (a free port), got '" + std::string(bad) + "'"));
  }
}

TEST_CASE("transport.worker_give_up_s must fit ZeroMQ's millisecond timeout", "[config]") {
  FarmConfig c;
  c.transport.worker_give_up_s = 2147483;  // 2^31 - 1 ms, rounded down to whole seconds
  CHECK(farm::ValidateConfig(c).ok());
  REQUIRE(farm::LoadConfig("", {"transport.worker_give_up_s=1e7"}, &c).code() ==
          farm::Status::Code::kInvalidArgument);
  const auto s = farm::ValidateConfig(c);
  CHECK_THAT(s.message(), Catch::Contains("transport.worker_give_up_s: expected a value in (0, 2147483]") &&
                              Catch::Contains("got 10000000"));
}

TEST_CASE("a non-finite number where any number goes says a finite one was expected", "[config]") {
  FarmConfig c;
  auto t = Parse("target_return: .nan\n", &c);
  REQUIRE_FALSE(t.ok());
  CHECK_THAT(t.message(), Catch::Contains("target_return: expected a finite number, got '.nan'"));
  auto o = Parse("env:\n  options: {size: .inf}\n", &c);
  REQUIRE_FALSE(o.ok());
  CHECK_THAT(o.message(), Catch::Contains("env.options.size: expected a finite number, got '.inf'"));
}

TEST_CASE("a key given twice in one mapping is an error (not the first one silently)", "[config]") {
  FarmConfig c;
  auto s = Parse("ppo:\n  lr: 0.001\n  gamma: 0.9\n  lr: 0.5\n", &c);
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains("test.yaml: ppo.lr: given twice; expected each key once"));
  auto top = Parse("seed: 1\nenv:\n  num_envs: 4\nseed: 2\n", &c);
  REQUIRE_FALSE(top.ok());
  CHECK_THAT(top.message(), Catch::Contains("test.yaml: seed: given twice"));
  // env.options is a mapping of its own.
  auto options = Parse("env:\n  options: {size: 1, size: 2}\n", &c);
  CHECK_FALSE(options.ok());
}

namespace {
const char* kTwoPolicies =
    "name: duo\nrun_dir: /tmp/duo\nenv:\n  python: envs.py:make\nppo:\n  lr: 7.0e-4\n"
    "policies:\n"
    "  - name: speaker\n    agents: [speaker_*]\n    set: [ppo.lr=3.0e-4, \"ppo.hidden_sizes=[32]\"]\n"
    "  - name: listener\n    agents: [listener_0, listener_1]\n    trainable: false\n    init_from: runs/old\n";
}  // namespace

TEST_CASE("policies: each policy's learner gets the run's config with its own overrides", "[config][policies]") {
  FarmConfig run;
  REQUIRE(Parse(kTwoPolicies, &run).ok());
  REQUIRE(farm::ValidateConfig(run).ok());
  REQUIRE(run.policies.size() == 2);
  CHECK(run.policies[1].agents == std::vector<std::string>{"listener_0", "listener_1"});
  FarmConfig speaker, listener;
  REQUIRE(farm::PolicyRunConfig(run, "speaker", &speaker).ok());
  CHECK(speaker.run_dir == "/tmp/duo/speaker");
  CHECK(speaker.name == "duo-speaker");
  CHECK(speaker.ppo.lr == Approx(3e-4));
  CHECK(speaker.ppo.hidden_sizes == std::vector<int>{32});
  CHECK(speaker.learner.train);
  CHECK(speaker.policies.empty());
  REQUIRE(farm::PolicyRunConfig(run, "listener", &listener).ok());
  CHECK(listener.run_dir == "/tmp/duo/listener");
  CHECK(listener.ppo.lr == Approx(7e-4));  // the run's
  CHECK(listener.ppo.hidden_sizes == std::vector<int>{64, 64});
  CHECK_FALSE(listener.learner.train);
  CHECK(listener.learner.init_from == "runs/old");
  // A policy's core gets the core defaults for what neither the run nor the policy gave.
  FarmConfig cored;
  run.policies[1].set = {"ppo.core=gru"};
  REQUIRE(farm::PolicyRunConfig(run, "listener", &cored).ok());
  CHECK(cored.ppo.rollout_length == farm::kCoreDefaults.rollout_length);
  CHECK(cored.ppo.lr == Approx(7e-4));  // given by the run
  // The dumped config reads back with its policies.
  FarmConfig again;
  REQUIRE(Parse(farm::DumpConfig(run), &again).ok());
  REQUIRE(again.policies.size() == 2);
  CHECK(again.policies[0].set == run.policies[0].set);
  CHECK(again.policies[1].init_from == "runs/old");
  CHECK_FALSE(again.policies[1].trainable);
}

TEST_CASE("policies: a bad entry is named with what was expected", "[config][policies]") {
  FarmConfig run;
  REQUIRE(Parse(kTwoPolicies, &run).ok());
  FarmConfig out;
  auto missing = farm::PolicyRunConfig(run, "prey", &out);
  CHECK_THAT(missing.message(), Catch::Contains("no policy 'prey'") && Catch::Contains("speaker, listener"));
  const auto refused = [&](const std::function<void(FarmConfig&)>& change, std::vector<std::string> words) {
    FarmConfig c = run;
    change(c);
    const auto s = farm::ValidateConfig(c);
    INFO(s.message());
    REQUIRE_FALSE(s.ok());
    for (const auto& w : words) CHECK_THAT(s.message(), Catch::Contains(w));
  };
  refused([](FarmConfig& c) { c.policies[0].set = {"env.num_envs=4"}; },
          {"policies[0] (speaker).set 'env.num_envs=4'", "ppo.*, learner.* and batcher.*"});
  refused([](FarmConfig& c) { c.policies[0].set = {"ppo.lrr=1"}; }, {"policies[0] (speaker)", "ppo.lrr", "unknown key"});
  refused([](FarmConfig& c) { c.policies[0].set = {"ppo.fused_update=on", "learner.device=cpu", "ppo.value_norm=running"}; },
          {"policy 'speaker'", "ppo.value_norm=running"});
  refused([](FarmConfig& c) { c.policies[1].set = {"learner.eval_episodes=10"}; },
          {"policies[1] (listener).set 'learner.eval_episodes=10'", "the run's"});
  // With normalisation the workers use the run's gamma and rollout length for every policy.
  refused([](FarmConfig& c) { c.env.normalize_reward = true; c.policies[0].set = {"ppo.gamma=0.9"}; },
          {"policy 'speaker'", "ppo.gamma and ppo.rollout_length are the run's", "0.9"});
  refused([](FarmConfig& c) { c.env.normalize_obs = true; c.policies[0].set = {"ppo.core=gru"}; },
          {"policy 'speaker'", "128"});  // the core's default rollout length
  refused([](FarmConfig& c) { c.policies[1].name = "speaker"; }, {"policies[1].name", "'speaker' is given twice"});
  refused([](FarmConfig& c) { c.policies[0].name = "a/b"; }, {"policies[0].name", "'a/b'"});
  refused([](FarmConfig& c) { c.policies[0].agents.clear(); }, {"policies[0] (speaker).agents"});
  refused([](FarmConfig& c) { c.policies[0].agents = {"a,b"}; }, {"no commas"});
  // A C++ env takes several policies (its agents by index), with normalisation too (statistics per policy).
  {
    FarmConfig cpp = run;
    cpp.env.python.clear();
    cpp.env.name = "uav_coverage";
    CHECK(farm::ValidateConfig(cpp).ok());
    cpp.env.normalize_obs = cpp.env.normalize_reward = true;
    CHECK(farm::ValidateConfig(cpp).ok());
  }
  refused([](FarmConfig& c) { c.env.frame_stack = 4; }, {"env.frame_stack is 4"});
  FarmConfig no_dir = run;
  no_dir.run_dir.clear();
  CHECK(farm::ValidateConfig(no_dir).ok());  // scripts/farm sets it (farm-learner --policies-plan)
  CHECK_THAT(farm::PolicyRunConfig(no_dir, "speaker", &out).message(), Catch::Contains("run_dir is not set"));
  auto bad_key = Parse("policies:\n  - name: a\n    agent: [x]\n", &out);
  CHECK_THAT(bad_key.message(), Catch::Contains("policies[0].agent") && Catch::Contains("unknown key"));
}
