#include "api/batch_api.hpp"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "common/json_bounded.hpp"

namespace shardline::api {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

constexpr std::size_t kMaxValidationErrors = 100;

std::int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

ojson or_null(std::int64_t t) { return t > 0 ? ojson(t) : ojson(nullptr); }
ojson or_null(const std::string& s) { return s.empty() ? ojson(nullptr) : ojson(s); }

ojson line_error(std::string code, std::string message, std::string param, std::size_t line) {
  ojson e;
  e["code"] = std::move(code);
  e["message"] = std::move(message);
  e["param"] = param.empty() ? ojson(nullptr) : ojson(std::move(param));
  e["line"] = line;
  return e;
}

}  // namespace

ApiResponse api_error(int status, std::string message, std::string type, std::string param, std::string code) {
  ojson err;
  err["message"] = std::move(message);
  err["type"] = std::move(type);
  err["param"] = param.empty() ? ojson(nullptr) : ojson(std::move(param));
  err["code"] = code.empty() ? ojson(nullptr) : ojson(std::move(code));
  ojson body;
  body["error"] = std::move(err);
  return {status, std::move(body)};
}

Result<std::unique_ptr<BatchApi>> BatchApi::open(BatchApiOptions options, JobService& jobs) {
  std::unique_ptr<BatchApi> api(new BatchApi(std::move(options), jobs));
  auto files = FileStore::open(api->options_.dir / "files");
  if (!files) return std::move(files).error();
  api->files_ = std::move(files).value();
  if (Status s = create_directories_durably(*posix_file_system(), api->batches_dir().string()); !s) return s.error();
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(api->batches_dir(), ec)) {
    if (entry.path().extension() != ".json") continue;
    std::ifstream in(entry.path());
    std::stringstream ss;
    ss << in.rdbuf();
    const json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("id"))
      return make_error(ErrorCode::corrupt, entry.path().string() + ": not a batch record");
    Batch b = from_record(j);
    if (b.status == "validating") {  // its job may or may not have been submitted
      b.status = "failed";
      b.failed_at = unix_now();
      b.errors = {{"object", "list"},
                  {"data", ojson::array({line_error("interrupted",
                                                    "the node restarted while the batch was being validated; "
                                                    "create it again",
                                                    "", 0)})}};
      if (Status s = api->save(b); !s) return s.error();
    }
    api->batches_[b.id] = std::move(b);
  }
  if (ec) return make_error(ErrorCode::io, "cannot read " + api->batches_dir().string() + ": " + ec.message());
  return api;
}

// ---- files ------------------------------------------------------------------------

ojson BatchApi::file_object(const FileInfo& f) {
  ojson o;
  o["id"] = f.id;
  o["object"] = "file";
  o["bytes"] = f.bytes;
  o["created_at"] = f.created_at;
  o["filename"] = f.filename;
  o["purpose"] = f.purpose;
  return o;
}

ApiResponse BatchApi::finish_upload(const FileInfo& file) {
  std::ifstream in(files_->content_path(file.id), std::ios::binary);
  std::string line;
  std::size_t number = 0, lines = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    ++lines;
    const auto parsed = parse_json_bounded(line);
    if (!parsed.ok() || !parsed->is_object()) {
      (void)files_->remove(file.id);
      const std::string why = parsed.ok()                                          ? " is not a JSON object"
                              : parsed.error().code == ErrorCode::invalid_argument ? ": " + parsed.error().message
                                                                                   : " is not valid JSON";
      return api_error(400,
                       "Invalid file format for Batch API. Must be .jsonl: line " + std::to_string(number) + why,
                       "invalid_request_error", "file", "invalid_file_format");
    }
  }
  if (lines == 0) {
    (void)files_->remove(file.id);
    return api_error(400, "Invalid file format for Batch API. The file has no requests", "invalid_request_error",
                     "file", "invalid_file_format");
  }
  return {200, file_object(file)};
}

ApiResponse BatchApi::retrieve_file(const std::string& id) const {
  auto f = files_->get(id);
  if (!f) return api_error(404, "No such File object: " + id, "invalid_request_error", "id");
  return {200, file_object(*f)};
}

ApiResponse BatchApi::list_files(const std::string& purpose) const {
  ojson data = ojson::array();
  for (const FileInfo& f : files_->list())
    if (purpose.empty() || f.purpose == purpose) data.push_back(file_object(f));
  ojson body;
  body["object"] = "list";
  body["data"] = std::move(data);
  body["has_more"] = false;
  return {200, std::move(body)};
}

ApiResponse BatchApi::delete_file(const std::string& id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [bid, b] : batches_)
      if (b.input_file_id == id && (b.status == "validating" || b.status == "in_progress" || b.status == "finalizing"))
        return api_error(409, "File " + id + " is the input of batch " + bid + ", which is still running",
                         "invalid_request_error", "id");
  }
  Status s = files_->remove(id);
  if (!s) {
    if (s.error().code == ErrorCode::not_found)
      return api_error(404, "No such File object: " + id, "invalid_request_error", "id");
    return api_error(500, s.error().message, "server_error");
  }
  ojson body;
  body["id"] = id;
  body["object"] = "file";
  body["deleted"] = true;
  return {200, std::move(body)};
}

// ---- batches ----------------------------------------------------------------------

ojson BatchApi::to_record(const Batch& b) {
  ojson j;
  j["id"] = b.id;
  j["endpoint"] = b.endpoint;
  j["input_file_id"] = b.input_file_id;
  j["completion_window"] = b.completion_window;
  j["metadata"] = b.metadata;
  j["status"] = b.status;
  j["errors"] = b.errors;
  j["job_id"] = b.job_id;
  j["output_file_id"] = b.output_file_id;
  j["error_file_id"] = b.error_file_id;
  j["total"] = b.total;
  j["completed"] = b.completed;
  j["failed"] = b.failed;
  j["created_at"] = b.created_at;
  j["in_progress_at"] = b.in_progress_at;
  j["finalizing_at"] = b.finalizing_at;
  j["completed_at"] = b.completed_at;
  j["failed_at"] = b.failed_at;
  j["cancelling_at"] = b.cancelling_at;
  j["cancelled_at"] = b.cancelled_at;
  return j;
}

BatchApi::Batch BatchApi::from_record(const json& j) {
  Batch b;
  b.id = j.value("id", std::string());
  b.endpoint = j.value("endpoint", std::string());
  b.input_file_id = j.value("input_file_id", std::string());
  b.completion_window = j.value("completion_window", std::string("24h"));
  b.metadata = j.contains("metadata") ? ojson(j["metadata"]) : ojson(nullptr);
  b.status = j.value("status", std::string("failed"));
  b.errors = j.contains("errors") ? ojson(j["errors"]) : ojson(nullptr);
  b.job_id = j.value("job_id", std::uint64_t{0});
  b.output_file_id = j.value("output_file_id", std::string());
  b.error_file_id = j.value("error_file_id", std::string());
  b.total = j.value("total", std::uint64_t{0});
  b.completed = j.value("completed", std::uint64_t{0});
  b.failed = j.value("failed", std::uint64_t{0});
  b.created_at = j.value("created_at", std::int64_t{0});
  b.in_progress_at = j.value("in_progress_at", std::int64_t{0});
  b.finalizing_at = j.value("finalizing_at", std::int64_t{0});
  b.completed_at = j.value("completed_at", std::int64_t{0});
  b.failed_at = j.value("failed_at", std::int64_t{0});
  b.cancelling_at = j.value("cancelling_at", std::int64_t{0});
  b.cancelled_at = j.value("cancelled_at", std::int64_t{0});
  return b;
}

ojson BatchApi::batch_object(const Batch& b) {
  ojson o;
  o["id"] = b.id;
  o["object"] = "batch";
  o["endpoint"] = b.endpoint;
  o["errors"] = b.errors;
  o["input_file_id"] = b.input_file_id;
  o["completion_window"] = b.completion_window;
  o["status"] = b.status;
  o["output_file_id"] = or_null(b.output_file_id);
  o["error_file_id"] = or_null(b.error_file_id);
  o["created_at"] = b.created_at;
  o["in_progress_at"] = or_null(b.in_progress_at);
  o["expires_at"] = b.created_at + 24 * 3600;
  o["finalizing_at"] = or_null(b.finalizing_at);
  o["completed_at"] = or_null(b.completed_at);
  o["failed_at"] = or_null(b.failed_at);
  o["expired_at"] = nullptr;
  o["cancelling_at"] = or_null(b.cancelling_at);
  o["cancelled_at"] = or_null(b.cancelled_at);
  ojson counts;
  counts["total"] = b.total;
  counts["completed"] = b.completed;
  counts["failed"] = b.failed;
  o["request_counts"] = std::move(counts);
  o["metadata"] = b.metadata;
  return o;
}

Status BatchApi::save(const Batch& b) const {
  return write_file_atomically(batches_dir() / (b.id + ".json"),
                               to_record(b).dump(-1, ' ', false, ojson::error_handler_t::replace));
}

ojson BatchApi::validate_input(const std::string& file_id, const std::string& endpoint,
                               std::uint64_t* num_requests) const {
  ojson errors = ojson::array();
  auto add = [&](ojson e) {
    if (errors.size() < kMaxValidationErrors) errors.push_back(std::move(e));
  };
  std::ifstream in(files_->content_path(file_id), std::ios::binary);
  std::set<std::string> seen;
  std::string line;
  std::size_t number = 0, requests = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    ++requests;
    const auto parsed = parse_json_bounded(line);
    if (!parsed.ok() || !parsed->is_object()) {
      add(line_error("invalid_json_line",
                     parsed.ok() || parsed.error().code != ErrorCode::invalid_argument
                         ? "This line is not parseable as valid JSON."
                         : "This line is not parseable as valid JSON: " + parsed.error().message + ".",
                     "", number));
      continue;
    }
    const json& j = *parsed;
    auto id = j.find("custom_id");
    if (id == j.end() || !id->is_string()) {
      add(line_error("missing_required_parameter", "The request is missing a custom_id (a string).", "custom_id",
                     number));
    } else if (!seen.insert(id->get<std::string>()).second) {
      add(line_error("duplicate_custom_id",
                     "The custom_id for this request is a duplicate of another request: " + id->get<std::string>(),
                     "custom_id", number));
    }
    auto method = j.find("method");
    if (method == j.end() || *method != "POST")
      add(line_error("invalid_request", "The method must be POST.", "method", number));
    auto url = j.find("url");
    if (url == j.end() || !url->is_string() || url->get<std::string>() != endpoint)
      add(line_error("mismatched_endpoint",
                     "The provided URL " + (url == j.end() ? std::string("(none)") : url->dump()) +
                         " does not match the batch endpoint " + endpoint + ".",
                     "url", number));
    auto body = j.find("body");
    if (body == j.end() || !body->is_object())
      add(line_error("missing_required_parameter", "The request has no body object.", "body", number));
  }
  if (requests == 0) add(line_error("empty_file", "The input file has no requests.", "", 0));
  *num_requests = requests;
  return errors;
}

ApiResponse BatchApi::create_batch(const json& body) {
  if (!body.is_object()) return api_error(400, "The body must be a JSON object");
  auto str = [&](const char* k) -> const json* {
    auto it = body.find(k);
    return it == body.end() || it->is_null() ? nullptr : &*it;
  };
  for (auto it = body.begin(); it != body.end(); ++it)
    if (it.key() != "input_file_id" && it.key() != "endpoint" && it.key() != "completion_window" &&
        it.key() != "metadata" && it.key() != "output_expires_after")
      return api_error(400, "Unrecognized request argument supplied: " + it.key(), "invalid_request_error", it.key());
  const json* input = str("input_file_id");
  if (input == nullptr || !input->is_string())
    return api_error(400, "Missing required parameter: 'input_file_id'.", "invalid_request_error", "input_file_id",
                     "missing_required_parameter");
  const json* endpoint = str("endpoint");
  if (endpoint == nullptr || !endpoint->is_string())
    return api_error(400, "Missing required parameter: 'endpoint'.", "invalid_request_error", "endpoint",
                     "missing_required_parameter");
  const std::string ep = endpoint->get<std::string>();
  if (ep != "/v1/completions" && ep != "/v1/chat/completions")
    return api_error(400,
                     "Invalid value for 'endpoint': " + ep +
                         ". Supported values are: '/v1/completions' and '/v1/chat/completions'.",
                     "invalid_request_error", "endpoint", "unsupported_endpoint");
  const json* window = str("completion_window");
  if (window == nullptr || *window != "24h")
    return api_error(400, "Invalid value for 'completion_window': supported values are: '24h'.",
                     "invalid_request_error", "completion_window");
  ojson metadata = nullptr;
  if (const json* m = str("metadata")) {
    if (!m->is_object() || m->size() > 16)
      return api_error(400, "'metadata' must be an object of at most 16 string values", "invalid_request_error",
                       "metadata");
    for (auto it = m->begin(); it != m->end(); ++it)
      if (!it->is_string() || it.key().size() > 64 || it->get<std::string>().size() > 512)
        return api_error(400, "'metadata' values must be strings (keys up to 64, values up to 512 characters)",
                         "invalid_request_error", "metadata");
    metadata = ojson(*m);
  }
  const std::string file_id = input->get<std::string>();
  auto file = files_->get(file_id);
  if (!file) return api_error(404, "No such File object: " + file_id, "invalid_request_error", "input_file_id");
  if (file->purpose != "batch")
    return api_error(400, "File " + file_id + " has purpose '" + file->purpose + "'; a batch input needs 'batch'",
                     "invalid_request_error", "input_file_id");

  Batch b;
  b.id = random_id("batch_");
  b.endpoint = ep;
  b.input_file_id = file_id;
  b.metadata = std::move(metadata);
  b.created_at = unix_now();
  if (Status s = save(b); !s) return api_error(500, s.error().message, "server_error");
  ojson errors = validate_input(file_id, ep, &b.total);
  if (!errors.empty()) {
    b.status = "failed";
    b.failed_at = unix_now();
    b.errors = {{"object", "list"}, {"data", std::move(errors)}};
  } else {
    messages::SubmitJob job;
    job.model_dir = options_.model_dir;
    job.inputs = {files_->content_path(file_id).string()};
    job.output = (batches_dir() / (b.id + ".output.jsonl")).string();
    auto id = jobs_.submit(job);
    if (!id) {
      b.status = "failed";
      b.failed_at = unix_now();
      b.errors = {{"object", "list"},
                  {"data", ojson::array({line_error("job_submit_failed", id.error().to_string(), "", 0)})}};
    } else {
      b.job_id = *id;
      b.status = "in_progress";
      b.in_progress_at = unix_now();
    }
  }
  if (Status s = save(b); !s) return api_error(500, s.error().message, "server_error");
  ojson out = batch_object(b);
  std::lock_guard<std::mutex> lock(mu_);
  batches_[b.id] = std::move(b);
  return {200, std::move(out)};
}

Status BatchApi::finalize(Batch& b, const std::string& job_output) {
  std::ifstream in(job_output, std::ios::binary);
  if (!in) return make_error(ErrorCode::io, "cannot read the job's output " + job_output);
  std::optional<FileStore::Writer> out, err;
  std::string line;
  while (std::getline(in, line)) {
    const auto parsed = parse_json_bounded(line);
    const bool ok = parsed.ok() && parsed->is_object() && parsed->contains("error") && (*parsed)["error"].is_null();
    std::optional<FileStore::Writer>& w = ok ? out : err;
    if (!w) {
      auto created = files_->create(b.id + (ok ? "_output.jsonl" : "_error.jsonl"), "batch_output");
      if (!created) return created.error();
      w.emplace(std::move(created).value());
    }
    if (Status s = w->write(line + "\n"); !s) return s;
  }
  for (auto* w : {&out, &err}) {
    if (!*w) continue;
    auto f = (*w)->commit();
    if (!f) return f.error();
    (w == &out ? b.output_file_id : b.error_file_id) = f->id;
  }
  return {};
}

bool BatchApi::final_status(const std::string& status) {
  return status == "completed" || status == "failed" || status == "cancelled";
}

Status BatchApi::refresh(Batch& b) {
  if (b.status != "in_progress" && b.status != "finalizing" && b.status != "cancelling") return {};
  Result<messages::JobProgress> p = make_error(ErrorCode::internal, "unset");
  if (b.status == "cancelling") {
    p = jobs_.cancel(b.job_id);
    // The job finished before the cancel reached it: it ends as it is.
    if (!p && p.error().code == ErrorCode::invalid_argument) p = jobs_.progress(b.job_id);
  } else {
    p = jobs_.progress(b.job_id);
  }
  if (!p) return p.error();
  b.total = p->total;
  b.failed = p->failed;
  b.completed = p->done - std::min(p->done, p->failed);
  if (p->state == "failed") {
    b.status = "failed";
    b.failed_at = unix_now();
    b.errors = {{"object", "list"}, {"data", ojson::array({line_error("job_failed", "the job failed", "", 0)})}};
    return save(b);
  }
  const bool cancelled = p->state == "cancelled";
  if (p->state != "done" && !cancelled) return {};
  std::lock_guard<std::mutex> lock(finalize_mu_);
  {
    std::lock_guard<std::mutex> records(mu_);
    const Batch& stored = batches_[b.id];
    if (final_status(stored.status)) {  // another poll finalized it while this one waited
      b = stored;
      return {};
    }
    if (b.cancelling_at == 0) b.cancelling_at = stored.cancelling_at;  // a cancel came while it read
  }
  // A cancelled batch goes from cancelling to cancelled (OpenAI has no
  // finalizing step there).
  if (!cancelled) {
    b.status = "finalizing";
    b.finalizing_at = unix_now();
  }
  if (Status s = finalize(b, p->output); !s) return s;
  b.status = cancelled ? "cancelled" : "completed";
  (cancelled ? b.cancelled_at : b.completed_at) = unix_now();
  if (Status s = save(b); !s) return s;
  // Recorded before the finalize lock is let go, so a poll waiting on it
  // sees the completed batch and does not split the output again.
  std::lock_guard<std::mutex> records(mu_);
  batches_[b.id] = b;
  return {};
}

ApiResponse BatchApi::retrieve_batch(const std::string& id) {
  Batch b;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = batches_.find(id);
    if (it == batches_.end()) return api_error(404, "No such Batch object: " + id, "invalid_request_error", "id");
    b = it->second;
  }
  if (Status s = refresh(b); !s) {
    // The orchestrator restarting, say: answer with what is known (the
    // next poll tries again) rather than fail a client's polling loop.
    spdlog::warn("http api: batch {}: cannot read its job's progress: {}", id, s.error().to_string());
    std::lock_guard<std::mutex> lock(mu_);
    return {200, batch_object(batches_[id])};
  }
  std::lock_guard<std::mutex> lock(mu_);
  Batch& stored = batches_[id];
  // A concurrent poll may have finalized it first: keep the final record.
  if (final_status(stored.status)) return {200, batch_object(stored)};
  // A cancel recorded while this poll read the job's progress wins.
  if (stored.status == "cancelling" && b.status == "in_progress") return {200, batch_object(stored)};
  stored = b;
  return {200, batch_object(b)};
}

ApiResponse BatchApi::cancel_batch(const std::string& id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = batches_.find(id);
    if (it == batches_.end()) return api_error(404, "No such Batch object: " + id, "invalid_request_error", "id");
    Batch& stored = it->second;
    if (stored.status == "in_progress") {
      Batch b = stored;
      b.status = "cancelling";
      b.cancelling_at = unix_now();
      if (Status s = save(b); !s) return api_error(500, s.error().message, "server_error");
      stored = std::move(b);
    } else if (stored.status != "cancelling" && stored.status != "cancelled") {
      return api_error(409, "Cannot cancel a batch with status '" + stored.status + "'", "invalid_request_error",
                       "", "batch_not_cancellable");
    }
  }
  // Cancels the job (refresh() on a cancelling batch) and finalizes it.
  return retrieve_batch(id);
}

ApiResponse BatchApi::list_batches(int limit, const std::string& after) {
  if (limit < 1 || limit > 100)
    return api_error(400, "Invalid value for 'limit': must be in [1, 100]", "invalid_request_error", "limit");
  std::vector<Batch> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, b] : batches_) all.push_back(b);
  }
  std::sort(all.begin(), all.end(),
            [](const Batch& a, const Batch& b) { return std::pair(a.created_at, a.id) > std::pair(b.created_at, b.id); });
  std::size_t start = 0;
  if (!after.empty()) {
    auto it = std::find_if(all.begin(), all.end(), [&](const Batch& b) { return b.id == after; });
    if (it == all.end()) return api_error(404, "No such Batch object: " + after, "invalid_request_error", "after");
    start = static_cast<std::size_t>(it - all.begin()) + 1;
  }
  ojson data = ojson::array();
  for (std::size_t i = start; i < all.size() && data.size() < static_cast<std::size_t>(limit); ++i)
    data.push_back(batch_object(all[i]));
  ojson body;
  body["object"] = "list";
  body["first_id"] = data.empty() ? ojson(nullptr) : data.front()["id"];
  body["last_id"] = data.empty() ? ojson(nullptr) : data.back()["id"];
  body["has_more"] = start + data.size() < all.size();
  body["data"] = std::move(data);
  return {200, std::move(body)};
}

}  // namespace shardline::api
