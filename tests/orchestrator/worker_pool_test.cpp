// orchestrator::WorkerPool over a real JobManager in a temp dir: hello
// (accepted, refused for a wrong group shape, replaced), in-flight counts as
// lines go out and results come back, queue room, heartbeat timeouts on an
// injected clock, requeue of a dead worker's lines, the cluster's group
// count; after a restart of the orchestrator: held lines claimed by a hello,
// dispatch held until the known workers are back, hello again of the same
// instance, asking unknown workers to say hello, a stalled orchestrator.
#include "orchestrator/worker_pool.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "orchestrator/job_admission.hpp"
#include "tests/orchestrator/temp_dir.hpp"

namespace shardline::orchestrator {
namespace orchestrator_worker_pool_test {

using engine::ParallelConfig;
using testing::TempDir;
using testing::write_file;
using worker::BatchRequest;
using worker::BatchResult;
using worker::LineRef;
using Clock = WorkerPool::Clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

BatchResult result_for(const BatchRequest& r) {
  BatchResult out;
  out.job_id = r.job_id;
  out.line_index = r.line_index;
  out.custom_id = r.custom_id;
  out.ok = true;
  out.choices.push_back(worker::BatchChoice{0, " done", "length", {}});
  out.prompt_tokens = 1;
  out.completion_tokens = 1;
  return out;
}

std::vector<BatchResult> results_for(const std::vector<BatchRequest>& work) {
  std::vector<BatchResult> out;
  for (const auto& r : work) out.push_back(result_for(r));
  return out;
}

std::set<std::uint64_t> lines_of(const std::vector<BatchRequest>& work) {
  std::set<std::uint64_t> out;
  for (const auto& r : work) out.insert(r.line_index);
  return out;
}

/// A JobManager over a temp dir with one job of `lines` good lines, and a
/// pool on node0 whose workers run single-device groups, dp = `dp`.
class WorkerPoolTest : public ::testing::Test {
 protected:
  void SetUp() override { open(20, 1); }

  void open(int lines, int dp, double heartbeat_timeout_s = 30.0) {
    pool_.reset();
    jobs_.reset();
    std::string text;
    for (int i = 0; i < lines; ++i) text += "{\"prompt\":\"p" + std::to_string(i) + "\",\"max_tokens\":1}\n";
    write_file(tmp_.file("in.jsonl"), text);
    auto m = JobManager::open(tmp_.file("state-" + std::to_string(++opened_)));
    ASSERT_TRUE(m.ok()) << m.error().to_string();
    jobs_ = std::move(m).value();
    JobSpec spec;
    spec.model_dir = "/models/m";
    spec.input_paths = {tmp_.file("in.jsonl")};
    spec.output_path = tmp_.file("out-" + std::to_string(opened_) + ".jsonl");
    auto id = jobs_->submit(spec);
    ASSERT_TRUE(id.ok()) << id.error().to_string();
    job_id_ = *id;
    ParallelConfig pc;
    pc.dp = dp;
    pool_ = std::make_unique<WorkerPool>(*jobs_, WorkerPoolOptions{"node0", pc, heartbeat_timeout_s});
  }

  /// The orchestrator restarts: the JobManager is opened again on the same
  /// data dir (every uncommitted line pending) under a new, empty pool.
  void restart(double heartbeat_timeout_s = 30.0) {
    pool_.reset();
    jobs_.reset();
    auto m = JobManager::open(tmp_.file("state-" + std::to_string(opened_)));
    ASSERT_TRUE(m.ok()) << m.error().to_string();
    jobs_ = std::move(m).value();
    pool_ = std::make_unique<WorkerPool>(*jobs_, WorkerPoolOptions{"node0", ParallelConfig{1, 1, 1, 2},
                                                                   heartbeat_timeout_s, 1.0});
  }

  /// The lines each worker got from one dispatch, by worker.
  std::map<std::string, std::vector<BatchRequest>> dispatch() {
    std::map<std::string, std::vector<BatchRequest>> out;
    for (auto& a : pool_->dispatch()) {
      EXPECT_EQ(out.count(a.worker), 0u) << a.worker << " got two assignments in one dispatch";
      out[a.worker] = std::move(a.work);
    }
    return out;
  }

  void hello(const std::string& name, std::uint32_t max_batch, Clock::time_point now = Clock::time_point{}) {
    auto h = pool_->hello(name, max_batch, ParallelConfig{}, now);
    ASSERT_TRUE(h.ok()) << h.error().to_string();
    ASSERT_FALSE(h->replaced);
  }

  JobProgress progress() const { return *jobs_->progress(job_id_); }

  TempDir tmp_;
  int opened_ = 0;
  std::unique_ptr<JobManager> jobs_;
  std::unique_ptr<WorkerPool> pool_;
  std::uint64_t job_id_ = 0;
};

TEST_F(WorkerPoolTest, HelloRegistersTheWorkerAsStarting) {
  const Clock::time_point t0 = Clock::time_point{} + seconds(5);
  auto h = pool_->hello("node0/cpu:0", 4, ParallelConfig{}, t0);
  ASSERT_TRUE(h.ok()) << h.error().to_string();
  EXPECT_FALSE(h->replaced);
  EXPECT_EQ(h->requeued, 0u);
  ASSERT_TRUE(pool_->contains("node0/cpu:0"));
  EXPECT_EQ(pool_->size(), 1u);
  const WorkerPool::Worker* w = pool_->find("node0/cpu:0");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->max_batch, 4u);
  EXPECT_EQ(w->in_flight, 0u);
  EXPECT_EQ(w->last_seen, t0);
  EXPECT_FALSE(w->load.has_value());
  const auto list = pool_->list();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].name, "node0/cpu:0");
  EXPECT_EQ(list[0].node, "node0");
  EXPECT_EQ(list[0].state, "starting");
  EXPECT_EQ(list[0].group, "tp=1,pp=1,sp=1");
  // A batch of 0 counts as 1.
  hello("node0/cpu:1", 0);
  EXPECT_EQ(pool_->find("node0/cpu:1")->max_batch, 1u);
  EXPECT_EQ(pool_->room("node0/cpu:1"), 2u);
}

TEST_F(WorkerPoolTest, HelloOfAnotherGroupShapeIsRefusedAndChangesNothing) {
  hello("node1/cpu:0", 2);
  ASSERT_EQ(dispatch()["node1/cpu:0"].size(), 4u);
  auto h = pool_->hello("node1/cpu:0", 2, ParallelConfig{2, 1, 1, 1}, Clock::time_point{} + seconds(1));
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(h.error().message, check_worker_group("node1/cpu:0", ParallelConfig{2, 1, 1, 1}, ParallelConfig{})
                                   .error()
                                   .message);
  // The registered instance keeps its lines and its registration.
  const WorkerPool::Worker* w = pool_->find("node1/cpu:0");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->in_flight, 4u);
  EXPECT_EQ(w->last_seen, Clock::time_point{});
  EXPECT_EQ(w->parallel, ParallelConfig{});
  EXPECT_EQ(progress().in_flight, 4u);
  auto other = pool_->hello("node2/cpu:0-1", 2, ParallelConfig{2, 1, 1, 1}, Clock::time_point{});
  ASSERT_FALSE(other.ok());
  EXPECT_FALSE(pool_->contains("node2/cpu:0-1"));
  EXPECT_EQ(pool_->num_groups(), 2);
}

TEST_F(WorkerPoolTest, SecondHelloOfTheSameNameReplacesTheFirstAndRequeuesItsLines) {
  hello("node0/cpu:0", 3);
  const auto first = dispatch()["node0/cpu:0"];
  ASSERT_EQ(first.size(), 6u);
  EXPECT_EQ(progress().in_flight, 6u);

  const Clock::time_point t1 = Clock::time_point{} + seconds(9);
  auto h = pool_->hello("node0/cpu:0", 1, ParallelConfig{}, t1);
  ASSERT_TRUE(h.ok()) << h.error().to_string();
  EXPECT_TRUE(h->replaced);
  EXPECT_EQ(h->requeued, 6u);
  EXPECT_EQ(pool_->size(), 1u);
  const WorkerPool::Worker* w = pool_->find("node0/cpu:0");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->max_batch, 1u);  // the new instance's
  EXPECT_EQ(w->in_flight, 0u);
  EXPECT_EQ(w->last_seen, t1);
  EXPECT_EQ(progress().in_flight, 0u);
  EXPECT_EQ(progress().pending, 20u);
  // The requeued lines come first, to the new instance (room 2).
  const auto again = dispatch()["node0/cpu:0"];
  ASSERT_EQ(again.size(), 2u);
  for (const auto& r : again) EXPECT_TRUE(lines_of(first).count(r.line_index)) << r.line_index;
}

TEST_F(WorkerPoolTest, InFlightCountsLinesOutAndResultsBack) {
  hello("node0/cpu:0", 2);
  auto got = dispatch()["node0/cpu:0"];
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(pool_->find("node0/cpu:0")->in_flight, 4u);
  EXPECT_EQ(progress().in_flight, 4u);

  // Three results back: in flight 1, and the three lines are committed.
  const Clock::time_point t1 = Clock::time_point{} + seconds(3);
  auto n = pool_->on_results("node0/cpu:0", results_for({got.begin(), got.begin() + 3}), t1);
  ASSERT_TRUE(n.ok()) << n.error().to_string();
  EXPECT_EQ(*n, 3u);
  EXPECT_EQ(pool_->find("node0/cpu:0")->in_flight, 1u);
  EXPECT_EQ(pool_->find("node0/cpu:0")->last_seen, t1);
  EXPECT_EQ(progress().done, 3u);
  EXPECT_EQ(progress().in_flight, 1u);

  // The next dispatch refills exactly the room that came back.
  auto more = dispatch()["node0/cpu:0"];
  EXPECT_EQ(more.size(), 3u);
  EXPECT_EQ(pool_->find("node0/cpu:0")->in_flight, 4u);

  // More results than in flight (duplicates of a retried worker) never go below 0.
  std::vector<BatchResult> all = results_for(got);
  for (const auto& r : results_for(more)) all.push_back(r);
  all.push_back(result_for(got[0]));
  n = pool_->on_results("node0/cpu:0", all, t1);
  ASSERT_TRUE(n.ok()) << n.error().to_string();
  EXPECT_EQ(*n, 4u);  // the fourth line of `got` and the three of `more`
  EXPECT_EQ(pool_->find("node0/cpu:0")->in_flight, 0u);
  EXPECT_EQ(progress().done, 7u);

  // Results of a worker the pool does not know are committed all the same.
  hello("node0/cpu:1", 1);
  auto late = dispatch();
  ASSERT_EQ(late.size(), 2u);
  n = pool_->on_results("node9/cpu:0", results_for(late["node0/cpu:1"]), t1);
  ASSERT_TRUE(n.ok()) << n.error().to_string();
  EXPECT_EQ(*n, 2u);
  EXPECT_EQ(pool_->find("node0/cpu:1")->in_flight, 2u);  // not its results as far as the pool knows
  EXPECT_FALSE(pool_->contains("node9/cpu:0"));
}

TEST_F(WorkerPoolTest, QueueRoomIsTwiceTheBatchDealtInNameOrderUntilNothingIsPending) {
  EXPECT_EQ(WorkerPool::queue_capacity(1), 2u);
  EXPECT_EQ(WorkerPool::queue_capacity(64), 128u);
  EXPECT_EQ(pool_->room("node0/cpu:9"), 0u);  // unknown
  hello("node0/cpu:1", 3);
  hello("node0/cpu:0", 4);
  EXPECT_EQ(pool_->room("node0/cpu:0"), 8u);
  EXPECT_EQ(pool_->room("node0/cpu:1"), 6u);

  // One line per worker per round, in name order, until both are full.
  auto first = pool_->dispatch();
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(first[0].worker, "node0/cpu:0");  // name order
  EXPECT_EQ(first[1].worker, "node0/cpu:1");
  auto lines = [](const std::vector<BatchRequest>& work) {
    std::vector<std::uint64_t> out;
    for (const auto& r : work) out.push_back(r.line_index);
    return out;
  };
  EXPECT_EQ(lines(first[0].work), (std::vector<std::uint64_t>{0, 2, 4, 6, 8, 10, 12, 13}));
  EXPECT_EQ(lines(first[1].work), (std::vector<std::uint64_t>{1, 3, 5, 7, 9, 11}));
  EXPECT_EQ(pool_->room("node0/cpu:0"), 0u);
  EXPECT_EQ(pool_->room("node0/cpu:1"), 0u);
  EXPECT_TRUE(pool_->dispatch().empty());  // both full

  // Room for 5 on cpu:0 and 2 on cpu:1, 6 lines left: dealt 14 15 16 17 18,
  // then cpu:1 is full and cpu:0 takes the last one.
  ASSERT_TRUE(pool_->on_results("node0/cpu:0", results_for({first[0].work.begin(), first[0].work.begin() + 5}),
                                Clock::time_point{})
                  .ok());
  ASSERT_TRUE(pool_->on_results("node0/cpu:1", results_for({first[1].work.begin(), first[1].work.begin() + 2}),
                                Clock::time_point{})
                  .ok());
  auto second = dispatch();
  EXPECT_EQ(lines(second["node0/cpu:0"]), (std::vector<std::uint64_t>{14, 16, 18, 19}));
  EXPECT_EQ(lines(second["node0/cpu:1"]), (std::vector<std::uint64_t>{15, 17}));
  EXPECT_EQ(pool_->room("node0/cpu:0"), 1u);
  EXPECT_EQ(progress().pending, 0u);
  EXPECT_TRUE(pool_->dispatch().empty());  // nothing pending: room stays
  EXPECT_EQ(pool_->room("node0/cpu:0"), 1u);
}

TEST_F(WorkerPoolTest, HeartbeatTimeoutOnTheInjectedClock) {
  open(20, 1, /*heartbeat_timeout_s=*/10.0);
  const Clock::time_point t0 = Clock::time_point{} + seconds(100);
  hello("node0/cpu:0", 1, t0);
  hello("node0/cpu:1", 1, t0);
  hello("node0/cpu:2", 1, t0);
  EXPECT_TRUE(pool_->silent_workers(t0).empty());
  EXPECT_TRUE(pool_->silent_workers(t0 + seconds(10)).empty());  // exactly the timeout: not yet
  EXPECT_EQ(pool_->silent_workers(t0 + seconds(10) + milliseconds(1)),
            (std::vector<std::string>{"node0/cpu:0", "node0/cpu:1", "node0/cpu:2"}));

  // A heartbeat and results each count as a sign of life.
  const auto work = dispatch();
  pool_->heartbeat("node0/cpu:1", WorkerLoad{"busy", 3, 1, 5, 10}, t0 + seconds(8));
  ASSERT_TRUE(pool_->on_results("node0/cpu:2", results_for(work.at("node0/cpu:2")), t0 + seconds(6)).ok());
  EXPECT_EQ(pool_->silent_workers(t0 + seconds(15)), (std::vector<std::string>{"node0/cpu:0"}));
  EXPECT_EQ(pool_->silent_workers(t0 + seconds(17)), (std::vector<std::string>{"node0/cpu:0", "node0/cpu:2"}));
  EXPECT_EQ(pool_->silent_workers(t0 + seconds(19)),
            (std::vector<std::string>{"node0/cpu:0", "node0/cpu:1", "node0/cpu:2"}));
  pool_->heartbeat("node9/cpu:0", WorkerLoad{}, t0 + seconds(19));  // unknown: ignored
  EXPECT_FALSE(pool_->contains("node9/cpu:0"));
  EXPECT_EQ(pool_->size(), 3u);  // silent workers stay until removed

  // The heartbeat's load is what `actor list` shows; none is "starting" again.
  auto list = pool_->list();
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[0].state, "starting");
  EXPECT_EQ(list[1].state, "busy running=3 waiting=1 kv=5/10");
  pool_->heartbeat("node0/cpu:1", std::nullopt, t0 + seconds(20));
  EXPECT_EQ(pool_->list()[1].state, "starting");
}

TEST_F(WorkerPoolTest, RemovingADeadWorkerRequeuesItsLinesFirstInLine) {
  hello("node0/cpu:0", 2);
  hello("node0/cpu:1", 2);
  auto first = dispatch();
  const auto dead_lines = lines_of(first.at("node0/cpu:0"));
  ASSERT_EQ(dead_lines.size(), 4u);
  ASSERT_EQ(first.at("node0/cpu:1").size(), 4u);
  EXPECT_EQ(progress().in_flight, 8u);

  const std::optional<std::size_t> n = pool_->remove("node0/cpu:0");
  ASSERT_TRUE(n.has_value());
  EXPECT_EQ(*n, 4u);
  EXPECT_FALSE(pool_->contains("node0/cpu:0"));
  EXPECT_EQ(progress().in_flight, 4u);
  EXPECT_EQ(progress().pending, 16u);
  EXPECT_FALSE(pool_->remove("node0/cpu:0").has_value());  // gone already
  EXPECT_FALSE(pool_->remove("nobody").has_value());

  // The survivor gets the dead worker's lines before any new line.
  ASSERT_TRUE(pool_->on_results("node0/cpu:1", results_for(first.at("node0/cpu:1")), Clock::time_point{}).ok());
  auto second = dispatch();
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(lines_of(second.at("node0/cpu:1")), dead_lines);

  // Run the job to the end with the survivor alone: every line once.
  for (int guard = 0; guard < 100; ++guard) {
    ASSERT_TRUE(pool_->on_results("node0/cpu:1", results_for(second["node0/cpu:1"]), Clock::time_point{}).ok());
    second = dispatch();
    if (second.empty()) break;
  }
  EXPECT_EQ(progress().state, JobState::done);
  EXPECT_EQ(progress().done, 20u);
  EXPECT_EQ(pool_->find("node0/cpu:1")->in_flight, 0u);
}

TEST_F(WorkerPoolTest, GroupsAreThisNodesDpPlusJoinedNodesWorkers) {
  open(20, 2);
  EXPECT_EQ(pool_->num_groups(), 2);  // this node's groups count before they say hello
  EXPECT_EQ(pool_->cluster_config(), (ParallelConfig{1, 1, 1, 2}));
  hello("node0/cpu:0", 1);
  hello("node0/cpu:1", 1);
  EXPECT_EQ(pool_->num_groups(), 2);
  hello("node1/cpu:0", 1);
  hello("node2/cpu:3", 1);
  EXPECT_EQ(pool_->num_groups(), 4);
  EXPECT_EQ(pool_->cluster_config(), (ParallelConfig{1, 1, 1, 4}));
  ASSERT_TRUE(pool_->remove("node1/cpu:0").has_value());
  EXPECT_EQ(pool_->num_groups(), 3);
  ASSERT_TRUE(pool_->remove("node0/cpu:0").has_value());
  EXPECT_EQ(pool_->num_groups(), 3);  // a local group is still configured
  EXPECT_EQ(node_of("node1/cpu:0-1"), "node1");
  EXPECT_EQ(node_of("solo"), "solo");
}

std::vector<LineRef> refs_of(const std::vector<BatchRequest>& work) {
  std::vector<LineRef> out;
  for (const auto& r : work) out.push_back(LineRef{r.job_id, r.line_index});
  return out;
}

TEST_F(WorkerPoolTest, AfterARestartHeldLinesAreClaimedAndDispatchWaitsForTheKnownWorkers) {
  open(40, 2);
  hello("node0/cpu:0", 4);
  hello("node0/cpu:1", 4);
  auto before = dispatch();
  const auto held0 = before.at("node0/cpu:0");
  auto held1 = before.at("node0/cpu:1");
  ASSERT_EQ(held0.size(), 8u);
  ASSERT_EQ(held1.size(), 8u);
  // cpu:1 finished two before the orchestrator died.
  ASSERT_TRUE(pool_->on_results("node0/cpu:1", results_for({held1.begin(), held1.begin() + 2}), {}).ok());
  held1.erase(held1.begin(), held1.begin() + 2);

  restart();
  const Clock::time_point t0 = Clock::time_point{} + seconds(50);
  pool_->await_workers({"node0/cpu:0", "node0/cpu:1"}, t0 + seconds(3));
  EXPECT_TRUE(pool_->holding());
  EXPECT_TRUE(pool_->dispatch().empty());  // 38 lines pending, but two workers may hold some

  HelloInfo info;
  info.max_batch = 4;
  info.held = refs_of(held0);
  info.instance = "actor-0";
  auto h0 = pool_->hello("node0/cpu:0", info, t0 + seconds(1));
  ASSERT_TRUE(h0.ok()) << h0.error().to_string();
  EXPECT_FALSE(h0->replaced);
  EXPECT_EQ(h0->claimed, held0.size());
  EXPECT_FALSE(h0->hold_ended);
  EXPECT_EQ(pool_->find("node0/cpu:0")->in_flight, held0.size());
  EXPECT_TRUE(pool_->holding());
  EXPECT_TRUE(pool_->dispatch().empty());
  EXPECT_TRUE(pool_->end_hold_if_due(t0 + seconds(2)).empty());  // before the deadline

  info.held = refs_of(held1);
  info.instance = "actor-1";
  auto h1 = pool_->hello("node0/cpu:1", info, t0 + seconds(2));
  ASSERT_TRUE(h1.ok());
  EXPECT_EQ(h1->claimed, held1.size());
  EXPECT_TRUE(h1->hold_ended);
  EXPECT_FALSE(pool_->holding());

  // Now the rest goes out, and nothing either worker holds.
  std::set<std::uint64_t> held = lines_of(held0);
  for (auto l : lines_of(held1)) held.insert(l);
  auto after = dispatch();
  EXPECT_EQ(after.count("node0/cpu:0"), 0u);  // its queue is full of what it holds
  ASSERT_EQ(after.at("node0/cpu:1").size(), 8 - held1.size());
  for (const auto& r : after.at("node0/cpu:1")) EXPECT_EQ(held.count(r.line_index), 0u) << r.line_index;
  EXPECT_EQ(progress().in_flight, 16u);

  // The held lines' results count them off as usual.
  ASSERT_TRUE(pool_->on_results("node0/cpu:1", results_for(held1), t0 + seconds(3)).ok());
  EXPECT_EQ(pool_->find("node0/cpu:1")->in_flight, 2u);
}

TEST_F(WorkerPoolTest, TheHoldEndsAtItsDeadlineWithTheMissingWorkersNamed) {
  open(10, 2);
  const Clock::time_point t0 = Clock::time_point{} + seconds(5);
  hello("node0/cpu:0", 1, t0);
  // Registered names count as back; an empty list holds nothing.
  pool_->await_workers({"node0/cpu:0"}, t0 + seconds(3));
  EXPECT_FALSE(pool_->holding());
  pool_->await_workers({}, t0 + seconds(3));
  EXPECT_FALSE(pool_->holding());
  pool_->await_workers({"node0/cpu:0", "node0/cpu:1", "node1/cpu:0"}, t0 + seconds(3));
  EXPECT_TRUE(pool_->holding());
  EXPECT_TRUE(pool_->dispatch().empty());
  EXPECT_TRUE(pool_->end_hold_if_due(t0 + seconds(3) - milliseconds(1)).empty());
  EXPECT_EQ(pool_->end_hold_if_due(t0 + seconds(3)), (std::vector<std::string>{"node0/cpu:1", "node1/cpu:0"}));
  EXPECT_FALSE(pool_->holding());
  EXPECT_EQ(dispatch().at("node0/cpu:0").size(), 2u);
  EXPECT_TRUE(pool_->end_hold_if_due(t0 + seconds(9)).empty());
}

TEST_F(WorkerPoolTest, AFreshStartOverUnfinishedWorkHoldsUntilItsDeadlineWhoeverSaysHello) {
  // The orchestrator's node restarted after a crash: the workers of other
  // nodes are unknown to this process, so no hello can end the hold early.
  open(10, 2);
  const Clock::time_point t0 = Clock::time_point{} + seconds(5);
  pool_->await_unknown_workers(t0 + seconds(3));
  EXPECT_TRUE(pool_->holding());
  HelloInfo info;
  info.max_batch = 2;
  info.instance = "actor-0";
  auto h = pool_->hello("node1/cpu:0", info, t0 + seconds(1));
  ASSERT_TRUE(h.ok());
  EXPECT_FALSE(h->hold_ended);
  EXPECT_TRUE(pool_->holding());
  EXPECT_TRUE(pool_->dispatch().empty());
  // Awaiting named workers too: their return does not end it either.
  pool_->await_workers({"node1/cpu:1"}, t0 + seconds(2));
  auto h1 = pool_->hello("node1/cpu:1", info, t0 + seconds(1));
  ASSERT_TRUE(h1.ok());
  EXPECT_FALSE(h1->hold_ended);
  EXPECT_TRUE(pool_->dispatch().empty());
  EXPECT_TRUE(pool_->end_hold_if_due(t0 + seconds(3) - milliseconds(1)).empty());
  EXPECT_TRUE(pool_->holding());
  EXPECT_TRUE(pool_->end_hold_if_due(t0 + seconds(3)).empty());  // no named worker is missing
  EXPECT_FALSE(pool_->holding());
  const auto after = dispatch();
  EXPECT_EQ(after.at("node1/cpu:0").size(), 4u);
  EXPECT_EQ(after.at("node1/cpu:1").size(), 4u);
}

TEST_F(WorkerPoolTest, AHelloFromTheRegisteredInstanceKeepsItsLines) {
  HelloInfo info;
  info.max_batch = 2;
  info.instance = "actor-7";
  ASSERT_TRUE(pool_->hello("node0/cpu:0", info, {}).ok());
  const auto got = dispatch().at("node0/cpu:0");
  ASSERT_EQ(got.size(), 4u);
  // The same instance again (asked twice to say hello): nothing requeued.
  info.held = refs_of(got);
  auto again = pool_->hello("node0/cpu:0", info, {});
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->again);
  EXPECT_FALSE(again->replaced);
  EXPECT_EQ(again->requeued, 0u);
  EXPECT_EQ(again->claimed, 4u);
  EXPECT_EQ(pool_->find("node0/cpu:0")->in_flight, 4u);
  EXPECT_EQ(progress().in_flight, 4u);
  // Another instance under the name (a restarted worker) replaces it.
  info.instance = "actor-8";
  info.held.clear();
  auto other = pool_->hello("node0/cpu:0", info, {});
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(other->replaced);
  EXPECT_EQ(other->requeued, 4u);
  EXPECT_EQ(pool_->find("node0/cpu:0")->in_flight, 0u);
  // No instance never matches.
  info.instance.clear();
  EXPECT_TRUE(pool_->hello("node0/cpu:0", info, {})->replaced);
  EXPECT_TRUE(pool_->hello("node0/cpu:0", info, {})->replaced);
}

TEST_F(WorkerPoolTest, UnknownWorkersAreAskedToSayHelloOncePerHeartbeatInterval) {
  restart();  // heartbeat interval 1 s
  const Clock::time_point t0 = Clock::time_point{} + seconds(5);
  EXPECT_TRUE(pool_->ask_hello("node1/cpu:0", t0));
  EXPECT_FALSE(pool_->ask_hello("node1/cpu:0", t0 + milliseconds(999)));
  EXPECT_TRUE(pool_->ask_hello("node0/cpu:0", t0 + milliseconds(999)));  // per worker
  EXPECT_TRUE(pool_->ask_hello("node1/cpu:0", t0 + seconds(1)));
  hello("node1/cpu:0", 1, t0 + seconds(2));
  EXPECT_FALSE(pool_->ask_hello("node1/cpu:0", t0 + seconds(10)));  // registered
  ASSERT_TRUE(pool_->remove("node1/cpu:0").has_value());
  EXPECT_TRUE(pool_->ask_hello("node1/cpu:0", t0 + seconds(10)));  // dropped, yet alive
}

TEST_F(WorkerPoolTest, AStalledOrchestratorExcusesTheSilenceItCausedItself) {
  restart(/*heartbeat_timeout_s=*/3.0);
  const Clock::time_point t0 = Clock::time_point{} + seconds(5);
  hello("node0/cpu:0", 1, t0);
  hello("node0/cpu:1", 1, t0 + seconds(2));
  EXPECT_EQ(pool_->silent_workers(t0 + seconds(4)), (std::vector<std::string>{"node0/cpu:0"}));
  pool_->excuse_silence(t0 + seconds(4));
  EXPECT_TRUE(pool_->silent_workers(t0 + seconds(7)).empty());
  EXPECT_EQ(pool_->silent_workers(t0 + seconds(7) + milliseconds(1)),
            (std::vector<std::string>{"node0/cpu:0", "node0/cpu:1"}));
  pool_->heartbeat("node0/cpu:1", std::nullopt, t0 + seconds(9));
  pool_->excuse_silence(t0 + seconds(8));  // never moves a clock back
  EXPECT_EQ(pool_->find("node0/cpu:1")->last_seen, t0 + seconds(9));
}

TEST(WorkerPoolGroups, ClusterConfigKeepsTheGroupShape) {
  TempDir tmp;
  auto jobs = JobManager::open(tmp.file("state"));
  ASSERT_TRUE(jobs.ok()) << jobs.error().to_string();
  WorkerPool pool(**jobs, WorkerPoolOptions{"a", ParallelConfig{2, 2, 1, 1}, 30.0});
  EXPECT_EQ(pool.cluster_config(), (ParallelConfig{2, 2, 1, 1}));
  auto h = pool.hello("b/cpu:0-3", 8, ParallelConfig{2, 2, 1, 1}, Clock::time_point{});
  ASSERT_TRUE(h.ok()) << h.error().to_string();
  EXPECT_EQ(pool.list().at(0).group, "tp=2,pp=2,sp=1");
  EXPECT_EQ(pool.cluster_config(), (ParallelConfig{2, 2, 1, 2}));
  EXPECT_TRUE(pool.dispatch().empty());  // no job: nothing to hand out
  EXPECT_EQ(pool.find("b/cpu:0-3")->in_flight, 0u);
}

}  // namespace
}  // namespace shardline::orchestrator
