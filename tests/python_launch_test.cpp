// farm-worker with env.python: the Python worker's command line carries the config's settings, a bad
// env.python is refused naming the key, and the interpreter is chosen by probing (fake interpreters: shell
// scripts written here). No LibTorch.
#include <catch2/catch.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/files.h"
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
  // Empty means automatic: farm-worker puts ChoosePythonInterpreter's choice there first.
  c.env.python_interpreter.clear();
  const Status unchosen = PythonWorkerArgv(c, 5, "tcp://10.0.0.1:5555", "", {}, &argv);
  REQUIRE_FALSE(unchosen.ok());
  CHECK_THAT(unchosen.message(), Catch::Contains("env.python_interpreter"));
  // The Python worker does not cut episodes: refused by name rather than ignored.
  c.env.python_interpreter = "/opt/venv/bin/python";
  c.env.decorrelate_episodes = true;
  const Status cut = PythonWorkerArgv(c, 5, "tcp://10.0.0.1:5555", "", {}, &argv);
  REQUIRE_FALSE(cut.ok());
  CHECK_THAT(cut.message(), Catch::Contains("env.decorrelate_episodes") && Catch::Contains("env.python"));
}

TEST_CASE("policies: the Python worker gets each policy's endpoint and agent patterns, in the config's order") {
  FarmConfig c;
  c.env.python = "my_envs:make_env";
  c.env.python_interpreter = "python3";
  c.policies = {{"speaker", {"speaker_*"}, true, "", {}}, {"listener", {"listener_0", "listener_1"}, true, "", {}}};
  std::vector<std::string> argv;
  REQUIRE(PythonWorkerArgv(c, 0, "listener=tcp://127.0.0.1:6001,speaker=tcp://127.0.0.1:6000", "", {}, &argv).ok());
  CHECK_FALSE(Has(argv, "--learner"));
  const auto first = std::find(argv.begin(), argv.end(), "--policy");
  REQUIRE(std::distance(first, argv.end()) >= 8);
  CHECK(std::vector<std::string>(first, first + 8) ==
        std::vector<std::string>{"--policy", "speaker", "tcp://127.0.0.1:6000", "speaker_*", "--policy", "listener",
                                 "tcp://127.0.0.1:6001", "listener_0,listener_1"});
  // farm-worker --check-python names no learner yet.
  REQUIRE(PythonWorkerArgv(c, 0, "", "", {}, &argv).ok());
  const auto refused = [&](const std::string& endpoints, const std::string& words) {
    const Status s = PythonWorkerArgv(c, 0, endpoints, "", {}, &argv);
    INFO(endpoints);
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.message(), Catch::Contains(words) && Catch::Contains("speaker, listener"));
  };
  refused("speaker=tcp://127.0.0.1:6000", "no endpoint for policy 'listener'");
  refused("ipc:///tmp/learner", "'ipc:///tmp/learner'");
  // One tcp://HOST:PORT: the i-th policy's learner on PORT + i.
  REQUIRE(PythonWorkerArgv(c, 0, "tcp://127.0.0.1:6000", "", {}, &argv).ok());
  const auto base = std::find(argv.begin(), argv.end(), "--policy");
  REQUIRE(std::distance(base, argv.end()) >= 8);
  CHECK((base[2] == "tcp://127.0.0.1:6000" && base[5] == "listener" && base[6] == "tcp://127.0.0.1:6001"));
  refused("speaker=tcp://a:1,listener=tcp://a:2,prey=tcp://a:3", "no policy 'prey'");
  refused("speaker=tcp://a:1,speaker=tcp://a:2", "policy 'speaker' given twice");
}

TEST_CASE("env.python: normalisation settings and CURVE keys travel, missing worker keys are refused by name") {
  FarmConfig c;
  c.env.python = "my_envs:make_env";
  c.env.python_interpreter = "python3";
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
  c.env.python_interpreter = "python3";
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
  REQUIRE(RemoveTree(dir).ok());
}

TEST_CASE("env.python: where the run found the file comes first, but never over a spec naming another file") {
  const std::string dir = std::filesystem::absolute("python_launch_test_found").string();
  std::filesystem::create_directories(dir + "/old");
  std::filesystem::create_directories(dir + "/new");
  std::ofstream(dir + "/old/my_env.py") << "def make():\n    pass\n";
  std::ofstream(dir + "/new/my_env.py") << "def make():\n    pass\n";
  std::ofstream(dir + "/new/other.py") << "def make():\n    pass\n";
  FarmConfig c;
  c.env.python_interpreter = "python3";
  c.env.python_found = dir + "/old/my_env.py";
  std::vector<std::string> argv;
  // The recorded file, over one of the same name in a search directory.
  c.env.python = "my_env.py:make";
  REQUIRE(PythonWorkerArgv(c, 0, "tcp://h:1", "", {dir + "/new"}, &argv).ok());
  CHECK(After(argv, "--env-module") == dir + "/old/my_env.py:make");
  // Another file (a --set env.python): the record does not apply.
  c.env.python = "other.py:make";
  REQUIRE(PythonWorkerArgv(c, 0, "tcp://h:1", "", {dir + "/new"}, &argv).ok());
  CHECK(After(argv, "--env-module") == dir + "/new/other.py:make");
  // An absolute path names its file, even one of the recorded name.
  c.env.python = dir + "/new/my_env.py:make";
  REQUIRE(PythonWorkerArgv(c, 0, "tcp://h:1", "", {}, &argv).ok());
  CHECK(After(argv, "--env-module") == dir + "/new/my_env.py:make");
  // A module name: the recorded folder goes first on the worker's sys.path when it holds the module.
  c.env.python = "my_env:make";
  c.env.python_found = dir + "/old";
  REQUIRE(PythonWorkerArgv(c, 0, "tcp://h:1", "", {}, &argv).ok());
  CHECK(After(argv, "--sys-path") == dir + "/old");
  std::string note;
  c.env.python = "not_there:make";
  REQUIRE(PythonWorkerArgv(c, 0, "tcp://h:1", "", {}, &argv, &note).ok());
  CHECK(std::find(argv.begin(), argv.end(), "--sys-path") == argv.end());
  CHECK_THAT(note, Catch::Contains("module 'not_there' is not in the folder the run found it in"));
  REQUIRE(RemoveTree(dir).ok());
}

// A fake interpreter: a shell script in `dir` that answers the probe as an interpreter lacking `missing` would
// (it records its PYTHONPATH in NAME.pythonpath), or runs `body` when given. Returns its path.
std::string FakePython(const std::filesystem::path& dir, const std::string& name, const std::string& missing,
                       const std::string& body = "") {
  const std::string path = (dir / name).string();
  std::ofstream f(path);
  f << "#!/bin/sh\n";
  if (!body.empty()) {
    f << body << "\n";
  } else {
    f << "printf '%s' \"$PYTHONPATH\" > '" << path << ".pythonpath'\n"
      << "echo \"executable\t" << path << "\"\n"
      << "echo 'version\t3.99.0'\n";
    if (!missing.empty()) f << "echo \"missing\t" << missing << "\tNo module named '" << missing << "'\"\n";
    f << "echo done\n";
  }
  f.close();
  chmod(path.c_str(), 0755);
  return path;
}

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string t = (std::filesystem::temp_directory_path() / "python_launch_test.XXXXXX").string();
    REQUIRE(mkdtemp(t.data()) != nullptr);
    path = t;
  }
  ~TempDir() { (void)RemoveTree(path.string()); }
};

std::string Slurp(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST_CASE("python interpreter: automatic choice skips one lacking a module and says why", "[python]") {
  TempDir tmp;
  PythonSearch search;
  search.candidates = {FakePython(tmp.path, "nonumpy", "numpy"), FakePython(tmp.path, "good", "")};
  search.python_path = "/farm/worker/python:/other";
  PythonChoice choice;
  const Status s = ChoosePythonInterpreter(search, &choice);
  REQUIRE(s.ok());
  CHECK(choice.interpreter == (tmp.path / "good").string());
  REQUIRE(choice.tried.size() == 2);
  CHECK_FALSE(choice.tried[0].usable());
  REQUIRE(choice.tried[0].missing.size() == 1);
  CHECK(choice.tried[0].missing[0].module == "numpy");
  CHECK(choice.tried[0].missing[0].reason == "No module named 'numpy'");
  CHECK(choice.tried[0].version == "3.99.0");
  CHECK(choice.tried[1].usable());
  CHECK_THAT(choice.note, Catch::StartsWith("python: using " + (tmp.path / "good").string()) &&
                              Catch::Contains((tmp.path / "nonumpy").string() + " (Python 3.99.0) lacks numpy"));
  // The probe ran with the worker's PYTHONPATH.
  CHECK(Slurp((tmp.path / "nonumpy.pythonpath").string()) == "/farm/worker/python:/other");
  // The first usable one wins: the second is not asked.
  search.candidates = {FakePython(tmp.path, "first", ""), (tmp.path / "nonumpy").string()};
  REQUIRE(ChoosePythonInterpreter(search, &choice).ok());
  CHECK(choice.interpreter == (tmp.path / "first").string());
  CHECK(choice.tried.size() == 1);
}

TEST_CASE("python interpreter: a bare name is looked up on PATH and reported with its path", "[python]") {
  TempDir tmp;
  FakePython(tmp.path, "python3", "zmq");
  const char* old = std::getenv("PATH");
  const std::string saved = old ? old : "";
  setenv("PATH", (tmp.path.string() + ":" + saved).c_str(), 1);
  const PythonProbe p = ProbePythonInterpreter("python3", {"zmq"}, "", 10);
  setenv("PATH", saved.c_str(), 1);
  CHECK(p.path == (tmp.path / "python3").string());
  CHECK(p.error.empty());
  REQUIRE(p.missing.size() == 1);
  CHECK(p.missing[0].module == "zmq");
  CHECK_THAT(p.Describe(), Catch::StartsWith("python3 on PATH = " + (tmp.path / "python3").string()));
  CHECK_THAT(p.Problem(), Catch::Contains("lacks zmq"));
}

TEST_CASE("python interpreter: a set one is used as given, or refused with the reasons and the fixes", "[python]") {
  TempDir tmp;
  PythonSearch search;
  search.candidates = {FakePython(tmp.path, "never_asked", "")};
  search.configured = FakePython(tmp.path, "venv_python", "");
  PythonChoice choice;
  REQUIRE(ChoosePythonInterpreter(search, &choice).ok());
  CHECK(choice.interpreter == search.configured);
  REQUIRE(choice.tried.size() == 1);  // the candidates are not asked
  CHECK_THAT(choice.note, Catch::Contains("env.python_interpreter"));

  search.configured = FakePython(tmp.path, "lacks_numpy", "numpy");
  const Status s = ChoosePythonInterpreter(search, &choice);
  REQUIRE_FALSE(s.ok());
  CHECK(choice.tried.size() == 1);
  CHECK_THAT(s.message(), Catch::Contains(search.configured) && Catch::Contains("lacks numpy") &&
                              Catch::Contains("env.python_interpreter: /path/to/python") &&
                              Catch::Contains("--set env.python_interpreter=") &&
                              Catch::Contains(search.configured + " -m pip install numpy"));
}

TEST_CASE("python interpreter: a missing, non-Python or hung interpreter is reported, none usable fails", "[python]") {
  TempDir tmp;
  const std::string missing = (tmp.path / "no_such_python").string();
  PythonProbe p = ProbePythonInterpreter(missing, PythonWorkerModules(), "", 10);
  CHECK_FALSE(p.usable());
  CHECK(p.error == "no such file");
  CHECK(ProbePythonInterpreter("farm_no_such_python_here", {"zmq"}, "", 10).error.find("not found on PATH") !=
        std::string::npos);
  p = ProbePythonInterpreter(FakePython(tmp.path, "not_python", "", "echo 'syntax error'; exit 3"), {"zmq"}, "", 10);
  CHECK_THAT(p.error, Catch::Contains("exited with status 3") && Catch::Contains("syntax error"));
  const auto start = std::chrono::steady_clock::now();
  p = ProbePythonInterpreter(FakePython(tmp.path, "hangs", "", "exec sleep 30"), {"zmq"}, "", 0.5);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
  CHECK_THAT(p.error, Catch::Contains("did not answer within 0.5 s"));

  PythonSearch search;
  search.configured = missing;
  PythonChoice choice;
  Status s = ChoosePythonInterpreter(search, &choice);
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains(missing + ": cannot be run: no such file"));

  // Automatic, none usable: every one named with what it lacks, the fixes, Debian's packages for a /usr/bin one.
  search.configured.clear();
  search.candidates = {FakePython(tmp.path, "python3", "numpy"), missing};
  s = ChoosePythonInterpreter(search, &choice);
  REQUIRE_FALSE(s.ok());
  CHECK(choice.tried.size() == 2);
  CHECK_THAT(s.message(), Catch::Contains("no Python interpreter here") &&
                              Catch::Contains((tmp.path / "python3").string() + " (Python 3.99.0): lacks numpy") &&
                              Catch::Contains(missing + ": cannot be run") &&
                              Catch::Contains("env.python_interpreter: /path/to/python") &&
                              Catch::Contains("pip install numpy"));
  PythonProbe debian;
  debian.interpreter = debian.path = "/usr/bin/python3";
  debian.missing = {{"zmq", "No module named 'zmq'"}, {"google.protobuf", "No module named 'google'"}};
  CHECK_THAT(debian.Problem(), Catch::Contains("lacks zmq (No module named 'zmq'), google.protobuf"));
}

TEST_CASE("python interpreter: the worker's modules, the fallback and the PYTHONPATH it gets", "[python]") {
  CHECK(PythonWorkerModules() == std::vector<std::string>{"zmq", "google.protobuf", "numpy"});
  const char* old_system = std::getenv("FARM_SYSTEM_PYTHON");
  const std::string saved_system = old_system ? old_system : "";
  unsetenv("FARM_SYSTEM_PYTHON");
  CHECK(SystemPythonPath() == "/usr/bin/python3");
  setenv("FARM_SYSTEM_PYTHON", "/opt/test/python3", 1);
  CHECK(SystemPythonPath() == "/opt/test/python3");
  CHECK(PythonSearch::FromEnvironment("").candidates == std::vector<std::string>{"python3", "/opt/test/python3"});
  if (old_system)
    setenv("FARM_SYSTEM_PYTHON", saved_system.c_str(), 1);
  else
    unsetenv("FARM_SYSTEM_PYTHON");

  TempDir tmp;
  const char* old = std::getenv("PYTHONPATH");
  const std::string saved = old ? old : "";
  setenv("PYTHONPATH", "/mine", 1);
  CHECK(PythonWorkerPythonPath((tmp.path / "no_package_here").string()) == "/mine");
  std::filesystem::create_directories(tmp.path / "farm_worker");
  CHECK(PythonWorkerPythonPath(tmp.path.string()) == tmp.path.string() + ":/mine");
  unsetenv("PYTHONPATH");
  CHECK(PythonWorkerPythonPath(tmp.path.string()) == tmp.path.string());
  if (old) setenv("PYTHONPATH", saved.c_str(), 1);
}

}  // namespace
}  // namespace farm
