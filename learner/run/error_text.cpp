#include "learner/run/error_text.h"

#include <c10/util/Exception.h>

#include <new>

namespace farm {

std::string ErrorText(const std::exception& e) {
  if (const auto* torch_error = dynamic_cast<const c10::Error*>(&e)) return torch_error->what_without_backtrace();
  if (dynamic_cast<const std::bad_alloc*>(&e)) return std::string("out of memory: an allocation failed (") + e.what() + ")";
  return e.what();
}

}  // namespace farm
