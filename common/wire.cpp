// Conversions between wire messages and in-memory spaces and buffers.
#include "common/wire.h"

#include "common/non_finite.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace farm {

wire::DType ToWire(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return wire::FLOAT32;
    case DType::kFloat64: return wire::FLOAT64;
    case DType::kInt32: return wire::INT32;
    case DType::kInt64: return wire::INT64;
    case DType::kUInt8: return wire::UINT8;
  }
  return wire::DTYPE_UNSPECIFIED;
}

Status FromWire(wire::DType dtype, DType* out) {
  switch (dtype) {
    case wire::FLOAT32: *out = DType::kFloat32; return Status::Ok();
    case wire::FLOAT64: *out = DType::kFloat64; return Status::Ok();
    case wire::INT32: *out = DType::kInt32; return Status::Ok();
    case wire::INT64: *out = DType::kInt64; return Status::Ok();
    case wire::UINT8: *out = DType::kUInt8; return Status::Ok();
    default: break;
  }
  return Status::Protocol(fmt::format("unknown dtype {}", static_cast<int>(dtype)));
}

void ToWire(const Space& space, wire::Space* out) {
  out->set_kind(space.is_discrete()         ? wire::Space::DISCRETE
                : space.is_multi_discrete() ? wire::Space::MULTI_DISCRETE
                                            : wire::Space::BOX);
  out->set_dtype(ToWire(space.dtype));
  out->mutable_shape()->Assign(space.shape.begin(), space.shape.end());
  out->set_n(space.n);
  out->mutable_nvec()->Assign(space.nvec.begin(), space.nvec.end());
  out->mutable_low()->Assign(space.low.begin(), space.low.end());
  out->mutable_high()->Assign(space.high.begin(), space.high.end());
}

Status FromWire(const wire::Space& in, Space* out) {
  Space s;
  if (in.kind() == wire::Space::DISCRETE) {
    if (in.n() <= 0 || in.n() > kMaxSpaceElements)
      return Status::Protocol(fmt::format("discrete space needs 0 < n <= {}, got {}", kMaxSpaceElements, in.n()));
    s = Space::Discrete(in.n());
    return (*out = s, Status::Ok());
  }
  if (in.kind() == wire::Space::MULTI_DISCRETE) {
    if (in.nvec_size() == 0 || in.nvec_size() > kMaxSpaceComponents)
      return Status::Protocol(fmt::format("multi-discrete space needs 1 to {} components in nvec, got {}",
                                          kMaxSpaceComponents, in.nvec_size()));
    int64_t total = 0;  // the policy head has one logit per choice
    for (int i = 0; i < in.nvec_size(); ++i) {
      const int64_t c = in.nvec(i);
      if (c <= 0 || c > kMaxSpaceElements - total)
        return Status::Protocol(fmt::format(
            "multi-discrete space needs every nvec entry > 0 and at most {} choices in all, got nvec[{}] = {}",
            kMaxSpaceElements, i, c));
      total += c;
    }
    s = Space::MultiDiscrete(std::vector<int64_t>(in.nvec().begin(), in.nvec().end()));
    return (*out = s, Status::Ok());
  }
  if (in.kind() != wire::Space::BOX)
    return Status::Protocol(fmt::format("unknown space kind {}", static_cast<int>(in.kind())));
  s.kind = Space::Kind::kBox;
  if (auto st = FromWire(in.dtype(), &s.dtype); !st.ok()) return st;
  s.shape.assign(in.shape().begin(), in.shape().end());
  if (s.shape.empty()) return Status::Protocol("box space has an empty shape");
  // Bounds the element count before anyone multiplies the dimensions (Space::numel() would overflow).
  int64_t numel = 1;
  for (auto d : s.shape) {
    if (d <= 0) return Status::Protocol(fmt::format("box shape {} has a non-positive dimension", ShapeString(s.shape)));
    if (d > kMaxSpaceElements / numel)
      return Status::Protocol(
          fmt::format("box shape {} has more than {} elements", ShapeString(s.shape), kMaxSpaceElements));
    numel *= d;
  }
  s.low.assign(in.low().begin(), in.low().end());
  s.high.assign(in.high().begin(), in.high().end());
  if (static_cast<int64_t>(s.low.size()) != s.numel() || static_cast<int64_t>(s.high.size()) != s.numel())
    return Status::Protocol(fmt::format("box bounds have {}/{} entries, expected {}", s.low.size(), s.high.size(),
                                        s.numel()));
  *out = std::move(s);
  return Status::Ok();
}

void SetTensor(wire::Tensor* out, DType dtype, const std::vector<int64_t>& shape, const void* data,
               std::size_t bytes) {
  out->set_dtype(ToWire(dtype));
  out->mutable_shape()->Assign(shape.begin(), shape.end());
  out->set_data(data, bytes);
}

std::string ShapeString(const std::vector<int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

Status CheckTensor(const wire::Tensor& t, DType dtype, const std::vector<int64_t>& shape, const char* what) {
  DType got = DType::kFloat32;
  const bool dtype_ok = FromWire(t.dtype(), &got).ok() && got == dtype;
  const std::vector<int64_t> got_shape(t.shape().begin(), t.shape().end());
  if (!dtype_ok || got_shape != shape) {
    return Status::Protocol(fmt::format("{}: expected {} {}, got {} {}", what, dtype_name(dtype), ShapeString(shape),
                                        dtype_ok ? dtype_name(got) : "unknown-dtype", ShapeString(got_shape)));
  }
  // The expected shape may hold a count from the message (final_obs): a product that overflows is refused,
  // not wrapped around to a size that happens to match.
  std::size_t bytes = dtype_size(dtype);
  for (auto d : shape) {
    if (d < 0 || __builtin_mul_overflow(bytes, static_cast<std::size_t>(d), &bytes))
      return Status::Protocol(fmt::format("{}: shape {} is too large", what, ShapeString(shape)));
  }
  if (t.data().size() != bytes)
    return Status::Protocol(fmt::format("{}: shape {} needs {} bytes, got {}", what, ShapeString(shape), bytes,
                                        t.data().size()));
  return Status::Ok();
}

std::string Encode(const wire::Envelope& envelope) { return envelope.SerializeAsString(); }

Status Decode(const void* data, std::size_t size, wire::Envelope* out) {
  if (size > static_cast<std::size_t>(std::numeric_limits<int>::max()))
    return Status::Protocol(fmt::format("a {}-byte message is larger than protobuf can parse", size));
  if (!out->ParseFromArray(data, static_cast<int>(size)))
    return Status::Protocol(fmt::format("cannot parse a {}-byte message as farm.wire.Envelope", size));
  if (out->body_case() == wire::Envelope::BODY_NOT_SET)
    return Status::Protocol("message has no body (unknown message type or empty envelope)");
  return Status::Ok();
}

Status CheckHello(const wire::Hello& h, Handshake* out) {
  if (h.protocol_version() != kProtocolVersion)
    return Status::Protocol(fmt::format("protocol version {} is not supported (expected {})", h.protocol_version(),
                                        kProtocolVersion));
  if (h.num_groups() == 0 || h.num_envs() == 0 || h.num_envs() % h.num_groups() != 0)
    return Status::Protocol(fmt::format("num_envs ({}) must be a positive multiple of num_groups ({})", h.num_envs(),
                                        h.num_groups()));
  if (h.num_envs() > kMaxEnvsPerWorker)
    return Status::Protocol(fmt::format("num_envs ({}) is more than one worker may have ({})", h.num_envs(),
                                        kMaxEnvsPerWorker));
  const uint32_t agents = h.num_agents() == 0 ? 1 : h.num_agents();  // absent: a single-agent env
  if (uint64_t{h.num_envs()} * agents > kMaxEnvsPerWorker)
    return Status::Protocol(fmt::format("num_envs x num_agents ({} x {}) is more rows than one worker may have ({})",
                                        h.num_envs(), agents, kMaxEnvsPerWorker));
  Handshake hs;
  if (auto s = FromWire(h.observation(), &hs.observation); !s.ok())
    return Status::Protocol("observation space: " + s.message());
  if (auto s = FromWire(h.action(), &hs.action); !s.ok()) return Status::Protocol("action space: " + s.message());
  if (!hs.observation.is_box() || hs.observation.dtype != DType::kFloat32)
    return Status::Protocol("observation space must be a float32 box, got " + hs.observation.ToString());
  if (hs.action.is_box() && hs.action.dtype != DType::kFloat32)
    return Status::Protocol("action space must be discrete, multi-discrete or a float32 box, got " +
                            hs.action.ToString());
  if (h.has_global_state()) {
    Space state;
    if (auto s = FromWire(h.global_state(), &state); !s.ok()) return Status::Protocol("global state: " + s.message());
    if (!state.is_box() || state.dtype != DType::kFloat32)
      return Status::Protocol("global state must be a float32 box, got " + state.ToString());
    hs.global_state = std::move(state);
  }
  hs.num_groups = h.num_groups();
  hs.group_size = h.num_envs() / h.num_groups();
  hs.num_agents = agents;
  hs.group_rows = hs.group_size * agents;
  *out = std::move(hs);
  return Status::Ok();
}

Status CheckStepRequest(const wire::StepRequest& req, int64_t group_size, const std::vector<int64_t>& obs_shape,
                        const std::vector<uint64_t>& next_seq) {
  if (req.group() >= next_seq.size())
    return Status::Protocol(fmt::format("group {} out of range (worker has {} groups)", req.group(), next_seq.size()));
  const uint64_t expected = next_seq[req.group()];
  if (req.seq() < expected)
    return Status::Protocol(fmt::format("group {}: seq {} out of order (expected {}): a duplicate of a request "
                                        "already received",
                                        req.group(), req.seq(), expected));
  if (req.seq() != expected)
    return Status::Protocol(fmt::format("group {}: seq {} out of order (expected {})", req.group(), req.seq(),
                                        expected));
  if (req.first() != (req.seq() == 0))
    return Status::Protocol(fmt::format("group {}: 'first' must be set exactly on seq 0", req.group()));
  const int64_t n = group_size;
  std::vector<int64_t> shape{n};
  shape.insert(shape.end(), obs_shape.begin(), obs_shape.end());
  if (auto s = CheckTensor(req.obs(), DType::kFloat32, shape, "StepRequest.obs"); !s.ok()) return s;
  // active: absent (every row acts) or a 0/1 byte per row. After a reset every agent acts, so a first request
  // (the group's envs just reset) has no row that finished.
  if (!req.active().empty()) {
    if (static_cast<int64_t>(req.active().size()) != n)
      return Status::Protocol(
          fmt::format("StepRequest.active: expected {} bytes (one per row) or none, got {}", n, req.active().size()));
    const auto* active = reinterpret_cast<const uint8_t*>(req.active().data());
    for (int64_t r = 0; r < n; ++r) {
      if (active[r] > 1)
        return Status::Protocol(fmt::format("StepRequest.active: row {} holds {}, expected 0 or 1", r, int{active[r]}));
      if (req.first() && active[r] == 0)
        return Status::Protocol(fmt::format(
            "StepRequest.active: row {} is 0 on a first request, expected 1 (every agent acts after a reset)", r));
    }
  }
  if (req.first()) {
    // Nothing has been stepped yet: final observations here would be read (and bootstrapped) unchecked.
    if (req.final_obs_index_size() > 0)
      return Status::Protocol(fmt::format("StepRequest.final_obs_index: {} entries on a first request (no step "
                                          "results yet)",
                                          req.final_obs_index_size()));
    return Status::Ok();
  }
  if (auto s = CheckTensor(req.reward(), DType::kFloat32, {n}, "StepRequest.reward"); !s.ok()) return s;
  if (static_cast<int64_t>(req.terminated().size()) != n || static_cast<int64_t>(req.truncated().size()) != n)
    return Status::Protocol(fmt::format("terminated/truncated: expected {} bytes each, got {}/{}", n,
                                        req.terminated().size(), req.truncated().size()));
  // Flags are bytes 0 or 1, and a row ends one way: truncated means the time limit ended an episode that did
  // not terminate (Gymnasium's TimeLimit), so the learner bootstraps it and never a terminal.
  const auto* terminated = reinterpret_cast<const uint8_t*>(req.terminated().data());
  const auto* truncated = reinterpret_cast<const uint8_t*>(req.truncated().data());
  int64_t truncated_rows = 0;
  for (int64_t r = 0; r < n; ++r) {
    if (terminated[r] > 1)
      return Status::Protocol(
          fmt::format("StepRequest.terminated: row {} holds {}, expected 0 or 1", r, int{terminated[r]}));
    if (truncated[r] > 1)
      return Status::Protocol(
          fmt::format("StepRequest.truncated: row {} holds {}, expected 0 or 1", r, int{truncated[r]}));
    if (terminated[r] && truncated[r])
      return Status::Protocol(
          fmt::format("StepRequest row {}: terminated and truncated both set, expected at most "
                      "one (a row truncated by the time limit is one that did not terminate)",
                      r));
    truncated_rows += truncated[r];
  }
  const int64_t k = req.final_obs_index_size();
  if (k > 0) {
    shape[0] = k;
    if (auto s = CheckTensor(req.final_obs(), DType::kFloat32, shape, "StepRequest.final_obs"); !s.ok()) return s;
  }
  // final_obs_index is exactly the truncated rows, ascending: each gets gamma * V(final obs) once, and a
  // truncated row without one would be bootstrapped as if it had terminated.
  for (int64_t j = 0; j < k; ++j) {
    const int32_t i = req.final_obs_index(static_cast<int>(j));
    if (i < 0 || i >= n)
      return Status::Protocol(fmt::format("StepRequest.final_obs_index {} out of range [0, {}) at entry {}", i, n, j));
    if (j > 0 && i <= req.final_obs_index(static_cast<int>(j - 1)))
      return Status::Protocol(
          fmt::format("StepRequest.final_obs_index: entry {} ({}) {} entry {} ({}), expected "
                      "strictly ascending rows, each listed once",
                      j, i, i == req.final_obs_index(static_cast<int>(j - 1)) ? "repeats" : "is below", j - 1,
                      req.final_obs_index(static_cast<int>(j - 1))));
    if (truncated[i] != 1)
      return Status::Protocol(
          fmt::format("StepRequest.final_obs_index: entry {} names row {}, which was not "
                      "truncated (truncated[{}] = 0{}), expected only rows with truncated = 1",
                      j, i, i, terminated[i] ? ", terminated" : ""));
  }
  if (truncated_rows != k) {
    // Every entry names a distinct truncated row, so some truncated row has none: the first such one.
    int64_t j = 0;
    for (int64_t r = 0; r < n; ++r) {
      if (!truncated[r]) continue;
      if (j < k && req.final_obs_index(static_cast<int>(j)) == r) {
        ++j;
        continue;
      }
      return Status::Protocol(
          fmt::format("StepRequest.final_obs_index: row {} was truncated but is not listed "
                      "({} truncated rows, {} entries), expected every truncated row with its "
                      "final observation",
                      r, truncated_rows, k));
    }
  }
  return Status::Ok();
}

namespace {

// NaN and both infinities: every exponent bit set, exactly when (bits & 0x7f800000) + 0x00800000 carries
// into bit 31. A bit test rather than std::isfinite, so that the scan over a whole tensor runs without a
// branch per float.
constexpr uint32_t kExponent = 0x7f800000u;
constexpr uint32_t kExponentCarry = 0x00800000u;

// The bytes may sit at any alignment inside a protobuf string: read with memcpy.
float LoadFloat(const char* p) {
  float v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Whether any of the `n` floats at `data` is non-finite: one pass, unaligned loads, four 16-byte vectors per
// iteration with SSE2 (1 instruction per float against 2 for the compiler's vectorisation of a compare).
bool AnyNonFinite(const char* data, int64_t n) {
  int64_t i = 0;
  uint32_t any = 0;
#if defined(__SSE2__)
  const __m128i exponent = _mm_set1_epi32(static_cast<int>(kExponent));
  const __m128i carry = _mm_set1_epi32(static_cast<int>(kExponentCarry));
  __m128i a0 = _mm_setzero_si128(), a1 = a0, a2 = a0, a3 = a0;
  for (; i + 16 <= n; i += 16) {
    const auto* p = reinterpret_cast<const __m128i*>(data + i * 4);
    a0 = _mm_or_si128(a0, _mm_add_epi32(_mm_and_si128(_mm_loadu_si128(p), exponent), carry));
    a1 = _mm_or_si128(a1, _mm_add_epi32(_mm_and_si128(_mm_loadu_si128(p + 1), exponent), carry));
    a2 = _mm_or_si128(a2, _mm_add_epi32(_mm_and_si128(_mm_loadu_si128(p + 2), exponent), carry));
    a3 = _mm_or_si128(a3, _mm_add_epi32(_mm_and_si128(_mm_loadu_si128(p + 3), exponent), carry));
  }
  // Bit 31 of each lane set: a non-finite value in that lane.
  any = _mm_movemask_ps(_mm_castsi128_ps(_mm_or_si128(_mm_or_si128(a0, a1), _mm_or_si128(a2, a3)))) != 0 ? 0x80000000u : 0;
#endif
  for (; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, data + i * 4, sizeof bits);
    any |= (bits & kExponent) + kExponentCarry;
  }
  return (any & 0x80000000u) != 0;
}

// Index of the first non-finite float among the `n` at `data`, or -1. Finite data (the rule) is read once;
// the exact index is looked for only in a chunk that has one.
int64_t FirstNonFinite(const char* data, int64_t n) {
  constexpr int64_t kChunk = 4096;
  for (int64_t begin = 0; begin < n; begin += kChunk) {
    const int64_t end = std::min(n, begin + kChunk);
    if (!AnyNonFinite(data + begin * 4, end - begin)) continue;
    for (int64_t i = begin; i < end; ++i)
      if (!std::isfinite(LoadFloat(data + i * 4))) return i;
  }
  return -1;
}

int64_t ZeroNonFinite(char* data, int64_t n) {
  int64_t replaced = 0;
  for (int64_t i = FirstNonFinite(data, n); i >= 0 && i < n; ++i) {
    if (std::isfinite(LoadFloat(data + i * 4))) continue;
    const float zero = 0.0f;
    std::memcpy(data + i * 4, &zero, sizeof zero);
    ++replaced;
  }
  return replaced;
}

int64_t FloatCount(const std::string& bytes) { return static_cast<int64_t>(bytes.size() / sizeof(float)); }

}  // namespace

std::string NonFinite::ToString(int64_t row_elements) const {
  std::string out = fmt::format("{}[{}] = {}", field, index, value);
  if (row_elements > 1)
    out += fmt::format(" (row {}, element {})", index / row_elements, index % row_elements);
  return out;
}

namespace {

bool ScanField(const std::string& bytes, const char* field, NonFinite* first) {
  const int64_t i = FirstNonFinite(bytes.data(), FloatCount(bytes));
  if (i < 0) return false;
  *first = NonFinite{field, i, LoadFloat(bytes.data() + i * 4)};
  return true;
}

bool FindNonFiniteEpisode(const wire::StepRequest& req, NonFinite* first) {
  for (int i = 0; i < req.episodes_size(); ++i) {
    const float r = req.episodes(i).episode_return();
    if (!std::isfinite(r)) {
      *first = NonFinite{"StepRequest.episodes.episode_return", i, r};
      return true;
    }
  }
  return false;
}

}  // namespace

bool FindNonFinite(const wire::StepRequest& req, NonFinite* first) {
  return ScanField(req.obs().data(), "StepRequest.obs", first) ||
         ScanField(req.reward().data(), "StepRequest.reward", first) ||
         ScanField(req.final_obs().data(), "StepRequest.final_obs", first) ||
         ScanField(req.global_state().data(), "StepRequest.global_state", first) ||
         ScanField(req.final_global_state().data(), "StepRequest.final_global_state", first) ||
         FindNonFiniteEpisode(req, first);
}

bool FindNonFiniteBesidesObsAndState(const wire::StepRequest& req, NonFinite* first) {
  return ScanField(req.reward().data(), "StepRequest.reward", first) ||
         ScanField(req.final_obs().data(), "StepRequest.final_obs", first) ||
         ScanField(req.final_global_state().data(), "StepRequest.final_global_state", first) ||
         FindNonFiniteEpisode(req, first);
}

int64_t CopyUntilNonFinite(const std::string& bytes, void* dst) {
  const int64_t n = FloatCount(bytes);
  const char* src = bytes.data();
  auto* out = static_cast<char*>(dst);
  constexpr int64_t kChunk = 4096;  // floats: 16 KiB, well within L1
  for (int64_t begin = 0; begin < n; begin += kChunk) {
    const int64_t end = std::min(n, begin + kChunk);
    if (AnyNonFinite(src + begin * 4, end - begin)) {
      for (int64_t i = begin; i < end; ++i)
        if (!std::isfinite(LoadFloat(src + i * 4))) return i;
    }
    std::memcpy(out + begin * 4, src + begin * 4, static_cast<std::size_t>(end - begin) * 4);
  }
  return -1;
}

int64_t SanitizeNonFinite(wire::StepRequest* req) {
  int64_t replaced = 0;
  for (wire::Tensor* t : {req->mutable_obs(), req->mutable_reward(), req->mutable_final_obs()}) {
    std::string* bytes = t->mutable_data();
    replaced += ZeroNonFinite(bytes->data(), FloatCount(*bytes));
  }
  // Only when present: mutable_*() would add an empty state to a request without one.
  if (req->has_global_state()) {
    std::string* bytes = req->mutable_global_state()->mutable_data();
    replaced += ZeroNonFinite(bytes->data(), FloatCount(*bytes));
  }
  if (req->has_final_global_state()) {
    std::string* bytes = req->mutable_final_global_state()->mutable_data();
    replaced += ZeroNonFinite(bytes->data(), FloatCount(*bytes));
  }
  for (auto& ep : *req->mutable_episodes()) {
    if (!std::isfinite(ep.episode_return())) {
      ep.set_episode_return(0.0f);
      ++replaced;
    }
  }
  return replaced;
}

int64_t MaxSessionMessageBytes(int64_t group_rows, int64_t obs_numel, const Space& action, int64_t state_numel) {
  // Per tensor or message: tags, lengths, dtype, shape, seq, group, version. Generous, never tight.
  constexpr int64_t kHeaders = 1024;
  // Per row: reward (4), terminated, truncated and active (1 + 1 + 1), a final_obs_index varint (<= 10) and
  // one EpisodeStats (tag, length, float, varint: <= 24; one per env, so per row at most).
  constexpr int64_t kPerEnv = 41;
  const int64_t obs_bytes = obs_numel * static_cast<int64_t>(sizeof(float));
  const int64_t request = 2 * group_rows * obs_bytes + group_rows * kPerEnv + kHeaders;
  const int64_t action_bytes = action.numel() * (action.is_categorical() ? int64_t{8} : int64_t{4});
  const int64_t reply = group_rows * action_bytes + kHeaders;
  const int64_t base = std::max(request, reply);
  if (state_numel == 0) return base;
  // The state and final-state tensors' tags, lengths, dtype and shape, then a state per row and per final row.
  return base + 2 * group_rows * state_numel * static_cast<int64_t>(sizeof(float)) + kHeaders;
}

int64_t MaxSessionMessageBytes(int64_t group_size, const Space& observation, const Space& action) {
  return MaxSessionMessageBytes(group_size, observation.numel(), action, 0);
}

int64_t MaxSessionMessageBytes(int64_t group_rows, const Space& observation, const Space& action,
                               const std::optional<Space>& global_state) {
  return MaxSessionMessageBytes(group_rows, observation.numel(), action, global_state ? global_state->numel() : 0);
}

Status CheckStepWholeEnvs(const wire::StepRequest& req, uint32_t num_agents) {
  const int64_t k = req.final_obs_index_size();
  if (req.first() && k > 0)
    return Status::Protocol(fmt::format("StepRequest.final_obs_index: {} entries on a first request (no step "
                                        "results yet)",
                                        k));
  if (num_agents <= 1) return Status::Ok();
  const int64_t n = num_agents;
  for (int64_t i = 0; i < k; ++i) {
    const int64_t want = i % n == 0 ? -1 : req.final_obs_index(static_cast<int>(i - i % n)) + i % n;
    const int64_t got = req.final_obs_index(static_cast<int>(i));
    if ((i % n == 0 && got % n != 0) || (i % n != 0 && got != want) || (i + n - i % n > k))
      return Status::Protocol(fmt::format("StepRequest.final_obs_index: entry {} ({}) breaks the runs of whole envs "
                                          "it must list ({} agents per env: rows e * {} to e * {} + {}, ascending)",
                                          i, got, n, n, n, n - 1));
  }
  return Status::Ok();
}

Status CheckStepGlobalState(const wire::StepRequest& req, int64_t group_rows, uint32_t num_agents,
                            const std::vector<int64_t>* state_shape) {
  if (state_shape == nullptr) {
    if (req.has_global_state() || req.has_final_global_state())
      return Status::Protocol("StepRequest.global_state: sent, but the worker's Hello declared no global state");
    return Status::Ok();
  }
  const int64_t n = std::max<uint32_t>(num_agents, 1);
  std::vector<int64_t> shape{group_rows / n};  // one state per env
  shape.insert(shape.end(), state_shape->begin(), state_shape->end());
  if (auto s = CheckTensor(req.global_state(), DType::kFloat32, shape, "StepRequest.global_state"); !s.ok()) return s;
  const int64_t k = req.first() ? 0 : req.final_obs_index_size();
  if (k == 0) {
    if (req.has_final_global_state())
      return Status::Protocol("StepRequest.final_global_state: sent without final_obs_index entries");
    return Status::Ok();
  }
  if (k % n != 0)
    return Status::Protocol(fmt::format("StepRequest.final_obs_index: {} entries are not whole envs of {} agents", k, n));
  shape[0] = k / n;
  return CheckTensor(req.final_global_state(), DType::kFloat32, shape, "StepRequest.final_global_state");
}

}  // namespace farm
