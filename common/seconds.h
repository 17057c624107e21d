// A steady-clock duration in seconds, as the learner's time splits and reports count them.
#pragma once

#include <chrono>

namespace farm {

inline double Seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace farm
