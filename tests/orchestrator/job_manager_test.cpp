#include "orchestrator/job_manager.hpp"

#include <gtest/gtest.h>

#include <filesystem>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "orchestrator/batch_format.hpp"
#include "tests/orchestrator/fake_clock.hpp"
#include "tests/orchestrator/temp_dir.hpp"
#include "tests/support/output_ids.hpp"

namespace shardline::orchestrator {

using worker::BatchChoice;
using worker::BatchRequest;
using worker::BatchResult;

namespace orchestrator_job_manager_test {

using testing::FakeClock;
using testing::read_file;
using testing::TempDir;
using testing::write_file;

/// What a worker would answer: deterministic text from the request.
BatchResult fake_result(const BatchRequest& r) {
  BatchResult out;
  out.job_id = r.job_id;
  out.line_index = r.line_index;
  out.custom_id = r.custom_id;
  out.ok = true;
  for (int i = 0; i < r.n; ++i) {
    BatchChoice c;
    c.index = i;
    c.text = " echo:" + r.prompt + "#" + std::to_string(i);
    c.finish_reason = "length";
    if (r.return_token_ids) c.token_ids = {1, 2, 3};
    out.choices.push_back(c);
  }
  out.prompt_tokens = static_cast<int>(r.prompt.size());
  out.completion_tokens = r.params.max_tokens * r.n;
  return out;
}

JobSpec spec_for(const TempDir& tmp, std::vector<std::string> inputs, const std::string& out) {
  JobSpec s;
  s.model_dir = "/models/stories260K/";
  s.input_paths = std::move(inputs);
  s.output_path = tmp.file(out);
  return s;
}

/// Runs the job(s) to the end with one fake worker, `batch` requests at a time.
void drain(JobManager& m, std::size_t batch = 3) {
  for (int guard = 0; guard < 10000; ++guard) {
    auto work = m.next_work(batch, "w");
    if (work.empty()) break;
    std::vector<BatchResult> results;
    for (const auto& r : work) results.push_back(fake_result(r));
    auto n = m.on_results(results);
    ASSERT_TRUE(n.ok()) << n.error().to_string();
  }
}

std::vector<nlohmann::json> read_lines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::string text = read_file(path);
  std::size_t pos = 0;
  while (pos < text.size()) {
    const auto nl = text.find('\n', pos);
    out.push_back(nlohmann::json::parse(text.substr(pos, nl - pos)));
    pos = nl + 1;
  }
  return out;
}

TEST(JobManager, GoodAndBadLinesGiveOneOutputLineEach) {
  TempDir tmp;
  write_file(tmp.file("a.jsonl"),
             "{\"prompt\":\"p0\",\"max_tokens\":2}\n"
             "\n"                                   // blank: skipped, not counted
             "not json\n"                           // line 1
             "{\"custom_id\":\"x\",\"method\":\"POST\",\"url\":\"/v1/completions\","
             "\"body\":{\"prompt\":\"p2\",\"n\":2,\"return_token_ids\":true}}\r\n"
             "{\"max_tokens\":3}\n");               // line 3: missing_prompt
  write_file(tmp.file("b.jsonl"),
             "{\"custom_id\":\"c\",\"url\":\"/v1/chat/completions\",\"body\":{}}\n"  // line 4
             "{\"prompt\":[5,6,7],\"max_tokens\":1}");  // line 5, no final newline
  auto m = JobManager::open(tmp.file("state"));
  ASSERT_TRUE(m.ok()) << m.error().to_string();
  auto id = (*m)->submit(spec_for(tmp, {tmp.file("a.jsonl"), tmp.file("b.jsonl")}, "out.jsonl"));
  ASSERT_TRUE(id.ok()) << id.error().to_string();

  auto p = *(*m)->progress(*id);
  EXPECT_EQ(p.total, 6u);
  EXPECT_EQ(p.done, 3u);  // the three bad lines, committed at submit
  EXPECT_EQ(p.failed, 3u);
  EXPECT_EQ(p.state, JobState::queued);

  drain(**m);
  p = *(*m)->progress(*id);
  EXPECT_EQ(p.state, JobState::done);
  EXPECT_EQ(p.done, 6u);
  EXPECT_EQ(p.failed, 3u);
  EXPECT_EQ(p.written, 6u);
  EXPECT_EQ(p.pending, 0u);
  EXPECT_EQ(p.eta_s, 0.0);
  EXPECT_EQ(p.prompt_tokens, 2u + 2u + 0u);  // "p0", "p2", and "" for the token-id prompt
  EXPECT_EQ(p.completion_tokens, 2u + 16u * 2 + 1u);

  const auto lines = read_lines(tmp.file("out.jsonl"));
  ASSERT_EQ(lines.size(), 6u);
  EXPECT_EQ(lines[0]["custom_id"], "1");
  EXPECT_EQ(lines[0]["response"]["body"]["model"], "stories260K");
  EXPECT_EQ(lines[0]["response"]["body"]["choices"][0]["text"], " echo:p0#0");
  EXPECT_EQ(lines[1]["error"]["code"], "invalid_json");
  EXPECT_EQ(lines[1]["custom_id"], "2");
  EXPECT_EQ(lines[2]["custom_id"], "x");
  EXPECT_EQ(lines[2]["response"]["body"]["choices"].size(), 2u);
  EXPECT_EQ(lines[2]["response"]["body"]["choices"][1]["token_ids"], nlohmann::json({1, 2, 3}));
  EXPECT_EQ(lines[3]["error"]["code"], "missing_prompt");
  EXPECT_EQ(lines[4]["error"]["code"], "missing_prompt");  // a chat line without messages
  EXPECT_EQ(lines[4]["custom_id"], "c");
  // Errors name their line in its shard (blank lines counted), as the
  // `line` of OpenAI's batch errors (issue 46, item 13).
  EXPECT_EQ(lines[1]["error"]["line"], 3);  // "not json", after a blank line
  EXPECT_EQ(lines[3]["error"]["line"], 5);
  EXPECT_EQ(lines[4]["error"]["line"], 1);  // the first line of b.jsonl
  EXPECT_FALSE(lines[0]["response"].is_null());
  const std::string key = (*m)->job(*id)->output_id_key;
  EXPECT_EQ(lines[5]["id"], "batch_req_" + output_line_id(key, 5));
  EXPECT_EQ(lines[5]["response"]["request_id"], "cmpl-" + output_line_id(key, 5));
  EXPECT_TRUE(lines[5]["error"].is_null());
}

// A custom_id an earlier line of the job has (its own or the default line
// number) is the later line's duplicate_custom_id error, committed at submit;
// the first line runs, and a restart does not run the duplicate either.
TEST(JobManager, DuplicateCustomIdsAreErrorsOfTheLaterLines) {
  TempDir tmp;
  write_file(tmp.file("a.jsonl"),
             "{\"custom_id\":\"a\",\"prompt\":\"p0\"}\n"
             "{\"custom_id\":\"b\",\"prompt\":\"p1\"}\n"
             "{\"custom_id\":\"a\",\"prompt\":\"p2\"}\n"
             "{\"prompt\":\"p3\"}\n"  // custom_id "4"
             "not json\n");              // custom_id "5"
  write_file(tmp.file("b.jsonl"), "{\"custom_id\":\"4\",\"prompt\":\"p5\"}\n{\"custom_id\":\"a\",\"max_tokens\":1}\n");
  std::uint64_t id = 0;
  {
    auto m = JobManager::open(tmp.file("state"));
    ASSERT_TRUE(m.ok());
    auto submitted = (*m)->submit(spec_for(tmp, {tmp.file("a.jsonl"), tmp.file("b.jsonl")}, "out.jsonl"));
    ASSERT_TRUE(submitted.ok()) << submitted.error().to_string();
    id = *submitted;
    EXPECT_EQ((*m)->progress(id)->failed, 4u);  // lines 2, 4 (bad JSON), 5, 6
    auto work = (*m)->next_work(2, "w");  // then the node stops before any result
    ASSERT_EQ(work.size(), 2u);
  }
  auto m = JobManager::open(tmp.file("state"));
  ASSERT_TRUE(m.ok());
  std::set<std::uint64_t> ran;
  for (int guard = 0; guard < 100; ++guard) {
    auto work = (*m)->next_work(3, "w");
    if (work.empty()) break;
    std::vector<BatchResult> results;
    for (const auto& r : work) {
      ran.insert(r.line_index);
      results.push_back(fake_result(r));
    }
    ASSERT_TRUE((*m)->on_results(results).ok());
  }
  EXPECT_EQ(ran, (std::set<std::uint64_t>{0, 1, 3}));
  const auto lines = read_lines(tmp.file("out.jsonl"));
  ASSERT_EQ(lines.size(), 7u);
  EXPECT_EQ(lines[2]["error"]["code"], "duplicate_custom_id");
  EXPECT_EQ(lines[2]["custom_id"], "a");
  EXPECT_NE(lines[2]["error"]["message"].get<std::string>().find("line 1"), std::string::npos);
  EXPECT_EQ(lines[3]["custom_id"], "4");
  EXPECT_TRUE(lines[3]["error"].is_null());
  EXPECT_EQ(lines[4]["error"]["code"], "invalid_json");
  EXPECT_EQ(lines[5]["error"]["code"], "duplicate_custom_id");
  EXPECT_NE(lines[5]["error"]["message"].get<std::string>().find("line 4"), std::string::npos);
  EXPECT_EQ(lines[6]["error"]["code"], "duplicate_custom_id");  // checked before its own missing prompt
}

TEST(JobManager, LinesOverTheSizeLimitAreErrorsAndNeverHeld) {
  TempDir tmp;
  const std::string huge = "{\"custom_id\":\"big\",\"prompt\":\"" + std::string(5000, 'x') + "\"}";
  // Blank lines, CRLF, a too-long line in the middle and as the last line
  // without a newline; the limit (200 bytes) below the 64 KiB read blocks
  // and a 200 KiB line across several blocks.
  write_file(tmp.file("a.jsonl"), "{\"custom_id\":\"a\",\"prompt\":\"p0\"}\r\n\n" + huge +
                                      "\n{\"custom_id\":\"b\",\"prompt\":\"p1\"}\n" + std::string(200 * 1024, 'y') +
                                      "\n\n" + std::string(201, ' ') + "\n{\"custom_id\":\"c\",\"prompt\":\"" +
                                      std::string(150, 'z') + "\"}\n" + huge);
  JobManagerOptions options;
  options.max_line_bytes = 200;
  auto m = JobManager::open(tmp.file("state"), options);
  ASSERT_TRUE(m.ok());
  auto id = (*m)->submit(spec_for(tmp, {tmp.file("a.jsonl")}, "out.jsonl"));
  ASSERT_TRUE(id.ok()) << id.error().to_string();
  EXPECT_EQ((*m)->progress(*id)->total, 7u);
  EXPECT_EQ((*m)->progress(*id)->failed, 4u);  // two huge, the 200 KiB one, the 201 spaces
  std::set<std::string> ran;
  for (int guard = 0; guard < 100; ++guard) {
    auto work = (*m)->next_work(3, "w");
    if (work.empty()) break;
    std::vector<BatchResult> results;
    for (const auto& r : work) {
      ran.insert(r.custom_id);
      results.push_back(fake_result(r));
    }
    ASSERT_TRUE((*m)->on_results(results).ok());
  }
  EXPECT_EQ(ran, (std::set<std::string>{"a", "b", "c"}));
  const auto lines = read_lines(tmp.file("out.jsonl"));
  ASSERT_EQ(lines.size(), 7u);
  EXPECT_TRUE(lines[0]["error"].is_null());
  EXPECT_EQ(lines[1]["error"]["code"], "line_too_long");
  EXPECT_EQ(lines[1]["custom_id"], "2");  // never parsed: the default id
  EXPECT_EQ(lines[1]["error"]["message"].get<std::string>(),
            "line 3 of " + tmp.file("a.jsonl") + " is " + std::to_string(huge.size()) +
                " bytes; a line may have at most 200 bytes");
  EXPECT_TRUE(lines[2]["error"].is_null());
  EXPECT_EQ(lines[3]["error"]["code"], "line_too_long");
  EXPECT_NE(lines[3]["error"]["message"].get<std::string>().find(" is 204800 bytes"), std::string::npos);
  EXPECT_EQ(lines[4]["error"]["code"], "line_too_long");  // 201 spaces: too long before it is blank
  EXPECT_TRUE(lines[5]["error"].is_null());
  EXPECT_EQ(lines[5]["custom_id"], "c");
  EXPECT_EQ(lines[6]["error"]["code"], "line_too_long");
  EXPECT_NE(lines[6]["error"]["message"].get<std::string>().find("line 9 of "), std::string::npos);
}

TEST(JobManager, WorkerErrorsCarryTheirInputLineThroughRequeues) {
  TempDir tmp;
  write_file(tmp.file("a.jsonl"), "\n{\"prompt\":\"p0\"}\n\n\n{\"prompt\":\"p1\"}\n{\"prompt\":\"p2\"}\n");
  auto m = JobManager::open(tmp.file("state"));
  ASSERT_TRUE(m.ok());
  auto id = (*m)->submit(spec_for(tmp, {tmp.file("a.jsonl")}, "out.jsonl"));
  ASSERT_TRUE(id.ok()) << id.error().to_string();
  auto work = (*m)->next_work(3, "w1");
  ASSERT_EQ(work.size(), 3u);
  EXPECT_EQ(work[0].input_line, 2u);
  EXPECT_EQ(work[1].input_line, 5u);
  EXPECT_EQ(work[2].input_line, 6u);
  // w1 dies; its lines go to w2, which fails line 1 and finishes the others.
  EXPECT_EQ((*m)->requeue_in_flight("w1"), 3u);
  work = (*m)->next_work(3, "w2");
  ASSERT_EQ(work.size(), 3u);
  std::vector<BatchResult> results;
  for (const auto& r : work) {
    if (r.line_index == 1) results.push_back(make_error_result(*id, 1, r.custom_id, "context_length_exceeded", "x"));
    else results.push_back(fake_result(r));
  }
  ASSERT_TRUE((*m)->on_results(results).ok());
  const auto lines = read_lines(tmp.file("out.jsonl"));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[1]["error"]["code"], "context_length_exceeded");
  EXPECT_EQ(lines[1]["error"]["line"], 5);
  EXPECT_FALSE(lines[0].contains("line"));
}

TEST(JobManager, JobsAreServedFifo) {
  TempDir tmp;
  write_file(tmp.file("a.jsonl"), "{\"prompt\":\"a0\"}\n{\"prompt\":\"a1\"}\n{\"prompt\":\"a2\"}\n");
  write_file(tmp.file("b.jsonl"), "{\"prompt\":\"b0\"}\n{\"prompt\":\"b1\"}\n");
  auto m = JobManager::open(tmp.file("state"));
  ASSERT_TRUE(m.ok());
  const auto a = *(*m)->submit(spec_for(tmp, {tmp.file("a.jsonl")}, "a.out"));
  const auto b = *(*m)->submit(spec_for(tmp, {tmp.file("b.jsonl")}, "b.out"));
  EXPECT_LT(a, b);
  auto w1 = (*m)->next_work(2, "w1");
  ASSERT_EQ(w1.size(), 2u);
  EXPECT_EQ(w1[0].job_id, a);
  EXPECT_EQ(w1[0].prompt, "a0");
  EXPECT_EQ(w1[1].prompt, "a1");
  auto w2 = (*m)->next_work(3, "w2");
  ASSERT_EQ(w2.size(), 3u);
  EXPECT_EQ(w2[0].prompt, "a2");
  EXPECT_EQ(w2[1].job_id, b);
  EXPECT_EQ(w2[1].prompt, "b0");
  EXPECT_EQ(w2[2].prompt, "b1");
  EXPECT_TRUE((*m)->next_work(5, "w3").empty());
  EXPECT_EQ((*m)->progress(a)->state, JobState::running);
  EXPECT_EQ((*m)->progress(a)->in_flight, 3u);

  // w1 dies: its requests come back first.
  EXPECT_EQ((*m)->requeue_in_flight("w1"), 2u);
  EXPECT_EQ((*m)->progress(a)->pending, 2u);
  auto again = (*m)->next_work(10, "w3");
  ASSERT_EQ(again.size(), 2u);
  EXPECT_EQ(again[0].prompt, "a0");
  EXPECT_EQ(again[1].prompt, "a1");

  // Results in any order; a duplicate from the "dead" worker is ignored.
  std::vector<BatchResult> results;
  for (const auto& r : w2) results.push_back(fake_result(r));
  for (const auto& r : again) results.push_back(fake_result(r));
  std::reverse(results.begin(), results.end());
  EXPECT_EQ(*(*m)->on_results(results), 5u);
  EXPECT_EQ(*(*m)->on_result(fake_result(w1[0])), 0u);
  EXPECT_EQ((*m)->progress(a)->state, JobState::done);
  EXPECT_EQ((*m)->progress(b)->state, JobState::done);
  EXPECT_TRUE((*m)->idle());
  const auto jobs = (*m)->list_jobs();
  ASSERT_EQ(jobs.size(), 2u);
  EXPECT_EQ(read_lines(tmp.file("a.out")).size(), 3u);
  EXPECT_EQ(read_lines(tmp.file("b.out")).size(), 2u);
}

TEST(JobManager, RestartRequeuesEverythingUncommittedAndOutputMatchesCleanRun) {
  TempDir tmp;
  std::string input;
  for (int i = 0; i < 40; ++i) {
    input += (i % 9 == 4) ? "{\"prompt\":\"x\",\"top_p\":7}\n" : "{\"prompt\":\"p" + std::to_string(i) + "\"}\n";
  }
  write_file(tmp.file("in.jsonl"), input);

  // Clean run.
  {
    auto m = JobManager::open(tmp.file("clean"));
    ASSERT_TRUE(m.ok());
    auto spec = spec_for(tmp, {tmp.file("in.jsonl")}, "clean.out");
    ASSERT_TRUE((*m)->submit(spec).ok());
    drain(**m, 5);
  }
  const std::string clean = read_file(tmp.file("clean.out"));
  ASSERT_FALSE(clean.empty());

  std::uint64_t job = 0;
  std::vector<BatchRequest> lost;
  {
    auto m = JobManager::open(tmp.file("state"));
    ASSERT_TRUE(m.ok());
    job = *(*m)->submit(spec_for(tmp, {tmp.file("in.jsonl")}, "run.out"));
    auto work = (*m)->next_work(12, "w");
    // Commit every other one, out of order; the rest are "lost" in the crash.
    std::vector<BatchResult> some;
    for (std::size_t i = 0; i < work.size(); ++i) {
      if (i % 2 == 1) some.push_back(fake_result(work[i]));
      else lost.push_back(work[i]);
    }
    ASSERT_TRUE((*m)->on_results(some).ok());
    EXPECT_GT((*m)->progress(job)->in_flight, 0u);
  }  // crash: in-flight state is gone
  {
    std::ofstream torn(tmp.file("run.out"), std::ios::binary | std::ios::app);
    torn << "{\"id\":\"torn";
  }
  auto m = JobManager::open(tmp.file("state"));
  ASSERT_TRUE(m.ok()) << m.error().to_string();
  auto p = *(*m)->progress(job);
  EXPECT_EQ(p.state, JobState::running);
  EXPECT_EQ(p.in_flight, 0u);
  EXPECT_EQ(p.pending, p.total - p.done);
  // The lost requests are handed out again (first, being the lowest lines).
  auto work = (*m)->next_work(lost.size(), "w2");
  ASSERT_EQ(work.size(), lost.size());
  for (std::size_t i = 0; i < lost.size(); ++i) EXPECT_EQ(work[i].line_index, lost[i].line_index);
  std::vector<BatchResult> results;
  for (const auto& r : work) results.push_back(fake_result(r));
  ASSERT_TRUE((*m)->on_results(results).ok());
  drain(**m, 4);
  EXPECT_EQ((*m)->progress(job)->state, JobState::done);
  // Same bytes as the clean run, apart from the ids (another job's).
  const std::string run = read_file(tmp.file("run.out"));
  EXPECT_EQ(testing_support::normalize_output_ids(run), testing_support::normalize_output_ids(clean));
  // Its own ids are its key's, the same before and after the restart
  // (issue 46, item 16).
  const std::string key = (*m)->job(job)->output_id_key;
  ASSERT_EQ(key.size(), 32u);
  std::size_t line = 0;
  for (std::size_t at = 0; at < run.size(); ++line) {
    const std::size_t nl = run.find('\n', at);
    ASSERT_NE(nl, std::string::npos);
    EXPECT_EQ(nlohmann::json::parse(run.substr(at, nl - at))["id"], "batch_req_" + output_line_id(key, line)) << line;
    at = nl + 1;
  }
  EXPECT_EQ(line, 40u);
}

TEST(JobManager, ProgressRatesFollowTheClock) {
  TempDir tmp;
  std::string input;
  for (int i = 0; i < 10; ++i) input += "{\"prompt\":\"p\",\"max_tokens\":10}\n";
  write_file(tmp.file("in.jsonl"), input);
  FakeClock clock;
  JobManagerOptions opts;
  opts.clock = clock.fn();
  auto m = JobManager::open(tmp.file("state"), opts);
  ASSERT_TRUE(m.ok());
  const auto job = *(*m)->submit(spec_for(tmp, {tmp.file("in.jsonl")}, "out"));
  EXPECT_EQ((*m)->progress(job)->eta_s, -1.0);
  auto work = (*m)->next_work(4, "w");
  clock.t += 2.0;
  std::vector<BatchResult> results;
  for (const auto& r : work) results.push_back(fake_result(r));
  ASSERT_TRUE((*m)->on_results(results).ok());
  auto p = *(*m)->progress(job);
  EXPECT_EQ(p.done, 4u);
  EXPECT_EQ(p.completion_tokens, 40u);
  EXPECT_DOUBLE_EQ(p.tokens_per_s, 20.0);  // 40 tokens in 2 s
  EXPECT_DOUBLE_EQ(p.eta_s, 3.0);          // 6 lines left at 2 lines/s
  EXPECT_EQ(p.written, 4u);
  drain(**m);
  clock.t += 100.0;  // frozen once done
  p = *(*m)->progress(job);
  EXPECT_EQ(p.state, JobState::done);
  EXPECT_DOUBLE_EQ(p.tokens_per_s, 50.0);
  EXPECT_EQ(p.eta_s, 0.0);
}

TEST(JobManager, SubmitErrorsAndEdgeCases) {
  TempDir tmp;
  auto m = JobManager::open(tmp.file("state"));
  ASSERT_TRUE(m.ok());
  auto missing = (*m)->submit(spec_for(tmp, {tmp.file("nope.jsonl")}, "out"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, ErrorCode::not_found);
  EXPECT_TRUE((*m)->list_jobs().empty());
  EXPECT_FALSE((*m)->submit(spec_for(tmp, {}, "out")).ok());

  write_file(tmp.file("in.jsonl"), "{\"prompt\":\"a\"}\n");
  EXPECT_FALSE((*m)->submit(spec_for(tmp, {tmp.file("in.jsonl")}, "in.jsonl")).ok());
  ASSERT_TRUE((*m)->submit(spec_for(tmp, {tmp.file("in.jsonl")}, "out")).ok());
  auto busy = (*m)->submit(spec_for(tmp, {tmp.file("in.jsonl")}, "out"));
  ASSERT_FALSE(busy.ok());
  EXPECT_EQ(busy.error().code, ErrorCode::invalid_argument);

  // An empty job is done at once.
  write_file(tmp.file("empty.jsonl"), "\n  \n");
  auto e = (*m)->submit(spec_for(tmp, {tmp.file("empty.jsonl")}, "empty.out"));
  ASSERT_TRUE(e.ok());
  EXPECT_EQ((*m)->progress(*e)->state, JobState::done);
  EXPECT_EQ(read_file(tmp.file("empty.out")), "");
  // A shard none of whose lines is a JSON object is not JSONL: the submit is
  // refused naming the shard, its first line's number and a snippet, and no
  // job is created (issue 46, item 13: a CSV ran as a job of invalid_json
  // lines and exited 0).
  const std::size_t jobs_before = (*m)->list_jobs().size();
  write_file(tmp.file("table.csv"), "\nid,prompt\n1,hello\n");
  auto csv = (*m)->submit(spec_for(tmp, {tmp.file("table.csv")}, "csv.out"));
  ASSERT_FALSE(csv.ok());
  EXPECT_EQ(csv.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(csv.error().message.find(tmp.file("table.csv") + " is not JSONL"), std::string::npos)
      << csv.error().message;
  EXPECT_NE(csv.error().message.find("line 2: not valid JSON: \"id,prompt\""), std::string::npos)
      << csv.error().message;
  write_file(tmp.file("array.json"), "[{\"prompt\": \"a\"},\n {\"prompt\": \"b\"}]\n");
  auto arr = (*m)->submit(spec_for(tmp, {tmp.file("array.json")}, "arr.out"));
  ASSERT_FALSE(arr.ok());
  EXPECT_NE(arr.error().message.find("line 1: not valid JSON"), std::string::npos) << arr.error().message;
  write_file(tmp.file("list.jsonl"), "[1, 2]\n");
  auto list = (*m)->submit(spec_for(tmp, {tmp.file("in.jsonl"), tmp.file("list.jsonl")}, "list.out"));
  ASSERT_FALSE(list.ok()) << "the second shard is checked too";
  EXPECT_NE(list.error().message.find(tmp.file("list.jsonl") + " is not JSONL"), std::string::npos)
      << list.error().message;
  EXPECT_NE(list.error().message.find("line 1: a JSON array, not an object"), std::string::npos)
      << list.error().message;
  EXPECT_EQ((*m)->list_jobs().size(), jobs_before);
  EXPECT_FALSE(std::filesystem::exists(tmp.file("csv.out")));
  // One good line makes a shard JSONL: its bad lines are per-line errors.
  write_file(tmp.file("mixed.jsonl"), "x\n{\"prompt\":\"a\"}\ny\n");
  auto b = (*m)->submit(spec_for(tmp, {tmp.file("mixed.jsonl")}, "mixed.out"));
  ASSERT_TRUE(b.ok()) << b.error().to_string();
  EXPECT_EQ((*m)->progress(*b)->total, 3u);

  // Results for unknown jobs or lines are ignored.
  BatchResult stray;
  stray.job_id = 999;
  EXPECT_EQ(*(*m)->on_result(stray), 0u);
  EXPECT_FALSE((*m)->progress(999).ok());
}

// The orchestrator's submits carry what the cluster runs: the job is
// admitted against it before anything is read or created (admit_job), and
// records the config it runs on; submits without it (tests, tools) are not
// checked against a cluster.
TEST(JobManager, SubmitAdmitsTheJobAgainstTheCluster) {
  TempDir tmp;
  auto m = JobManager::open(tmp.file("state"));
  ASSERT_TRUE(m.ok());
  write_file(tmp.file("in.jsonl"), "{\"prompt\":\"a\"}\n");
  std::filesystem::create_directories(tmp.file("model"));
  const ClusterShape cluster{tmp.file("model"), engine::ParallelConfig{1, 2, 1, 1}, 2, "none"};
  auto spec = [&](const std::string& out) {
    JobSpec s = spec_for(tmp, {tmp.file("in.jsonl")}, out);
    s.model_dir = tmp.file("model");
    return s;
  };

  JobSpec other_model = spec("a.out");
  other_model.model_dir = tmp.file("other");
  auto refused = (*m)->submit(other_model, &cluster);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(refused.error().message,
            "this cluster serves the model " + tmp.file("model") + ", not " + tmp.file("other"));
  JobSpec other_shape = spec("b.out");
  other_shape.parallel = "tp=2,pp=1,sp=1,dp=2";
  refused = (*m)->submit(other_shape, &cluster);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("job asks tp=2,pp=1,sp=1,dp=2; this cluster's workers are 2 engine groups"),
            std::string::npos)
      << refused.error().message;
  JobSpec other_sharing = spec("c.out");
  other_sharing.weight_sharing = "sidp";
  refused = (*m)->submit(other_sharing, &cluster);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().message, "this cluster runs --weight-sharing none; the job asks for --weight-sharing sidp");
  // Nothing of the refused jobs exists.
  EXPECT_TRUE((*m)->list_jobs().empty());
  for (const char* out : {"a.out", "b.out", "c.out"}) EXPECT_FALSE(std::filesystem::exists(tmp.file(out))) << out;

  // Admitted: without --parallel it runs on (and records) the cluster's
  // config; with one, the one it asked.
  auto id = (*m)->submit(spec("d.out"), &cluster);
  ASSERT_TRUE(id.ok()) << id.error().to_string();
  EXPECT_EQ((*m)->job(*id)->spec.parallel, "tp=1,pp=2,sp=1,dp=2");
  JobSpec asked = spec("e.out");
  asked.parallel = "tp=1,pp=2,sp=1,dp=2";
  asked.weight_sharing = "none";
  id = (*m)->submit(asked, &cluster);
  ASSERT_TRUE(id.ok()) << id.error().to_string();
  EXPECT_EQ((*m)->job(*id)->spec.parallel, "tp=1,pp=2,sp=1,dp=2");
  // No cluster: no admission (the model folder of spec_for does not exist).
  EXPECT_TRUE((*m)->submit(spec_for(tmp, {tmp.file("in.jsonl")}, "f.out")).ok());
}

TEST(JobManager, ChangedInputFailsTheJobOnRestart) {
  TempDir tmp;
  write_file(tmp.file("in.jsonl"), "{\"prompt\":\"a\"}\n{\"prompt\":\"b\"}\n");
  std::uint64_t job = 0;
  {
    auto m = JobManager::open(tmp.file("state"));
    ASSERT_TRUE(m.ok());
    job = *(*m)->submit(spec_for(tmp, {tmp.file("in.jsonl")}, "out"));
  }
  write_file(tmp.file("in.jsonl"), "{\"prompt\":\"a\"}\n");
  auto m = JobManager::open(tmp.file("state"));
  ASSERT_TRUE(m.ok());
  auto p = *(*m)->progress(job);
  EXPECT_EQ(p.state, JobState::failed);
  EXPECT_NE(p.error.find("in.jsonl"), std::string::npos);
  EXPECT_TRUE((*m)->next_work(5, "w").empty());
}

}  // namespace
}  // namespace shardline::orchestrator
