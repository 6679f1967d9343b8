// Seesaw's phases (seed 000 §4.2) in the engine: pure prefill and pure decode
// phases with a host KV buffer between them, the transitions picked by the
// phase policy (engine/policies/seesaw_policy.hpp). Every sequence's KV
// leaves the device when its prefill ends (and at a transition) and comes
// back by a restore; none is recomputed unless the host buffer is full.
// Under budgets so small that every sequence crosses a transition and a
// restore, on one device and on an in-process pp=2 group (whose pipeline a
// transition drains), every schedule gives the single-device mixed run's
// tokens and logits bit for bit, and the stories260K reference ids.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "engine/data_parallel.hpp"
#include "engine/engine_builder.hpp"
#include "tests/support/engine_runs.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline::engine {
namespace {

using testing_support::kStoriesDir;

constexpr std::uint64_t kBytesPerToken = 5 * 2 * 4 * 8 * 4;  // stories260K: layers * K,V * KV heads * hd * f32

EngineOptions tiny_options() {
  EngineOptions o;
  o.model_dir = kStoriesDir;
  o.block_size = 4;
  o.max_model_len = 64;
  o.kv_cache_bytes = 32 * 4 * kBytesPerToken;  // 32 blocks of 4 tokens: two sequences' worth
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = 16;
  o.capture_logits = true;
  o.check_integrity = true;
  o.num_threads = 1;
  return o;
}

struct Run {
  std::vector<RequestOutput> outputs;
  SeesawStats seesaw;
  KvIoStats kv;
};

Result<Run> run(EngineOptions o, const std::vector<std::vector<std::int32_t>>& prompts) {
  sampling::SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 48;
  Result<EngineInstance> e = build_engine(o);
  if (!e.ok()) return std::move(e).error();
  std::vector<LlmEngine*> engines = {e->engine.get()};
  auto out = generate_data_parallel(engines, prompts, greedy);
  if (!out.ok()) return std::move(out).error();
  return Run{std::move(out).value(), e->engine->seesaw_stats(), e->engine->kv_io().stats()};
}

using testing_support::bit_identical;

TEST(Seesaw, EverySchedulePhasesTheSameTokensAsContinuousBatching) {
  const auto cases = testing_support::load_stories_reference();
  std::vector<std::vector<std::int32_t>> prompts;
  for (int k = 0; k < 4; ++k)
    for (const auto& c : cases) prompts.push_back(c.prompt_ids);
  const std::size_t n = prompts.size();

  auto mixed = run(tiny_options(), prompts);  // today's scheduler on one device
  ASSERT_TRUE(mixed.ok()) << mixed.error().to_string();
  for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(mixed->outputs[i].token_ids, cases[i % cases.size()].generated_ids);

  for (const ParallelConfig& pc : {ParallelConfig{}, ParallelConfig{1, 2, 1, 1}}) {
    for (const SeesawSchedule schedule : {SeesawSchedule::transition_minimizing, SeesawSchedule::prefill_prioritizing,
                                          SeesawSchedule::decode_prioritizing}) {
      for (const PreemptionMode mode : {PreemptionMode::swap, PreemptionMode::recompute}) {
        const std::string what = pc.to_string() + " " + to_string(schedule) + " " + preemption_mode_name(mode);
        SCOPED_TRACE(what);
        EngineOptions o = tiny_options();
        o.parallel = pc;
        o.preemption_mode = mode;
        o.seesaw = SeesawPolicyOptions{schedule};
        o.swap_space_bytes = 64 * kBytesPerToken;  // the host KV buffer: one max_model_len sequence, the least
        auto got = run(o, prompts);
        ASSERT_TRUE(got.ok()) << got.error().to_string();
        ASSERT_EQ(got->outputs.size(), n);
        for (std::size_t i = 0; i < n; ++i) {
          EXPECT_EQ(got->outputs[i].request_id, i);
          EXPECT_EQ(got->outputs[i].token_ids, cases[i % cases.size()].generated_ids) << "request " << i;
        }
        EXPECT_TRUE(bit_identical(got->outputs, mixed->outputs)) << "tokens or logits differ from the mixed run";
        const SeesawStats& s = got->seesaw;
        std::printf("  %-44s transitions %llu, steps prefill %llu / decode %llu, offloads %llu, onboards %llu, "
                    "host peak %lld tokens\n",
                    what.c_str(), static_cast<unsigned long long>(s.transitions),
                    static_cast<unsigned long long>(s.prefill_steps), static_cast<unsigned long long>(s.decode_steps),
                    static_cast<unsigned long long>(s.offloads), static_cast<unsigned long long>(got->kv.onboards),
                    s.host_peak_tokens);
        EXPECT_GE(s.transitions, 3u);
        EXPECT_GE(s.offloads, n);          // every sequence left the device at least once
        EXPECT_GE(got->kv.onboards, n);    // ... and came back by a restore
        EXPECT_GT(s.prefill_steps, 0u);
        EXPECT_GT(s.decode_steps, 0u);
        EXPECT_LE(s.host_peak_tokens, 64);
        EXPECT_EQ(got->kv.swap_space_bytes_used, 0u);  // nothing left behind
      }
    }
  }
}

TEST(Seesaw, AHostBufferBelowOneSequenceIsRefused) {
  EngineOptions o = tiny_options();
  o.seesaw = SeesawPolicyOptions{};
  o.swap_space_bytes = 63 * kBytesPerToken;  // max_model_len is 64
  auto e = build_engine(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(e.error().message.find("cannot hold one max_model_len=64 sequence"), std::string::npos)
      << e.error().message;
  o.swap_space_bytes = 64 * kBytesPerToken;
  EXPECT_TRUE(build_engine(o).ok());
}

}  // namespace
}  // namespace shardline::engine
