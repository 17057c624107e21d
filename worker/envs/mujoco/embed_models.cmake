# Writes OUT, a C++ file defining farm::mujoco::BuiltinModelFiles() with the text of every MJCF file in
# MODELS_DIR (run by the build whenever one of them changes: worker/CMakeLists.txt).
#   cmake -DMODELS_DIR=... -DOUT=... -P embed_models.cmake
file(GLOB files RELATIVE "${MODELS_DIR}" "${MODELS_DIR}/*.xml")
list(SORT files)
set(body "")
foreach(f IN LISTS files)
  file(READ "${MODELS_DIR}/${f}" text)
  if(text MATCHES "\\)farm_mjcf\"")
    message(FATAL_ERROR "${f} contains the raw string's delimiter )farm_mjcf\"")
  endif()
  string(APPEND body "      {\"${f}\", R\"farm_mjcf(${text})farm_mjcf\"},\n")
endforeach()
set(content "// Generated from worker/envs/mujoco/models/*.xml by embed_models.cmake: do not edit.
#include \"worker/envs/mujoco/builtin_models.h\"

namespace farm::mujoco {

const std::map<std::string, std::string>& BuiltinModelFiles() {
  static const std::map<std::string, std::string> files{
${body}  };
  return files;
}

}  // namespace farm::mujoco
")
# Rewritten only when it changes, so an untouched model costs no recompilation.
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
  if(old STREQUAL content)
    return()
  endif()
endif()
file(WRITE "${OUT}" "${content}")
