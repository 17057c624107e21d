// farm-worker with env.python: the Python worker's command line carries the config's settings, and a bad
// env.python is refused naming the key. No LibTorch.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/config.h"
#include "worker/python_launch.h"

namespace farm {
namespace {

// The value after `flag` in argv, or "<absent>".
std::string After(const std::vector<std::string>& argv, const std::string& flag) {
  const auto it = std::find(argv.begin(), argv.end(), flag);
  return it == argv.end() || it + 1 == argv.end() ? "<absent>" : *(it + 1);
}
bool Has(const std::vector<std::string>& argv, const std::string& flag) {
  return std::find(argv.begin(), argv.end(), flag) != argv.end();
}

TEST_CASE("env.python: the Python worker gets the config's envs, groups, seed, index, give-up time and frame stack") {
  FarmConfig c;
  c.env.python = "my_envs:make_env";
  c.env.python_interpreter = "/opt/venv/bin/python";
  c.env.num_envs = 12;
  c.env.num_groups = 3;
  c.env.frame_stack = 4;
  c.seed = 77;
  c.transport.worker_give_up_s = 12.5;
  std::vector<std::string> argv;
  REQUIRE(PythonWorkerArgv(c, 5, "tcp://10.0.0.1:5555", "/tmp/w.json", {}, &argv).ok());
  REQUIRE(argv.size() > 3);
  CHECK(argv[0] == "/opt/venv/bin/python");
  CHECK(argv[1] == "-m");
  CHECK(argv[2] == "farm_worker");
  CHECK(After(argv, "--learner") == "tcp://10.0.0.1:5555");
  CHECK(After(argv, "--env-module") == "my_envs:make_env");
  CHECK(After(argv, "--num-envs") == "12");
  CHECK(After(argv, "--groups") == "3");
  CHECK(After(argv, "--seed") == "77");
  CHECK(After(argv, "--index") == "5");
  CHECK(After(argv, "--give-up-s") == "12.5");
  CHECK(After(argv, "--frame-stack") == "4");
  CHECK(After(argv, "--stats-file") == "/tmp/w.json");
  CHECK_FALSE(Has(argv, "--normalize-obs"));
  CHECK_FALSE(Has(argv, "--curve-worker-secret-key-file"));
}

TEST_CASE("env.python: normalisation settings and CURVE keys travel, missing worker keys are refused by name") {
  FarmConfig c;
  c.env.python = "my_envs:make_env";
  c.env.normalize_obs = true;
  c.env.obs_clip = 5;
  c.ppo.gamma = 0.98;
  c.ppo.rollout_length = 32;
  std::vector<std::string> argv;
  REQUIRE(PythonWorkerArgv(c, 0, "tcp://h:1", "", {}, &argv).ok());
  CHECK(Has(argv, "--normalize-obs"));
  CHECK_FALSE(Has(argv, "--normalize-reward"));
  CHECK(After(argv, "--obs-clip") == "5");
  CHECK(After(argv, "--gamma") == "0.98");
  CHECK(After(argv, "--rollout-length") == "32");
  CHECK_FALSE(Has(argv, "--stats-file"));
  c.transport.curve = true;
  c.transport.curve_worker_secret_key_file = "keys/w.key";
  const Status missing = PythonWorkerArgv(c, 0, "tcp://h:1", "", {}, &argv);
  REQUIRE_FALSE(missing.ok());
  CHECK_THAT(missing.message(), Catch::Contains("transport.curve_learner_public_key_file"));
  c.transport.curve_learner_public_key_file = "keys/learner.pub";
  REQUIRE(PythonWorkerArgv(c, 0, "tcp://h:1", "", {}, &argv).ok());
  CHECK(After(argv, "--curve-worker-secret-key-file") == "keys/w.key");
  CHECK(After(argv, "--curve-learner-public-key-file") == "keys/learner.pub");
}

TEST_CASE("env.python: a .py path is made absolute, a missing file or a value without FACTORY names the key") {
  FarmConfig c;
  std::vector<std::string> argv;
  for (const char* bad : {"my_envs", "my_envs:", ":make_env"}) {
    c.env.python = bad;
    const Status s = PythonWorkerArgv(c, 0, "tcp://h:1", "", {}, &argv);
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.message(), Catch::Contains("env.python") && Catch::Contains("MODULE:FACTORY"));
  }
  c.env.python = "no_such_dir/envs.py:make";
  const Status s = PythonWorkerArgv(c, 0, "tcp://h:1", "", {}, &argv);
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains("env.python") && Catch::Contains("no_such_dir/envs.py") &&
                              Catch::Contains("not found"));
  std::ofstream("python_launch_test_envs.py") << "def make():\n    pass\n";
  c.env.python = "python_launch_test_envs.py:make";
  REQUIRE(PythonWorkerArgv(c, 0, "tcp://h:1", "", {}, &argv).ok());
  const std::string module = After(argv, "--env-module");
  CHECK(module.front() == '/');
  CHECK_THAT(module, Catch::EndsWith("/python_launch_test_envs.py:make"));
  std::remove("python_launch_test_envs.py");
  // Not here: beside the config file (the first search directory), else in the checkout (the second).
  const std::string dir = "python_launch_test_dir";
  std::filesystem::create_directories(dir + "/sub");
  std::ofstream(dir + "/sub/envs.py") << "def make():\n    pass\n";
  c.env.python = "sub/envs.py:make";
  REQUIRE(PythonWorkerArgv(c, 0, "tcp://h:1", "", {"no_such_config_dir", dir}, &argv).ok());
  CHECK_THAT(After(argv, "--env-module"), Catch::EndsWith("/python_launch_test_dir/sub/envs.py:make"));
  c.env.python = "sub/missing.py:make";
  const Status missing = PythonWorkerArgv(c, 0, "tcp://h:1", "", {"no_such_config_dir", dir}, &argv);
  REQUIRE_FALSE(missing.ok());
  CHECK_THAT(missing.message(), Catch::Contains("no_such_config_dir/sub/missing.py") &&
                                    Catch::Contains("python_launch_test_dir/sub/missing.py"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace farm
