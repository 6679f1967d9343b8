#pragma once
// Helpers of the node fault tests: start `shardline node start` and find its
// ports, poll a job through the CLI (tolerating a moment without an answer),
// read a Prometheus counter, check an output file.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/demo_prompts.hpp"
#include "tests/support/process.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline::testing_support {

/// A started node: its listening address ("127.0.0.1:PORT") and metrics
/// port (0 without --metrics), or empty when it never said so.
struct NodeAddress {
  std::string addr;
  int metrics_port = 0;
};

/// Waits for a node's "listening on" (and "metrics on port") lines.
inline NodeAddress wait_for_node(Child& node, bool metrics) {
  NodeAddress out;
  const std::string log = node.wait_for_log(metrics ? "metrics on port" : "listening on", std::chrono::seconds(60));
  std::smatch m;
  if (std::regex_search(log, m, std::regex("listening on (127\\.0\\.0\\.1:\\d+)"))) out.addr = m[1].str();
  if (metrics && std::regex_search(log, m, std::regex("metrics on port (\\d+)"))) out.metrics_port = std::stoi(m[1].str());
  return out;
}

/// " --node ADDR --key-file KEY" for the client commands.
inline std::string client_flags(const std::string& addr, const std::string& key_file) {
  return " --node " + addr + " --key-file " + key_file;
}

/// `job status JOB --json`, parsed; nullopt when the command failed (e.g. a
/// request that met no orchestrator for its timeout).
inline std::optional<nlohmann::json> job_status(const std::string& client, int job) {
  const CommandResult r = run_command(kShardline + " job status " + std::to_string(job) + " --json" + client);
  if (r.exit_code != 0) return std::nullopt;
  try {
    return nlohmann::json::parse(r.out);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

/// Lines done of `job` (-1 when no answer).
inline int job_done(const std::string& client, int job) {
  const auto s = job_status(client, job);
  return s ? (*s)["jobs"][0]["done"].get<int>() : -1;
}

/// Polls until `job` is done or `timeout` passes; returns the last status.
inline nlohmann::json wait_job_done(const std::string& client, int job, std::chrono::seconds timeout) {
  nlohmann::json last;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (auto s = job_status(client, job)) {
      last = *s;
      if (last["jobs"][0]["state"] == "done" || last["jobs"][0]["state"] == "failed") break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return last;
}

/// The value of a metric line "NAME VALUE" (NAME with its labels) in
/// Prometheus text; -1 when absent.
inline double metric_in(const std::string& text, const std::string& name_with_labels) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(name_with_labels + " ", 0) == 0) return std::stod(line.substr(name_with_labels.size() + 1));
  return -1;
}

/// The value of a metric line "NAME VALUE" (NAME with its labels) from a
/// node's /metrics; -1 when absent or unreachable.
inline double metric(int port, const std::string& name_with_labels) {
  httplib::Client c("127.0.0.1", port);
  auto res = c.Get("/metrics");
  if (!res || res->status != 200) return -1;
  return metric_in(res->body, name_with_labels);
}

/// A node's whole /metrics text, asked again until it answers or
/// `timeout` passes ("" then).
inline std::string scrape_eventually(int port, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    httplib::Client c("127.0.0.1", port);
    if (auto res = c.Get("/metrics"); res && res->status == 200) return res->body;
    if (std::chrono::steady_clock::now() >= deadline) return "";
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

/// Every custom_id of `output` once, `n` lines in all.
inline void expect_each_custom_id_once(const std::string& output, std::size_t n) {
  std::istringstream in(output);
  std::string line;
  std::set<std::string> ids;
  std::size_t lines = 0;
  while (std::getline(in, line)) {
    ids.insert(nlohmann::json::parse(line)["custom_id"].get<std::string>());
    ++lines;
  }
  EXPECT_EQ(lines, n);
  EXPECT_EQ(ids.size(), n);
}

/// Every match of `re`'s first group in `text`.
inline std::vector<std::string> all_matches(const std::string& text, const std::regex& re) {
  std::vector<std::string> out;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it)
    out.push_back((*it)[1].str());
  return out;
}

/// A test with a cluster key and a demo-prompt job in its temp dir: the
/// input, the output of an undisturbed `run`, and `job submit`.
class ClusterJobTest : public TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    ASSERT_EQ(run_command(kShardline + " cluster init --key-file " + path("cluster.key")).exit_code, 0);
  }

  void write_input(int n, int max_tokens) {
    write_demo_prompts(path("in.jsonl"), n, [&](int, nlohmann::json& body) { body["max_tokens"] = max_tokens; });
  }

  /// The output of `run` on one device without failures (batch-invariant:
  /// the batch size does not change it).
  std::string clean_output(int max_batch = 16) {
    const auto r = run_command(kShardline + " run --quiet --model " + kStoriesDir + " --input " + path("in.jsonl") +
                               " --output " + path("clean.jsonl") + " --max-batch " + std::to_string(max_batch));
    EXPECT_EQ(r.exit_code, 0) << r.out;
    return read_file(path("clean.jsonl"));
  }

  void submit(const std::string& client) {
    const auto r = run_command(kShardline + " job submit" + client + " --model " + kStoriesDir + " --input " +
                               path("in.jsonl") + " --output " + path("out.jsonl"));
    ASSERT_EQ(r.exit_code, 0) << r.out;
  }
};

}  // namespace shardline::testing_support
