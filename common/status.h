// Status: errors at boundaries (config, wire, files) as values, LevelDB style.
#pragma once

#include <string>
#include <utility>

namespace farm {

class Status {
 public:
  enum class Code { kOk = 0, kInvalidArgument, kNotFound, kIoError, kProtocol, kClosed, kInternal };

  Status() = default;
  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string msg) { return Status(Code::kInvalidArgument, std::move(msg)); }
  static Status NotFound(std::string msg) { return Status(Code::kNotFound, std::move(msg)); }
  static Status IoError(std::string msg) { return Status(Code::kIoError, std::move(msg)); }
  static Status Protocol(std::string msg) { return Status(Code::kProtocol, std::move(msg)); }
  static Status Closed(std::string msg) { return Status(Code::kClosed, std::move(msg)); }
  // A failure inside the program (an exception from a library where none was expected), not in its input.
  static Status Internal(std::string msg) { return Status(Code::kInternal, std::move(msg)); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string ToString() const;

 private:
  Status(Code code, std::string msg) : code_(code), message_(std::move(msg)) {}
  Code code_ = Code::kOk;
  std::string message_;
};

}  // namespace farm
