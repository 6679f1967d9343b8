#include "worker/kv_streamer.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>

#include "kvstore/kv_targets.hpp"

namespace shardline::worker {
namespace worker_kv_streamer_test {

/// A target that can be held shut (flush_batch waits until opened) and made
/// to fail its next N flushes; everything else goes to a MemoryKvTarget.
class GatedTarget final : public kvstore::KvTarget {
 public:
  kvstore::MemoryKvTarget memory;
  std::atomic<int> fail_next{0};
  std::atomic<int> calls{0};

  void close() {
    std::lock_guard<std::mutex> l(mu_);
    open_ = false;
  }
  void open() {
    {
      std::lock_guard<std::mutex> l(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  /// Waits until a flush_batch call is blocked on the gate.
  void wait_blocked() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [this] { return waiting_ > 0; });
  }
  Status flush(const kvstore::KvChunkKey& key, std::span<const std::byte> chunk) override {
    return memory.flush(key, chunk);
  }
  Result<std::vector<std::byte>> fetch(const kvstore::KvChunkKey& key) override { return memory.fetch(key); }
  Status flush_batch(std::span<const kvstore::KvChunkRef> chunks, std::span<const std::byte> buffer) override {
    ++calls;
    {
      std::unique_lock<std::mutex> l(mu_);
      ++waiting_;
      cv_.notify_all();
      cv_.wait(l, [this] { return open_; });
      --waiting_;
    }
    if (fail_next > 0) {
      --fail_next;
      return make_error(ErrorCode::io, "store restarting");
    }
    return memory.flush_batch(chunks, buffer);
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = true;
  int waiting_ = 0;
};

QueuedIncrement increment(std::uint64_t job, std::uint64_t request, int begin, int end, std::size_t bytes) {
  QueuedIncrement inc;
  inc.key = {job, request, kvstore::KvRange{0, 2, begin, end}};
  inc.chunk.resize(bytes);
  for (std::size_t i = 0; i < bytes; ++i) inc.chunk[i] = static_cast<std::byte>((request * 31 + begin + i) & 0xff);
  for (int p = begin; p <= end; ++p) inc.token_ids.push_back(p * 10);
  inc.num_prompt_tokens = 3;
  return inc;
}

TEST(KvStreamer, FlushesEveryIncrementInOrderAndReportsIt) {
  auto target = std::make_shared<GatedTarget>();
  std::vector<kvstore::KvChunkKey> reported;
  std::mutex mu;
  KvStreamer streamer(target, {}, [&](std::vector<QueuedIncrement> flushed) {
    std::lock_guard<std::mutex> l(mu);
    for (const auto& inc : flushed) {
      EXPECT_TRUE(inc.chunk.empty()) << "chunks are released before the report";
      EXPECT_EQ(inc.token_ids.size(), static_cast<std::size_t>(inc.key.range.num_tokens() + 1));
      reported.push_back(inc.key);
    }
  });
  for (int t = 0; t < 20; ++t) streamer.push(increment(1, 7, t, t + 1, 64));
  ASSERT_TRUE(streamer.drain(std::chrono::seconds(10)));
  const KvStreamerStats s = streamer.stats();
  EXPECT_EQ(s.pushed, 20u);
  EXPECT_EQ(s.flushed, 20u);
  EXPECT_EQ(s.flushed_bytes, 20u * 64);
  EXPECT_EQ(s.queued_bytes, 0u);
  std::lock_guard<std::mutex> l(mu);
  ASSERT_EQ(reported.size(), 20u);
  for (int t = 0; t < 20; ++t) {
    EXPECT_EQ(reported[static_cast<std::size_t>(t)].range.token_begin, t) << "in push order";
    auto got = target->memory.fetch(reported[static_cast<std::size_t>(t)]);
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(*got, increment(1, 7, t, t + 1, 64).chunk);
  }
}

TEST(KvStreamer, BackpressureWithoutBlockingThenOneBatch) {
  auto target = std::make_shared<GatedTarget>();
  KvStreamer streamer(target, KvStreamerOptions{.max_queued_bytes = 1000});
  target->close();
  streamer.push(increment(1, 1, 0, 1, 100));
  target->wait_blocked();  // the first batch is held at the store
  // The step loop keeps pushing (push never waits for the store) until the
  // streamer stops accepting: the engine then keeps its KV in the cache.
  int pushed = 1;
  while (streamer.accepting()) streamer.push(increment(1, 1, pushed, pushed + 1, 100)), ++pushed;
  EXPECT_EQ(pushed, 11) << "1000 bytes accepted, the 11th push went over";
  EXPECT_FALSE(streamer.accepting());
  EXPECT_EQ(streamer.stats().queued_bytes, 1100u);
  target->open();
  ASSERT_TRUE(streamer.drain(std::chrono::seconds(10)));
  EXPECT_TRUE(streamer.accepting());
  const KvStreamerStats s = streamer.stats();
  EXPECT_EQ(s.flushed, 11u);
  EXPECT_EQ(s.batches, 2u) << "what queued behind the held batch went as one buffered batch";
  EXPECT_EQ(s.max_queued_bytes_seen, 1100u);
}

TEST(KvStreamer, FailedFlushesAreRetriedInOrder) {
  auto target = std::make_shared<GatedTarget>();
  target->fail_next = 3;
  KvStreamer streamer(target, KvStreamerOptions{.retry_interval = std::chrono::milliseconds(5)});
  for (int t = 0; t < 5; ++t) streamer.push(increment(2, 3, t, t + 1, 32));
  ASSERT_TRUE(streamer.drain(std::chrono::seconds(10)));
  const KvStreamerStats s = streamer.stats();
  EXPECT_EQ(s.failed_flushes, 3u);
  EXPECT_EQ(s.flushed, 5u);
  for (int t = 0; t < 5; ++t) EXPECT_TRUE(target->memory.fetch({2, 3, kvstore::KvRange{0, 2, t, t + 1}}).ok()) << t;
}

TEST(KvStreamer, ForgetRequestDropsOnlyItsQueuedIncrements) {
  auto target = std::make_shared<GatedTarget>();
  KvStreamer streamer(target);
  target->close();
  streamer.push(increment(1, 1, 0, 1, 10));
  target->wait_blocked();
  streamer.push(increment(1, 2, 0, 1, 10));
  streamer.push(increment(1, 1, 1, 2, 10));
  streamer.push(increment(2, 2, 0, 1, 10));
  streamer.push(increment(1, 2, 1, 2, 10));
  EXPECT_EQ(streamer.forget_request(1, 2), 2u);
  EXPECT_EQ(streamer.forget_request(1, 2), 0u);
  EXPECT_EQ(streamer.stats().queued_bytes, 30u) << "the held batch and two survivors";
  target->open();
  ASSERT_TRUE(streamer.drain(std::chrono::seconds(10)));
  EXPECT_TRUE(target->memory.fetch({1, 1, kvstore::KvRange{0, 2, 1, 2}}).ok());
  EXPECT_TRUE(target->memory.fetch({2, 2, kvstore::KvRange{0, 2, 0, 1}}).ok());
  EXPECT_FALSE(target->memory.fetch({1, 2, kvstore::KvRange{0, 2, 0, 1}}).ok());
  EXPECT_EQ(streamer.stats().forgotten, 2u);
}

// A batch is one message to the store, which refuses those over 64 MiB: the
// streamer sends at most max_batch_bytes per flush_batch (one increment at
// least), and splits an increment larger than that by layers, each part
// with the same positions and token ids and its layers' bytes.
TEST(KvStreamer, BatchesStayUnderTheirBoundAndALargeIncrementIsSplitByLayers) {
  auto target = std::make_shared<GatedTarget>();
  std::vector<kvstore::KvChunkKey> reported;
  std::mutex mu;
  KvStreamerOptions o;
  o.max_batch_bytes = 100;
  KvStreamer streamer(target, o, [&](std::vector<QueuedIncrement> flushed) {
    std::lock_guard<std::mutex> l(mu);
    for (const auto& inc : flushed) {
      EXPECT_EQ(inc.token_ids.size(), 3u);
      reported.push_back(inc.key);
    }
  });
  target->close();
  for (int t = 0; t < 3; ++t) streamer.push(increment(1, 7, 2 * t, 2 * t + 2, 64));  // 2 layers of 32 bytes
  const QueuedIncrement big = increment(1, 8, 0, 2, 256);                              // 2 layers of 128 bytes
  streamer.push(big);
  target->open();
  ASSERT_TRUE(streamer.drain(std::chrono::seconds(10)));
  EXPECT_EQ(target->calls.load(), 5) << "64 | 64 | 64 | 128 | 128: no batch of two fits 100 bytes";
  const KvStreamerStats s = streamer.stats();
  EXPECT_EQ(s.pushed, 5u);
  EXPECT_EQ(s.flushed_bytes, 3u * 64u + 256u);
  std::lock_guard<std::mutex> l(mu);
  ASSERT_EQ(reported.size(), 5u);
  for (int layer = 0; layer < 2; ++layer) {
    const kvstore::KvChunkKey part{1, 8, kvstore::KvRange{layer, layer + 1, 0, 2}};
    EXPECT_EQ(reported[3 + static_cast<std::size_t>(layer)], part);
    auto bytes = target->memory.fetch(part);
    ASSERT_TRUE(bytes.ok()) << "layer " << layer;
    EXPECT_TRUE(std::equal(bytes->begin(), bytes->end(), big.chunk.begin() + layer * 128)) << "layer " << layer;
  }
}

// One layer still over the bound is split by positions, each part taking
// its positions from every (K|V, head) row.
TEST(KvStreamer, ASingleLayerOverTheBoundIsSplitByPositions) {
  auto target = std::make_shared<GatedTarget>();
  KvStreamerOptions o;
  o.max_batch_bytes = 40;
  o.num_kv_heads = 2;  // 4 rows
  std::mutex mu;
  std::map<int, std::vector<std::int32_t>> ids;  // token_begin -> token ids reported
  KvStreamer streamer(target, o, [&](std::vector<QueuedIncrement> flushed) {
    std::lock_guard<std::mutex> l(mu);
    for (const auto& part : flushed) ids[part.key.range.token_begin] = part.token_ids;
  });
  QueuedIncrement inc;
  inc.key = {1, 9, kvstore::KvRange{3, 4, 10, 16}};  // layer 3, positions [10, 16)
  inc.chunk.resize(4 * 6 * 4);                        // 4 rows x 6 positions x 4 bytes
  for (std::size_t i = 0; i < inc.chunk.size(); ++i) inc.chunk[i] = static_cast<std::byte>(i);
  for (int p = 10; p <= 16; ++p) inc.token_ids.push_back(p * 10);
  inc.num_prompt_tokens = 12;
  const QueuedIncrement whole = inc;
  streamer.push(std::move(inc));
  ASSERT_TRUE(streamer.drain(std::chrono::seconds(10)));
  EXPECT_EQ(streamer.stats().pushed, 3u) << "2 positions (32 bytes) per part";
  for (int t0 = 0; t0 < 6; t0 += 2) {
    const kvstore::KvChunkKey key{1, 9, kvstore::KvRange{3, 4, 10 + t0, 12 + t0}};
    auto bytes = target->memory.fetch(key);
    ASSERT_TRUE(bytes.ok()) << "positions from " << 10 + t0;
    ASSERT_EQ(bytes->size(), 32u);
    for (std::size_t row = 0; row < 4; ++row)
      for (std::size_t b = 0; b < 8; ++b)
        EXPECT_EQ((*bytes)[row * 8 + b], whole.chunk[(row * 6 + static_cast<std::size_t>(t0)) * 4 + b])
            << "row " << row << " positions from " << 10 + t0;
    std::lock_guard<std::mutex> l(mu);
    EXPECT_EQ(ids[10 + t0], (std::vector<std::int32_t>{(10 + t0) * 10, (11 + t0) * 10, (12 + t0) * 10}))
        << "the part's positions and the next one's token";
  }
}

}  // namespace
}  // namespace shardline::worker
