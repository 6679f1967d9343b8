// The HTTP API of a `shardline node start --http` process: the curl
// walkthrough of docs/http.md run as written (its output equal to `shardline
// run` on the same file after the job-id fields), per-line errors in the
// error file, refused input files, the OpenAI error objects and statuses of
// bad requests and keys (counted on /metrics), 200 concurrent polls during a
// running batch, a node killed with SIGKILL mid-batch whose batch still
// completes with every custom_id exactly once, and a batch cancelled
// mid-way whose files hold exactly what finished before the cancel.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <random>
#include <thread>

#include "tests/api/api_harness.hpp"

namespace shardline::api {
namespace api_http_e2e_test {

using json = nlohmann::json;
using testing::ApiNode;
using testing::body;
using testing::upload;
using testing_support::kShardline;
using testing_support::read_file;
using testing_support::run_command;

using HttpE2e = testing_support::TempDirTest;

/// The ```sh block after `<!-- curl-example -->` in docs/http.md.
std::string curl_example() {
  const std::string doc = read_file(std::string(SHARDLINE_SOURCE_DIR) + "/docs/http.md");
  const auto marker = doc.find("<!-- curl-example -->");
  const auto start = doc.find("```sh\n", marker);
  const auto end = doc.find("```", start + 6);
  if (marker == std::string::npos || start == std::string::npos || end == std::string::npos) return "";
  return doc.substr(start + 6, end - start - 6);
}

/// Polls a batch until it is no longer running.
json wait_batch(httplib::Client& c, const std::string& id, std::vector<json>* history = nullptr) {
  for (int i = 0; i < 1200; ++i) {
    json b = body(c.Get("/v1/batches/" + id));
    if (history) history->push_back(b);
    const std::string s = b.value("status", "");
    if (s != "validating" && s != "in_progress" && s != "finalizing" && s != "cancelling") return b;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return json();
}

json create_batch(httplib::Client& c, const std::string& file_id, const std::string& endpoint = "/v1/completions") {
  return body(c.Post("/v1/batches",
                     json{{"input_file_id", file_id}, {"endpoint", endpoint}, {"completion_window", "24h"}}.dump(),
                     "application/json"));
}

TEST_F(HttpE2e, TheCurlWalkthroughOfTheDocsMatchesRun) {
  const std::string input = testing::demo_prompts(24);
  std::ofstream(path("prompts.jsonl")) << input;
  ApiNode node(dir_.string());
  ASSERT_GT(node.port(), 0) << node.log();
  const std::string script = curl_example();
  ASSERT_NE(script.find("curl"), std::string::npos) << "no curl example in docs/http.md";
  std::ofstream(path("example.sh")) << script;
  const auto r = run_command("cd " + dir_.string() + " && API=" + node.url() + " KEY=" + testing::kApiKey +
                             " timeout 300 bash -euo pipefail example.sh");
  ASSERT_EQ(r.exit_code, 0) << r.out << node.log();
  EXPECT_NE(r.out.find("completed {'total': 24, 'completed': 24, 'failed': 0}"), std::string::npos) << r.out;

  const auto run = run_command(kShardline + " run --quiet --threads 1 --model " + testing_support::kStoriesDir +
                               " --input " + path("prompts.jsonl") + " --output " + path("run.jsonl"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const std::string got = read_file(path("output.jsonl")), want = read_file(path("run.jsonl"));
  ASSERT_FALSE(want.empty());
  EXPECT_EQ(testing::normalize_job_ids(got), testing::normalize_job_ids(want));
}

TEST_F(HttpE2e, BadLinesGoToTheErrorFileAndBadFilesFailTheBatch) {
  ApiNode node(dir_.string());
  auto c = node.client();
  const std::string good = R"({"custom_id":"g","method":"POST","url":"/v1/chat/completions","body":{"messages":[{"role":"user","content":"hi"}],"max_tokens":4}})";
  const std::string bad = R"({"custom_id":"b","method":"POST","url":"/v1/chat/completions","body":{"messages":[{"role":"user","content":"hi"}],"frobnicate":1}})";
  // stories260K has no chat template: the good line fails per line too, with
  // chat_template_missing; a completions batch shows the split.
  const std::string cg = R"({"custom_id":"ok","method":"POST","url":"/v1/completions","body":{"prompt":"Once upon a time","max_tokens":4}})";
  const std::string cb = R"({"custom_id":"bad","method":"POST","url":"/v1/completions","body":{"prompt":"x","best_of":3}})";
  json f = body(upload(*c, cg + "\n" + cb + "\n"));
  json b = wait_batch(*c, create_batch(*c, f["id"])["id"]);
  ASSERT_EQ(b["status"], "completed") << b.dump();
  EXPECT_EQ(b["request_counts"], (json{{"total", 2}, {"completed", 1}, {"failed", 1}}));
  auto out = c->Get("/v1/files/" + b["output_file_id"].get<std::string>() + "/content");
  auto err = c->Get("/v1/files/" + b["error_file_id"].get<std::string>() + "/content");
  ASSERT_TRUE(out && err);
  EXPECT_NE(out->body.find("\"custom_id\":\"ok\""), std::string::npos) << out->body;
  EXPECT_EQ(out->body.find("\"custom_id\":\"bad\""), std::string::npos) << out->body;
  EXPECT_NE(err->body.find("\"custom_id\":\"bad\""), std::string::npos) << err->body;
  EXPECT_NE(err->body.find("unsupported_parameter"), std::string::npos) << err->body;

  f = body(upload(*c, good + "\n" + bad + "\n"));
  b = wait_batch(*c, create_batch(*c, f["id"], "/v1/chat/completions")["id"]);
  EXPECT_EQ(b["status"], "completed") << b.dump();
  EXPECT_EQ(b["request_counts"]["failed"], 2);
  EXPECT_TRUE(b["output_file_id"].is_null());
  err = c->Get("/v1/files/" + b["error_file_id"].get<std::string>() + "/content");
  EXPECT_NE(err->body.find("chat_template_missing"), std::string::npos) << err->body;
  EXPECT_NE(err->body.find("unknown_parameter"), std::string::npos) << err->body;

  // Duplicate custom_ids and a line of the other endpoint: refused as OpenAI does.
  f = body(upload(*c, cg + "\n" + cg + "\n" + good + "\n"));
  b = create_batch(*c, f["id"]);
  EXPECT_EQ(b["status"], "failed") << b.dump();
  ASSERT_EQ(b["errors"]["data"].size(), 2u) << b.dump();
  EXPECT_EQ(b["errors"]["data"][0]["code"], "duplicate_custom_id");
  EXPECT_EQ(b["errors"]["data"][1]["code"], "mismatched_endpoint");
}

// Issue 46, item 3: cpp-httplib's SO_REUSEPORT let a second node start on a
// keyed node's --http port, and the kernel split the requests between them.
// Now the second one exits at start with the port named, and the first
// keeps answering every request.
TEST_F(HttpE2e, SecondNodeOnTheSameHttpPortIsAStartError) {
  ApiNode node(dir_.string());
  ASSERT_GT(node.port(), 0) << node.log();
  const std::string port = std::to_string(node.port());
  std::filesystem::create_directories(path("second"));
  const auto second = run_command("timeout 60 " + kShardline + " node start --model " + testing_support::kStoriesDir +
                                  " --listen 127.0.0.1:0 --key-file " + path("cluster.key") + " --data-dir " +
                                  path("second/data") + " --http 127.0.0.1:" + port + " --threads 1");
  EXPECT_NE(second.exit_code, 0) << second.out;
  EXPECT_NE(second.exit_code, 124) << "the second node started: " << second.out;
  EXPECT_NE(second.out.find("cannot listen on 127.0.0.1:" + port), std::string::npos) << second.out;
  EXPECT_NE(second.out.find("in use"), std::string::npos) << second.out;
  auto keyless = node.client("");
  for (int i = 0; i < 6; ++i) {
    const auto r = keyless->Get("/v1/batches");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401) << "request " << i << " reached another server";
  }
}

TEST_F(HttpE2e, BadRequestsGetOpenAiErrorsAndAuthFailuresAreCounted) {
  ApiNode node(dir_.string(), {"--metrics", "127.0.0.1:0", "--max-upload-mib", "1"});
  auto c = node.client();
  auto expect = [](const httplib::Result& r, int status, const std::string& text) {
    ASSERT_TRUE(r) << "no response";
    EXPECT_EQ(r->status, status) << r->body;
    const json j = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.contains("error")) << r->body;
    for (const char* k : {"message", "type", "param", "code"}) EXPECT_TRUE(j["error"].contains(k)) << r->body;
    EXPECT_NE(j["error"]["message"].get<std::string>().find(text), std::string::npos) << r->body;
  };
  expect(node.client("")->Get("/v1/files"), 401, "didn't provide an API key");
  expect(node.client("sk-wrong")->Get("/v1/batches"), 401, "Incorrect API key");
  // The scheme is case-insensitive, then one or more spaces (RFC 7235;
  // issue 46, item 4); another scheme is no key.
  for (const std::string header : {"bearer " + testing::kApiKey, "BEARER  " + testing::kApiKey, "Bearer " + testing::kApiKey}) {
    httplib::Client raw("127.0.0.1", node.port());
    const auto r = raw.Get("/v1/batches", {{"Authorization", header}});
    ASSERT_TRUE(r) << header;
    EXPECT_EQ(r->status, 200) << header << ": " << r->body;
  }
  {
    httplib::Client raw("127.0.0.1", node.port());
    expect(raw.Get("/v1/batches", {{"Authorization", "Basic " + testing::kApiKey}}), 401, "didn't provide an API key");
    expect(raw.Get("/v1/batches", {{"Authorization", "Bearer"}}), 401, "didn't provide an API key");
  }
  expect(c->Get("/v1/files/file-nope"), 404, "No such File object");
  expect(c->Get("/v1/batches/batch_nope"), 404, "No such Batch object");
  expect(c->Post("/v1/batches/batch_nope/cancel", "", "application/json"), 404, "No such Batch object");
  expect(c->Get("/v1/nothing"), 404, "Unknown request URL");
  expect(upload(*c, R"({"custom_id":"a"})" "\n", "fine-tune"), 400, "purpose");
  expect(upload(*c, "not json\n"), 400, "Must be .jsonl");
  expect(c->Post("/v1/files", "{}", "application/json"), 400, "multipart/form-data");
  expect(c->Post("/v1/files", "--xyz\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nabc",
                 "multipart/form-data; boundary=xyz"),
         400, "");
  expect(upload(*c, std::string(2u << 20, 'x')), 413, "");
  expect(c->Post("/v1/batches", "{not json", "application/json"), 400, "not valid JSON");
  expect(c->Post("/v1/batches", "{\"metadata\": " + std::string(100000, '[') + std::string(100000, ']') + "}",
                 "application/json"),
         400, "nested deeper than 64 levels");
  const json f = body(upload(*c, R"({"custom_id":"a","method":"POST","url":"/v1/completions","body":{"prompt":"x"}})"));
  expect(c->Post("/v1/batches",
                 json{{"input_file_id", f["id"]}, {"endpoint", "/v1/embeddings"}, {"completion_window", "24h"}}.dump(),
                 "application/json"),
         400, "Invalid value for 'endpoint'");
  expect(c->Get("/v1/batches?limit=abc"), 400, "limit");
  // The node is still serving; the four refused requests were counted.
  EXPECT_EQ(c->Get("/v1/files")->status, 200);
  httplib::Client m("127.0.0.1", node.metrics_port());
  auto metrics = m.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("shardline_http_auth_failures_total 4"), std::string::npos) << metrics->body;
  EXPECT_NE(node.log().find("wrong API key"), std::string::npos);
}

TEST_F(HttpE2e, RandomAndMutatedBodiesNeverCrashTheNode) {
  ApiNode node(dir_.string());
  auto c = node.client();
  const std::string valid_multipart =
      "--b0\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
      "--b0\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.jsonl\"\r\n"
      "Content-Type: application/jsonl\r\n\r\n{\"custom_id\":\"a\"}\n\r\n--b0--\r\n";
  const std::string valid_batch = R"({"input_file_id":"file-x","endpoint":"/v1/completions","completion_window":"24h"})";
  std::mt19937 rng(1234);
  auto mutate = [&](std::string s) {
    const int edits = 1 + static_cast<int>(rng() % 8);
    for (int e = 0; e < edits && !s.empty(); ++e) {
      const std::size_t at = rng() % s.size();
      switch (rng() % 4) {
        case 0: s[at] = static_cast<char>(rng() % 256); break;
        case 1: s.erase(at, 1 + rng() % 16); break;
        case 2: s.insert(at, std::string(1 + rng() % 8, static_cast<char>(rng() % 256))); break;
        default: s = s.substr(0, at); break;
      }
    }
    return s;
  };
  int answered = 0;
  for (int i = 0; i < 300; ++i) {
    std::string b;
    if (i % 3 == 2) {
      b.resize(rng() % 512);
      for (char& ch : b) ch = static_cast<char>(rng() % 256);
    }
    auto r1 = c->Post("/v1/files", i % 3 == 2 ? b : mutate(valid_multipart), "multipart/form-data; boundary=b0");
    auto r2 = c->Post("/v1/batches", i % 3 == 2 ? b : mutate(valid_batch), "application/json");
    for (const auto* r : {&r1, &r2}) {
      if (!*r) continue;
      ++answered;
      EXPECT_TRUE((*r)->status == 200 || ((*r)->status >= 400 && (*r)->status < 500)) << (*r)->status << (*r)->body;
    }
  }
  EXPECT_GT(answered, 500);
  EXPECT_FALSE(node.child().exited()) << node.log();
  // Still serving, and a real batch still runs.
  const json f = body(upload(*c, testing::demo_prompts(3)));
  const json b = wait_batch(*c, create_batch(*c, f["id"])["id"]);
  EXPECT_EQ(b["status"], "completed") << b.dump();
}

TEST_F(HttpE2e, TwoHundredConcurrentPollsDuringABatch) {
  ApiNode node(dir_.string());
  auto c = node.client();
  const json f = body(upload(*c, testing::demo_prompts(200)));
  const std::string id = create_batch(*c, f["id"])["id"];
  std::atomic<int> ok{0}, bad{0}, running{0};
  std::atomic<long long> max_ms{0};
  std::mutex error_mu;
  std::string first_error;
  std::vector<std::thread> pollers;
  for (int t = 0; t < 200; ++t)
    pollers.emplace_back([&] {
      auto cl = node.client();
      for (int k = 0; k < 3; ++k) {
        const auto t0 = std::chrono::steady_clock::now();
        auto r = cl->Get("/v1/batches/" + id);
        const long long ms =
            std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
        long long prev = max_ms.load();
        while (ms > prev && !max_ms.compare_exchange_weak(prev, ms)) {
        }
        if (r && r->status == 200) {
          ++ok;
          if (r->body.find("\"status\":\"in_progress\"") != std::string::npos) ++running;
        } else {
          ++bad;
          std::lock_guard<std::mutex> lock(error_mu);
          if (first_error.empty())
            first_error = r ? "HTTP " + std::to_string(r->status) + " " + r->body : httplib::to_string(r.error());
        }
      }
    });
  for (auto& t : pollers) t.join();
  EXPECT_EQ(ok.load(), 600);
  EXPECT_EQ(bad.load(), 0) << first_error;
  EXPECT_GT(running.load(), 0) << "no poll saw the batch running";
  EXPECT_LT(max_ms.load(), 5000) << "a status poll waited " << max_ms.load() << " ms";
  std::cout << "600 polls by 200 clients: slowest " << max_ms.load() << " ms\n";
  const json b = wait_batch(*c, id);
  ASSERT_EQ(b["status"], "completed") << b.dump();
  auto out = c->Get("/v1/files/" + b["output_file_id"].get<std::string>() + "/content");
  ASSERT_TRUE(out);
  EXPECT_EQ(std::count(out->body.begin(), out->body.end(), '\n'), 200);
}

TEST_F(HttpE2e, ANodeKilledMidBatchFinishesItOnceAfterARestart) {
  const std::string input = testing::demo_prompts(120);
  std::string batch_id;
  {
    // Four sequences at a time: the batch takes long enough to be cut.
    ApiNode node(dir_.string(), {"--max-batch", "4"}, "node1.log");
    auto c = node.client();
    const json f = body(upload(*c, input));
    batch_id = create_batch(*c, f["id"])["id"];
    // Kill it once some lines are done and before all are.
    int completed = 0;
    for (int i = 0; i < 3000 && completed < 10; ++i) {
      completed = body(c->Get("/v1/batches/" + batch_id))["request_counts"]["completed"].get<int>();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    node.child().kill(SIGKILL);
    node.child().wait();
    ASSERT_GE(completed, 10);
    ASSERT_LT(completed, 120) << "the batch finished before the kill";
  }
  ApiNode again(dir_.string(), {"--max-batch", "4"}, "node2.log");
  auto c = again.client();
  const json b = wait_batch(*c, batch_id);
  ASSERT_EQ(b["status"], "completed") << b.dump() << again.log();
  EXPECT_EQ(b["request_counts"], (json{{"total", 120}, {"completed", 120}, {"failed", 0}}));
  const std::string out = c->Get("/v1/files/" + b["output_file_id"].get<std::string>() + "/content")->body;
  std::istringstream lines(out);
  std::string line;
  std::multiset<std::string> ids;
  while (std::getline(lines, line)) ids.insert(json::parse(line)["custom_id"].get<std::string>());
  EXPECT_EQ(ids.size(), 120u);
  EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()).size(), 120u);
  // The same bytes as a run without a kill.
  std::ofstream(path("in.jsonl")) << input;
  const auto run = run_command(kShardline + " run --quiet --threads 1 --model " + testing_support::kStoriesDir +
                               " --input " + path("in.jsonl") + " --output " + path("run.jsonl"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  EXPECT_EQ(testing::normalize_job_ids(out), testing::normalize_job_ids(read_file(path("run.jsonl"))));
}

TEST_F(HttpE2e, ACancelledBatchKeepsWhatFinishedAndTheNodeRunsTheNext) {
  const std::string input = testing::demo_prompts(120);
  ApiNode node(dir_.string(), {"--max-batch", "4", "--metrics", "127.0.0.1:0"});
  auto c = node.client();
  const json f = body(upload(*c, input));
  const std::string id = create_batch(*c, f["id"])["id"];
  int completed = 0;
  for (int i = 0; i < 3000 && completed < 5; ++i) {
    completed = body(c->Get("/v1/batches/" + id))["request_counts"]["completed"].get<int>();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_GE(completed, 5);
  const json cancelled = body(c->Post("/v1/batches/" + id + "/cancel", "", "application/json"));
  ASSERT_TRUE(cancelled.value("status", "") == "cancelling" || cancelled.value("status", "") == "cancelled")
      << cancelled.dump();
  const json b = wait_batch(*c, id);
  ASSERT_EQ(b["status"], "cancelled") << b.dump() << node.log();
  EXPECT_FALSE(b["cancelled_at"].is_null());
  const int done = b["request_counts"]["completed"].get<int>();
  EXPECT_GE(done, completed);
  ASSERT_LT(done, 120) << "the batch finished before the cancel";
  EXPECT_EQ(b["request_counts"]["failed"], 0);
  // Its output: the lines that finished, each as `shardline run` writes it,
  // in input order.
  const std::string out = c->Get("/v1/files/" + b["output_file_id"].get<std::string>() + "/content")->body;
  std::ofstream(path("in.jsonl")) << input;
  const auto run = run_command(kShardline + " run --quiet --threads 1 --model " + testing_support::kStoriesDir +
                               " --input " + path("in.jsonl") + " --output " + path("run.jsonl"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  std::map<std::string, std::string> want;
  std::vector<std::string> order;
  {
    std::istringstream lines(testing::normalize_job_ids(read_file(path("run.jsonl"))));
    std::string line;
    while (std::getline(lines, line)) {
      const std::string cid = json::parse(line)["custom_id"];
      want[cid] = line;
      order.push_back(cid);
    }
  }
  std::istringstream lines(testing::normalize_job_ids(out));
  std::string line;
  int n = 0;
  std::size_t last = 0;
  while (std::getline(lines, line)) {
    const std::string cid = json::parse(line)["custom_id"];
    EXPECT_EQ(line, want[cid]);
    const std::size_t pos = static_cast<std::size_t>(std::find(order.begin(), order.end(), cid) - order.begin());
    EXPECT_TRUE(n == 0 || pos > last) << "out of input order: " << cid;
    last = pos;
    ++n;
  }
  EXPECT_EQ(n, done);
  // Cancelling again answers the same batch; a completed one refuses.
  EXPECT_EQ(body(c->Post("/v1/batches/" + id + "/cancel", "", "application/json")), b);
  // The workers dropped the cancelled lines: the next batch runs at once.
  const json f2 = body(upload(*c, testing::demo_prompts(3)));
  const std::string id2 = create_batch(*c, f2["id"])["id"];
  const json b2 = wait_batch(*c, id2);
  EXPECT_EQ(b2["status"], "completed") << b2.dump();
  auto refused = c->Post("/v1/batches/" + id2 + "/cancel", "", "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 409);
  EXPECT_EQ(body(refused)["error"]["code"], "batch_not_cancellable");
  httplib::Client m("127.0.0.1", node.metrics_port());
  auto metrics = m.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("shardline_jobs{state=\"cancelled\"} 1"), std::string::npos) << metrics->body;
}

}  // namespace
}  // namespace shardline::api
