// Where the files a config names are found (common/config_files.h): beside the config, at the place a run
// recorded, at the same place relative to a moved run directory, beside it; the message when none has it; the
// learner's and the workers' keys made absolute; and the defaults a core brings (common/config.h kCoreDefaults).
#include <unistd.h>

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/config.h"
#include "common/config_files.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using farm::FarmConfig;
using farm::FileQuery;

namespace {

void Touch(const fs::path& p) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << "x";
}

// A run directory's config.yaml as the learner writes it: run_dir recorded where it was.
void WriteRunConfig(const fs::path& run, const std::string& recorded_run_dir, const std::string& extra) {
  fs::create_directories(run / "checkpoints");
  std::ofstream(run / "config.yaml") << "run_dir: \"" << recorded_run_dir << "\"\n" << extra;
}

// Runs f with the current directory set to dir, then restores it.
template <class F>
void InDirectory(const fs::path& dir, F f) {
  const fs::path before = fs::current_path();
  fs::current_path(dir);
  f();
  fs::current_path(before);
}

}  // namespace

TEST_CASE("a relative path: the current directory, then beside the config, then the extra folders", "[files]") {
  farm::testing::TempDir tmp;
  const fs::path root(tmp.path);
  Touch(root / "proj" / "enc.pt");
  std::ofstream(root / "proj" / "my.yaml") << "name: x\n";
  fs::create_directories(root / "elsewhere");
  FarmConfig c;
  REQUIRE(farm::LoadConfig((root / "proj" / "my.yaml").string(), {}, &c).ok());
  CHECK(c.source_dir == (root / "proj").string());
  CHECK_FALSE(c.in_run_dir);
  FileQuery q;
  q.key = "ppo.actor_encoder_script";
  q.path = "enc.pt";
  q.also = {(root / "checkout").string()};
  InDirectory(root / "elsewhere", [&] {
    const auto candidates = farm::ConfigFileCandidates(c, q);
    REQUIRE(candidates == std::vector<std::string>{(root / "elsewhere" / "enc.pt").string(),
                                                    (root / "proj" / "enc.pt").string(),
                                                    (root / "checkout" / "enc.pt").string()});
    std::string found;
    REQUIRE(farm::FindConfigFile(c, q, &found).ok());
    CHECK(found == (root / "proj" / "enc.pt").string());
    // In the current directory too: that one first.
    Touch(root / "elsewhere" / "enc.pt");
    REQUIRE(farm::FindConfigFile(c, q, &found).ok());
    CHECK(found == (root / "elsewhere" / "enc.pt").string());
  });
}

TEST_CASE("a run directory read from where it was recorded, moved, and moved with its project", "[files]") {
  farm::testing::TempDir tmp;
  const fs::path root(tmp.path);
  const fs::path proj = root / "proj", run = proj / "runs" / "r1";
  Touch(proj / "my_env.py");
  WriteRunConfig(run, run.string(), "env:\n  python: my_env.py:make\n  python_found: \"" + (proj / "my_env.py").string() + "\"\n");
  FileQuery q;
  q.key = "env.python";
  q.path = "my_env.py";
  std::string found;
  FarmConfig at_home;
  REQUIRE(farm::LoadConfig((run / "config.yaml").string(), {}, &at_home).ok());
  CHECK(at_home.in_run_dir);
  q.recorded = at_home.env.python_found;
  InDirectory(root, [&] { REQUIRE(farm::FindConfigFile(at_home, q, &found).ok()); });
  CHECK(found == (proj / "my_env.py").string());

  SECTION("the run directory moved alone: the recorded path still holds") {
    fs::create_directories(root / "moved");
    fs::rename(run, root / "moved" / "r1");
    FarmConfig c;
    REQUIRE(farm::LoadConfig((root / "moved" / "r1" / "config.yaml").string(), {}, &c).ok());
    InDirectory(root, [&] { REQUIRE(farm::FindConfigFile(c, q, &found).ok()); });
    CHECK(found == (proj / "my_env.py").string());
  }
  SECTION("the project moved with the run inside: the same place relative to the run directory") {
    fs::rename(proj, root / "proj2");
    FarmConfig c;
    REQUIRE(farm::LoadConfig((root / "proj2" / "runs" / "r1" / "config.yaml").string(), {}, &c).ok());
    const auto candidates = farm::ConfigFileCandidates(c, q);
    REQUIRE(candidates.size() >= 2);
    CHECK(candidates[0] == (proj / "my_env.py").string());
    CHECK(candidates[1] == (root / "proj2" / "my_env.py").string());
    InDirectory(root, [&] { REQUIRE(farm::FindConfigFile(c, q, &found).ok()); });
    CHECK(found == (root / "proj2" / "my_env.py").string());
  }
  SECTION("moved to another machine, the file put beside the run directory") {
    fs::create_directories(root / "other");
    fs::rename(run, root / "other" / "r1");
    fs::remove(proj / "my_env.py");
    Touch(root / "other" / "my_env.py");
    FarmConfig c;
    REQUIRE(farm::LoadConfig((root / "other" / "r1" / "config.yaml").string(), {}, &c).ok());
    InDirectory(root, [&] { REQUIRE(farm::FindConfigFile(c, q, &found).ok()); });
    CHECK(found == (root / "other" / "my_env.py").string());
  }
  SECTION("found nowhere: the key, every place tried, what to set") {
    fs::remove(proj / "my_env.py");
    q.hint = "set env.python to where the file is now (--set env.python=/path/to/my_env.py:make)";
    farm::Status s;
    InDirectory(root, [&] { s = farm::FindConfigFile(at_home, q, &found); });
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.message(), Catch::StartsWith("env.python: file 'my_env.py' not found (looked for " +
                                              (proj / "my_env.py").string() + ", "));
    CHECK_THAT(s.message(), Catch::Contains((root / "my_env.py").string()));  // the current directory
    CHECK_THAT(s.message(), Catch::EndsWith("(--set env.python=/path/to/my_env.py:make)"));
  }
}

TEST_CASE("the learner's files made absolute, a run directory's encoder copy first, the workers' keys",
          "[files]") {
  farm::testing::TempDir tmp;
  const fs::path root(tmp.path), proj = root / "proj";
  Touch(proj / "enc.pt");
  Touch(proj / "keys" / "learner.key");
  fs::create_directories(proj / "keys" / "authorized");
  fs::create_directories(proj / "runs" / "base" / "checkpoints");
  std::ofstream(proj / "my.yaml") << "learner: {init_from: runs/base}\nppo: {actor_encoder_script: enc.pt}\n"
                                     "transport: {curve: true, curve_learner_secret_key_file: keys/learner.key, "
                                     "curve_authorized_keys: keys/authorized, curve_worker_secret_key_file: "
                                     "keys/worker.key, curve_learner_public_key_file: keys/learner.pub}\n";
  fs::create_directories(root / "elsewhere");
  InDirectory(root / "elsewhere", [&] {
    FarmConfig c;
    REQUIRE(farm::LoadConfig((proj / "my.yaml").string(), {}, &c).ok());
    REQUIRE(farm::ResolveLearnerFiles(&c, "actor_encoder.pt", "critic_encoder.pt").ok());
    CHECK(c.learner.init_from == (proj / "runs" / "base").string());
    CHECK(c.ppo.actor_encoder_script == (proj / "enc.pt").string());
    CHECK(c.transport.curve_learner_secret_key_file == (proj / "keys" / "learner.key").string());
    CHECK(c.transport.curve_authorized_keys == (proj / "keys" / "authorized").string());
    // The workers' keys are not on this machine: left as given for the workers to find.
    CHECK(c.transport.curve_worker_secret_key_file == "keys/worker.key");
    farm::Status w = farm::ResolveWorkerFiles(&c);
    REQUIRE_FALSE(w.ok());
    CHECK_THAT(w.message(), Catch::StartsWith("transport.curve_worker_secret_key_file: file 'keys/worker.key' not found"));
    Touch(proj / "keys" / "worker.key");
    Touch(proj / "keys" / "learner.pub");
    REQUIRE(farm::ResolveWorkerFiles(&c).ok());
    CHECK(c.transport.curve_worker_secret_key_file == (proj / "keys" / "worker.key").string());
    // A key the learner needs and cannot find stops it, naming the key.
    FarmConfig d;
    REQUIRE(farm::LoadConfig((proj / "my.yaml").string(), {"ppo.critic_encoder_script=missing.pt"}, &d).ok());
    farm::Status s = farm::ResolveLearnerFiles(&d, "actor_encoder.pt", "critic_encoder.pt");
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.message(), Catch::StartsWith("ppo.critic_encoder_script: file 'missing.pt' not found"));
  });
  // A run directory's config: its own copy of the encoder comes first, even where the original still is.
  const fs::path run = proj / "runs" / "r";
  WriteRunConfig(run, run.string(), "ppo: {actor_encoder_script: \"" + (proj / "enc.pt").string() + "\"}\n");
  Touch(run / "actor_encoder.pt");
  FarmConfig r;
  REQUIRE(farm::LoadConfig((run / "config.yaml").string(), {}, &r).ok());
  REQUIRE(farm::ResolveLearnerFiles(&r, "actor_encoder.pt", "critic_encoder.pt").ok());
  CHECK(r.ppo.actor_encoder_script == (run / "actor_encoder.pt").string());
}

TEST_CASE("a core brings its defaults for the keys the config does not give", "[config][files]") {
  FarmConfig plain;
  REQUIRE(farm::LoadConfig("", {}, &plain).ok());
  CHECK(plain.ppo.rollout_length == 32);
  CHECK(plain.ppo.lr == 2.5e-4);
  FarmConfig core;
  REQUIRE(farm::LoadConfig("", {"ppo.core=gru"}, &core).ok());
  CHECK(core.ppo.rollout_length == farm::kCoreDefaults.rollout_length);
  CHECK(core.ppo.lr == farm::kCoreDefaults.lr);
  CHECK(core.ppo.core_size == 64);
  CHECK(core.ppo.bptt == 0);
  CHECK(core.ppo.chunk_steps() == farm::kCoreDefaults.rollout_length);  // the whole rollout
  FarmConfig given;
  REQUIRE(farm::LoadConfig("", {"ppo.core=lstm", "ppo.lr=3e-4", "ppo.rollout_length=64", "ppo.bptt=16"}, &given).ok());
  CHECK(given.ppo.lr == 3e-4);
  CHECK(given.ppo.rollout_length == 64);
  CHECK(given.ppo.chunk_steps() == 16);
  CHECK(given.ppo.core_size == 64);
  // A run's dumped config gives every key: read back, nothing changes.
  FarmConfig back;
  REQUIRE(farm::ParseConfig(farm::DumpConfig(given), "dump", &back).ok());
  REQUIRE(farm::LoadConfig("", {}, &back).ok());
  CHECK(back.ppo.lr == 3e-4);
  CHECK(back.ppo.rollout_length == 64);
  // bptt must still divide the rollout.
  FarmConfig bad;
  farm::Status s = farm::LoadConfig("", {"ppo.core=gru", "ppo.bptt=48"}, &bad);
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains("ppo.bptt (48) must divide ppo.rollout_length (128)"));
}
