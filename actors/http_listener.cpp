#include "actors/http_listener.hpp"

#include <httplib.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "comm/address.hpp"

namespace shardline::actors {

Result<std::unique_ptr<HttpListener>> HttpListener::start(std::unique_ptr<httplib::Server> server,
                                                          const std::string& host_port, const std::string& name,
                                                          bool max_backlog) {
  auto hp = comm::parse_host_port(host_port);
  if (!hp) return std::move(hp).error();
  const auto& [host, port] = *hp;
  std::unique_ptr<HttpListener> l(new HttpListener());
  l->server_ = std::move(server);
  int listen_fd = -1;
  l->server_->set_socket_options([&listen_fd](socket_t fd) {
    const int yes = 1;
    (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    listen_fd = fd;
  });
  l->port_ = port == 0 ? l->server_->bind_to_any_port(host) : (l->server_->bind_to_port(host, port) ? port : -1);
  if (l->port_ <= 0)
    return make_error(ErrorCode::io, name + ": cannot listen on " + host_port +
                                         (port != 0 ? " (is the port in use by another process?)" : ""));
  // Linux takes a second listen() as a new backlog for the same socket.
  if (max_backlog && listen_fd >= 0 && ::listen(listen_fd, SOMAXCONN) != 0)
    spdlog::warn("{}: cannot raise the listen backlog: {}", name, std::strerror(errno));
  httplib::Server* srv = l->server_.get();
  auto exited = std::make_shared<std::atomic<bool>>(false);
  l->thread_ = std::thread([srv, exited] {
    srv->listen_after_bind();
    *exited = true;
  });
  // Wait for the accept loop (or the thread's end), at most 10 s.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!srv->is_running() && !*exited && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return l;
}

HttpListener::~HttpListener() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace shardline::actors
