// The orchestrator relay over fake orchestrators in one actor system: what
// arrives before there is an orchestrator waits for one; the orchestrator
// sees the original sender and its reply reaches the requester; messages an
// orchestrator had queued when it died (request_receiver_down), and what
// was sent after its death, go in order to the next one.
#include <gtest/gtest.h>

#include <caf/all.hpp>

#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "actors/actors.hpp"
#include "actors/protocol.hpp"

namespace shardline::actors {
namespace actors_orchestrator_relay_test {

/// What the fake orchestrators received: "NAME:BYTES", and from whom.
struct Record {
  std::mutex mu;
  std::vector<std::string> got;
  std::vector<caf::actor_addr> senders;

  std::vector<std::string> snapshot() {
    std::lock_guard<std::mutex> lock(mu);
    return got;
  }
  bool wait_for(std::size_t n, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (snapshot().size() >= n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
};

/// A fake orchestrator: answers "NAME:BYTES"; on "die" it stalls 300 ms
/// (so that what the test sends meanwhile queues in its mailbox) and quits
/// like a killed one.
caf::behavior fake_orchestrator(caf::event_based_actor* self, std::string name, std::shared_ptr<Record> record) {
  return {
      [=](relayed_atom, caf::strong_actor_ptr& sender, const std::string&, const std::string& bytes) -> std::string {
        {
          std::lock_guard<std::mutex> lock(record->mu);
          record->got.push_back(name + ":" + bytes);
          record->senders.push_back(sender ? sender->address() : caf::actor_addr());
        }
        if (bytes == "die") {
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          self->quit(caf::exit_reason::kill);
        }
        return name + ":" + bytes;
      },
  };
}

class OrchestratorRelay : public ::testing::Test {
 protected:
  OrchestratorRelay() {
    cfg_.set("scheduler.max-threads", 4);
    cfg_.set("logger.console-verbosity", caf::atom("quiet"));
    sys_ = std::make_unique<caf::actor_system>(cfg_);
  }
  ~OrchestratorRelay() override {
    sys_->await_all_actors_done();
    sys_.reset();
  }

  /// A request through the relay; its reply, or "error".
  std::string ask(caf::scoped_actor& client, const caf::actor& relay, const std::string& bytes) {
    std::string out = "error";
    client->request(relay, std::chrono::seconds(10), msg_atom::value, std::string("tag"), bytes)
        .receive([&](const std::string& reply) { out = reply; }, [&](caf::error&) {});
    return out;
  }

  caf::actor_system_config cfg_;
  std::unique_ptr<caf::actor_system> sys_;
};

TEST_F(OrchestratorRelay, QueuesUntilAnOrchestratorAndHandsOverWhatADeadOneLeft) {
  auto record = std::make_shared<Record>();
  caf::actor relay = spawn_orchestrator_relay(*sys_);
  caf::scoped_actor client{*sys_};
  caf::scoped_actor worker{*sys_};

  // No orchestrator yet: a worker's message and a request wait.
  worker->send(relay, msg_atom::value, std::string("tag"), std::string("hello"));
  auto early = std::async(std::launch::async, [&] {
    caf::scoped_actor c{*sys_};
    return ask(c, relay, "early");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_TRUE(record->snapshot().empty());
  caf::actor first = sys_->spawn(fake_orchestrator, std::string("first"), record);
  client->send(relay, orchestrator_atom::value, first);  // from this node, as the supervisor sends it
  EXPECT_EQ(early.get(), "first:early");
  ASSERT_TRUE(record->wait_for(2));
  EXPECT_EQ(record->snapshot(), (std::vector<std::string>{"first:hello", "first:early"}));
  {
    std::lock_guard<std::mutex> lock(record->mu);
    EXPECT_EQ(record->senders[0], worker->address()) << "the orchestrator must see the original sender";
  }
  EXPECT_EQ(ask(client, relay, "q1"), "first:q1");

  // It dies with three messages queued behind the fatal one: they bounce
  // back to the relay (request_receiver_down) and wait for the next one.
  worker->send(relay, msg_atom::value, std::string("tag"), std::string("die"));
  ASSERT_TRUE(record->wait_for(4));  // "die" is being handled (stalling)
  worker->send(relay, msg_atom::value, std::string("tag"), std::string("r1"));
  worker->send(relay, msg_atom::value, std::string("tag"), std::string("r2"));
  auto pending = std::async(std::launch::async, [&] {
    caf::scoped_actor c{*sys_};
    return ask(c, relay, "q2");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // first is dead by now
  EXPECT_EQ(record->snapshot().size(), 4u) << "nothing reaches a dead orchestrator";
  worker->send(relay, msg_atom::value, std::string("tag"), std::string("r3"));  // sent after the death
  caf::actor second = sys_->spawn(fake_orchestrator, std::string("second"), record);
  client->send(relay, orchestrator_atom::value, second);
  EXPECT_EQ(pending.get(), "second:q2");
  ASSERT_TRUE(record->wait_for(8));
  const auto got = record->snapshot();
  const std::vector<std::string> expected{"first:hello", "first:early", "first:q1", "first:die",
                                          "second:r1",   "second:r2",   "second:q2", "second:r3"};
  EXPECT_EQ(got, expected);
  EXPECT_EQ(ask(client, relay, "q3"), "second:q3");

  caf::anon_send_exit(second, caf::exit_reason::user_shutdown);
  client->send_exit(relay, caf::exit_reason::user_shutdown);
}

// Control and exit messages are taken only from actors of this node: an
// anonymous sender (which is what a remote peer's anon_send looks like)
// cannot redirect the relay nor make it quit (issue 46, item 1); both are
// counted. (A remote sender is refused by the same check:
// tests/actors/keyless_client_e2e_test.cpp.)
TEST_F(OrchestratorRelay, AnonymousControlAndExitMessagesAreRefusedAndCounted) {
  auto record = std::make_shared<Record>();
  auto metrics = std::make_shared<MetricsRegistry>();
  caf::actor relay = spawn_orchestrator_relay(*sys_, metrics);
  caf::scoped_actor supervisor{*sys_};
  caf::actor real = sys_->spawn(fake_orchestrator, std::string("real"), record);
  supervisor->send(relay, orchestrator_atom::value, real);
  caf::scoped_actor client{*sys_};
  EXPECT_EQ(ask(client, relay, "q1"), "real:q1");

  caf::actor intruder = sys_->spawn(fake_orchestrator, std::string("intruder"), record);
  caf::anon_send(relay, orchestrator_atom::value, intruder);
  caf::anon_send_exit(relay, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(relay, caf::exit_reason::unhandled_exception);
  EXPECT_EQ(ask(client, relay, "q2"), "real:q2") << "the relay still forwards to the real orchestrator";
  EXPECT_NE(metrics->render().find("shardline_relay_refused_total 3\n"), std::string::npos) << metrics->render();

  caf::anon_send_exit(real, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(intruder, caf::exit_reason::user_shutdown);
  supervisor->send_exit(relay, caf::exit_reason::user_shutdown);
}

}  // namespace
}  // namespace shardline::actors
