// Automatic prefix caching (engine/prefix_cache.hpp, issue 42) through the
// whole CPU engine on the shipped stories260K: jobs full of shared prefixes
// (one long system-style head on every request, few-shot heads from a small
// pool, the same prompt several times with different seeds, prompts that
// differ in a block's last token) give byte-identical outputs (token ids
// and every captured logit) with caching on and off, at two chunkings, under
// recompute and swap preemption in a tiny KV cache; with caching on the
// shared tokens are counted as hits and are not computed (fewer prefill
// tokens). Planted bug (by hand, see docs/prefix-caching.md): a block name
// and check that ignore the block's last token make the one-token-apart
// prompts share KV, and this test fails.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "engine/group/engine_builder.hpp"
#include "engine/prefix_tier.hpp"
#include "tests/support/engine_runs.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline::engine {
namespace engine_prefix_cache_golden_test {

using testing_support::kStoriesDir;

struct JobRun {
  std::map<std::uint64_t, RequestOutput> outputs;
  long long prefill_tokens = 0;  ///< tokens the steps computed (not decodes)
  long long query_tokens = 0;
  long long hit_tokens = 0;
  long long copied_tokens = 0;  ///< positions copied from another request's block (copy-on-write)
  int preemptions = 0;
};

/// The requests: id -> (prompt ids, sampling).
using Job = std::map<std::uint64_t, std::pair<std::vector<std::int32_t>, sampling::SamplingParams>>;

JobRun run_job(const Job& job, bool caching, int budget, std::uint64_t kv_cache_bytes, PreemptionMode mode,
            int max_num_seqs = 64, ParallelConfig parallel = {}) {
  EngineOptions o;
  o.parallel = parallel;
  o.model_dir = kStoriesDir;
  o.block_size = 16;
  o.kv_cache_bytes = kv_cache_bytes;
  o.max_num_seqs = max_num_seqs;
  o.max_num_batched_tokens = budget;
  o.max_model_len = 128;  // the longest prompt (77) and its output fit
  o.capture_logits = true;
  o.check_integrity = true;
  o.preemption_mode = mode;
  o.enable_prefix_caching = caching;
  auto e = build_engine(o);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().to_string());
  JobRun r;
  if (!e.ok()) return r;
  for (const auto& [id, req] : job) EXPECT_TRUE(e->engine->add_request(id, req.first, req.second).ok());
  r.outputs = testing_support::run_all(*e->engine);
  for (const auto& s : e->engine->step_stats()) {
    r.prefill_tokens += s.num_prefill_tokens;
    r.preemptions += s.num_preemptions;
  }
  r.query_tokens = e->engine->scheduler().prefix_query_tokens();
  r.hit_tokens = e->engine->scheduler().prefix_hit_tokens();
  r.copied_tokens = static_cast<long long>(e->engine->kv_io().stats().prefix_copied_tokens);
  return r;
}

sampling::SamplingParams params(std::uint64_t seed, float temperature, int max_tokens) {
  sampling::SamplingParams p;
  p.temperature = temperature;
  p.max_tokens = max_tokens;
  p.seed = seed;
  p.has_seed = true;
  p.ignore_eos = true;
  return p;
}

/// A deterministic token stream over the model's vocabulary (512).
std::vector<std::int32_t> tokens(int n, int salt) {
  std::vector<std::int32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(3 + (salt * 131 + i * 37 + (i * i) % 17) % 500);
  return out;
}

std::vector<std::int32_t> cat(std::vector<std::int32_t> a, const std::vector<std::int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

/// The shared-prefix job: 12 requests on one 70-token head (4 full blocks
/// and a partial one) with their own questions; 8 few-shot requests, each
/// with 2 of 4 pool examples (34 tokens each) then a question; one prompt
/// 4 times with other seeds (n = 4 done as requests); 2 prompts 60 tokens
/// long that differ only in token 47 (the last of their third block), and a
/// prompt that equals the head exactly.
Job shared_prefix_job() {
  Job job;
  const std::vector<std::int32_t> head = cat({1}, tokens(69, 1));
  std::uint64_t id = 0;
  for (int q = 0; q < 12; ++q) job[id++] = {cat(head, tokens(5 + q, 100 + q)), params(10 + q, q % 2 ? 0.8f : 0.0f, 12)};
  std::vector<std::vector<std::int32_t>> pool;
  for (int e = 0; e < 4; ++e) pool.push_back(tokens(34, 200 + e));
  for (int q = 0; q < 8; ++q)
    job[id++] = {cat(cat(cat({1}, pool[q % 4]), pool[(q + 1) % 4]), tokens(6, 300 + q)), params(40 + q, 0.0f, 10)};
  const std::vector<std::int32_t> same = cat({1}, tokens(40, 400));
  for (int n = 0; n < 4; ++n) job[id++] = {same, params(60 + n, 1.0f, 16)};
  std::vector<std::int32_t> twin = cat({1}, tokens(59, 500));
  job[id++] = {twin, params(70, 0.0f, 12)};
  twin[47] = (twin[47] + 1) % 500 + 3;  // the last token of the third block
  job[id++] = {twin, params(71, 0.0f, 12)};
  job[id++] = {head, params(72, 0.0f, 12)};
  return job;
}

void expect_same_outputs(const JobRun& got, const JobRun& want, const std::string& where) {
  ASSERT_EQ(got.outputs.size(), want.outputs.size()) << where;
  for (const auto& [id, out] : want.outputs) {
    ASSERT_EQ(got.outputs.count(id), 1u) << where << " request " << id;
    EXPECT_TRUE(testing_support::bit_identical(got.outputs.at(id), out)) << where << " request " << id;
  }
}

// Caching on and off, with a whole-prompt budget and a 7-token one (chunked
// prefill across the cached boundary): byte-identical outputs; with caching
// the shared tokens are hits and are not prefilled.
TEST(PrefixCacheGolden, SharedPrefixJobIsByteIdenticalWithAndWithoutCaching) {
  const Job job = shared_prefix_job();
  for (int budget : {2048, 7}) {
    const std::string where = "budget " + std::to_string(budget);
    // One request at a time first would give the most hits; a batch of 64
    // admits many together, so hits come from requests admitted after the
    // first's blocks were computed. max_num_seqs 4 staggers them.
    const JobRun off = run_job(job, false, budget, 8u << 20, PreemptionMode::recompute, 4);
    const JobRun on = run_job(job, true, budget, 8u << 20, PreemptionMode::recompute, 4);
    expect_same_outputs(on, off, where);
    EXPECT_EQ(off.hit_tokens, 0) << where;
    EXPECT_GT(on.hit_tokens, 11 * 64) << where << ": the head's 4 full blocks, at least, for the later requests";
    EXPECT_EQ(on.prefill_tokens + on.hit_tokens, off.prefill_tokens) << where << ": every hit is a token not computed";
  }
}

// A KV cache of 24 blocks (384 tokens) for the same job at max_num_seqs 16:
// preemption under both modes, named blocks evicted and shared blocks freed
// while their sharers run; still byte-identical to no caching.
TEST(PrefixCacheGolden, PreemptionAndEvictionInATinyCacheKeepTheOutputsIdentical) {
  const Job job = shared_prefix_job();
  constexpr std::uint64_t kBytesPerToken = 5 * 4 * 8 * 2 * 4;  // stories260K, F32 KV
  for (PreemptionMode mode : {PreemptionMode::recompute, PreemptionMode::swap}) {
    const std::string where = std::string("preemption ") + preemption_mode_name(mode);
    const JobRun off = run_job(job, false, 64, 24 * 16 * kBytesPerToken, mode, 16);
    const JobRun on = run_job(job, true, 64, 24 * 16 * kBytesPerToken, mode, 16);
    expect_same_outputs(on, off, where);
    EXPECT_GT(on.preemptions, 0) << where << ": the cache must be too small";
    EXPECT_GT(on.hit_tokens, 0) << where;
  }
}

// The `n` choices of a line are requests admitted together: 8 requests of
// one 64-token prompt (sampled, other seeds) in one step budget. The first
// computes the prompt; the others wait for its blocks (ComputingPrefixes),
// share its first 3 blocks and copy the KV of its last block's first 15
// tokens (copy-on-write: their last token is always computed, into a block
// of their own): 64 + 7 x 1 prefill tokens instead of 8 x 64, the same
// outputs.
TEST(PrefixCacheGolden, RequestsAdmittedTogetherComputeASharedPromptOnce) {
  Job job;
  const std::vector<std::int32_t> prompt = cat({1}, tokens(63, 900));
  for (std::uint64_t n = 0; n < 8; ++n) job[n] = {prompt, params(800 + n, 1.0f, 10)};
  const JobRun off = run_job(job, false, 2048, 8u << 20, PreemptionMode::recompute);
  const JobRun on = run_job(job, true, 2048, 8u << 20, PreemptionMode::recompute);
  expect_same_outputs(on, off, "n = 8");
  EXPECT_EQ(off.prefill_tokens, 8 * 64);
  EXPECT_EQ(on.prefill_tokens, 64 + 7 * 1);
  EXPECT_EQ(on.hit_tokens, 7 * 63);
  EXPECT_EQ(on.copied_tokens, 7 * 15);
}

// A shared head that ends inside a block (70 tokens: 4 full blocks and 6),
// twelve requests one after another: each later one shares the 4 blocks
// and copies the KV of the head's last 6 tokens out of the block the
// requests before it filled (copy-on-write), so the steps compute exactly
// the prompts' prefix tree (the head once, every question once), and the
// outputs are byte-identical to no caching. Planted bug (by hand): copying
// out of the sequence's own block instead of the source
// (KvCacheIo::copy_prefix) changes the outputs and this test fails.
TEST(PrefixCacheGolden, AHeadEndingMidBlockIsCopiedNotComputed) {
  Job job;
  const std::vector<std::int32_t> head = cat({1}, tokens(69, 1));
  long long ideal = 70;
  for (int q = 0; q < 12; ++q) {
    job[static_cast<std::uint64_t>(q)] = {cat(head, tokens(5 + q, 100 + q)), params(10 + q, q % 2 ? 0.8f : 0.0f, 12)};
    ideal += 5 + q;  // the questions' first tokens all differ
  }
  const JobRun off = run_job(job, false, 2048, 8u << 20, PreemptionMode::recompute, 1);
  const JobRun on = run_job(job, true, 2048, 8u << 20, PreemptionMode::recompute, 1);
  expect_same_outputs(on, off, "one at a time");
  EXPECT_EQ(on.prefill_tokens, ideal);
  EXPECT_EQ(on.copied_tokens, 11 * 6);
  EXPECT_EQ(on.hit_tokens, 11 * 70);
  // Admitted together (a step's budget for all), the later ones wait for the
  // head's blocks, then copy the same 6 tokens.
  const JobRun together = run_job(job, true, 2048, 8u << 20, PreemptionMode::recompute);
  expect_same_outputs(together, off, "admitted together");
  EXPECT_LE(together.prefill_tokens, ideal + 11 * 6) << "at most the partial block again per request";
}

// The same on engine groups, whose block table is the group's and whose
// ranks each hold a share of every block (TP: heads, PP: layers, SP: the
// whole KV on each rank): the copy reaches every share, and the outputs are
// the group's own uncached run's.
TEST(PrefixCacheGolden, GroupsShareAndCopyTheirBlocksToo) {
  Job job;
  const std::vector<std::int32_t> head = cat({1}, tokens(69, 1));
  for (int q = 0; q < 6; ++q)
    job[static_cast<std::uint64_t>(q)] = {cat(head, tokens(5 + q, 100 + q)), params(10 + q, q % 2 ? 0.8f : 0.0f, 8)};
  for (const ParallelConfig parallel : {ParallelConfig{2, 1, 1, 1}, ParallelConfig{1, 2, 1, 1}, ParallelConfig{1, 1, 2, 1}}) {
    const std::string where = parallel.to_string();
    const JobRun off = run_job(job, false, 2048, 8u << 20, PreemptionMode::recompute, 1, parallel);
    const JobRun on = run_job(job, true, 2048, 8u << 20, PreemptionMode::recompute, 1, parallel);
    expect_same_outputs(on, off, where);
    EXPECT_EQ(on.hit_tokens, 5 * 70) << where;
    EXPECT_EQ(on.copied_tokens, 5 * 6) << where;
  }
}

// ---- a prefix tier below the cache (engine/prefix_tier.hpp) --------------------

/// An engine over stories260K with `kv_blocks` blocks of 16, one request at a time.
std::unique_ptr<EngineInstance> tier_engine(bool caching, int kv_blocks, PrefixTier* tier, int max_num_seqs = 1) {
  EngineOptions o;
  o.model_dir = kStoriesDir;
  o.block_size = 16;
  o.kv_cache_bytes = static_cast<std::uint64_t>(kv_blocks) * 16 * 2560;  // stories260K, F32 KV: 2,560 bytes a position
  o.max_num_seqs = max_num_seqs;
  o.max_num_batched_tokens = 2048;
  o.max_model_len = 128;
  o.capture_logits = true;
  o.check_integrity = true;
  o.enable_prefix_caching = caching;
  auto e = build_engine(o);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().to_string());
  if (!e.ok()) return nullptr;
  auto instance = std::make_unique<EngineInstance>(std::move(e).value());
  instance->engine->set_prefix_tier(tier);
  return instance;
}

/// Runs `job` to the end on `engine`; the prompt tokens its steps computed into `prefill`.
std::map<std::uint64_t, RequestOutput> run_on(LlmEngine& engine, const Job& job, long long* prefill) {
  engine.clear_step_stats();
  for (const auto& [id, req] : job) EXPECT_TRUE(engine.add_request(id, req.first, req.second).ok()) << id;
  auto out = testing_support::run_all(engine);
  *prefill = 0;
  for (const auto& s : engine.step_stats()) *prefill += s.num_prefill_tokens;
  return out;
}

/// Runs `first`, then `fillers` (which evict blocks of it), on `engine`.
void run_then_fill(LlmEngine& engine, const Job& first, const Job& fillers) {
  long long prefill = 0;
  (void)run_on(engine, first, &prefill);
  (void)run_on(engine, fillers, &prefill);
}

// A 16-block cache: a request behind a 70-token head (4 full blocks), then
// four 112-token fillers that evict every named block, then another request
// behind the head. With a host tier the evicted blocks were spilled, and
// the head's 4 blocks come back from it (64 positions restored, 11
// computed) instead of being computed again; the outputs are those of no
// caching, bit for bit. Planted bug (by hand): the tier's blocks restored
// in the wrong order (KvCacheIo::restore) changes the outputs and this
// test fails.
TEST(PrefixCacheGolden, EvictedBlocksSpillToATierAndComeBackInsteadOfBeingComputed) {
  const std::vector<std::int32_t> head = cat({1}, tokens(69, 1));
  Job first, fillers, again;
  first[0] = {cat(head, tokens(5, 100)), params(10, 0.0f, 12)};
  for (std::uint64_t f = 0; f < 4; ++f) fillers[10 + f] = {cat({1}, tokens(99, 700 + static_cast<int>(f))), params(20, 0.8f, 12)};
  again[1] = {cat(head, tokens(5, 101)), params(11, 0.8f, 12)};
  long long prefill = 0;
  auto plain = tier_engine(false, 16, nullptr);
  ASSERT_NE(plain, nullptr);
  run_then_fill(*plain->engine, first, fillers);
  const auto want = run_on(*plain->engine, again, &prefill);

  HostPrefixTier tier(64u << 20);
  auto cached = tier_engine(true, 16, &tier);
  ASSERT_NE(cached, nullptr);
  run_then_fill(*cached->engine, first, fillers);
  const KvIoStats before = cached->engine->kv_io().stats();
  EXPECT_GT(before.prefix_tier_spilled_blocks, 4u) << "the fillers evicted named blocks, the head's among them";
  EXPECT_EQ(cached->engine->scheduler().block_manager().peek_cached_prefix({again.at(1).first, {}}, 74), 0)
      << "the head is no longer on the device";
  const auto got = run_on(*cached->engine, again, &prefill);
  EXPECT_EQ(prefill, 75 - 64) << "the head's 4 blocks restored from the tier, the rest computed";
  EXPECT_EQ(cached->engine->kv_io().stats().prefix_tier_restored_tokens, 64u);
  EXPECT_EQ(tier.stats().hits, 4u);
  ASSERT_EQ(got.count(1), 1u);
  EXPECT_TRUE(testing_support::bit_identical(got.at(1), want.at(1))) << "the restored head's KV differs";

  // Without the tier, the same engine computes the head again.
  auto no_tier = tier_engine(true, 16, nullptr);
  ASSERT_NE(no_tier, nullptr);
  run_then_fill(*no_tier->engine, first, fillers);
  (void)run_on(*no_tier->engine, again, &prefill);
  EXPECT_EQ(prefill, 75);
}

// The cache frees a request's blocks tail first, so under pressure a prefix
// loses its tail and keeps its head (an 8-block cache, a filler that takes
// the 3 free blocks and evicts 2). A request behind it then shares the
// head's blocks on the device and takes the evicted tail's from the tier:
// the head's first 3 blocks cached, its fourth restored, 11 positions
// computed (27 without the tier), bit-identical to no caching.
TEST(PrefixCacheGolden, APrefixWhoseTailWasEvictedTakesItFromTheTierAfterItsDeviceHit) {
  const std::vector<std::int32_t> head = cat({1}, tokens(69, 1));
  Job first, fillers, again;
  first[0] = {cat(head, tokens(5, 100)), params(10, 0.0f, 12)};       // 87 tokens: 5 named blocks
  fillers[10] = {cat({1}, tokens(67, 700)), params(20, 0.8f, 12)};    // 5 blocks: 3 free, 2 evicted (the tail's)
  again[1] = {cat(head, tokens(5, 101)), params(11, 0.8f, 12)};
  long long prefill = 0;
  auto plain = tier_engine(false, 8, nullptr);
  ASSERT_NE(plain, nullptr);
  run_then_fill(*plain->engine, first, fillers);
  const auto want = run_on(*plain->engine, again, &prefill);

  for (const bool with_tier : {true, false}) {
    HostPrefixTier tier(64u << 20);
    auto e = tier_engine(true, 8, with_tier ? &tier : nullptr);
    ASSERT_NE(e, nullptr);
    run_then_fill(*e->engine, first, fillers);
    ASSERT_EQ(e->engine->scheduler().block_manager().peek_cached_prefix({again.at(1).first, {}}, 74), 48)
        << "the head's first 3 blocks are still cached, its fourth was evicted";
    const auto got = run_on(*e->engine, again, &prefill);
    EXPECT_EQ(prefill, with_tier ? 75 - 64 : 75 - 48);
    EXPECT_EQ(e->engine->kv_io().stats().prefix_tier_restored_tokens, with_tier ? 16u : 0u);
    EXPECT_EQ(got.at(1).num_cached_tokens, with_tier ? 64 : 48);
    EXPECT_TRUE(testing_support::bit_identical(got.at(1), want.at(1))) << (with_tier ? "tier" : "no tier");
  }
}

// A restart: the first engine spills its cache to the tier when it is done
// (spill_prefix_cache), a second engine given the tier runs two requests
// behind the same head, added together. The first fetches the head's 4
// blocks from the tier; the second does not fetch them again, waits for
// them and hits them on the device: 11 + 11 positions computed instead of
// 2 x 75, and the outputs are those of no caching.
TEST(PrefixCacheGolden, ASecondEngineStartsWarmFromTheTierTheFirstSpilledTo) {
  const std::vector<std::int32_t> head = cat({1}, tokens(69, 1));
  Job first, pair;
  first[0] = {cat(head, tokens(5, 100)), params(10, 0.0f, 12)};
  pair[1] = {cat(head, tokens(5, 101)), params(11, 0.8f, 12)};
  pair[2] = {cat(head, tokens(5, 102)), params(12, 0.0f, 12)};
  long long prefill = 0;
  auto plain = tier_engine(false, 64, nullptr, 8);
  ASSERT_NE(plain, nullptr);
  const auto want = run_on(*plain->engine, pair, &prefill);

  HostPrefixTier tier(64u << 20);
  {
    auto a = tier_engine(true, 64, &tier, 8);
    ASSERT_NE(a, nullptr);
    (void)run_on(*a->engine, first, &prefill);
    ASSERT_TRUE(a->engine->spill_prefix_cache().ok());
    EXPECT_EQ(tier.stats().blocks, 5u) << "the head's 4 blocks and the first request's fifth";
  }
  auto b = tier_engine(true, 64, &tier, 8);
  ASSERT_NE(b, nullptr);
  const auto got = run_on(*b->engine, pair, &prefill);
  EXPECT_EQ(prefill, 2 * (75 - 64));
  EXPECT_EQ(b->engine->kv_io().stats().prefix_tier_restored_tokens, 64u) << "one fetch, not one per request";
  EXPECT_EQ(tier.stats().hits, 4u);
  EXPECT_EQ(b->engine->scheduler().prefix_hit_tokens(), 64) << "the second request hit the restored blocks";
  for (std::uint64_t id : {1u, 2u}) {
    ASSERT_EQ(got.count(id), 1u);
    EXPECT_TRUE(testing_support::bit_identical(got.at(id), want.at(id))) << "request " << id;
    EXPECT_EQ(got.at(id).num_cached_tokens, 64) << "request " << id;
  }
}

}  // namespace engine_prefix_cache_golden_test
}  // namespace shardline::engine
