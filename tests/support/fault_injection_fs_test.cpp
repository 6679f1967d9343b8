// The fault-injecting file systems themselves: what survives a simulated
// power cut, and the switch that cuts it.

#include "tests/support/fault_injection_fs.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>

#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/options.h>

#include "orchestrator/job_store.hpp"
#include "tests/orchestrator/temp_dir.hpp"
#include "tests/support/fault_injection_rocksdb_fs.hpp"

namespace shardline::testing_support {
namespace support_fault_injection_fs_test {

using orchestrator::testing::read_file;
using orchestrator::testing::TempDir;
using orchestrator::testing::write_file;

struct Rig {
  TempDir tmp;
  std::shared_ptr<CrashSwitch> power = std::make_shared<CrashSwitch>();
  FaultInjectionFileSystem fs{power};
};

TEST(CrashSwitch, RefusesTheArmedOperationAndEveryLaterOne) {
  CrashSwitch power;
  EXPECT_TRUE(power.admit("op"));
  EXPECT_TRUE(power.admit("op"));
  power.crash_before(4);
  EXPECT_TRUE(power.admit("op"));  // op 3
  EXPECT_FALSE(power.down());
  EXPECT_FALSE(power.admit("op"));  // op 4: the cut
  EXPECT_TRUE(power.down());
  EXPECT_FALSE(power.admit("op"));
  EXPECT_EQ(power.ops(), 4u);
  EXPECT_EQ(power.cut_before(), "op");
  power.power_on();
  EXPECT_FALSE(power.down());
  EXPECT_EQ(power.ops(), 0u);
  EXPECT_TRUE(power.admit("op"));
}

TEST(FaultInjectionFileSystem, DropKeepsOnlyWhatWasSynced) {
  Rig r;
  ASSERT_TRUE(r.fs.sync_dir(r.tmp.path()).ok());
  {
    auto f = r.fs.open_writable(r.tmp.file("a"));
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(r.fs.sync_dir(r.tmp.path()).ok());
    ASSERT_TRUE(f->file->write_at(0, "synced.").ok());
    ASSERT_TRUE(f->file->sync().ok());
    ASSERT_TRUE(f->file->write_at(7, "lost").ok());
    EXPECT_EQ(read_file(r.tmp.file("a")), "synced.lost");
  }
  r.fs.simulate_crash(UnsyncedData::drop);
  EXPECT_EQ(read_file(r.tmp.file("a")), "synced.");
}

TEST(FaultInjectionFileSystem, ZeroKeepsTheSizeButNotTheBytes) {
  Rig r;
  {
    auto f = r.fs.open_writable(r.tmp.file("a"));
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(r.fs.sync_dir(r.tmp.path()).ok());
    ASSERT_TRUE(f->file->write_at(0, "ab").ok());
    ASSERT_TRUE(f->file->sync().ok());
    ASSERT_TRUE(f->file->write_at(2, "cd").ok());
    ASSERT_TRUE(f->file->write_at(0, "X").ok());  // an unsynced overwrite is undone too
  }
  r.fs.simulate_crash(UnsyncedData::zero);
  EXPECT_EQ(read_file(r.tmp.file("a")), std::string("ab\0\0", 4));
}

TEST(FaultInjectionFileSystem, AnUnsyncedTruncationIsUndone) {
  Rig r;
  write_file(r.tmp.file("old"), "0123456789");  // there before: durable
  {
    auto f = r.fs.open_writable(r.tmp.file("old"));
    ASSERT_TRUE(f.ok());
    EXPECT_FALSE(f->created);
    ASSERT_TRUE(f->file->truncate(3).ok());
  }
  r.fs.simulate_crash(UnsyncedData::drop);
  EXPECT_EQ(read_file(r.tmp.file("old")), "0123456789");
}

TEST(FaultInjectionFileSystem, NamesNeedTheirFolderSynced) {
  Rig r;
  // First (syncing tmp makes every name in it durable, the later ones too).
  ASSERT_TRUE(create_directories_durably(r.fs, r.tmp.file("kept/sub")).ok());
  {
    auto f = r.fs.open_writable(r.tmp.file("no_dir_sync"));
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(f->file->write_at(0, "data").ok());
    ASSERT_TRUE(f->file->sync().ok());  // the data, not the name
  }
  ASSERT_TRUE(*r.fs.make_directory(r.tmp.file("d")));
  ASSERT_TRUE(*r.fs.make_directory(r.tmp.file("d/e")));
  ASSERT_TRUE(r.fs.sync_dir(r.tmp.file("d")).ok());  // e is durable in d, d is not in tmp
  r.fs.simulate_crash(UnsyncedData::drop);
  EXPECT_FALSE(std::filesystem::exists(r.tmp.file("no_dir_sync")));
  EXPECT_FALSE(std::filesystem::exists(r.tmp.file("d")));
  EXPECT_TRUE(std::filesystem::is_directory(r.tmp.file("kept/sub")));
}

TEST(FaultInjectionFileSystem, AfterTheCutNothingReachesTheDisk) {
  Rig r;
  auto f = r.fs.open_writable(r.tmp.file("a"));  // op 1
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE(f->file->write_at(0, "one").ok());  // op 2
  r.power->crash_before(3);
  const Status st = f->file->write_at(3, "two");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::io);
  EXPECT_FALSE(f->file->sync().ok());
  EXPECT_FALSE(r.fs.make_directory(r.tmp.file("d")).ok());
  EXPECT_EQ(read_file(r.tmp.file("a")), "one");
  EXPECT_FALSE(std::filesystem::exists(r.tmp.file("d")));
}

// ---- RocksDB ----------------------------------------------------------------

TEST(FaultInjectionRocksDbFs, LosesUnsyncedWritesKeepsSyncedOnes) {
  TempDir tmp;
  auto power = std::make_shared<CrashSwitch>();
  auto fs = std::make_shared<FaultInjectionRocksDbFs>(power);
  std::unique_ptr<rocksdb::Env> env = rocksdb::NewCompositeEnv(fs);
  rocksdb::Options options;
  options.create_if_missing = true;
  options.env = env.get();
  const std::string dir = tmp.file("db");
  {
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(options, dir, &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    rocksdb::WriteOptions sync;
    sync.sync = true;
    ASSERT_TRUE(db->Put(sync, "a", "1").ok());
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), "b", "2").ok());  // not synced
    std::string v;
    ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), "b", &v).ok());
    power->crash_before(power->ops() + 1);  // the power goes now
    ASSERT_FALSE(db->Put(sync, "c", "3").ok());
  }
  fs->simulate_crash();
  power->power_on();
  rocksdb::DB* raw = nullptr;
  ASSERT_TRUE(rocksdb::DB::Open(options, dir, &raw).ok());
  std::unique_ptr<rocksdb::DB> db(raw);
  std::string v;
  ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), "a", &v).ok());
  EXPECT_EQ(v, "1");
  EXPECT_TRUE(db->Get(rocksdb::ReadOptions(), "b", &v).IsNotFound());
  EXPECT_TRUE(db->Get(rocksdb::ReadOptions(), "c", &v).IsNotFound());
}

TEST(FaultInjectionRocksDbFs, JobStoreCommitsSurviveTheCut) {
  TempDir tmp;
  auto power = std::make_shared<CrashSwitch>();
  auto fs = std::make_shared<FaultInjectionRocksDbFs>(power);
  orchestrator::JobStoreOptions options;
  options.file_system = fs;
  std::uint64_t job = 0;
  {
    auto store = orchestrator::JobStore::open(tmp.file("db"), options);
    ASSERT_TRUE(store.ok()) << store.error().to_string();
    orchestrator::JobRecord rec;
    rec.total_lines = 2;
    job = *(*store)->create_job(rec);
    ASSERT_TRUE((*store)->put_result(job, orchestrator::StoredResult{1, "line one", true, 1, 1}).ok());
    ASSERT_TRUE((*store)->set_output_progress(job, orchestrator::OutputProgress{0, 0}).ok());
    power->crash_before(power->ops() + 1);
    EXPECT_FALSE((*store)->put_result(job, orchestrator::StoredResult{0, "line zero", true, 1, 1}).ok());
  }
  fs->simulate_crash();
  power->power_on();
  auto store = orchestrator::JobStore::open(tmp.file("db"), options);
  ASSERT_TRUE(store.ok()) << store.error().to_string();
  EXPECT_TRUE((*store)->get_job(job).ok());
  EXPECT_EQ(**(*store)->get_result(job, 1), "line one");
  EXPECT_FALSE((*store)->get_result(job, 0)->has_value());
  EXPECT_EQ(*(*store)->count_results(job), 1u);
}

}  // namespace
}  // namespace shardline::testing_support
