// Peers without the cluster key against a node's port (issue 46, item 1).
// The port publishes the orchestrator relay over mutual TLS
// (actors/cluster_tls.hpp). This test process tries, as any peer on the
// network can:
//   * a plain CAF client (`remote_actor`, no TLS), which before the fix
//     could redirect the orchestrator's traffic to itself and stop the
//     relay with one exit message;
//   * a TLS client holding another cluster's key;
//   * raw bytes, an empty connection, and one that stays silent (a TLS
//     handshake that never comes must not stall anyone else).
// None gets a connection; the node logs each refusal with the peer's
// address and counts it (shardline_tls_handshake_failures_total), and a
// real client's job completes while the silent connection is still open.
// Then a client with the right key, over TLS, sends what only the node's
// own actors may send (a new orchestrator, exits) and an unsigned request:
// the relay refuses them too (defence in depth: shardline_relay_refused_total,
// shardline_auth_failures_total), and the intruder's actor receives nothing.
#include <gtest/gtest.h>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <atomic>
#include <chrono>
#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <thread>

#include <unistd.h>

#include "actors/cluster_tls.hpp"
#include "tests/actors/tls_endpoint.hpp"
#include "actors/protocol.hpp"
#include "tests/actors/node_harness.hpp"
#include "tests/support/loopback.hpp"
#include "tests/support/process.hpp"

namespace shardline::actors {
namespace actors_keyless_client_e2e_test {

using testing_support::Child;
using testing_support::kShardline;
using testing_support::run_command;

using KeylessClient = testing_support::TempDirTest;

/// An actor that counts every message it gets (it should get none).
caf::behavior intruder(caf::event_based_actor* self, std::shared_ptr<std::atomic<int>> received) {
  self->set_default_handler([received](caf::scheduled_actor*, caf::message_view&) -> caf::result<caf::message> {
    ++*received;
    return caf::message();
  });
  return {[received](msg_atom, const std::string&, const std::string&) { ++*received; }};
}

/// Opens a TCP connection to 127.0.0.1:`port`, writes `bytes`, and
/// returns the socket (closed by the caller), or -1.
int raw_connection(int port, const std::string& bytes) {
  const int fd = testing_support::connect_loopback(port);
  if (fd >= 0 && !bytes.empty() && ::write(fd, bytes.data(), bytes.size()) < 0) return -1;
  return fd;
}

TEST_F(KeylessClient, CannotConnectAndTheNodeKeepsServing) {
  ASSERT_EQ(run_command(kShardline + " cluster init --key-file " + path("cluster.key")).exit_code, 0);
  ASSERT_EQ(run_command(kShardline + " cluster init --key-file " + path("other.key")).exit_code, 0);
  Child node({kShardline, "node", "start", "--listen", "127.0.0.1:0", "--data-dir", path("data"), "--model",
              testing_support::kStoriesDir, "--key-file", path("cluster.key"), "--metrics", "127.0.0.1:0",
              "--threads", "1"},
             path("node.log"));
  const auto addr = testing_support::wait_for_node(node, /*metrics=*/true);
  ASSERT_FALSE(addr.addr.empty()) << node.log();
  const int port = std::stoi(addr.addr.substr(addr.addr.rfind(':') + 1));

  // 1. A plain CAF client: no TLS, no key.
  {
    caf::actor_system_config cfg;
    cfg.load<caf::io::middleman>();
    cfg.set("logger.console-verbosity", caf::atom("quiet"));
    caf::actor_system sys{cfg};
    auto relay = sys.middleman().remote_actor("127.0.0.1", static_cast<std::uint16_t>(port));
    EXPECT_FALSE(relay) << "a keyless plain CAF client reached the relay";
  }
  // 2. TLS with another cluster's key.
  {
    auto other = ClusterKey::load(path("other.key"));
    ASSERT_TRUE(other);
    TlsEndpoint stranger(*other);
    auto relay = stranger.connect(port);
    ASSERT_FALSE(relay) << "a client of another cluster key reached the relay";
    EXPECT_NE(relay.error().message.find("TLS handshake failed"), std::string::npos) << relay.error().message;
  }
  // 3. Raw bytes, an empty connection, and a silent one left open.
  for (const std::string bytes : {std::string("GET / HTTP/1.0\r\n\r\n"), std::string()}) {
    const int fd = raw_connection(port, bytes);
    ASSERT_GE(fd, 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ::close(fd);
  }
  const int silent = raw_connection(port, "");
  ASSERT_GE(silent, 0);

  // A real client with the key: its job completes meanwhile.
  {
    std::ofstream in(path("in.jsonl"));
    for (int i = 0; i < 4; ++i)
      in << R"({"custom_id": "r)" << i << R"(", "body": {"prompt": "Once upon a time", "max_tokens": 4}})" "\n";
  }
  const std::string client = testing_support::client_flags(addr.addr, path("cluster.key"));
  const auto submit = run_command(kShardline + " job submit" + client + " --model " + testing_support::kStoriesDir +
                                  " --input " + path("in.jsonl") + " --output " + path("out.jsonl"));
  ASSERT_EQ(submit.exit_code, 0) << submit.out << node.log();
  const auto status = testing_support::wait_job_done(client, 1, std::chrono::seconds(120));
  ASSERT_FALSE(status.is_null()) << node.log();
  EXPECT_EQ(status["jobs"][0]["state"], "done") << status.dump() << node.log();
  EXPECT_EQ(status["jobs"][0]["done"], 4);
  ::close(silent);

  // 4. With the key, over TLS: what only the node's own actors may send.
  auto received = std::make_shared<std::atomic<int>>(0);
  {
    auto key = ClusterKey::load(path("cluster.key"));
    ASSERT_TRUE(key);
    TlsEndpoint holder(*key);
    caf::actor_system& sys = *holder.sys;
    auto relay = holder.connect(port);
    ASSERT_TRUE(relay) << relay.error().message;
    caf::actor mine = sys.spawn(intruder, received);
    {
      caf::scoped_actor self{sys};
      self->send(*relay, orchestrator_atom::value, mine);        // hijack, named sender
      caf::anon_send(*relay, orchestrator_atom::value, mine);    // hijack, anonymous
      self->send_exit(*relay, caf::exit_reason::user_shutdown);  // stop it
      caf::anon_send_exit(*relay, caf::exit_reason::unhandled_exception);
      // An unsigned request is refused by the orchestrator's inbox.
      std::string reply;
      self->request(*relay, std::chrono::seconds(30), msg_atom::value, std::string("no-tag"), std::string("bytes"))
          .receive([&](const std::string& r) { reply = r; }, [&](caf::error& e) { reply = "error " + sys.render(e); });
      EXPECT_FALSE(reply.empty());
      EXPECT_EQ(reply.rfind("error", 0), std::string::npos) << "the relay stopped answering: " << reply;
    }
    const auto again = run_command(kShardline + " job status 1" + client);
    EXPECT_EQ(again.exit_code, 0) << again.out;
    caf::anon_send_exit(mine, caf::exit_reason::user_shutdown);
  }
  EXPECT_EQ(received->load(), 0) << "the intruder received the node's traffic";

  const std::string log = node.log();
  // Refused at the handshake: the plain client, the other key, the raw
  // bytes, the empty and the silent connection.
  EXPECT_GE(testing_support::all_matches(log, std::regex("tls: refused a connection from (127\\.0\\.0\\.1:\\d+)")).size(),
            5u)
      << log;
  EXPECT_GE(testing_support::metric(addr.metrics_port, "shardline_tls_handshake_failures_total"), 5) << log;
  EXPECT_NE(log.find("refused a new orchestrator"), std::string::npos) << log;
  EXPECT_NE(log.find("refused an exit message"), std::string::npos) << log;
  EXPECT_GE(testing_support::metric(addr.metrics_port, "shardline_relay_refused_total"), 4) << log;
  EXPECT_GE(testing_support::metric(addr.metrics_port, "shardline_auth_failures_total"), 1) << log;
}

}  // namespace
}  // namespace shardline::actors
