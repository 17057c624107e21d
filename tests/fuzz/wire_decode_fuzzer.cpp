// libFuzzer target: arbitrary bytes through the receivers' decode path.
//
// Decode() parses an Envelope; then, per message kind, the checks a receiver
// makes before it touches the payload: CheckHello, CheckStepRequest,
// CheckStepGlobalState, CheckStepWholeEnvs and the non-finite scan (the
// learner, against the fixed handshakes of fuzz_messages.h) and CheckTensor on
// an ActionReply (the worker). Whatever a check accepts is then read the way
// the receiver reads it, at the sizes the handshake implies, so ASan sees any
// buffer a check let through too short, and UBSan any overflow on the way;
// flags and final_obs_index must hold what the learner's bootstrapping assumes.
// A check that accepts something it must not is reported with abort().
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/protobuf_log.h"
#include "tests/fuzz/fuzz_messages.h"

namespace {

using namespace farm;

void Require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz invariant violated: %s\n", what);
  std::abort();
}

// Sums what the learner reads, so that the reads are not optimised away.
volatile float g_sink = 0;

void OnHello(const wire::Hello& h) {
  Handshake hs;
  if (!CheckHello(h, &hs).ok()) return;
  Require(hs.group_size > 0 && hs.num_groups > 0, "accepted Hello has an empty group layout");
  Require(static_cast<uint64_t>(hs.group_size) * hs.num_groups == h.num_envs(), "groups do not cover num_envs");
  Require(h.num_envs() <= kMaxEnvsPerWorker, "accepted Hello has too many envs");
  Require(hs.num_agents >= 1 && hs.group_rows == hs.group_size * hs.num_agents &&
              hs.group_rows * hs.num_groups <= kMaxEnvsPerWorker,
          "accepted Hello has a bad row count");
  std::vector<const Space*> spaces{&hs.observation, &hs.action};
  if (hs.global_state) {
    Require(hs.global_state->is_box() && hs.global_state->dtype == DType::kFloat32, "global state not a box");
    spaces.push_back(&*hs.global_state);
  }
  // The learner compares this bound with transport.max_message_bytes: it must not overflow.
  Require(MaxSessionMessageBytes(hs.group_rows, hs.observation, hs.action, hs.global_state) > 0,
          "message bound not positive");
  for (const Space* space : spaces) {
    const int64_t numel = space->numel();
    Require(numel > 0 && numel <= kMaxSpaceElements, "accepted space has a bad element count");
    if (space->is_box()) {
      Require(static_cast<int64_t>(space->low.size()) == numel && static_cast<int64_t>(space->high.size()) == numel,
              "accepted box has bounds of the wrong size");
      for (int64_t i = 0; i < numel; ++i) g_sink = g_sink + space->low[i] + space->high[i];
    } else if (space->is_multi_discrete()) {
      // The policy sizes one head of sum(nvec) logits and checks each component's action against nvec[i].
      Require(static_cast<int64_t>(space->nvec.size()) == numel && numel <= kMaxSpaceComponents,
              "accepted multi-discrete space has a bad component count");
      int64_t logits = 0;
      for (int64_t c : space->nvec) {
        Require(c > 0 && c <= kMaxSpaceElements - logits, "accepted multi-discrete space has a bad nvec");
        logits += c;
      }
      Require(space->head_size() == logits, "multi-discrete head size is not sum(nvec)");
    }
    (void)space->ToString();
  }
  Require(hs.observation.dtype == DType::kFloat32 && hs.observation.is_box(), "observation not a float32 box");
  // The bytes of one group's observations: what the learner and its store size buffers by.
  uint64_t bytes = 0;
  Require(!__builtin_mul_overflow(static_cast<uint64_t>(hs.group_size),
                                  static_cast<uint64_t>(hs.observation.numel()) * sizeof(float), &bytes),
          "a group's observation bytes overflow");
}

// The learner's checks of a request from a worker with `rows` rows per group (and, when `state` is set,
// a global state of that shape and `agents` agents per env), then its reads of what they accepted.
void OnStepFrom(const wire::StepRequest& req, int64_t rows, const std::vector<int64_t>* state, uint32_t agents) {
  if (!CheckStepRequest(req, rows, fuzz::kObsShape, fuzz::kNextSeq).ok()) return;
  if (!CheckStepGlobalState(req, rows, agents, state).ok()) return;
  if (!CheckStepWholeEnvs(req, agents).ok()) return;
  const int64_t n = rows;
  // The learner copies the observations into its batch tensor: exactly n rows.
  std::vector<float> batch(static_cast<std::size_t>(n * fuzz::kObsNumel));
  Require(req.obs().data().size() == batch.size() * sizeof(float), "accepted obs of the wrong size");
  std::memcpy(batch.data(), req.obs().data().data(), req.obs().data().size());
  const int64_t k = req.first() ? 0 : req.final_obs_index_size();
  if (state) {
    // One state per env: the learner copies n / agents of them, then one per truncated env.
    const int64_t envs = n / agents, final_envs = k / agents;
    Require(k % agents == 0, "accepted final_obs_index entries that are not whole envs");
    std::vector<float> states(static_cast<std::size_t>((envs + final_envs) * fuzz::kStateNumel));
    Require(req.global_state().data().size() == static_cast<std::size_t>(envs * fuzz::kStateNumel) * sizeof(float),
            "accepted global_state of the wrong size");
    std::memcpy(states.data(), req.global_state().data().data(), req.global_state().data().size());
    if (k > 0) {
      Require(req.final_global_state().data().size() ==
                  static_cast<std::size_t>(final_envs * fuzz::kStateNumel) * sizeof(float),
              "accepted final_global_state of the wrong size");
      std::memcpy(states.data() + envs * fuzz::kStateNumel, req.final_global_state().data().data(),
                  req.final_global_state().data().size());
    }
  }
  // What learner.non_finite does: find the first NaN/Inf, or zero them all; afterwards none is left.
  NonFinite first;
  if (FindNonFinite(req, &first)) (void)first.ToString(fuzz::kObsNumel);
  wire::StepRequest copy = req;
  const int64_t replaced = SanitizeNonFinite(&copy);
  Require(replaced >= 0 && !FindNonFinite(copy, &first), "SanitizeNonFinite left a non-finite value");
  if (req.first()) return;
  // The trajectory store reads rewards as floats and the flags as bytes.
  const auto* reward = reinterpret_cast<const float*>(req.reward().data().data());
  const auto* terminated = reinterpret_cast<const uint8_t*>(req.terminated().data());
  const auto* truncated = reinterpret_cast<const uint8_t*>(req.truncated().data());
  int64_t truncated_rows = 0;
  for (int64_t i = 0; i < n; ++i) {
    g_sink = g_sink + reward[i] + static_cast<float>(terminated[i] + truncated[i]);
    Require(terminated[i] <= 1 && truncated[i] <= 1, "accepted a flag byte other than 0 or 1");
    Require(!(terminated[i] && truncated[i]), "accepted a row both terminated and truncated");
    truncated_rows += truncated[i];
  }
  // The learner adds gamma * V(final obs) once per entry: the entries are the truncated rows, each once.
  Require(truncated_rows == k, "accepted final_obs_index entries that are not one per truncated row");
  for (int64_t j = 0; j < k; ++j) {
    const int32_t i = req.final_obs_index(static_cast<int>(j));
    Require(i >= 0 && i < n && truncated[i] == 1, "accepted a final_obs_index entry of a row not truncated");
    Require(j == 0 || i > req.final_obs_index(static_cast<int>(j - 1)), "accepted final_obs_index not ascending");
  }
  // Final observations follow in the batch tensor; their indices address the group's rows.
  std::vector<float> finals(static_cast<std::size_t>(k * fuzz::kObsNumel));
  if (k > 0) {
    Require(req.final_obs().data().size() == finals.size() * sizeof(float), "accepted final_obs of the wrong size");
    std::memcpy(finals.data(), req.final_obs().data().data(), req.final_obs().data().size());
  }
  std::vector<float> group_reward(static_cast<std::size_t>(n));
  for (int32_t i : req.final_obs_index()) group_reward.at(static_cast<std::size_t>(i)) += 1.0f;
  for (const auto& ep : req.episodes()) g_sink = g_sink + ep.episode_return() + static_cast<float>(ep.length());
}

void OnStep(const wire::StepRequest& req) {
  OnStepFrom(req, fuzz::kGroupSize, nullptr, 1);
  OnStepFrom(req, fuzz::kGroupRows, &fuzz::kStateShape, fuzz::kNumAgents);
}

void OnAction(const wire::ActionReply& reply) {
  const int64_t n = fuzz::kGroupSize;
  if (CheckTensor(reply.action(), DType::kInt64, {n}, "ActionReply.action").ok()) {
    const auto* a = reinterpret_cast<const int64_t*>(reply.action().data().data());
    for (int64_t i = 0; i < n; ++i) g_sink = g_sink + static_cast<float>(a[i] >= 0 && a[i] < fuzz::kNumActions);
  }
  std::vector<int64_t> shape{n};
  shape.insert(shape.end(), fuzz::kBoxActionShape.begin(), fuzz::kBoxActionShape.end());
  if (CheckTensor(reply.action(), DType::kFloat32, shape, "ActionReply.action").ok()) {
    const auto* a = reinterpret_cast<const float*>(reply.action().data().data());
    for (int64_t i = 0; i < n * fuzz::kBoxActionShape[0]; ++i) g_sink = g_sink + a[i];
  }
}

}  // namespace

// Protobuf logs every string field with invalid UTF-8 it refuses; the refusal itself is what is checked.
// Its messages go through the learner's and worker's handler (into spdlog, a line per 10 s at most),
// which is fuzzed along with them.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  InstallProtobufLogHandler();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  wire::Envelope envelope;
  const Status decoded = Decode(data, size, &envelope);
  if (!decoded.ok()) {
    Require(decoded.code() == Status::Code::kProtocol && !decoded.message().empty(), "decode error without a message");
    return 0;
  }
  Require(envelope.body_case() != wire::Envelope::BODY_NOT_SET, "decoded an envelope without a body");
  switch (envelope.body_case()) {
    case wire::Envelope::kHello: OnHello(envelope.hello()); break;
    case wire::Envelope::kStep: OnStep(envelope.step()); break;
    case wire::Envelope::kAction: OnAction(envelope.action()); break;
    default: break;
  }
  // What one side sends, the other decodes.
  const std::string again = Encode(envelope);
  wire::Envelope back;
  Require(Decode(again.data(), again.size(), &back).ok(), "a decoded envelope does not survive a round trip");
  Require(back.body_case() == envelope.body_case(), "the round trip changed the message kind");
  return 0;
}
