// comm/address.hpp: HOST:PORT as the command line gives it (--listen,
// --join, --node, --metrics, --group-master).
#include "comm/address.hpp"

#include <gtest/gtest.h>

#include <string>

namespace shardline::comm {
namespace comm_address_test {

void expect_parsed(const std::string& text, const std::string& host, int port) {
  auto hp = parse_host_port(text);
  ASSERT_TRUE(hp.ok()) << text << ": " << hp.error().to_string();
  EXPECT_EQ(hp->first, host) << text;
  EXPECT_EQ(hp->second, port) << text;
}

void expect_refused(const std::string& text, const std::string& why) {
  auto hp = parse_host_port(text);
  ASSERT_FALSE(hp.ok()) << text << " was accepted";
  EXPECT_EQ(hp.error().code, ErrorCode::invalid_argument) << text;
  EXPECT_EQ(hp.error().message, "'" + text + "'" + why) << text;
}

TEST(ParseHostPort, SplitsHostAndPort) {
  expect_parsed("10.0.0.1:29500", "10.0.0.1", 29500);
  expect_parsed("127.0.0.1:8080", "127.0.0.1", 8080);
  expect_parsed("localhost:0", "localhost", 0);  // 0: the caller binds a free port
  expect_parsed("h:65535", "h", 65535);
  expect_parsed("0.0.0.0:1", "0.0.0.0", 1);
}

TEST(ParseHostPort, SplitsAtTheLastColon) {
  // Neither former copy (actors/metrics.cpp, engine/group/tcp_group.cpp) treated
  // brackets: the host is kept as written.
  expect_parsed("::1:80", "::1", 80);
  expect_parsed("[::1]:80", "[::1]", 80);
}

TEST(ParseHostPort, RefusesAMissingHostOrColon) {
  expect_refused("nohost", " is not HOST:PORT");
  expect_refused("no-port", " is not HOST:PORT");
  expect_refused(":80", " is not HOST:PORT");
  expect_refused("", " is not HOST:PORT");
}

TEST(ParseHostPort, RefusesABadPort) {
  expect_refused("host:99999", ": port must be 0..65535");
  expect_refused("h:70000", ": port must be 0..65535");
  expect_refused("h:65536", ": port must be 0..65535");
  expect_refused("h:8x", ": port must be 0..65535");
  expect_refused("h:", ": port must be 0..65535");
  expect_refused("h:-1", ": port must be 0..65535");
  expect_refused("h:+80", ": port must be 0..65535");
  expect_refused("h: 80", ": port must be 0..65535");
  expect_refused("h:99999999999999999999", ": port must be 0..65535");
}

}  // namespace
}  // namespace shardline::comm
