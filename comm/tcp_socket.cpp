#include "comm/tcp_socket.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <thread>

namespace shardline::comm::tcp_detail {

Clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  constexpr std::chrono::milliseconds kMax = std::chrono::hours(24 * 365);
  return Clock::now() + std::clamp(timeout, std::chrono::milliseconds(1), kMax);
}

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, INT_MAX));
}

std::string errno_text(int e) { return std::strerror(e); }

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

IoResult io_fail(IoFail f, std::string text) { return IoResult{f, std::move(text)}; }

IoResult wait_fd(int fd, short events, Clock::time_point deadline, int stop_fd) {
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

namespace {

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

struct AddrInfo {
  addrinfo* list = nullptr;
  ~AddrInfo() {
    if (list) ::freeaddrinfo(list);
  }
};

}  // namespace

bool is_wildcard(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "*";
}

std::string endpoint(const std::string& host, int port) {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
         std::to_string(port);
}

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

}  // namespace shardline::comm::tcp_detail
