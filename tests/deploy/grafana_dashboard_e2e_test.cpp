// deploy/grafana/shardline-dashboard.json: every metric its panels query is
// one a node exports (read from a running node's /metrics, `# TYPE` lines,
// so a renamed or dropped metric fails here), the panels cover what
// operators look at (throughput, requests by state, KV use, failures and
// recoveries, SiDP WaS/CaS mode and switches), and every query parses with
// a PromQL parser from PyPI (promql-parser, in the test venv; a missing
// parser fails the test).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "tests/support/python.hpp"
#include "tests/support/process.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline {
namespace deploy_grafana_dashboard_e2e_test {

using json = nlohmann::json;
using testing_support::Child;
using testing_support::kShardline;
using testing_support::read_file;
using testing_support::run_command;

using GrafanaDashboard = testing_support::TempDirTest;

const std::string kDashboard = std::string(SHARDLINE_SOURCE_DIR) + "/deploy/grafana/shardline-dashboard.json";

/// Every query of the dashboard's panels, with its panel title.
std::vector<std::pair<std::string, std::string>> queries(const json& dash) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& p : dash.at("panels"))
    for (const auto& t : p.value("targets", json::array())) out.emplace_back(p.at("title"), t.at("expr"));
  return out;
}

/// Metric names a query reads (a histogram's _bucket series as written).
std::set<std::string> metrics_in(const std::string& expr) {
  std::set<std::string> names;
  static const std::regex name("shardline_[a-z0-9_]+");
  for (auto it = std::sregex_iterator(expr.begin(), expr.end(), name); it != std::sregex_iterator(); ++it)
    names.insert(it->str());
  return names;
}

TEST_F(GrafanaDashboard, IsAWellFormedDashboard) {
  const json dash = json::parse(read_file(kDashboard));
  EXPECT_EQ(dash.at("uid"), "shardline-cluster");
  std::set<int> ids;
  int with_queries = 0;
  for (const auto& p : dash.at("panels")) {
    EXPECT_TRUE(ids.insert(p.at("id").get<int>()).second) << "duplicate panel id " << p.at("id");
    EXPECT_TRUE(p.contains("gridPos")) << p.at("title");
    if (p.at("type") == "row") continue;
    EXPECT_FALSE(p.value("targets", json::array()).empty()) << p.at("title") << " has no query";
    EXPECT_FALSE(p.value("description", "").empty()) << p.at("title") << " has no description";
    ++with_queries;
    for (const auto& t : p.at("targets"))
      EXPECT_NE(t.at("expr").get<std::string>().find("instance=~\"$instance\""), std::string::npos)
          << p.at("title") << ": every query follows the Node selector";
  }
  EXPECT_GE(with_queries, 12);
}

TEST_F(GrafanaDashboard, QueriesOnlyMetricsANodeExportsAndCoversTheTopics) {
  ASSERT_EQ(run_command(kShardline + " cluster init --key-file " + path("cluster.key")).exit_code, 0);
  Child node({kShardline, "node", "start", "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0", "--http",
              "127.0.0.1:0", "--data-dir", path("data"), "--model", testing_support::kStoriesDir, "--key-file",
              path("cluster.key"), "--threads", "1"},
             path("node.log"));
  const std::string log = node.wait_for_log("http api on port", std::chrono::seconds(60));
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log, m, std::regex("metrics on port (\\d+)"))) << log;
  httplib::Client client("127.0.0.1", std::stoi(m[1].str()));
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res);
  std::map<std::string, std::string> exported;  // name -> type
  static const std::regex type_line("# TYPE (\\S+) (\\S+)");
  for (auto it = std::sregex_iterator(res->body.begin(), res->body.end(), type_line); it != std::sregex_iterator();
       ++it)
    exported[(*it)[1]] = (*it)[2];
  ASSERT_GT(exported.size(), 20u) << res->body;

  const json dash = json::parse(read_file(kDashboard));
  std::set<std::string> queried;
  for (const auto& [title, expr] : queries(dash)) {
    const auto names = metrics_in(expr);
    EXPECT_FALSE(names.empty()) << title << ": " << expr;
    for (const std::string& n : names) {
      queried.insert(n);
      static const std::regex bucket("(.*)_(bucket|sum|count)$");
      std::smatch b;
      if (exported.count(n) == 0 && std::regex_match(n, b, bucket)) {
        EXPECT_EQ(exported[b[1]], "histogram") << title << ": " << n << " is not a histogram's series";
        continue;
      }
      EXPECT_EQ(exported.count(n), 1u) << title << ": " << n << " is not exported by a node";
    }
  }
  // The topics (issue 16): throughput, requests by state, KV use, failures
  // and recoveries, WaS/CaS mode and transitions.
  for (const char* n : {"shardline_generation_tokens_total", "shardline_requests_total", "shardline_jobs",
                        "shardline_kv_blocks_used", "shardline_kv_blocks_total", "shardline_worker_failures_total",
                        "shardline_recovered_tokens_total", "shardline_recomputed_tokens_total",
                        "shardline_sidp_mode", "shardline_sidp_switches_total"})
    EXPECT_EQ(queried.count(n), 1u) << "the dashboard does not show " << n;
  node.kill(SIGTERM);
  EXPECT_EQ(node.wait_or_kill(std::chrono::seconds(20)), 0) << node.log();
}

TEST_F(GrafanaDashboard, EveryQueryParsesAsPromQl) {
  const std::string problem = testing_support::python_env_problem("promql_parser");
  ASSERT_TRUE(problem.empty()) << problem;
  json exprs = json::array();
  for (const auto& [title, expr] : queries(json::parse(read_file(kDashboard)))) exprs.push_back(expr);
  // The parser finds errors: a broken query is reported (the check can fail).
  exprs.push_back("sum(rate(shardline_workers[1m])");
  std::ofstream(path("exprs.json")) << exprs.dump();
  const auto r = run_command(testing_support::kPython + " " + std::string(SHARDLINE_SOURCE_DIR) +
                             "/tests/deploy/check_promql.py " + path("exprs.json"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::vector<std::string> lines;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), exprs.size()) << r.out;
  for (std::size_t i = 0; i + 1 < lines.size(); ++i) EXPECT_EQ(lines[i], "ok") << exprs[i];
  EXPECT_EQ(lines.back().rfind("error: ", 0), 0u) << lines.back();
}

}  // namespace
}  // namespace shardline
