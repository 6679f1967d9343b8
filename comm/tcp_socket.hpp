#pragma once
/// \file
/// Internal to comm/ (the TCP backend, comm/tcp.hpp): file descriptors and
/// the POSIX socket calls it makes, each bounded by a deadline. Every socket
/// is non-blocking; a wait is a poll with the time left. Nothing here knows
/// about ranks, handshakes or frames.
///
/// Modules of the TCP backend:
///   tcp_socket     sockets, deadlines, bounded reads / writes (this file)
///   tcp_handshake  control messages, hello / challenge / proof (HMAC-SHA256)
///   tcp_comm, tcp  the data path: frames, receiver / responder threads,
///                  the TcpCommunicator
///   tcp_rendezvous TcpGroup: listen, rendezvous, full mesh

#include <sys/uio.h>

#include <chrono>
#include <cstddef>
#include <string>
#include <utility>

#include "common/result.hpp"

namespace shardline::comm::tcp_detail {

using Clock = std::chrono::steady_clock;

/// now + timeout, with timeout clamped to [1 ms, one year].
[[nodiscard]] Clock::time_point deadline_after(std::chrono::milliseconds timeout);
/// Milliseconds until the deadline, in [0, INT_MAX] (a poll timeout).
[[nodiscard]] int ms_left(Clock::time_point deadline);
/// strerror(e).
[[nodiscard]] std::string errno_text(int e);

/// An owned file descriptor (closed on destruction; -1 = none).
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
  void reset();
  [[nodiscard]] int get() const noexcept { return fd_; }
  [[nodiscard]] bool valid() const noexcept { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

/// How a socket operation ended.
enum class IoFail { none, timeout, closed, stopped, error };

struct IoResult {
  IoFail fail = IoFail::none;
  std::string text;  ///< what went wrong (empty when ok)
  [[nodiscard]] bool ok() const noexcept { return fail == IoFail::none; }
};

[[nodiscard]] IoResult io_fail(IoFail f, std::string text);

/// Waits until fd is ready for `events` (POLLIN / POLLOUT), the deadline
/// passes (timeout), or stop_fd (if >= 0) becomes readable (stopped).
[[nodiscard]] IoResult wait_fd(int fd, short events, Clock::time_point deadline, int stop_fd = -1);

/// Whether errno `e` means the connection is gone (EPIPE, ECONNRESET, ...).
[[nodiscard]] bool is_closed_errno(int e);

/// Writes all of iov (advancing it as it goes) before the deadline, giving
/// up when stop_fd (if >= 0) becomes readable; `written` counts the bytes
/// that went out, also on failure.
[[nodiscard]] IoResult write_all(int fd, iovec* iov, int iovcnt, Clock::time_point deadline,
                                 int stop_fd, std::size_t& written);
/// Writes n bytes before the deadline.
[[nodiscard]] IoResult write_all(int fd, const void* data, std::size_t n, Clock::time_point deadline);
/// Reads exactly n bytes before the deadline (closed on EOF).
[[nodiscard]] IoResult read_all(int fd, void* data, std::size_t n, Clock::time_point deadline);

/// "", "0.0.0.0", "::" or "*": all interfaces.
[[nodiscard]] bool is_wildcard(const std::string& host);
/// "host:port", or "[host]:port" for an IPv6 address (for messages).
[[nodiscard]] std::string endpoint(const std::string& host, int port);

/// A non-blocking listening socket bound to host:port (port 0: any free port;
/// a wildcard host: all interfaces). Errors: io (cannot resolve, bind, listen).
[[nodiscard]] Result<Fd> listen_on(const std::string& host, int port);
/// The local port fd is bound to (0 if unknown).
[[nodiscard]] int bound_port(int fd);
/// The numeric address of fd's peer ("?" if unknown).
[[nodiscard]] std::string peer_host(int fd);

/// Connects to host:port before the deadline, retrying every 20 ms while the
/// listener is not up yet (connection refused / unreachable). The socket is
/// non-blocking with TCP_NODELAY. Errors: io (cannot resolve; the last
/// failure once the deadline passed).
[[nodiscard]] Result<Fd> connect_to(const std::string& host, int port, Clock::time_point deadline);

/// Accepts one connection (non-blocking, TCP_NODELAY) into `out` before the
/// deadline; fail timeout when none came.
[[nodiscard]] IoResult accept_until(int listen_fd, Clock::time_point deadline, Fd& out);

}  // namespace shardline::comm::tcp_detail
