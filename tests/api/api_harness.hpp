#pragma once
// A node with the HTTP API in a child process, for the api e2e tests: its
// cluster key, an API key file, the port it prints, plain HTTP calls, and the
// job-id fields of output lines normalized for byte comparisons.

#include <httplib.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/output_ids.hpp"
#include "tests/support/process.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline::api::testing {

using testing_support::Child;
using testing_support::kShardline;

inline const std::string kApiKey = "sk-shardline-test-key";

/// Starts `node start --http 127.0.0.1:0 --api-key-file` over `dir`
/// (cluster.key and api.keys are written there once).
class ApiNode {
 public:
  ApiNode(const std::string& dir, std::vector<std::string> extra = {}, const std::string& log = "node.log") : dir_(dir) {
    if (!std::ifstream(dir + "/cluster.key"))
      (void)testing_support::run_command(kShardline + " cluster init --key-file " + dir + "/cluster.key");
    std::ofstream(dir + "/api.keys") << "# test keys\n\n" << kApiKey << "\n";
    std::vector<std::string> argv = {kShardline, "node", "start", "--model", testing_support::kStoriesDir,
                                     "--listen", "127.0.0.1:0", "--key-file", dir + "/cluster.key",
                                     "--data-dir", dir + "/data", "--http", "127.0.0.1:0",
                                     "--api-key-file", dir + "/api.keys", "--threads", "1"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    child_ = std::make_unique<Child>(argv, dir + "/" + log);
    const std::string out = child_->wait_for_log("http api on port", std::chrono::seconds(60));
    std::smatch m;
    if (std::regex_search(out, m, std::regex("http api on port (\\d+)"))) port_ = std::stoi(m[1]);
    if (std::regex_search(out, m, std::regex("metrics on port (\\d+)"))) metrics_port_ = std::stoi(m[1]);
  }
  [[nodiscard]] int port() const { return port_; }
  [[nodiscard]] int metrics_port() const { return metrics_port_; }
  [[nodiscard]] std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  [[nodiscard]] std::string log() const { return child_->log(); }
  Child& child() { return *child_; }

  /// An HTTP client with the key (or `key` when given; "" = none).
  [[nodiscard]] std::unique_ptr<httplib::Client> client(const std::string& key = kApiKey) const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port_);
    c->set_read_timeout(60, 0);
    if (!key.empty()) c->set_default_headers({{"Authorization", "Bearer " + key}});
    return c;
  }

 private:
  std::string dir_;
  std::unique_ptr<Child> child_;
  int port_ = 0;
  int metrics_port_ = 0;
};

/// Uploads `text` as a batch input file; returns the response.
inline httplib::Result upload(httplib::Client& c, const std::string& text, const std::string& purpose = "batch") {
  httplib::MultipartFormDataItems items = {{"purpose", purpose, "", ""},
                                           {"file", text, "input.jsonl", "application/jsonl"}};
  return c.Post("/v1/files", items);
}

inline nlohmann::json body(const httplib::Result& r) {
  return r ? nlohmann::json::parse(r->body, nullptr, false) : nlohmann::json();
}

/// Output lines with their ids replaced (tests/support/output_ids.hpp), so
/// outputs of different jobs over the same input compare byte for byte.
inline std::string normalize_job_ids(const std::string& text) { return testing_support::normalize_output_ids(text); }

/// The first `n` lines of the demo prompts.
inline std::string demo_prompts(std::size_t n) {
  std::ifstream in(std::string(SHARDLINE_SOURCE_DIR) + "/deploy/demo/prompts.jsonl");
  std::string line, out;
  for (std::size_t i = 0; i < n && std::getline(in, line); ++i) out += line + "\n";
  return out;
}

}  // namespace shardline::api::testing
