// Conversions between wire messages (proto/farm.proto) and in-memory types,
// plus the checks a receiver makes on tensors it did not build itself.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/space.h"
#include "common/status.h"
#include "farm.pb.h"

namespace farm {

// Bumped on any incompatible change to farm.proto's meaning.
// 2: multi-agent envs (Hello.num_agents: a request's rows are envs x agents)
//    and global states (Hello.global_state, StepRequest.global_state and
//    final_global_state).
// 3: global states once per env, not once per agent row
//    (StepRequest.global_state [envs, state...], final_global_state one per
//    truncated env). A learner refuses any other version by name.
constexpr uint32_t kProtocolVersion = 3;

// Receivers' limits, far above any real use and low enough that sizes derived
// from them (envs x elements x 8 bytes) cannot overflow 64 bits.
constexpr uint32_t kMaxEnvsPerWorker = 1u << 20;
constexpr int64_t kMaxSpaceElements = int64_t{1} << 31;  // per observation or action; also a discrete n
// Components of a multi-discrete action space (the policy runs one categorical head per component).
constexpr int kMaxSpaceComponents = 4096;

wire::DType ToWire(DType dtype);
Status FromWire(wire::DType dtype, DType* out);
void ToWire(const Space& space, wire::Space* out);
Status FromWire(const wire::Space& space, Space* out);

// Fills `out` with dtype, shape and a copy of `bytes` bytes at `data`.
void SetTensor(wire::Tensor* out, DType dtype, const std::vector<int64_t>& shape, const void* data, std::size_t bytes);

// Checks that `t` holds `dtype` with exactly `shape` and a matching byte
// count. The message names `what` and says what was expected and observed.
Status CheckTensor(const wire::Tensor& t, DType dtype, const std::vector<int64_t>& shape, const char* what);

std::string ShapeString(const std::vector<int64_t>& shape);

// Serialises an envelope to bytes / parses one, with a clear error.
std::string Encode(const wire::Envelope& envelope);
Status Decode(const void* data, std::size_t size, wire::Envelope* out);

// A worker's Hello once checked: what the learner serves it by.
struct Handshake {
  Space observation;  // a float32 box
  Space action;       // discrete, multi-discrete, or a float32 box
  uint32_t num_groups = 0;
  int64_t group_size = 0;  // envs per group
  uint32_t num_agents = 1;  // agents per env (Hello.num_agents, 0 read as 1)
  int64_t group_rows = 0;   // rows of one group's requests: group_size * num_agents
  std::optional<Space> global_state;  // a float32 box, when the env has one
};

// The learner's checks of a Hello that need none of its state: protocol
// version, group layout (num_envs a positive multiple of num_groups, at most
// kMaxEnvsPerWorker, and so are its rows, num_envs x num_agents), spaces a
// policy can serve, and a global state (when given) that is a float32 box.
Status CheckHello(const wire::Hello& hello, Handshake* out);

// The learner's checks of a StepRequest from a worker with `group_size` envs
// per group, observations of `obs_shape`, and next_seq[g] the seq expected
// next from group g (one entry per group): group in range, seq in order,
// `first` exactly on seq 0, obs [group_size, obs...], active absent or
// group_size bytes each 0 or 1 (all 1 on the first request); after the first request
// also reward [group_size], group_size terminated/truncated bytes, each 0 or
// 1 and never both 1 on one row, and final_obs [k, obs...] for k
// final_obs_index entries that are exactly the truncated rows, strictly
// ascending (none on the first request). When it returns Ok every buffer may
// be read at those sizes, and each truncated row has one final observation.
Status CheckStepRequest(const wire::StepRequest& req, int64_t group_size, const std::vector<int64_t>& obs_shape,
                        const std::vector<uint64_t>& next_seq);

// The global-state fields of a request that CheckStepRequest accepted, from a
// worker with `group_rows` rows per group and `num_agents` agents per env:
// with `state_shape` (the Hello's global state), global_state [group_rows /
// num_agents, state...] (one per env) and, after the first request,
// final_global_state [len(final_obs_index) / num_agents, state...] (one per
// truncated env; absent when no env was truncated); without (nullptr),
// neither field may be present.
Status CheckStepGlobalState(const wire::StepRequest& req, int64_t group_rows, uint32_t num_agents,
                            const std::vector<int64_t>* state_shape);

// What the learner relies on to keep an env's agents together, for a request
// that passed CheckStepRequest, from a worker of `num_agents` agents per env:
// final_obs_index lists whole envs (num_agents consecutive rows from a
// multiple of num_agents) and is empty on a first request.
Status CheckStepWholeEnvs(const wire::StepRequest& req, uint32_t num_agents);

// A NaN or infinite float in a StepRequest that passed CheckStepRequest.
struct NonFinite {
  std::string field;  // "StepRequest.obs", ".reward", ".final_obs", ".global_state", ".final_global_state"
                      // or ".episodes.episode_return"
  int64_t index = 0;  // flat element index within that field
  float value = 0;
  std::string ToString(int64_t row_elements) const;  // "StepRequest.obs[5] = nan (row 1, element 2)"
};

// The first non-finite value of obs, reward, final_obs, global_state,
// final_global_state and the episodes' returns (in that order), or false when
// every one is finite.
bool FindNonFinite(const wire::StepRequest& req, NonFinite* first);

// Replaces every non-finite value of those fields by 0; returns how many.
int64_t SanitizeNonFinite(wire::StepRequest* req);

// An upper bound on the bytes of any message of a session with `group_size`
// envs per group: a StepRequest (obs and, with every env truncated, as many
// final observations; rewards, flags, indices, episodes) or an ActionReply.
// Compare with transport.max_message_bytes: ZeroMQ drops a peer that sends more.
int64_t MaxSessionMessageBytes(int64_t group_size, const Space& observation, const Space& action);
// The same bound for a session whose requests have `group_rows` rows (envs x
// agents per group) and, when `global_state` is set, states (generous: a
// state and a final state per row, added to the larger of request and reply).
int64_t MaxSessionMessageBytes(int64_t group_rows, const Space& observation, const Space& action,
                               const std::optional<Space>& global_state);
// The same bound from a row's element counts: `obs_numel` floats of
// observation and `state_numel` of global state (0: none). For a worker that
// checks its config before it builds anything of that size (a stacked
// observation space holds bounds for every element).
int64_t MaxSessionMessageBytes(int64_t group_rows, int64_t obs_numel, const Space& action, int64_t state_numel);

}  // namespace farm
