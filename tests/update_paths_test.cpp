// The update paths' table (common/update_paths.h): every refusal of a path that does not take a need names the key
// that asked for the path and the setting that asked for the need; config validation refuses, by the table, each
// config that asks ppo.fused_update=on or ppo.graph_update=on of something that path does not take, and accepts the
// ones it does; the copy of the table in the header's comment is the table.
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/config.h"
#include "common/update_paths.h"

#include <catch2/catch.hpp>

namespace farm {
namespace {

constexpr UpdatePath kPaths[] = {UpdatePath::kFused, UpdatePath::kGraphed, UpdatePath::kLibtorch};

UpdateNeed Need(int i) { return static_cast<UpdateNeed>(i); }

// A config that asks for `need` through its own keys, as overrides; empty for the needs only a running learner
// knows (a centralised critic, finished agents, ranks).
std::vector<std::string> Asking(UpdateNeed need) {
  switch (need) {
    case UpdateNeed::kCore: return {"ppo.core=gru"};
    case UpdateNeed::kValueNorm: return {"ppo.value_norm=running"};
    case UpdateNeed::kSde: return {"ppo.sde=true"};
    case UpdateNeed::kEncoderScript: return {"ppo.actor_encoder_script=encoder.pt"};
    case UpdateNeed::kEncoder: return {"ppo.encoder=cnn"};
    case UpdateNeed::kActivation: return {"ppo.activation=relu"};
    case UpdateNeed::kLayerNorm: return {"ppo.layer_norm=true"};
    case UpdateNeed::kBf16: return {"learner.precision=bf16"};
    case UpdateNeed::kFp16: return {"learner.precision=fp16", "learner.device=cuda"};
    case UpdateNeed::kCuda: return {"learner.device=cuda"};
    default: return {};
  }
}

}  // namespace

TEST_CASE("each path's refusal names the key that asked for it and the setting that asked for the need",
          "[update_paths]") {
  for (const UpdatePath path : kPaths) {
    for (int i = 0; i < kNumUpdateNeeds; ++i) {
      INFO(UpdatePathName(path) << " and " << UpdateNeedName(Need(i)));
      UpdateNeeds needs;
      CHECK(CheckUpdatePath(path, needs).ok());
      const std::string setting = "<setting " + std::to_string(i) + ">";
      needs.Ask(Need(i), setting);
      const Status s = CheckUpdatePath(path, needs);
      CHECK(s.ok() == Takes(path, Need(i)));
      if (!s.ok()) {
        CHECK_THAT(s.message(), Catch::Contains(std::string(UpdatePathKey(path)) + "=on") &&
                                    Catch::Contains(setting) &&
                                    Catch::Contains(UpdatePathName(path)));
      }
      needs.Drop(Need(i));
      CHECK(CheckUpdatePath(path, needs).ok());
    }
  }
  // The LibTorch update takes everything: it is where every other path falls back to.
  for (int i = 0; i < kNumUpdateNeeds; ++i) CHECK(Takes(UpdatePath::kLibtorch, Need(i)));
  // The fused update takes ranks (its flat gradient buffer is all-reduced whole); the graphed step does not.
  CHECK(Takes(UpdatePath::kFused, UpdateNeed::kRanks));
  CHECK_FALSE(Takes(UpdatePath::kGraphed, UpdateNeed::kRanks));
  // The first need refused is the one named, in the table's order.
  UpdateNeeds two;
  two.Ask(UpdateNeed::kFp16, "learner.precision=fp16");
  two.Ask(UpdateNeed::kCore, "ppo.core=lstm");
  CHECK_THAT(CheckUpdatePath(UpdatePath::kGraphed, two).message(), Catch::Contains("ppo.core=lstm"));
}

TEST_CASE("config validation refuses, by the table, what each path given =on does not take, and names it",
          "[update_paths]") {
  for (const UpdatePath path : {UpdatePath::kFused, UpdatePath::kGraphed}) {
    const std::string key = UpdatePathKey(path);
    for (int i = 0; i < kNumUpdateNeeds; ++i) {
      const std::vector<std::string> asking = Asking(Need(i));
      if (asking.empty()) continue;
      INFO(key << "=on with " << asking.front());
      std::vector<std::string> overrides = asking;
      overrides.push_back(key + "=on");
      // The fused update runs only on the CPU: its config names the device unless the need is the device.
      if (path == UpdatePath::kFused && Need(i) != UpdateNeed::kCuda && Need(i) != UpdateNeed::kFp16)
        overrides.push_back("learner.device=cpu");
      FarmConfig config;
      const Status s = LoadConfig("", overrides, &config);
      if (Takes(path, Need(i))) {
        CHECK(s.ok());
        if (!s.ok()) WARN(s.message());
        continue;
      }
      REQUIRE_FALSE(s.ok());
      // The setting by its key, and by its value unless a boolean's.
      const std::string& asked = asking.front();
      const std::string value = asked.substr(asked.find('=') + 1);
      CHECK_THAT(s.message(), Catch::Contains(key + "=on") && Catch::Contains(asked.substr(0, asked.find('='))) &&
                                  Catch::Contains(value == "true" ? key : value) &&
                                  Catch::Contains(key + "=auto to fall back"));
    }
  }
  // ppo.fused_update=on on the CPU in fp32 with the tanh MLP: nothing to refuse.
  FarmConfig config;
  CHECK(LoadConfig("", {"ppo.fused_update=on", "learner.device=cpu"}, &config).ok());
  // auto may pick CUDA: the fused update is not promised there.
  FarmConfig defaults;
  const Status s = LoadConfig("", {"ppo.fused_update=on"}, &defaults);
  CHECK_THAT(s.message(), Catch::Contains("learner.device=cpu") && Catch::Contains("learner.device=auto"));
}

TEST_CASE("the table in update_paths.h's comment is the table", "[update_paths]") {
  std::ifstream in(std::string(FARM_SOURCE_DIR) + "/common/update_paths.h");
  REQUIRE(in.good());
  std::string line, copy;
  bool inside = false;
  while (std::getline(in, line)) {
    if (line.rfind("//   need ", 0) == 0) inside = true;
    if (!inside) continue;
    if (line.rfind("//   ", 0) != 0) break;
    copy += line.substr(5) + "\n";
  }
  CHECK(copy == UpdatePathTable());
}

}  // namespace farm
