// JobManager's resume points (issue 11, DéjàVu seed 003 §4.2.3): the
// replicated KV progress workers report (on_kv_progress) becomes each
// in-flight line's BatchRequest::resume, travels with requeued and claimed
// lines, survives a restart in jobs.db, and is deleted when the line is
// committed or the job finishes; plus the requeued / resumed counters and the
// resume record's encoding.
#include "orchestrator/job_manager.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "tests/orchestrator/fake_worker.hpp"
#include "tests/orchestrator/temp_dir.hpp"

namespace shardline::orchestrator {
namespace orchestrator_job_manager_resume_test {

using testing::fake_result;
using testing::TempDir;
using testing::write_file;
using worker::BatchRequest;
using worker::BatchResult;
using worker::LineRef;
using worker::ChoiceResume;
using worker::KvProgress;

constexpr int kLines = 8;

/// Line i asks for n = 2 choices.
std::string input_text() {
  std::string s;
  for (int i = 0; i < kLines; ++i)
    s += "{\"custom_id\":\"c" + std::to_string(i) + "\",\"prompt\":\"p" + std::to_string(i) +
         "\",\"n\":2,\"max_tokens\":16}\n";
  return s;
}

KvProgress kv(std::uint64_t job, std::uint64_t line, int choice, int tokens, std::vector<std::int32_t> ids) {
  return KvProgress{job, line, choice, tokens, std::move(ids)};
}

std::vector<ChoiceResume> resume_of(std::vector<std::pair<int, std::vector<std::int32_t>>> choices) {
  std::vector<ChoiceResume> out;
  for (auto& [tokens, ids] : choices) out.push_back(ChoiceResume{std::move(ids), tokens, {}});
  return out;
}

const BatchRequest* find_line(const std::vector<BatchRequest>& work, std::uint64_t line) {
  for (const auto& r : work)
    if (r.line_index == line) return &r;
  return nullptr;
}

class JobManagerResume : public ::testing::Test {
 protected:
  void SetUp() override {
    write_file(tmp_.file("in.jsonl"), input_text());
    open();
    JobSpec spec;
    spec.model_dir = "/models/m";
    spec.input_paths = {tmp_.file("in.jsonl")};
    spec.output_path = tmp_.file("out.jsonl");
    auto id = m_->submit(spec);
    ASSERT_TRUE(id.ok()) << id.error().to_string();
    job_ = *id;
  }
  void open() {
    m_.reset();  // closes jobs.db first
    auto m = JobManager::open(tmp_.file("state"));
    ASSERT_TRUE(m.ok()) << m.error().to_string();
    m_ = std::move(m.value());
  }
  std::size_t records() {
    auto n = m_->store().count_resume_records(job_);
    EXPECT_TRUE(n.ok());
    return n.ok() ? *n : 9999;
  }
  void report(const std::string& worker, const std::vector<KvProgress>& progress) {
    Status st = m_->on_kv_progress(worker, progress);
    ASSERT_TRUE(st.ok()) << st.error().to_string();
  }

  TempDir tmp_;
  std::unique_ptr<JobManager> m_;
  std::uint64_t job_ = 0;
};

TEST_F(JobManagerResume, ProgressCountsOnlyForLinesInFlightOnTheReportingWorker) {
  ASSERT_EQ(m_->next_work(2, "w1").size(), 2u);  // lines 0, 1
  ASSERT_EQ(m_->next_work(2, "w2").size(), 2u);  // lines 2, 3; 4.. pending
  report("w1", {kv(job_, 0, 1, 5, {7, 8}),
                kv(job_, 2, 0, 9, {1}),        // in flight on w2
                kv(job_, 4, 0, 9, {1}),        // pending
                kv(job_ + 5, 0, 0, 9, {1}),    // unknown job
                kv(job_, 100000, 0, 9, {1})});  // no such line
  EXPECT_EQ(records(), 1u);
  auto stored = m_->store().load_resume(job_);
  ASSERT_TRUE(stored.ok());
  ASSERT_EQ(stored->size(), 1u);
  EXPECT_EQ((*stored)[0].line_index, 0u);
  EXPECT_EQ((*stored)[0].choices, resume_of({{0, {}}, {5, {7, 8}}}));

  EXPECT_EQ(m_->requeue_in_flight("w1"), 2u);
  auto work = m_->next_work(10, "w3");  // requeued 0, 1 first, then 4..7
  ASSERT_EQ(work.size(), 6u);
  EXPECT_EQ(work[0].line_index, 0u);
  EXPECT_EQ(work[0].resume, resume_of({{0, {}}, {5, {7, 8}}}));
  EXPECT_EQ(work[1].line_index, 1u);
  EXPECT_TRUE(work[1].resume.empty());
  for (std::size_t i = 2; i < work.size(); ++i) EXPECT_TRUE(work[i].resume.empty()) << work[i].line_index;
  EXPECT_EQ(m_->requeue_in_flight("w2"), 2u);
  for (const auto& r : m_->next_work(10, "w4")) EXPECT_TRUE(r.resume.empty()) << r.line_index;
}

TEST_F(JobManagerResume, AcksNeverGoBackAndBadEntriesAreIgnored) {
  ASSERT_EQ(m_->next_work(1, "w1").size(), 1u);  // line 0, n = 2
  report("w1", {kv(job_, 0, 0, 10, {1, 2, 3}), kv(job_, 0, 1, 4, {9})});
  report("w1", {kv(job_, 0, 0, 8, {5, 5}),        // lower
                kv(job_, 0, 0, 10, {6, 6, 6}),    // equal
                kv(job_, 0, 2, 50, {4}),          // choice >= n
                kv(job_, 0, -1, 50, {4}),         // negative choice
                kv(job_, 0, 1, -3, {4})});        // negative tokens
  const auto expected = resume_of({{10, {1, 2, 3}}, {4, {9}}});
  auto stored = m_->store().load_resume(job_);
  ASSERT_TRUE(stored.ok());
  ASSERT_EQ(stored->size(), 1u);
  EXPECT_EQ((*stored)[0].choices, expected);
  ASSERT_EQ(m_->requeue_all(), 1u);
  auto work = m_->next_work(1, "w2");
  ASSERT_EQ(work.size(), 1u);
  EXPECT_EQ(work[0].resume, expected);

  // The new worker moves it on; its higher ack counts, in the same call as a
  // stale one of the old worker.
  report("w2", {kv(job_, 0, 1, 6, {9, 10, 11})});
  report("w1", {kv(job_, 0, 1, 60, {0})});
  ASSERT_EQ(m_->requeue_in_flight("w2"), 1u);
  work = m_->next_work(1, "w3");
  ASSERT_EQ(work.size(), 1u);
  EXPECT_EQ(work[0].resume, resume_of({{10, {1, 2, 3}}, {6, {9, 10, 11}}}));
}

TEST_F(JobManagerResume, ResumePointsSurviveARestartAndGoOutWithTheLine) {
  auto first = m_->next_work(3, "w1");  // lines 0, 1, 2
  ASSERT_EQ(first.size(), 3u);
  report("w1", {kv(job_, 1, 0, 12, {3, 4}), kv(job_, 2, 1, 7, {8})});
  open();  // the orchestrator restarts: every uncommitted line is pending again
  ASSERT_EQ(m_->progress(job_)->in_flight, 0u);
  auto work = m_->next_work(10, "w2");
  ASSERT_EQ(work.size(), static_cast<std::size_t>(kLines));
  EXPECT_TRUE(find_line(work, 0)->resume.empty());
  EXPECT_EQ(find_line(work, 1)->resume, resume_of({{12, {3, 4}}, {0, {}}}));
  EXPECT_EQ(find_line(work, 2)->resume, resume_of({{0, {}}, {7, {8}}}));
  EXPECT_EQ(m_->progress(job_)->resumed, 2u);
  // The new worker's acks count against the reloaded points.
  report("w2", {kv(job_, 1, 0, 12, {0}), kv(job_, 1, 1, 2, {5})});
  ASSERT_EQ(m_->requeue_in_flight("w2"), static_cast<std::size_t>(kLines));
  work = m_->next_work(2, "w3");
  ASSERT_EQ(work.size(), 2u);
  EXPECT_EQ(find_line(work, 1)->resume, resume_of({{12, {3, 4}}, {2, {5}}}));
}

TEST_F(JobManagerResume, ClaimedLinesKeepTheirResumePoints) {
  ASSERT_EQ(m_->next_work(4, "w1").size(), 4u);  // lines 0..3
  report("w1", {kv(job_, 3, 1, 20, {1, 2})});
  open();
  // w1 lived through the restart and still holds lines 2 and 3.
  auto claimed = m_->claim_in_flight("w1", {LineRef{job_, 2}, LineRef{job_, 3}});
  ASSERT_TRUE(claimed.ok()) << claimed.error().to_string();
  ASSERT_EQ(*claimed, 2u);
  report("w1", {kv(job_, 2, 0, 3, {6})});  // in flight on w1 again: counts
  ASSERT_EQ(m_->requeue_in_flight("w1"), 2u);
  auto work = m_->next_work(10, "w2");
  EXPECT_EQ(find_line(work, 2)->resume, resume_of({{3, {6}}, {0, {}}}));
  EXPECT_EQ(find_line(work, 3)->resume, resume_of({{0, {}}, {20, {1, 2}}}));
}

TEST_F(JobManagerResume, ClaimingALineRequeuedBeforeTheClaimAttachesItsResumePoint) {
  ASSERT_EQ(m_->next_work(2, "w1").size(), 2u);
  report("w1", {kv(job_, 1, 0, 9, {4})});
  ASSERT_EQ(m_->requeue_in_flight("w1"), 2u);  // lines 0, 1 in retry
  auto claimed = m_->claim_in_flight("w1", {LineRef{job_, 1}});
  ASSERT_TRUE(claimed.ok());
  ASSERT_EQ(*claimed, 1u);
  ASSERT_EQ(m_->requeue_in_flight("w1"), 1u);
  auto work = m_->next_work(10, "w2");
  EXPECT_EQ(find_line(work, 1)->resume, resume_of({{9, {4}}, {0, {}}}));
}

TEST_F(JobManagerResume, CommittingALineDeletesItsResumeRecord) {
  auto work = m_->next_work(3, "w1");
  ASSERT_EQ(work.size(), 3u);
  report("w1", {kv(job_, 0, 0, 5, {1}), kv(job_, 1, 0, 5, {1}), kv(job_, 2, 1, 5, {1})});
  EXPECT_EQ(records(), 3u);
  ASSERT_TRUE(m_->on_results({fake_result(work[0]), fake_result(work[2])}).ok());
  EXPECT_EQ(records(), 1u);
  auto stored = m_->store().load_resume(job_);
  ASSERT_TRUE(stored.ok());
  ASSERT_EQ(stored->size(), 1u);
  EXPECT_EQ((*stored)[0].line_index, 1u);
  // A late ack for a committed line is stale.
  report("w1", {kv(job_, 0, 0, 9, {1})});
  EXPECT_EQ(records(), 1u);
  open();
  EXPECT_EQ(records(), 1u);
  work = m_->next_work(10, "w2");
  ASSERT_EQ(work.size(), static_cast<std::size_t>(kLines - 2));
  EXPECT_EQ(find_line(work, 1)->resume, resume_of({{5, {1}}, {0, {}}}));
}

TEST_F(JobManagerResume, AFinishedJobHasNoResumeRecordsLeft) {
  auto work = m_->next_work(kLines, "w1");
  ASSERT_EQ(work.size(), static_cast<std::size_t>(kLines));
  report("w1", {kv(job_, 5, 0, 5, {1}), kv(job_, 6, 0, 5, {1})});
  // Line 5's result arrives from a worker that had not reported it: the
  // record is still deleted with the commit.
  std::vector<BatchResult> results;
  for (const auto& r : work)
    if (r.line_index != 6) results.push_back(fake_result(r));
  ASSERT_TRUE(m_->on_results(results).ok());
  EXPECT_EQ(records(), 1u);
  // A record the manager does not know of (as a crash could leave behind)
  // goes with the job too.
  ASSERT_TRUE(m_->store().put_resume({ResumeRecord{job_, 2, resume_of({{3, {1}}})}}).ok());
  ASSERT_EQ(records(), 2u);
  ASSERT_TRUE(m_->on_results({fake_result(work[6])}).ok());
  EXPECT_EQ(m_->progress(job_)->state, JobState::done);
  EXPECT_EQ(records(), 0u);
  // And open() deletes what is left of a finished job.
  ASSERT_TRUE(m_->store().put_resume({ResumeRecord{job_, 2, resume_of({{3, {1}}})}}).ok());
  open();
  EXPECT_EQ(records(), 0u);
}

TEST_F(JobManagerResume, AFailedJobHasNoResumeRecordsLeft) {
  ASSERT_EQ(m_->next_work(3, "w1").size(), 3u);
  report("w1", {kv(job_, 0, 0, 5, {1}), kv(job_, 2, 1, 6, {2})});
  m_.reset();
  write_file(tmp_.file("in.jsonl"), input_text() + "{\"prompt\":\"more\"}\n");  // the shard changed
  open();
  EXPECT_EQ(m_->progress(job_)->state, JobState::failed);
  EXPECT_EQ(records(), 0u);
}

TEST_F(JobManagerResume, CountsRequeuedAndResumedLinesAcrossARestart) {
  ASSERT_EQ(m_->next_work(3, "w1").size(), 3u);
  ASSERT_EQ(m_->next_work(2, "w2").size(), 2u);
  report("w1", {kv(job_, 0, 1, 4, {1})});
  report("w2", {kv(job_, 3, 0, 4, {1})});
  EXPECT_EQ(m_->requeue_in_flight("w1"), 3u);
  EXPECT_EQ(m_->progress(job_)->requeued, 3u);
  EXPECT_EQ(m_->progress(job_)->resumed, 0u);
  auto work = m_->next_work(3, "w3");  // the requeued 0, 1, 2: only 0 resumes
  ASSERT_EQ(work.size(), 3u);
  EXPECT_EQ(m_->progress(job_)->resumed, 1u);
  EXPECT_EQ(m_->requeue_all(), 5u);  // w2's 3, 4 and w3's 0, 1, 2: line 0 twice
  EXPECT_EQ(m_->progress(job_)->requeued, 8u);
  EXPECT_EQ(m_->next_work(10, "w4").size(), static_cast<std::size_t>(kLines));  // 0 and 3 resume
  EXPECT_EQ(m_->progress(job_)->resumed, 3u);
  open();
  EXPECT_EQ(m_->progress(job_)->requeued, 8u);
  EXPECT_EQ(m_->progress(job_)->resumed, 3u);
  EXPECT_EQ(m_->next_work(10, "w5").size(), static_cast<std::size_t>(kLines));
  EXPECT_EQ(m_->progress(job_)->resumed, 5u);
}

// ---- the 'K' value ---------------------------------------------------------------

TEST(JobStoreResumeRecord, RoundTripsAndDropsTheKvChunk) {
  std::vector<ChoiceResume> c = resume_of({{0, {}}, {17, {1, -2, 2147483647}}, {3, {-2147483647 - 1}}});
  c[1].kv_chunk = {std::byte{1}, std::byte{2}};
  auto back = decode_resume(encode_resume(c));
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  c[1].kv_chunk.clear();
  EXPECT_EQ(*back, c);
  const std::string v = encode_resume(resume_of({{17, {1}}}));
  EXPECT_EQ(v, std::string("\x01\x00\x00\x00\x11\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00", 16));  // little-endian
}

TEST(JobStoreResumeRecord, DecodeRejectsMalformedValues) {
  const std::string good = encode_resume(resume_of({{17, {1, 2}}, {4, {}}}));
  ASSERT_TRUE(decode_resume(good).ok());
  for (std::size_t cut = 0; cut < good.size(); ++cut) {
    auto r = decode_resume(good.substr(0, cut));
    ASSERT_FALSE(r.ok()) << cut;
    EXPECT_EQ(r.error().code, ErrorCode::corrupt);
  }
  auto trailing = decode_resume(good + "x");
  ASSERT_FALSE(trailing.ok());
  EXPECT_EQ(trailing.error().code, ErrorCode::corrupt);
  auto negative = decode_resume(encode_resume(resume_of({{-1, {}}})));
  ASSERT_FALSE(negative.ok());
  EXPECT_EQ(negative.error().code, ErrorCode::corrupt);
  auto huge_ids = decode_resume(std::string("\x01\x00\x00\x00\x01\x00\x00\x00\xff\xff\xff\xff", 12));
  ASSERT_FALSE(huge_ids.ok());
  EXPECT_EQ(huge_ids.error().code, ErrorCode::corrupt);
  auto many = decode_resume(std::string("\x81\x00\x00\x00", 4));  // 129 choices
  ASSERT_FALSE(many.ok());
  EXPECT_EQ(many.error().code, ErrorCode::corrupt);
}

}  // namespace
}  // namespace shardline::orchestrator

namespace shardline::orchestrator {
namespace orchestrator_job_manager_resume_test {

// A line with logprobs never gets a resume point (the logprobs of the
// tokens before the failure were not replicated); a chat line carries the
// job's --chat-template, a completions line does not; both survive a restart.
TEST(JobManagerLineSettings, LogprobsLinesStartFromThePromptAndChatLinesCarryTheJobTemplate) {
  TempDir tmp;
  write_file(tmp.file("in.jsonl"),
             "{\"prompt\":\"p0\",\"logprobs\":2}\n"
             "{\"prompt\":\"p1\"}\n"
             "{\"url\":\"/v1/chat/completions\",\"body\":{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}}\n");
  const std::string tpl = "{% for m in messages %}{{ m.content }}{% endfor %}";
  std::uint64_t job = 0;
  {
    auto m = JobManager::open(tmp.file("state"));
    ASSERT_TRUE(m.ok());
    JobSpec spec;
    spec.model_dir = "/models/m";
    spec.input_paths = {tmp.file("in.jsonl")};
    spec.output_path = tmp.file("out.jsonl");
    spec.chat_template = tpl;
    auto id = (*m)->submit(spec);
    ASSERT_TRUE(id.ok());
    job = *id;
    ASSERT_EQ((*m)->next_work(3, "w1").size(), 3u);
    const std::vector<KvProgress> progress = {KvProgress{job, 0, 0, 4, {7, 8}}, KvProgress{job, 1, 0, 4, {7, 8}}};
    ASSERT_TRUE((*m)->on_kv_progress("w1", progress).ok());
  }
  auto m = JobManager::open(tmp.file("state"));  // a restart: the three lines are pending again
  ASSERT_TRUE(m.ok());
  auto work = (*m)->next_work(3, "w2");
  ASSERT_EQ(work.size(), 3u);
  EXPECT_EQ(work[0].params.logprobs, 2);
  EXPECT_TRUE(work[0].resume.empty());
  EXPECT_EQ(work[1].resume, resume_of({{4, {7, 8}}}));
  EXPECT_TRUE(work[0].chat_template.empty());
  EXPECT_TRUE(work[1].chat_template.empty());
  EXPECT_TRUE(work[2].chat);
  EXPECT_EQ(work[2].chat_template, tpl);
}

}  // namespace
}  // namespace shardline::orchestrator
