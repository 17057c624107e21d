// libprotobuf's own log messages, routed into spdlog and rate limited.
#pragma once

#include <cstdint>

#include "common/log_limit.h"

namespace farm {

// Installs, once per process, a protobuf log handler (google::protobuf::SetLogHandler)
// that writes protobuf's messages through spdlog ("protobuf: ..."), at most one
// line per kLogRateInterval per source location of protobuf's, with the count of
// those dropped in between. Call it while the process is starting, before any
// thread parses messages (the learner and the worker do, in their Create).
// Without it protobuf writes one stderr line per bad message (such as an
// invalid UTF-8 string field), at whatever rate a client sends them.
//
// A later call without `now` changes nothing; a call with `now` starts afresh
// with that clock (for tests).
void InstallProtobufLogHandler(LogRateLimiter::Now now = {});

// Messages protobuf has logged since the handler was installed, written or not.
int64_t ProtobufLogMessages();

}  // namespace farm
