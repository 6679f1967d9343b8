#include "comm/tcp.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "comm/exchange.hpp"

namespace shardline::comm {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the TCP frame format is little-endian host order");

using Clock = std::chrono::steady_clock;
using detail::ByteBuf;
using detail::ms_text;

constexpr std::uint32_t kHelloMagic = 0x43544853;  // "SHTC"
constexpr std::uint32_t kProtocolVersion = 1;
constexpr std::size_t kNonceBytes = 32;
constexpr std::size_t kMaxHandshakeMessage = 1 << 20;
constexpr std::uint64_t kMaxFrameBytes = std::uint64_t{1} << 40;
constexpr auto kHandshakeSlice = std::chrono::seconds(10);  // one connection's handshake
constexpr std::size_t kStageBytes = 1 << 16;
constexpr std::size_t kPumpBudget = 8u << 20;  // bytes read from one peer per poll round

Clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  constexpr std::chrono::milliseconds kMax = std::chrono::hours(24 * 365);
  return Clock::now() + std::clamp(timeout, std::chrono::milliseconds(1), kMax);
}

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, INT_MAX));
}

std::string errno_text(int e) { return std::strerror(e); }

// ---- file descriptors and sockets ------------------------------------------

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  [[nodiscard]] int get() const noexcept { return fd_; }
  [[nodiscard]] bool valid() const noexcept { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

/// A lock whose acquisition gives up at a deadline (what std::timed_mutex
/// does, built on mutex + condition variable so that ThreadSanitizer, which
/// does not intercept pthread_mutex_clocklock, can follow it).
class DeadlineLock {
 public:
  [[nodiscard]] bool lock_until(Clock::time_point deadline) {
    std::unique_lock lk(mu_);
    if (!cv_.wait_until(lk, deadline, [&] { return !busy_; })) return false;
    busy_ = true;
    return true;
  }
  void unlock() {
    {
      std::lock_guard lk(mu_);
      busy_ = false;
    }
    cv_.notify_one();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool busy_ = false;
};

/// Holds a DeadlineLock taken by lock_until until release() or destruction.
class DeadlineGuard {
 public:
  explicit DeadlineGuard(DeadlineLock& lock) : lock_(lock) {}
  ~DeadlineGuard() { release(); }
  DeadlineGuard(const DeadlineGuard&) = delete;
  DeadlineGuard& operator=(const DeadlineGuard&) = delete;
  [[nodiscard]] bool acquire(Clock::time_point deadline) {
    held_ = lock_.lock_until(deadline);
    return held_;
  }
  void release() {
    if (held_) lock_.unlock();
    held_ = false;
  }

 private:
  DeadlineLock& lock_;
  bool held_ = false;
};

enum class IoFail { none, timeout, closed, stopped, error };

struct IoResult {
  IoFail fail = IoFail::none;
  std::string text;
  [[nodiscard]] bool ok() const noexcept { return fail == IoFail::none; }
};

IoResult io_fail(IoFail f, std::string text) { return IoResult{f, std::move(text)}; }

/// Waits until fd is ready for `events`, the deadline passes, or stop_fd
/// becomes readable.
IoResult wait_fd(int fd, short events, Clock::time_point deadline, int stop_fd = -1) {
  for (;;) {
    pollfd p[2] = {{fd, events, 0}, {stop_fd, POLLIN, 0}};
    const int n = ::poll(p, stop_fd >= 0 ? 2 : 1, ms_left(deadline));
    if (n < 0) {
      if (errno == EINTR) continue;
      return io_fail(IoFail::error, "poll: " + errno_text(errno));
    }
    if (stop_fd >= 0 && (p[1].revents & POLLIN)) return io_fail(IoFail::stopped, "shutting down");
    if (n > 0 && p[0].revents != 0) return {};
    if (Clock::now() >= deadline) return io_fail(IoFail::timeout, "timed out");
  }
}

bool is_closed_errno(int e) {
  return e == EPIPE || e == ECONNRESET || e == ENOTCONN || e == ESHUTDOWN || e == ECONNABORTED;
}

/// Writes all of iov; `written` counts the bytes that went out.
IoResult write_all(int fd, iovec* iov, int iovcnt, Clock::time_point deadline, int stop_fd,
                   std::size_t& written) {
  written = 0;
  while (iovcnt > 0) {
    if (iov->iov_len == 0) {
      ++iov;
      --iovcnt;
      continue;
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<std::size_t>(iovcnt);
    const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        IoResult w = wait_fd(fd, POLLOUT, deadline, stop_fd);
        if (!w.ok()) return w;
        continue;
      }
      const int e = errno;
      return io_fail(is_closed_errno(e) ? IoFail::closed : IoFail::error, errno_text(e));
    }
    written += static_cast<std::size_t>(n);
    auto left = static_cast<std::size_t>(n);
    while (left > 0 && iovcnt > 0) {
      if (left >= iov->iov_len) {
        left -= iov->iov_len;
        ++iov;
        --iovcnt;
      } else {
        iov->iov_base = static_cast<char*>(iov->iov_base) + left;
        iov->iov_len -= left;
        left = 0;
      }
    }
  }
  return {};
}

IoResult write_all(int fd, const void* data, std::size_t n, Clock::time_point deadline) {
  iovec iov{const_cast<void*>(data), n};
  std::size_t written = 0;
  return write_all(fd, &iov, 1, deadline, -1, written);
}

IoResult read_all(int fd, void* data, std::size_t n, Clock::time_point deadline) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t got = ::recv(fd, p, n, MSG_DONTWAIT);
    if (got > 0) {
      p += got;
      n -= static_cast<std::size_t>(got);
      continue;
    }
    if (got == 0) return io_fail(IoFail::closed, "connection closed");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      IoResult w = wait_fd(fd, POLLIN, deadline);
      if (!w.ok()) return w;
      continue;
    }
    const int e = errno;
    return io_fail(is_closed_errno(e) ? IoFail::closed : IoFail::error, errno_text(e));
  }
  return {};
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

bool is_wildcard(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "*";
}

std::string endpoint(const std::string& host, int port) {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
         std::to_string(port);
}

struct AddrInfo {
  addrinfo* list = nullptr;
  ~AddrInfo() {
    if (list) ::freeaddrinfo(list);
  }
};

Result<Fd> listen_on(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  const std::string h = is_wildcard(host) ? "0.0.0.0" : host;
  AddrInfo ai;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(h.c_str(), service.c_str(), &hints, &ai.list); rc != 0) {
    return make_error(ErrorCode::io, "cannot resolve '" + h + "': " + ::gai_strerror(rc));
  }
  std::string last = "no address";
  for (addrinfo* a = ai.list; a; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd.valid()) {
      last = "socket: " + errno_text(errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0) {
      last = "bind: " + errno_text(errno);
      continue;
    }
    if (::listen(fd.get(), SOMAXCONN) != 0) {
      last = "listen: " + errno_text(errno);
      continue;
    }
    return fd;
  }
  return make_error(ErrorCode::io, "cannot listen on " + endpoint(h, port) + ": " + last);
}

int bound_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return 0;
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return 0;
}

std::string peer_host(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  char host[NI_MAXHOST];
  if (::getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof host, nullptr, 0,
                    NI_NUMERICHOST) != 0) {
    return "?";
  }
  return host;
}

/// Connects to host:port before the deadline, retrying while the listener is
/// not up yet (connection refused / unreachable).
Result<Fd> connect_to(const std::string& host, int port, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  AddrInfo ai;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &ai.list); rc != 0) {
    return make_error(ErrorCode::io, "cannot resolve '" + host + "': " + ::gai_strerror(rc));
  }
  std::string last = "no address";
  for (;;) {
    for (addrinfo* a = ai.list; a; a = a->ai_next) {
      Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
      if (!fd.valid()) {
        last = "socket: " + errno_text(errno);
        continue;
      }
      int rc = ::connect(fd.get(), a->ai_addr, a->ai_addrlen);
      if (rc != 0 && errno != EINPROGRESS) {
        last = errno_text(errno);
        continue;
      }
      if (rc != 0) {
        IoResult w = wait_fd(fd.get(), POLLOUT, deadline);
        if (!w.ok()) {
          last = w.fail == IoFail::timeout ? "connect timed out" : w.text;
          continue;
        }
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) {
          last = errno_text(err);
          continue;
        }
      }
      set_nodelay(fd.get());
      return fd;
    }
    if (Clock::now() + std::chrono::milliseconds(20) >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // not up yet: retry
  }
  return make_error(ErrorCode::io, "cannot connect to " + endpoint(host, port) + " (" + last + ")");
}

/// Accepts one connection before the deadline; fail timeout when none came.
IoResult accept_until(int listen_fd, Clock::time_point deadline, Fd& out) {
  for (;;) {
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      out = Fd(fd);
      set_nodelay(fd);
      return {};
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return io_fail(IoFail::error, "accept: " + errno_text(errno));
    }
    IoResult w = wait_fd(listen_fd, POLLIN, deadline);
    if (!w.ok()) return w;
  }
}

// ---- handshake messages ------------------------------------------------------

enum Hs : std::uint8_t {
  kHello = 1,
  kChallenge = 2,
  kProof = 3,
  kAccept = 4,
  kReject = 5,
  kTable = 6,
  kReady = 7,
  kGo = 8,
};

struct Writer {
  std::string b;
  Writer& u8(std::uint8_t v) {
    b.push_back(static_cast<char>(v));
    return *this;
  }
  Writer& u32(std::uint32_t v) {
    b.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  Writer& u64(std::uint64_t v) {
    b.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  Writer& str(std::string_view s) {
    u32(static_cast<std::uint32_t>(s.size()));
    b.append(s);
    return *this;
  }
};

struct Reader {
  std::string_view b;
  std::size_t pos = 0;
  bool ok = true;
  std::string_view take(std::size_t n) {
    if (!ok || b.size() - pos < n) {
      ok = false;
      return {};
    }
    auto s = b.substr(pos, n);
    pos += n;
    return s;
  }
  std::uint8_t u8() {
    auto s = take(1);
    return ok ? static_cast<std::uint8_t>(s[0]) : 0;
  }
  std::uint32_t u32() {
    std::uint32_t v = 0;
    auto s = take(sizeof v);
    if (ok) std::memcpy(&v, s.data(), sizeof v);
    return v;
  }
  std::uint64_t u64() {
    std::uint64_t v = 0;
    auto s = take(sizeof v);
    if (ok) std::memcpy(&v, s.data(), sizeof v);
    return v;
  }
  std::string str() {
    const std::uint32_t n = u32();
    return std::string(take(n));
  }
};

IoResult send_msg(int fd, const std::string& body, Clock::time_point deadline) {
  Writer w;
  w.u32(static_cast<std::uint32_t>(body.size()));
  w.b += body;
  return write_all(fd, w.b.data(), w.b.size(), deadline);
}

IoResult recv_msg(int fd, Clock::time_point deadline, std::string& body) {
  std::uint32_t n = 0;
  if (IoResult r = read_all(fd, &n, sizeof n, deadline); !r.ok()) return r;
  if (n == 0 || n > kMaxHandshakeMessage) {
    return io_fail(IoFail::error, "bad handshake message length " + std::to_string(n) +
                                      " (not a Shardline TCP peer?)");
  }
  body.assign(n, '\0');
  return read_all(fd, body.data(), n, deadline);
}

std::string io_text(const IoResult& r, std::chrono::milliseconds timeout) {
  if (r.fail == IoFail::timeout) return "timed out after " + ms_text(timeout);
  return r.text;
}

std::string random_bytes(std::size_t n) {
  std::string s(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(s.data()), static_cast<int>(n)) != 1) {
    // Fall back to a weaker source rather than failing the rendezvous.
    std::uint64_t x = static_cast<std::uint64_t>(Clock::now().time_since_epoch().count()) ^
                      reinterpret_cast<std::uintptr_t>(&s);
    for (auto& c : s) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      c = static_cast<char>(x >> 56);
    }
  }
  return s;
}

std::string hmac(const std::string& key, std::string_view label, std::string_view hello,
                 std::string_view nonce) {
  std::string data;
  data.reserve(label.size() + 1 + hello.size() + nonce.size());
  data.append(label).push_back('\0');
  data.append(hello).append(nonce);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
            reinterpret_cast<const unsigned char*>(data.data()), data.size(), mac, &len)) {
    return {};
  }
  return std::string(reinterpret_cast<const char*>(mac), len);
}

bool same_mac(const std::string& a, const std::string& b) {
  return !a.empty() && a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string reject_body(ErrorCode code, const std::string& reason) {
  return Writer()
      .u8(kReject)
      .u8(code == ErrorCode::invalid_argument ? 1 : 0)
      .str(reason)
      .b;
}

/// A reject message as an Error: "<prefix>: <reason>".
Error rejected(std::string_view body, const std::string& prefix) {
  Reader r{body};
  r.u8();
  const std::uint8_t code = r.u8();
  const std::string reason = r.str();
  return make_error(code == 1 ? ErrorCode::invalid_argument : ErrorCode::io,
                    prefix + ": " + (r.ok ? reason : "refused"));
}

struct Hello {
  std::string body;  // as sent, for the MACs
  std::uint32_t world = 0;
  int from = -1;
  int to = -1;
  std::uint64_t session = 0;
  bool has_key = false;
  std::string listen_host;
  int listen_port = 0;
};

/// The connecting side: hello, check the acceptor's proof, prove, await accept.
Status connector_handshake(int fd, const TcpOptions& o, int to, std::uint64_t session,
                           int listen_port, Clock::time_point deadline, const std::string& what) {
  const std::string nonce = random_bytes(kNonceBytes);
  const std::string hello = Writer()
                                .u8(kHello)
                                .u32(kHelloMagic)
                                .u32(kProtocolVersion)
                                .u32(static_cast<std::uint32_t>(o.world_size))
                                .u32(static_cast<std::uint32_t>(o.rank))
                                .u32(static_cast<std::uint32_t>(to))
                                .u64(session)
                                .u8(o.key.empty() ? 0 : 1)
                                .str(nonce)
                                .str(o.listen_host)
                                .u32(static_cast<std::uint32_t>(listen_port))
                                .b;
  auto fail = [&](const IoResult& r) {
    return make_error(ErrorCode::io, what + ": " + (r.fail == IoFail::timeout ? "timed out" : r.text));
  };
  if (IoResult r = send_msg(fd, hello, deadline); !r.ok()) return fail(r);
  std::string m;
  if (IoResult r = recv_msg(fd, deadline, m); !r.ok()) return fail(r);
  if (static_cast<std::uint8_t>(m[0]) == kReject) return rejected(m, what + ": refused");
  Reader rd{m};
  rd.u8();
  const std::string peer_nonce = rd.str();
  const std::string peer_mac = rd.str();
  if (!rd.ok || static_cast<std::uint8_t>(m[0]) != kChallenge) {
    return make_error(ErrorCode::io, what + ": protocol error (expected a challenge)");
  }
  std::string proof;
  if (!o.key.empty()) {
    if (!same_mac(peer_mac, hmac(o.key, "shardline-tcp-v1 acceptor", hello, peer_nonce))) {
      const std::string reason = "wrong key: rank " + std::to_string(o.rank) +
                                 " and rank " + std::to_string(to) + " hold different keys";
      (void)send_msg(fd, reject_body(ErrorCode::invalid_argument, reason), deadline);
      return make_error(ErrorCode::invalid_argument,
                        what + ": wrong key: rank " + std::to_string(to) +
                            " could not prove knowledge of this rank's key (the keys differ)");
    }
    proof = hmac(o.key, "shardline-tcp-v1 connector", hello, peer_nonce);
  }
  if (IoResult r = send_msg(fd, Writer().u8(kProof).str(proof).b, deadline); !r.ok()) return fail(r);
  if (IoResult r = recv_msg(fd, deadline, m); !r.ok()) return fail(r);
  if (static_cast<std::uint8_t>(m[0]) == kReject) return rejected(m, what + ": refused");
  if (static_cast<std::uint8_t>(m[0]) != kAccept) {
    return make_error(ErrorCode::io, what + ": protocol error (expected accept)");
  }
  return Status();
}

/// The accepting side. `check` vets the hello (returns a reason to refuse,
/// with its code). On failure the connection was refused; the Error says why.
Result<Hello> acceptor_handshake(
    int fd, const TcpOptions& o, Clock::time_point deadline,
    const std::function<std::optional<Error>(const Hello&)>& check) {
  const std::string from_host = peer_host(fd);
  auto fail = [&](const IoResult& r) {
    return make_error(ErrorCode::io, "connection from " + from_host + ": " +
                                         (r.fail == IoFail::timeout ? "handshake timed out" : r.text));
  };
  std::string m;
  if (IoResult r = recv_msg(fd, deadline, m); !r.ok()) return fail(r);
  Hello h;
  h.body = m;
  Reader rd{m};
  const std::uint8_t type = rd.u8();
  const std::uint32_t magic = rd.u32();
  const std::uint32_t version = rd.u32();
  h.world = rd.u32();
  h.from = static_cast<int>(rd.u32());
  h.to = static_cast<int>(rd.u32());
  h.session = rd.u64();
  h.has_key = rd.u8() != 0;
  const std::string nonce = rd.str();
  h.listen_host = rd.str();
  h.listen_port = static_cast<int>(rd.u32());
  const std::string who = "connection from " + from_host +
                          (rd.ok ? " (rank " + std::to_string(h.from) + ")" : std::string());
  auto refuse = [&](ErrorCode code, const std::string& reason) {
    (void)send_msg(fd, reject_body(code, reason), deadline);
    return make_error(code, who + ": " + reason);
  };
  if (!rd.ok || type != kHello || magic != kHelloMagic) {
    return refuse(ErrorCode::io, "not a Shardline TCP hello");
  }
  if (version != kProtocolVersion) {
    return refuse(ErrorCode::invalid_argument,
                  "protocol version " + std::to_string(version) + ", rank " +
                      std::to_string(o.rank) + " speaks " + std::to_string(kProtocolVersion));
  }
  if (h.world != static_cast<std::uint32_t>(o.world_size)) {
    return refuse(ErrorCode::invalid_argument,
                  "world size " + std::to_string(h.world) + " disagrees with rank " +
                      std::to_string(o.rank) + "'s " + std::to_string(o.world_size));
  }
  if (h.to != o.rank) {
    return refuse(ErrorCode::invalid_argument, "addressed to rank " + std::to_string(h.to) +
                                                   " but reached rank " + std::to_string(o.rank));
  }
  if (h.has_key != !o.key.empty()) {
    return refuse(ErrorCode::invalid_argument,
                  "wrong key: rank " + std::to_string(h.from) +
                      (h.has_key ? " has a key but rank " + std::to_string(o.rank) + " has none"
                                 : " has no key but rank " + std::to_string(o.rank) + " requires one"));
  }
  if (auto bad = check(h)) return refuse(bad->code, bad->message);

  const std::string my_nonce = random_bytes(kNonceBytes);
  const std::string my_mac =
      o.key.empty() ? std::string() : hmac(o.key, "shardline-tcp-v1 acceptor", h.body, my_nonce);
  if (IoResult r = send_msg(fd, Writer().u8(kChallenge).str(my_nonce).str(my_mac).b, deadline);
      !r.ok()) {
    return fail(r);
  }
  if (IoResult r = recv_msg(fd, deadline, m); !r.ok()) return fail(r);
  if (static_cast<std::uint8_t>(m[0]) == kReject) return rejected(m, who + ": gave up");
  Reader pr{m};
  pr.u8();
  const std::string proof = pr.str();
  if (!pr.ok || static_cast<std::uint8_t>(m[0]) != kProof) {
    return refuse(ErrorCode::io, "protocol error (expected a proof)");
  }
  if (!o.key.empty() &&
      !same_mac(proof, hmac(o.key, "shardline-tcp-v1 connector", h.body, my_nonce))) {
    return refuse(ErrorCode::invalid_argument,
                  "wrong key: rank " + std::to_string(h.from) + " could not prove knowledge of rank " +
                      std::to_string(o.rank) + "'s key (the keys differ)");
  }
  if (IoResult r = send_msg(fd, Writer().u8(kAccept).b, deadline); !r.ok()) return fail(r);
  (void)nonce;
  return h;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

std::string refusals_text(const std::vector<std::string>& refused) {
  if (refused.empty()) return {};
  std::string s = "; refused " + std::to_string(refused.size()) + " connection(s): ";
  for (std::size_t i = 0; i < refused.size(); ++i) s += (i ? "; " : "") + refused[i];
  return s;
}

// ---- the communicator ----------------------------------------------------------

enum class Kind : std::uint32_t { data = 1, coll = 2, get_req = 3, get_resp = 4 };

struct FrameHeader {
  std::uint32_t kind = 0;
  std::int32_t tag = 0;     ///< data: the user tag
  std::uint64_t bytes = 0;  ///< payload bytes that follow
  std::uint64_t id = 0;     ///< coll: sequence number; get_req / get_resp: request id
  std::uint64_t arg = 0;    ///< coll: count; get_req: offset; get_resp: region bytes
  std::int32_t root = 0;    ///< coll: root
  std::uint8_t op = 0;      ///< coll: CollOp
  std::uint8_t phase = 0;   ///< coll: 1 or 2
  std::uint8_t bad = 0;     ///< coll: BadArgs
  std::uint8_t status = 0;  ///< get_resp: 0 ok, 1 no such region, 2 outside the region
};
static_assert(sizeof(FrameHeader) == 40);

enum GetStatus : std::uint8_t { kGetOk = 0, kGetNotFound = 1, kGetOutside = 2 };

class TcpComm final : public detail::CollectivesByCall<TcpCommunicator> {
 public:
  TcpComm(int rank, int world, std::vector<Fd> conns, std::chrono::milliseconds timeout)
      : rank_(rank), world_(world) {
    set_timeout(timeout);
    for (int k = 0; k < world; ++k) {
      auto p = std::make_unique<Peer>();
      p->fd = std::move(conns[static_cast<std::size_t>(k)]);
      p->rx.stage.resize(kStageBytes);
      peers_.push_back(std::move(p));
    }
    int fds[2];
    if (::pipe2(fds, O_NONBLOCK | O_CLOEXEC) == 0) {
      stop_r_ = Fd(fds[0]);
      stop_w_ = Fd(fds[1]);
    }
    receiver_ = std::thread([this] { receive_loop(); });
    responder_ = std::thread([this] { respond_loop(); });
  }

  ~TcpComm() override {
    stop_.store(true);
    if (stop_w_.valid()) {
      const char c = 1;
      (void)!::write(stop_w_.get(), &c, 1);  // never drained: stays readable
    }
    {
      std::lock_guard lk(mu_);
    }
    cv_.notify_all();
    resp_cv_.notify_all();
    if (receiver_.joinable()) receiver_.join();
    if (responder_.joinable()) responder_.join();
    // Orderly close: FIN after everything we wrote; drop what is unread so
    // close() does not turn into a reset.
    for (auto& p : peers_) {
      if (!p->fd.valid()) continue;
      ::shutdown(p->fd.get(), SHUT_WR);
      char sink[4096];
      for (int i = 0; i < 256 && ::recv(p->fd.get(), sink, sizeof sink, MSG_DONTWAIT) > 0; ++i) {
      }
    }
  }

  int rank() const noexcept override { return rank_; }
  int world_size() const noexcept override { return world_; }
  void set_timeout(std::chrono::milliseconds t) noexcept override {
    timeout_ms_.store(std::max<std::int64_t>(t.count(), 1));
  }
  std::chrono::milliseconds timeout() const noexcept override {
    return std::chrono::milliseconds(timeout_ms_.load());
  }
  std::uint64_t bytes_sent() const noexcept override { return bytes_sent_.load(); }
  std::uint64_t bytes_received() const noexcept override { return bytes_received_.load(); }
  std::uint64_t wire_bytes_sent() const noexcept override { return wire_sent_.load(); }
  std::uint64_t wire_bytes_received() const noexcept override { return wire_received_.load(); }
  bool peer_dead(int peer) const override {
    if (peer < 0 || peer >= world_ || peer == rank_) return false;
    std::lock_guard lk(mu_);
    return peers_[static_cast<std::size_t>(peer)]->dead;
  }
  std::string poisoned() const override {
    std::lock_guard lk(mu_);
    return poisoned_;
  }

  Status send(const void* data, std::size_t bytes, int peer, int tag) override;
  Status recv(void* data, std::size_t bytes, int peer, int tag) override;
  Status expose(std::string name, const void* data, std::size_t bytes) override;
  Status unexpose(const std::string& name) override;
  Status get(int peer, std::string name, std::size_t offset, void* dst,
             std::size_t bytes) override;

 private:
  struct RxState {  // receiver thread only
    FrameHeader hdr;
    std::size_t hdr_got = 0;
    bool in_payload = false;
    ByteBuf payload;
    std::size_t payload_got = 0;
    std::vector<std::byte> stage;
    bool open = true;
  };
  struct Peer {
    Fd fd;
    DeadlineLock send_mu;  // one frame at a time on the socket
    RxState rx;
    // Guarded by mu_.
    bool dead = false;
    std::string dead_reason;
    std::map<int, std::deque<ByteBuf>> p2p;  // by tag
    std::map<std::pair<std::uint64_t, std::uint8_t>, detail::CollMsg> coll;  // by (seq, phase)
  };
  struct PendingGet {
    bool done = false;
    std::uint8_t status = kGetOk;
    std::uint64_t region_bytes = 0;
    ByteBuf data;
  };
  struct GetRequest {
    int peer = 0;
    std::uint64_t id = 0;
    std::uint64_t offset = 0;
    std::uint64_t bytes = 0;
    std::string name;
  };
  struct Region {
    const void* data = nullptr;
    std::size_t bytes = 0;
    int inflight = 0;
  };

  class Transport final : public detail::CollTransport {
   public:
    Transport(TcpComm& c, Clock::time_point deadline) : c_(c), deadline_(deadline) {}
    Status post(int peer, const detail::CollDesc& d, const void* payload, const char* op) override {
      FrameHeader h;
      h.kind = static_cast<std::uint32_t>(Kind::coll);
      h.bytes = d.payload_bytes;
      h.id = d.seq;
      h.arg = d.count;
      h.root = d.root;
      h.op = d.op;
      h.phase = d.phase;
      h.bad = d.bad;
      return c_.send_frame(peer, h, payload, deadline_, op);
    }
    Status take(int peer, std::uint64_t seq, std::uint8_t phase, detail::CollMsg& out,
                const char* op) override {
      return c_.take_coll(peer, seq, phase, out, deadline_, op);
    }

   private:
    TcpComm& c_;
    Clock::time_point deadline_;
  };

  std::string who(const char* op) const { return std::string(op) + ": rank " + std::to_string(rank_); }
  Error peer_range_error(const char* op, int peer) const {
    return make_error(ErrorCode::invalid_argument,
                      who(op) + ": peer " + std::to_string(peer) + " is out of range [0, " +
                          std::to_string(world_) + ")");
  }
  Error dead_error(const char* op, int peer) const {  // mu_ held
    return make_error(ErrorCode::io, who(op) + ": peer rank " + std::to_string(peer) + " is dead (" +
                                         peers_[static_cast<std::size_t>(peer)]->dead_reason + ")");
  }

  Status collective(const detail::CollCall& call) override;
  Status send_frame(int peer, const FrameHeader& h, const void* payload, Clock::time_point deadline,
                    const char* op);
  Status take_coll(int peer, std::uint64_t seq, std::uint8_t phase, detail::CollMsg& out,
                   Clock::time_point deadline, const char* op);
  void mark_dead(int peer, const std::string& reason);
  void receive_loop();
  void pump(int peer);
  void dispatch(int peer);
  void respond_loop();

  const int rank_;
  const int world_;
  std::atomic<std::int64_t> timeout_ms_{kDefaultTimeout.count()};
  std::vector<std::unique_ptr<Peer>> peers_;

  mutable std::mutex mu_;
  std::condition_variable cv_;       // p2p, collectives, gets, deaths
  std::condition_variable resp_cv_;  // get requests for the responder
  std::deque<GetRequest> requests_;
  std::map<std::uint64_t, PendingGet> pending_;
  std::uint64_t next_request_ = 1;
  std::string poisoned_;
  int num_dead_ = 0;
  std::uint64_t coll_seq_ = 0;  // the collective thread only

  std::mutex regions_mu_;
  std::condition_variable regions_cv_;
  std::map<std::string, Region> regions_;

  std::atomic<bool> stop_{false};
  Fd stop_r_, stop_w_;
  std::thread receiver_, responder_;

  std::atomic<std::uint64_t> bytes_sent_{0}, bytes_received_{0}, wire_sent_{0}, wire_received_{0};
};

void TcpComm::mark_dead(int peer, const std::string& reason) {
  Peer& p = *peers_[static_cast<std::size_t>(peer)];
  {
    std::lock_guard lk(mu_);
    if (p.dead) return;
    p.dead = true;
    p.dead_reason = reason;
    ++num_dead_;
  }
  if (p.fd.valid()) ::shutdown(p.fd.get(), SHUT_WR);  // fail its writers fast; FIN to the peer
  cv_.notify_all();
}

Status TcpComm::send_frame(int peer, const FrameHeader& h, const void* payload,
                           Clock::time_point deadline, const char* op) {
  Peer& p = *peers_[static_cast<std::size_t>(peer)];
  {
    std::lock_guard lk(mu_);
    if (p.dead) return dead_error(op, peer);
  }
  DeadlineGuard lk(p.send_mu);
  if (!lk.acquire(deadline)) {
    return make_error(ErrorCode::io, who(op) + " timed out after " + ms_text(timeout()) +
                                         " waiting for its connection to rank " +
                                         std::to_string(peer) + " to be free");
  }
  iovec iov[2] = {{const_cast<FrameHeader*>(&h), sizeof h},
                  {const_cast<void*>(payload), static_cast<std::size_t>(h.bytes)}};
  std::size_t written = 0;
  const IoResult r = write_all(p.fd.get(), iov, h.bytes > 0 ? 2 : 1, deadline, stop_r_.get(), written);
  wire_sent_.fetch_add(written);
  if (r.ok()) return Status();
  lk.release();
  if (r.fail == IoFail::timeout && written == 0) {
    return make_error(ErrorCode::io, who(op) + " timed out after " + ms_text(timeout()) +
                                         " sending to rank " + std::to_string(peer) +
                                         " (it does not read)");
  }
  // The stream now holds part of a frame (or is gone): the connection is lost.
  std::string reason = r.fail == IoFail::timeout
                           ? "a send timed out after " + ms_text(timeout()) + " mid-frame"
                       : r.fail == IoFail::closed ? "connection closed (" + r.text + ")"
                                                  : r.text;
  mark_dead(peer, reason);
  std::lock_guard g(mu_);
  return dead_error(op, peer);
}

Status TcpComm::take_coll(int peer, std::uint64_t seq, std::uint8_t phase, detail::CollMsg& out,
                          Clock::time_point deadline, const char* op) {
  Peer& p = *peers_[static_cast<std::size_t>(peer)];
  const auto key = std::make_pair(seq, phase);
  std::unique_lock lk(mu_);
  // Any dead member dooms the collective on every rank: stop waiting at once,
  // whichever peer this rank happens to be waiting for.
  cv_.wait_until(lk, deadline,
                 [&] { return p.coll.count(key) > 0 || num_dead_ > 0 || stop_.load(); });
  if (auto it = p.coll.find(key); it != p.coll.end()) {
    out = std::move(it->second);
    p.coll.erase(it);
    return Status();
  }
  if (p.dead) return dead_error(op, peer);
  for (int k = 0; k < world_; ++k) {
    if (peers_[static_cast<std::size_t>(k)]->dead) return dead_error(op, k);
  }
  return make_error(ErrorCode::io, who(op) + " timed out after " + ms_text(timeout()) +
                                       " waiting for rank " + std::to_string(peer) +
                                       " (collective #" + std::to_string(seq) + ", phase " +
                                       std::to_string(phase) + ")");
}

Status TcpComm::collective(const detail::CollCall& call) {
  const char* name = detail::coll_op_name(static_cast<std::uint8_t>(call.op));
  const auto deadline = deadline_after(timeout());
  {
    std::lock_guard lk(mu_);
    if (!poisoned_.empty()) {
      return make_error(ErrorCode::io, who(name) + ": the group is poisoned by an earlier failure (" +
                                           poisoned_ + "); rebuild it");
    }
    for (int k = 0; k < world_; ++k) {
      if (k != rank_ && peers_[static_cast<std::size_t>(k)]->dead) {
        Error e = dead_error(name, k);
        poisoned_ = e.message;
        return e;
      }
    }
  }
  Transport t(*this, deadline);
  std::uint64_t sent = 0;
  const std::uint64_t seq = coll_seq_++;
  Status st = detail::run_collective(t, rank_, world_, seq, call, sent);
  bytes_sent_.fetch_add(sent);
  if (!st.ok() && st.error().code == ErrorCode::io) {
    std::lock_guard lk(mu_);
    if (poisoned_.empty()) poisoned_ = st.error().message;
  }
  return st;
}

Status TcpComm::send(const void* data, std::size_t bytes, int peer, int tag) {
  constexpr const char* kOp = "send";
  if (peer < 0 || peer >= world_) return peer_range_error(kOp, peer);
  if (bytes > 0 && data == nullptr) {
    return make_error(ErrorCode::invalid_argument, who(kOp) + ": data is null");
  }
  if (bytes > kMaxFrameBytes) {
    return make_error(ErrorCode::invalid_argument, who(kOp) + ": " + std::to_string(bytes) +
                                                       " bytes is more than one message may carry");
  }
  if (peer == rank_) {
    ByteBuf copy = ByteBuf::allocate(bytes);
    if (!copy.ok()) {
      return make_error(ErrorCode::out_of_memory,
                        who(kOp) + ": cannot buffer " + std::to_string(bytes) + " bytes");
    }
    if (bytes > 0) std::memcpy(copy.data(), data, bytes);
    {
      std::lock_guard lk(mu_);
      peers_[static_cast<std::size_t>(peer)]->p2p[tag].push_back(std::move(copy));
    }
    cv_.notify_all();
    return Status();
  }
  FrameHeader h;
  h.kind = static_cast<std::uint32_t>(Kind::data);
  h.tag = tag;
  h.bytes = bytes;
  Status st = send_frame(peer, h, data, deadline_after(timeout()), kOp);
  if (st.ok()) bytes_sent_.fetch_add(bytes);
  return st;
}

Status TcpComm::recv(void* data, std::size_t bytes, int peer, int tag) {
  constexpr const char* kOp = "recv";
  if (peer < 0 || peer >= world_) return peer_range_error(kOp, peer);
  if (bytes > 0 && data == nullptr) {
    return make_error(ErrorCode::invalid_argument, who(kOp) + ": data is null");
  }
  Peer& p = *peers_[static_cast<std::size_t>(peer)];
  const auto deadline = deadline_after(timeout());
  std::unique_lock lk(mu_);
  auto queued = [&]() -> std::deque<ByteBuf>* {
    auto it = p.p2p.find(tag);
    return it != p.p2p.end() && !it->second.empty() ? &it->second : nullptr;
  };
  cv_.wait_until(lk, deadline, [&] { return queued() != nullptr || p.dead || stop_.load(); });
  if (auto* q = queued()) {
    if (q->front().size() != bytes) {
      return make_error(ErrorCode::mismatch,
                        who(kOp) + ": message from rank " + std::to_string(peer) + " (tag " +
                            std::to_string(tag) + ") has " + std::to_string(q->front().size()) +
                            " bytes, expected " + std::to_string(bytes));
    }
    ByteBuf msg = std::move(q->front());
    q->pop_front();
    if (q->empty()) p.p2p.erase(tag);
    lk.unlock();
    if (bytes > 0) std::memcpy(data, msg.data(), bytes);
    return Status();
  }
  if (p.dead) return dead_error(kOp, peer);
  return make_error(ErrorCode::io, who(kOp) + " timed out after " + ms_text(timeout()) +
                                       " waiting for rank " + std::to_string(peer) + " (tag " +
                                       std::to_string(tag) + ", " + std::to_string(bytes) +
                                       " bytes)");
}

Status TcpComm::expose(std::string name, const void* data, std::size_t bytes) {
  constexpr const char* kOp = "expose";
  if (name.empty()) return make_error(ErrorCode::invalid_argument, who(kOp) + ": empty name");
  if (bytes > 0 && data == nullptr) {
    return make_error(ErrorCode::invalid_argument, who(kOp) + ": region '" + name + "' is null");
  }
  std::unique_lock lk(regions_mu_);
  auto it = regions_.find(name);
  if (it != regions_.end()) {
    regions_cv_.wait(lk, [&] { return it->second.inflight == 0; });  // answers are bounded
    it->second.data = data;
    it->second.bytes = bytes;
  } else {
    regions_.emplace(std::move(name), Region{data, bytes, 0});
  }
  return Status();
}

Status TcpComm::unexpose(const std::string& name) {
  constexpr const char* kOp = "unexpose";
  std::unique_lock lk(regions_mu_);
  auto it = regions_.find(name);
  if (it == regions_.end()) {
    return make_error(ErrorCode::not_found, who(kOp) + ": no region named '" + name + "'");
  }
  regions_cv_.wait(lk, [&] { return it->second.inflight == 0; });
  regions_.erase(it);
  return Status();
}

Status TcpComm::get(int peer, std::string name, std::size_t offset, void* dst, std::size_t bytes) {
  constexpr const char* kOp = "get";
  if (peer < 0 || peer >= world_) return peer_range_error(kOp, peer);
  if (bytes > 0 && dst == nullptr) {
    return make_error(ErrorCode::invalid_argument, who(kOp) + ": dst is null");
  }
  auto outside = [&](std::uint64_t region_bytes) {
    return make_error(ErrorCode::invalid_argument,
                      who(kOp) + ": bytes [" + std::to_string(offset) + ", " +
                          std::to_string(offset) + " + " + std::to_string(bytes) +
                          ") are outside region '" + name + "' of rank " + std::to_string(peer) +
                          " (" + std::to_string(region_bytes) + " bytes)");
  };
  auto not_found = [&] {
    return make_error(ErrorCode::not_found, who(kOp) + ": rank " + std::to_string(peer) +
                                                " exposes no region named '" + name + "'");
  };
  if (peer == rank_) {
    std::unique_lock lk(regions_mu_);
    auto it = regions_.find(name);
    if (it == regions_.end()) return not_found();
    const Region& r = it->second;
    if (offset > r.bytes || bytes > r.bytes - offset) return outside(r.bytes);
    if (bytes > 0) std::memcpy(dst, static_cast<const std::byte*>(r.data) + offset, bytes);
    return Status();
  }

  Peer& p = *peers_[static_cast<std::size_t>(peer)];
  std::uint64_t id = 0;
  {
    std::lock_guard lk(mu_);
    if (p.dead) return dead_error(kOp, peer);
    id = next_request_++;
    pending_[id];
  }
  const auto deadline = deadline_after(timeout());
  std::string payload = Writer().u64(bytes).b + name;
  FrameHeader h;
  h.kind = static_cast<std::uint32_t>(Kind::get_req);
  h.bytes = payload.size();
  h.id = id;
  h.arg = offset;
  if (Status st = send_frame(peer, h, payload.data(), deadline, kOp); !st.ok()) {
    std::lock_guard lk(mu_);
    pending_.erase(id);
    return st;
  }
  std::unique_lock lk(mu_);
  cv_.wait_until(lk, deadline, [&] { return pending_[id].done || p.dead || stop_.load(); });
  PendingGet answer = std::move(pending_[id]);
  pending_.erase(id);
  if (!answer.done) {
    if (p.dead) return dead_error(kOp, peer);
    return make_error(ErrorCode::io, who(kOp) + " timed out after " + ms_text(timeout()) +
                                         " waiting for rank " + std::to_string(peer) +
                                         " (region '" + name + "')");
  }
  lk.unlock();
  if (answer.status == kGetNotFound) return not_found();
  if (answer.status == kGetOutside) return outside(answer.region_bytes);
  if (answer.data.size() != bytes) {
    return make_error(ErrorCode::io, who(kOp) + ": rank " + std::to_string(peer) + " answered " +
                                         std::to_string(answer.data.size()) + " bytes, expected " +
                                         std::to_string(bytes) + " (protocol error)");
  }
  if (bytes > 0) std::memcpy(dst, answer.data.data(), bytes);
  return Status();
}

// ---- receiver and responder threads --------------------------------------------

void TcpComm::receive_loop() {
  std::vector<pollfd> fds;
  std::vector<int> who;
  while (!stop_.load()) {
    fds.clear();
    who.clear();
    fds.push_back({stop_r_.get(), POLLIN, 0});
    who.push_back(-1);
    for (int k = 0; k < world_; ++k) {
      Peer& p = *peers_[static_cast<std::size_t>(k)];
      if (k == rank_ || !p.fd.valid() || !p.rx.open) continue;
      fds.push_back({p.fd.get(), POLLIN, 0});
      who.push_back(k);
    }
    // Without a stop pipe (pipe2 failed), wake up now and then to see stop_.
    const int n = ::poll(fds.data(), fds.size(), stop_r_.valid() ? -1 : 50);
    if (n < 0) {
      if (errno == EINTR) continue;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    if (fds[0].revents != 0) break;  // stop
    for (std::size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents != 0) pump(who[i]);
    }
  }
}

/// Reads what peer k has sent (up to a budget), dispatching complete frames.
void TcpComm::pump(int k) {
  Peer& p = *peers_[static_cast<std::size_t>(k)];
  RxState& rx = p.rx;
  std::size_t budget = kPumpBudget;
  auto lost = [&](const std::string& reason) {
    rx.open = false;
    mark_dead(k, reason);
  };
  while (budget > 0 && rx.open) {
    // Large payload remainders go straight into the payload buffer.
    const bool direct = rx.in_payload && rx.payload.size() - rx.payload_got >= rx.stage.size();
    void* dst = direct ? static_cast<void*>(rx.payload.data() + rx.payload_got) : rx.stage.data();
    const std::size_t cap = direct ? rx.payload.size() - rx.payload_got : rx.stage.size();
    const ssize_t got = ::recv(p.fd.get(), dst, cap, MSG_DONTWAIT);
    if (got == 0) return lost("connection closed");
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      return lost(is_closed_errno(errno) ? "connection closed (" + errno_text(errno) + ")"
                                         : errno_text(errno));
    }
    const auto n = static_cast<std::size_t>(got);
    wire_received_.fetch_add(n);
    budget -= std::min(budget, n);
    if (direct) {
      rx.payload_got += n;
      if (rx.payload_got == rx.payload.size()) dispatch(k);
      continue;
    }
    std::size_t pos = 0;
    while (pos < n && rx.open) {
      if (!rx.in_payload) {
        const std::size_t take = std::min(sizeof(FrameHeader) - rx.hdr_got, n - pos);
        std::memcpy(reinterpret_cast<std::byte*>(&rx.hdr) + rx.hdr_got, rx.stage.data() + pos, take);
        rx.hdr_got += take;
        pos += take;
        if (rx.hdr_got < sizeof(FrameHeader)) break;
        const FrameHeader& h = rx.hdr;
        if (h.kind < static_cast<std::uint32_t>(Kind::data) ||
            h.kind > static_cast<std::uint32_t>(Kind::get_resp) || h.bytes > kMaxFrameBytes) {
          return lost("protocol error (bad frame header)");
        }
        rx.payload = ByteBuf::allocate(h.bytes);
        if (!rx.payload.ok()) {
          return lost("out of memory for a " + std::to_string(h.bytes) + "-byte message");
        }
        rx.payload_got = 0;
        rx.in_payload = true;
        if (h.bytes == 0) dispatch(k);
      } else {
        const std::size_t take = std::min(rx.payload.size() - rx.payload_got, n - pos);
        std::memcpy(rx.payload.data() + rx.payload_got, rx.stage.data() + pos, take);
        rx.payload_got += take;
        pos += take;
        if (rx.payload_got == rx.payload.size()) dispatch(k);
      }
    }
  }
}

void TcpComm::dispatch(int k) {
  Peer& p = *peers_[static_cast<std::size_t>(k)];
  RxState& rx = p.rx;
  const FrameHeader h = rx.hdr;
  ByteBuf payload = std::move(rx.payload);
  rx.in_payload = false;
  rx.hdr_got = 0;
  rx.payload_got = 0;
  switch (static_cast<Kind>(h.kind)) {
    case Kind::data: {
      bytes_received_.fetch_add(payload.size());
      {
        std::lock_guard lk(mu_);
        p.p2p[h.tag].push_back(std::move(payload));
      }
      cv_.notify_all();
      return;
    }
    case Kind::coll: {
      bytes_received_.fetch_add(payload.size());
      detail::CollMsg m;
      m.desc.op = h.op;
      m.desc.phase = h.phase;
      m.desc.bad = h.bad;
      m.desc.root = h.root;
      m.desc.seq = h.id;
      m.desc.count = h.arg;
      m.desc.payload_bytes = h.bytes;
      m.payload = std::move(payload);
      {
        std::lock_guard lk(mu_);
        p.coll[std::make_pair(h.id, h.phase)] = std::move(m);
      }
      cv_.notify_all();
      return;
    }
    case Kind::get_req: {
      GetRequest req;
      req.peer = k;
      req.id = h.id;
      req.offset = h.arg;
      if (payload.size() < sizeof(std::uint64_t)) {
        rx.open = false;
        mark_dead(k, "protocol error (short get request)");
        return;
      }
      std::memcpy(&req.bytes, payload.data(), sizeof req.bytes);
      req.name.assign(reinterpret_cast<const char*>(payload.data()) + sizeof req.bytes,
                      payload.size() - sizeof req.bytes);
      {
        std::lock_guard lk(mu_);
        requests_.push_back(std::move(req));
      }
      resp_cv_.notify_one();
      return;
    }
    case Kind::get_resp: {
      bytes_received_.fetch_add(payload.size());
      {
        std::lock_guard lk(mu_);
        auto it = pending_.find(h.id);
        if (it == pending_.end()) return;  // the get gave up
        it->second.done = true;
        it->second.status = h.status;
        it->second.region_bytes = h.arg;
        it->second.data = std::move(payload);
      }
      cv_.notify_all();
      return;
    }
  }
}

void TcpComm::respond_loop() {
  for (;;) {
    GetRequest req;
    {
      std::unique_lock lk(mu_);
      resp_cv_.wait(lk, [&] { return stop_.load() || !requests_.empty(); });
      if (stop_.load()) return;
      req = std::move(requests_.front());
      requests_.pop_front();
    }
    FrameHeader h;
    h.kind = static_cast<std::uint32_t>(Kind::get_resp);
    h.id = req.id;
    const void* src = nullptr;
    Region* region = nullptr;
    {
      std::lock_guard lk(regions_mu_);
      auto it = regions_.find(req.name);
      if (it == regions_.end()) {
        h.status = kGetNotFound;
      } else {
        h.arg = it->second.bytes;
        if (req.offset > it->second.bytes || req.bytes > it->second.bytes - req.offset) {
          h.status = kGetOutside;
        } else {
          h.status = kGetOk;
          h.bytes = req.bytes;
          region = &it->second;
          src = static_cast<const std::byte*>(region->data) + req.offset;
          ++region->inflight;  // unexpose waits until the answer is written
        }
      }
    }
    const Status st = send_frame(req.peer, h, src, deadline_after(timeout()), "get (answer)");
    if (st.ok()) bytes_sent_.fetch_add(h.bytes);
    if (region) {
      {
        std::lock_guard lk(regions_mu_);
        --region->inflight;
      }
      regions_cv_.notify_all();
    }
  }
}

}  // namespace

// ---- TcpGroup ----------------------------------------------------------------------

struct TcpGroup::State {
  TcpOptions opts;
  Fd listener;
  int port = 0;
  bool connected = false;
};

TcpGroup::TcpGroup(std::unique_ptr<State> state) : state_(std::move(state)) {}
TcpGroup::TcpGroup(TcpGroup&&) noexcept = default;
TcpGroup& TcpGroup::operator=(TcpGroup&&) noexcept = default;
TcpGroup::~TcpGroup() = default;

int TcpGroup::port() const noexcept { return state_ ? state_->port : 0; }
int TcpGroup::rank() const noexcept { return state_ ? state_->opts.rank : 0; }
int TcpGroup::world_size() const noexcept { return state_ ? state_->opts.world_size : 0; }

Result<TcpGroup> TcpGroup::listen(TcpOptions o) {
  const std::string where = "TcpGroup::listen: rank " + std::to_string(o.rank);
  if (o.world_size < 1) {
    return make_error(ErrorCode::invalid_argument,
                      where + ": world_size must be >= 1, got " + std::to_string(o.world_size));
  }
  if (o.rank < 0 || o.rank >= o.world_size) {
    return make_error(ErrorCode::invalid_argument, where + ": rank is out of range [0, " +
                                                       std::to_string(o.world_size) + ")");
  }
  if (o.master_port < 0 || o.master_port > 65535 || (o.rank != 0 && o.master_port == 0 && o.world_size > 1)) {
    return make_error(ErrorCode::invalid_argument,
                      where + ": master_port " + std::to_string(o.master_port) +
                          (o.rank != 0 ? " (ranks other than 0 need rank 0's actual port, 1-65535)"
                                       : " is out of range [0, 65535]"));
  }
  if (o.timeout.count() <= 0) {
    return make_error(ErrorCode::invalid_argument, where + ": timeout must be positive");
  }
  auto state = std::make_unique<State>();
  if (o.world_size > 1) {
    const std::string& host = o.rank == 0 ? o.master_host : o.listen_host;
    auto fd = listen_on(host, o.rank == 0 ? o.master_port : 0);
    if (!fd.ok()) return make_error(fd.error().code, where + ": " + fd.error().message);
    state->port = bound_port(fd->get());
    state->listener = std::move(fd).value();
  }
  state->opts = std::move(o);
  return TcpGroup(std::move(state));
}

Result<std::unique_ptr<TcpCommunicator>> TcpGroup::create(TcpOptions options) {
  auto g = listen(std::move(options));
  if (!g.ok()) return std::move(g).error();
  return g->connect();
}

namespace {

/// Accepts connections until every rank in `expect` has passed the handshake
/// (refusing strangers, wrong keys, duplicates). `on_hello` records a peer.
Status accept_ranks(int listen_fd, const TcpOptions& o, std::uint64_t session,
                    std::vector<int> expect, Clock::time_point deadline,
                    std::vector<Fd>& conns, std::vector<std::string>* hosts,
                    std::vector<int>* ports, const std::string& where, const char* waiting_for) {
  std::vector<std::string> refused;
  while (!expect.empty()) {
    Fd fd;
    IoResult a = accept_until(listen_fd, deadline, fd);
    if (!a.ok()) {
      return make_error(ErrorCode::io,
                        where + (a.fail == IoFail::timeout
                                     ? " timed out after " + ms_text(o.timeout)
                                     : ": " + a.text) +
                            " waiting for rank(s) " + rank_list(expect) + " " + waiting_for +
                            refusals_text(refused));
    }
    const auto hs_deadline = std::min(deadline, Clock::now() + kHandshakeSlice);
    auto h = acceptor_handshake(fd.get(), o, hs_deadline, [&](const Hello& hello) -> std::optional<Error> {
      if (hello.session != session) {
        return make_error(ErrorCode::invalid_argument, "belongs to another group (session differs)");
      }
      if (hello.from < 0 || hello.from >= o.world_size) {
        return make_error(ErrorCode::invalid_argument, "rank " + std::to_string(hello.from) +
                                                           " is out of range [0, " +
                                                           std::to_string(o.world_size) + ")");
      }
      if (conns[static_cast<std::size_t>(hello.from)].valid()) {
        return make_error(ErrorCode::invalid_argument,
                          "rank " + std::to_string(hello.from) +
                              " is already connected (two processes claim that rank)");
      }
      if (std::find(expect.begin(), expect.end(), hello.from) == expect.end()) {
        return make_error(ErrorCode::invalid_argument,
                          "rank " + std::to_string(hello.from) + " does not connect to rank " +
                              std::to_string(o.rank) + " at this stage");
      }
      return std::nullopt;
    });
    if (!h.ok()) {
      refused.push_back(h.error().message);
      continue;
    }
    const int from = h->from;
    if (hosts) {
      (*hosts)[static_cast<std::size_t>(from)] =
          is_wildcard(h->listen_host) ? peer_host(fd.get()) : h->listen_host;
      (*ports)[static_cast<std::size_t>(from)] = h->listen_port;
    }
    conns[static_cast<std::size_t>(from)] = std::move(fd);
    expect.erase(std::find(expect.begin(), expect.end(), from));
  }
  return Status();
}

/// Best effort: tell `fd` that the rendezvous failed.
void send_abort(int fd, const Error& e) {
  if (fd < 0) return;
  (void)send_msg(fd, reject_body(e.code, e.message),
                 Clock::now() + std::chrono::milliseconds(500));
}

Status rendezvous_master(const TcpOptions& o, int listen_fd, int port, Clock::time_point deadline,
                         std::vector<Fd>& conns) {
  const int w = o.world_size;
  const std::string where = "TcpGroup::connect: rank 0";
  std::vector<std::string> hosts(static_cast<std::size_t>(w));
  std::vector<int> ports(static_cast<std::size_t>(w), 0);
  std::vector<int> expect;
  for (int k = 1; k < w; ++k) expect.push_back(k);
  const std::string waiting = "to register at " + endpoint(o.master_host, port);
  if (Status st = accept_ranks(listen_fd, o, 0, expect, deadline, conns, &hosts, &ports, where,
                               waiting.c_str());
      !st.ok()) {
    return st;
  }
  auto abort_all = [&](const Error& e) {
    for (int k = 1; k < w; ++k) send_abort(conns[static_cast<std::size_t>(k)].get(), e);
    return e;
  };
  std::string session_bytes = random_bytes(sizeof(std::uint64_t));
  std::uint64_t session = 0;
  std::memcpy(&session, session_bytes.data(), sizeof session);
  if (session == 0) session = 1;
  Writer table;
  table.u8(kTable).u64(session).u32(static_cast<std::uint32_t>(w));
  for (int k = 0; k < w; ++k) {
    table.str(hosts[static_cast<std::size_t>(k)]).u32(static_cast<std::uint32_t>(ports[static_cast<std::size_t>(k)]));
  }
  for (int k = 1; k < w; ++k) {
    if (IoResult r = send_msg(conns[static_cast<std::size_t>(k)].get(), table.b, deadline); !r.ok()) {
      return abort_all(make_error(ErrorCode::io, where + ": sending the address table to rank " +
                                                     std::to_string(k) + " failed: " +
                                                     io_text(r, o.timeout)));
    }
  }
  for (int k = 1; k < w; ++k) {
    std::string m;
    IoResult r = recv_msg(conns[static_cast<std::size_t>(k)].get(), deadline, m);
    if (!r.ok()) {
      return abort_all(make_error(
          ErrorCode::io, where + (r.fail == IoFail::timeout
                                      ? " timed out after " + ms_text(o.timeout) +
                                            " waiting for rank " + std::to_string(k) +
                                            " to connect to its peers"
                                      : ": rank " + std::to_string(k) +
                                            " failed while connecting to its peers: " + r.text)));
    }
    if (static_cast<std::uint8_t>(m[0]) == kReject) {
      return abort_all(rejected(m, where + ": rank " + std::to_string(k) + " could not join"));
    }
    if (static_cast<std::uint8_t>(m[0]) != kReady) {
      return abort_all(make_error(ErrorCode::io, where + ": protocol error from rank " +
                                                     std::to_string(k) + " (expected ready)"));
    }
  }
  const std::string go = Writer().u8(kGo).b;
  for (int k = 1; k < w; ++k) {
    if (IoResult r = send_msg(conns[static_cast<std::size_t>(k)].get(), go, deadline); !r.ok()) {
      return abort_all(make_error(ErrorCode::io, where + ": rank " + std::to_string(k) +
                                                     " went away at the end of the rendezvous: " +
                                                     io_text(r, o.timeout)));
    }
  }
  return Status();
}

Status rendezvous_member(const TcpOptions& o, int listen_fd, int port, Clock::time_point deadline,
                         std::vector<Fd>& conns) {
  const int w = o.world_size;
  const int r = o.rank;
  const std::string where = "TcpGroup::connect: rank " + std::to_string(r);
  const std::string master = endpoint(o.master_host, o.master_port);
  auto fd0 = connect_to(o.master_host, o.master_port, deadline);
  if (!fd0.ok()) {
    return make_error(ErrorCode::io, where + ": cannot reach rank 0 within " + ms_text(o.timeout) +
                                         ": " + fd0.error().message);
  }
  if (Status st = connector_handshake(fd0->get(), o, 0, 0, port, deadline,
                                      where + ": handshake with rank 0 at " + master);
      !st.ok()) {
    return st;
  }
  const int master_fd = fd0->get();
  conns[0] = std::move(fd0).value();
  auto fail = [&](Error e) {
    send_abort(master_fd, e);
    return e;
  };

  std::string m;
  if (IoResult rr = recv_msg(master_fd, deadline, m); !rr.ok()) {
    return make_error(ErrorCode::io,
                      where + (rr.fail == IoFail::timeout
                                   ? " timed out after " + ms_text(o.timeout) +
                                         " waiting for rank 0's address table (other ranks missing?)"
                                   : ": lost rank 0 while waiting for the address table: " + rr.text));
  }
  if (static_cast<std::uint8_t>(m[0]) == kReject) return rejected(m, where + ": rank 0 aborted the rendezvous");
  Reader rd{m};
  const std::uint8_t type = rd.u8();
  const std::uint64_t session = rd.u64();
  const std::uint32_t n = rd.u32();
  std::vector<std::string> hosts;
  std::vector<int> ports;
  for (std::uint32_t k = 0; k < n && rd.ok && k < 1u << 20; ++k) {
    hosts.push_back(rd.str());
    ports.push_back(static_cast<int>(rd.u32()));
  }
  if (!rd.ok || type != kTable || n != static_cast<std::uint32_t>(w)) {
    return fail(make_error(ErrorCode::io, where + ": protocol error (bad address table from rank 0)"));
  }
  for (int j = 1; j < r; ++j) {
    const std::string peer = endpoint(hosts[static_cast<std::size_t>(j)], ports[static_cast<std::size_t>(j)]);
    auto fd = connect_to(hosts[static_cast<std::size_t>(j)], ports[static_cast<std::size_t>(j)], deadline);
    if (!fd.ok()) {
      return fail(make_error(ErrorCode::io, where + ": cannot reach rank " + std::to_string(j) + ": " +
                                                fd.error().message));
    }
    if (Status st = connector_handshake(fd->get(), o, j, session, port, deadline,
                                        where + ": handshake with rank " + std::to_string(j) + " at " + peer);
        !st.ok()) {
      return fail(st.error());
    }
    conns[static_cast<std::size_t>(j)] = std::move(fd).value();
  }
  std::vector<int> expect;
  for (int k = r + 1; k < w; ++k) expect.push_back(k);
  if (Status st = accept_ranks(listen_fd, o, session, expect, deadline, conns, nullptr, nullptr,
                               where, "to connect");
      !st.ok()) {
    return fail(st.error());
  }
  if (IoResult rr = send_msg(master_fd, Writer().u8(kReady).b, deadline); !rr.ok()) {
    return make_error(ErrorCode::io, where + ": lost rank 0: " + io_text(rr, o.timeout));
  }
  if (IoResult rr = recv_msg(master_fd, deadline, m); !rr.ok()) {
    return make_error(ErrorCode::io,
                      where + (rr.fail == IoFail::timeout
                                   ? " timed out after " + ms_text(o.timeout) +
                                         " waiting for the other ranks to finish connecting"
                                   : ": lost rank 0 at the end of the rendezvous: " + rr.text));
  }
  if (static_cast<std::uint8_t>(m[0]) == kReject) return rejected(m, where + ": rank 0 aborted the rendezvous");
  if (static_cast<std::uint8_t>(m[0]) != kGo) {
    return make_error(ErrorCode::io, where + ": protocol error (expected go from rank 0)");
  }
  return Status();
}

}  // namespace

Result<std::unique_ptr<TcpCommunicator>> TcpGroup::connect() {
  if (!state_) return make_error(ErrorCode::invalid_argument, "TcpGroup::connect: moved-from group");
  if (state_->connected) {
    return make_error(ErrorCode::invalid_argument, "TcpGroup::connect: rank " +
                                                       std::to_string(state_->opts.rank) +
                                                       ": already called");
  }
  state_->connected = true;
  const TcpOptions& o = state_->opts;
  const auto deadline = deadline_after(o.timeout);
  std::vector<Fd> conns(static_cast<std::size_t>(o.world_size));
  if (o.world_size > 1) {
    Status st = o.rank == 0
                    ? rendezvous_master(o, state_->listener.get(), state_->port, deadline, conns)
                    : rendezvous_member(o, state_->listener.get(), state_->port, deadline, conns);
    state_->listener.reset();
    if (!st.ok()) return st.error();
  }
  return std::unique_ptr<TcpCommunicator>(
      std::make_unique<TcpComm>(o.rank, o.world_size, std::move(conns), o.timeout));
}

}  // namespace shardline::comm
