// TensorBoardWriter: scalar summaries in TensorBoard's event-file format,
// written from C++ without TensorFlow (`tensorboard --logdir runs/` reads them).
//
// Threading: NOT thread-safe. One thread owns a writer and makes every call.
//
// File: <dir>/events.out.tfevents.<unix seconds>.<hostname>, a sequence of
// TFRecords, each holding one serialized tensorboard.Event
// (proto/tensorboard_event.proto); the first one carries file_version
// "brain.Event:2". A record is
//   uint64 length (little-endian) | uint32 masked CRC32C of those 8 bytes |
//   data | uint32 masked CRC32C of data
// with mask(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace farm {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, init and final xor
// 0xFFFFFFFF): Crc32c("123456789", 9) == 0xE3069283.
uint32_t Crc32c(const void* data, std::size_t size);

// The rotation-plus-constant TFRecord applies to every stored CRC, so that a
// CRC computed over data that itself holds CRCs stays meaningful.
uint32_t MaskCrc32c(uint32_t crc);

class TensorBoardWriter {
 public:
  // Creates `dir` (and its parents) when missing, creates a new event file in
  // it and writes the file_version record. Never overwrites a file: when the
  // name is taken (two writers in one second), ".1", ".2", ... is appended,
  // which TensorBoard still picks up ("tfevents" in the name is what it matches).
  static Status Open(const std::string& dir, std::unique_ptr<TensorBoardWriter>* out);

  ~TensorBoardWriter();  // flushes and closes; an error there is lost: call Flush() first to see it
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One Event holding one value. `value` is stored as a float32
  // (Summary.Value.simple_value). Flushes like AddScalars.
  void AddScalar(const std::string& tag, double value, int64_t step, double wall_time);

  // One Event holding every (tag, value), then a flush so a live TensorBoard
  // sees the point at once. The first write error is kept and returned by
  // every later Flush(); writes after it are skipped.
  void AddScalars(const std::vector<std::pair<std::string, double>>& values, int64_t step, double wall_time);

  // Pushes buffered records to the OS; returns the first error seen so far.
  Status Flush();

  const std::string& path() const { return path_; }

 private:
  struct FileCloser {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };

  TensorBoardWriter(std::string path, std::FILE* file) : path_(std::move(path)), file_(file) {}
  void WriteRecord(const std::string& data);

  std::string path_;
  std::unique_ptr<std::FILE, FileCloser> file_;
  Status status_;  // first error; ok while none
};

}  // namespace farm
