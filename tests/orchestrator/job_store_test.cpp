#include "orchestrator/job_store.hpp"

#include <gtest/gtest.h>

#include <filesystem>

#include <vector>

#include "tests/orchestrator/temp_dir.hpp"

namespace shardline::orchestrator {
namespace orchestrator_job_store_test {

using testing::TempDir;

JobRecord sample_record() {
  JobRecord r;
  r.spec.model_dir = "/models/stories260K";
  r.spec.model_name = "stories260K";
  r.spec.input_paths = {"/data/a.jsonl", "/data/b.jsonl"};
  r.spec.output_path = "/data/out.jsonl";
  r.created_unix_ms = 1700000000123;
  r.total_lines = 10;
  r.input_sizes = {100, 200};
  return r;
}

StoredResult stored(std::uint64_t line, bool ok, std::string text, std::uint64_t pt = 0, std::uint64_t ct = 0) {
  return StoredResult{line, std::move(text), ok, pt, ct};
}

TEST(JobStore, CreateGetUpdateList) {
  TempDir tmp;
  auto store = JobStore::open(tmp.file("db"));
  ASSERT_TRUE(store.ok()) << store.error().to_string();
  auto a = (*store)->create_job(sample_record());
  auto b = (*store)->create_job(sample_record());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, 1u);
  EXPECT_EQ(*b, 2u);
  auto rec = (*store)->get_job(*a);
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec->id, 1u);
  EXPECT_EQ(rec->spec.input_paths, sample_record().spec.input_paths);
  EXPECT_EQ(rec->spec.request_id_prefix, "cmpl-");
  EXPECT_EQ(rec->created_unix_ms, 1700000000123);
  EXPECT_EQ(rec->state, JobState::queued);
  rec->state = JobState::failed;
  rec->error = "input shard changed";
  ASSERT_TRUE((*store)->update_job(*rec).ok());
  auto list = (*store)->list_jobs();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].state, JobState::failed);
  EXPECT_EQ((*list)[0].error, "input shard changed");
  EXPECT_EQ((*list)[1].id, 2u);
  EXPECT_EQ((*store)->get_job(9).error().code, ErrorCode::not_found);
  JobRecord ghost = sample_record();
  ghost.id = 9;
  EXPECT_FALSE((*store)->update_job(ghost).ok());
}

TEST(JobStore, ResultsExactlyOnce) {
  TempDir tmp;
  auto store = JobStore::open(tmp.file("db"));
  ASSERT_TRUE(store.ok());
  auto& s = **store;
  const auto job = *s.create_job(sample_record());
  auto first = s.put_result(job, stored(3, true, "line3", 5, 7));
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE(*first);
  auto again = s.put_result(job, stored(3, false, "other"));
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(*again);
  EXPECT_EQ(**s.get_result(job, 3), "line3");
  EXPECT_FALSE(s.get_result(job, 4)->has_value());
  EXPECT_TRUE(*s.has_result(job, 3));
  // A batch with a duplicate inside and one already committed.
  auto n = s.put_results(job, {stored(1, true, "line1", 2, 3), stored(1, true, "dup"), stored(3, true, "x"),
                               stored(0, false, "err0")});
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 2u);
  EXPECT_EQ(*s.count_results(job), 3u);
  const JobCounters c = *s.counters(job);
  EXPECT_EQ(c.ok, 2u);
  EXPECT_EQ(c.failed, 1u);
  EXPECT_EQ(c.prompt_tokens, 7u);
  EXPECT_EQ(c.completion_tokens, 10u);
  // Ordered scan (big-endian keys), also across the 255/256 byte boundary.
  ASSERT_TRUE(*s.put_result(job, stored(256, true, "line256")));
  ASSERT_TRUE(*s.put_result(job, stored(255, true, "line255")));
  std::vector<std::uint64_t> seen;
  ASSERT_TRUE(s.scan_results(job, 1, [&](std::uint64_t line, std::string_view) {
                 seen.push_back(line);
                 return true;
               }).ok());
  EXPECT_EQ(seen, (std::vector<std::uint64_t>{1, 3, 255, 256}));
  // Results of another job are separate.
  const auto job2 = *s.create_job(sample_record());
  EXPECT_FALSE(s.get_result(job2, 3)->has_value());
  EXPECT_EQ(*s.count_results(job2), 0u);
  seen.clear();
  ASSERT_TRUE(s.scan_results(job2, 0, [&](std::uint64_t line, std::string_view) {
                 seen.push_back(line);
                 return true;
               }).ok());
  EXPECT_TRUE(seen.empty());
}

TEST(JobStore, PersistsAcrossReopen) {
  TempDir tmp;
  std::uint64_t job = 0;
  {
    auto store = JobStore::open(tmp.file("db"));
    ASSERT_TRUE(store.ok());
    job = *(*store)->create_job(sample_record());
    ASSERT_TRUE(*(*store)->put_result(job, stored(0, true, "zero", 3, 4)));
    ASSERT_TRUE((*store)->set_output_progress(job, OutputProgress{5, 1}).ok());
  }
  auto store = JobStore::open(tmp.file("db"));
  ASSERT_TRUE(store.ok()) << store.error().to_string();
  auto& s = **store;
  EXPECT_EQ(**s.get_result(job, 0), "zero");
  EXPECT_FALSE(*s.put_result(job, stored(0, true, "again")));
  EXPECT_EQ(*s.count_results(job), 1u);
  EXPECT_EQ(s.counters(job)->completion_tokens, 4u);
  EXPECT_EQ(s.output_progress(job)->offset, 5u);
  EXPECT_EQ(s.output_progress(job)->next_line, 1u);
  EXPECT_EQ(s.output_progress(job + 1)->offset, 0u);  // unknown: the start
  // Ids stay monotonic after a reopen.
  EXPECT_EQ(*s.create_job(sample_record()), job + 1);
}

TEST(JobStore, OpenFailsCleanly) {
  TempDir tmp;
  testing::write_file(tmp.file("not_a_dir"), "x");
  auto store = JobStore::open(tmp.file("not_a_dir"));
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.error().code, ErrorCode::io);
}

// Issue 46, item 11: a garbled jobs.db was reported as an io error; it is
// `corrupt`, naming the path (the job store is the record of truth: it is
// not moved aside like the KV cache).
TEST(JobStore, AGarbledStoreIsCorruptNamingItsPath) {
  TempDir tmp;
  {
    auto store = JobStore::open(tmp.file("jobs.db"));
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->create_job(sample_record()).ok());
  }
  int garbled = 0;
  for (const auto& e : std::filesystem::directory_iterator(tmp.file("jobs.db")))
    if (e.path().filename().string().starts_with("MANIFEST-")) {
      testing::write_file(e.path().string(), std::string(256, '\xA5'));
      ++garbled;
    }
  ASSERT_EQ(garbled, 1);
  auto store = JobStore::open(tmp.file("jobs.db"));
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.error().code, ErrorCode::corrupt) << store.error().to_string();
  EXPECT_NE(store.error().message.find(tmp.file("jobs.db")), std::string::npos) << store.error().to_string();
  EXPECT_EQ(store.error().to_string().rfind("corrupt: job store: open ", 0), 0u) << store.error().to_string();
}

}  // namespace
}  // namespace shardline::orchestrator
