// Seesaw's prefetcher thread (engine/seesaw/kv_mover.hpp, seed 000 §5.2): a
// transfer copies exactly what kvstore::copy_out / copy_in copy, completions
// come back in submission order through poll / wait_any / drain, a paced
// transfer lasts at least its emulated link time (shorter with more
// devices), an asynchronous transfer runs while the caller does something
// else (its time hidden) and a synchronous one is all waited for, the
// caches cannot change under a pending transfer, and bad options are refused.
#include "engine/seesaw/kv_mover.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <numeric>
#include <optional>
#include <thread>
#include <vector>

namespace shardline::engine {
namespace engine_kv_mover_test {

using Clock = std::chrono::steady_clock;

constexpr kvstore::KvModelShape kShape{3, 2, 4, DType::f32};  // 3 layers, 2 KV heads, head_dim 4
constexpr int kBlocks = 6, kBlockSize = 4;

/// One rank holding every layer and head: a cache of kBlocks blocks.
struct Cache {
  std::vector<float> memory;  // [layers, 2, blocks, heads, block_size, head_dim]
  kvstore::KvCacheView view;
  explicit Cache(float first) {
    view.layout = kvstore::KvRankLayout{0, kShape.num_layers, {0, 1}, kBlocks, kBlockSize};
    memory.resize(kvstore::cache_bytes(kShape, view.layout) / sizeof(float));
    std::iota(memory.begin(), memory.end(), first);
    view.data = memory.data();
  }
};

KvMoverOptions options(bool async, std::optional<comm::LinkSpec> link = std::nullopt, int num_devices = 1) {
  KvMoverOptions o;
  o.async = async;
  o.host_link = link;
  o.num_devices = num_devices;
  return o;
}

std::unique_ptr<KvMover> make_mover(KvMoverOptions o, const Cache& cache) {
  auto mover = KvMover::create(std::move(o));
  EXPECT_TRUE(mover.ok()) << mover.error().to_string();
  EXPECT_TRUE((*mover)->set_caches(kShape, {cache.view}).ok());
  return std::move(mover).value();
}

KvTransfer to_host(std::uint64_t id, std::vector<std::int32_t> table, int num_tokens) {
  KvTransfer t;
  t.direction = KvTransfer::Direction::to_host;
  t.seq_id = id;
  t.block_table = std::move(table);
  t.range = {0, kShape.num_layers, 0, num_tokens};
  t.chunk.resize(kvstore::chunk_bytes(kShape, t.range));
  return t;
}

TEST(KvMover, CopiesWhatCopyOutAndCopyInCopyInSubmissionOrder) {
  for (const bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "sync");
    Cache src(1.0f), dst(0.0f);
    std::fill(dst.memory.begin(), dst.memory.end(), 0.0f);
    auto out_mover = make_mover(options(async), src);
    out_mover->submit(to_host(7, {3, 1}, 6));
    out_mover->submit(to_host(8, {5}, 3));
    EXPECT_EQ(out_mover->num_pending(), 2);
    std::vector<KvTransferDone> done = out_mover->drain();
    EXPECT_EQ(out_mover->num_pending(), 0);
    ASSERT_EQ(done.size(), 2u);
    EXPECT_EQ(done[0].transfer.seq_id, 7u);  // one copy stream: in order
    EXPECT_EQ(done[1].transfer.seq_id, 8u);
    for (const KvTransferDone& d : done) {
      ASSERT_TRUE(d.status.ok()) << d.status.error().message;
      std::vector<std::byte> want(d.transfer.chunk.size());
      ASSERT_TRUE(kvstore::copy_out(kShape, std::vector{src.view}, d.transfer.block_table, d.transfer.range, want).ok());
      EXPECT_EQ(std::memcmp(want.data(), d.transfer.chunk.data(), want.size()), 0) << d.transfer.seq_id;
    }

    // Back into other blocks of another cache.
    auto in_mover = make_mover(options(async), dst);
    KvTransfer in;
    in.direction = KvTransfer::Direction::to_device;
    in.seq_id = 7;
    in.block_table = {0, 4};
    in.range = done[0].transfer.range;
    in.chunk = done[0].transfer.chunk;
    in_mover->submit(std::move(in));
    std::vector<KvTransferDone> back = in_mover->drain();
    ASSERT_EQ(back.size(), 1u);
    ASSERT_TRUE(back[0].status.ok());
    std::vector<std::byte> again(done[0].transfer.chunk.size());
    ASSERT_TRUE(kvstore::copy_out(kShape, std::vector{dst.view}, std::vector<std::int32_t>{0, 4}, done[0].transfer.range, again).ok());
    EXPECT_EQ(std::memcmp(again.data(), done[0].transfer.chunk.data(), again.size()), 0);

    const KvMoverStats s = out_mover->stats();
    EXPECT_EQ(s.num_transfers, 2u);
    EXPECT_EQ(s.bytes_to_host, done[0].transfer.chunk.size() + done[1].transfer.chunk.size());
    EXPECT_EQ(s.bytes_to_device, 0u);
    EXPECT_EQ(in_mover->stats().bytes_to_device, done[0].transfer.chunk.size());
  }
}

TEST(KvMover, ABadTableComesBackAsTheCompletionsError) {
  Cache c(1.0f);
  auto mover = make_mover(options(true), c);
  mover->submit(to_host(1, {kBlocks + 3}, 2));  // a block outside the cache
  std::vector<KvTransferDone> done = mover->drain();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_FALSE(done[0].status.ok());
}

TEST(KvMover, APacedTransferLastsItsLinkTimeSplitOverTheDevices) {
  Cache c(1.0f);
  const KvTransfer t = to_host(1, {0, 1, 2}, 12);  // 3 * 2 * 2 * 12 * 4 * 4 = 2304 bytes
  const std::size_t bytes = t.chunk.size();
  ASSERT_EQ(bytes, 2304u);
  const comm::LinkSpec link{0.0001, 1000};  // 100 KB/s + 1 ms
  for (const int devices : {1, 2}) {
    auto mover = make_mover(options(true, link, devices), c);
    mover->submit(t);
    std::vector<KvTransferDone> done = mover->drain();
    ASSERT_EQ(done.size(), 1u);
    const double link_ms = 1.0 + static_cast<double>(bytes) / devices / 1e5 * 1e3;  // 24 ms / devices + 1
    EXPECT_GE(done[0].transfer_ms, link_ms - 0.01) << devices << " devices";
  }
}

TEST(KvMover, AnAsynchronousTransferIsHiddenAndASynchronousOneIsWaitedFor) {
  Cache c(1.0f);
  const comm::LinkSpec link{0.0001, 200000};  // 200 ms + 100 KB/s: ~220 ms for 2 KB

  auto sync = make_mover(options(false, link), c);
  const auto t0 = Clock::now();
  sync->submit(to_host(1, {0, 1, 2}, 12));
  EXPECT_GE(Clock::now() - t0, std::chrono::milliseconds(200));  // submit ran it
  EXPECT_EQ(sync->num_pending(), 1);
  ASSERT_EQ(sync->poll().size(), 1u);
  EXPECT_EQ(sync->stats().wait_ms, sync->stats().transfer_ms);
  EXPECT_EQ(sync->stats().hidden_share(), 0.0);

  auto async = make_mover(options(true, link), c);
  const auto t1 = Clock::now();
  async->submit(to_host(1, {0, 1, 2}, 12));
  EXPECT_LT(Clock::now() - t1, std::chrono::milliseconds(200));  // queued, not run
  EXPECT_EQ(async->num_pending(), 1);
  // "A step" while it moves: the transfer's time passes without a wait.
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  std::vector<KvTransferDone> done = async->drain();
  ASSERT_EQ(done.size(), 1u);
  const KvMoverStats s = async->stats();
  EXPECT_GE(s.transfer_ms, 200.0);
  EXPECT_LT(s.wait_ms, s.transfer_ms);
  EXPECT_GT(s.hidden_share(), 0.0);
  std::printf("  async: transfer %.1f ms, waited %.2f ms, hidden %.0f%%\n", s.transfer_ms, s.wait_ms,
              100 * s.hidden_share());

  EXPECT_TRUE(async->wait_any().empty());  // nothing pending: returns at once
  EXPECT_TRUE(async->poll().empty());
}

TEST(KvMover, TheCachesCannotChangeUnderAPendingTransfer) {
  Cache c(1.0f);
  auto mover = make_mover(options(true, comm::LinkSpec{0.0001, 10000}), c);
  mover->submit(to_host(1, {0}, 2));
  Status busy = mover->set_caches(kShape, {c.view});
  ASSERT_FALSE(busy.ok());
  EXPECT_EQ(busy.error().code, ErrorCode::internal);
  EXPECT_NE(busy.error().message.find("drain"), std::string::npos);
  EXPECT_EQ(mover->drain().size(), 1u);  // the transfer itself is not lost
  EXPECT_TRUE(mover->set_caches(kShape, {c.view}).ok());
}

TEST(KvMover, DestroyingItDropsQueuedTransfers) {
  Cache c(1.0f);
  const auto t0 = Clock::now();
  {
    auto mover = make_mover(options(true, comm::LinkSpec{0.0001, 100000}), c);  // 100 ms each
    for (int i = 0; i < 8; ++i) mover->submit(to_host(static_cast<std::uint64_t>(i), {0}, 2));
  }
  // The running one finishes; the seven queued ones (700 ms) do not run.
  EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(500));
}

TEST(KvMover, BadOptionsAreRefused) {
  auto none = KvMover::create(options(true, std::nullopt, 0));
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(none.error().message.find("num_devices"), std::string::npos);
  auto link = KvMover::create(options(true, comm::LinkSpec{-1, 0}));
  ASSERT_FALSE(link.ok());
  EXPECT_EQ(link.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(link.error().message.find("host link"), std::string::npos);
}

}  // namespace
}  // namespace shardline::engine
