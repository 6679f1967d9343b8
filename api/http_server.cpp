#include "api/http_server.hpp"

#include <httplib.h>
#include <spdlog/spdlog.h>


#include <algorithm>
#include <cctype>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <utility>

#include "common/json_bounded.hpp"
#include "actors/http_listener.hpp"
#include "comm/address.hpp"

namespace shardline::api {

namespace {

using json = nlohmann::json;

void send(httplib::Response& res, const ApiResponse& r) {
  res.status = r.status;
  res.set_content(r.body.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace), "application/json");
}

Result<std::set<std::string>> read_keys(const std::string& file) {
  std::ifstream in(file);
  if (!in) return make_error(ErrorCode::not_found, "--api-key-file: cannot read " + file);
  std::set<std::string> keys;
  std::string line;
  while (std::getline(in, line)) {
    const auto b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos || line[b] == '#') continue;
    const auto e = line.find_last_not_of(" \t\r");
    keys.insert(line.substr(b, e - b + 1));
  }
  if (keys.empty()) return make_error(ErrorCode::invalid_argument, "--api-key-file: " + file + " holds no key");
  return keys;
}

/// An upload in progress: the multipart fields and the file being written.
struct Upload {
  std::string field;       ///< the part being read
  std::string purpose;
  std::string filename;
  bool has_file = false;
  std::optional<FileStore::Writer> writer;
  std::optional<ApiResponse> error;
};

}  // namespace

bool is_loopback_host(const std::string& host) {
  return host == "localhost" || host == "::1" || host == "[::1]" || host.rfind("127.", 0) == 0;
}

Result<std::unique_ptr<HttpApiServer>> HttpApiServer::start(HttpApiOptions options, BatchApi& api) {
  auto hp = comm::parse_host_port(options.host_port);
  if (!hp) return std::move(hp).error();
  const auto& [host, port] = *hp;
  std::unique_ptr<HttpApiServer> s(new HttpApiServer());
  if (!options.api_key_file.empty()) {
    auto keys = read_keys(options.api_key_file);
    if (!keys) return std::move(keys).error();
    s->keys_ = std::move(keys).value();
  } else if (!is_loopback_host(host)) {
    return make_error(ErrorCode::invalid_argument, "--http " + options.host_port +
                                                       ": without --api-key-file the HTTP API listens on a loopback "
                                                       "address only (e.g. 127.0.0.1:PORT)");
  }
  s->options_ = std::move(options);
  auto server = std::make_unique<httplib::Server>();
  const int threads = std::max(1, s->options_.num_threads);
  server->new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<std::size_t>(threads)); };
  // Room for the multipart framing around the largest upload.
  server->set_payload_max_length(static_cast<std::size_t>(api.max_upload_bytes()) + (1u << 20));
  // cpp-httplib gives each open connection a pool thread: an idle
  // keep-alive connection would hold one (200 polling clients would queue
  // behind 32 idle ones), so every response closes its connection, and a
  // stalled client lets go of its thread after the read timeout.
  server->set_keep_alive_max_count(1);
  server->set_read_timeout(10, 0);
  server->set_write_timeout(10, 0);
  s->add_routes(*server, api);
  // cpp-httplib listens with a backlog of 5: a burst of clients overflows
  // it and their SYNs are retried after 1, 3, 7, 15 s... so: SOMAXCONN.
  auto listener = actors::HttpListener::start(std::move(server), s->options_.host_port, "--http", /*max_backlog=*/true);
  if (!listener) return std::move(listener).error();
  s->listener_ = std::move(listener).value();
  return s;
}

HttpApiServer::~HttpApiServer() = default;

int HttpApiServer::port() const { return listener_->port(); }

void HttpApiServer::add_routes(httplib::Server& srv, BatchApi& api) {
  srv.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (keys_.empty()) return httplib::Server::HandlerResponse::Unhandled;
    // "Authorization: Bearer KEY": the scheme is case-insensitive and
    // followed by one or more spaces (RFC 7235 section 2.1; issue 46, item 4).
    const std::string auth = req.get_header_value("Authorization");
    const std::size_t space = auth.find(' ');
    std::string scheme = auth.substr(0, space);
    std::transform(scheme.begin(), scheme.end(), scheme.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    const bool given = scheme == "bearer" && space != std::string::npos;
    const std::string key = given ? auth.substr(auth.find_first_not_of(' ', space) == std::string::npos
                                                    ? auth.size()
                                                    : auth.find_first_not_of(' ', space))
                                  : std::string();
    if (given && keys_.count(key) != 0) return httplib::Server::HandlerResponse::Unhandled;
    spdlog::warn("http api: {} {} from {}: {}", req.method, req.path, req.remote_addr,
                 given ? "wrong API key" : "no API key");
    if (options_.on_auth_failure) options_.on_auth_failure();
    send(res, api_error(401,
                        given ? "Incorrect API key provided."
                              : "You didn't provide an API key. Provide it in an Authorization header "
                                "(Authorization: Bearer YOUR_KEY).",
                        "invalid_request_error", "", "invalid_api_key"));
    return httplib::Server::HandlerResponse::Handled;
  });
  srv.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send(res, api_error(500, what, "server_error"));
  });
  srv.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;  // a route's own error
    if (res.status == 413)
      send(res, api_error(413, "The request body is larger than the upload limit", "invalid_request_error", "file"));
    else if (res.status == 404)
      send(res, api_error(404, "Unknown request URL: " + req.method + " " + req.path, "invalid_request_error", "",
                          "unknown_url"));
    else
      send(res, api_error(res.status, "HTTP error " + std::to_string(res.status), "invalid_request_error"));
  });

  // ---- files ----
  srv.Post("/v1/files", [&api](const httplib::Request& req, httplib::Response& res,
                               const httplib::ContentReader& content_reader) {
    if (!req.is_multipart_form_data()) {
      send(res, api_error(400, "Expected a multipart/form-data body with the fields 'file' and 'purpose'"));
      return;
    }
    Upload up;
    const bool read = content_reader(
        [&](const httplib::MultipartFormData& part) {
          up.field = part.name;
          if (part.name == "file") {
            if (up.has_file) {
              up.error = api_error(400, "More than one 'file' field", "invalid_request_error", "file");
              return false;
            }
            up.has_file = true;
            up.filename = part.filename.empty() ? "upload.jsonl" : part.filename;
            auto w = api.files().create(up.filename, "batch", api.max_upload_bytes());
            if (!w) {
              up.error = api_error(500, w.error().message, "server_error");
              return false;
            }
            up.writer.emplace(std::move(w).value());
          }
          return true;
        },
        [&](const char* data, std::size_t len) {
          if (up.field == "purpose") {
            up.purpose.append(data, len);
            if (up.purpose.size() > 64) {
              up.error = api_error(400, "Invalid value for 'purpose'", "invalid_request_error", "purpose");
              return false;
            }
          } else if (up.field == "file" && up.writer) {
            if (Status s = up.writer->write({data, len}); !s) {
              up.error = s.error().code == ErrorCode::out_of_memory
                             ? api_error(413, s.error().message, "invalid_request_error", "file", "file_too_large")
                             : api_error(500, s.error().message, "server_error");
              return false;
            }
          }
          return true;
        });
    if (up.error) return send(res, *up.error);
    if (!read) {
      if (res.status == 413)  // the HTTP layer's payload limit
        return send(res, api_error(413, "The upload is larger than the limit of " +
                                            std::to_string(api.max_upload_bytes()) + " bytes",
                                   "invalid_request_error", "file", "file_too_large"));
      return send(res, api_error(400, "Malformed multipart/form-data body"));
    }
    if (!up.has_file) return send(res, api_error(400, "Missing required parameter: 'file'.", "invalid_request_error", "file"));
    if (up.purpose.empty())
      return send(res, api_error(400, "Missing required parameter: 'purpose'.", "invalid_request_error", "purpose"));
    if (up.purpose != "batch")
      return send(res, api_error(400, "Invalid value for 'purpose': '" + up.purpose +
                                          "'. This server supports only 'batch'.",
                                 "invalid_request_error", "purpose"));
    auto file = up.writer->commit();
    if (!file) return send(res, api_error(500, file.error().message, "server_error"));
    send(res, api.finish_upload(*file));
  });
  srv.Get("/v1/files", [&api](const httplib::Request& req, httplib::Response& res) {
    send(res, api.list_files(req.get_param_value("purpose")));
  });
  srv.Get(R"(/v1/files/([^/]+))", [&api](const httplib::Request& req, httplib::Response& res) {
    send(res, api.retrieve_file(req.matches[1]));
  });
  srv.Delete(R"(/v1/files/([^/]+))", [&api](const httplib::Request& req, httplib::Response& res) {
    send(res, api.delete_file(req.matches[1]));
  });
  srv.Get(R"(/v1/files/([^/]+)/content)", [&api](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    auto f = api.files().get(id);
    if (!f) return send(res, api_error(404, "No such File object: " + id, "invalid_request_error", "id"));
    auto in = std::make_shared<std::ifstream>(api.files().content_path(id), std::ios::binary);
    if (!*in) return send(res, api_error(500, "cannot read file " + id, "server_error"));
    res.set_content_provider(static_cast<std::size_t>(f->bytes), "application/octet-stream",
                             [in](std::size_t offset, std::size_t length, httplib::DataSink& sink) {
                               std::string buf(std::min<std::size_t>(length, 1u << 16), '\0');
                               in->clear();
                               in->seekg(static_cast<std::streamoff>(offset));
                               in->read(buf.data(), static_cast<std::streamsize>(buf.size()));
                               const auto n = static_cast<std::size_t>(in->gcount());
                               if (n == 0) return false;
                               return sink.write(buf.data(), n);
                             });
  });

  // ---- batches ----
  srv.Post("/v1/batches", [&api](const httplib::Request& req, httplib::Response& res) {
    const auto body = parse_json_bounded(req.body);
    if (!body.ok())
      return send(res, api_error(400, body.error().code == ErrorCode::invalid_argument
                                          ? "The body is not valid JSON: " + body.error().message
                                          : "The body is not valid JSON"));
    send(res, api.create_batch(*body));
  });
  srv.Get("/v1/batches", [&api](const httplib::Request& req, httplib::Response& res) {
    int limit = 20;
    if (req.has_param("limit")) {
      try {
        std::size_t used = 0;
        const std::string v = req.get_param_value("limit");
        limit = std::stoi(v, &used);
        if (used != v.size()) limit = -1;
      } catch (const std::exception&) {
        limit = -1;
      }
    }
    send(res, api.list_batches(limit, req.get_param_value("after")));
  });
  srv.Get(R"(/v1/batches/([^/]+))", [&api](const httplib::Request& req, httplib::Response& res) {
    send(res, api.retrieve_batch(req.matches[1]));
  });
  srv.Post(R"(/v1/batches/([^/]+)/cancel)", [&api](const httplib::Request& req, httplib::Response& res) {
    send(res, api.cancel_batch(req.matches[1]));
  });
}

}  // namespace shardline::api
