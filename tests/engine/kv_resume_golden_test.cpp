// Golden, on the shipped stories260K through the whole engine: DéjàVu's
// recovery from the last replicated token (seed 003 §4.2.3) and microbatch
// swapping (§4.2.2) give byte-identical outputs to an undisturbed run.
//  - A reference run streams every step's KV increment (the token-streaming
//    sink). Each request is then resumed in a fresh engine from a cut: the
//    tokens it had generated plus the KV of its first r positions, merged
//    from the increments the way a KV store would. Outputs are identical,
//    only positions after r are computed, and the KV the resumed engine
//    recomputes is bit-identical to the reference's (batch invariance).
//  - Resuming on a pipeline-parallel or sequence-parallel group (a different
//    cache layout: split at the source, merged at the destination) works the
//    same.
//  - Under 3x KV oversubscription, preemption by swap and by recompute both
//    give the reference outputs; swap computes fewer tokens.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <numeric>

#include "engine/group/engine_builder.hpp"
#include "tests/support/engine_runs.hpp"
#include "tests/support/kv_host_tier.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline::engine {
namespace engine_kv_resume_golden_test {

using testing_support::kStoriesDir;
using testing_support::run_all;

constexpr int kMaxTokens = 40;
constexpr int kNumRequests = 12;

EngineInstance make_engine(ParallelConfig pc = {}, std::uint64_t kv_cache_bytes = 8u << 20,
                           PreemptionMode mode = PreemptionMode::recompute, std::uint64_t swap_bytes = 64u << 20) {
  EngineOptions o;
  o.model_dir = kStoriesDir;
  o.block_size = 16;
  o.kv_cache_bytes = kv_cache_bytes;
  o.max_num_seqs = 64;
  o.max_num_batched_tokens = 256;
  o.max_model_len = 256;
  o.check_integrity = true;
  o.parallel = pc;
  o.num_threads = 1;
  o.preemption_mode = mode;
  o.swap_space_bytes = swap_bytes;
  auto e = build_engine(o);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().to_string());
  return std::move(e).value();
}

struct Request {
  std::vector<std::int32_t> prompt;
  sampling::SamplingParams params;
};

std::vector<Request> requests(const text::Tokenizer& tok) {
  const char* starts[] = {"Once upon a time", "The little dog", "Lily wanted to", "Tom and his mom went to the",
                          "One day, a bird"};
  std::vector<Request> out;
  const auto params = testing_support::mixed_sampling_params(kNumRequests, kMaxTokens);
  for (int i = 0; i < kNumRequests; ++i) out.push_back({tok.encode(starts[i % 5], true), params[static_cast<std::size_t>(i)]});
  return out;
}

using testing_support::HostTier;

/// What a reference run left behind: outputs, and per request the tier of
/// its streamed KV plus the tier state after each generated token.
struct Reference {
  std::map<std::uint64_t, RequestOutput> outputs;
  std::map<std::uint64_t, std::unique_ptr<HostTier>> tiers;
};

/// A sink that merges every increment into per-request host tiers, and
/// checks each increment's token ids against the request's known tokens.
struct TierSink final : KvStreamSink {
  std::map<std::uint64_t, std::unique_ptr<HostTier>>* tiers = nullptr;
  int accept_every = 1;  ///< accept after every k-th step only (backpressure)
  mutable int asked = 0;
  int pushes = 0;
  std::vector<std::pair<std::uint64_t, std::vector<std::int32_t>>> tokens;  ///< (id, token ids at token_begin..)
  std::vector<int> begins;
  bool accepting() const override { return asked++ % accept_every == 0; }
  void push(KvIncrement inc) override {
    ++pushes;
    tokens.emplace_back(inc.request_id, inc.token_ids);
    begins.push_back(inc.range.token_begin);
    EXPECT_GT(inc.range.num_tokens(), 0);
    EXPECT_EQ(static_cast<int>(inc.token_ids.size()), inc.range.num_tokens() + 1);
    (*tiers)[inc.request_id]->merge(inc.range, inc.chunk);
  }
};

Reference run_reference(const std::vector<Request>& reqs, ParallelConfig pc = {}) {
  EngineInstance e = make_engine(pc);
  Reference ref;
  const kvstore::KvModelShape shape = e.executor->kv_model_shape();
  for (std::uint64_t id = 0; id < reqs.size(); ++id) ref.tiers[id] = std::make_unique<HostTier>(shape);
  TierSink sink;
  sink.tiers = &ref.tiers;
  e.engine->set_kv_sink(&sink);
  for (std::uint64_t id = 0; id < reqs.size(); ++id)
    EXPECT_TRUE(e.engine->add_request(id, reqs[id].prompt, reqs[id].params).ok());
  ref.outputs = run_all(*e.engine);
  EXPECT_EQ(ref.outputs.size(), reqs.size());
  EXPECT_GT(e.engine->kv_io().stats().streamed_bytes, 0u);
  return ref;
}

int computed_tokens(const LlmEngine& engine) {
  int n = 0;
  for (const StepStats& s : engine.step_stats()) n += s.num_prefill_tokens + s.num_decode_tokens;
  return n;
}

void expect_same(const RequestOutput& want, const RequestOutput& got, const std::string& where) {
  EXPECT_EQ(got.token_ids, want.token_ids) << where;
  EXPECT_EQ(got.text, want.text) << where;
  EXPECT_EQ(got.finish_reason, want.finish_reason) << where;
}

class KvResumeGolden : public ::testing::Test {
 protected:
  void SetUp() override {
    probe_ = make_engine();
    reqs_ = requests(*probe_.tokenizer);
  }
  EngineInstance probe_;
  std::vector<Request> reqs_;
};

/// Resumes every request after `k` generated tokens (or fewer when it
/// finished sooner) from r = known - 1 - lag positions of KV, on `pc`.
void resume_all(const std::vector<Request>& reqs, const Reference& ref, int k, int lag, ParallelConfig pc) {
  EngineInstance e = make_engine(pc);
  std::map<std::uint64_t, std::unique_ptr<HostTier>> recomputed;
  const kvstore::KvModelShape shape = e.executor->kv_model_shape();
  for (std::uint64_t id = 0; id < reqs.size(); ++id) recomputed[id] = std::make_unique<HostTier>(shape);
  TierSink sink;
  sink.tiers = &recomputed;
  e.engine->set_kv_sink(&sink);
  int expected_computed = 0;
  int expected_restored = 0;
  std::map<std::uint64_t, int> restored_at;
  for (std::uint64_t id = 0; id < reqs.size(); ++id) {
    const RequestOutput& want = ref.outputs.at(id);
    const int out_len = static_cast<int>(want.token_ids.size());
    const int cut = std::min(k, out_len - 1);  // still unfinished at the cut
    const int prompt = static_cast<int>(reqs[id].prompt.size());
    const int known = prompt + cut;
    const int r = std::max(0, known - 1 - lag);
    ResumeState rs;
    rs.output_ids.assign(want.token_ids.begin(), want.token_ids.begin() + cut);
    rs.num_kv_tokens = r;
    if (r > 0) rs.kv_chunk = ref.tiers.at(id)->prefix(r);
    ASSERT_TRUE(e.engine->add_request(id, reqs[id].prompt, reqs[id].params, std::move(rs)).ok());
    // Positions r .. (prompt + out_len - 2) are computed once each.
    expected_computed += prompt + out_len - 1 - r;
    expected_restored += r;
    restored_at[id] = r;
  }
  auto got = run_all(*e.engine);
  ASSERT_EQ(got.size(), reqs.size());
  const std::string where = "k=" + std::to_string(k) + " lag=" + std::to_string(lag) + " on " + pc.to_string();
  for (std::uint64_t id = 0; id < reqs.size(); ++id) expect_same(ref.outputs.at(id), got.at(id), where);
  EXPECT_EQ(computed_tokens(*e.engine), expected_computed) << where << ": only positions after r are computed";
  EXPECT_EQ(e.engine->kv_io().stats().restored_tokens, static_cast<std::uint64_t>(expected_restored)) << where;
  // The KV the resumed engine computed (positions >= r) is bit-identical to
  // the reference's: restored and recomputed KV are interchangeable.
  for (std::uint64_t id = 0; id < reqs.size(); ++id) {
    const int r = restored_at[id];
    const int end = static_cast<int>(reqs[id].prompt.size() + got.at(id).token_ids.size()) - 1;
    const int last_streamed = recomputed[id]->end;  // the final step's KV is not streamed (it finished)
    if (last_streamed <= r) continue;
    const kvstore::KvRange range{0, shape.num_layers, r, std::min(end, last_streamed)};
    std::vector<std::byte> a(kvstore::chunk_bytes(shape, range)), b(a.size());
    // Positions below r of `recomputed` were never written (zero): compare r.. only.
    ASSERT_TRUE(kvstore::copy_out(shape, std::span(&ref.tiers.at(id)->view, 1), ref.tiers.at(id)->table, range, a).ok());
    ASSERT_TRUE(kvstore::copy_out(shape, std::span(&recomputed[id]->view, 1), recomputed[id]->table, range, b).ok());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size()), 0) << where << " request " << id;
  }
}

TEST_F(KvResumeGolden, ResumeFromLastReplicatedTokenIsByteIdentical) {
  const Reference ref = run_reference(reqs_);
  for (int k : {1, 9, 25}) resume_all(reqs_, ref, k, /*lag=*/0, {});
}

TEST_F(KvResumeGolden, ResumeWithReplicationLagRecomputesOnlyTheTail) {
  const Reference ref = run_reference(reqs_);
  resume_all(reqs_, ref, 20, /*lag=*/5, {});
}

TEST_F(KvResumeGolden, ResumeWithoutKvRecomputesPromptPlusOutput) {
  const Reference ref = run_reference(reqs_);
  resume_all(reqs_, ref, 12, /*lag=*/1000, {});  // r = 0: the recompute fallback
}

TEST_F(KvResumeGolden, ResumeOnAnotherLayoutPipelineAndSequenceParallel) {
  // stories260K: 8 query heads, 4 KV heads, 5 layers. pp=2 splits the layers
  // 3+2; sp=2 gives each rank 2 KV heads. Both are bit-identical to one device.
  const Reference ref = run_reference(reqs_);
  resume_all(reqs_, ref, 10, 0, ParallelConfig{.tp = 1, .pp = 2, .sp = 1, .dp = 1});
  resume_all(reqs_, ref, 10, 0, ParallelConfig{.tp = 1, .pp = 1, .sp = 2, .dp = 1});
}

TEST_F(KvResumeGolden, TensorParallelGroupResumesOnItsOwnLayout) {
  // tp=2 rounds differently from one device (partial sums): resume within
  // the tp=2 layout, as a cluster of tp=2 workers does.
  const ParallelConfig tp2{.tp = 2, .pp = 1, .sp = 1, .dp = 1};
  const Reference ref = run_reference(reqs_, tp2);
  resume_all(reqs_, ref, 15, 0, tp2);
}

TEST_F(KvResumeGolden, BackpressureStreamsCatchUpIncrementsWithoutLosingKv) {
  // A sink that accepts after every fourth step only: the engine never
  // blocks, keeps the KV in its cache meanwhile and later hands over one
  // increment from the last streamed position. The merged KV equals what
  // an always-accepting sink got, and every increment's token ids are the
  // request's tokens at those positions.
  const Reference ref = run_reference(reqs_);
  EngineInstance e = make_engine();
  std::map<std::uint64_t, std::unique_ptr<HostTier>> tiers;
  for (std::uint64_t id = 0; id < reqs_.size(); ++id) tiers[id] = std::make_unique<HostTier>(e.executor->kv_model_shape());
  TierSink slow;
  slow.tiers = &tiers;
  slow.accept_every = 4;
  e.engine->set_kv_sink(&slow);
  for (std::uint64_t id = 0; id < reqs_.size(); ++id)
    ASSERT_TRUE(e.engine->add_request(id, reqs_[id].prompt, reqs_[id].params).ok());
  auto out = run_all(*e.engine);
  int multi_token_decode_catchups = 0;
  for (std::size_t i = 0; i < slow.tokens.size(); ++i) {
    const auto& [id, toks] = slow.tokens[i];
    std::vector<std::int32_t> all = reqs_[id].prompt;
    all.insert(all.end(), out.at(id).token_ids.begin(), out.at(id).token_ids.end());
    const int b = slow.begins[i];
    ASSERT_LE(b + toks.size(), all.size());
    EXPECT_TRUE(std::equal(toks.begin(), toks.end(), all.begin() + b)) << "request " << id << " at " << b;
    if (b >= static_cast<int>(reqs_[id].prompt.size()) && toks.size() > 2) ++multi_token_decode_catchups;
  }
  EXPECT_GT(multi_token_decode_catchups, 0) << "decode increments were merged while the sink refused";
  for (std::uint64_t id = 0; id < reqs_.size(); ++id) {
    const int covered = tiers[id]->covered;
    EXPECT_EQ(covered, tiers[id]->end) << "no gap";
    EXPECT_GT(covered, static_cast<int>(reqs_[id].prompt.size()));
    EXPECT_LE(covered, ref.tiers.at(id)->covered);
    const auto a = ref.tiers.at(id)->prefix(covered);
    const auto b = tiers[id]->prefix(covered);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size()), 0) << "request " << id;
  }
}

TEST_F(KvResumeGolden, BadResumeStatesAreRefusedAndNothingElseIsLost) {
  EngineInstance e = make_engine();
  const kvstore::KvModelShape shape = e.executor->kv_model_shape();
  const auto& req = reqs_[0];
  auto expect_refused = [&](ResumeState rs, const std::string& needle) {
    Status s = e.engine->add_request(99, req.prompt, req.params, std::move(rs));
    ASSERT_FALSE(s.ok()) << needle;
    EXPECT_EQ(s.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(s.error().message.find(needle), std::string::npos) << s.error().message;
  };
  ResumeState wrong_size;
  wrong_size.output_ids = {5, 6};
  wrong_size.num_kv_tokens = 3;
  wrong_size.kv_chunk.resize(kvstore::chunk_bytes(shape, {0, shape.num_layers, 0, 3}) - 1);
  expect_refused(std::move(wrong_size), "does not hold 3 positions");
  ResumeState too_far;
  too_far.output_ids = {5};
  too_far.num_kv_tokens = static_cast<int>(req.prompt.size()) + 1;
  expect_refused(std::move(too_far), "at most the tokens before the last");
  ResumeState finished;
  finished.output_ids.assign(static_cast<std::size_t>(req.params.max_tokens), 5);
  expect_refused(std::move(finished), "it had finished");
  ResumeState bad_id;
  bad_id.output_ids = {100000};
  expect_refused(std::move(bad_id), "outside vocab");
  // The engine still serves a good request, and a refused id is free again.
  ASSERT_TRUE(e.engine->add_request(99, req.prompt, req.params).ok());
  auto out = run_all(*e.engine);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_FALSE(e.engine->kv_io().holds(99));
}

// ---- swap preemption ---------------------------------------------------------------

struct SwapRun {
  std::map<std::uint64_t, RequestOutput> outputs;
  int computed = 0;
  int preemptions = 0;
  KvIoStats io;
};

SwapRun run_oversubscribed(const std::vector<Request>& reqs, PreemptionMode mode, std::uint64_t swap_bytes,
                           ParallelConfig pc = {}) {
  // stories260K KV: 5 layers x 2 x 4 heads x 8 dims x 4 B = 1280 B/token.
  // 12 requests of ~45-50 tokens need ~48 blocks of 16; give them 16.
  EngineInstance e = make_engine(pc, 16ull * 16 * 1280, mode, swap_bytes);
  for (std::uint64_t id = 0; id < reqs.size(); ++id)
    EXPECT_TRUE(e.engine->add_request(id, reqs[id].prompt, reqs[id].params).ok());
  SwapRun r;
  r.outputs = run_all(*e.engine);
  r.computed = computed_tokens(*e.engine);
  r.preemptions = e.engine->scheduler().total_preemptions();
  r.io = e.engine->kv_io().stats();
  EXPECT_EQ(r.io.swap_space_bytes_used, 0u) << "every swapped sequence came back";
  return r;
}

TEST_F(KvResumeGolden, SwapPreemptionMatchesRecomputeAndComputesLess) {
  const Reference ref = run_reference(reqs_);
  const SwapRun rec = run_oversubscribed(reqs_, PreemptionMode::recompute, 64u << 20);
  const SwapRun swp = run_oversubscribed(reqs_, PreemptionMode::swap, 64u << 20);
  ASSERT_GT(rec.preemptions, 0) << "the cache must be oversubscribed";
  ASSERT_GT(swp.preemptions, 0);
  for (std::uint64_t id = 0; id < reqs_.size(); ++id) {
    expect_same(ref.outputs.at(id), rec.outputs.at(id), "recompute");
    expect_same(ref.outputs.at(id), swp.outputs.at(id), "swap");
  }
  EXPECT_EQ(swp.io.swap_outs, static_cast<std::uint64_t>(swp.preemptions));
  EXPECT_EQ(swp.io.swap_ins, swp.io.swap_outs);
  EXPECT_EQ(swp.io.swap_fallbacks, 0u);
  EXPECT_EQ(swp.io.swapped_in_bytes, swp.io.swapped_out_bytes);
  EXPECT_EQ(rec.io.swap_outs, 0u);
  EXPECT_LT(swp.computed, rec.computed) << "swapping recomputes nothing";
}

TEST_F(KvResumeGolden, FullSwapSpaceFallsBackToRecompute) {
  const Reference ref = run_reference(reqs_);
  const SwapRun swp = run_oversubscribed(reqs_, PreemptionMode::swap, /*swap_bytes=*/1);
  ASSERT_GT(swp.preemptions, 0);
  EXPECT_EQ(swp.io.swap_outs, 0u);
  EXPECT_EQ(swp.io.swap_fallbacks, static_cast<std::uint64_t>(swp.preemptions));
  for (std::uint64_t id = 0; id < reqs_.size(); ++id) expect_same(ref.outputs.at(id), swp.outputs.at(id), "fallback");
}

TEST_F(KvResumeGolden, SwapPreemptionOnAPipelineGroup) {
  // pp=2: micro-batches in flight while others are swapped out and in.
  const Reference ref = run_reference(reqs_);
  const SwapRun swp =
      run_oversubscribed(reqs_, PreemptionMode::swap, 64u << 20, ParallelConfig{.tp = 1, .pp = 2, .sp = 1, .dp = 1});
  ASSERT_GT(swp.preemptions, 0);
  EXPECT_GT(swp.io.swap_outs, 0u);
  for (std::uint64_t id = 0; id < reqs_.size(); ++id) expect_same(ref.outputs.at(id), swp.outputs.at(id), "pp=2 swap");
}

}  // namespace
}  // namespace shardline::engine
