// farm-keygen: makes one CURVE key pair for the learner or a worker (docs/OPERATIONS.md, "Security: CURVE keys").
//   farm-keygen DIR NAME  ->  DIR/NAME.key (the secret key, mode 0600) and DIR/NAME.pub ("PUBLIC_KEY NAME")
// Existing files are never overwritten.
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>
#include <zmq.h>

#include <CLI/CLI.hpp>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <regex>
#include <string>

#include "common/curve.h"
#include "common/status.h"

namespace {

namespace fs = std::filesystem;

// Creates `path` with `mode` (failing if it exists), writes `text` and syncs it.
farm::Status WriteNewFile(const std::string& path, const std::string& text, mode_t mode) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) return farm::Status::IoError(fmt::format("{}: cannot create: {}", path, std::strerror(errno)));
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return farm::Status::IoError(fmt::format("{}: write failed: {}", path, std::strerror(err)));
    }
    done += static_cast<std::size_t>(n);
  }
  const int rc = ::fsync(fd);
  const int err = errno;
  if (::close(fd) != 0 || rc != 0)
    return farm::Status::IoError(fmt::format("{}: cannot sync: {}", path, std::strerror(rc != 0 ? err : errno)));
  return farm::Status::Ok();
}

int Fail(const std::string& message) {
  fmt::print(stderr, "farm-keygen: {}\n", message);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Rollout Farm CURVE keys: writes DIR/NAME.key (the secret key, mode 0600; it never leaves its host) and "
      "DIR/NAME.pub (\"PUBLIC_KEY NAME\", to hand out: the learner's to its workers, a worker's to the learner's "
      "transport.curve_authorized_keys)"};
  std::string dir, name;
  app.add_option("DIR", dir, "folder for the key files (created when missing)")->required();
  app.add_option("NAME", name, "key name: letters, digits, '.', '_' and '-'")->required();
  CLI11_PARSE(app, argc, argv);

  if (!std::regex_match(name, std::regex("[A-Za-z0-9_-][A-Za-z0-9._-]*")))
    return Fail(fmt::format("NAME '{}': expected letters, digits, '.', '_' and '-' (not starting with '.')", name));
  if (auto s = farm::CheckCurveSupport(); !s.ok()) return Fail(s.message());
  const std::string secret_path = (fs::path(dir) / (name + ".key")).string();
  const std::string public_path = (fs::path(dir) / (name + ".pub")).string();
  std::error_code ec;
  for (const auto& p : {secret_path, public_path})
    if (fs::exists(p, ec)) return Fail(fmt::format("{} already exists; remove it first or choose another NAME", p));
  if (!fs::is_directory(dir, ec)) {
    fs::create_directories(dir, ec);
    if (ec) return Fail(fmt::format("{}: cannot create the folder: {}", dir, ec.message()));
  }
  std::array<char, farm::kCurveKeyZ85Size + 1> public_key{}, secret_key{};
  if (zmq_curve_keypair(public_key.data(), secret_key.data()) != 0)
    return Fail(fmt::format("zmq_curve_keypair failed: {}", zmq_strerror(zmq_errno())));
  if (auto s = WriteNewFile(secret_path, std::string(secret_key.data()) + "\n", 0600); !s.ok()) return Fail(s.message());
  if (auto s = WriteNewFile(public_path, fmt::format("{} {}\n", public_key.data(), name), 0644); !s.ok())
    return Fail(s.message());
  fmt::print("{}\n{}\npublic key: {}\n", secret_path, public_path, public_key.data());
  return 0;
}
