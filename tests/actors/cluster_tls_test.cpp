// actors/cluster_tls.hpp in one process: an actor published over TLS by one
// actor system and reached by others. The same cluster key connects and
// talks; another key fails the handshake on both ends (counted on the
// server); and failed or abruptly closed connections leave a healthy one
// alone. With CAF's own OpenSSL module that last case failed: a stale entry
// in OpenSSL's per-thread error queue made the next read of a healthy
// connection look like an error, and a joined node was cut off by every
// `shardline actor list`.
#include "actors/cluster_tls.hpp"
#include "tests/actors/tls_endpoint.hpp"
#include "tests/support/loopback.hpp"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

namespace shardline::actors {
namespace actors_cluster_tls_test {

using echo_atom = caf::atom_constant<caf::atom("echo")>;

caf::behavior echo(caf::event_based_actor*) {
  return {[](echo_atom, const std::string& s) { return "echo " + s; }};
}

/// `request(echo, s)` through `actor`, or the error text.
std::string ask(caf::actor_system& sys, const caf::actor& actor, const std::string& s) {
  caf::scoped_actor self{sys};
  std::string out;
  self->request(actor, std::chrono::seconds(10), echo_atom::value, s)
      .receive([&](const std::string& r) { out = r; }, [&](caf::error& e) { out = "error " + sys.render(e); });
  return out;
}

/// A TCP connection to 127.0.0.1:`port` that writes `bytes` and is reset
/// (SO_LINGER 0) when closed.
void abrupt_connection(std::uint16_t port, const std::string& bytes) {
  const int fd = testing_support::connect_loopback(port);
  ASSERT_GE(fd, 0);
  if (!bytes.empty()) ASSERT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  linger l{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
  ::close(fd);
}

TEST(ClusterTls, SameKeyTalksOtherKeyIsRefusedAndAHealthyConnectionOutlivesBadOnes) {
  auto key = ClusterKey::generate();
  auto other = ClusterKey::generate();
  ASSERT_TRUE(key && other);
  auto metrics = std::make_shared<MetricsRegistry>();
  TlsEndpoint server(*key, metrics);
  caf::actor published = server.sys->spawn(echo);
  auto port = server.tls->publish(published, "127.0.0.1", 0);
  ASSERT_TRUE(port) << port.error().message;

  TlsEndpoint good(*key);
  EXPECT_EQ(good.tls->fingerprint_sha256(), server.tls->fingerprint_sha256());
  auto remote = good.tls->connect("127.0.0.1", *port);
  ASSERT_TRUE(remote) << remote.error().message;
  EXPECT_EQ(ask(*good.sys, *remote, "a"), "echo a");
  // Watch the healthy connection: its proxy goes down if it is dropped.
  auto down = std::make_shared<std::atomic<bool>>(false);
  caf::actor watcher = good.sys->spawn([down, r = *remote](caf::event_based_actor* self) -> caf::behavior {
    self->monitor(r);
    self->set_down_handler([down](caf::down_msg&) { *down = true; });
    return {[](int) {}};
  });

  {
    TlsEndpoint bad(*other);
    EXPECT_NE(bad.tls->fingerprint_sha256(), server.tls->fingerprint_sha256());
    auto refused = bad.tls->connect("127.0.0.1", *port);
    ASSERT_FALSE(refused);
    EXPECT_EQ(refused.error().code, ErrorCode::io);
    EXPECT_NE(refused.error().message.find("the TLS handshake failed"), std::string::npos) << refused.error().message;
  }
  abrupt_connection(*port, "not TLS at all\r\n");
  abrupt_connection(*port, "");
  {
    // A plain (not TLS) CAF client.
    caf::actor_system_config cfg;
    cfg.load<caf::io::middleman>();
    cfg.set("logger.console-verbosity", caf::atom("quiet"));
    caf::actor_system plain{cfg};
    EXPECT_FALSE(plain.middleman().remote_actor("127.0.0.1", *port));
  }
  for (int i = 0; i < 20; ++i) EXPECT_EQ(ask(*good.sys, *remote, std::to_string(i)), "echo " + std::to_string(i));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(down->load()) << "the healthy connection was dropped";
  EXPECT_GE(metrics->get("shardline_tls_handshake_failures_total"), 4);

  caf::anon_send_exit(watcher, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(published, caf::exit_reason::user_shutdown);
}

TEST(ClusterTls, AUsedPortIsAnError) {
  auto key = ClusterKey::generate();
  ASSERT_TRUE(key);
  TlsEndpoint a(*key), b(*key);
  caf::actor x = a.sys->spawn(echo);
  caf::actor y = b.sys->spawn(echo);
  auto port = a.tls->publish(x, "127.0.0.1", 0);
  ASSERT_TRUE(port);
  auto again = b.tls->publish(y, "127.0.0.1", *port);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code, ErrorCode::io);
  EXPECT_NE(again.error().message.find("cannot listen on 127.0.0.1:" + std::to_string(*port)), std::string::npos)
      << again.error().message;
  caf::anon_send_exit(x, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(y, caf::exit_reason::user_shutdown);
}

}  // namespace
}  // namespace shardline::actors
