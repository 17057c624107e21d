// TensorBoard event files: read back by a reader written here, apart from the
// writer (its own bitwise CRC32C, its own record parser, a raw protobuf walk
// that pins TensorBoard's field numbers), so a shared mistake cannot hide.
#include "common/tensorboard.h"
#include "common/files.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tensorboard_event.pb.h"

using namespace farm;
namespace fs = std::filesystem;

namespace {

// Bit at a time, no table: an independent CRC-32C.
uint32_t BitwiseCrc32c(const std::string& s) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char c : s) {
    crc ^= c;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

uint32_t Masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

uint64_t ReadLittleEndian(const std::string& bytes, size_t pos, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t(static_cast<unsigned char>(bytes[pos + i])) << (8 * i);
  return v;
}

// Splits a TFRecord file into record payloads. Any framing or CRC problem
// leaves `error` non-empty and stops.
struct Records {
  std::vector<std::string> data;
  std::string error;
};

Records ParseRecords(const std::string& bytes) {
  Records r;
  size_t pos = 0;
  while (pos < bytes.size()) {
    if (bytes.size() - pos < 12) {
      r.error = "truncated header at " + std::to_string(pos);
      return r;
    }
    const std::string len_bytes = bytes.substr(pos, 8);
    if (ReadLittleEndian(bytes, pos + 8, 4) != Masked(BitwiseCrc32c(len_bytes))) {
      r.error = "length CRC mismatch at " + std::to_string(pos);
      return r;
    }
    const uint64_t len = ReadLittleEndian(bytes, pos, 8);
    pos += 12;
    if (bytes.size() - pos < len + 4) {
      r.error = "truncated data at " + std::to_string(pos);
      return r;
    }
    std::string data = bytes.substr(pos, len);
    if (ReadLittleEndian(bytes, pos + len, 4) != Masked(BitwiseCrc32c(data))) {
      r.error = "data CRC mismatch at " + std::to_string(pos);
      return r;
    }
    r.data.push_back(std::move(data));
    pos += len + 4;
  }
  return r;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A fresh directory under the system temp dir, removed at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("farm_tensorboard_test_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
    (void)RemoveTree(path.string());
  }
  ~TempDir() { (void)RemoveTree(path.string()); }
};

// One protobuf field as it sits on the wire.
struct Field {
  int number;
  int wire_type;
  uint64_t scalar;      // varint, fixed32, fixed64
  std::string payload;  // length-delimited
};

uint64_t ReadVarint(const std::string& s, size_t* pos) {
  uint64_t v = 0;
  for (int shift = 0; *pos < s.size(); shift += 7) {
    const auto b = static_cast<unsigned char>(s[(*pos)++]);
    v |= uint64_t(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
  FAIL("truncated varint");
  return 0;
}

std::vector<Field> WalkFields(const std::string& s) {
  std::vector<Field> out;
  size_t pos = 0;
  while (pos < s.size()) {
    const uint64_t key = ReadVarint(s, &pos);
    Field f{static_cast<int>(key >> 3), static_cast<int>(key & 7), 0, {}};
    switch (f.wire_type) {
      case 0:
        f.scalar = ReadVarint(s, &pos);
        break;
      case 1:
        REQUIRE(pos + 8 <= s.size());
        f.scalar = ReadLittleEndian(s, pos, 8);
        pos += 8;
        break;
      case 5:
        REQUIRE(pos + 4 <= s.size());
        f.scalar = ReadLittleEndian(s, pos, 4);
        pos += 4;
        break;
      case 2: {
        const uint64_t n = ReadVarint(s, &pos);
        REQUIRE(pos + n <= s.size());
        f.payload = s.substr(pos, n);
        pos += n;
        break;
      }
      default:
        FAIL("unexpected wire type " << f.wire_type);
    }
    out.push_back(f);
  }
  return out;
}

}  // namespace

TEST_CASE("CRC32C gives the standard check value", "[tensorboard][crc]") {
  const std::string check = "123456789";
  CHECK(Crc32c(check.data(), check.size()) == 0xE3069283u);
  CHECK(BitwiseCrc32c(check) == 0xE3069283u);
  CHECK(Crc32c("", 0) == 0u);
  // 32 zero bytes: a second published CRC-32C vector (RFC 3720, B.4).
  const std::string zeros(32, '\0');
  CHECK(Crc32c(zeros.data(), zeros.size()) == 0x8A9136AAu);
  // Table and bitwise agree on every byte value and on longer input.
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  CHECK(Crc32c(all.data(), all.size()) == BitwiseCrc32c(all));
  for (int i = 0; i < 256; ++i) {
    const std::string one(1, static_cast<char>(i));
    REQUIRE(Crc32c(one.data(), 1) == BitwiseCrc32c(one));
  }
  CHECK(MaskCrc32c(0xE3069283u) == Masked(0xE3069283u));
  CHECK(MaskCrc32c(0) == 0xa282ead8u);
}

TEST_CASE("Scalars round trip through an independent reader", "[tensorboard]") {
  TempDir tmp;
  const fs::path dir = tmp.path / "nested" / "tb";  // missing: Open creates it
  std::unique_ptr<TensorBoardWriter> writer;
  REQUIRE(TensorBoardWriter::Open(dir.string(), &writer).ok());
  REQUIRE(writer != nullptr);

  char host[256] = {};
  REQUIRE(gethostname(host, sizeof(host) - 1) == 0);
  // events.out.tfevents.<unix seconds>.<hostname>
  const fs::path path(writer->path());
  CHECK(path.parent_path() == dir);
  const std::string name = path.filename().string();
  const std::string prefix = "events.out.tfevents.";
  REQUIRE(name.rfind(prefix, 0) == 0);
  const size_t dot = name.find('.', prefix.size());
  REQUIRE(dot != std::string::npos);
  const std::string seconds = name.substr(prefix.size(), dot - prefix.size());
  CHECK(seconds.find_first_not_of("0123456789") == std::string::npos);
  CHECK(std::abs(std::stoll(seconds) - static_cast<long long>(std::time(nullptr))) < 60);
  CHECK(name.substr(dot + 1) == host);

  writer->AddScalar("charts/sps", 12345.5, 100, 1700000000.25);
  writer->AddScalars({{"losses/policy", -0.125}, {"losses/value", 3.5}, {"charts/mean_return_100", 487.0}}, 2048,
                     1700000001.5);
  writer->AddScalars({}, 4096, 1700000002.0);  // an Event with an empty Summary is still a valid record
  REQUIRE(writer->Flush().ok());

  // Readable before the writer closes: AddScalars flushed.
  const Records records = ParseRecords(ReadFile(writer->path()));
  REQUIRE(records.error.empty());
  REQUIRE(records.data.size() == 4);

  tensorboard::Event first;
  REQUIRE(first.ParseFromString(records.data[0]));
  CHECK(first.what_case() == tensorboard::Event::kFileVersion);
  CHECK(first.file_version() == "brain.Event:2");
  CHECK(first.wall_time() > 1.6e9);

  tensorboard::Event one;
  REQUIRE(one.ParseFromString(records.data[1]));
  REQUIRE(one.has_summary());
  CHECK(one.step() == 100);
  CHECK(one.wall_time() == 1700000000.25);
  REQUIRE(one.summary().value_size() == 1);
  CHECK(one.summary().value(0).tag() == "charts/sps");
  CHECK(one.summary().value(0).simple_value() == 12345.5f);

  tensorboard::Event many;
  REQUIRE(many.ParseFromString(records.data[2]));
  REQUIRE(many.has_summary());
  CHECK(many.step() == 2048);
  CHECK(many.wall_time() == 1700000001.5);
  REQUIRE(many.summary().value_size() == 3);
  CHECK(many.summary().value(0).tag() == "losses/policy");
  CHECK(many.summary().value(0).simple_value() == -0.125f);
  CHECK(many.summary().value(1).tag() == "losses/value");
  CHECK(many.summary().value(1).simple_value() == 3.5f);
  CHECK(many.summary().value(2).tag() == "charts/mean_return_100");
  CHECK(many.summary().value(2).simple_value() == 487.0f);

  tensorboard::Event empty;
  REQUIRE(empty.ParseFromString(records.data[3]));
  CHECK(empty.step() == 4096);
  CHECK(empty.summary().value_size() == 0);

  // Closing keeps the file intact.
  const std::string kept = writer->path();
  writer.reset();
  CHECK(ParseRecords(ReadFile(kept)).data.size() == 4);
}

TEST_CASE("Records use TensorBoard's field numbers", "[tensorboard]") {
  // Upstream: tensorboard/compat/proto/event.proto and summary.proto.
  // Event: wall_time = 1 (double), step = 2, file_version = 3, summary = 5.
  // Summary: value = 1; Summary.Value: tag = 1, simple_value = 2 (float).
  TempDir tmp;
  std::unique_ptr<TensorBoardWriter> writer;
  REQUIRE(TensorBoardWriter::Open(tmp.path.string(), &writer).ok());
  writer->AddScalar("x", 0.5, 7, 1700000000.0);
  const Records records = ParseRecords(ReadFile(writer->path()));
  REQUIRE(records.error.empty());
  REQUIRE(records.data.size() == 2);

  const auto head = WalkFields(records.data[0]);
  REQUIRE(head.size() == 2);  // step 0 is the proto3 default and is not written
  CHECK((head[0].number == 1 && head[0].wire_type == 1));
  CHECK((head[1].number == 3 && head[1].wire_type == 2 && head[1].payload == "brain.Event:2"));

  const auto event = WalkFields(records.data[1]);
  REQUIRE(event.size() == 3);
  CHECK((event[0].number == 1 && event[0].wire_type == 1));
  double wall_time;
  std::memcpy(&wall_time, &event[0].scalar, sizeof(wall_time));
  CHECK(wall_time == 1700000000.0);
  CHECK((event[1].number == 2 && event[1].wire_type == 0 && event[1].scalar == 7));
  CHECK((event[2].number == 5 && event[2].wire_type == 2));
  const auto summary = WalkFields(event[2].payload);
  REQUIRE(summary.size() == 1);
  CHECK((summary[0].number == 1 && summary[0].wire_type == 2));
  const auto value = WalkFields(summary[0].payload);
  REQUIRE(value.size() == 2);
  CHECK((value[0].number == 1 && value[0].wire_type == 2 && value[0].payload == "x"));
  CHECK((value[1].number == 2 && value[1].wire_type == 5));
  const uint32_t bits = static_cast<uint32_t>(value[1].scalar);
  float simple_value;
  std::memcpy(&simple_value, &bits, sizeof(simple_value));
  CHECK(simple_value == 0.5f);
}

TEST_CASE("The reader's CRC checks catch a corrupted byte", "[tensorboard]") {
  TempDir tmp;
  std::unique_ptr<TensorBoardWriter> writer;
  REQUIRE(TensorBoardWriter::Open(tmp.path.string(), &writer).ok());
  writer->AddScalars({{"a", 1.0}, {"b", 2.0}}, 1, 1700000000.0);
  const std::string good = ReadFile(writer->path());
  const Records ok = ParseRecords(good);
  REQUIRE(ok.error.empty());
  REQUIRE(ok.data.size() == 2);
  const size_t second = 8 + 4 + ok.data[0].size() + 4;  // offset of the second record

  SECTION("in the data") {
    std::string bad = good;
    bad[second + 12 + 3] ^= 0x01;
    const Records r = ParseRecords(bad);
    CHECK(r.data.size() == 1);
    CHECK_THAT(r.error, Catch::Contains("data CRC mismatch"));
  }
  SECTION("in the length") {
    std::string bad = good;
    bad[second + 1] ^= 0x40;
    CHECK_THAT(ParseRecords(bad).error, Catch::Contains("length CRC mismatch"));
  }
  SECTION("in a stored CRC") {
    std::string bad = good;
    bad[good.size() - 1] ^= 0x80;
    CHECK_THAT(ParseRecords(bad).error, Catch::Contains("data CRC mismatch"));
  }
  SECTION("a truncated file") {
    CHECK_THAT(ParseRecords(good.substr(0, good.size() - 2)).error, Catch::Contains("truncated"));
  }
}

TEST_CASE("Open never overwrites an existing event file", "[tensorboard]") {
  TempDir tmp;
  fs::create_directories(tmp.path);
  char host[256] = {};
  REQUIRE(gethostname(host, sizeof(host) - 1) == 0);
  // Take every name Open could pick in the next few seconds.
  const long long now = static_cast<long long>(std::time(nullptr));
  std::vector<fs::path> taken;
  for (long long t = now - 1; t <= now + 5; ++t) {
    taken.push_back(tmp.path / ("events.out.tfevents." + std::to_string(t) + "." + host));
    std::ofstream(taken.back()) << "keep";
  }
  std::unique_ptr<TensorBoardWriter> a, b;
  REQUIRE(TensorBoardWriter::Open(tmp.path.string(), &a).ok());
  REQUIRE(TensorBoardWriter::Open(tmp.path.string(), &b).ok());
  CHECK(a->path().size() > 2);
  CHECK(a->path().substr(a->path().size() - 2) == ".1");
  CHECK(b->path().substr(b->path().size() - 2) == ".2");
  for (const auto& p : taken) CHECK(ReadFile(p.string()) == "keep");

  a->AddScalar("t", 1.0, 1, 1.0);
  b->AddScalar("t", 2.0, 1, 1.0);
  const Records ra = ParseRecords(ReadFile(a->path()));
  const Records rb = ParseRecords(ReadFile(b->path()));
  REQUIRE(ra.data.size() == 2);
  REQUIRE(rb.data.size() == 2);
  tensorboard::Event ea, eb;
  REQUIRE(ea.ParseFromString(ra.data[1]));
  REQUIRE(eb.ParseFromString(rb.data[1]));
  CHECK(ea.summary().value(0).simple_value() == 1.0f);
  CHECK(eb.summary().value(0).simple_value() == 2.0f);
}

TEST_CASE("Open reports a directory it cannot create", "[tensorboard]") {
  TempDir tmp;
  fs::create_directories(tmp.path);
  const fs::path blocker = tmp.path / "a_file";
  std::ofstream(blocker) << "not a directory";
  std::unique_ptr<TensorBoardWriter> writer;
  const Status st = TensorBoardWriter::Open((blocker / "tb").string(), &writer);
  CHECK_FALSE(st.ok());
  CHECK(st.code() == Status::Code::kIoError);
  CHECK_THAT(st.message(), Catch::Contains("a_file"));
  CHECK(writer == nullptr);
}
