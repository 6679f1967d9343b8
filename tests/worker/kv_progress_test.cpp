// KvProgressTracker: store acks + streamed tokens -> the resume points the
// orchestrator records. Each report must be a valid engine resume
// (num_kv_tokens <= prompt + output - 1) that never includes a token whose
// KV was not acknowledged.
#include "worker/kv_progress.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace shardline::worker {
namespace worker_kv_progress_test {

constexpr int kLayers = 2;

/// An increment of positions [begin, end) with the tokens at [begin, end + 1).
QueuedIncrement inc(std::uint64_t job, std::uint64_t request, int begin, int end, int num_prompt,
                    std::vector<std::int32_t> tokens) {
  QueuedIncrement q;
  q.key = kvstore::KvChunkKey{job, request, kvstore::KvRange{0, kLayers, begin, end}};
  q.token_ids = std::move(tokens);
  q.num_prompt_tokens = num_prompt;
  return q;
}

TEST(KvProgressTracker, PrefillThenDecodeReportsValidResumes) {
  KvProgressTracker t;
  const std::uint64_t key = kv_request_key(12, 1);
  // Prompt of 4 tokens (10..13) prefilled; the first generated token is 100.
  std::vector<QueuedIncrement> flushed{inc(7, key, 0, 4, 4, {10, 11, 12, 13, 100})};
  std::vector<KvStoreAck> acks{{7, key, 4}};
  auto p = t.on_flushed(flushed, acks);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].job_id, 7u);
  EXPECT_EQ(p[0].line_index, 12u);
  EXPECT_EQ(p[0].choice, 1);
  // Acked [0, 4): no generated token is at a position < 4, so the resume
  // feeds none and restores at most prompt - 1 positions.
  EXPECT_TRUE(p[0].output_ids.empty());
  EXPECT_EQ(p[0].replicated_tokens, 3);

  // Two decode steps: positions 4 (token 100) and 5 (token 101), then 102 sampled.
  flushed = {inc(7, key, 4, 6, 4, {100, 101, 102})};
  acks = {{7, key, 6}};
  p = t.on_flushed(flushed, acks);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].output_ids, (std::vector<std::int32_t>{100, 101}));  // positions 4, 5
  EXPECT_EQ(p[0].replicated_tokens, 5);  // prompt 4 + 2 outputs - 1
  // Token 102 (position 6) is never fed: its KV is not acknowledged.
}

TEST(KvProgressTracker, AckBehindTheStreamAndRepeatsAreNotReported) {
  KvProgressTracker t;
  const std::uint64_t key = kv_request_key(3, 0);
  std::vector<QueuedIncrement> flushed{inc(1, key, 0, 3, 2, {5, 6, 200, 201})};
  std::vector<KvStoreAck> acks{{1, key, 2}};  // the replica holds only the prompt
  auto p = t.on_flushed(flushed, acks);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_TRUE(p[0].output_ids.empty());
  EXPECT_EQ(p[0].replicated_tokens, 1);
  // The same ack again: nothing new.
  EXPECT_TRUE(t.on_flushed({}, acks).empty());
  // Now everything: outputs at positions 2 (200); restore 2 positions.
  acks = {{1, key, 3}};
  p = t.on_flushed({}, acks);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].output_ids, (std::vector<std::int32_t>{200}));
  EXPECT_EQ(p[0].replicated_tokens, 2);
  // A lower ack (a replica replaced) never moves it back.
  acks = {{1, key, 1}};
  EXPECT_TRUE(t.on_flushed({}, acks).empty());
}

TEST(KvProgressTracker, ResumedRequestIsSeededWithItsOutputs) {
  KvProgressTracker t;
  const std::uint64_t key = kv_request_key(9, 0);
  // Resumed with outputs 300, 301 (positions 3, 4 after a 3-token prompt);
  // the new worker streams from position 4 on.
  t.seed(2, key, {300, 301});
  std::vector<QueuedIncrement> flushed{inc(2, key, 4, 6, 3, {301, 302, 303})};
  std::vector<KvStoreAck> acks{{2, key, 6}};
  auto p = t.on_flushed(flushed, acks);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].output_ids, (std::vector<std::int32_t>{300, 301, 302}));
  EXPECT_EQ(p[0].replicated_tokens, 5);
}

TEST(KvProgressTracker, AGapInTheKnownTokensLimitsTheReport) {
  KvProgressTracker t;
  const std::uint64_t key = kv_request_key(4, 0);
  // Prompt of 2; an increment of positions [4, 6) arrives but [2, 4) never
  // did (e.g. a resumed request that was not seeded): outputs at positions
  // 2 and 3 are unknown, so nothing past the prompt can be reported.
  std::vector<QueuedIncrement> flushed{inc(5, key, 4, 6, 2, {40, 41, 42})};
  std::vector<KvStoreAck> acks{{5, key, 6}};
  auto p = t.on_flushed(flushed, acks);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_TRUE(p[0].output_ids.empty());
  EXPECT_EQ(p[0].replicated_tokens, 1);
}

TEST(KvProgressTracker, UnknownRequestsAndForgottenOnesAreSkipped) {
  KvProgressTracker t;
  std::vector<KvStoreAck> acks{{1, 77, 10}};
  EXPECT_TRUE(t.on_flushed({}, acks).empty());  // never streamed here
  const std::uint64_t key = kv_request_key(1, 0);
  std::vector<QueuedIncrement> flushed{inc(1, key, 0, 2, 1, {1, 2, 3})};
  (void)t.on_flushed(flushed, {});
  EXPECT_EQ(t.tracked(), 1u);
  t.forget(1, key);
  EXPECT_EQ(t.tracked(), 0u);
  acks = {{1, key, 2}};
  EXPECT_TRUE(t.on_flushed({}, acks).empty());
  (void)t.on_flushed(flushed, {});
  t.seed(2, key, {1});
  t.forget_job(1);
  EXPECT_EQ(t.tracked(), 1u);  // job 2's entry stays
}

TEST(KvProgressTracker, AFinishedChoicesLastTokenIsNeverInItsResume) {
  KvProgressTracker t;
  const std::uint64_t key = kv_request_key(0, 0);
  // max_tokens 3: outputs 7, 8, 9 at positions 2, 3, 4; the KV of position 4
  // (the last token) is never computed, so the last increment covers [2, 4).
  std::vector<QueuedIncrement> flushed{inc(1, key, 0, 2, 2, {1, 2, 7}), inc(1, key, 2, 4, 2, {7, 8, 9})};
  std::vector<KvStoreAck> acks{{1, key, 4}};
  auto p = t.on_flushed(flushed, acks);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].output_ids, (std::vector<std::int32_t>{7, 8}));  // 2 < max_tokens: a valid resume
  EXPECT_EQ(p[0].replicated_tokens, 3);
}

}  // namespace
}  // namespace shardline::worker
