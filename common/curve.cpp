// CURVE key files and the ZAP handler.
#include "common/curve.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <zmq_addon.hpp>

namespace farm {
namespace {

namespace fs = std::filesystem;

constexpr std::size_t kMaxLoggedRefusals = 1024;  // distinct refused keys logged; later ones are only counted
constexpr const char* kKeygenHint = "make keys with: scripts/farm keygen DIR NAME";

// Lines of a key file, '\r' removed; `first_only` stops after the first one that is not skipped.
std::vector<std::pair<int, std::vector<std::string>>> KeyLines(const std::string& text, bool first_only) {
  std::vector<std::pair<int, std::vector<std::string>>> lines;
  std::istringstream in(text);
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    line.erase(std::remove(line.begin(), line.end(), '\r'), line.end());
    // '#' is a Z85 character, so only "#" alone or followed by a space starts a comment.
    if (line == "#" || line.rfind("# ", 0) == 0) continue;
    std::istringstream words(line);
    std::vector<std::string> w{std::istream_iterator<std::string>(words), std::istream_iterator<std::string>()};
    if (w.empty()) continue;
    lines.emplace_back(number, std::move(w));
    if (first_only) break;
  }
  return lines;
}

// `hint` says how to make the missing file.
Status ReadText(const std::string& path, const std::string& config_key, const char* hint, std::string* text) {
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (!fs::exists(st)) return Status::NotFound(fmt::format("{}: '{}' does not exist ({})", config_key, path, hint));
  if (!fs::is_regular_file(st)) return Status::InvalidArgument(fmt::format("{}: '{}' is not a file", config_key, path));
  std::ifstream in(path);
  if (!in) return Status::IoError(fmt::format("{}: cannot read '{}'", config_key, path));
  std::stringstream ss;
  ss << in.rdbuf();
  *text = ss.str();
  return Status::Ok();
}

// Checks that `word` is a Z85 CURVE key; never echoes it (it may be a secret).
Status CheckKey(const std::string& word, const std::string& config_key, const std::string& where) {
  if (word.size() != kCurveKeyZ85Size)
    return Status::InvalidArgument(fmt::format("{}: {}: expected a CURVE key of {} Z85 characters, got {} characters",
                                               config_key, where, kCurveKeyZ85Size, word.size()));
  std::array<uint8_t, 32> bytes{};
  if (zmq_z85_decode(bytes.data(), word.c_str()) == nullptr)
    return Status::InvalidArgument(fmt::format("{}: {}: the key is not Z85 text", config_key, where));
  return Status::Ok();
}

// The first word of the first line that is not skipped.
Status FirstKey(const std::string& path, const std::string& config_key, std::vector<std::string>* words) {
  std::string text;
  if (auto s = ReadText(path, config_key, kKeygenHint, &text); !s.ok()) return s;
  auto lines = KeyLines(text, /*first_only=*/true);
  if (lines.empty()) return Status::InvalidArgument(fmt::format("{}: '{}' holds no key", config_key, path));
  *words = std::move(lines[0].second);
  return CheckKey((*words)[0], config_key, fmt::format("'{}' line {}", path, lines[0].first));
}

Status ReadAuthorizedFile(const std::string& path, const std::string& default_name, const std::string& config_key,
                          AuthorizedKeys* out) {
  std::string text;
  if (auto s = ReadText(path, config_key, "list the workers' NAME.pub lines in it: cat worker-*.pub > FILE", &text);
      !s.ok())
    return s;
  for (const auto& [number, words] : KeyLines(text, /*first_only=*/false)) {
    if (auto s = CheckKey(words[0], config_key, fmt::format("'{}' line {}", path, number)); !s.ok()) return s;
    const std::string name =
        words.size() > 1 ? words[1] : (default_name.empty() ? fmt::format("{}:{}", path, number) : default_name);
    out->emplace(words[0], name);
  }
  return Status::Ok();
}

}  // namespace

Status CheckCurveSupport() {
  if (zmq_has("curve")) return Status::Ok();
  int major = 0, minor = 0, patch = 0;
  zmq_version(&major, &minor, &patch);
  return Status::InvalidArgument(fmt::format(
      "CURVE is not available: the linked libzmq {}.{}.{} was built without it (libsodium); use a libzmq with "
      "CURVE (Debian's libzmq5 has it)",
      major, minor, patch));
}

Status ReadSecretKeyFile(const std::string& path, const std::string& config_key, CurveKeyPair* out) {
  if (fs::path(path).extension() == ".pub")
    return Status::InvalidArgument(
        fmt::format("{}: '{}' is a public key file; expected the secret key file (NAME.key)", config_key, path));
  std::vector<std::string> words;
  if (auto s = FirstKey(path, config_key, &words); !s.ok()) return s;
  if (words.size() != 1)
    return Status::InvalidArgument(fmt::format(
        "{}: '{}' does not look like a secret key file (NAME.key holds the key alone)", config_key, path));
  std::array<char, kCurveKeyZ85Size + 1> public_key{};
  if (zmq_curve_public(public_key.data(), words[0].c_str()) != 0)
    return Status::InvalidArgument(fmt::format("{}: '{}': cannot derive the public key: {}", config_key, path,
                                               zmq_strerror(zmq_errno())));
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0)
    spdlog::warn("{}: the secret key file '{}' can be read by other users; chmod 600 it", config_key, path);
  out->secret_key = words[0];
  out->public_key = public_key.data();
  return Status::Ok();
}

Status ReadPublicKeyFile(const std::string& path, const std::string& config_key, std::string* out) {
  std::vector<std::string> words;
  if (auto s = FirstKey(path, config_key, &words); !s.ok()) return s;
  *out = words[0];
  return Status::Ok();
}

Status ReadAuthorizedKeys(const std::string& path, const std::string& config_key, AuthorizedKeys* out) {
  std::error_code ec;
  AuthorizedKeys keys;
  if (fs::is_directory(path, ec)) {
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(path, ec))
      if (entry.path().extension() == ".pub" && entry.is_regular_file(ec)) files.push_back(entry.path());
    if (ec) return Status::IoError(fmt::format("{}: cannot list '{}': {}", config_key, path, ec.message()));
    std::sort(files.begin(), files.end());
    for (const auto& f : files)
      if (auto s = ReadAuthorizedFile(f.string(), f.stem().string(), config_key, &keys); !s.ok()) return s;
  } else {
    if (auto s = ReadAuthorizedFile(path, "", config_key, &keys); !s.ok()) return s;
  }
  if (keys.empty())
    return Status::InvalidArgument(fmt::format(
        "{}: '{}' lists no public keys, so no worker could join (a file of \"KEY NAME\" lines, or a directory of "
        "NAME.pub files)",
        config_key, path));
  *out = std::move(keys);
  return Status::Ok();
}

Status LoadCurveServerKeys(const TransportConfig& config, std::unique_ptr<CurveServerKeys>* out) {
  if (!config.curve) return Status::Ok();
  if (auto s = CheckCurveSupport(); !s.ok()) return Status::InvalidArgument("transport.curve is true, but " + s.message());
  if (config.curve_learner_secret_key_file.empty())
    return Status::InvalidArgument(fmt::format(
        "transport.curve is true but transport.curve_learner_secret_key_file is not set: the learner's secret key "
        "file ({})",
        kKeygenHint));
  if (config.curve_authorized_keys.empty())
    return Status::InvalidArgument(
        "transport.curve is true but transport.curve_authorized_keys is not set: a file of the workers' public keys "
        "(one \"KEY NAME\" per line), or a directory of their NAME.pub files");
  auto keys = std::make_unique<CurveServerKeys>();
  if (auto s = ReadSecretKeyFile(config.curve_learner_secret_key_file, "transport.curve_learner_secret_key_file",
                                 &keys->own);
      !s.ok())
    return s;
  if (auto s = ReadAuthorizedKeys(config.curve_authorized_keys, "transport.curve_authorized_keys", &keys->authorized);
      !s.ok())
    return s;
  *out = std::move(keys);
  return Status::Ok();
}

Status LoadCurveClientKeys(const TransportConfig& config, std::unique_ptr<CurveClientKeys>* out) {
  if (!config.curve) return Status::Ok();
  if (auto s = CheckCurveSupport(); !s.ok()) return Status::InvalidArgument("transport.curve is true, but " + s.message());
  if (config.curve_worker_secret_key_file.empty())
    return Status::InvalidArgument(fmt::format(
        "transport.curve is true but transport.curve_worker_secret_key_file is not set: this worker's secret key "
        "file ({})",
        kKeygenHint));
  if (config.curve_learner_public_key_file.empty())
    return Status::InvalidArgument(
        "transport.curve is true but transport.curve_learner_public_key_file is not set: the learner's public key "
        "file (its NAME.pub)");
  auto keys = std::make_unique<CurveClientKeys>();
  if (auto s = ReadSecretKeyFile(config.curve_worker_secret_key_file, "transport.curve_worker_secret_key_file",
                                 &keys->own);
      !s.ok())
    return s;
  if (auto s = ReadPublicKeyFile(config.curve_learner_public_key_file, "transport.curve_learner_public_key_file",
                                 &keys->server_public_key);
      !s.ok())
    return s;
  *out = std::move(keys);
  return Status::Ok();
}

// ---------------------------------------------------------------- ZapAuthenticator

Status ZapAuthenticator::Start(zmq::context_t& ctx, AuthorizedKeys keys, std::unique_ptr<ZapAuthenticator>* out) {
  std::unique_ptr<ZapAuthenticator> a(new ZapAuthenticator());
  a->keys_ = std::move(keys);
  try {
    a->handler_ = zmq::socket_t(ctx, zmq::socket_type::rep);
    a->handler_.set(zmq::sockopt::linger, 0);
    a->handler_.bind("inproc://zeromq.zap.01");
    const std::string stop_endpoint = fmt::format("inproc://farm-zap-stop-{}", static_cast<const void*>(a.get()));
    a->stop_recv_ = zmq::socket_t(ctx, zmq::socket_type::pair);
    a->stop_recv_.bind(stop_endpoint);
    a->stop_send_ = zmq::socket_t(ctx, zmq::socket_type::pair);
    a->stop_send_.connect(stop_endpoint);
  } catch (const zmq::error_t& e) {
    return Status::IoError(fmt::format("cannot start the ZAP handler on inproc://zeromq.zap.01: {}", e.what()));
  }
  ZapAuthenticator* p = a.get();
  a->thread_ = std::thread([p] { p->Loop(); });
  *out = std::move(a);
  return Status::Ok();
}

ZapAuthenticator::~ZapAuthenticator() {
  if (!thread_.joinable()) return;
  while (true) {
    try {
      stop_send_.send(zmq::message_t(), zmq::send_flags::none);
      break;
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      // ETERM: the context is shutting down, so the handler's poll throws ETERM too and it leaves by itself.
      if (e.num() != ETERM) spdlog::error("ZAP handler: cannot ask it to stop: {}", e.what());
      break;
    }
  }
  thread_.join();
}

void ZapAuthenticator::Loop() {
  zmq::pollitem_t items[] = {{handler_.handle(), 0, ZMQ_POLLIN, 0}, {stop_recv_.handle(), 0, ZMQ_POLLIN, 0}};
  std::vector<zmq::message_t> request;
  try {
    while (true) {
      try {
        zmq::poll(items, 2, std::chrono::milliseconds(-1));
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;
        throw;
      }
      if (items[1].revents & ZMQ_POLLIN) return;
      if (!(items[0].revents & ZMQ_POLLIN)) continue;
      request.clear();
      if (!zmq::recv_multipart(handler_, std::back_inserter(request), zmq::recv_flags::dontwait)) continue;
      Answer(request);
    }
  } catch (const zmq::error_t& e) {
    // Without a handler libzmq's CURVE handshakes wait for a ZAP reply: no worker can join any more.
    if (e.num() != ETERM) spdlog::error("ZAP handler stopped, no worker can join any more: {}", e.what());
  }
}

// A request (RFC 27): version, request id, domain, address, routing id, mechanism, credentials.
// The reply: version, request id, status code, status text, user id, metadata.
void ZapAuthenticator::Answer(std::vector<zmq::message_t>& req) {
  std::string code = "400";
  std::string text;
  std::string user;
  const std::string request_id = req.size() > 1 ? req[1].to_string() : std::string();
  if (req.size() < 6 || req[0].to_string_view() != "1.0") {
    text = "malformed ZAP request";
    spdlog::error("ZAP handler: {} ({} frames)", text, req.size());
  } else if (req[5].to_string_view() != "CURVE" || req.size() != 7 || req[6].size() != 32) {
    text = "CURVE required";
    refused_.fetch_add(1);
    spdlog::warn("refused a connection from {}: mechanism {}, expected CURVE", req[3].to_string(),
                 req[5].to_string());
  } else {
    std::array<char, kCurveKeyZ85Size + 1> key{};
    zmq_z85_encode(key.data(), static_cast<const uint8_t*>(req[6].data()), 32);
    const auto it = keys_.find(key.data());
    if (it != keys_.end()) {
      code = "200";
      text = "OK";
      user = it->second;
      accepted_.fetch_add(1);
      spdlog::info("admitted a worker from {} with CURVE key '{}'", req[3].to_string(), it->second);
    } else {
      text = "CURVE key not authorized";
      refused_.fetch_add(1);
      if (logged_.size() < kMaxLoggedRefusals && logged_.insert(key.data()).second)
        spdlog::warn(
            "refused a worker from {}: its CURVE public key {} is not in transport.curve_authorized_keys "
            "(counted in summary.json's auth_refused; further refusals of this key are not logged)",
            req[3].to_string(), key.data());
    }
  }
  const std::array<zmq::const_buffer, 6> reply = {zmq::str_buffer("1.0"), zmq::buffer(request_id),
                                                  zmq::buffer(code),      zmq::buffer(text),
                                                  zmq::buffer(user),      zmq::const_buffer()};
  zmq::send_multipart(handler_, reply);
}

}  // namespace farm
