// What a KvStore's acknowledgements survive, per sync policy:
//  - a process crash: a child process writes chunks, reports each ack over a
//    pipe and is killed with SIGKILL; the parent reopens the store;
//  - a power loss: RocksDB runs on a FaultInjectionRocksDbFs
//    (tests/support/) that throws away every write not yet synced when the
//    power goes. With `fsync` the power is cut before every file operation
//    of a store's life in turn; after each cut every acknowledged position
//    must be readable, with the bytes written, from the reopened store.
//    With `wal` and `none` the test shows that acknowledged chunks do
//    vanish (docs/kv-store.md).
// In every case the reopened store acknowledges only positions it can
// return, bit for bit (recovery never uses KV the store does not have).

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <map>
#include <memory>

#include "kvstore/kv_store.hpp"
#include "tests/kvstore/kv_store_test_util.hpp"
#include "tests/support/fault_injection_rocksdb_fs.hpp"

namespace shardline::kvstore {
namespace kvstore_kv_store_fault_test {

using shardline::testing_support::CrashSwitch;
using shardline::testing_support::FaultInjectionRocksDbFs;
using testing::chunk_key;
using testing::decode_range;
using testing::make_chunk;
using testing::small_shape;
using testing::TempDir;

using RequestKey = std::pair<std::uint64_t, std::uint64_t>;
using Acks = std::map<RequestKey, int>;

/// The chunks of three requests as workers stream them: a prefill layer
/// pair by layer pair, decode steps (one out of order), a resend that
/// overlaps (a recovered worker), interleaved across requests.
std::vector<KvChunkKey> workload() {
  const KvModelShape s = small_shape();
  std::vector<KvChunkKey> w;
  w.push_back(chunk_key(1, 10, KvRange{0, 2, 0, 6}));
  w.push_back(chunk_key(1, 11, KvRange{0, 4, 0, 4}));
  w.push_back(chunk_key(1, 10, KvRange{2, 4, 0, 6}));
  w.push_back(chunk_key(2, 3, decode_range(s, 1)));
  w.push_back(chunk_key(2, 3, decode_range(s, 0)));
  for (int t = 0; t < 6; ++t) {
    w.push_back(chunk_key(1, 10, decode_range(s, 6 + t)));
    w.push_back(chunk_key(1, 11, decode_range(s, 4 + t)));
    if (t == 3) w.push_back(chunk_key(1, 11, KvRange{0, 4, 2, 8}));
    w.push_back(chunk_key(2, 3, decode_range(s, 2 + t)));
  }
  return w;
}

KvStoreOptions store_options(KvSyncPolicy sync, std::shared_ptr<rocksdb::FileSystem> fs = nullptr) {
  KvStoreOptions o;
  o.shape = small_shape();
  o.sync = sync;
  o.file_system = std::move(fs);
  return o;
}

/// Records the largest ack seen of each request of the workload.
void note_acks(const KvStore& s, Acks& acked) {
  for (const auto& k : workload()) {
    int& a = acked[{k.job_id, k.request_id}];
    a = std::max(a, s.durable_tokens(k.job_id, k.request_id));
  }
}

/// The reopened store acknowledges at least `acked` and returns exactly the
/// written bytes for every position it acknowledges.
void expect_acked_survived(KvStore& s, const Acks& acked, bool must_keep) {
  for (const auto& [id, a] : acked) {
    const int durable = s.durable_tokens(id.first, id.second);
    if (must_keep) {
      EXPECT_GE(durable, a) << "request " << id.second << ": acked " << a << " positions, " << durable << " survived";
    }
    auto p = s.fetch_prefix(id.first, id.second, 1 << 20);
    ASSERT_TRUE(p.ok()) << p.error().to_string();
    ASSERT_EQ(p->tokens, durable);
    EXPECT_TRUE(p->chunk ==
                make_chunk(s.options().shape, id.first, id.second, KvRange{0, s.options().shape.num_layers, 0, durable}))
        << "request " << id.second << ": the restored KV differs from what was written";
  }
}

// ---- process crash: kill -9 of a child process that owns the store ------------

/// Runs the workload in a child process with `sync`, reading each ack from
/// it, kills it with SIGKILL once it is done, and returns the acks.
Acks write_then_kill_9(const std::string& dir, KvSyncPolicy sync) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    auto s = KvStore::open(dir, store_options(sync));
    if (!s.ok()) ::_exit(2);
    for (const auto& k : workload()) {
      auto ack = (*s)->put(k, make_chunk(small_shape(), k.job_id, k.request_id, k.range));
      if (!ack.ok()) ::_exit(3);
      const std::int64_t msg[3] = {static_cast<std::int64_t>(k.job_id), static_cast<std::int64_t>(k.request_id), *ack};
      if (::write(fds[1], msg, sizeof msg) != static_cast<ssize_t>(sizeof msg)) ::_exit(4);
    }
    const std::int64_t done[3] = {-1, -1, -1};
    if (::write(fds[1], done, sizeof done) != static_cast<ssize_t>(sizeof done)) ::_exit(4);
    for (;;) ::pause();  // the store stays open: the kill finds it mid-life
  }
  ::close(fds[1]);
  Acks acked;
  bool done = false;
  std::int64_t msg[3];
  while (::read(fds[0], msg, sizeof msg) == static_cast<ssize_t>(sizeof msg)) {
    if (msg[0] == -1) {
      done = true;
      break;
    }
    int& a = acked[{static_cast<std::uint64_t>(msg[0]), static_cast<std::uint64_t>(msg[1])}];
    a = std::max(a, static_cast<int>(msg[2]));
  }
  ::close(fds[0]);
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(done) << "the child failed (status " << status << ")";
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  return acked;
}

TEST(KvStoreProcessCrash, Kill9KeepsEveryAckWithWalAndFsync) {
  for (const KvSyncPolicy sync : {KvSyncPolicy::wal, KvSyncPolicy::fsync}) {
    SCOPED_TRACE(kv_sync_policy_name(sync));
    TempDir tmp;
    const Acks acked = write_then_kill_9(tmp.file("kv"), sync);
    ASSERT_EQ(acked.size(), 3u);
    EXPECT_EQ(acked.at({1, 10}), 12);
    auto s = KvStore::open(tmp.file("kv"), store_options(sync));
    ASSERT_TRUE(s.ok()) << s.error().to_string();
    expect_acked_survived(**s, acked, true);
  }
}

// `none` acks "in this process's memory" (the memtable; no WAL): kill -9
// loses every chunk not yet flushed to an SST, here all of them. With
// replication factor 2 the replica's copy is what survives (docs/kv-store.md).
TEST(KvStoreProcessCrash, Kill9LosesNoneAcksButNeverAcksWhatItLacks) {
  TempDir tmp;
  const Acks acked = write_then_kill_9(tmp.file("kv"), KvSyncPolicy::none);
  ASSERT_EQ(acked.at({1, 10}), 12);
  auto s = KvStore::open(tmp.file("kv"), store_options(KvSyncPolicy::none));
  ASSERT_TRUE(s.ok()) << s.error().to_string();
  for (const auto& [id, a] : acked) EXPECT_EQ((*s)->durable_tokens(id.first, id.second), 0);
  expect_acked_survived(**s, acked, false);
}

// ---- power loss: unsynced writes dropped ------------------------------------

/// One simulated machine: its power switch and RocksDB's file system on it.
struct Machine {
  std::shared_ptr<CrashSwitch> power = std::make_shared<CrashSwitch>();
  std::shared_ptr<FaultInjectionRocksDbFs> fs = std::make_shared<FaultInjectionRocksDbFs>(power);
  /// After the store is gone: what a reboot finds, then power on.
  void reboot() {
    fs->simulate_crash();
    power->power_on();
  }
};

/// One life of a store: opens it and streams the workload; every ack (and
/// the coverage after a failed write, which must not have moved) goes into
/// `acked`. Returns false when the power went.
bool live(const std::string& dir, const KvStoreOptions& o, const CrashSwitch& power, Acks& acked) {
  auto opened = KvStore::open(dir, o);
  if (!opened.ok()) {
    EXPECT_TRUE(power.down()) << opened.error().to_string();
    return false;
  }
  KvStore& s = **opened;
  for (const auto& k : workload()) {
    auto ack = s.put(k, make_chunk(o.shape, k.job_id, k.request_id, k.range));
    note_acks(s, acked);
    if (!ack.ok()) {
      EXPECT_TRUE(power.down()) << ack.error().to_string();
      return false;
    }
    EXPECT_EQ(*ack, s.durable_tokens(k.job_id, k.request_id));
  }
  return !power.down();
}

TEST(KvStorePowerLoss, FsyncKeepsEveryAckWhereverThePowerGoes) {
  TempDir tmp;
  std::uint64_t life_ops = 0;
  {
    Machine m;
    Acks acked;
    ASSERT_TRUE(live(tmp.file("count"), store_options(KvSyncPolicy::fsync, m.fs), *m.power, acked));
    life_ops = m.power->ops();
    EXPECT_EQ(acked.at({1, 10}), 12);
    EXPECT_EQ(acked.at({1, 11}), 10);
    EXPECT_EQ(acked.at({2, 3}), 8);
  }
  ASSERT_GT(life_ops, 2 * workload().size());  // at least an append and a sync per write
  int lost_writes = 0;
  for (std::uint64_t cut = 1; cut <= life_ops + 1; ++cut) {
    SCOPED_TRACE("power cut before operation " + std::to_string(cut) + " of " + std::to_string(life_ops));
    const std::string dir = tmp.file("cut" + std::to_string(cut));
    Machine m;
    Acks acked;
    m.power->crash_before(cut);
    const KvStoreOptions o = store_options(KvSyncPolicy::fsync, m.fs);
    if (!live(dir, o, *m.power, acked)) ++lost_writes;
    const std::string first_cut = m.power->cut_before();
    m.reboot();
    {
      auto s = KvStore::open(dir, o);
      ASSERT_TRUE(s.ok()) << "cut before " << first_cut << ": " << s.error().to_string();
      expect_acked_survived(**s, acked, true);
      ASSERT_FALSE(::testing::Test::HasFailure()) << "cut before: " << first_cut;
    }
    // A second life (the workload resent, as a recovered worker does) is cut
    // early too, while it reopens the store or writes its first chunks.
    m.power->power_on();
    m.power->crash_before(1 + (cut * 7) % 30);
    live(dir, o, *m.power, acked);
    const std::string second_cut = m.power->cut_before();
    m.reboot();
    auto s = KvStore::open(dir, o);
    ASSERT_TRUE(s.ok()) << "second cut before " << second_cut << ": " << s.error().to_string();
    expect_acked_survived(**s, acked, true);
    ASSERT_FALSE(::testing::Test::HasFailure()) << "cut before: " << first_cut << ", then before: " << second_cut;
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  EXPECT_GT(lost_writes, static_cast<int>(workload().size()));  // cuts landed in opens and writes
}

/// Streams the workload, then the power goes while the store is open.
Acks write_then_cut_power(const std::string& dir, Machine& m, KvSyncPolicy sync) {
  Acks acked;
  {
    auto s = KvStore::open(dir, store_options(sync, m.fs));
    EXPECT_TRUE(s.ok()) << s.error().to_string();
    if (!s.ok()) return acked;
    for (const auto& k : workload()) {
      auto ack = (*s)->put(k, make_chunk(small_shape(), k.job_id, k.request_id, k.range));
      EXPECT_TRUE(ack.ok()) << ack.error().to_string();
    }
    note_acks(**s, acked);
    m.power->crash_before(m.power->ops() + 1);  // the next operation (closing included) finds no power
  }
  m.reboot();
  return acked;
}

// `wal` and `none` acknowledge before anything is synced: a power loss (or
// an OS crash) takes every chunk not yet in a synced SST or WAL, acked or
// not. That is their documented price; replication factor 2 covers the
// loss of one node, not a power loss of every node at once.
TEST(KvStorePowerLoss, WalAndNoneLoseAckedChunksButNeverAckWhatTheyLack) {
  for (const KvSyncPolicy sync : {KvSyncPolicy::wal, KvSyncPolicy::none}) {
    SCOPED_TRACE(kv_sync_policy_name(sync));
    TempDir tmp;
    Machine m;
    const Acks acked = write_then_cut_power(tmp.file("kv"), m, sync);
    ASSERT_EQ(acked.at({1, 10}), 12);
    auto s = KvStore::open(tmp.file("kv"), store_options(sync, m.fs));
    ASSERT_TRUE(s.ok()) << s.error().to_string();
    int kept = 0, acked_total = 0;
    for (const auto& [id, a] : acked) {
      kept += (*s)->durable_tokens(id.first, id.second);
      acked_total += a;
    }
    std::printf("%s: %d acknowledged positions before the power loss, %d after\n", kv_sync_policy_name(sync),
                acked_total, kept);
    EXPECT_LT(kept, acked_total) << "expected the unsynced chunks to be lost";
    expect_acked_survived(**s, acked, false);
  }
}

// The same store, closed and reopened without losing the unsynced bytes (a
// process crash leaves them with the kernel): every `wal` ack is there. (A
// clean close also flushes the memtable, so this passes even without a WAL;
// the kill -9 test above is the one that needs the WAL.)
TEST(KvStorePowerLoss, WalKeepsEveryAckWhenOnlyTheProcessStops) {
  TempDir tmp;
  Machine m;
  Acks acked;
  ASSERT_TRUE(live(tmp.file("kv"), store_options(KvSyncPolicy::wal, m.fs), *m.power, acked));
  auto s = KvStore::open(tmp.file("kv"), store_options(KvSyncPolicy::wal, m.fs));
  ASSERT_TRUE(s.ok()) << s.error().to_string();
  expect_acked_survived(**s, acked, true);
}

}  // namespace
}  // namespace shardline::kvstore
