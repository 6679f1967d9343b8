// JobManager::claim_in_flight: after a restart of the orchestrator alone
// (JobManager::open on the same data dir), the lines a surviving worker
// reports holding are in flight on it again, not handed out a second time;
// requeued, they come back with the same request; the output is the clean
// run's.
#include "orchestrator/job_manager.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tests/orchestrator/fake_worker.hpp"
#include "tests/orchestrator/temp_dir.hpp"
#include "tests/support/output_ids.hpp"

namespace shardline::orchestrator {
namespace orchestrator_job_manager_claim_test {

using testing::fake_result;
using testing::read_file;
using testing::TempDir;
using testing::write_file;
using worker::BatchRequest;
using worker::BatchResult;
using worker::LineRef;

std::vector<BatchResult> results_for(const std::vector<BatchRequest>& work) {
  std::vector<BatchResult> out;
  for (const auto& r : work) out.push_back(fake_result(r));
  return out;
}

std::vector<LineRef> refs_of(const std::vector<BatchRequest>& work) {
  std::vector<LineRef> out;
  for (const auto& r : work) out.push_back(LineRef{r.job_id, r.line_index});
  return out;
}

JobSpec spec_for(const TempDir& tmp, const std::string& out) {
  JobSpec s;
  s.model_dir = "/models/m";
  s.input_paths = {tmp.file("a.jsonl"), tmp.file("b.jsonl")};
  s.output_path = tmp.file(out);
  return s;
}

/// Runs every pending line through a fake worker.
void drain(JobManager& m) {
  for (int guard = 0; guard < 1000; ++guard) {
    auto work = m.next_work(7, "drain");
    if (work.empty()) return;
    ASSERT_TRUE(m.on_results(results_for(work)).ok());
  }
}

class JobManagerClaim : public ::testing::Test {
 protected:
  void SetUp() override {
    // Two shards with blank lines and a bad line: line indexes skip blanks.
    std::string a, b;
    for (int i = 0; i < 30; ++i) {
      a += (i == 7) ? "{\"prompt\":\"x\",\"top_p\":7}\n" : "{\"custom_id\":\"a" + std::to_string(i) +
                                                               "\",\"prompt\":\"pa" + std::to_string(i) + "\"}\n";
      if (i % 10 == 3) a += "\n";
    }
    for (int i = 0; i < 25; ++i) b += "{\"custom_id\":\"b" + std::to_string(i) + "\",\"prompt\":\"pb" + std::to_string(i) + "\"}\n";
    write_file(tmp_.file("a.jsonl"), a);
    write_file(tmp_.file("b.jsonl"), b);
    auto clean = JobManager::open(tmp_.file("clean"));
    ASSERT_TRUE(clean.ok());
    ASSERT_TRUE((*clean)->submit(spec_for(tmp_, "clean.out")).ok());
    drain(**clean);
    clean_ = read_file(tmp_.file("clean.out"));
    ASSERT_FALSE(clean_.empty());
  }

  TempDir tmp_;
  std::string clean_;
};

TEST_F(JobManagerClaim, HeldLinesOfASurvivingWorkerStayInFlightOnItAfterARestart) {
  std::uint64_t job = 0;
  std::vector<BatchRequest> held_w1, held_w2;
  {
    auto m = JobManager::open(tmp_.file("state"));
    ASSERT_TRUE(m.ok());
    job = *(*m)->submit(spec_for(tmp_, "run.out"));
    auto first = (*m)->next_work(10, "w0");
    ASSERT_TRUE((*m)->on_results(results_for(first)).ok());  // committed before the crash
    held_w1 = (*m)->next_work(12, "w1");                      // lines 10..21 of shard a
    held_w2 = (*m)->next_work(20, "w2");                      // 22..41: both shards
    ASSERT_EQ(held_w1.size(), 12u);
    ASSERT_EQ(held_w2.size(), 20u);
    // w2 finished a few, and the orchestrator committed them before it died.
    ASSERT_TRUE((*m)->on_results(results_for({held_w2.begin(), held_w2.begin() + 5})).ok());
    held_w2.erase(held_w2.begin(), held_w2.begin() + 5);
  }  // the orchestrator dies: in-flight state is gone, the workers live on

  auto reopened = JobManager::open(tmp_.file("state"));
  ASSERT_TRUE(reopened.ok()) << reopened.error().to_string();
  JobManager& m = **reopened;
  ASSERT_EQ(m.progress(job)->in_flight, 0u);

  // w2 says hello again first, with its lines plus noise: a committed line,
  // a line past the end, an unknown job, and one line twice.
  std::vector<LineRef> w2_refs = refs_of(held_w2);
  w2_refs.push_back(LineRef{job, 0});
  w2_refs.push_back(LineRef{job, 100000});
  w2_refs.push_back(LineRef{job + 7, 3});
  w2_refs.push_back(w2_refs.front());
  auto c2 = m.claim_in_flight("w2", w2_refs);
  ASSERT_TRUE(c2.ok()) << c2.error().to_string();
  EXPECT_EQ(*c2, held_w2.size());  // the duplicate counts once, the noise not
  EXPECT_EQ(m.in_flight_count("w2"), held_w2.size());
  // w1 claims its lines, and also one of w2's: that one stays w2's.
  std::vector<LineRef> w1_refs = refs_of(held_w1);
  w1_refs.push_back(LineRef{job, held_w2.back().line_index});
  auto c1 = m.claim_in_flight("w1", w1_refs);
  ASSERT_TRUE(c1.ok()) << c1.error().to_string();
  EXPECT_EQ(*c1, held_w1.size());
  EXPECT_EQ(m.in_flight_count("w1"), held_w1.size());
  EXPECT_EQ(m.in_flight_count("w2"), held_w2.size());
  EXPECT_EQ(m.progress(job)->in_flight, held_w1.size() + held_w2.size());

  // Nothing held is handed out again: the rest of the job is.
  std::set<std::uint64_t> held;
  for (const auto& r : held_w1) held.insert(r.line_index);
  for (const auto& r : held_w2) held.insert(r.line_index);
  auto rest = m.next_work(1000, "w3");
  const auto p = *m.progress(job);
  EXPECT_EQ(rest.size(), p.total - p.done - held.size());
  for (const auto& r : rest) EXPECT_EQ(held.count(r.line_index), 0u) << "line " << r.line_index << " handed out twice";

  // w1 dies: its claimed lines come back with the request it had (read
  // again from the shards), and are handed out once.
  EXPECT_EQ(m.requeue_in_flight("w1"), held_w1.size());
  auto again = m.next_work(1000, "w4");
  ASSERT_EQ(again.size(), held_w1.size());
  for (std::size_t i = 0; i < again.size(); ++i) {
    EXPECT_EQ(again[i].line_index, held_w1[i].line_index);
    EXPECT_EQ(again[i].custom_id, held_w1[i].custom_id);
    EXPECT_EQ(again[i].prompt, held_w1[i].prompt);
  }
  // A requeued line can be claimed back by a worker that still holds it.
  EXPECT_EQ(m.requeue_in_flight("w4"), held_w1.size());
  auto back = m.claim_in_flight("w5", {LineRef{job, held_w1[0].line_index}});
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, 1u);
  EXPECT_EQ(m.next_work(1000, "w6").size(), held_w1.size() - 1);

  // Everything finishes, each result once, and the output is the clean run's.
  ASSERT_TRUE(m.on_results(results_for(rest)).ok());
  ASSERT_TRUE(m.on_results(results_for(held_w1)).ok());
  ASSERT_TRUE(m.on_results(results_for(held_w2)).ok());
  drain(m);
  EXPECT_EQ(m.progress(job)->state, JobState::done);
  EXPECT_EQ(testing_support::normalize_output_ids(read_file(tmp_.file("run.out"))), testing_support::normalize_output_ids(clean_));
}

// Lines far ahead of the job's reader (a surviving worker's, after a
// restart) are read from the line index's checkpoints, not from the
// shards' start: each claimed line is its own request, with its shard line
// number, both from the index submit built and, after a restart, from the
// one the first claim builds.
TEST(JobManagerClaimAhead, LinesFarAheadOfTheReaderAreClaimedAsTheirOwnRequests) {
  TempDir tmp;
  std::map<std::uint64_t, std::pair<std::string, std::uint64_t>> want;  // line -> (custom_id, shard line)
  std::uint64_t index = 0;
  for (const auto& [name, count] : {std::pair{std::string("a"), 3000}, std::pair{std::string("b"), 2000}}) {
    std::string text;
    std::uint64_t file_line = 0;
    for (int i = 0; i < count; ++i) {
      if (i % 97 == 5) {
        text += "\n";
        ++file_line;
      }
      const std::string id = name + std::to_string(i);
      text += "{\"custom_id\":\"" + id + "\",\"prompt\":\"p" + id + "\"}\n";
      want[index++] = {id, ++file_line};
    }
    write_file(tmp.file(name + ".jsonl"), text);
  }
  JobSpec spec = spec_for(tmp, "out.jsonl");
  const std::vector<std::uint64_t> ahead = {1500, 2999, 3000, 4321, 4999};
  std::vector<LineRef> refs;
  auto claim_and_check = [&](JobManager& m, std::uint64_t job) {
    refs.clear();
    for (std::uint64_t l : ahead) refs.push_back(LineRef{job, l});
    auto claimed = m.claim_in_flight("w9", refs);
    ASSERT_TRUE(claimed.ok()) << claimed.error().to_string();
    EXPECT_EQ(*claimed, ahead.size());
    EXPECT_EQ(m.requeue_in_flight("w9"), ahead.size());
    const auto again = m.next_work(ahead.size(), "w1");
    ASSERT_EQ(again.size(), ahead.size());
    for (std::size_t i = 0; i < ahead.size(); ++i) {
      EXPECT_EQ(again[i].line_index, ahead[i]);
      EXPECT_EQ(again[i].custom_id, want[ahead[i]].first);
      EXPECT_EQ(again[i].prompt, "p" + want[ahead[i]].first);
      EXPECT_EQ(again[i].input_line, want[ahead[i]].second) << "line " << ahead[i];
    }
  };
  std::uint64_t job = 0;
  {
    auto m = JobManager::open(tmp.file("state"));
    ASSERT_TRUE(m.ok());
    auto submitted = (*m)->submit(spec);
    ASSERT_TRUE(submitted.ok()) << submitted.error().to_string();
    job = *submitted;
    ASSERT_EQ((*m)->next_work(10, "w0").size(), 10u);
    claim_and_check(**m, job);
  }
  auto reopened = JobManager::open(tmp.file("state"));  // no index yet
  ASSERT_TRUE(reopened.ok());
  ASSERT_EQ((*reopened)->next_work(10, "w0").size(), 10u);
  claim_and_check(**reopened, job);
}

TEST_F(JobManagerClaim, ClaimsOfFinishedJobsAndUnknownLinesAreIgnored) {
  auto m = JobManager::open(tmp_.file("state"));
  ASSERT_TRUE(m.ok());
  const std::uint64_t job = *(*m)->submit(spec_for(tmp_, "run.out"));
  auto c = (*m)->claim_in_flight("w", {});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, 0u);
  // The parse error line (index 7) was committed at submit: not claimable.
  c = (*m)->claim_in_flight("w", {LineRef{job, 7}, LineRef{job, 8}});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, 1u);
  EXPECT_EQ((*m)->in_flight_count("w"), 1u);
  EXPECT_EQ((*m)->in_flight_count("nobody"), 0u);
  // Requeued before the reader got to it, line 8 goes out once.
  ASSERT_EQ((*m)->requeue_in_flight("w"), 1u);
  const auto all = (*m)->next_work(1000, "y");
  EXPECT_EQ(std::count_if(all.begin(), all.end(), [](const BatchRequest& r) { return r.line_index == 8; }), 1);
  const auto p = *(*m)->progress(job);
  EXPECT_EQ(all.size(), p.total - p.done);
  ASSERT_EQ((*m)->requeue_in_flight("y"), all.size());
  c = (*m)->claim_in_flight("w", {LineRef{job, 8}});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, 1u);
  drain(**m);
  // Line 8 is w's: drain never got it.
  EXPECT_EQ((*m)->progress(job)->state, JobState::running);
  auto work = (*m)->next_work(10, "x");
  EXPECT_TRUE(work.empty());
  ASSERT_EQ((*m)->requeue_in_flight("w"), 1u);
  drain(**m);
  EXPECT_EQ((*m)->progress(job)->state, JobState::done);
  c = (*m)->claim_in_flight("w", {LineRef{job, 8}});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, 0u);  // the job is done
  EXPECT_EQ(testing_support::normalize_output_ids(read_file(tmp_.file("run.out"))), testing_support::normalize_output_ids(clean_));
}

}  // namespace
}  // namespace shardline::orchestrator
