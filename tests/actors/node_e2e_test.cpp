// End to end through the `shardline` binary: the embedded `run`, a node and a
// client in two processes over loopback, per-line errors, the cluster key.
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include <nlohmann/json.hpp>

#include "tests/support/demo_prompts.hpp"
#include "tests/support/output_ids.hpp"
#include "tests/support/process.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline {
namespace actors_node_e2e_test {

namespace fs = std::filesystem;
using testing_support::Child;
using testing_support::kShardline;
using testing_support::read_file;
using testing_support::run_command;

using NodeE2e = testing_support::TempDirTest;

std::vector<nlohmann::json> read_jsonl(const std::string& file) {
  std::vector<nlohmann::json> out;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

void write_reference_input(const std::string& file) {
  std::ofstream out(file);
  int i = 0;
  for (const auto& c : testing_support::load_stories_reference()) {
    nlohmann::json body{{"model", "stories260K"}, {"prompt", c.prompt},     {"max_tokens", 48},
                        {"temperature", 0},       {"return_token_ids", true}};
    out << nlohmann::json{{"custom_id", "ref-" + std::to_string(i++)}, {"method", "POST"},
                          {"url", "/v1/completions"}, {"body", body}}
               .dump()
        << "\n";
  }
}

TEST_F(NodeE2e, RunGivesTheReferenceTokenIds) {
  write_reference_input(path("in.jsonl"));
  const auto r = run_command(kShardline + " run --quiet --model " + testing_support::kStoriesDir + " --input " +
                             path("in.jsonl") + " --output " + path("out.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto lines = read_jsonl(path("out.jsonl"));
  const auto refs = testing_support::load_stories_reference();
  ASSERT_EQ(lines.size(), refs.size());
  for (std::size_t i = 0; i < refs.size(); ++i) {
    EXPECT_EQ(lines[i]["custom_id"], "ref-" + std::to_string(i));
    const auto& choice = lines[i]["response"]["body"]["choices"][0];
    EXPECT_EQ(choice["token_ids"].get<std::vector<std::int32_t>>(), refs[i].generated_ids) << i;
    EXPECT_EQ(refs[i].prompt + choice["text"].get<std::string>(), refs[i].full_text);
    EXPECT_EQ(lines[i]["response"]["body"]["usage"]["completion_tokens"], 48);
    EXPECT_TRUE(lines[i]["error"].is_null());
  }
}

// The same `run` again reports its finished job (nothing is rerun); other
// inputs into the same output and data dir run as a new job.
TEST_F(NodeE2e, RunAgainReportsItsJobAndNewInputsRunANewJobWithOverwrite) {
  write_reference_input(path("a.jsonl"));
  {
    std::ofstream b(path("b.jsonl"));
    b << R"({"custom_id": "b-1", "body": {"prompt": "Lily wanted to", "max_tokens": 8, "temperature": 0}})" "\n";
  }
  const std::string base = kShardline + " run --model " + testing_support::kStoriesDir + " --output " +
                           path("out.jsonl") + " --data-dir " + path("data") + " --input ";
  ASSERT_EQ(run_command(base + path("a.jsonl")).exit_code, 0);
  const std::string first = read_file(path("out.jsonl"));
  const auto again = run_command(base + path("a.jsonl"));
  ASSERT_EQ(again.exit_code, 0) << again.out;
  EXPECT_NE(again.out.find("continuing job 1"), std::string::npos) << again.out;
  EXPECT_EQ(read_file(path("out.jsonl")), first);
  // Other inputs into the same output: a second job, which replaces the
  // first one's file only with --overwrite (issue 46, item 9).
  const auto refused = run_command(base + path("b.jsonl"));
  EXPECT_EQ(refused.exit_code, 1) << refused.out;
  EXPECT_NE(refused.out.find("already exists (the output of job 1, done): pass --overwrite"), std::string::npos)
      << refused.out;
  EXPECT_EQ(read_file(path("out.jsonl")), first);
  const auto other = run_command(base + path("b.jsonl") + " --overwrite");
  ASSERT_EQ(other.exit_code, 0) << other.out;
  EXPECT_NE(other.out.find("job 2:"), std::string::npos) << other.out;
  const auto lines = read_jsonl(path("out.jsonl"));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["custom_id"], "b-1");
}

// Issue 46, item 5: a line of 100,000 nested arrays killed `run` with
// SIGSEGV, and every restart of its job died again. Now the line is an
// invalid_json error, the others complete, and running again finds the job
// finished with the same output.
TEST_F(NodeE2e, DeeplyNestedLineIsAPerLineErrorAndTheJobRestarts) {
  {
    std::ofstream in(path("in.jsonl"));
    in << R"({"custom_id": "a", "body": {"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}})" "\n"
       << R"({"custom_id": "deep", "body": {"prompt": "Hi", "max_tokens": )" << std::string(100000, '[')
       << std::string(100000, ']') << "}}\n"
       << R"({"custom_id": "b", "body": {"prompt": "Lily wanted to", "max_tokens": 4, "temperature": 0}})" "\n";
  }
  const std::string cmd = kShardline + " run --quiet --model " + testing_support::kStoriesDir + " --input " +
                          path("in.jsonl") + " --output " + path("out.jsonl") + " --data-dir " + path("data");
  const auto r = run_command(cmd);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto lines = read_jsonl(path("out.jsonl"));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_TRUE(lines[0]["error"].is_null()) << lines[0].dump();
  EXPECT_EQ(lines[1]["custom_id"], "2");  // its custom_id was never read: the line number
  EXPECT_EQ(lines[1]["error"]["code"], "invalid_json");
  EXPECT_NE(lines[1]["error"]["message"].get<std::string>().find("nested deeper than 64 levels"), std::string::npos)
      << lines[1].dump();
  EXPECT_TRUE(lines[2]["error"].is_null()) << lines[2].dump();
  const std::string first = read_file(path("out.jsonl"));
  const auto again = run_command(cmd);
  ASSERT_EQ(again.exit_code, 0) << again.out;
  EXPECT_EQ(read_file(path("out.jsonl")), first);
}

// Issue 46, item 12: a model folder without a tokenizer ran every line on
// ids, wrote ids as text and exited 0. Now a usage error before anything is
// created (no output, no state folder).
TEST_F(NodeE2e, RunRefusesAModelWithoutATokenizerBeforeCreatingAnything) {
  std::filesystem::create_directories(path("no-tokenizer"));
  for (const char* f : {"config.json", "model.safetensors"})
    std::filesystem::copy_file(std::filesystem::path(testing_support::kStoriesDir) / f, path("no-tokenizer") + "/" + f);
  std::ofstream(path("in.jsonl")) << R"({"prompt": "Once upon a time", "max_tokens": 4})" "\n";
  const auto r = run_command(kShardline + " run --quiet --model " + path("no-tokenizer") + " --input " +
                             path("in.jsonl") + " --output " + path("out.jsonl"));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("has no tokenizer"), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists(path("out.jsonl")));
  EXPECT_FALSE(std::filesystem::exists(path("out.jsonl.shardline")));
}

TEST_F(NodeE2e, BadLinesGetPerLineErrorsAndGoodLinesComplete) {
  {
    std::ofstream in(path("in.jsonl"));
    in << R"({"custom_id": "good-1", "body": {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}})" "\n"
       << R"({"custom_id": "broken", "body": {"prompt": )" "\n"
       << R"({"custom_id": "no-prompt", "body": {"max_tokens": 8}})" "\n"
       << R"({"custom_id": "unknown", "body": {"prompt": "hi", "frobnicate": 3}})" "\n"
       << R"({"custom_id": "chat", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "hi"}]}})" "\n"
       << R"({"custom_id": "too-long", "body": {"prompt": "Once upon a time", "max_tokens": 600}})" "\n"
       << R"({"prompt": "Lily wanted to", "max_tokens": 8, "temperature": 0})" "\n";
  }
  const auto r = run_command(kShardline + " run --quiet --model " + testing_support::kStoriesDir + " --input " +
                             path("in.jsonl") + " --output " + path("out.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto lines = read_jsonl(path("out.jsonl"));
  ASSERT_EQ(lines.size(), 7u);
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"good-1", ""},
      {"2", "invalid_json"},  // a malformed line's custom_id cannot be read: its line number
      {"no-prompt", "missing_prompt"},
      {"unknown", "unknown_parameter"},
      {"chat", "chat_template_missing"},  // stories260K has no chat template and the job gave none
      {"too-long", "context_length_exceeded"},
      {"7", ""}};
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(lines[i]["custom_id"], expected[i].first);
    if (expected[i].second.empty()) {
      EXPECT_TRUE(lines[i]["error"].is_null()) << lines[i].dump();
      EXPECT_EQ(lines[i]["response"]["status_code"], 200);
      EXPECT_EQ(lines[i]["response"]["body"]["usage"]["completion_tokens"], 8);
    } else {
      EXPECT_TRUE(lines[i]["response"].is_null()) << lines[i].dump();
      EXPECT_EQ(lines[i]["error"]["code"], expected[i].second) << lines[i].dump();
      EXPECT_FALSE(lines[i]["error"]["message"].get<std::string>().empty());
    }
  }
  // The last good line is greedy: the same 8 tokens `shardline generate` gives.
  EXPECT_EQ(lines[6]["response"]["body"]["choices"][0]["text"], " go on a walk.");
}

// Issue 46, item 6: a 4 MiB prompt line held its worker in the tokenizer past
// its heartbeats, so the line was requeued and tokenized again, forever. Now
// the worker refuses it from its length before tokenizing, and a line over
// the 16 MiB limit is an error at submit, never read into memory.
TEST_F(NodeE2e, HugePromptLinesAreRefusedAndTheOthersComplete) {
  std::string prose;
  while (prose.size() < (4u << 20)) prose += "Once upon a time, there was a little girl named Lily. ";
  {
    std::ofstream in(path("in.jsonl"));
    in << nlohmann::json{{"custom_id", "prose"}, {"prompt", prose}, {"max_tokens", 4}}.dump() << "\n"
       << R"({"custom_id": "good", "prompt": "Lily wanted to", "max_tokens": 8, "temperature": 0})" "\n"
       << nlohmann::json{{"custom_id", "over-limit"}, {"prompt", std::string(17u << 20, 'x')}}.dump() << "\n";
  }
  const auto r = run_command(kShardline + " run --quiet --model " + testing_support::kStoriesDir + " --input " +
                             path("in.jsonl") + " --output " + path("out.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto lines = read_jsonl(path("out.jsonl"));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["error"]["code"], "context_length_exceeded") << lines[0].dump().substr(0, 400);
  EXPECT_NE(lines[0]["error"]["message"].get<std::string>().find("at least"), std::string::npos);
  EXPECT_EQ(lines[1]["response"]["body"]["choices"][0]["text"], " go on a walk.");
  EXPECT_EQ(lines[2]["custom_id"], "3");
  EXPECT_EQ(lines[2]["error"]["code"], "line_too_long");
  EXPECT_NE(lines[2]["error"]["message"].get<std::string>().find("at most 16777216 bytes"), std::string::npos);
}

// Issue 46, item 9: a second job on an existing output silently replaced
// it. Now it needs --overwrite; a rerun of the same command continues (or
// reports) its own job as before.
TEST_F(NodeE2e, RunRefusesAnExistingOutputUnlessOverwrite) {
  std::ofstream(path("in.jsonl")) << R"({"prompt": "Lily wanted to", "max_tokens": 4, "temperature": 0})" "\n";
  const std::string base = kShardline + " run --quiet --model " + testing_support::kStoriesDir + " --input " +
                           path("in.jsonl") + " --output " + path("out.jsonl");
  ASSERT_EQ(run_command(base).exit_code, 0);
  const auto first = read_jsonl(path("out.jsonl"));
  ASSERT_EQ(first.size(), 1u);
  EXPECT_FALSE(std::filesystem::exists(path("out.jsonl.lock")));
  // The same command: its finished job is reported, nothing is rewritten.
  const auto again = run_command(base);
  EXPECT_EQ(again.exit_code, 0) << again.out;
  // Another data dir on the same output: refused, the file untouched.
  const auto other = run_command(base + " --data-dir " + path("other-state"));
  EXPECT_EQ(other.exit_code, 1) << other.out;
  EXPECT_NE(other.out.find("already exists"), std::string::npos) << other.out;
  EXPECT_NE(other.out.find("pass --overwrite"), std::string::npos) << other.out;
  EXPECT_EQ(read_jsonl(path("out.jsonl")), first);
  // With --overwrite it runs again, in either data dir.
  const auto replaced = run_command(base + " --data-dir " + path("other-state") + " --overwrite");
  EXPECT_EQ(replaced.exit_code, 0) << replaced.out;
  const auto rerun = run_command(base + " --overwrite");
  EXPECT_EQ(rerun.exit_code, 0) << rerun.out;
  const auto last = read_jsonl(path("out.jsonl"));
  ASSERT_EQ(last.size(), 1u);
  EXPECT_EQ(last[0]["response"]["body"]["choices"], first[0]["response"]["body"]["choices"]);
}

TEST_F(NodeE2e, NodeAndClientInTwoProcessesWithKeyAndMetrics) {
  ASSERT_EQ(run_command(kShardline + " cluster init --key-file " + path("cluster.key")).exit_code, 0);
  ASSERT_EQ(run_command(kShardline + " cluster init --key-file " + path("other.key")).exit_code, 0);
  write_reference_input(path("in.jsonl"));
  Child node({kShardline, "node", "start", "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0", "--data-dir",
              path("data"), "--model", testing_support::kStoriesDir, "--key-file", path("cluster.key")},
             path("node.log"));
  ASSERT_TRUE(node.started());
  const std::string log = node.wait_for_log("metrics on port", std::chrono::seconds(30));
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log, m, std::regex("listening on 127\\.0\\.0\\.1:(\\d+)"))) << log;
  const std::string addr = "127.0.0.1:" + m[1].str();
  ASSERT_TRUE(std::regex_search(log, m, std::regex("metrics on port (\\d+)"))) << log;
  const int metrics_port = std::stoi(m[1].str());
  const std::string client = " --node " + addr + " --key-file " + path("cluster.key");

  // A wrong key and a missing key are refused; nothing is submitted.
  auto wrong = run_command(kShardline + " job submit --node " + addr + " --key-file " + path("other.key") +
                           " --model " + testing_support::kStoriesDir + " --input " + path("in.jsonl") +
                           " --output " + path("wrong.jsonl"));
  // Refused in the TLS handshake (actors/cluster_tls.hpp), on both ends.
  EXPECT_EQ(wrong.exit_code, 1) << wrong.out;
  EXPECT_NE(wrong.out.find("the TLS handshake failed"), std::string::npos) << wrong.out;
  auto missing = run_command(kShardline + " job status --node " + addr + " --key-file " + path("none.key"));
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.out.find("none.key"), std::string::npos) << missing.out;
  EXPECT_NE(node.log().find("tls: refused a connection from 127.0.0.1:"), std::string::npos) << node.log();
  EXPECT_FALSE(std::filesystem::exists(path("wrong.jsonl")));

  auto submit = run_command(kShardline + " job submit" + client + " --model " + testing_support::kStoriesDir +
                            " --input " + path("in.jsonl") + " --output " + path("out.jsonl"));
  ASSERT_EQ(submit.exit_code, 0) << submit.out;
  EXPECT_EQ(submit.out, "1\n");

  nlohmann::json status;
  for (int i = 0; i < 300; ++i) {
    auto s = run_command(kShardline + " job status 1 --json" + client);
    ASSERT_EQ(s.exit_code, 0) << s.out;
    status = nlohmann::json::parse(s.out);
    if (status["jobs"][0]["state"] == "done") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(status["jobs"][0]["state"], "done") << status.dump();
  EXPECT_EQ(status["jobs"][0]["done"], 3);
  EXPECT_EQ(status["jobs"][0]["total"], 3);
  EXPECT_EQ(status["jobs"][0]["completion_tokens"], 3 * 48);
  bool saw_worker = false;
  for (const auto& a : status["actors"]) saw_worker = saw_worker || a["name"] == "node0/cpu:0";
  EXPECT_TRUE(saw_worker) << status.dump();
  EXPECT_FALSE(fs::exists(path("wrong.jsonl")));

  // The same job through the embedded `run` writes the same bytes.
  ASSERT_EQ(run_command(kShardline + " run --quiet --model " + testing_support::kStoriesDir + " --input " +
                        path("in.jsonl") + " --output " + path("run.jsonl"))
                .exit_code,
            0);
  EXPECT_EQ(testing_support::normalize_output_ids(read_file(path("out.jsonl"))),
            testing_support::normalize_output_ids(read_file(path("run.jsonl"))));  // two jobs: two sets of ids

  httplib::Client metrics("127.0.0.1", metrics_port);
  auto res = metrics.Get("/metrics");
  ASSERT_TRUE(res);
  // Whole sample lines: "... 3" alone would also match 30 or 3.5.
  EXPECT_NE(res->body.find("shardline_requests_total{state=\"done\"} 3\n"), std::string::npos) << res->body;
  EXPECT_NE(res->body.find("shardline_generation_tokens_total 144\n"), std::string::npos) << res->body;
  EXPECT_NE(res->body.find("shardline_auth_failures_total"), std::string::npos) << res->body;

  auto actors = run_command(kShardline + " actor list" + client);
  EXPECT_EQ(actors.exit_code, 0);
  EXPECT_NE(actors.out.find("node0/kvstore"), std::string::npos) << actors.out;

  node.kill(SIGTERM);
  EXPECT_EQ(node.wait_or_kill(std::chrono::seconds(20)), 0) << "node did not stop on SIGTERM: " << node.log();
}

// `job cancel` stops a running job: its output file keeps the lines finished
// before it, each as an uncancelled run writes it, in input order.
TEST_F(NodeE2e, JobCancelKeepsTheFinishedLines) {
  ASSERT_EQ(run_command(kShardline + " cluster init --key-file " + path("cluster.key")).exit_code, 0);
  // Enough lines that the job is still running when the cancel arrives: 120
  // lines of stories260K at batch 4 finished in under a second, sometimes
  // between the poll that saw 3 done and the cancel (2 of 8 runs here).
  constexpr int kLines = 600;
  ASSERT_EQ(testing_support::write_demo_prompts(path("in.jsonl"), kLines), kLines);
  Child node({kShardline, "node", "start", "--listen", "127.0.0.1:0", "--data-dir", path("data"), "--model",
              testing_support::kStoriesDir, "--key-file", path("cluster.key"), "--max-batch", "4", "--threads", "1"},
             path("node.log"));
  const std::string log = node.wait_for_log("listening on", std::chrono::seconds(30));
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log, m, std::regex("listening on 127\\.0\\.0\\.1:(\\d+)"))) << log;
  const std::string client = " --node 127.0.0.1:" + m[1].str() + " --key-file " + path("cluster.key");
  auto submit = run_command(kShardline + " job submit" + client + " --model " + testing_support::kStoriesDir +
                            " --input " + path("in.jsonl") + " --output " + path("out.jsonl"));
  ASSERT_EQ(submit.exit_code, 0) << submit.out;
  for (int i = 0; i < 600; ++i) {
    const auto s = nlohmann::json::parse(run_command(kShardline + " job status 1 --json" + client).out);
    if (s["jobs"][0]["done"].get<int>() >= 3) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const auto cancel = run_command(kShardline + " job cancel 1" + client);
  ASSERT_EQ(cancel.exit_code, 0) << cancel.out;
  ASSERT_TRUE(std::regex_search(cancel.out, m, std::regex("job 1 cancelled: (\\d+) of " + std::to_string(kLines) + " lines \\(0 with errors\\)")))
      << cancel.out;
  const int done = std::stoi(m[1].str());
  EXPECT_GE(done, 3);
  ASSERT_LT(done, kLines) << "the job finished before the cancel";
  const auto status = nlohmann::json::parse(run_command(kShardline + " job status 1 --json" + client).out);
  EXPECT_EQ(status["jobs"][0]["state"], "cancelled");
  EXPECT_EQ(status["jobs"][0]["done"], done);

  ASSERT_EQ(run_command(kShardline + " run --quiet --threads 1 --model " + testing_support::kStoriesDir +
                        " --input " + path("in.jsonl") + " --output " + path("run.jsonl"))
                .exit_code,
            0);
  const auto want = read_jsonl(path("run.jsonl"));
  const auto got = read_jsonl(path("out.jsonl"));
  ASSERT_EQ(static_cast<int>(got.size()), done);
  std::size_t next = 0;  // got[] is a subsequence of want[] (ignoring the job-id fields)
  for (const auto& line : got) {
    while (next < want.size() && want[next]["custom_id"] != line["custom_id"]) ++next;
    ASSERT_LT(next, want.size()) << "not in input order, or not an input line: " << line.dump();
    EXPECT_EQ(line["response"]["body"]["choices"], want[next]["response"]["body"]["choices"]);
    ++next;
  }

  // Again: fine. An unknown job, or a finished one, is a clear error.
  EXPECT_EQ(run_command(kShardline + " job cancel 1" + client).exit_code, 0);
  const auto unknown = run_command(kShardline + " job cancel 99" + client);
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_NE(unknown.out.find("no such job"), std::string::npos) << unknown.out;
  ASSERT_EQ(testing_support::write_demo_prompts(path("small.jsonl"), 2), 2);
  ASSERT_EQ(run_command(kShardline + " job submit" + client + " --model " + testing_support::kStoriesDir +
                        " --input " + path("small.jsonl") + " --output " + path("small.out.jsonl"))
                .exit_code,
            0);
  for (int i = 0; i < 600; ++i) {
    const auto s = nlohmann::json::parse(run_command(kShardline + " job status 2 --json" + client).out);
    if (s["jobs"][0]["state"] == "done") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const auto finished = run_command(kShardline + " job cancel 2" + client);
  EXPECT_EQ(finished.exit_code, 1);
  EXPECT_NE(finished.out.find("job 2 is already done"), std::string::npos) << finished.out;
  node.kill(SIGTERM);
  EXPECT_EQ(node.wait_or_kill(std::chrono::seconds(20)), 0) << node.log();
}

TEST_F(NodeE2e, SecondNodeJoinsTheClusterWithItsWorkers) {
  ASSERT_EQ(run_command(kShardline + " cluster init --key-file " + path("cluster.key")).exit_code, 0);
  testing_support::write_demo_prompts(path("in.jsonl"), 150);
  Child a({kShardline, "node", "start", "--name", "a", "--listen", "127.0.0.1:0", "--data-dir", path("data"),
           "--model", testing_support::kStoriesDir, "--key-file", path("cluster.key")},
          path("a.log"));
  std::smatch m;
  const std::string log = a.wait_for_log("listening on", std::chrono::seconds(30));
  ASSERT_TRUE(std::regex_search(log, m, std::regex("listening on 127\\.0\\.0\\.1:(\\d+)"))) << log;
  const std::string addr = "127.0.0.1:" + m[1].str();
  const std::string client = " --node " + addr + " --key-file " + path("cluster.key");
  // A node with the wrong key cannot join: the TLS handshake fails and it
  // exits with that error before starting a worker.
  ASSERT_EQ(run_command(kShardline + " cluster init --key-file " + path("other.key")).exit_code, 0);
  Child intruder({kShardline, "node", "start", "--name", "x", "--join", addr, "--model",
                  testing_support::kStoriesDir, "--key-file", path("other.key")},
                 path("x.log"));
  EXPECT_EQ(intruder.wait_or_kill(std::chrono::seconds(30)), 1) << intruder.log();
  EXPECT_NE(intruder.log().find("the TLS handshake failed"), std::string::npos) << intruder.log();
  Child b({kShardline, "node", "start", "--name", "b", "--join", addr, "--model", testing_support::kStoriesDir,
           "--key-file", path("cluster.key")},
          path("b.log"));
  std::string actors;
  for (int i = 0; i < 100; ++i) {
    actors = run_command(kShardline + " actor list" + client).out;
    // Both workers register on their own time (engine load): wait for both.
    if (actors.find("a/cpu:0") != std::string::npos && actors.find("b/cpu:0") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_NE(actors.find("a/cpu:0"), std::string::npos) << actors;
  EXPECT_NE(actors.find("b/cpu:0"), std::string::npos) << actors;
  EXPECT_EQ(actors.find("x/cpu:0"), std::string::npos) << actors;
  ASSERT_EQ(run_command(kShardline + " job submit" + client + " --model " + testing_support::kStoriesDir +
                        " --input " + path("in.jsonl") + " --output " + path("out.jsonl"))
                .exit_code,
            0);
  nlohmann::json status;
  for (int i = 0; i < 600; ++i) {
    status = nlohmann::json::parse(run_command(kShardline + " job status 1 --json" + client).out);
    if (status["jobs"][0]["state"] == "done") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(status["jobs"][0]["state"], "done") << status.dump();
  ASSERT_EQ(run_command(kShardline + " run --quiet --model " + testing_support::kStoriesDir + " --input " +
                        path("in.jsonl") + " --output " + path("run.jsonl"))
                .exit_code,
            0);
  EXPECT_TRUE(testing_support::same_output(read_file(path("out.jsonl")), read_file(path("run.jsonl"))));
  for (Child* c : {&b, &a}) {
    c->kill(SIGTERM);
    EXPECT_EQ(c->wait_or_kill(std::chrono::seconds(20)), 0) << "node did not stop on SIGTERM: " << c->log();
  }
}

}  // namespace
}  // namespace shardline
