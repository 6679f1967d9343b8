// JobManager::cancel: a cancelled job's output file holds exactly the lines
// committed before the cancel, in line order; nothing of it is handed out or
// committed afterwards; the state survives a restart, and a crash between the
// cancel's record and its finished file is repaired by open().
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "orchestrator/job_manager.hpp"
#include "tests/orchestrator/temp_dir.hpp"

namespace shardline::orchestrator {
namespace orchestrator_job_manager_cancel_test {

using testing::read_file;
using testing::TempDir;
using testing::write_file;
using worker::BatchChoice;
using worker::BatchRequest;
using worker::BatchResult;

BatchResult fake_result(const BatchRequest& r) {
  BatchResult out;
  out.job_id = r.job_id;
  out.line_index = r.line_index;
  out.custom_id = r.custom_id;
  out.ok = true;
  BatchChoice c;
  c.text = " echo:" + r.prompt;
  c.finish_reason = "length";
  out.choices.push_back(c);
  out.prompt_tokens = 1;
  out.completion_tokens = 1;
  return out;
}

JobSpec spec_for(const TempDir& tmp, const std::string& input, const std::string& out) {
  JobSpec s;
  s.model_dir = "/models/stories260K/";
  s.input_paths = {tmp.file(input)};
  s.output_path = tmp.file(out);
  return s;
}

/// `n` lines with custom_ids c0..c{n-1}; line `bad` (if < n) is not JSON.
std::string input_lines(int n, int bad = -1, std::size_t prompt_bytes = 2) {
  std::string text;
  for (int i = 0; i < n; ++i) {
    if (i == bad) {
      text += "not json\n";
      continue;
    }
    text += R"({"custom_id":"c)" + std::to_string(i) + R"(","body":{"prompt":")" + std::string(prompt_bytes, 'p') +
            R"(","max_tokens":1}})" + "\n";
  }
  return text;
}

std::vector<std::string> custom_ids(const std::string& path) {
  std::vector<std::string> ids;
  const std::string text = read_file(path);
  std::size_t pos = 0;
  while (pos < text.size()) {
    const auto nl = text.find('\n', pos);
    ids.push_back(nlohmann::json::parse(text.substr(pos, nl - pos)).at("custom_id").get<std::string>());
    pos = nl + 1;
  }
  return ids;
}

/// Hands out every line (first `first` to w1, the rest to w2), commits the
/// results of `commit`.
void run_partially(JobManager& m, std::size_t first, const std::vector<std::uint64_t>& commit) {
  auto a = m.next_work(first, "w1");
  auto b = m.next_work(1000, "w2");
  std::vector<BatchResult> results;
  for (const auto* batch : {&a, &b})
    for (const auto& r : *batch)
      for (const std::uint64_t line : commit)
        if (r.line_index == line) results.push_back(fake_result(r));
  auto n = m.on_results(results);
  ASSERT_TRUE(n.ok()) << n.error().to_string();
  ASSERT_EQ(*n, commit.size());
}

TEST(JobManagerCancel, OutputHoldsTheCommittedLinesInOrderAndNothingLater) {
  TempDir tmp;
  write_file(tmp.file("in.jsonl"), input_lines(10, /*bad=*/8));
  std::vector<BatchRequest> late;
  {
    auto m = JobManager::open(tmp.file("state"));
    ASSERT_TRUE(m.ok()) << m.error().to_string();
    auto id = (*m)->submit(spec_for(tmp, "in.jsonl", "out.jsonl"));
    ASSERT_TRUE(id.ok()) << id.error().to_string();
    // Line 0 stays uncommitted, so the output file holds nothing yet.
    run_partially(**m, 4, {1, 2, 5});
    EXPECT_EQ(read_file(tmp.file("out.jsonl")), "");

    auto workers = (*m)->cancel(*id);
    ASSERT_TRUE(workers.ok()) << workers.error().to_string();
    EXPECT_EQ(*workers, (std::vector<std::string>{"w1", "w2"}));
    EXPECT_EQ(custom_ids(tmp.file("out.jsonl")), (std::vector<std::string>{"c1", "c2", "c5", "9"}))
        << "lines 1, 2 and 5, and the parse error of line 8 (its custom_id is its line number)";
    auto p = (*m)->progress(*id);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(p->state, JobState::cancelled);
    EXPECT_EQ(p->done, 4u);
    EXPECT_EQ(p->failed, 1u);
    EXPECT_EQ(p->in_flight, 0u);
    EXPECT_EQ(p->pending, 0u);
    EXPECT_EQ(p->written, 4u);
    EXPECT_TRUE((*m)->idle());
    EXPECT_FALSE((*m)->has_pending_work());
    EXPECT_EQ((*m)->in_flight_count("w1"), 0u);
    EXPECT_TRUE((*m)->next_work(100, "w3").empty());

    // A result that arrives after the cancel is not committed.
    BatchRequest r0;
    r0.job_id = *id;
    r0.line_index = 0;
    r0.custom_id = "c0";
    auto n = (*m)->on_result(fake_result(r0));
    ASSERT_TRUE(n.ok());
    EXPECT_EQ(*n, 0u);
    EXPECT_EQ((*m)->progress(*id)->done, 4u);

    // Cancelling again changes nothing.
    auto again = (*m)->cancel(*id);
    ASSERT_TRUE(again.ok()) << again.error().to_string();
    EXPECT_TRUE(again->empty());
  }
  auto m = JobManager::open(tmp.file("state"));
  ASSERT_TRUE(m.ok()) << m.error().to_string();
  auto p = (*m)->progress(1);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->state, JobState::cancelled);
  EXPECT_EQ(p->done, 4u);
  EXPECT_EQ(custom_ids(tmp.file("out.jsonl")), (std::vector<std::string>{"c1", "c2", "c5", "9"}));
}

TEST(JobManagerCancel, OnlyUnfinishedJobsCanBeCancelled) {
  TempDir tmp;
  write_file(tmp.file("in.jsonl"), input_lines(3));
  auto m = JobManager::open(tmp.file("state"));
  ASSERT_TRUE(m.ok());
  auto id = (*m)->submit(spec_for(tmp, "in.jsonl", "out.jsonl"));
  ASSERT_TRUE(id.ok());
  run_partially(**m, 3, {0, 1, 2});
  ASSERT_EQ((*m)->progress(*id)->state, JobState::done);
  const std::string done_output = read_file(tmp.file("out.jsonl"));

  auto refused = (*m)->cancel(*id);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(refused.error().message.find("already done"), std::string::npos) << refused.error().message;
  EXPECT_EQ((*m)->progress(*id)->state, JobState::done);
  EXPECT_EQ(read_file(tmp.file("out.jsonl")), done_output);

  auto unknown = (*m)->cancel(99);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.error().code, ErrorCode::not_found);
}

TEST(JobManagerCancel, QueuedJobWithNothingCommittedGetsAnEmptyFile) {
  TempDir tmp;
  write_file(tmp.file("in.jsonl"), input_lines(3));
  auto m = JobManager::open(tmp.file("state"));
  ASSERT_TRUE(m.ok());
  auto id = (*m)->submit(spec_for(tmp, "in.jsonl", "out.jsonl"));
  ASSERT_TRUE(id.ok());
  auto workers = (*m)->cancel(*id);
  ASSERT_TRUE(workers.ok()) << workers.error().to_string();
  EXPECT_TRUE(workers->empty());
  EXPECT_EQ(read_file(tmp.file("out.jsonl")), "");
  EXPECT_EQ((*m)->progress(*id)->written, 0u);
}

TEST(JobManagerCancel, OpenFinishesTheFileOfACancelInterruptedByACrash) {
  TempDir tmp;
  write_file(tmp.file("in.jsonl"), input_lines(6));
  {
    auto m = JobManager::open(tmp.file("state"));
    ASSERT_TRUE(m.ok());
    auto id = (*m)->submit(spec_for(tmp, "in.jsonl", "out.jsonl"));
    ASSERT_TRUE(id.ok());
    run_partially(**m, 6, {0, 1, 3});
    EXPECT_EQ(custom_ids(tmp.file("out.jsonl")), (std::vector<std::string>{"c0", "c1"}));
    // The crash: cancel() wrote the record, then the process died before
    // the file was finished.
    auto rec = (*m)->job(*id);
    ASSERT_TRUE(rec.ok());
    rec->state = JobState::cancelled;
    ASSERT_TRUE((*m)->store().update_job(*rec).ok());
  }
  auto m = JobManager::open(tmp.file("state"));
  ASSERT_TRUE(m.ok()) << m.error().to_string();
  EXPECT_EQ(custom_ids(tmp.file("out.jsonl")), (std::vector<std::string>{"c0", "c1", "c3"}));
  EXPECT_EQ((*m)->progress(1)->state, JobState::cancelled);
  // And a further restart leaves the finished file alone.
  m->reset();
  auto again = JobManager::open(tmp.file("state"));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(custom_ids(tmp.file("out.jsonl")), (std::vector<std::string>{"c0", "c1", "c3"}));
}

TEST(JobManagerCancel, LargeOutputIsWrittenInChunksWithoutLosingALine) {
  // 12 lines of 1 MiB each: finish_partial flushes every 4 MiB.
  TempDir tmp;
  write_file(tmp.file("in.jsonl"), input_lines(12, -1, 1u << 20));
  auto m = JobManager::open(tmp.file("state"));
  ASSERT_TRUE(m.ok());
  auto id = (*m)->submit(spec_for(tmp, "in.jsonl", "out.jsonl"));
  ASSERT_TRUE(id.ok());
  run_partially(**m, 12, {1, 3, 4, 5, 6, 7, 8, 11});
  auto workers = (*m)->cancel(*id);
  ASSERT_TRUE(workers.ok()) << workers.error().to_string();
  EXPECT_EQ(custom_ids(tmp.file("out.jsonl")),
            (std::vector<std::string>{"c1", "c3", "c4", "c5", "c6", "c7", "c8", "c11"}));
}

}  // namespace
}  // namespace shardline::orchestrator
