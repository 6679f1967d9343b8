#pragma once
/// \file
/// The OpenAI Files and Batches APIs as plain calls (docs/http.md): JSON in,
/// an HTTP status and a JSON body out, with no HTTP in sight, so they are
/// tested without sockets; api/http_server.hpp maps routes onto them.
///
/// A batch is a Shardline job over its input file: `create_batch` checks the
/// file as OpenAI does (every line JSON with a `custom_id`, `method` POST and
/// the batch's `url`; no `custom_id` twice), then submits a job whose output
/// goes to a file under the API's folder. `retrieve_batch` reads the job's
/// progress (request_counts) and, when the job is done, splits its output
/// into the batch's output file (lines with a response) and error file
/// (lines with an error), as OpenAI does. Batch records are JSON files
/// written atomically; the files are a FileStore.
///
/// Statuses: validating -> in_progress -> finalizing -> completed; failed
/// (the input file failed validation: `errors`, or the job failed);
/// in_progress -> cancelling -> cancelled (`cancel_batch`: the output and
/// error files hold the lines finished before the cancel). Batches are
/// never expired (completion_window "24h" is accepted and not enforced).

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "api/file_store.hpp"
#include "common/result.hpp"
#include "messages/types.hpp"

namespace shardline::api {

/// An API answer: the HTTP status and the JSON body (an OpenAI object, or
/// {"error": {"message", "type", "param", "code"}}).
struct ApiResponse {
  int status = 200;
  nlohmann::ordered_json body;
};

/// The OpenAI error object with its HTTP status.
[[nodiscard]] ApiResponse api_error(int status, std::string message, std::string type = "invalid_request_error",
                                    std::string param = "", std::string code = "");

/// What the batch API needs of the cluster.
class JobService {
 public:
  virtual ~JobService() = default;
  /// Submits a job; returns its id. Errors: the orchestrator's.
  [[nodiscard]] virtual Result<std::uint64_t> submit(const messages::SubmitJob& job) = 0;
  /// The job's progress. Errors: not_found, io.
  [[nodiscard]] virtual Result<messages::JobProgress> progress(std::uint64_t job_id) = 0;
  /// Cancels the job (orchestrator::JobManager::cancel: its output file
  /// keeps the lines committed so far); returns its progress after it.
  /// Cancelling a cancelled job again succeeds. Errors: not_found,
  /// invalid_argument (the job is done or failed), io.
  [[nodiscard]] virtual Result<messages::JobProgress> cancel(std::uint64_t job_id) = 0;
};

struct BatchApiOptions {
  std::filesystem::path dir;  ///< the API's folder (`--data-dir`/api): files/ and batches/
  std::string model_dir;      ///< the node's model: every batch's job runs it
  std::uint64_t max_upload_bytes = 200ull << 20;  ///< OpenAI's batch input limit (200 MB)
};

class BatchApi {
 public:
  /// Opens the folders and the records in them. A batch left in
  /// `validating` by a crash (its job may not exist) is failed with an
  /// error saying so. Errors: io, corrupt (a record that does not parse).
  [[nodiscard]] static Result<std::unique_ptr<BatchApi>> open(BatchApiOptions options, JobService& jobs);

  [[nodiscard]] FileStore& files() { return *files_; }
  [[nodiscard]] std::uint64_t max_upload_bytes() const { return options_.max_upload_bytes; }

  /// After an upload was written (purpose "batch"): checks that it is JSONL
  /// (every non-blank line a JSON object) and returns the file object, or
  /// deletes it and returns 400 naming the first bad line.
  [[nodiscard]] ApiResponse finish_upload(const FileInfo& file);
  [[nodiscard]] ApiResponse retrieve_file(const std::string& id) const;
  [[nodiscard]] ApiResponse list_files(const std::string& purpose) const;
  [[nodiscard]] ApiResponse delete_file(const std::string& id);

  /// POST /v1/batches: {input_file_id, endpoint, completion_window, metadata}.
  [[nodiscard]] ApiResponse create_batch(const nlohmann::json& body);
  /// The batch, refreshed from its job. When the job's progress cannot be
  /// read (the orchestrator is restarting), the last known state, logged.
  [[nodiscard]] ApiResponse retrieve_batch(const std::string& id);
  /// POST /v1/batches/{id}/cancel: an in_progress batch becomes cancelling
  /// (recorded), its job is cancelled, and once that is done the batch is
  /// finalized as cancelled with what its job finished; when the cluster
  /// cannot be reached it stays cancelling and each poll tries again. A
  /// cancelling or cancelled batch answers as it is (idempotent); a batch
  /// whose job finished first answers completed. Errors: 404 (no such
  /// batch), 409 (the batch is completed, failed or finalizing).
  [[nodiscard]] ApiResponse cancel_batch(const std::string& id);
  /// GET /v1/batches: newest first; `after` is a batch id (the page starts
  /// after it), limit in [1, 100].
  [[nodiscard]] ApiResponse list_batches(int limit, const std::string& after);

  /// The OpenAI `file` object.
  [[nodiscard]] static nlohmann::ordered_json file_object(const FileInfo& f);

 private:
  struct Batch {
    std::string id;
    std::string endpoint;
    std::string input_file_id;
    std::string completion_window = "24h";
    nlohmann::ordered_json metadata;  ///< null or an object of strings
    std::string status = "validating";
    nlohmann::ordered_json errors;    ///< null or {"object": "list", "data": [...]}
    std::uint64_t job_id = 0;
    std::string output_file_id, error_file_id;
    std::uint64_t total = 0, completed = 0, failed = 0;
    std::int64_t created_at = 0, in_progress_at = 0, finalizing_at = 0, completed_at = 0, failed_at = 0;
    std::int64_t cancelling_at = 0, cancelled_at = 0;
  };

  BatchApi(BatchApiOptions options, JobService& jobs) : options_(std::move(options)), jobs_(jobs) {}
  [[nodiscard]] std::filesystem::path batches_dir() const { return options_.dir / "batches"; }
  [[nodiscard]] Status save(const Batch& b) const;
  [[nodiscard]] static nlohmann::ordered_json batch_object(const Batch& b);
  [[nodiscard]] static nlohmann::ordered_json to_record(const Batch& b);
  [[nodiscard]] static Batch from_record(const nlohmann::json& j);
  /// Validation errors of the input file ({code, message, param, line}), at
  /// most 100; `num_requests` gets its number of non-blank lines.
  [[nodiscard]] nlohmann::ordered_json validate_input(const std::string& file_id, const std::string& endpoint,
                                                      std::uint64_t* num_requests) const;
  /// Reads the job's progress into `b` (a cancelling batch: cancels its job,
  /// again); finalizes a finished or cancelled job.
  [[nodiscard]] Status refresh(Batch& b);
  /// True for completed, failed and cancelled: the record changes no more.
  [[nodiscard]] static bool final_status(const std::string& status);
  /// Splits the job's output into the output and error files.
  [[nodiscard]] Status finalize(Batch& b, const std::string& job_output);

  BatchApiOptions options_;
  JobService& jobs_;
  std::unique_ptr<FileStore> files_;
  mutable std::mutex mu_;            ///< batches_
  std::mutex finalize_mu_;           ///< one finalization at a time
  std::map<std::string, Batch> batches_;
};

}  // namespace shardline::api
