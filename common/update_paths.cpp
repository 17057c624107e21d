#include "common/update_paths.h"

#include <fmt/format.h>

#include <utility>

#include "common/config.h"

namespace farm {
namespace {

struct NeedRow {
  UpdateNeed need;
  const char* name;
  // Which paths take it, in UpdatePath's order: fused, graphed, libtorch.
  std::array<bool, kNumUpdatePaths> takes;
  // The refusal, with {key} (the path's key, "ppo.fused_update"), {setting} (what asked for the need) and {path}
  // (the path's name).
  const char* refusal;
};

// The table. Keep the copy in update_paths.h's comment true (update_paths_test compares them).
constexpr std::array<NeedRow, kNumUpdateNeeds> kTable{{
    {UpdateNeed::kCore, "a recurrent core (ppo.core)", {false, false, true},
     "{key}=on cannot train {setting} ({path} takes rows, not chunks through a recurrent core)"},
    {UpdateNeed::kCentralisedCritic, "a centralised critic (global state)", {false, true, true},
     "{key}=on cannot train {setting}: {path} has no centralised critic"},
    {UpdateNeed::kValueNorm, "value normalisation (ppo.value_norm)", {false, true, true},
     "{setting} cannot run with {key}=on ({path} has no value normalisation)"},
    {UpdateNeed::kRanks, "learner ranks", {true, false, true},
     "{key}=on cannot run with {setting} ({path} does not take ranks)"},
    {UpdateNeed::kSde, "state-dependent exploration (ppo.sde)", {false, true, true},
     "{key}=on cannot train {setting} ({path} has no state-dependent exploration, only a state-independent log-std)"},
    {UpdateNeed::kEncoderScript, "a TorchScript encoder", {false, false, true},
     "{key}=on cannot run a TorchScript encoder ({setting}): {path} does not capture a TorchScript encoder"},
    {UpdateNeed::kEncoder, "an encoder other than the mlp", {false, true, true},
     "{key}=on needs ppo.encoder=mlp (got {setting}): {path} knows only the MLP"},
    {UpdateNeed::kActivation, "an activation other than tanh", {false, true, true},
     "{key}=on needs ppo.activation=tanh: {path} has only tanh ({setting})"},
    {UpdateNeed::kLayerNorm, "layer norm (ppo.layer_norm)", {false, true, true},
     "{key}=on needs ppo.layer_norm=false: {path} has no layer norm ({setting})"},
    {UpdateNeed::kBf16, "bf16", {false, true, true},
     "{key}=on needs learner.precision=fp32 (got {setting}): {path} is fp32 only"},
    {UpdateNeed::kFp16, "fp16", {false, false, true},
     "{key}=on cannot run {setting}: {path} has no fp16 loss scaling"},
    {UpdateNeed::kCuda, "a CUDA device", {false, true, true},
     "{key}=on needs learner.device=cpu (got {setting}): {path} runs on the CPU"},
}};

constexpr bool RowsInOrder() {
  for (std::size_t i = 0; i < kTable.size(); ++i)
    if (static_cast<std::size_t>(kTable[i].need) != i) return false;
  return true;
}
static_assert(RowsInOrder(), "kTable's rows must follow UpdateNeed's order");

const NeedRow& Row(UpdateNeed need) { return kTable[static_cast<std::size_t>(need)]; }

}  // namespace

const char* UpdatePathName(UpdatePath path) {
  switch (path) {
    case UpdatePath::kFused: return "the fused update";
    case UpdatePath::kGraphed: return "the graphed step";
    case UpdatePath::kLibtorch: return "the LibTorch update";
  }
  return "?";
}

const char* UpdatePathId(UpdatePath path) {
  switch (path) {
    case UpdatePath::kFused: return "fused";
    case UpdatePath::kGraphed: return "graphed";
    case UpdatePath::kLibtorch: return "libtorch";
  }
  return "?";
}

const char* UpdatePathKey(UpdatePath path) {
  switch (path) {
    case UpdatePath::kFused: return "ppo.fused_update";
    case UpdatePath::kGraphed: return "ppo.graph_update";
    case UpdatePath::kLibtorch: return nullptr;
  }
  return nullptr;
}

const char* UpdateNeedName(UpdateNeed need) { return Row(need).name; }

bool Takes(UpdatePath path, UpdateNeed need) { return Row(need).takes[static_cast<std::size_t>(path)]; }

void UpdateNeeds::Ask(UpdateNeed need, std::string setting) {
  settings_[static_cast<std::size_t>(need)] = setting.empty() ? std::string(UpdateNeedName(need)) : std::move(setting);
}

void UpdateNeeds::Drop(UpdateNeed need) { settings_[static_cast<std::size_t>(need)].clear(); }

UpdateNeeds ConfigNeeds(const FarmConfig& c) {
  UpdateNeeds n;
  if (c.ppo.core != "none") n.Ask(UpdateNeed::kCore, "ppo.core=" + c.ppo.core);
  if (c.ppo.value_norm != "none") n.Ask(UpdateNeed::kValueNorm, "ppo.value_norm=" + c.ppo.value_norm);
  if (c.ppo.sde) n.Ask(UpdateNeed::kSde, "ppo.sde");
  if (c.ppo.has_encoder_script())
    n.Ask(UpdateNeed::kEncoderScript, fmt::format("ppo.actor_encoder_script '{}', ppo.critic_encoder_script '{}'",
                                                  c.ppo.actor_encoder_script, c.ppo.critic_encoder_script));
  if (c.ppo.encoder != "mlp") n.Ask(UpdateNeed::kEncoder, c.ppo.encoder);
  if (c.ppo.activation != "tanh") n.Ask(UpdateNeed::kActivation, "ppo.activation is " + c.ppo.activation);
  if (c.ppo.layer_norm) n.Ask(UpdateNeed::kLayerNorm, "ppo.layer_norm is true");
  if (c.learner.precision == "bf16") n.Ask(UpdateNeed::kBf16, "learner.precision=bf16");
  if (c.learner.precision == "fp16") n.Ask(UpdateNeed::kFp16, "learner.precision=fp16");
  // auto may pick a CUDA device: a path that runs only on the CPU needs learner.device=cpu.
  if (c.learner.device != "cpu") n.Ask(UpdateNeed::kCuda, "learner.device=" + c.learner.device);
  return n;
}

Status CheckUpdatePath(UpdatePath path, const UpdateNeeds& needs) {
  const char* key = UpdatePathKey(path);
  for (const NeedRow& row : kTable) {
    if (!needs.asks(row.need) || row.takes[static_cast<std::size_t>(path)]) continue;
    return Status::InvalidArgument(fmt::format(row.refusal, fmt::arg("key", key ? key : UpdatePathId(path)),
                                               fmt::arg("setting", needs.setting(row.need)),
                                               fmt::arg("path", UpdatePathName(path))));
  }
  return Status::Ok();
}

std::string UpdatePathTable() {
  std::string out = fmt::format("{:<39}{:<8}{:<9}{}\n", "need", "fused", "graphed", "libtorch");
  for (const NeedRow& row : kTable) {
    const auto cell = [&](UpdatePath p) { return Takes(p, row.need) ? "yes" : "-"; };
    out += fmt::format("{:<39}{:<8}{:<9}{}\n", row.name, cell(UpdatePath::kFused), cell(UpdatePath::kGraphed),
                       cell(UpdatePath::kLibtorch));
  }
  return out;
}

}  // namespace farm
