// Prometheus registry rendering and the HTTP endpoint on loopback.
#include "actors/metrics.hpp"

#include <gtest/gtest.h>
#include <httplib.h>

namespace shardline::actors {
namespace actors_metrics_test {

TEST(Metrics, RendersTextExpositionFormat) {
  MetricsRegistry r;
  r.describe("shardline_requests_total", "counter", "Requests finished, by state.");
  r.add("shardline_requests_total", "state=\"done\"", 3);
  r.add("shardline_requests_total", "state=\"done\"", 2);
  r.add("shardline_requests_total", "state=\"failed\"", 1);
  r.describe("shardline_kv_blocks_used", "gauge", "KV blocks in use.");
  r.set("shardline_kv_blocks_used", "", 7);
  EXPECT_EQ(r.get("shardline_requests_total", "state=\"done\""), 5);
  EXPECT_EQ(r.render(),
            "# HELP shardline_kv_blocks_used KV blocks in use.\n"
            "# TYPE shardline_kv_blocks_used gauge\n"
            "shardline_kv_blocks_used 7\n"
            "# HELP shardline_requests_total Requests finished, by state.\n"
            "# TYPE shardline_requests_total counter\n"
            "shardline_requests_total{state=\"done\"} 5\n"
            "shardline_requests_total{state=\"failed\"} 1\n");
}

TEST(Metrics, ServedOverHttp) {
  MetricsRegistry r;
  r.describe("shardline_engine_steps_total", "counter", "Engine steps.");
  r.add("shardline_engine_steps_total", "", 42);
  auto server = MetricsServer::start(r, "127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.error().to_string();
  httplib::Client client("127.0.0.1", (*server)->port());
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, r.render());  // exactly the registry's text, not a line of it
  EXPECT_NE(res->body.find("shardline_engine_steps_total 42\n"), std::string::npos) << res->body;
}

TEST(Metrics, BadAddressIsAClearError) {
  MetricsRegistry r;
  auto s = MetricsServer::start(r, "no-port");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(s.error().message.find("'no-port'"), std::string::npos) << s.error().message;
  // HOST:PORT parsing itself is tested in tests/comm/address_test.cpp.
  auto bad_port = MetricsServer::start(r, "127.0.0.1:99999");
  ASSERT_FALSE(bad_port.ok());
  EXPECT_EQ(bad_port.error().code, ErrorCode::invalid_argument);
}

// A port already serving metrics is an error for a second server, not a
// port the two share (cpp-httplib's default SO_REUSEPORT; issue 46).
TEST(Metrics, PortInUseIsAnError) {
  MetricsRegistry r;
  auto first = MetricsServer::start(r, "127.0.0.1:0");
  ASSERT_TRUE(first.ok()) << first.error().to_string();
  const std::string addr = "127.0.0.1:" + std::to_string((*first)->port());
  auto second = MetricsServer::start(r, addr);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.error().code, ErrorCode::io);
  EXPECT_NE(second.error().message.find(addr + " (is the port in use"), std::string::npos) << second.error().message;
}

}  // namespace
}  // namespace shardline::actors
