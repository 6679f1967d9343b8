// A node's SiDP group as the worker actors drive it (engine/sidp/sidp_node.hpp,
// worker/sidp_stepper.hpp): each rank on its own thread attaches, builds its
// engine, joins a compute generation and steps with the stepper's hooks, as
// the worker actor does. Directives come from outside (the orchestrator's
// part), at any moment. The outputs are bit-identical (memcmp) to one device:
//  - WaS -> CaS -> WaS -> CaS directives mid-run (stories260K, dp = 2 and 3);
//  - a rank "crashes" (its SidpRank and engine are destroyed) and a new
//    incarnation of it joins: its peer keeps stepping in WaS meanwhile, a CaS
//    directive given while the rank is down waits, and is applied by the
//    whole rebuilt generation once the rank is back.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/data_parallel.hpp"
#include "engine/group/engine_builder.hpp"
#include "engine/sidp/sidp_node.hpp"
#include "tests/support/stories_reference.hpp"
#include "worker/sidp_stepper.hpp"

namespace shardline::worker {
namespace worker_sidp_stepper_golden_test {

using engine::EngineOptions;
using engine::RequestOutput;
using model::sidp::SidpMode;

EngineOptions stories_options() {
  EngineOptions o;
  o.model_dir = testing_support::kStoriesDir;
  o.weights = testing_support::stories_weights();
  o.block_size = 16;
  o.kv_cache_bytes = 8u << 20;
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = 7;  // chunked prefill: many steps
  o.capture_logits = true;
  o.check_integrity = true;
  o.num_threads = 1;
  return o;
}

sampling::SamplingParams greedy() {
  sampling::SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = 48;
  return p;
}

std::vector<RequestOutput> run_single(const std::vector<std::vector<std::int32_t>>& prompts,
                                      const std::vector<sampling::SamplingParams>& params) {
  auto e = engine::build_engine(stories_options());
  EXPECT_TRUE(e.ok()) << e.error().to_string();
  std::vector<engine::LlmEngine*> engines = {e->engine.get()};
  auto out = engine::generate_data_parallel(engines, prompts, params);
  EXPECT_TRUE(out.ok()) << out.error().to_string();
  return out.ok() ? std::move(out).value() : std::vector<RequestOutput>{};
}

void expect_bit_identical(const std::vector<RequestOutput>& got, const std::vector<RequestOutput>& ref) {
  ASSERT_EQ(got.size(), ref.size());
  for (std::size_t i = 0; i < ref.size(); ++i) {
    EXPECT_EQ(got[i].token_ids, ref[i].token_ids) << "request " << i;
    ASSERT_EQ(got[i].logits.size(), ref[i].logits.size()) << "request " << i;
    for (std::size_t s = 0; s < ref[i].logits.size(); ++s)
      ASSERT_EQ(0, std::memcmp(got[i].logits[s].data(), ref[i].logits[s].data(), ref[i].logits[s].size() * 4))
          << "request " << i << " step " << s << " not bit-identical";
  }
}

/// One rank's incarnation: its place in the group, its engine, its stepper.
struct Incarnation {
  engine::EngineInstance instance;
  std::unique_ptr<SidpStepper> stepper;
};

Incarnation start_rank(engine::SidpNodeGroup& group, int rank) {
  Incarnation inc;
  auto r = group.attach(rank);
  EXPECT_TRUE(r.ok()) << r.error().to_string();
  auto built = engine::build_engine((*r)->engine_options());
  EXPECT_TRUE(built.ok()) << built.error().to_string();
  inc.instance = std::move(built).value();
  EXPECT_TRUE((*r)->join().ok());
  inc.stepper = std::make_unique<SidpStepper>(std::move(r).value());
  return inc;
}

std::shared_ptr<engine::SidpNodeGroup> make_group(int dp) {
  engine::SidpOptions so;
  so.dp = dp;
  so.comm_timeout = std::chrono::milliseconds(20'000);
  auto g = engine::SidpNodeGroup::create(stories_options(), so);
  EXPECT_TRUE(g.ok()) << g.error().to_string();
  for (int r = 0; r < dp; ++r) EXPECT_TRUE((*g)->load_owner(r).ok());
  return *g;
}

/// Steps `inc` until every rank of the run has finished (the worker actor's
/// loop, without the mailbox). `on_step(steps)` runs after each real step.
/// Returns false on a step error.
template <class OnStep>
bool drive(Incarnation& inc, std::vector<RequestOutput>& outputs, std::atomic<int>& finished, int dp,
           OnStep on_step) {
  engine::LlmEngine& eng = *inc.instance.engine;
  bool counted = false;
  int steps = 0;
  while (true) {
    if (eng.has_unfinished()) {
      EXPECT_TRUE(inc.stepper->before_step().ok());
      auto out = eng.step();
      if (!out.ok()) {
        ADD_FAILURE() << "rank " << inc.stepper->rank().rank() << ": " << out.error().to_string();
        return false;
      }
      for (RequestOutput& o : *out) outputs[o.request_id] = std::move(o);
      if (Status st = inc.stepper->after_step(); !st) {
        ADD_FAILURE() << st.error().to_string();
        return false;
      }
      if (!on_step(++steps)) return true;  // the caller takes over (a crash)
      continue;
    }
    if (!counted) {
      counted = true;
      ++finished;
    }
    if (finished.load() == dp) return true;  // leaving kills the generation: peers blocked in it wake
    auto idle = inc.stepper->idle();
    if (!idle.ok()) {
      ADD_FAILURE() << idle.error().to_string();
      return false;
    }
    std::this_thread::sleep_for(idle->again ? idle->delay : std::chrono::milliseconds(1));
  }
}

TEST(SidpStepperGolden, DirectivesAtAnyMomentGiveBitIdenticalOutputs) {
  const auto prompts = testing_support::stories_prompt_ids();
  for (int dp : {2, 3}) {
    SCOPED_TRACE("dp=" + std::to_string(dp));
    // Rank 0's requests generate 48 tokens, the others' 12 (EOS ignored):
    // the others run out of work while rank 0 goes on in CaS, so they take
    // dummy turns.
    std::vector<sampling::SamplingParams> params(prompts.size(), greedy());
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      params[i].ignore_eos = true;
      if (i % static_cast<std::size_t>(dp) != 0) params[i].max_tokens = 12;
    }
    const auto ref = run_single(prompts, params);
    auto group = make_group(dp);
    std::vector<RequestOutput> outputs(prompts.size());
    std::vector<model::sidp::SidpFfnStats> stats(static_cast<std::size_t>(dp));
    std::atomic<int> finished{0};
    std::mutex mu;
    std::vector<SidpStepper*> steppers(static_cast<std::size_t>(dp), nullptr);
    std::atomic<int> started{0};
    std::vector<std::thread> threads;
    for (int r = 0; r < dp; ++r)
      threads.emplace_back([&, r] {
        Incarnation inc = start_rank(*group, r);
        {
          std::lock_guard lk(mu);
          steppers[static_cast<std::size_t>(r)] = inc.stepper.get();
        }
        ++started;
        while (started.load() < dp) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        for (std::size_t i = static_cast<std::size_t>(r); i < prompts.size(); i += static_cast<std::size_t>(dp))
          ASSERT_TRUE(inc.instance.engine->add_request(i, prompts[i], params[i]).ok());
        // The orchestrator's broadcast reaches each rank when it reaches it:
        // here rank 0 hands it to every rank's stepper at its steps 3, 9, 16.
        drive(inc, outputs, finished, dp, [&](int steps) {
          if (r == 0 && (steps == 3 || steps == 9 || steps == 16)) {
            std::lock_guard lk(mu);
            for (SidpStepper* s : steppers)
              if (s != nullptr) s->directive(steps == 9 ? SidpMode::was : SidpMode::cas, static_cast<std::uint64_t>(steps));
          }
          return true;
        });
        stats[static_cast<std::size_t>(r)] = inc.stepper->rank().ffn().stats();
        std::lock_guard lk(mu);
        steppers[static_cast<std::size_t>(r)] = nullptr;
      });
    for (auto& t : threads) t.join();
    expect_bit_identical(outputs, ref);
    std::uint64_t fused = 0, dummy = 0;
    for (int r = 0; r < dp; ++r) {
      const auto& s = stats[static_cast<std::size_t>(r)];
      EXPECT_GE(s.switches_to_cas, 1u) << "rank " << r;
      EXPECT_GE(s.switches_to_was, 1u) << "rank " << r;
      fused += s.cas_fused_gemms;
      dummy += s.dummy_steps;
    }
    EXPECT_GT(fused, 0u) << "no owner ran a fused CaS GEMM";
    EXPECT_GT(dummy, 0u) << "no rank took a dummy turn in CaS";
    EXPECT_EQ(group->generation(), 1u);
  }
}

TEST(SidpStepperGolden, ARestartedRankRebuildsTheGenerationAndTheDirectiveWaitsForIt) {
  const auto prompts = testing_support::stories_prompt_ids();
  const auto ref = run_single(prompts, std::vector<sampling::SamplingParams>(prompts.size(), greedy()));
  constexpr int dp = 2;
  auto group = make_group(dp);
  std::vector<RequestOutput> outputs(prompts.size());
  std::atomic<int> finished{0};
  std::atomic<bool> rank0_joined{false}, rank1_down{false}, directive_given{false};
  std::uint64_t rank0_generation = 0, rank1_generation = 0;
  model::sidp::SidpFfnStats stats0, stats1;
  std::thread t0([&] {
    Incarnation inc = start_rank(*group, 0);
    rank0_joined = true;
    for (std::size_t i = 0; i < prompts.size(); i += dp)
      ASSERT_TRUE(inc.instance.engine->add_request(i, prompts[i], greedy()).ok());
    drive(inc, outputs, finished, dp, [&](int steps) {
      // At its 2nd step rank 0 waits for rank 1 to go down (rank 1 needs
      // nothing from this thread in WaS), so the order is fixed. While rank 1
      // is down the orchestrator says CaS: rank 0 has no compute generation,
      // so it keeps running WaS.
      if (steps == 2) {
        while (!rank1_down) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        // A step boundary: rank 0 finds its generation dead and leaves it.
        EXPECT_TRUE(inc.stepper->before_step().ok());
        EXPECT_TRUE(inc.stepper->rank().generation_dead());
        EXPECT_EQ(inc.stepper->rank().generation(), 0u);
        inc.stepper->directive(SidpMode::cas, 1);
        EXPECT_FALSE(inc.stepper->rank().ffn().join_pending());
        EXPECT_EQ(inc.stepper->rank().ffn().mode(), SidpMode::was);
        directive_given = true;
      }
      return true;
    });
    rank0_generation = inc.stepper->rank().generation();
    stats0 = inc.stepper->rank().ffn().stats();
  });
  std::thread t1([&] {
    std::vector<RequestOutput> first(prompts.size());
    std::atomic<int> never{0};
    {
      Incarnation inc = start_rank(*group, 1);
      while (!rank0_joined) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // both in generation 1
      for (std::size_t i = 1; i < prompts.size(); i += dp)
        ASSERT_TRUE(inc.instance.engine->add_request(i, prompts[i], greedy()).ok());
      drive(inc, first, never, dp, [](int steps) { return steps < 4; });  // "crashes" at its 4th step (WaS)
    }  // its SidpRank goes: generation 1 dies
    rank1_down = true;
    while (!directive_given) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    Incarnation inc = start_rank(*group, 1);  // a new incarnation: generation 2
    for (std::size_t i = 1; i < prompts.size(); i += dp)
      ASSERT_TRUE(inc.instance.engine->add_request(i, prompts[i], greedy()).ok());
    drive(inc, outputs, finished, dp, [](int) { return true; });
    rank1_generation = inc.stepper->rank().generation();
    stats1 = inc.stepper->rank().ffn().stats();
  });
  t0.join();
  t1.join();
  expect_bit_identical(outputs, ref);
  EXPECT_EQ(group->generation(), 2u);
  EXPECT_EQ(rank1_generation, 2u);
  // Rank 0 followed to generation 2 (or, if it finished first, left with it).
  EXPECT_TRUE(rank0_generation == 2u || rank0_generation == 0u) << rank0_generation;
  EXPECT_EQ(stats1.switches_to_cas, 1u) << "the new incarnation applied the directive given while it was down";
  EXPECT_GT(stats1.cas_steps + stats1.dummy_steps, 0u);
  EXPECT_GE(stats0.switches_to_cas, 1u);
}

}  // namespace
}  // namespace shardline::worker
