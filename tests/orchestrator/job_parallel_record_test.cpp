// A job's parallel config and token budget policy: recorded by JobManager
// (canonical form, defaults, refusals), kept across a restart, read as
// defaults from records written before the fields existed, and carried by
// every request handed to workers.
#include <gtest/gtest.h>

#include <rocksdb/db.h>

#include <memory>
#include <string>

#include "orchestrator/job_manager.hpp"
#include "orchestrator/job_store.hpp"
#include "tests/orchestrator/temp_dir.hpp"

namespace shardline::orchestrator {
namespace orchestrator_job_parallel_record_test {

using testing::TempDir;
using testing::write_file;

JobSpec spec_for(const TempDir& tmp, const std::string& out) {
  JobSpec s;
  s.model_dir = "/models/stories260K";
  s.input_paths = {tmp.file("in.jsonl")};
  s.output_path = tmp.file(out);
  return s;
}

void write_input(const TempDir& tmp) {
  write_file(tmp.file("in.jsonl"),
             "{\"prompt\": \"a\", \"max_tokens\": 2}\n{\"prompt\": \"b\", \"max_tokens\": 2}\n"
             "{\"prompt\": \"c\", \"max_tokens\": 2}\n");
}

TEST(JobParallelRecord, SubmitRecordsCanonicalConfigAndPolicy) {
  TempDir tmp;
  write_input(tmp);
  auto m = JobManager::open(tmp.file("data"));
  ASSERT_TRUE(m.ok()) << m.error().to_string();
  JobSpec a = spec_for(tmp, "a.jsonl");
  a.parallel = "pp=2,tp=2";
  a.token_budget = "throttle";
  auto ida = (*m)->submit(a);
  ASSERT_TRUE(ida.ok()) << ida.error().to_string();
  JobSpec b = spec_for(tmp, "b.jsonl");
  b.token_budget = "";
  auto idb = (*m)->submit(b);
  ASSERT_TRUE(idb.ok()) << idb.error().to_string();

  EXPECT_EQ((*m)->job(*ida)->spec.parallel, "tp=2,pp=2,sp=1,dp=1");
  EXPECT_EQ((*m)->job(*ida)->spec.token_budget, "throttle");
  EXPECT_EQ((*m)->job(*idb)->spec.parallel, "");
  EXPECT_EQ((*m)->job(*idb)->spec.token_budget, "fixed");

  // Every request carries its job's policy, requeued ones too.
  auto work = (*m)->next_work(100, "w0");
  ASSERT_EQ(work.size(), 6u);
  for (const auto& r : work) EXPECT_EQ(r.token_budget, r.job_id == *ida ? "throttle" : "fixed") << r.job_id;
  EXPECT_EQ((*m)->requeue_in_flight("w0"), 6u);
  work = (*m)->next_work(100, "w1");
  ASSERT_EQ(work.size(), 6u);
  for (const auto& r : work) EXPECT_EQ(r.token_budget, r.job_id == *ida ? "throttle" : "fixed") << r.job_id;

  // Kept across a restart.
  m->reset();
  auto again = JobManager::open(tmp.file("data"));
  ASSERT_TRUE(again.ok()) << again.error().to_string();
  EXPECT_EQ((*again)->job(*ida)->spec.parallel, "tp=2,pp=2,sp=1,dp=1");
  EXPECT_EQ((*again)->job(*ida)->spec.token_budget, "throttle");
  work = (*again)->next_work(100, "w2");
  ASSERT_EQ(work.size(), 6u);
  for (const auto& r : work) EXPECT_EQ(r.token_budget, r.job_id == *ida ? "throttle" : "fixed") << r.job_id;
}

TEST(JobParallelRecord, BadPolicyOrConfigIsRefusedAndCreatesNoJob) {
  TempDir tmp;
  write_input(tmp);
  auto m = JobManager::open(tmp.file("data"));
  ASSERT_TRUE(m.ok()) << m.error().to_string();
  JobSpec a = spec_for(tmp, "a.jsonl");
  a.token_budget = "eager";
  auto r = (*m)->submit(a);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(r.error().message.find("'eager'"), std::string::npos) << r.error().message;
  JobSpec b = spec_for(tmp, "b.jsonl");
  b.parallel = "tp=2,xp=3";
  r = (*m)->submit(b);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(r.error().message.find("xp"), std::string::npos) << r.error().message;
  EXPECT_TRUE((*m)->list_jobs().empty());
}

TEST(JobParallelRecord, RecordsWithoutTheFieldsReadAsDefaults) {
  TempDir tmp;
  const std::string db_dir = tmp.file("jobs.db");
  {
    auto store = JobStore::open(db_dir);
    ASSERT_TRUE(store.ok()) << store.error().to_string();
    JobRecord rec;
    rec.spec.model_dir = "/m";
    rec.spec.input_paths = {"/in.jsonl"};
    rec.spec.output_path = "/out.jsonl";
    ASSERT_TRUE((*store)->create_job(rec).ok());
  }
  {
    // Overwrite job 1 with a record as an older version wrote it.
    rocksdb::DB* raw = nullptr;
    rocksdb::Options options;
    ASSERT_TRUE(rocksdb::DB::Open(options, db_dir, &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    std::string key(1, 'J');
    for (int i = 7; i >= 0; --i) key.push_back(static_cast<char>((1ull >> (8 * i)) & 0xff));
    const std::string old_record =
        R"({"id":1,"model_dir":"/m","model_name":"m","input_paths":["/in.jsonl"],"output_path":"/out.jsonl",)"
        R"("request_id_prefix":"cmpl-","state":"done","created_unix_ms":1,"finished_unix_ms":2,)"
        R"("total_lines":0,"input_sizes":[0],"error":""})";
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), key, old_record).ok());
  }
  auto store = JobStore::open(db_dir);
  ASSERT_TRUE(store.ok()) << store.error().to_string();
  auto rec = (*store)->get_job(1);
  ASSERT_TRUE(rec.ok()) << rec.error().to_string();
  EXPECT_EQ(rec->spec.parallel, "");
  EXPECT_EQ(rec->spec.token_budget, "fixed");
  EXPECT_EQ(rec->state, JobState::done);
}

}  // namespace
}  // namespace shardline::orchestrator
