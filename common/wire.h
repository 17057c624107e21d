// Conversions between wire messages (proto/farm.proto) and in-memory types,
// plus the checks a receiver makes on tensors it did not build itself.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/space.h"
#include "common/status.h"
#include "farm.pb.h"

namespace farm {

// Bumped on any incompatible change to farm.proto's meaning.
constexpr uint32_t kProtocolVersion = 1;

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

}  // namespace farm
