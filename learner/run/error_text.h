// ErrorText: what an exception says, for logs and stop reasons. LibTorch's errors without their C++ backtrace;
// std::bad_alloc named as running out of memory.
#pragma once

#include <exception>
#include <string>

namespace farm {

std::string ErrorText(const std::exception& e);

}  // namespace farm
