// Golden, through the whole engine (scheduler, block manager, runner,
// sampler, detokenizer) on the shipped stories260K: the reference greedy ids
// and top-5 logits, alone and in a batch of 64 at several chunkings and under
// KV preemption, with logits bit-identical to the request running alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>

#include "engine/group/engine_builder.hpp"
#include "tests/support/engine_runs.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline::engine {
namespace engine_cpu_engine_golden_test {

constexpr int kMaxTokens = 48;
using RefCase = testing_support::StoriesCase;
using testing_support::kStoriesDir;

std::vector<RefCase> load_reference() { return testing_support::load_stories_reference(); }

EngineInstance make_engine(int max_num_batched_tokens, std::uint64_t kv_cache_bytes = 8u << 20,
                      int max_num_seqs = 64) {
  EngineOptions o;
  o.model_dir = kStoriesDir;
  o.block_size = 16;
  o.kv_cache_bytes = kv_cache_bytes;
  o.max_num_seqs = max_num_seqs;
  o.max_num_batched_tokens = max_num_batched_tokens;
  o.capture_logits = true;
  o.check_integrity = true;
  auto e = build_engine(o);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().to_string());
  return std::move(e).value();
}

sampling::SamplingParams greedy() {
  sampling::SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = kMaxTokens;
  return p;
}

using testing_support::bit_identical;
using testing_support::run_all;

void add_fillers(LlmEngine& engine, const text::Tokenizer& tok, std::uint64_t first_id) {
  testing_support::add_fillers(engine, tok, first_id, 61);
}

void expect_reference(const RefCase& ref, const RequestOutput& out, const std::string& where) {
  testing_support::expect_reference(ref, out, kMaxTokens, where);
}

class CpuEngineGolden : public ::testing::Test {
 protected:
  void SetUp() override {
    refs_ = load_reference();
    ASSERT_EQ(refs_.size(), 3u);
    // Alone: each reference prompt in its own engine, whole prompt in one step.
    for (const RefCase& r : refs_) {
      EngineInstance e = make_engine(2048);
      ASSERT_TRUE(e.engine->add_request(7, e.tokenizer->encode(r.prompt, true), greedy()).ok());
      auto outs = run_all(*e.engine);
      ASSERT_EQ(outs.size(), 1u);
      alone_.push_back(outs.at(7));
    }
  }
  std::vector<RefCase> refs_;
  std::vector<RequestOutput> alone_;
};

TEST_F(CpuEngineGolden, AloneMatchesReferenceIdsTextAndTop5) {
  for (std::size_t i = 0; i < refs_.size(); ++i) {
    EXPECT_EQ(alone_[i].prompt_token_ids, refs_[i].prompt_ids);
    expect_reference(refs_[i], alone_[i], "alone case " + std::to_string(i));
  }
}

// The three reference requests inside a batch of 64, at token budgets that
// chunk prompts differently (7, 64 and 2048 tokens per step): reference ids,
// and logits bit-identical to running alone.
TEST_F(CpuEngineGolden, BatchOf64AtAnyChunkingIsBitIdenticalToAlone) {
  for (int budget : {64, 7, 2048}) {
    EngineInstance e = make_engine(budget);
    for (std::size_t i = 0; i < refs_.size(); ++i)
      ASSERT_TRUE(e.engine->add_request(i, e.tokenizer->encode(refs_[i].prompt, true), greedy()).ok());
    add_fillers(*e.engine, *e.tokenizer, 100);
    auto outs = run_all(*e.engine);
    ASSERT_EQ(outs.size(), 64u) << "budget " << budget;
    for (std::size_t i = 0; i < refs_.size(); ++i) {
      const std::string where = "budget " + std::to_string(budget) + " case " + std::to_string(i);
      expect_reference(refs_[i], outs.at(i), where);
      EXPECT_TRUE(bit_identical(outs.at(i), alone_[i])) << where << ": logits differ from alone";
    }
  }
}

// A KV cache too small for the batch forces recompute preemption; every
// request still finishes, the reference ones with bit-identical logits.
TEST_F(CpuEngineGolden, PreemptionUnderTinyKvCacheKeepsOutputsIdentical) {
  // stories260K: 5 layers * 4 kv heads * 8 dims * 2 (K,V) * 4 bytes = 1280 bytes/token.
  // 64 blocks of 16 tokens: room for ~16 sequences of ~60 tokens, far fewer than 64.
  EngineInstance e = make_engine(256, 64ull * 16 * 1280);
  ASSERT_EQ(e.num_kv_blocks, 64);
  for (std::size_t i = 0; i < refs_.size(); ++i)
    ASSERT_TRUE(e.engine->add_request(i, e.tokenizer->encode(refs_[i].prompt, true), greedy()).ok());
  add_fillers(*e.engine, *e.tokenizer, 100);
  auto outs = run_all(*e.engine);
  ASSERT_EQ(outs.size(), 64u);
  int preemptions = 0;
  for (const auto& s : e.engine->step_stats()) preemptions += s.num_preemptions;
  EXPECT_GT(preemptions, 0) << "the test must actually preempt";
  for (std::size_t i = 0; i < refs_.size(); ++i) {
    expect_reference(refs_[i], outs.at(i), "preempted case " + std::to_string(i));
    EXPECT_TRUE(bit_identical(outs.at(i), alone_[i])) << "case " << i;
  }
}

// Seeded sampling: a request's tokens depend on (seed, position) only, not on
// its batch or chunking.
TEST(CpuEngineSeeded, SeededSamplingIsBatchInvariant) {
  sampling::SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 40;
  p.top_p = 0.95f;
  p.seed = 1234;
  p.has_seed = true;
  p.max_tokens = 40;
  EngineInstance alone = make_engine(2048);
  ASSERT_TRUE(alone.engine->add_request(5, alone.tokenizer->encode("Once upon a time", true), p).ok());
  const RequestOutput a = run_all(*alone.engine).at(5);

  EngineInstance batched = make_engine(5);
  ASSERT_TRUE(batched.engine->add_request(5, batched.tokenizer->encode("Once upon a time", true), p).ok());
  add_fillers(*batched.engine, *batched.tokenizer, 100);
  const RequestOutput b = run_all(*batched.engine).at(5);
  EXPECT_TRUE(bit_identical(a, b));
  EXPECT_EQ(a.text, b.text);

  // A different seed gives a different story (the seed is really used).
  p.seed = 99;
  EngineInstance other = make_engine(2048);
  ASSERT_TRUE(other.engine->add_request(5, other.tokenizer->encode("Once upon a time", true), p).ok());
  EXPECT_NE(run_all(*other.engine).at(5).token_ids, a.token_ids);
}

}  // namespace
}  // namespace shardline::engine
