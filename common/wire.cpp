// Conversions between wire messages and in-memory spaces and buffers.
#include "common/wire.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

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
  out->set_kind(space.is_discrete() ? wire::Space::DISCRETE : wire::Space::BOX);
  out->set_dtype(ToWire(space.dtype));
  out->mutable_shape()->Assign(space.shape.begin(), space.shape.end());
  out->set_n(space.n);
  out->mutable_low()->Assign(space.low.begin(), space.low.end());
  out->mutable_high()->Assign(space.high.begin(), space.high.end());
}

Status FromWire(const wire::Space& in, Space* out) {
  Space s;
  if (in.kind() == wire::Space::DISCRETE) {
    if (in.n() <= 0) return Status::Protocol(fmt::format("discrete space needs n > 0, got {}", in.n()));
    s = Space::Discrete(in.n());
    return (*out = s, Status::Ok());
  }
  if (in.kind() != wire::Space::BOX)
    return Status::Protocol(fmt::format("unknown space kind {}", static_cast<int>(in.kind())));
  s.kind = Space::Kind::kBox;
  if (auto st = FromWire(in.dtype(), &s.dtype); !st.ok()) return st;
  s.shape.assign(in.shape().begin(), in.shape().end());
  for (auto d : s.shape)
    if (d <= 0) return Status::Protocol(fmt::format("box shape {} has a non-positive dimension", ShapeString(s.shape)));
  if (s.shape.empty()) return Status::Protocol("box space has an empty shape");
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
  std::size_t numel = 1;
  for (auto d : shape) numel *= static_cast<std::size_t>(d);
  const std::size_t bytes = numel * dtype_size(dtype);
  if (t.data().size() != bytes)
    return Status::Protocol(fmt::format("{}: shape {} needs {} bytes, got {}", what, ShapeString(shape), bytes,
                                        t.data().size()));
  return Status::Ok();
}

std::string Encode(const wire::Envelope& envelope) { return envelope.SerializeAsString(); }

Status Decode(const void* data, std::size_t size, wire::Envelope* out) {
  if (!out->ParseFromArray(data, static_cast<int>(size)))
    return Status::Protocol(fmt::format("cannot parse a {}-byte message as farm.wire.Envelope", size));
  if (out->body_case() == wire::Envelope::BODY_NOT_SET)
    return Status::Protocol("message has no body (unknown message type or empty envelope)");
  return Status::Ok();
}

}  // namespace farm
