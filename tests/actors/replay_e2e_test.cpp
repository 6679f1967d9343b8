// Replay against a node (issue 46, item 2).
//   1. On the wire: a recording TCP proxy sits between `shardline job
//      submit` and the node; the client's bytes, sent again on a new
//      connection, are refused in the TLS handshake (fresh keys per
//      connection) and counted, and no second job appears.
//   2. Above TLS, by a key holder: a signed submit sent twice, and again
//      on a new connection, runs once; the copies are refused as replayed,
//      logged and counted (shardline_replays_refused_total).
#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <atomic>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include "actors/cluster_tls.hpp"
#include "tests/actors/tls_endpoint.hpp"
#include "actors/protocol.hpp"
#include "messages/codec.hpp"
#include "tests/actors/node_harness.hpp"
#include "tests/support/loopback.hpp"
#include "tests/support/process.hpp"

namespace shardline::actors {
namespace actors_replay_e2e_test {

using testing_support::Child;
using testing_support::connect_loopback;
using testing_support::listen_loopback;
using testing_support::kShardline;
using testing_support::run_command;

using Replay = testing_support::TempDirTest;

/// Forwards one connection accepted on `listener` to 127.0.0.1:`port` and
/// back until either side closes; returns what the client sent.
std::string record_one_connection(int listener, int port) {
  const int client = ::accept(listener, nullptr, nullptr);
  const int server = connect_loopback(port);
  std::string sent;
  if (client < 0 || server < 0) return sent;
  char buf[65536];
  for (bool open = true; open;) {
    pollfd fds[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
    if (::poll(fds, 2, 30'000) <= 0) break;
    for (int i = 0; i < 2 && open; ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const ssize_t n = ::read(fds[i].fd, buf, sizeof(buf));
      if (n <= 0) {
        open = false;
        break;
      }
      if (i == 0) sent.append(buf, static_cast<std::size_t>(n));
      if (::write(fds[1 - i].fd, buf, static_cast<std::size_t>(n)) != n) open = false;
    }
  }
  ::close(client);
  ::close(server);
  return sent;
}

std::size_t num_jobs(const std::string& client) {
  const auto list = run_command(kShardline + " job status --json" + client);
  EXPECT_EQ(list.exit_code, 0) << list.out;
  return nlohmann::json::parse(list.out)["jobs"].size();
}

TEST_F(Replay, RecordedBytesAndResentSignedMessagesAreRefusedAndCounted) {
  ASSERT_EQ(run_command(kShardline + " cluster init --key-file " + path("cluster.key")).exit_code, 0);
  Child node({kShardline, "node", "start", "--listen", "127.0.0.1:0", "--data-dir", path("data"), "--model",
              testing_support::kStoriesDir, "--key-file", path("cluster.key"), "--metrics", "127.0.0.1:0",
              "--threads", "1"},
             path("node.log"));
  const auto addr = testing_support::wait_for_node(node, /*metrics=*/true);
  ASSERT_FALSE(addr.addr.empty()) << node.log();
  const int port = std::stoi(addr.addr.substr(addr.addr.rfind(':') + 1));
  const std::string client = testing_support::client_flags(addr.addr, path("cluster.key"));
  {
    std::ofstream in(path("in.jsonl"));
    for (int i = 0; i < 3; ++i)
      in << R"({"custom_id": "r)" << i << R"(", "body": {"prompt": "Once upon a time", "max_tokens": 4}})" "\n";
  }
  const std::string submit_args = " --model " + std::string(testing_support::kStoriesDir) + " --input " +
                                  path("in.jsonl") + " --output " + path("out.jsonl");

  // 1. Record a submit through a proxy, then play the bytes back.
  std::uint16_t proxy_port = 0;
  const int listener = listen_loopback(proxy_port);
  ASSERT_GE(listener, 0);
  std::string recorded;
  std::thread proxy([&] { recorded = record_one_connection(listener, port); });
  const auto submitted = run_command(kShardline + " job submit --node 127.0.0.1:" + std::to_string(proxy_port) +
                                     " --key-file " + path("cluster.key") + submit_args);
  proxy.join();
  ::close(listener);
  ASSERT_EQ(submitted.exit_code, 0) << submitted.out << node.log();
  ASSERT_GT(recorded.size(), 500u);
  ASSERT_FALSE(testing_support::wait_job_done(client, 1, std::chrono::seconds(120)).is_null()) << node.log();
  // -1: not exported yet (no failure so far).
  const double tls_before =
      std::max(0.0, testing_support::metric(addr.metrics_port, "shardline_tls_handshake_failures_total"));
  {
    const int fd = connect_loopback(port);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, recorded.data(), recorded.size()), static_cast<ssize_t>(recorded.size()));
    char buf[4096];
    while (::read(fd, buf, sizeof(buf)) > 0) {
    }  // until the node closes it
    ::close(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(testing_support::metric(addr.metrics_port, "shardline_tls_handshake_failures_total"), tls_before + 1)
      << node.log();
  EXPECT_EQ(num_jobs(client), 1u) << "the played-back bytes submitted a job";

  // 2. A key holder sends one signed submit three times.
  auto key = ClusterKey::load(path("cluster.key"));
  ASSERT_TRUE(key);
  messages::SubmitJob job;
  job.model_dir = testing_support::kStoriesDir;
  job.inputs = {path("in.jsonl")};
  job.output = path("out2.jsonl");
  const Signed s = sign(*key, messages::encode(messages::OrchestratorMsg{job}));
  std::vector<std::string> replies;
  for (int connection = 0; connection < 2; ++connection) {
    TlsEndpoint holder(*key);
    caf::actor_system& sys = *holder.sys;
    auto relay = holder.connect(port);
    ASSERT_TRUE(relay) << relay.error().message;
    for (int copy = 0; copy < (connection == 0 ? 2 : 1); ++copy) {
      caf::scoped_actor self{sys};
      self->request(*relay, std::chrono::seconds(30), msg_atom::value, s.tag, s.bytes)
          .receive(
              [&](const std::string& sealed) {
                auto bytes = open_reply(*key, s.tag, sealed);
                ASSERT_TRUE(bytes) << bytes.error().message;
                auto r = messages::decode_orchestrator_reply(*bytes);
                ASSERT_TRUE(r.ok());
                if (auto* e = std::get_if<Error>(&*r))
                  replies.push_back(e->message);
                else
                  replies.push_back(messages::kind_name(*r));
              },
              [&](caf::error& e) { replies.push_back("error " + sys.render(e)); });
    }
  }
  ASSERT_EQ(replies.size(), 3u);
  EXPECT_EQ(replies[0], "jobSubmitted");
  EXPECT_EQ(replies[1].rfind("replayed:", 0), 0u) << replies[1];
  EXPECT_EQ(replies[2].rfind("replayed:", 0), 0u) << replies[2];
  EXPECT_EQ(num_jobs(client), 2u) << "a replayed submit ran again";
  EXPECT_EQ(testing_support::metric(addr.metrics_port, "shardline_replays_refused_total"), 2) << node.log();
  EXPECT_EQ(testing_support::all_matches(node.log(), std::regex("orchestrator: (refused a replayed message)")).size(),
            2u)
      << node.log();
}

}  // namespace
}  // namespace shardline::actors
