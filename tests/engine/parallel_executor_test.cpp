// Engine groups: a dead rank is reported within the timeout (no hang), the
// pipelined engine keeps up to pp micro-batches in flight and aborts
// requests in flight when they land, and Token Throttling gives the same
// greedy tokens as the fixed budget.
#include "engine/group/parallel_executor.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "engine/group/engine_builder.hpp"
#include "engine/policies/token_budget_policies.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline::engine {
namespace engine_parallel_executor_test {

using Clock = std::chrono::steady_clock;

EngineOptions stories(ParallelConfig pc) {
  EngineOptions o;
  o.model_dir = testing_support::kStoriesDir;
  o.kv_cache_bytes = 8u << 20;
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = 64;
  o.parallel = pc;
  o.check_integrity = true;
  return o;
}

/// A one-sequence step at position 0..n-1 in block 0.
model::StepInput simple_step(int n) {
  model::StepInput in;
  in.block_size = 16;
  in.seqs.push_back({1, 0, n, true, {0}});
  for (int i = 0; i < n; ++i) {
    in.token_ids.push_back(1 + i);
    in.positions.push_back(i);
    in.slot_mapping.push_back(i);
  }
  in.logits_rows = {n - 1};
  return in;
}

TEST(ParallelExecutor, DeadPeerFailsTheStepWithinTheTimeout) {
  for (ParallelConfig pc : {ParallelConfig{2, 1, 1, 1}, ParallelConfig{1, 2, 1, 1}, ParallelConfig{1, 1, 2, 1}}) {
    SCOPED_TRACE(pc.to_string());
    Result<EngineInstance> e = build_engine(stories(pc));
    ASSERT_TRUE(e.ok()) << e.error().to_string();
    ParallelExecutor& exec = e.value().executor_as<InProcEngineGroup>()->executor();
    ASSERT_TRUE(exec.execute(simple_step(5)).ok());  // healthy first
    ASSERT_TRUE(e.value().executor_as<InProcEngineGroup>()->kill_rank(1).ok());
    const auto t0 = Clock::now();
    Result<model::StepOutput> r = exec.execute(simple_step(5));
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, ErrorCode::io) << r.error().to_string();
    EXPECT_LT(s, 5.0) << "a dead peer must not hang the group";
  }
}

TEST(ParallelExecutor, AtMostPpMicroBatchesInFlightCollectedInOrder) {
  Result<EngineInstance> e = build_engine(stories({1, 2, 1, 1}));
  ASSERT_TRUE(e.ok());
  ParallelExecutor& exec = e.value().executor_as<InProcEngineGroup>()->executor();
  ASSERT_TRUE(exec.submit(simple_step(3)).ok());
  ASSERT_TRUE(exec.submit(simple_step(3)).ok());
  Status third = exec.submit(simple_step(3));  // pp = 2 in flight at most
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.error().code, ErrorCode::invalid_argument);
  EXPECT_TRUE(exec.collect().ok());
  EXPECT_TRUE(exec.collect().ok());
  EXPECT_FALSE(exec.collect().ok());  // nothing in flight
}

TEST(ParallelExecutor, RejectsABadStepBeforeSendingIt) {
  Result<EngineInstance> e = build_engine(stories({2, 1, 1, 1}));
  ASSERT_TRUE(e.ok());
  ParallelExecutor& exec = e.value().executor_as<InProcEngineGroup>()->executor();
  model::StepInput bad = simple_step(3);
  bad.token_ids[1] = 1 << 20;
  Result<model::StepOutput> r = exec.execute(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
  EXPECT_TRUE(exec.execute(simple_step(3)).ok()) << "the group still works after a rejected step";
  EXPECT_TRUE(e.value().executor_as<InProcEngineGroup>()->rank_status(1).ok());
}

TEST(PipelinedEngine, ThrottleAndFixedBudgetsGiveTheReferenceTokensWithMicroBatchesInFlight) {
  const auto cases = testing_support::load_stories_reference();
  for (const char* policy : {"fixed", "throttle"}) {
    SCOPED_TRACE(policy);
    EngineOptions o = stories({1, 2, 1, 1});
    o.token_budget = std::shared_ptr<const TokenBudgetPolicy>(
        engine::make_token_budget_policy(policy, o.max_num_batched_tokens).value());
    Result<EngineInstance> e = build_engine(o);
    ASSERT_TRUE(e.ok());
    LlmEngine& eng = *e.value().engine;
    sampling::SamplingParams greedy;
    greedy.temperature = 0;
    greedy.max_tokens = 48;
    for (std::size_t i = 0; i < cases.size(); ++i) ASSERT_TRUE(eng.add_request(i, cases[i].prompt_ids, greedy).ok());
    sampling::SamplingParams filler = greedy;
    filler.max_tokens = 40;
    filler.ignore_eos = true;
    ASSERT_TRUE(eng.add_request(100, cases[0].prompt_ids, filler).ok());  // aborted in flight below
    std::vector<RequestOutput> done;
    bool aborted = false;
    int max_batch = 0;
    while (eng.has_unfinished()) {
      auto r = eng.step();
      ASSERT_TRUE(r.ok()) << r.error().to_string();
      for (auto& x : r.value()) done.push_back(std::move(x));
      const StepStats& s = eng.step_stats().back();
      max_batch = std::max(max_batch, s.num_decode_tokens);
      if (!aborted && eng.step_stats().size() == 6) {
        EXPECT_TRUE(eng.abort_request(100));
        aborted = true;
      }
    }
    ASSERT_EQ(done.size(), cases.size() + 1);
    for (const RequestOutput& x : done) {
      if (x.request_id == 100) {
        EXPECT_EQ(x.finish_reason, FinishReason::abort);
        EXPECT_LT(x.token_ids.size(), 40u);
        continue;
      }
      EXPECT_EQ(x.token_ids, cases[x.request_id].generated_ids) << "request " << x.request_id;
    }
    if (std::string(policy) == "throttle") {
      EXPECT_LE(max_batch, 2) << "#D = ceil(4 / 2) decodes per micro-batch";
    }
  }
}

}  // namespace
}  // namespace shardline::engine

namespace shardline::engine {
namespace engine_parallel_executor_test {

// An emulated interconnect for an in-process group (make_inproc_group_comms
// with a link): every communicator of every rank is paced on its members'
// device ports, collectives included; a link of another size is refused.
TEST(InProcGroupLink, EveryCommunicatorIsPacedOnItsDevicesPorts) {
  const ParallelConfig pc{2, 2, 1, 1};  // tp=2, pp=2: TP groups {0,1} and {2,3}
  const ParallelConfig cd{4, 1, 1, 1};
  auto link = comm::LinkModel::create(4, comm::LinkSpec{0.1, 0}).value();
  auto comms = make_inproc_group_comms(pc, false, &cd, link);
  ASSERT_TRUE(comms.ok()) << comms.error().to_string();
  for (const GroupComms& rc : comms->ranks) {
    for (const comm::Communicator* c : {rc.world.get(), rc.tp.get(), rc.decode_tp.get()})
      EXPECT_NE(dynamic_cast<const comm::PacedCommunicator*>(c), nullptr);
  }
  // The stage-1 TP group (devices 2 and 3) all-reduces over the link.
  std::vector<std::thread> threads;
  for (const int r : {2, 3})
    threads.emplace_back([&, r] {
      auto* tp = dynamic_cast<comm::PacedCommunicator*>(comms->ranks[static_cast<std::size_t>(r)].tp.get());
      std::vector<float> v(1000, 1.0f);
      ASSERT_TRUE(tp->all_reduce_sum(v.data(), v.size()).ok());
      EXPECT_EQ(v[0], 2.0f);
      EXPECT_EQ(tp->paced_bytes(), 4000u);  // 2 (w-1)/w * 1000 floats
    });
  for (auto& t : threads) t.join();

  auto wrong = make_inproc_group_comms(pc, false, nullptr, comm::LinkModel::create(2, comm::LinkSpec{1, 0}).value());
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(wrong.error().message.find("a link model of 2 devices for 4 ranks"), std::string::npos)
      << wrong.error().message;
  // Unpaced without a link.
  auto plain = make_inproc_group_comms(pc);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(dynamic_cast<const comm::PacedCommunicator*>(plain->ranks[0].tp.get()), nullptr);
}

}  // namespace
}  // namespace shardline::engine
