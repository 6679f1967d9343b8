// The orchestrator's SiDP half over fake workers and a fake layer owner in
// one actor system (no engine): a group's hellos bring the sync directive,
// a falling batch in the heartbeats brings a CaS directive to both ranks
// with a larger epoch, metrics and `job status` show it; a restarted
// orchestrator syncs the group again above the old epochs; a layer owner's
// hello puts it in `actor list`, and `actor kill` kills it.
#include <gtest/gtest.h>

#include <caf/all.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "actors/actors.hpp"
#include "actors/client.hpp"
#include "actors/protocol.hpp"
#include "messages/codec.hpp"
#include "tests/orchestrator/temp_dir.hpp"

namespace shardline::actors {
namespace actors_sidp_orchestrator_test {

using send_atom = caf::atom_constant<caf::atom("tsend")>;
using namespace std::chrono_literals;

/// What a fake worker or owner received and how it ended.
struct Record {
  std::mutex mu;
  std::vector<messages::SidpSwitch> switches;
  int shutdowns = 0;
  std::optional<caf::error> exit;

  std::vector<messages::SidpSwitch> got() {
    std::lock_guard<std::mutex> lock(mu);
    return switches;
  }
};

/// A fake worker or layer owner: (send_atom, bytes) signs the bytes and
/// sends them to the relay as itself; it records the SiDP directives it
/// receives (their tags checked) and its exit reason.
caf::behavior fake_peer(caf::event_based_actor* self, caf::actor relay, std::shared_ptr<const ClusterKey> key,
                        std::shared_ptr<Record> rec) {
  self->attach_functor([rec](const caf::error& reason) {
    std::lock_guard<std::mutex> lock(rec->mu);
    rec->exit = reason;
  });
  return {
      [=](send_atom, const std::string& bytes) {
        const Signed s = sign(*key, bytes);
        self->send(relay, msg_atom::value, s.tag, s.bytes);
      },
      [=](msg_atom, const std::string& tag, const std::string& bytes) {
        if (!message_tag_is_authentic(*key, tag, bytes)) return;
        auto msg = messages::decode_worker(bytes);
        if (!msg) return;
        std::lock_guard<std::mutex> lock(rec->mu);
        if (const auto* sw = std::get_if<messages::SidpSwitch>(&*msg)) rec->switches.push_back(*sw);
        if (std::holds_alternative<messages::Shutdown>(*msg)) ++rec->shutdowns;
      },
      [](const std::string&) {},  // the orchestrator's (empty) replies
  };
}

bool eventually(const std::function<bool()>& done, std::chrono::milliseconds timeout = 15s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return done();
}

std::uint64_t unix_ms_now() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}

class SidpOrchestrator : public ::testing::Test {
 protected:
  SidpOrchestrator() {
    cfg_.set("scheduler.max-threads", 4);
    cfg_.set("logger.console-verbosity", caf::atom("quiet"));
    sys_ = std::make_unique<caf::actor_system>(cfg_);
    auto key = ClusterKey::generate();
    EXPECT_TRUE(key.ok());
    key_ = std::make_shared<const ClusterKey>(std::move(key).value());
    describe_node_metrics(*metrics_);
    relay_ = spawn_orchestrator_relay(*sys_);
  }
  ~SidpOrchestrator() override {
    for (const caf::actor& a : peers_) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    if (orchestrator_) caf::anon_send_exit(orchestrator_, caf::exit_reason::user_shutdown);
    {  // from an actor of this node: the relay ignores anonymous exits
      caf::scoped_actor self{*sys_};
      self->send_exit(relay_, caf::exit_reason::user_shutdown);
    }
    sys_->await_all_actors_done();
    sys_.reset();
  }

  /// Starts an orchestrator incarnation over the data dir and hands it to the relay.
  void start_orchestrator() {
    std::unique_ptr<orchestrator::JobManager> jobs;
    ASSERT_TRUE(eventually([&] {  // the previous incarnation may still hold the RocksDB lock
      auto j = orchestrator::JobManager::open(dir_.path());
      if (j) jobs = std::move(j).value();
      return jobs != nullptr;
    }));
    OrchestratorConfig oc;
    oc.node_name = "t";
    oc.model_dir = dir_.path();
    oc.jobs = std::move(jobs);
    oc.key = key_;
    oc.metrics = metrics_;
    oc.failure.heartbeat_ms = 100;
    oc.failure.failure_timeout_ms = 5000;
    oc.sidp_policy.setting = engine::SidpModeSetting::automatic;
    oc.sidp_policy.switch_batch = 4;
    oc.sidp_policy.min_dwell_s = 0.2;
    oc.roster = roster_;
    orchestrator_ = spawn_orchestrator(*sys_, std::move(oc));
    caf::scoped_actor supervisor{*sys_};  // the relay takes a new orchestrator only from this node
    supervisor->send(relay_, orchestrator_atom::value, orchestrator_);
  }

  caf::actor peer(std::shared_ptr<Record> rec) {
    caf::actor a = sys_->spawn(fake_peer, relay_, std::shared_ptr<const ClusterKey>(key_), std::move(rec));
    peers_.push_back(a);
    return a;
  }

  static void say(const caf::actor& from, const messages::OrchestratorMsg& msg) {
    caf::anon_send(from, send_atom::value, messages::encode(msg));
  }

  static messages::WorkerHello hello(int rank) {
    messages::WorkerHello h;
    h.worker_name = "t/cpu:" + std::to_string(rank);
    h.device = "cpu";
    h.max_batch = 8;
    h.sidp_group = "t/sidp";
    h.sidp_rank = static_cast<std::uint32_t>(rank);
    h.sidp_ranks = 2;
    return h;
  }

  static messages::WorkerHeartbeat beat(int rank, std::uint32_t running, const std::string& mode) {
    messages::WorkerHeartbeat b;
    b.worker_name = "t/cpu:" + std::to_string(rank);
    b.status.worker_name = b.worker_name;
    b.status.state = "busy";
    b.status.num_running = running;
    b.status.kv_blocks_used = 5;
    b.status.kv_blocks_total = 10;
    b.status.weight_bytes = 2u << 20;
    b.status.sidp_mode = mode;
    return b;
  }

  std::optional<messages::ActorInfo> find_actor(Client& client, const std::string& name) {
    auto list = client.call<messages::ActorList>(messages::ActorListQuery{});
    EXPECT_TRUE(list.ok()) << list.error().to_string();
    if (!list) return std::nullopt;
    for (const auto& a : list->actors)
      if (a.name == name) return a;
    return std::nullopt;
  }

  orchestrator::testing::TempDir dir_;
  caf::actor_system_config cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  std::shared_ptr<const ClusterKey> key_;
  std::shared_ptr<MetricsRegistry> metrics_ = std::make_shared<MetricsRegistry>();
  std::shared_ptr<OrchestratorRoster> roster_ = std::make_shared<OrchestratorRoster>();
  caf::actor relay_;
  caf::actor orchestrator_;
  std::vector<caf::actor> peers_;
};

TEST_F(SidpOrchestrator, SyncsThenSwitchesToCasInTheTailAndShowsIt) {
  start_orchestrator();
  auto client = Client::local(*sys_, relay_, key_);
  auto rec0 = std::make_shared<Record>();
  auto rec1 = std::make_shared<Record>();
  caf::actor w0 = peer(rec0);
  caf::actor w1 = peer(rec1);

  // Rank 0 alone: nothing. Rank 1 completes the group: both get WaS, epoch 1.
  say(w0, hello(0));
  std::this_thread::sleep_for(100ms);
  EXPECT_TRUE(rec0->got().empty()) << "an incomplete group gets no directive";
  say(w1, hello(1));
  const messages::SidpSwitch sync{"t/sidp", "was", 1};
  ASSERT_TRUE(eventually([&] { return rec0->got().size() == 1 && rec1->got().size() == 1; }));
  EXPECT_EQ(rec0->got()[0], sync);
  EXPECT_EQ(rec1->got()[0], sync);
  EXPECT_EQ(metrics_->get("shardline_sidp_mode", "group=\"t/sidp\""), 0.0);

  // The bulk: 8 running on each rank (G = 16 >= b* = 4) for 0.5 s: no switch.
  for (int i = 0; i < 10; ++i) {
    say(w0, beat(0, 8, "was"));
    say(w1, beat(1, 8, "was"));
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(rec0->got().size(), 1u);
  EXPECT_EQ(rec1->got().size(), 1u);

  // The tail: 1 on each (G = 2 < 4); after the 0.2 s dwell both get CaS.
  const std::uint64_t before = unix_ms_now();
  ASSERT_TRUE(eventually([&] {
    say(w0, beat(0, 1, "was"));
    say(w1, beat(1, 1, "was"));
    return rec0->got().size() == 2 && rec1->got().size() == 2;
  }));
  const std::uint64_t after = unix_ms_now();
  EXPECT_EQ(rec0->got()[1], (messages::SidpSwitch{"t/sidp", "cas", 2}));
  EXPECT_EQ(rec1->got()[1], (messages::SidpSwitch{"t/sidp", "cas", 2}));
  EXPECT_EQ(metrics_->get("shardline_sidp_mode", "group=\"t/sidp\""), 1.0);
  EXPECT_EQ(metrics_->get("shardline_sidp_switches_total", "group=\"t/sidp\",to=\"cas\""), 1.0);
  EXPECT_EQ(metrics_->get("shardline_sidp_switches_total", "group=\"t/sidp\",to=\"was\""), 0.0);
  const std::string text = metrics_->render();
  EXPECT_NE(text.find("# TYPE shardline_sidp_mode gauge"), std::string::npos) << text;
  EXPECT_NE(text.find("shardline_sidp_switches_total{group=\"t/sidp\",to=\"cas\"} 1"), std::string::npos) << text;

  // `job status` lists the group and its switch.
  auto status = client->call<messages::JobStatusList>(messages::JobStatusQuery{0});
  ASSERT_TRUE(status.ok()) << status.error().to_string();
  ASSERT_EQ(status->sidp_groups.size(), 1u);
  const messages::SidpGroupStatus& g = status->sidp_groups[0];
  EXPECT_EQ(g.group, "t/sidp");
  EXPECT_EQ(g.mode, "cas");
  EXPECT_EQ(g.setting, "auto");
  EXPECT_EQ(g.num_ranks, 2u);
  EXPECT_EQ(g.switch_batch, 4u);
  EXPECT_EQ(g.group_batch, 2u);
  EXPECT_EQ(g.num_switches, 1u);
  ASSERT_EQ(g.switches.size(), 1u);
  EXPECT_EQ(g.switches[0].to_mode, "cas");
  EXPECT_EQ(g.switches[0].epoch, 2u);
  EXPECT_EQ(g.switches[0].group_batch, 2u);
  EXPECT_GE(g.switches[0].at_unix_ms, before);
  EXPECT_LE(g.switches[0].at_unix_ms, after);

  // `actor list`: the workers' detail from their heartbeats.
  say(w0, beat(0, 1, "cas"));
  ASSERT_TRUE(eventually([&] {
    auto a = find_actor(*client, "t/cpu:0");
    return a && a->detail == "weights 2.0 MiB, kv blocks 5/10, sidp cas";
  })) << (find_actor(*client, "t/cpu:0") ? find_actor(*client, "t/cpu:0")->detail : "not listed");
  EXPECT_EQ(roster_->sidp_epoch, 2u);

  // The orchestrator restarts (the ranks still run in CaS): the group's
  // hellos sync it again in WaS, above the old epochs.
  caf::scoped_actor watcher{*sys_};
  watcher->monitor(orchestrator_);
  ASSERT_TRUE(client->call<messages::Ack>(messages::KillActor{"orchestrator"}).ok());
  bool down = false;
  watcher->receive([&](const caf::down_msg&) { down = true; }, caf::after(15s) >> [] {});
  ASSERT_TRUE(down);
  {
    std::lock_guard<std::mutex> lock(roster_->mu);
    ++roster_->restarts;
  }
  start_orchestrator();
  say(w0, hello(0));
  say(w1, hello(1));
  ASSERT_TRUE(eventually([&] { return rec0->got().size() == 3 && rec1->got().size() == 3; }));
  EXPECT_EQ(rec0->got()[2], (messages::SidpSwitch{"t/sidp", "was", 3}));
  EXPECT_EQ(rec1->got()[2], (messages::SidpSwitch{"t/sidp", "was", 3}));
  EXPECT_EQ(metrics_->get("shardline_sidp_mode", "group=\"t/sidp\""), 0.0);
  EXPECT_EQ(rec0->shutdowns + rec1->shutdowns, 0);
}

TEST_F(SidpOrchestrator, RefusesAWorkerWhoseGroupSizeDisagrees) {
  start_orchestrator();
  auto rec0 = std::make_shared<Record>();
  auto rec1 = std::make_shared<Record>();
  caf::actor w0 = peer(rec0);
  caf::actor w1 = peer(rec1);
  auto client = Client::local(*sys_, relay_, key_);
  say(w0, hello(0));
  ASSERT_TRUE(eventually([&] { return find_actor(*client, "t/cpu:0").has_value(); }));  // it made the group
  messages::WorkerHello bad = hello(1);
  bad.sidp_ranks = 3;
  say(w1, bad);
  ASSERT_TRUE(eventually([&] {
    std::lock_guard<std::mutex> lock(rec1->mu);
    return rec1->shutdowns == 1;
  }));
  EXPECT_FALSE(find_actor(*client, "t/cpu:1")) << "a refused worker is not registered";
  EXPECT_TRUE(rec0->got().empty());
  std::lock_guard<std::mutex> lock(rec0->mu);
  EXPECT_EQ(rec0->shutdowns, 0);
}

TEST_F(SidpOrchestrator, ListsAndKillsALayerOwner) {
  start_orchestrator();
  auto client = Client::local(*sys_, relay_, key_);
  auto rec = std::make_shared<Record>();
  caf::actor owner = peer(rec);
  messages::LayerOwnerHello h{"t/cpu:1/owner", "t", "t/sidp", 1, {1, 3}, 3u << 20, true, 1};
  say(owner, h);
  std::optional<messages::ActorInfo> a;
  ASSERT_TRUE(eventually([&] { return (a = find_actor(*client, "t/cpu:1/owner")).has_value(); }));
  EXPECT_EQ(a->kind, "owner");
  EXPECT_EQ(a->node, "t");
  EXPECT_EQ(a->state, "running restarts=0");
  EXPECT_EQ(a->parallel, "");
  EXPECT_EQ(a->detail, "group t/sidp rank 1, layers 1,3, 3.0 MiB, loaded");
  say(owner, h);  // its periodic hello: the same incarnation
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(find_actor(*client, "t/cpu:1/owner")->state, "running restarts=0");

  ASSERT_TRUE(client->call<messages::Ack>(messages::KillActor{"t/cpu:1/owner"}).ok());
  ASSERT_TRUE(eventually([&] {
    std::lock_guard<std::mutex> lock(rec->mu);
    return rec->exit.has_value();
  }));
  {
    std::lock_guard<std::mutex> lock(rec->mu);
    EXPECT_EQ(*rec->exit, caf::make_error(caf::exit_reason::kill));
  }
  ASSERT_TRUE(eventually([&] { return find_actor(*client, "t/cpu:1/owner")->state == "down restarts=0"; }));
  auto again = client->call<messages::Ack>(messages::KillActor{"t/cpu:1/owner"});
  EXPECT_FALSE(again.ok()) << "a down owner cannot be killed";

  // Its respawned incarnation says hello: registered again, one restart.
  caf::actor respawned = peer(std::make_shared<Record>());
  h.loads = 2;
  say(respawned, h);
  ASSERT_TRUE(eventually([&] { return find_actor(*client, "t/cpu:1/owner")->state == "running restarts=1"; }));
  EXPECT_EQ(find_actor(*client, "t/cpu:1/owner")->detail, "group t/sidp rank 1, layers 1,3, 3.0 MiB, loaded (2 loads)");
}

}  // namespace
}  // namespace shardline::actors
