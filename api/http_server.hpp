#pragma once
/// \file
/// The OpenAI Files and Batches APIs over HTTP on a node (`node start
/// --http HOST:PORT`, docs/http.md), served by cpp-httplib on its own thread
/// pool: a slow or broken client holds one of its threads, never a job.
/// Routes map onto BatchApi; uploads stream to disk in chunks.
///
/// Auth: with `api_key_file` every request needs `Authorization: Bearer KEY`
/// with one of its keys (one per line; blank lines and '#' comments
/// skipped), else 401 with OpenAI's error object, a log line and
/// `on_auth_failure`. Without a key file the server only binds to a loopback
/// address (127.0.0.0/8, ::1, localhost) and accepts every request.

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>

#include "api/batch_api.hpp"
#include "common/result.hpp"

namespace httplib {
class Server;
}
namespace shardline::actors {
class HttpListener;  // actors/http_listener.hpp
}

namespace shardline::api {

struct HttpApiOptions {
  std::string host_port;      ///< "HOST:PORT" (port 0: any free port)
  std::string api_key_file;   ///< "" = no keys (loopback only)
  int num_threads = 32;       ///< HTTP worker threads (one per open connection)
  std::function<void()> on_auth_failure;  ///< e.g. a metrics counter
};

class HttpApiServer {
 public:
  /// Reads the keys, binds and starts serving `api` (not owned; it must
  /// outlive the server). Errors: invalid_argument (bad address, a
  /// non-loopback address without keys, an empty key file), not_found / io
  /// (key file), io (bind failed).
  [[nodiscard]] static Result<std::unique_ptr<HttpApiServer>> start(HttpApiOptions options, BatchApi& api);
  ~HttpApiServer();
  [[nodiscard]] int port() const;
  [[nodiscard]] bool authenticated() const { return !keys_.empty(); }

 private:
  HttpApiServer() = default;
  void add_routes(httplib::Server& srv, BatchApi& api);
  std::set<std::string> keys_;
  HttpApiOptions options_;
  /// Last: destroyed (stopped and joined) first, while the handlers'
  /// keys_ and options_ still exist.
  std::unique_ptr<actors::HttpListener> listener_;
};

/// Whether `host` is a loopback address or name.
[[nodiscard]] bool is_loopback_host(const std::string& host);

}  // namespace shardline::api
