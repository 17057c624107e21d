// Writes the seed corpus of wire_decode_fuzzer: one file per valid message.
//   wire_fuzz_seeds DIR
#include <cstdio>
#include <filesystem>

#include "common/files.h"
#include "tests/fuzz/fuzz_messages.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  std::error_code ec;
  std::filesystem::create_directories(argv[1], ec);
  if (ec) {
    std::fprintf(stderr, "%s: %s\n", argv[1], ec.message().c_str());
    return 1;
  }
  for (const auto& [name, envelope] : farm::fuzz::SeedMessages()) {
    const std::string path = std::string(argv[1]) + "/" + name;
    if (auto s = farm::WriteFileAtomic(path, farm::Encode(envelope)); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
  }
  return 0;
}
