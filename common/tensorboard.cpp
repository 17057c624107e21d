// TensorBoard event files: TFRecord framing with masked CRC32C around
// serialized tensorboard.Event protos. See tensorboard.h for the format.
#include "common/tensorboard.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "tensorboard_event.pb.h"

namespace farm {
namespace {

constexpr uint32_t kCrc32cPolynomial = 0x82F63B78u;  // Castagnoli, bit-reflected
constexpr uint32_t kCrcMaskDelta = 0xa282ead8u;
constexpr char kFileVersion[] = "brain.Event:2";

constexpr std::array<uint32_t, 256> MakeCrc32cTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 1u) ? (crc >> 1) ^ kCrc32cPolynomial : crc >> 1;
    table[i] = crc;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kCrc32cTable = MakeCrc32cTable();

// Byte order is fixed by the format, not by the host.
void AppendLittleEndian(uint64_t v, int bytes, std::string* out) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xffu));
}

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t Crc32c(const void* data, std::size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t crc = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < size; ++i) crc = kCrc32cTable[(crc ^ p[i]) & 0xffu] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t MaskCrc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + kCrcMaskDelta; }

Status TensorBoardWriter::Open(const std::string& dir, std::unique_ptr<TensorBoardWriter>* out) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IoError("cannot create TensorBoard directory '" + dir + "': " + ec.message());

  const long long seconds = static_cast<long long>(NowSeconds());
  const std::string base =
      (std::filesystem::path(dir) / ("events.out.tfevents." + std::to_string(seconds) + "." + HostName())).string();
  std::string path = base;
  std::FILE* file = nullptr;
  for (int attempt = 0; attempt < 1000; ++attempt) {
    if (attempt > 0) path = base + "." + std::to_string(attempt);
    file = std::fopen(path.c_str(), "wbx");  // "x": fail rather than truncate an existing file
    if (file != nullptr || errno != EEXIST) break;
  }
  if (file == nullptr) {
    return Status::IoError("cannot create TensorBoard event file '" + path + "': " + std::strerror(errno));
  }

  std::unique_ptr<TensorBoardWriter> writer(new TensorBoardWriter(path, file));
  tensorboard::Event event;
  event.set_wall_time(NowSeconds());
  event.set_step(0);
  event.set_file_version(kFileVersion);
  writer->WriteRecord(event.SerializeAsString());
  const Status st = writer->Flush();
  if (!st.ok()) return st;
  *out = std::move(writer);
  return Status::Ok();
}

TensorBoardWriter::~TensorBoardWriter() = default;  // fclose flushes

void TensorBoardWriter::AddScalar(const std::string& tag, double value, int64_t step, double wall_time) {
  AddScalars({{tag, value}}, step, wall_time);
}

void TensorBoardWriter::AddScalars(const std::vector<std::pair<std::string, double>>& values, int64_t step,
                                   double wall_time) {
  tensorboard::Event event;
  event.set_wall_time(wall_time);
  event.set_step(step);
  tensorboard::Summary* summary = event.mutable_summary();
  for (const auto& [tag, value] : values) {
    tensorboard::Summary::Value* v = summary->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));
  }
  WriteRecord(event.SerializeAsString());
  Flush();  // the error, if any, stays in status_
}

Status TensorBoardWriter::Flush() {
  if (status_.ok() && std::fflush(file_.get()) != 0) {
    status_ = Status::IoError("cannot flush TensorBoard event file '" + path_ + "': " + std::strerror(errno));
  }
  return status_;
}

void TensorBoardWriter::WriteRecord(const std::string& data) {
  if (!status_.ok()) return;
  std::string record;
  record.reserve(8 + 4 + data.size() + 4);
  AppendLittleEndian(data.size(), 8, &record);
  AppendLittleEndian(MaskCrc32c(Crc32c(record.data(), 8)), 4, &record);
  record += data;
  AppendLittleEndian(MaskCrc32c(Crc32c(data.data(), data.size())), 4, &record);
  if (std::fwrite(record.data(), 1, record.size(), file_.get()) != record.size()) {
    status_ = Status::IoError("cannot write TensorBoard event file '" + path_ + "': " + std::strerror(errno));
  }
}

}  // namespace farm
