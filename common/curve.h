// CURVE security for the farm's sockets: key files (Z85 text, made by
// farm-keygen / `scripts/farm keygen`), the list of worker keys a learner
// admits, and the ZAP handler that enforces that list.
//
// Key files: NAME.key holds one line, the 40-character Z85 secret key;
// NAME.pub holds "PUBLIC_KEY NAME". An authorized-keys file holds one
// "PUBLIC_KEY [NAME]" per line (blank lines and lines starting with "# " are
// skipped), so `cat *.pub > authorized_keys` makes one; a directory stands for
// every *.pub file in it.
//
// Knows ZeroMQ only: nothing of envs, models or the wire protocol.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "common/config.h"
#include "common/status.h"

namespace farm {

constexpr std::size_t kCurveKeyZ85Size = 40;  // a 32-byte key in Z85 text

// Ok when the linked libzmq was built with CURVE (libsodium); else why not.
Status CheckCurveSupport();

struct CurveKeyPair {
  std::string public_key;  // Z85
  std::string secret_key;  // Z85
};

// A worker's side of CURVE: its own key pair and the learner's public key.
struct CurveClientKeys {
  CurveKeyPair own;
  std::string server_public_key;  // Z85
};

// Public key (Z85) -> the name it was listed under.
using AuthorizedKeys = std::map<std::string, std::string>;

// The learner's side of CURVE: its key pair and the workers it admits.
struct CurveServerKeys {
  CurveKeyPair own;
  AuthorizedKeys authorized;
};

// Reads a secret key file and derives its public key. `config_key` (e.g.
// "transport.curve_worker_secret_key_file") names the setting in errors.
Status ReadSecretKeyFile(const std::string& path, const std::string& config_key, CurveKeyPair* out);

// Reads a public key file (its first word).
Status ReadPublicKeyFile(const std::string& path, const std::string& config_key, std::string* out);

// Reads an authorized-keys file, or every *.pub file of a directory.
Status ReadAuthorizedKeys(const std::string& path, const std::string& config_key, AuthorizedKeys* out);

// The keys a learner needs when config.curve is on (out untouched when off).
Status LoadCurveServerKeys(const TransportConfig& config, std::unique_ptr<CurveServerKeys>* out);

// The keys a worker needs when config.curve is on (out untouched when off).
Status LoadCurveClientKeys(const TransportConfig& config, std::unique_ptr<CurveClientKeys>* out);

// Answers ZeroMQ's authentication requests (ZAP, RFC 27) for every CURVE
// server socket of one context: 200 for a listed public key, 400 for any
// other. Refusals are counted and logged (the first of each key).
// Start it before binding the sockets it guards: libzmq admits every CURVE
// client while no handler is bound.
//
// Threading: Start() and the destructor are called from the owning thread.
// The handler thread owns the REP socket on inproc://zeromq.zap.01 and the
// refusal log; accepted() and refused() may be read from any thread. The
// destructor stops and joins the thread (also when the context was shut
// down first), so the context must outlive this object.
class ZapAuthenticator {
 public:
  static Status Start(zmq::context_t& ctx, AuthorizedKeys keys, std::unique_ptr<ZapAuthenticator>* out);
  ~ZapAuthenticator();
  ZapAuthenticator(const ZapAuthenticator&) = delete;
  ZapAuthenticator& operator=(const ZapAuthenticator&) = delete;

  int64_t accepted() const { return accepted_.load(); }
  int64_t refused() const { return refused_.load(); }

 private:
  ZapAuthenticator() = default;
  void Loop();
  void Answer(std::vector<zmq::message_t>& request);

  AuthorizedKeys keys_;
  zmq::socket_t handler_;    // REP on inproc://zeromq.zap.01: handler thread
  zmq::socket_t stop_recv_;  // PAIR: handler thread; an empty message means "leave"
  zmq::socket_t stop_send_;  // PAIR: owning thread
  std::set<std::string> logged_;  // handler thread: refused keys already logged (capped)
  std::atomic<int64_t> accepted_{0};
  std::atomic<int64_t> refused_{0};
  std::thread thread_;
};

}  // namespace farm
