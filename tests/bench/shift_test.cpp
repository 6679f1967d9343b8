// The Shift Parallelism benchmark (bench/shift.hpp) on stories260K: what it
// reports is what ran (the forced configs ran only in their mode, every
// request finished with all its tokens) and bad request classes are refused.
// No timing is asserted.
#include "bench/shift.hpp"

#include <gtest/gtest.h>

#include "tests/support/stories_reference.hpp"

namespace shardline::bench {
namespace bench_shift_test {

TEST(ShiftBench, ParsesRequestClasses) {
  auto c = parse_request_class("8x1024/16");
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  EXPECT_EQ(c->count, 8);
  EXPECT_EQ(c->input_len, 1024);
  EXPECT_EQ(c->output_len, 16);
  for (const char* bad : {"", "8x1024", "8/16x3", "0x4/4", "8x-1/16", "8x16/16z", "ax1/1"}) {
    auto r = parse_request_class(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(r.error().message.find(std::string("got '") + bad + "'"), std::string::npos) << r.error().message;
  }
}

ShiftBenchOptions small(const engine::ParallelConfig& pc) {
  ShiftBenchOptions o;
  o.engine.model_dir = testing_support::kStoriesDir;
  o.engine.parallel = pc;
  o.engine.num_threads = 1;
  o.engine.kv_cache_bytes = 8 << 20;
  o.long_requests = {2, 100, 4};
  o.short_requests = {5, 8, 20};
  o.sweep_tokens = {1, 8, 40};
  o.max_decode_sweep = 8;
  o.repeats = 2;
  o.threshold = 16;  // the 216-token first step runs in the base config, the decode steps shifted
  o.hysteresis = 0;
  return o;
}

TEST(ShiftBench, ReportsWhatRan) {
  for (const engine::ParallelConfig& pc : {engine::ParallelConfig{.sp = 2}, engine::ParallelConfig{.tp = 2, .sp = 2}}) {
    auto rep = run_shift_bench(small(pc));
    ASSERT_TRUE(rep.ok()) << rep.error().to_string();
    EXPECT_EQ(rep->devices, pc.group_size());
    // The shift config's shard is a TP' = sp*tp shard: smaller than the base's.
    EXPECT_GT(rep->shift_weight_bytes, 0u);
    EXPECT_LT(rep->shift_weight_bytes, rep->base_weight_bytes);
    ASSERT_EQ(rep->sweep.size(), 3u);
    for (const ShiftSweepRow& r : rep->sweep) {
      EXPECT_GT(r.prefill_base_ms, 0) << r.num_tokens;
      EXPECT_GT(r.prefill_shift_ms, 0) << r.num_tokens;
      EXPECT_EQ(r.decode_base_ms > 0, r.num_tokens <= 8) << r.num_tokens;  // decode sweep capped at 8
      EXPECT_EQ(r.decode_shift_ms > 0, r.num_tokens <= 8) << r.num_tokens;
    }
    ASSERT_EQ(rep->runs.size(), 6u);  // base, tp, shift, twice
    for (std::size_t i = 0; i < rep->runs.size(); ++i) {
      const ShiftMixedRun& r = rep->runs[i];
      EXPECT_EQ(r.config, i % 3 == 0 ? "base" : i % 3 == 1 ? "tp" : "shift");
      EXPECT_EQ(r.num_requests, 7);
      EXPECT_EQ(r.num_generated, 2 * 4 + 5 * 20) << r.config;
      EXPECT_GT(r.ttft_ms_median, 0);
      EXPECT_GT(r.tpot_ms_median, 0);
      if (r.config == "base") {
        EXPECT_EQ(r.shift_steps, 0u);
        EXPECT_GT(r.base_steps, 0u);
      } else if (r.config == "tp") {
        EXPECT_EQ(r.base_steps, 0u);
        EXPECT_GT(r.shift_steps, 0u);
      } else {
        EXPECT_EQ(r.threshold, 16);
        EXPECT_GE(r.base_steps, 1u);   // the prefill step
        EXPECT_GT(r.shift_steps, 0u);  // the decode steps
      }
    }
    EXPECT_NE(rep->to_json().find("\"mixed\""), std::string::npos);
  }
}

TEST(ShiftBench, RefusesAGroupWithoutAShiftConfig) {
  for (const engine::ParallelConfig& pc :
       {engine::ParallelConfig{}, engine::ParallelConfig{.pp = 2, .sp = 2}, engine::ParallelConfig{.sp = 2, .dp = 2}}) {
    auto rep = run_shift_bench(small(pc));
    ASSERT_FALSE(rep.ok()) << pc.to_string();
    EXPECT_EQ(rep.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(rep.error().message.find("--parallel must be sp=N or sp=N,tp=M"), std::string::npos);
  }
}

}  // namespace
}  // namespace shardline::bench
