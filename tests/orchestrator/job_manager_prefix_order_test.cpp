// Prefix-aware scheduling of a job's lines (issue 42, step 4;
// orchestrator/line_order.hpp): lines that share a prompt prefix go out
// together, each line exactly once, the order survives a restart of the
// orchestrator (it is stored with the job), claimed lines are not handed out
// twice, and the output file is the one input order gives. The job's
// progress carries the prompts' prefix tree's share of their text (the
// ideal hit rate) and the cached tokens the workers reported.

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "orchestrator/job_manager.hpp"
#include "orchestrator/line_order.hpp"
#include "tests/orchestrator/temp_dir.hpp"
#include "tests/support/output_ids.hpp"

namespace shardline::orchestrator {
namespace orchestrator_job_manager_prefix_order_test {

using testing::read_file;
using testing::TempDir;
using testing::write_file;
using worker::BatchRequest;
using worker::BatchResult;

constexpr int kLines = 30;
constexpr int kHeads = 3;

/// Head h: 200 characters, each head's first character its own.
std::string head(int h) { return std::string(1, static_cast<char>('A' + h)) + std::string(199, static_cast<char>('a' + h)); }
int head_of(const std::string& prompt) { return prompt[0] - 'A'; }
std::string prompt_of(int line) { return head(line % kHeads) + " q" + std::to_string(line); }

/// 30 lines, the three heads interleaved (line i behind head i % 3).
std::string input() {
  std::string s;
  for (int i = 0; i < kLines; ++i) s += R"({"custom_id":"r)" + std::to_string(i) + R"(","prompt":")" + prompt_of(i) + "\"}\n";
  return s;
}

BatchResult result_of(const BatchRequest& r) {
  BatchResult out;
  out.job_id = r.job_id;
  out.line_index = r.line_index;
  out.custom_id = r.custom_id;
  out.ok = true;
  worker::BatchChoice c;
  c.text = " answer " + std::to_string(r.line_index);
  c.finish_reason = "length";
  out.choices.push_back(c);
  out.prompt_tokens = 50;
  out.completion_tokens = 4;
  out.cached_tokens = 40;
  return out;
}

JobSpec spec_for(const TempDir& tmp, const std::string& out) {
  JobSpec s;
  s.model_dir = "/models/stories260K/";
  s.input_paths = {tmp.file("in.jsonl")};
  s.output_path = tmp.file(out);
  return s;
}

JobManagerOptions ordered(bool on) {
  JobManagerOptions o;
  o.order_lines_by_prefix = on;
  return o;
}

/// Hands out and commits everything, `batch` lines per call; returns the lines in hand-out order.
std::vector<BatchRequest> drain(JobManager& m, std::size_t batch) {
  std::vector<BatchRequest> handed;
  for (int guard = 0; guard < 1000; ++guard) {
    auto work = m.next_work(batch, "w");
    if (work.empty()) break;
    std::vector<BatchResult> results;
    for (const auto& r : work) {
      results.push_back(result_of(r));
      handed.push_back(r);
    }
    EXPECT_TRUE(m.on_results(results).ok());
  }
  return handed;
}

/// Head changes along a hand-out order.
int head_changes(const std::vector<BatchRequest>& handed) {
  int changes = 0;
  for (std::size_t i = 1; i < handed.size(); ++i) changes += head_of(handed[i].prompt) != head_of(handed[i - 1].prompt);
  return changes;
}

// The ideal of this input, by LineOrderBuilder's rule: each text is "p" +
// the prompt; lines behind one head share 201 bytes, so 3 whole 64-byte
// chunks (192 bytes) with the line before them in the order; different heads
// share nothing.
double ideal_hit_rate() {
  double total = 0;
  for (int i = 0; i < kLines; ++i) total += static_cast<double>(1 + prompt_of(i).size());
  return (kHeads * (kLines / kHeads - 1) * 192.0) / total;
}

TEST(JobManagerPrefixOrder, LinesBehindOneHeadGoOutTogetherEachOnceAndTheOutputIsInInputOrder) {
  TempDir tmp;
  write_file(tmp.file("in.jsonl"), input());
  auto plain = JobManager::open(tmp.file("plain"), ordered(false));
  ASSERT_TRUE(plain.ok());
  ASSERT_TRUE((*plain)->submit(spec_for(tmp, "plain.out")).ok());
  const auto in_order = drain(**plain, 4);
  EXPECT_EQ(head_changes(in_order), kLines - 1) << "input order interleaves the heads";

  auto m = JobManager::open(tmp.file("state"), ordered(true));
  ASSERT_TRUE(m.ok());
  const auto job = (*m)->submit(spec_for(tmp, "sorted.out"));
  ASSERT_TRUE(job.ok()) << job.error().to_string();
  const auto handed = drain(**m, 4);
  ASSERT_EQ(handed.size(), static_cast<std::size_t>(kLines));
  EXPECT_EQ(head_changes(handed), kHeads - 1) << "each head's lines go out together";
  std::set<std::uint64_t> lines;
  for (const auto& r : handed) {
    EXPECT_TRUE(lines.insert(r.line_index).second) << "line " << r.line_index << " went out twice";
    EXPECT_EQ(r.prompt, prompt_of(static_cast<int>(r.line_index))) << "the line read where the order says it is";
  }
  EXPECT_EQ(testing_support::normalize_output_ids(read_file(tmp.file("sorted.out"))),
            testing_support::normalize_output_ids(read_file(tmp.file("plain.out"))));
  const JobProgress p = *(*m)->progress(*job);
  EXPECT_TRUE(p.prefix_ordered);
  EXPECT_DOUBLE_EQ(p.prefix_ideal_hit_rate, ideal_hit_rate());
  EXPECT_EQ(p.cached_tokens, 40u * kLines);
  EXPECT_EQ(p.prompt_tokens, 50u * kLines);
  // Input order still knows the ideal.
  const JobProgress q = (*plain)->list_jobs().at(0);
  EXPECT_FALSE(q.prefix_ordered);
  EXPECT_DOUBLE_EQ(q.prefix_ideal_hit_rate, ideal_hit_rate());
}

// A restart in the middle: the stored order is loaded, the lines not
// committed go out (in that order, the lost ones among them), each once;
// a worker that lived through it claims its lines, which are not handed
// out again; the output equals the uninterrupted run's.
TEST(JobManagerPrefixOrder, TheOrderSurvivesARestartAndClaimedLinesAreNotHandedOutTwice) {
  TempDir tmp;
  write_file(tmp.file("in.jsonl"), input());
  {
    auto clean = JobManager::open(tmp.file("clean"));
    ASSERT_TRUE(clean.ok());
    ASSERT_TRUE((*clean)->submit(spec_for(tmp, "clean.out")).ok());
    (void)drain(**clean, 5);
  }
  std::uint64_t job = 0;
  std::vector<BatchRequest> held;  // still in flight on worker "survivor" after the restart
  {
    auto m = JobManager::open(tmp.file("state"));
    ASSERT_TRUE(m.ok());
    job = *(*m)->submit(spec_for(tmp, "run.out"));
    auto first = (*m)->next_work(12, "w");
    ASSERT_EQ(first.size(), 12u);
    std::vector<BatchResult> some;
    for (std::size_t i = 0; i < first.size(); ++i)
      if (i % 3 == 0) some.push_back(result_of(first[i]));
    ASSERT_TRUE((*m)->on_results(some).ok());
    held = (*m)->next_work(3, "survivor");
    ASSERT_EQ(held.size(), 3u);
  }  // crash: in-flight state is gone
  auto m = JobManager::open(tmp.file("state"));
  ASSERT_TRUE(m.ok()) << m.error().to_string();
  EXPECT_TRUE((*m)->progress(job)->prefix_ordered);
  std::vector<worker::LineRef> refs;
  for (const auto& r : held) refs.push_back({job, r.line_index});
  auto claimed = (*m)->claim_in_flight("survivor", refs);
  ASSERT_TRUE(claimed.ok()) << claimed.error().to_string();
  EXPECT_EQ(*claimed, 3u);
  const auto rest = drain(**m, 4);
  std::set<std::uint64_t> lines;
  for (const auto& r : rest) {
    EXPECT_TRUE(lines.insert(r.line_index).second) << "line " << r.line_index << " went out twice";
    for (const auto& h : held) EXPECT_NE(r.line_index, h.line_index) << "a claimed line went out again";
  }
  EXPECT_EQ(rest.size(), static_cast<std::size_t>(kLines - 4 - 3)) << "all but the committed and the claimed";
  EXPECT_LE(head_changes(rest), kHeads - 1) << "still grouped by head";
  std::vector<BatchResult> survivors;
  for (const auto& h : held) survivors.push_back(result_of(h));
  ASSERT_TRUE((*m)->on_results(survivors).ok());
  EXPECT_EQ((*m)->progress(job)->state, JobState::done);
  EXPECT_EQ(testing_support::normalize_output_ids(read_file(tmp.file("run.out"))),
            testing_support::normalize_output_ids(read_file(tmp.file("clean.out"))));
  // Finished: its stored order is gone.
  auto order = (*m)->store().load_line_order(job);
  ASSERT_TRUE(order.ok());
  EXPECT_TRUE(order->empty());
}

// The store keeps an order of more than one chunk exactly, and says so when
// a chunk is missing.
TEST(JobManagerPrefixOrder, TheStoreKeepsTheOrderInChunksAndFindsAMissingOne) {
  TempDir tmp;
  auto store = JobStore::open(tmp.file("db"));
  ASSERT_TRUE(store.ok());
  std::vector<LineOrderEntry> order;
  for (std::uint64_t i = 0; i < JobStore::kOrderChunk * 2 + 5; ++i) order.push_back({i * 7 % 9001, i % 3, i * 100, i + 1});
  ASSERT_TRUE((*store)->put_line_order(4, order).ok());
  ASSERT_TRUE((*store)->put_line_order(5, {{1, 0, 2, 3}}).ok());
  auto back = (*store)->load_line_order(4);
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_EQ(*back, order);
  EXPECT_EQ((*store)->load_line_order(5)->size(), 1u) << "another job's order is its own";
  EXPECT_TRUE((*store)->load_line_order(6)->empty());
  ASSERT_TRUE((*store)->delete_line_order(4).ok());
  EXPECT_TRUE((*store)->load_line_order(4)->empty());
  EXPECT_EQ((*store)->load_line_order(5)->size(), 1u);
}

// The prefix text: a completion's prompt, its token ids, a chat line's
// messages; lines whose text shares its first chunks go out together, and
// the rest in input order.
TEST(JobManagerPrefixOrder, TheBuilderSortsByTheTextsChunksAndMeasuresTheSharedBytes) {
  BatchRequest a, b, c, chat;
  a.prompt = std::string(130, 'x') + "1";
  b.prompt = "y";
  c.prompt = std::string(130, 'x') + "2";
  chat.chat = true;
  chat.messages_json = R"([{"content":"hi","role":"user"}])";
  EXPECT_EQ(prefix_text(a), "p" + a.prompt);
  EXPECT_EQ(prefix_text(chat), "c" + chat.messages_json);
  BatchRequest ids;
  ids.prompt_token_ids = {1, 2};
  EXPECT_EQ(prefix_text(ids).size(), 1u + 2 * sizeof(std::int32_t));
  LineOrderBuilder builder;
  builder.add(0, {0, 0, 0}, a);
  builder.add(1, {0, 200, 1}, b);
  builder.add(2, {0, 400, 2}, c);
  builder.add(3, {0, 600, 3}, chat);
  const LineOrderBuilder::Built built = builder.build();
  ASSERT_EQ(built.order.size(), 4u);
  std::vector<std::uint64_t> lines;
  for (const auto& e : built.order) lines.push_back(e.line_index);
  // a and c (131 equal bytes: 2 whole chunks) go out together, where a
  // (the group's first line) would have; b and the chat line share nothing
  // and keep their input order.
  EXPECT_EQ(lines, (std::vector<std::uint64_t>{0, 2, 1, 3}));
  EXPECT_EQ(built.order[0].byte_offset, 0u);
  EXPECT_EQ(built.order[1].byte_offset, 400u);
  EXPECT_EQ(built.prompt_bytes, 132u + 2u + 132u + 1u + chat.messages_json.size());
  EXPECT_EQ(built.shared_bytes, 128u);
}

}  // namespace orchestrator_job_manager_prefix_order_test
}  // namespace shardline::orchestrator
