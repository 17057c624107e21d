// Transport security: which bind addresses need CURVE, key files and their
// errors, and CURVE with the ZAP handler over real sockets (listed keys in,
// everyone else out, and the worker side told why).
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <unistd.h>
#include <zmq_addon.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <array>
#include <atomic>
#include <thread>
#include <filesystem>
#include <fstream>

#include "common/curve.h"
#include "common/files.h"
#include "common/transport.h"

using namespace farm;
namespace fs = std::filesystem;

namespace {

CurveKeyPair NewKeyPair() {
  std::array<char, 41> pub{}, sec{};
  REQUIRE(zmq_curve_keypair(pub.data(), sec.data()) == 0);
  return {pub.data(), sec.data()};
}

// A temporary folder, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / fmt::format("farm-transport-test-{}-{}", ::getpid(), counter_++);
    fs::create_directories(path_);
  }
  ~TempDir() { (void)RemoveTree(path_.string()); }
  std::string Write(const std::string& name, const std::string& text) const {
    const auto p = (path_ / name).string();
    std::ofstream(p) << text;
    fs::permissions(p, fs::perms::owner_read | fs::perms::owner_write);
    return p;
  }
  std::string path() const { return path_.string(); }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

bool Contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("only loopback, ipc and inproc endpoints count as local", "[transport]") {
  for (const char* e : {"tcp://127.0.0.1:*", "tcp://127.1.2.3:5555", "tcp://localhost:5555", "tcp://[::1]:5555",
                        "ipc:///tmp/farm.sock", "inproc://farm"})
    CHECK(IsLoopbackEndpoint(e));
  for (const char* e : {"tcp://0.0.0.0:5555", "tcp://*:5555", "tcp://10.0.0.1:5555", "tcp://eth0:5555",
                        "tcp://lo:5555", "tcp://[::]:5555", "tcp://example.com:5555", "tcp://128.0.0.1:1"})
    CHECK_FALSE(IsLoopbackEndpoint(e));
}

TEST_CASE("a non-loopback bind needs transport.curve or transport.insecure", "[transport]") {
  TransportConfig c;
  CHECK(CheckBindPolicy(c).ok());  // the default: tcp://127.0.0.1:*
  c.bind = "tcp://0.0.0.0:5555";
  const Status s = CheckBindPolicy(c);
  REQUIRE_FALSE(s.ok());
  CHECK(s.code() == Status::Code::kInvalidArgument);
  CHECK(Contains(s.message(), "transport.bind: 'tcp://0.0.0.0:5555' is not a loopback address"));
  CHECK(Contains(s.message(), "transport.curve: true"));
  CHECK(Contains(s.message(), "transport.insecure: true"));
  c.insecure = true;
  CHECK(CheckBindPolicy(c).ok());
  c.insecure = false;
  c.curve = true;
  CHECK(CheckBindPolicy(c).ok());
}

TEST_CASE("key files are read and checked, with errors that name the setting", "[transport][curve]") {
  REQUIRE(CheckCurveSupport().ok());
  TempDir dir;
  const CurveKeyPair pair = NewKeyPair();
  const std::string key = "transport.curve_worker_secret_key_file";
  CurveKeyPair read;
  REQUIRE(ReadSecretKeyFile(dir.Write("w.key", pair.secret_key + "\n"), key, &read).ok());
  CHECK(read.secret_key == pair.secret_key);
  CHECK(read.public_key == pair.public_key);  // derived from the secret key
  std::string pub;
  REQUIRE(ReadPublicKeyFile(dir.Write("w.pub", pair.public_key + " w\n"), key, &pub).ok());
  CHECK(pub == pair.public_key);

  Status s = ReadSecretKeyFile(dir.path() + "/missing.key", key, &read);
  CHECK(s.code() == Status::Code::kNotFound);
  CHECK(Contains(s.message(), key + ": '" + dir.path() + "/missing.key' does not exist"));
  s = ReadSecretKeyFile(dir.Write("short.key", pair.secret_key.substr(1) + "\n"), key, &read);
  CHECK(Contains(s.message(), "expected a CURVE key of 40 Z85 characters, got 39 characters"));
  s = ReadSecretKeyFile(dir.Write("tilde.key", std::string(40, '~') + "\n"), key, &read);
  CHECK(Contains(s.message(), "not Z85 text"));
  s = ReadSecretKeyFile(dir.Write("empty.key", "\n\n"), key, &read);
  CHECK(Contains(s.message(), "holds no key"));
  s = ReadSecretKeyFile(dir.path() + "/w.pub", key, &read);
  CHECK(Contains(s.message(), "is a public key file"));
  s = ReadSecretKeyFile(dir.Write("named.key", pair.public_key + " w\n"), key, &read);
  CHECK(Contains(s.message(), "does not look like a secret key file"));
  CHECK_FALSE(Contains(s.message(), pair.public_key));  // key text stays out of messages
}

TEST_CASE("authorized keys come from a file or a directory of .pub files", "[transport][curve]") {
  TempDir dir;
  const CurveKeyPair a = NewKeyPair(), b = NewKeyPair(), c = NewKeyPair();
  const std::string key = "transport.curve_authorized_keys";
  AuthorizedKeys keys;
  const std::string file = dir.Write("authorized", "# workers\n\n" + a.public_key + " alpha\n" + b.public_key + "\n");
  REQUIRE(ReadAuthorizedKeys(file, key, &keys).ok());
  REQUIRE(keys.size() == 2);
  CHECK(keys.at(a.public_key) == "alpha");
  CHECK(keys.at(b.public_key) == file + ":4");

  fs::create_directories(dir.path() + "/pubs");
  dir.Write("pubs/one.pub", a.public_key + " one\n");
  dir.Write("pubs/two.pub", c.public_key + "\n");
  dir.Write("pubs/notes.txt", "not a key\n");
  keys.clear();
  REQUIRE(ReadAuthorizedKeys(dir.path() + "/pubs", key, &keys).ok());
  REQUIRE(keys.size() == 2);
  CHECK(keys.at(a.public_key) == "one");
  CHECK(keys.at(c.public_key) == "two");  // the file's name when the line has none

  Status s = ReadAuthorizedKeys(dir.Write("none", "# nobody\n"), key, &keys);
  CHECK(Contains(s.message(), "lists no public keys"));
  s = ReadAuthorizedKeys(dir.Write("bad", a.public_key + "\nshort\n"), key, &keys);
  CHECK(Contains(s.message(), "line 2: expected a CURVE key of 40 Z85 characters"));
  fs::create_directories(dir.path() + "/empty");
  s = ReadAuthorizedKeys(dir.path() + "/empty", key, &keys);
  CHECK(Contains(s.message(), "lists no public keys"));
}

TEST_CASE("curve on without key settings is refused by name", "[transport][curve]") {
  TransportConfig c;
  c.curve = true;
  std::unique_ptr<CurveServerKeys> server;
  Status s = LoadCurveServerKeys(c, &server);
  CHECK(Contains(s.message(), "transport.curve_learner_secret_key_file is not set"));
  TempDir dir;
  c.curve_learner_secret_key_file = dir.Write("l.key", NewKeyPair().secret_key + "\n");
  s = LoadCurveServerKeys(c, &server);
  CHECK(Contains(s.message(), "transport.curve_authorized_keys is not set"));
  std::unique_ptr<CurveClientKeys> client;
  s = LoadCurveClientKeys(c, &client);
  CHECK(Contains(s.message(), "transport.curve_worker_secret_key_file is not set"));
  c.curve_worker_secret_key_file = c.curve_learner_secret_key_file;
  s = LoadCurveClientKeys(c, &client);
  CHECK(Contains(s.message(), "transport.curve_learner_public_key_file is not set"));
  c.curve = false;
  CHECK(LoadCurveClientKeys(c, &client).ok());
  CHECK(client == nullptr);
}

TEST_CASE("CURVE with ZAP admits listed workers only and tells the others why", "[transport][curve]") {
  const CurveKeyPair server = NewKeyPair(), listed = NewKeyPair(), stranger = NewKeyPair();
  zmq::context_t server_ctx(1);
  std::unique_ptr<ZapAuthenticator> zap;
  REQUIRE(ZapAuthenticator::Start(server_ctx, {{listed.public_key, "listed"}}, &zap).ok());
  std::unique_ptr<ZapAuthenticator> second;
  CHECK(ZapAuthenticator::Start(server_ctx, {}, &second).code() == Status::Code::kIoError);  // one per context

  TransportConfig tc;
  tc.worker_give_up_s = 5;
  std::string endpoint;
  zmq::socket_t router = MakeRouter(server_ctx, tc, &endpoint, &server);
  zmq::context_t client_ctx(1);
  wire::Envelope hello;
  hello.mutable_heartbeat();
  std::string scratch;
  const auto wait = std::chrono::seconds(5);

  SECTION("a listed key gets through") {
    const CurveClientKeys keys{listed, server.public_key};
    zmq::socket_t dealer = MakeDealer(client_ctx, "w-listed", endpoint, tc, &keys);
    REQUIRE(SendEnvelope(dealer, hello, &scratch));
    zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
    REQUIRE(zmq::poll(&item, 1, wait) == 1);
    std::vector<zmq::message_t> frames;
    REQUIRE(zmq::recv_multipart(router, std::back_inserter(frames)));
    REQUIRE(frames.size() == 2);
    CHECK(frames[0].to_string() == "w-listed");
    CHECK(std::string(frames[1].gets("User-Id")) == "listed");  // the name from the authorized keys
    CHECK(zap->accepted() == 1);
    CHECK(zap->refused() == 0);
  }
  SECTION("an unlisted key is refused, counted, and the worker learns it at once") {
    const CurveClientKeys keys{stranger, server.public_key};
    WatchedDealer dealer = WatchedDealer::Connect(client_ctx, "w-stranger", endpoint, tc, &keys);
    REQUIRE(SendEnvelope(dealer.socket(), hello, &scratch));
    wire::Envelope reply;
    Status s;
    REQUIRE(ReceiveEnvelope(dealer, wait, &reply, &s));
    CHECK(s.code() == Status::Code::kInvalidArgument);
    CHECK(Contains(s.message(), "refused this worker's CURVE public key " + stranger.public_key));
    CHECK(zap->refused() >= 1);
    CHECK(zap->accepted() == 0);
  }
  SECTION("a worker without CURVE is told that the learner requires it") {
    WatchedDealer dealer = WatchedDealer::Connect(client_ctx, "w-plain", endpoint, tc, nullptr);
    REQUIRE(SendEnvelope(dealer.socket(), hello, &scratch));
    wire::Envelope reply;
    Status s;
    REQUIRE(ReceiveEnvelope(dealer, wait, &reply, &s));
    CHECK(s.code() == Status::Code::kInvalidArgument);
    CHECK(Contains(s.message(), "requires CURVE"));
  }
  SECTION("a wrong learner public key is named as the likely cause") {
    const CurveClientKeys keys{listed, stranger.public_key};
    WatchedDealer dealer = WatchedDealer::Connect(client_ctx, "w-wrong-server", endpoint, tc, &keys);
    REQUIRE(SendEnvelope(dealer.socket(), hello, &scratch));
    wire::Envelope reply;
    Status s;
    REQUIRE(ReceiveEnvelope(dealer, wait, &reply, &s));
    CHECK((s.code() == Status::Code::kInvalidArgument || s.code() == Status::Code::kIoError));
    CHECK(Contains(s.message(), "transport.curve_learner_public_key_file"));
    CHECK(zap->accepted() == 0);
  }
  SECTION("the handler stops cleanly after its context was shut down") {
    router.close();
    server_ctx.shutdown();
    zap.reset();  // joins the handler thread, which left on ETERM
    SUCCEED();
  }
}

namespace {

// A TCP listener on 127.0.0.1 that accepts every connection and closes it at once, with a reset: what a worker
// sees of a CURVE learner that detects a mechanism mismatch before the worker has read its greeting (on a fast
// machine the learner's reset comes first, and the worker's ZeroMQ reports no mismatch, only a closed
// connection). Threading: its thread belongs to the object; the destructor stops and joins it.
class ClosingListener {
 public:
  ClosingListener() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd_ >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(fd_, 16) == 0);
    socklen_t len = sizeof addr;
    REQUIRE(::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    port_ = ntohs(addr.sin_port);
    REQUIRE(::pipe(wake_) == 0);
    thread_ = std::thread([this] { Serve(); });
  }
  ~ClosingListener() {
    const char c = 0;
    if (::write(wake_[1], &c, 1) != 1) FAIL("cannot wake the listener's thread");
    thread_.join();
    ::close(fd_);
    ::close(wake_[0]);
    ::close(wake_[1]);
  }
  std::string endpoint() const { return fmt::format("tcp://127.0.0.1:{}", port_); }
  int accepted() const { return accepted_.load(); }

 private:
  void Serve() {
    while (true) {
      pollfd fds[2] = {{fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0) continue;
      if (fds[1].revents) return;
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) continue;
      linger l{1, 0};  // close with a reset, as a peer that drops a connection with unread data does
      ::setsockopt(c, SOL_SOCKET, SO_LINGER, &l, sizeof l);
      ::close(c);
      accepted_.fetch_add(1);
    }
  }
  int fd_ = -1;
  int wake_[2] = {-1, -1};
  int port_ = 0;
  std::atomic<int> accepted_{0};
  std::thread thread_;
};

}  // namespace

TEST_CASE("A learner that closes every connection before the handshake completes is a failure, not silence",
          "[transport][curve]") {
  ClosingListener listener;
  zmq::context_t ctx(1);
  TransportConfig tc;
  tc.worker_give_up_s = 30;
  wire::Envelope hello;
  hello.mutable_heartbeat();
  std::string scratch;
  for (const bool with_curve : {false, true}) {
    CAPTURE(with_curve);
    const CurveClientKeys keys{NewKeyPair(), NewKeyPair().public_key};
    WatchedDealer dealer = WatchedDealer::Connect(ctx, with_curve ? "w-curve" : "w-plain", listener.endpoint(), tc,
                                                  with_curve ? &keys : nullptr);
    REQUIRE(SendEnvelope(dealer.socket(), hello, &scratch));
    wire::Envelope reply;
    Status s;
    const auto t0 = std::chrono::steady_clock::now();
    // Well inside the 30 s a worker would otherwise wait for a Welcome: ZeroMQ reconnects every 100 ms.
    REQUIRE(ReceiveEnvelope(dealer, std::chrono::seconds(20), &reply, &s));
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20));
    CHECK(s.code() == Status::Code::kInvalidArgument);
    CHECK(dealer.closed_in_handshake() == WatchedDealer::kHandshakeClosesBeforeFailing);
    CHECK_FALSE(dealer.handshake_succeeded());
    CHECK(Contains(s.message(), fmt::format("closed the connection during the {} handshake 3 times in a row",
                                            with_curve ? "CURVE" : "ZeroMQ")));
    CHECK(Contains(s.message(), with_curve ? "transport.curve_learner_public_key_file" : "requires CURVE"));
  }
  CHECK(listener.accepted() >= 2 * WatchedDealer::kHandshakeClosesBeforeFailing);
}

TEST_CASE("A WatchedDealer's events are all read, however fast the handshake: plain learner, no failure",
          "[transport]") {
  // The monitor is attached before the connect: the handshake's CONNECTED and HANDSHAKE_SUCCEEDED are seen even
  // when ZeroMQ completes the handshake before Connect returns.
  zmq::context_t ctx(1);
  TransportConfig tc;
  std::string endpoint;
  zmq::socket_t router = MakeRouter(ctx, tc, &endpoint);
  for (int i = 0; i < 20; ++i) {
    WatchedDealer dealer = WatchedDealer::Connect(ctx, fmt::format("w-fast-{}", i), endpoint, tc);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!dealer.handshake_succeeded() && std::chrono::steady_clock::now() < deadline) {
      zmq::pollitem_t item{dealer.monitor().handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(100));
      REQUIRE(dealer.Check().ok());
    }
    CHECK(dealer.handshake_succeeded());
    CHECK(dealer.closed_in_handshake() == 0);
  }
}
