// BatchApi without HTTP: uploads checked as JSONL, batch creation refusing
// what OpenAI refuses (with its error objects), validation failures listed
// per line (duplicate custom_ids, mixed endpoints), request_counts from the
// job's progress, the job's output split into the output and error files
// exactly once (also under concurrent polls), listing and paging, and the
// records surviving a restart.
#include "api/batch_api.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/process.hpp"

namespace shardline::api {
namespace api_batch_api_test {

using json = nlohmann::json;

/// A cluster that records submitted jobs; a test sets their progress and
/// writes their outputs.
class FakeJobs final : public JobService {
 public:
  Result<std::uint64_t> submit(const messages::SubmitJob& job) override {
    std::lock_guard<std::mutex> lock(mu);
    if (refuse) return make_error(ErrorCode::invalid_argument, "refused");
    submitted.push_back(job);
    messages::JobProgress p;
    p.job_id = submitted.size();
    p.state = "running";
    p.output = job.output;
    progress_.push_back(p);
    return p.job_id;
  }
  Result<messages::JobProgress> progress(std::uint64_t id) override {
    std::lock_guard<std::mutex> lock(mu);
    ++polls;
    if (fail_progress) return make_error(ErrorCode::io, "orchestrator restarting");
    if (id == 0 || id > progress_.size()) return make_error(ErrorCode::not_found, "no job");
    return progress_[id - 1];
  }
  Result<messages::JobProgress> cancel(std::uint64_t id) override {
    std::lock_guard<std::mutex> lock(mu);
    ++cancels;
    if (fail_cancel) return make_error(ErrorCode::io, "orchestrator restarting");
    if (id == 0 || id > progress_.size()) return make_error(ErrorCode::not_found, "no job");
    auto& p = progress_[id - 1];
    if (p.state == "done" || p.state == "failed")
      return make_error(ErrorCode::invalid_argument, "job is already " + p.state);
    p.state = "cancelled";
    return p;
  }
  void set(std::uint64_t id, std::string state, std::uint64_t total, std::uint64_t done, std::uint64_t failed) {
    std::lock_guard<std::mutex> lock(mu);
    auto& p = progress_.at(id - 1);
    p.state = std::move(state);
    p.total = total;
    p.done = done;
    p.failed = failed;
  }
  std::mutex mu;
  std::vector<messages::SubmitJob> submitted;
  bool refuse = false;
  bool fail_progress = false;
  bool fail_cancel = false;
  int polls = 0;
  int cancels = 0;

 private:
  std::vector<messages::JobProgress> progress_;
};

std::string request_line(const std::string& id, const std::string& url = "/v1/completions") {
  return json{{"custom_id", id}, {"method", "POST"}, {"url", url}, {"body", {{"prompt", "hi"}}}}.dump() + "\n";
}

class BatchApiTest : public testing_support::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    open();
  }
  void open() {
    api_.reset();
    BatchApiOptions o;
    o.dir = dir_ / "api";
    o.model_dir = "/models/m";
    o.max_upload_bytes = 1 << 20;
    auto a = BatchApi::open(o, jobs_);
    ASSERT_TRUE(a.ok()) << a.error().to_string();
    api_ = std::move(a).value();
  }
  /// Uploads `text` as a batch input; returns the answer.
  ApiResponse upload(const std::string& text, const std::string& name = "in.jsonl") {
    auto w = api_->files().create(name, "batch", 1 << 20);
    EXPECT_TRUE(w.ok());
    EXPECT_TRUE(w->write(text).ok());
    auto f = w->commit();
    EXPECT_TRUE(f.ok());
    return api_->finish_upload(*f);
  }
  std::string upload_id(const std::string& text) {
    ApiResponse r = upload(text);
    EXPECT_EQ(r.status, 200) << r.body.dump();
    return r.body.value("id", "");
  }
  ApiResponse create(const std::string& file_id, const std::string& endpoint = "/v1/completions") {
    return api_->create_batch(json{{"input_file_id", file_id}, {"endpoint", endpoint}, {"completion_window", "24h"}});
  }
  static void expect_error(const ApiResponse& r, int status, const std::string& param, const std::string& text) {
    EXPECT_EQ(r.status, status) << r.body.dump();
    ASSERT_TRUE(r.body.contains("error")) << r.body.dump();
    const auto& e = r.body["error"];
    EXPECT_EQ(e.size(), 4u);  // message, type, param, code
    if (param.empty()) EXPECT_TRUE(e["param"].is_null()) << r.body.dump();
    else EXPECT_EQ(e["param"], param) << r.body.dump();
    EXPECT_NE(e["message"].get<std::string>().find(text), std::string::npos) << r.body.dump();
  }

  FakeJobs jobs_;
  std::unique_ptr<BatchApi> api_;
};

TEST_F(BatchApiTest, UploadsMustBeJsonl) {
  const ApiResponse ok = upload(request_line("a") + "\n" + request_line("b"));
  ASSERT_EQ(ok.status, 200) << ok.body.dump();
  EXPECT_EQ(ok.body["object"], "file");
  EXPECT_EQ(ok.body["purpose"], "batch");
  EXPECT_EQ(ok.body["filename"], "in.jsonl");
  const std::string id = ok.body["id"];
  EXPECT_EQ(id.rfind("file-", 0), 0u);
  EXPECT_EQ(api_->retrieve_file(id).body, ok.body);

  const ApiResponse bad = upload(request_line("a") + "{not json\n");
  expect_error(bad, 400, "file", "line 2 is not valid JSON");
  EXPECT_EQ(bad.body["error"]["code"], "invalid_file_format");
  expect_error(upload("[1, 2]\n"), 400, "file", "line 1 is not a JSON object");
  // 100,000 nested arrays: refused by name, not a crash (issue 46, item 5).
  expect_error(upload(request_line("a") + "{\"custom_id\": \"d\", \"body\": " + std::string(100000, '[') +
                      std::string(100000, ']') + "}\n"),
               400, "file", "line 2: JSON nested deeper than 64 levels");
  expect_error(upload("\n \n"), 400, "file", "no requests");
  // The refused uploads are gone; the good one is listed.
  const ApiResponse list = api_->list_files("");
  ASSERT_EQ(list.body["data"].size(), 1u);
  EXPECT_EQ(list.body["data"][0]["id"], id);
  EXPECT_EQ(api_->list_files("batch_output").body["data"].size(), 0u);
  expect_error(api_->retrieve_file("file-nope"), 404, "id", "No such File object: file-nope");
  expect_error(api_->delete_file("file-nope"), 404, "id", "No such File object");
  const ApiResponse del = api_->delete_file(id);
  EXPECT_EQ(del.status, 200);
  EXPECT_EQ(del.body["deleted"], true);
  EXPECT_EQ(api_->retrieve_file(id).status, 404);
}

TEST_F(BatchApiTest, CreateRefusesBadRequestsWithOpenAiErrors) {
  const std::string file = upload_id(request_line("a"));
  expect_error(api_->create_batch(json::array()), 400, "", "JSON object");
  expect_error(api_->create_batch(json{{"endpoint", "/v1/completions"}, {"completion_window", "24h"}}), 400,
               "input_file_id", "Missing required parameter");
  expect_error(create(file, "/v1/embeddings"), 400, "endpoint", "Invalid value for 'endpoint'");
  expect_error(create("file-nope"), 404, "input_file_id", "No such File object");
  expect_error(api_->create_batch(json{{"input_file_id", file}, {"endpoint", "/v1/completions"}, {"completion_window", "1h"}}),
               400, "completion_window", "24h");
  expect_error(api_->create_batch(json{{"input_file_id", file}, {"endpoint", "/v1/completions"},
                                       {"completion_window", "24h"}, {"metadata", {{"k", 1}}}}),
               400, "metadata", "strings");
  expect_error(api_->create_batch(json{{"input_file_id", file}, {"endpoint", "/v1/completions"},
                                       {"completion_window", "24h"}, {"extra", 1}}),
               400, "extra", "Unrecognized request argument");
  EXPECT_TRUE(jobs_.submitted.empty());
}

TEST_F(BatchApiTest, InvalidInputFailsTheBatchWithOneErrorPerLine) {
  const std::string file = upload_id(request_line("a") + request_line("b") + request_line("a") +
                                     request_line("c", "/v1/chat/completions") +
                                     json{{"method", "POST"}, {"url", "/v1/completions"}, {"body", json::object()}}.dump() +
                                     "\n" + request_line("a"));
  const ApiResponse r = create(file);
  ASSERT_EQ(r.status, 200) << r.body.dump();  // as OpenAI: the batch exists, and failed validation
  EXPECT_EQ(r.body["status"], "failed");
  EXPECT_FALSE(r.body["failed_at"].is_null());
  const auto& errors = r.body["errors"]["data"];
  ASSERT_EQ(errors.size(), 4u) << r.body.dump();
  EXPECT_EQ(errors[0]["code"], "duplicate_custom_id");
  EXPECT_EQ(errors[0]["line"], 3);
  EXPECT_EQ(errors[1]["code"], "mismatched_endpoint");
  EXPECT_EQ(errors[1]["line"], 4);
  EXPECT_EQ(errors[1]["param"], "url");
  EXPECT_EQ(errors[2]["code"], "missing_required_parameter");
  EXPECT_EQ(errors[2]["param"], "custom_id");
  EXPECT_EQ(errors[3]["line"], 6);
  EXPECT_TRUE(jobs_.submitted.empty());
  // Retrieving it again gives the same failed batch.
  EXPECT_EQ(api_->retrieve_batch(r.body["id"]).body, r.body);
}

TEST_F(BatchApiTest, ABatchRunsAsAJobAndItsOutputIsSplit) {
  const std::string file = upload_id(request_line("a") + request_line("b") + request_line("c"));
  const ApiResponse created = api_->create_batch(
      json{{"input_file_id", file}, {"endpoint", "/v1/completions"}, {"completion_window", "24h"},
           {"metadata", {{"owner", "test"}}}});
  ASSERT_EQ(created.status, 200) << created.body.dump();
  const std::string id = created.body["id"];
  EXPECT_EQ(id.rfind("batch_", 0), 0u);
  EXPECT_EQ(created.body["status"], "in_progress");
  EXPECT_EQ(created.body["request_counts"]["total"], 3);
  EXPECT_EQ(created.body["metadata"]["owner"], "test");
  ASSERT_EQ(jobs_.submitted.size(), 1u);
  const messages::SubmitJob& job = jobs_.submitted[0];
  EXPECT_EQ(job.model_dir, "/models/m");
  ASSERT_EQ(job.inputs.size(), 1u);
  EXPECT_EQ(job.inputs[0], api_->files().content_path(file).string());

  jobs_.set(1, "running", 3, 1, 0);
  ApiResponse r = api_->retrieve_batch(id);
  EXPECT_EQ(r.body["status"], "in_progress");
  EXPECT_EQ(json(r.body["request_counts"]), (json{{"total", 3}, {"completed", 1}, {"failed", 0}}));
  EXPECT_TRUE(r.body["output_file_id"].is_null());

  // The job finishes: one of its lines is an error.
  const std::string ok_a = R"({"id":"batch_req_1_0","custom_id":"a","response":{"status_code":200},"error":null})";
  const std::string err_b = R"({"id":"batch_req_1_1","custom_id":"b","response":null,"error":{"code":"x","message":"y"}})";
  const std::string ok_c = R"({"id":"batch_req_1_2","custom_id":"c","response":{"status_code":200},"error":null})";
  std::ofstream(job.output) << ok_a << "\n" << err_b << "\n" << ok_c << "\n";
  jobs_.set(1, "done", 3, 3, 1);
  r = api_->retrieve_batch(id);
  EXPECT_EQ(r.body["status"], "completed");
  EXPECT_EQ(json(r.body["request_counts"]), (json{{"total", 3}, {"completed", 2}, {"failed", 1}}));
  for (const char* t : {"in_progress_at", "finalizing_at", "completed_at"}) EXPECT_FALSE(r.body[t].is_null()) << t;
  const std::string out = r.body["output_file_id"], err = r.body["error_file_id"];
  EXPECT_EQ(testing_support::read_file(api_->files().content_path(out).string()), ok_a + "\n" + ok_c + "\n");
  EXPECT_EQ(testing_support::read_file(api_->files().content_path(err).string()), err_b + "\n");
  EXPECT_EQ(api_->retrieve_file(out).body["purpose"], "batch_output");
  EXPECT_EQ(api_->list_files("batch_output").body["data"].size(), 2u);
  // A finished batch is not polled again, and its input is free to delete.
  const int polls = jobs_.polls;
  EXPECT_EQ(api_->retrieve_batch(id).body, r.body);
  EXPECT_EQ(jobs_.polls, polls);

  // After a restart the records are read back as they were.
  open();
  EXPECT_EQ(api_->retrieve_batch(id).body, r.body);
  EXPECT_EQ(api_->retrieve_file(out).status, 200);
  EXPECT_EQ(api_->delete_file(file).status, 200);
}

TEST_F(BatchApiTest, ConcurrentPollsFinalizeOnce) {
  const std::string file = upload_id(request_line("a"));
  const std::string id = create(file).body["id"];
  std::ofstream(jobs_.submitted.at(0).output) << R"({"custom_id":"a","response":{},"error":null})" << "\n";
  jobs_.set(1, "done", 1, 1, 0);
  std::vector<std::thread> pollers;
  std::vector<std::string> outputs(8);
  for (int i = 0; i < 8; ++i)
    pollers.emplace_back([&, i] { outputs[i] = api_->retrieve_batch(id).body.value("output_file_id", ""); });
  for (auto& t : pollers) t.join();
  for (const auto& o : outputs) EXPECT_EQ(o, outputs[0]);
  EXPECT_EQ(api_->list_files("batch_output").body["data"].size(), 1u);
}

TEST_F(BatchApiTest, AJobThatCannotBeSubmittedOrFailsFailsTheBatch) {
  const std::string file = upload_id(request_line("a"));
  jobs_.refuse = true;
  ApiResponse r = create(file);
  EXPECT_EQ(r.body["status"], "failed");
  EXPECT_EQ(r.body["errors"]["data"][0]["code"], "job_submit_failed");
  jobs_.refuse = false;
  r = create(file);
  EXPECT_EQ(r.body["status"], "in_progress");
  jobs_.set(1, "failed", 1, 0, 0);
  r = api_->retrieve_batch(r.body["id"]);
  EXPECT_EQ(r.body["status"], "failed");
  EXPECT_EQ(r.body["errors"]["data"][0]["code"], "job_failed");
}

TEST_F(BatchApiTest, AnUnreadableJobGivesTheLastKnownState) {
  const std::string file = upload_id(request_line("a") + request_line("b"));
  const std::string id = create(file).body["id"];
  jobs_.set(1, "running", 2, 1, 0);
  const ApiResponse seen = api_->retrieve_batch(id);
  jobs_.fail_progress = true;
  const ApiResponse r = api_->retrieve_batch(id);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, seen.body);
}

TEST_F(BatchApiTest, CancelFinalizesWithTheLinesFinishedBeforeIt) {
  const std::string file = upload_id(request_line("a") + request_line("b") + request_line("c"));
  const std::string id = create(file).body["id"];
  // Lines a and c finished (c with an error) before the cancel; the job's
  // output file holds them (JobManager::cancel wrote it).
  const std::string ok_a = R"({"custom_id":"a","response":{"status_code":200},"error":null})";
  const std::string err_c = R"({"custom_id":"c","response":null,"error":{"code":"x","message":"y"}})";
  std::ofstream(jobs_.submitted.at(0).output) << ok_a << "\n" << err_c << "\n";
  jobs_.set(1, "running", 3, 2, 1);
  const ApiResponse r = api_->cancel_batch(id);
  ASSERT_EQ(r.status, 200) << r.body.dump();
  EXPECT_EQ(r.body["status"], "cancelled");
  EXPECT_FALSE(r.body["cancelling_at"].is_null());
  EXPECT_FALSE(r.body["cancelled_at"].is_null());
  EXPECT_TRUE(r.body["completed_at"].is_null());
  EXPECT_EQ(json(r.body["request_counts"]), (json{{"total", 3}, {"completed", 1}, {"failed", 1}}));
  EXPECT_EQ(testing_support::read_file(api_->files().content_path(r.body["output_file_id"]).string()), ok_a + "\n");
  EXPECT_EQ(testing_support::read_file(api_->files().content_path(r.body["error_file_id"]).string()), err_c + "\n");
  EXPECT_EQ(jobs_.cancels, 1);
  // Again: the same batch, and the job is not asked again.
  EXPECT_EQ(api_->cancel_batch(id).body, r.body);
  EXPECT_EQ(api_->retrieve_batch(id).body, r.body);
  EXPECT_EQ(jobs_.cancels, 1);
  open();
  EXPECT_EQ(api_->retrieve_batch(id).body, r.body);

  expect_error(api_->cancel_batch("batch_nope"), 404, "id", "No such Batch object");
}

TEST_F(BatchApiTest, CancelWhileTheClusterIsUnreachableStaysCancellingUntilAPollGetsThrough) {
  const std::string file = upload_id(request_line("a"));
  const std::string id = create(file).body["id"];
  jobs_.fail_cancel = true;
  ApiResponse r = api_->cancel_batch(id);
  EXPECT_EQ(r.status, 200) << r.body.dump();
  EXPECT_EQ(r.body["status"], "cancelling");
  EXPECT_FALSE(r.body["cancelling_at"].is_null());
  // A restart keeps the cancel.
  open();
  EXPECT_EQ(api_->retrieve_batch(id).body["status"], "cancelling");
  jobs_.fail_cancel = false;
  std::ofstream(jobs_.submitted.at(0).output) << "";
  r = api_->retrieve_batch(id);
  EXPECT_EQ(r.body["status"], "cancelled");
  EXPECT_TRUE(r.body["output_file_id"].is_null());  // nothing finished: no files, as OpenAI
  EXPECT_TRUE(r.body["error_file_id"].is_null());
}

TEST_F(BatchApiTest, OnlyBatchesInProgressCanBeCancelled) {
  // A job that finished before the cancel reached it: the batch completes.
  const std::string file = upload_id(request_line("a"));
  const std::string raced = create(file).body["id"];
  std::ofstream(jobs_.submitted.at(0).output) << R"({"custom_id":"a","response":{},"error":null})" << "\n";
  jobs_.set(1, "done", 1, 1, 0);
  ApiResponse r = api_->cancel_batch(raced);
  EXPECT_EQ(r.status, 200) << r.body.dump();
  EXPECT_EQ(r.body["status"], "completed");
  EXPECT_FALSE(r.body["output_file_id"].is_null());
  // Completed and failed batches refuse.
  ApiResponse refused = api_->cancel_batch(raced);
  expect_error(refused, 409, "", "Cannot cancel a batch with status 'completed'");
  EXPECT_EQ(refused.body["error"]["code"], "batch_not_cancellable");
  const std::string bad = upload_id(request_line("a") + request_line("a"));
  const std::string failed = create(bad).body["id"];
  expect_error(api_->cancel_batch(failed), 409, "", "status 'failed'");
  EXPECT_EQ(api_->retrieve_batch(raced).body, r.body);
}

TEST_F(BatchApiTest, ListIsNewestFirstAndPages) {
  const std::string file = upload_id(request_line("a"));
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(create(file).body["id"]);
  ApiResponse page = api_->list_batches(2, "");
  ASSERT_EQ(page.status, 200);
  EXPECT_EQ(page.body["object"], "list");
  ASSERT_EQ(page.body["data"].size(), 2u);
  EXPECT_TRUE(page.body["has_more"].get<bool>());
  std::vector<std::string> seen;
  std::string after;
  for (int guard = 0; guard < 10; ++guard) {
    page = api_->list_batches(2, after);
    for (const auto& b : page.body["data"]) seen.push_back(b["id"]);
    if (!page.body["has_more"].get<bool>()) break;
    after = page.body["last_id"];
  }
  std::sort(seen.begin(), seen.end());
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(seen, ids);
  expect_error(api_->list_batches(0, ""), 400, "limit", "limit");
  expect_error(api_->list_batches(101, ""), 400, "limit", "limit");
  expect_error(api_->list_batches(2, "batch_nope"), 404, "after", "No such Batch");
  expect_error(api_->retrieve_batch("batch_nope"), 404, "id", "No such Batch object");
}

TEST_F(BatchApiTest, ABatchLeftValidatingByACrashIsFailedAtOpen) {
  std::filesystem::create_directories(dir_ / "api" / "batches");
  std::ofstream(dir_ / "api" / "batches" / "batch_x.json")
      << R"({"id":"batch_x","endpoint":"/v1/completions","input_file_id":"file-1","status":"validating","created_at":5})";
  open();
  const ApiResponse r = api_->retrieve_batch("batch_x");
  EXPECT_EQ(r.body["status"], "failed");
  EXPECT_EQ(r.body["errors"]["data"][0]["code"], "interrupted");
  // A corrupt record is a clear error at open.
  std::ofstream(dir_ / "api" / "batches" / "batch_y.json") << "{oops";
  BatchApiOptions o;
  o.dir = dir_ / "api";
  auto again = BatchApi::open(o, jobs_);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code, ErrorCode::corrupt);
  EXPECT_NE(again.error().message.find("batch_y.json"), std::string::npos);
}

TEST_F(BatchApiTest, UploadsOverTheLimitAreRefusedAndLeaveNothing) {
  auto w = api_->files().create("big.jsonl", "batch", 10);
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE(w->write("12345").ok());
  const Status s = w->write("678901");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, ErrorCode::out_of_memory);
  EXPECT_FALSE(w->commit().ok());
  std::size_t entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir_ / "api" / "files")) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 0u);
}

}  // namespace
}  // namespace shardline::api
