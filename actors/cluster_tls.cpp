#include "actors/cluster_tls.hpp"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>
#include <pthread.h>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <caf/detail/socket_guard.hpp>
#include <caf/io/all.hpp>
#include <caf/io/middleman_actor_impl.hpp>
#include <caf/io/network/default_multiplexer.hpp>
#include <caf/io/network/doorman_impl.hpp>
#include <caf/io/network/stream_impl.hpp>

#include "comm/tls_identity.hpp"

namespace shardline::actors {

namespace net = caf::io::network;

namespace {
constexpr const char* kTlsLabel = "shardline node tls v1";
constexpr const char* kHandshakeFailures = "shardline_tls_handshake_failures_total";
}  // namespace

/// What every connection of one process shares.
struct TlsContext {
  comm::TlsIdentity identity;
  SSL_CTX* ctx = nullptr;
  std::shared_ptr<MetricsRegistry> metrics;  ///< may be null

  explicit TlsContext(comm::TlsIdentity id) : identity(std::move(id)) {}
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;
  ~TlsContext() { SSL_CTX_free(ctx); }
};

namespace {

/// OpenSSL writes to the socket with write(2), which raises SIGPIPE on a
/// connection the peer closed; CAF's own sockets use MSG_NOSIGNAL. This
/// blocks SIGPIPE on the calling thread for one OpenSSL call and swallows
/// one it raised, without touching the process's disposition.
class SigpipeBlock {
 public:
  SigpipeBlock() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigpending(&before_);
    pthread_sigmask(SIG_BLOCK, &pipe_, &saved_);
  }
  ~SigpipeBlock() {
    sigset_t pending;
    sigpending(&pending);
    if (sigismember(&pending, SIGPIPE) && !sigismember(&before_, SIGPIPE)) {
      const timespec zero{};
      sigtimedwait(&pipe_, nullptr, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &saved_, nullptr);
  }
  SigpipeBlock(const SigpipeBlock&) = delete;
  SigpipeBlock& operator=(const SigpipeBlock&) = delete;

 private:
  sigset_t pipe_{}, saved_{}, before_{};
};

/// Drains this thread's OpenSSL error queue into one line.
std::string drain_errors() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out;
}

/// "ADDR:PORT" of the peer of `fd`, or "an unknown peer".
std::string peer_of(net::native_socket fd) {
  auto addr = net::remote_addr_of_fd(fd);
  auto port = net::remote_port_of_fd(fd);
  if (!addr || !port) return "an unknown peer";
  return *addr + ":" + std::to_string(*port);
}

/// One TLS connection: the SSL object, its handshake, and the stream it
/// drives (to pause the stream's writes while the handshake waits for the
/// peer, instead of spinning on a writable socket).
class TlsSession {
 public:
  TlsSession(std::shared_ptr<const TlsContext> context, net::native_socket fd, bool accepted)
      : context_(std::move(context)), fd_(fd), accepted_(accepted), peer_(peer_of(fd)) {}
  ~TlsSession() { SSL_free(ssl_); }
  TlsSession(const TlsSession&) = delete;
  TlsSession& operator=(const TlsSession&) = delete;

  /// False when OpenSSL cannot make the SSL object.
  [[nodiscard]] bool init() {
    ERR_clear_error();
    ssl_ = SSL_new(context_->ctx);
    if (!ssl_ || SSL_set_fd(ssl_, fd_) != 1) {
      spdlog::error("tls: cannot make a session: {}", drain_errors());
      return false;
    }
    if (accepted_)
      SSL_set_accept_state(ssl_);
    else
      SSL_set_connect_state(ssl_);
    return true;
  }

  void attach(net::stream* stream) { stream_ = stream; }

  net::rw_state read_some(std::size_t& result, net::native_socket, void* buf, std::size_t len) {
    result = 0;
    SigpipeBlock no_sigpipe;
    switch (drive_handshake(false)) {
      case Handshake::failed:
        return net::rw_state::failure;
      case Handshake::pending:
        return net::rw_state::success;
      case Handshake::done:
        break;
    }
    if (len == 0) return net::rw_state::success;
    // SSL_get_error reads this thread's error queue: it must start empty
    // (SSL_get_error(3)), whatever another connection left there.
    ERR_clear_error();
    const int n = SSL_read(ssl_, buf, static_cast<int>(std::min<std::size_t>(len, INT32_MAX)));
    if (n > 0) {
      result = static_cast<std::size_t>(n);
      return net::rw_state::success;
    }
    return after_io(n);
  }

  net::rw_state write_some(std::size_t& result, net::native_socket, const void* buf, std::size_t len) {
    result = 0;
    SigpipeBlock no_sigpipe;
    // Nothing to write: the stream only drives the handshake (CAF calls
    // this once at launch) and stops polling for writes on indeterminate.
    switch (drive_handshake(len > 0)) {
      case Handshake::failed:
        return net::rw_state::failure;
      case Handshake::pending:
        return len == 0 ? net::rw_state::indeterminate : net::rw_state::success;
      case Handshake::done:
        break;
    }
    if (len == 0) return net::rw_state::indeterminate;
    ERR_clear_error();
    const int n = SSL_write(ssl_, buf, static_cast<int>(std::min<std::size_t>(len, INT32_MAX)));
    if (n > 0) {
      result = static_cast<std::size_t>(n);
      return net::rw_state::success;
    }
    return after_io(n);
  }

  /// Whether decrypted bytes wait inside OpenSSL (the socket may have
  /// none left to wake the multiplexer).
  bool must_read_more(net::native_socket, std::size_t threshold) {
    return static_cast<std::size_t>(SSL_pending(ssl_)) >= threshold;
  }

 private:
  enum class Handshake { done, pending, failed };

  Handshake drive_handshake(bool on_write) {
    if (handshake_done_) return Handshake::done;
    if (handshake_failed_) return Handshake::failed;
    ERR_clear_error();
    const int r = SSL_do_handshake(ssl_);
    if (r == 1) {
      handshake_done_ = true;
      resume_writes();
      return Handshake::done;
    }
    switch (SSL_get_error(ssl_, r)) {
      case SSL_ERROR_WANT_READ:
        // The peer's turn: stop polling the (writable) socket for writes;
        // the read that completes the handshake resumes them.
        if (on_write && !writes_paused_ && stream_) {
          stream_->backend().del(net::operation::write, fd_, stream_);
          writes_paused_ = true;
        }
        return Handshake::pending;
      case SSL_ERROR_WANT_WRITE:
        resume_writes();
        return Handshake::pending;
      default:
        handshake_failed_ = true;
        report_failure();
        return Handshake::failed;
    }
  }

  void resume_writes() {
    if (!writes_paused_ || !stream_) return;
    writes_paused_ = false;
    stream_->backend().add(net::operation::write, fd_, stream_);
  }

  /// The result of a failed SSL_read/SSL_write (n <= 0).
  net::rw_state after_io(int n) {
    switch (SSL_get_error(ssl_, n)) {
      case SSL_ERROR_WANT_READ:
      case SSL_ERROR_WANT_WRITE:
        return net::rw_state::success;
      default:  // closed (close_notify or EOF), reset, or a protocol error
        ERR_clear_error();
        return net::rw_state::failure;
    }
  }

  void report_failure() {
    std::string why = drain_errors();
    const long verify = SSL_get_verify_result(ssl_);
    if (verify != X509_V_OK) why += std::string(why.empty() ? "" : "; ") + X509_verify_cert_error_string(verify);
    if (why.empty()) why = "the connection closed during the handshake";
    if (accepted_)
      spdlog::warn("tls: refused a connection from {}: {} (a peer without this cluster's key?)", peer_, why);
    else
      spdlog::warn("tls: handshake with {} failed: {} (not a node of this cluster key?)", peer_, why);
    if (context_->metrics) context_->metrics->add(kHandshakeFailures, "", 1);
  }

  std::shared_ptr<const TlsContext> context_;
  net::native_socket fd_;
  bool accepted_;
  std::string peer_;  ///< "ADDR:PORT", for the log
  SSL* ssl_ = nullptr;
  net::stream* stream_ = nullptr;
  bool handshake_done_ = false;
  bool handshake_failed_ = false;
  bool writes_paused_ = false;
};

/// CAF's stream ProtocolPolicy over a TlsSession.
class TlsPolicy {
 public:
  explicit TlsPolicy(std::shared_ptr<TlsSession> session) : session_(std::move(session)) {}
  net::rw_state read_some(std::size_t& result, net::native_socket fd, void* buf, std::size_t len) {
    return session_->read_some(result, fd, buf, len);
  }
  net::rw_state write_some(std::size_t& result, net::native_socket fd, const void* buf, std::size_t len) {
    return session_->write_some(result, fd, buf, len);
  }
  bool must_read_more(net::native_socket fd, std::size_t threshold) {
    return session_->must_read_more(fd, threshold);
  }

 private:
  std::shared_ptr<TlsSession> session_;
};

/// A BASP connection over TLS (CAF's io::scribe over a stream_impl).
class TlsScribe : public caf::io::scribe {
 public:
  TlsScribe(net::default_multiplexer& mpx, net::native_socket fd, std::shared_ptr<TlsSession> session)
      : caf::io::scribe(net::conn_hdl_from_socket(fd)), stream_(mpx, fd, TlsPolicy(session)) {
    session->attach(&stream_);
  }

  void configure_read(caf::io::receive_policy::config config) override {
    stream_.configure_read(config);
    if (!launched_) launch();
  }
  void ack_writes(bool enable) override { stream_.ack_writes(enable); }
  std::vector<char>& wr_buf() override { return stream_.wr_buf(); }
  std::vector<char>& rd_buf() override { return stream_.rd_buf(); }
  void graceful_shutdown() override {
    stream_.graceful_shutdown();
    detach(&stream_.backend(), false);
  }
  void flush() override { stream_.flush(this); }
  std::string addr() const override {
    auto x = net::remote_addr_of_fd(stream_.fd());
    return x ? *x : std::string();
  }
  std::uint16_t port() const override {
    auto x = net::remote_port_of_fd(stream_.fd());
    return x ? *x : 0;
  }
  void add_to_loop() override { stream_.activate(this); }
  void remove_from_loop() override { stream_.passivate(); }

 private:
  void launch() {
    launched_ = true;
    stream_.start(this);
    // One (empty) write event starts the handshake on the connecting side.
    stream_.force_empty_write(this);
  }

  bool launched_ = false;
  net::stream_impl<TlsPolicy> stream_;
};

/// Accepts TCP connections and wraps each in a TLS session.
class TlsDoorman : public net::doorman_impl {
 public:
  TlsDoorman(net::default_multiplexer& mpx, net::native_socket fd, std::shared_ptr<const TlsContext> context)
      : net::doorman_impl(mpx, fd), context_(std::move(context)) {}

  bool new_connection() override {
    if (detached()) return false;  // the broker let go of this doorman already
    auto& mpx = acceptor_.backend();
    const net::native_socket fd = acceptor_.accepted_socket();
    caf::detail::socket_guard guard{fd};
    if (!net::nonblocking(fd, true)) return false;
    auto session = std::make_shared<TlsSession>(context_, fd, true);
    if (!session->init()) return false;
    auto scribe = caf::make_counted<TlsScribe>(mpx, fd, std::move(session));
    guard.release();  // the scribe owns the socket now
    const caf::io::connection_handle hdl = scribe->hdl();
    parent()->add_scribe(std::move(scribe));
    return doorman::new_connection(&mpx, hdl);
  }

 private:
  std::shared_ptr<const TlsContext> context_;
};

/// CAF's middleman actor (publish, connect) with TLS sockets.
class TlsMiddleman : public caf::io::middleman_actor_impl {
 public:
  TlsMiddleman(caf::actor_config& cfg, caf::actor broker, std::shared_ptr<const TlsContext> context)
      : caf::io::middleman_actor_impl(cfg, std::move(broker)), context_(std::move(context)) {}

  const char* name() const override { return "shardline.tls_middleman"; }

 protected:
  caf::expected<caf::io::scribe_ptr> connect(const std::string& host, std::uint16_t port) override {
    auto fd = net::new_tcp_connection(host, port);
    if (!fd) return std::move(fd.error());
    caf::detail::socket_guard guard{*fd};
    if (!net::nonblocking(*fd, true)) return caf::sec::cannot_connect_to_node;
    auto session = std::make_shared<TlsSession>(context_, *fd, false);
    if (!session->init()) return caf::sec::cannot_connect_to_node;
    auto scribe = caf::make_counted<TlsScribe>(mpx(), *fd, std::move(session));
    guard.release();
    return scribe;
  }

  caf::expected<caf::io::doorman_ptr> open(std::uint16_t port, const char* addr, bool reuse) override {
    auto fd = net::new_tcp_acceptor_impl(port, addr, reuse);
    if (!fd) return std::move(fd.error());
    return caf::make_counted<TlsDoorman>(mpx(), *fd, context_);
  }

 private:
  net::default_multiplexer& mpx() { return static_cast<net::default_multiplexer&>(system().middleman().backend()); }
  std::shared_ptr<const TlsContext> context_;
};

}  // namespace

Result<std::shared_ptr<ClusterTls>> ClusterTls::create(const ClusterKey& key,
                                                       std::shared_ptr<MetricsRegistry> metrics) {
  auto identity = comm::TlsIdentity::create(key.derive(kTlsLabel), "shardline cluster");
  if (!identity) return std::move(identity).error();
  auto context = std::make_shared<TlsContext>(std::move(identity).value());
  context->metrics = std::move(metrics);
  ERR_clear_error();
  SSL_CTX* ctx = SSL_CTX_new(TLS_method());
  context->ctx = ctx;
  const bool ok = ctx && SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) == 1 &&
                  SSL_CTX_use_certificate(ctx, context->identity.certificate()) == 1 &&
                  SSL_CTX_use_PrivateKey(ctx, context->identity.key()) == 1 &&
                  SSL_CTX_check_private_key(ctx) == 1 &&
                  X509_STORE_add_cert(SSL_CTX_get_cert_store(ctx), context->identity.certificate()) == 1 &&
                  SSL_CTX_set_num_tickets(ctx, 0) == 1;
  if (!ok) return make_error(ErrorCode::internal, "tls: cannot build the TLS context: " + drain_errors());
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  // CAF's stream hands SSL_write what is left of its buffer after a partial
  // write, and may have moved it.
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  return std::shared_ptr<ClusterTls>(new ClusterTls(std::move(context)));
}

ClusterTls::~ClusterTls() { stop(); }

void ClusterTls::start(caf::actor_system& system) {
  if (middleman_) return;
  system_ = &system;
  auto broker = system.middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP"));
  middleman_ = system.spawn<TlsMiddleman, caf::detached + caf::hidden>(std::move(broker), context_);
}

void ClusterTls::stop() {
  if (!middleman_ || !system_) return;
  {
    caf::scoped_actor self{*system_, true};
    self->send_exit(middleman_, caf::exit_reason::kill);  // it ignores softer exits
    self->wait_for(middleman_);
  }
  middleman_ = caf::io::middleman_actor();
}

Result<std::uint16_t> ClusterTls::publish(const caf::actor& actor, const std::string& host, std::uint16_t port) {
  if (!middleman_) return make_error(ErrorCode::internal, "tls: publish before start");
  auto f = caf::make_function_view(middleman_);
  auto bound = f(caf::publish_atom_v, port, caf::actor_cast<caf::strong_actor_ptr>(actor),
                 system_->message_types(actor), host, true);
  if (!bound)
    return make_error(ErrorCode::io, "cannot listen on " + host + ":" + std::to_string(port) + ": " +
                                         system_->render(bound.error()));
  return *bound;
}

Result<caf::actor> ClusterTls::connect(const std::string& host, std::uint16_t port) {
  if (!middleman_) return make_error(ErrorCode::internal, "tls: connect before start");
  const std::string where = host + ":" + std::to_string(port);
  auto f = caf::make_function_view(middleman_);
  auto reply = f(caf::connect_atom_v, host, port);
  if (!reply) {
    std::string why = system_->render(reply.error());
    if (reply.error() == caf::sec::disconnect_during_handshake)
      why += " (the TLS handshake failed: is it a node of this cluster, started with the same --key-file?)";
    return make_error(ErrorCode::io, "cannot reach a node at " + where + ": " + why);
  }
  auto& ptr = std::get<1>(*reply);
  if (!ptr) return make_error(ErrorCode::io, "cannot reach a node at " + where + ": no actor published there");
  return caf::actor_cast<caf::actor>(std::move(ptr));
}

const std::string& ClusterTls::fingerprint_sha256() const { return context_->identity.fingerprint_sha256(); }

}  // namespace shardline::actors
