// A keyless CAF client against a node's port (issue 46, item 1). The port
// publishes the orchestrator relay; this test process connects to it as any
// peer on the network can (`remote_actor`), holding no cluster key, and:
//   * tells the relay that its own actor is the new orchestrator (as the
//     node's supervisor does locally), from a named actor and anonymously;
//   * sends the relay exit messages (user_shutdown, unhandled_exception);
//   * sends an unsigned request.
// Before the fix the first made the relay forward the node's traffic (the
// real clients' job submits and status polls, the workers' hellos and
// heartbeats) to the intruder. Now: the node keeps serving, a real client's
// job completes, the intruder receives nothing, and the attempts are logged
// and counted (shardline_relay_refused_total, shardline_auth_failures_total).
// exit_reason::kill is not tried: CAF makes it fatal before any handler,
// so only the transport can keep it out (docs/cluster.md, "Threat model").
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

#include "actors/protocol.hpp"
#include "tests/actors/node_harness.hpp"
#include "tests/support/process.hpp"

namespace shardline::actors {
namespace {

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

TEST_F(KeylessClient, CannotRedirectTheOrchestratorNorStopTheRelay) {
  ASSERT_EQ(run_command(kShardline + " cluster init --key-file " + path("cluster.key")).exit_code, 0);
  Child node({kShardline, "node", "start", "--listen", "127.0.0.1:0", "--data-dir", path("data"), "--model",
              testing_support::kStoriesDir, "--key-file", path("cluster.key"), "--metrics", "127.0.0.1:0",
              "--threads", "1"},
             path("node.log"));
  const auto addr = testing_support::wait_for_node(node, /*metrics=*/true);
  ASSERT_FALSE(addr.addr.empty()) << node.log();
  const int port = std::stoi(addr.addr.substr(addr.addr.rfind(':') + 1));

  // The keyless client: its own actor system, no key file anywhere.
  caf::actor_system_config cfg;
  cfg.load<caf::io::middleman>();
  cfg.set("logger.console-verbosity", caf::atom("quiet"));
  caf::actor_system sys{cfg};
  auto relay = sys.middleman().remote_actor("127.0.0.1", static_cast<std::uint16_t>(port));
  ASSERT_TRUE(relay) << sys.render(relay.error());
  auto received = std::make_shared<std::atomic<int>>(0);
  caf::actor mine = sys.spawn(intruder, received);
  {
    caf::scoped_actor self{sys};
    self->send(*relay, orchestrator_atom::value, mine);         // hijack, named sender
    caf::anon_send(*relay, orchestrator_atom::value, mine);     // hijack, anonymous
    self->send_exit(*relay, caf::exit_reason::user_shutdown);   // stop it
    caf::anon_send_exit(*relay, caf::exit_reason::unhandled_exception);
    // An unsigned request is refused by the orchestrator's inbox.
    std::string reply;
    self->request(*relay, std::chrono::seconds(30), msg_atom::value, std::string("no-tag"), std::string("bytes"))
        .receive([&](const std::string& r) { reply = r; }, [&](caf::error& e) { reply = "error " + sys.render(e); });
    EXPECT_FALSE(reply.empty());
    EXPECT_EQ(reply.rfind("error", 0), std::string::npos) << "the relay stopped answering: " << reply;
  }

  // A real client with the key: its job goes to the real orchestrator and
  // completes, through the same relay.
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
  EXPECT_EQ(received->load(), 0) << "the intruder received the node's traffic";

  const std::string log = node.log();
  EXPECT_NE(log.find("refused a new orchestrator"), std::string::npos) << log;
  EXPECT_NE(log.find("refused an exit message"), std::string::npos) << log;
  EXPECT_GE(testing_support::metric(addr.metrics_port, "shardline_relay_refused_total"), 4) << log;
  EXPECT_GE(testing_support::metric(addr.metrics_port, "shardline_auth_failures_total"), 1) << log;
  caf::anon_send_exit(mine, caf::exit_reason::user_shutdown);
}

}  // namespace
}  // namespace shardline::actors
