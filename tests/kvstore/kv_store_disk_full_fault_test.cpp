// The KV store on a full disk and under its own disk budget (issue 46,
// item 7). The store is a cache: a write it cannot make is refused with
// disk_full and acknowledges nothing, and the store goes on. Before, RocksDB
// refused every later write until the process restarted (its background
// error), and its LOG writer aborted the process on the write after a
// failed one (a 3 MiB tmpfs under --data-dir killed the node);
// `shardline run` on a real full tmpfs is in tests/cli/disk_full_e2e_test.cpp.

#include <gtest/gtest.h>

#include <memory>

#include "kvstore/kv_store.hpp"
#include "tests/kvstore/kv_store_test_util.hpp"
#include "tests/support/full_disk.hpp"

namespace shardline::kvstore {
namespace kvstore_kv_store_disk_full_fault_test {

using shardline::testing_support::DiskSpace;
using shardline::testing_support::FullDiskRocksDbFs;
using testing::chunk_key;
using testing::decode_range;
using testing::make_chunk;
using testing::small_shape;
using testing::TempDir;

Result<int> put_step(KvStore& store, std::uint64_t request, int token) {
  const KvModelShape s = small_shape();
  const KvRange r = decode_range(s, token);
  const auto chunk = make_chunk(s, 1, request, r);
  return store.put(chunk_key(1, request, r), chunk);
}

void expect_prefix(KvStore& store, std::uint64_t request, int tokens) {
  const KvModelShape s = small_shape();
  auto prefix = store.fetch_prefix(1, request, tokens);
  ASSERT_TRUE(prefix.ok()) << prefix.error().to_string();
  ASSERT_EQ(prefix->tokens, tokens);
  EXPECT_EQ(prefix->chunk, make_chunk(s, 1, request, KvRange{0, s.num_layers, 0, tokens}));
}

TEST(KvStoreDiskFull, WritesFailAsDiskFullAndWorkAgainOnceSpaceIsBack) {
  TempDir tmp;
  auto space = std::make_shared<DiskSpace>();
  KvStoreOptions o;
  o.shape = small_shape();
  o.sync = KvSyncPolicy::fsync;
  o.reopen_interval_ms = 0;  // probe for space at every write
  o.file_system = std::make_shared<FullDiskRocksDbFs>(space);
  auto store = KvStore::open(tmp.file("kv"), o);
  ASSERT_TRUE(store.ok()) << store.error().to_string();
  for (int t = 0; t < 4; ++t) ASSERT_EQ(*put_step(**store, 7, t), t + 1);

  space->full = true;
  for (int t = 4; t < 8; ++t) {  // every write fails cleanly: no abort, no ack
    auto ack = put_step(**store, 7, t);
    ASSERT_FALSE(ack.ok());
    EXPECT_EQ(ack.error().code, ErrorCode::disk_full) << ack.error().to_string();
    EXPECT_EQ((*store)->durable_tokens(1, 7), 4);
  }
  expect_prefix(**store, 7, 4);  // reads go on
  auto full_stats = (*store)->stats();
  ASSERT_TRUE(full_stats.ok()) << full_stats.error().to_string();
  EXPECT_EQ(full_stats->refused_writes, 4u);
  EXPECT_EQ(full_stats->reopens, 0u);

  space->full = false;
  for (int t = 4; t < 8; ++t) ASSERT_EQ(*put_step(**store, 7, t), t + 1);
  auto st = (*store)->stats();
  ASSERT_TRUE(st.ok()) << st.error().to_string();
  EXPECT_EQ(st->reopens, 1u);
  EXPECT_EQ(st->refused_writes, 4u);
  expect_prefix(**store, 7, 8);
  store->reset();

  auto again = KvStore::open(tmp.file("kv"), o);  // what was acknowledged is on disk
  ASSERT_TRUE(again.ok()) << again.error().to_string();
  EXPECT_EQ((*again)->durable_tokens(1, 7), 8);
  expect_prefix(**again, 7, 8);
}

TEST(KvStoreDiskFull, TheDiskBudgetRefusesWritesAndDeletedChunksGiveTheirSpaceBack) {
  TempDir tmp;
  const KvModelShape s = small_shape();
  const std::uint64_t step_bytes = make_chunk(s, 1, 1, decode_range(s, 0)).size();
  KvStoreOptions o;
  o.shape = s;
  o.disk_budget_bytes = 6 * step_bytes;
  auto store = KvStore::open(tmp.file("kv"), o);
  ASSERT_TRUE(store.ok()) << store.error().to_string();
  for (int t = 0; t < 4; ++t) ASSERT_TRUE(put_step(**store, 1, t).ok());
  for (int t = 0; t < 2; ++t) ASSERT_TRUE(put_step(**store, 2, t).ok());
  auto over = put_step(**store, 2, 2);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.error().code, ErrorCode::disk_full) << over.error().to_string();
  EXPECT_NE(over.error().message.find("disk budget"), std::string::npos) << over.error().message;
  EXPECT_EQ((*store)->durable_tokens(1, 2), 2);  // nothing counted
  auto st = (*store)->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->disk_budget, 6 * step_bytes);
  EXPECT_EQ(st->refused_writes, 1u);
  EXPECT_EQ(st->chunk_bytes, 6 * step_bytes);

  // Request 1 finishes: its chunks are deleted (the compaction that frees
  // their space runs when the budget needs it) and request 2 goes on.
  ASSERT_TRUE((*store)->drop_request(1, 1).ok());
  for (int t = 2; t < 6; ++t) ASSERT_EQ(*put_step(**store, 2, t), t + 1);
  st = (*store)->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->compactions, 1u);
  EXPECT_EQ(st->chunk_bytes, 6 * step_bytes);
  expect_prefix(**store, 2, 6);
}

// The store leaves disk_reserve_bytes free on its disk for jobs.db and the
// outputs: a cache never takes their last space.
TEST(KvStoreDiskFull, TheReserveKeepsTheLastFreeSpaceForJobsDbAndOutputs) {
  TempDir tmp;
  KvStoreOptions o;
  o.shape = small_shape();
  o.disk_reserve_bytes = 1ull << 60;  // more than any disk has free
  auto store = KvStore::open(tmp.file("kv"), o);
  ASSERT_TRUE(store.ok()) << store.error().to_string();
  auto refused = put_step(**store, 1, 0);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, ErrorCode::disk_full);
  EXPECT_NE(refused.error().message.find("jobs.db and outputs"), std::string::npos) << refused.error().message;
  EXPECT_EQ((*store)->durable_tokens(1, 1), 0);
  store->reset();
  o.disk_reserve_bytes = 0;
  store = KvStore::open(tmp.file("kv"), o);
  ASSERT_TRUE(store.ok());
  EXPECT_EQ(*put_step(**store, 1, 0), 1);
}

// RocksDB's LOG cannot be written (here: RLIMIT_FSIZE stops it, EFBIG, as
// deterministic as a full disk): the store keeps working. RocksDB's own
// logger, in Debian's build with assertions, aborts on the line after a
// failed one (WritableFileWriter::AssertFalseAndGetStatusForPrevError): the
// KV store's heartbeat stats() logs two lines, and a full data dir killed
// the node that way. In a child process, so that the limit and an abort
// stay there.
TEST(KvStoreDiskFull, AnUnwritableRocksDbLogNeverAbortsTheProcess) {
  TempDir tmp;
  const int status = shardline::testing_support::status_of_child([&] {
    KvStoreOptions o;
    o.shape = small_shape();
    o.disk_reserve_bytes = 0;
    auto store = KvStore::open(tmp.file("kv"), o);
    if (!store.ok()) return 3;
    if (!put_step(**store, 1, 0).ok()) return 4;
    // The LOG's next line fails, and so would the line after it.
    if (!shardline::testing_support::stop_files_growing_past(tmp.file("kv/LOG"))) return 5;
    for (int i = 0; i < 20; ++i) (void)(*store)->stats();  // each lists the WAL files: two LOG lines
    return 0;
  });
  ASSERT_TRUE(WIFEXITED(status)) << "the store's process died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace shardline::kvstore
