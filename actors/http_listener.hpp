#pragma once
/// \file
/// A cpp-httplib server serving on its own thread: what the Prometheus
/// endpoint (actors/metrics.hpp) and the HTTP Batch API (api/http_server.hpp)
/// share. It binds with SO_REUSEADDR only (cpp-httplib's default adds
/// SO_REUSEPORT, with which a second node once bound a keyed node's port
/// silently and the kernel split the requests between the two: issue 46,
/// item 3), so a port in use is a start error; and start() returns only once
/// the accept loop runs (before, cpp-httplib 0.11's stop() is a no-op and a
/// server destroyed at once would never be joined).

#include <memory>
#include <string>
#include <thread>

#include "common/result.hpp"

namespace httplib {
class Server;
}

namespace shardline::actors {

class HttpListener {
 public:
  /// Binds `server` (its routes and options already set) to HOST:PORT
  /// (port 0: any free one) and serves it on a thread. `max_backlog`: listen
  /// again with SOMAXCONN (cpp-httplib listens with a backlog of 5, and a
  /// burst of clients then waits 1, 3, 7 s... for SYN retries). `name`
  /// prefixes errors ("metrics", "--http").
  /// Errors: invalid_argument (bad address), io ("NAME: cannot listen on
  /// HOST:PORT (is the port in use by another process?)").
  [[nodiscard]] static Result<std::unique_ptr<HttpListener>> start(std::unique_ptr<httplib::Server> server,
                                                                  const std::string& host_port,
                                                                  const std::string& name, bool max_backlog);
  /// Stops the server and joins its thread.
  ~HttpListener();
  HttpListener(const HttpListener&) = delete;
  HttpListener& operator=(const HttpListener&) = delete;

  /// The bound port.
  [[nodiscard]] int port() const { return port_; }

 private:
  HttpListener() = default;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace shardline::actors
