// Why a log handler rather than `bytes` fields: the messages protobuf logs at
// a client's rate are its complaints about proto3 `string` fields holding
// invalid UTF-8 (Hello.worker_id and env_name, Welcome.error, Stop.reason,
// Error.message). Changing them to `bytes` would stop the complaints and keep
// the wire format, but it would also drop the check, and those texts are used
// as text: the learner quotes env_name in its log, in a refusal's
// Welcome.error (a string again, for the other side to parse) and in
// summary.json (nlohmann::json throws on invalid UTF-8 when it writes); the
// worker logs the learner's Error.message, Stop.reason and Welcome.error. Each
// use would need its own validation, and the Python worker's API would change
// (str -> bytes; assigning a str to a bytes field raises). Keeping `string`
// means a message with invalid UTF-8 still fails to parse, and the learner
// answers it with an Error and counts it in protocol_errors, as any other
// undecodable message; the handler only keeps protobuf's line about it from
// flooding the log, and covers every other message protobuf may log too.
#include "common/protobuf_log.h"

#include <google/protobuf/stubs/common.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cctype>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include <fmt/format.h>

// protobuf 4.22 and later log through Abseil and have no SetLogHandler.
#if GOOGLE_PROTOBUF_VERSION < 4022000
#include <google/protobuf/stubs/logging.h>
#define FARM_PROTOBUF_LOG_HANDLER 1
#else
#define FARM_PROTOBUF_LOG_HANDLER 0
#endif

namespace farm {
namespace {

// Never destroyed: protobuf may log from another thread or a static destructor while the process exits.
struct Router {
  std::mutex mu;                            // guards limiter's replacement
  std::shared_ptr<LogRateLimiter> limiter;  // null until installed
  std::atomic<int64_t> messages{0};
};
Router& TheRouter() {
  static Router* router = new Router;
  return *router;
}

#if FARM_PROTOBUF_LOG_HANDLER
spdlog::level::level_enum ToSpdlog(google::protobuf::LogLevel level) {
  switch (level) {
    case google::protobuf::LOGLEVEL_INFO: return spdlog::level::info;
    case google::protobuf::LOGLEVEL_WARNING: return spdlog::level::warn;
    case google::protobuf::LOGLEVEL_ERROR: return spdlog::level::err;
    default: return spdlog::level::critical;
  }
}

void Handle(google::protobuf::LogLevel level, const char* filename, int line, const std::string& message) {
  Router& r = TheRouter();
  r.messages.fetch_add(1, std::memory_order_relaxed);
  // FATAL: protobuf throws or aborts right after; never hold that line back.
  if (level == google::protobuf::LOGLEVEL_FATAL) {
    spdlog::critical("protobuf: {} ({}:{})", message, filename ? filename : "?", line);
    return;
  }
  std::shared_ptr<LogRateLimiter> limiter;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    limiter = r.limiter;
  }
  // The kind is protobuf's source location: a bounded set, whatever the input.
  const auto d = limiter->Allow(fmt::format("{}:{}", filename ? filename : "?", line));
  if (!d.log) return;
  std::string_view text(message);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  spdlog::log(ToSpdlog(level), "protobuf: {}{}", text, LogRateLimiter::Suffix(d));
}
#endif

}  // namespace

void InstallProtobufLogHandler(LogRateLimiter::Now now) {
  Router& r = TheRouter();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.limiter && !now) return;
  const bool first = !r.limiter;
  r.limiter = std::make_shared<LogRateLimiter>(kLogRateInterval, std::move(now));
  r.messages.store(0);
#if FARM_PROTOBUF_LOG_HANDLER
  if (first) google::protobuf::SetLogHandler(&Handle);
#else
  (void)first;  // protobuf's Abseil logging is left as it is
#endif
}

int64_t ProtobufLogMessages() { return TheRouter().messages.load(); }

}  // namespace farm
