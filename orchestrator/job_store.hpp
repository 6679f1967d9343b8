#pragma once
/// \file
/// Durable job state in RocksDB: job records, committed per-line results,
/// per-job counters, the output writer's progress, and where in-flight lines
/// resume after a failure (their replicated KV progress).
///
/// Keys (one column family; big-endian ids so iteration follows the order):
///   'M' "next_job_id"           → u64 BE, the next job id (ids start at 1)
///   'J' job(8)                  → job record (JSON)
///   'R' job(8) line(8)          → the committed result: the output line itself
///   'C' job(8)                  → counters: ok, failed, prompt_tokens, completion_tokens, cached_tokens
///                                 (5 × u64 BE; 4 in records of older versions)
///   'O' job(8)                  → output progress: file offset, next line (2 × u64 BE)
///   'K' job(8) line(8)          → resume record of an uncommitted line (encode: see below)
///   'F' job(8)                  → recovery counters: requeued, resumed (2 × u64 BE)
///   'L' job(8) chunk(8)         → prefix-aware line order, kOrderChunk entries per chunk
///                                 (line, shard, byte offset, file line: 4 × u64 BE each)
/// Every write of 'M', 'J', 'R', 'C', 'O', 'L' is synchronous (WriteOptions::sync,
/// one WriteBatch per call), so a write that returned is on disk even after
/// `kill -9` or a power cut (tests/orchestrator/unsynced_writes_fault_test.cpp
/// checks this on a file system that drops unsynced writes, see
/// JobStoreOptions). 'K' and 'F' are written to the WAL without a sync: they
/// survive a process crash (`kill -9`) but a power cut may lose the newest
/// ones, which only costs recompute (an older or no resume point) or an
/// undercount; deleting 'K' records rides in synced batches where it can.
/// A line is committed iff its 'R' key exists; which line is in flight on
/// which worker is not stored (after a restart, everything not committed is
/// pending again, with its 'K' resume record if any).
///
/// A 'K' value, little-endian fixed-width ints: u32 number of choices, then
/// per choice: i32 num_kv_tokens (the choice's replicated_tokens, >= 0),
/// u32 number of output ids, that many i32 output ids. ChoiceResume::kv_chunk
/// is never stored (the worker fetches the KV from the KV store).
///
/// A full disk (issue 46, items 7 and 8): a write that fails returns
/// disk_full (io for other I/O errors) and changes nothing; RocksDB then
/// refuses every write until reopened, so the next call closes the database
/// and opens it again (kvstore/rocksdb_support.hpp), and keeps trying at
/// each call while the disk stays full. RocksDB's LOG is written by
/// kvstore::open_info_log(), which survives a full disk.
///
/// Not thread-safe by design beyond an internal mutex: callers (one actor)
/// serialize; the mutex keeps the counter cache consistent and the database
/// in place while a call uses it.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/checksum.hpp"
#include "common/result.hpp"
#include "kvstore/rocksdb_support.hpp"
#include "worker/batch_types.hpp"

namespace rocksdb {
class Env;
class FileSystem;
}  // namespace rocksdb

namespace shardline::orchestrator {

/// cancelled: JobManager::cancel stopped it; its output file holds the
/// lines committed before that.
enum class JobState { queued, running, done, failed, cancelled };

/// "queued", "running", "done", "failed", "cancelled".
[[nodiscard]] const char* job_state_name(JobState s) noexcept;

/// What a user submits.
struct JobSpec {
  std::string model_dir;
  std::string model_name;  ///< "model" in output lines; empty: the model_dir's last component
  std::vector<std::string> input_paths;  ///< JSONL shards, read in this order
  std::string output_path;               ///< one output JSONL
  std::string request_id_prefix = "cmpl-";  ///< response.request_id = prefix + "<job>_<line>"
  /// The parallel config the job runs on (engine::ParallelConfig::to_string(),
  /// e.g. "tp=2,pp=1,sp=1,dp=1"); "" = not recorded (jobs of older versions).
  std::string parallel;
  /// Per-micro-batch token budget policy of the job's steps: "fixed" or
  /// "throttle" (engine/policies/token_budget_policies.hpp).
  std::string token_budget = "fixed";
  /// `--chat-template`: the template text chat lines are rendered with;
  /// "" = the model folder's (text/chat_template.hpp).
  std::string chat_template;
  /// model::model_fingerprint of the model the job's lines are computed
  /// with (the cluster's, at submit); "" = not recorded (older versions, or
  /// a JobManager without JobManagerOptions::model_fingerprint).
  std::string model_fingerprint;
  /// `--overwrite`: the submit may replace an existing, non-empty output
  /// file (JobManager::submit). Not stored: it only matters at submit.
  bool overwrite = false;
  /// `--weight-sharing` the job asks for; "" = the cluster's. Not stored:
  /// it is checked at submit (admit_job).
  std::string weight_sharing;
};

/// A job as stored.
struct JobRecord {
  std::uint64_t id = 0;
  JobSpec spec;
  JobState state = JobState::queued;
  std::int64_t created_unix_ms = 0;
  std::int64_t finished_unix_ms = 0;        ///< 0 while unfinished (done, failed or cancelled: when)
  std::uint64_t total_lines = 0;            ///< non-blank input lines over all shards
  std::vector<std::uint64_t> input_sizes;   ///< byte size of each shard at submit
  std::string error;                        ///< why the job failed (state failed)
  /// Prefix-aware scheduling (orchestrator/line_order.hpp): the job's line
  /// order is stored (JobStore::put_line_order) and its lines go out in it.
  /// False: input order (jobs of older versions, or ordering turned off).
  bool prefix_ordered = false;
  /// The prefix tree of its prompts' text, at submit: their bytes and, of
  /// them, the bytes it shares (the ideal a prefix cache can save).
  std::uint64_t prefix_prompt_bytes = 0;
  std::uint64_t prefix_shared_bytes = 0;
  /// 32 random hex digits drawn at submit: each output line's id and
  /// request_id derive from it and the line (format_result_line), so ids are
  /// unique across jobs and data dirs and the same on every resume. ""
  /// (jobs of older versions): "batch_req_<job>_<line>".
  std::string output_id_key;
};

/// Committed-result counters of a job (kept with the results, atomically).
struct JobCounters {
  std::uint64_t ok = 0;
  std::uint64_t failed = 0;
  std::uint64_t prompt_tokens = 0;
  std::uint64_t completion_tokens = 0;
  std::uint64_t cached_tokens = 0;  ///< of prompt_tokens, found in the workers' prefix caches
  [[nodiscard]] std::uint64_t committed() const noexcept { return ok + failed; }
};

/// Where the output file stands: bytes [0, offset) hold lines [0, next_line).
struct OutputProgress {
  std::uint64_t offset = 0;
  std::uint64_t next_line = 0;
  /// fnv1a64 (common/checksum.hpp) of the file's bytes [0, offset), checked
  /// when the writer reopens the file (issue 46, item 10).
  std::uint64_t prefix_checksum = kFnv1a64Empty;
  /// False for a record of an older version (no checksum kept).
  bool checksummed = true;
};

/// A result to commit: the formatted output line plus what the counters need.
struct StoredResult {
  std::uint64_t line_index = 0;
  std::string line;  ///< format_result_line(...), no newline
  bool ok = false;
  std::uint64_t prompt_tokens = 0;
  std::uint64_t completion_tokens = 0;
  std::uint64_t cached_tokens = 0;
};

/// Where a line of a job starts in its shards, at its place in the job's
/// prefix-aware order (orchestrator/line_order.hpp; ShardReader::seek_to).
struct LineOrderEntry {
  std::uint64_t line_index = 0;
  std::uint64_t shard = 0;        ///< position of its shard in JobSpec::input_paths
  std::uint64_t byte_offset = 0;  ///< of its first byte in the shard
  std::uint64_t file_line = 0;    ///< 1-based number in the shard of the raw line before it
  bool operator==(const LineOrderEntry&) const = default;
};

/// Failures and recoveries of a job, for `job status`.
struct RecoveryCounters {
  std::uint64_t requeued = 0;  ///< lines handed back to pending because their worker failed
  std::uint64_t resumed = 0;   ///< lines handed out with some choice's num_kv_tokens > 0
  bool operator==(const RecoveryCounters&) const = default;
};

/// Where an uncommitted line resumes: one ChoiceResume per choice
/// (kv_chunk empty; a choice without progress has num_kv_tokens 0).
struct ResumeRecord {
  std::uint64_t job_id = 0;
  std::uint64_t line_index = 0;
  std::vector<worker::ChoiceResume> choices;
};

/// The 'K' value of `choices` (see the file comment; kv_chunk is dropped).
[[nodiscard]] std::string encode_resume(const std::vector<worker::ChoiceResume>& choices);
/// Inverse of encode_resume. Errors: corrupt (truncated, trailing bytes,
/// more than 128 choices, a negative num_kv_tokens).
[[nodiscard]] Result<std::vector<worker::ChoiceResume>> decode_resume(std::string_view value);

struct JobStoreOptions {
  /// The file system RocksDB runs on; null: RocksDB's default (POSIX). Tests
  /// inject one that drops unsynced writes at a simulated crash
  /// (tests/support/fault_injection_rocksdb_fs.hpp).
  std::shared_ptr<rocksdb::FileSystem> file_system;
};

class JobStore {
 public:
  /// Opens (creating if missing) the RocksDB database in `dir`. Errors: io
  /// (RocksDB cannot open it), corrupt (a bad next_job_id).
  static Result<std::unique_ptr<JobStore>> open(const std::string& dir, JobStoreOptions options = {});
  ~JobStore();
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  /// Stores `record` under a fresh id (monotonic, persisted; record.id is
  /// ignored) and returns the id.
  Result<std::uint64_t> create_job(JobRecord record);
  /// Overwrites the stored record of record.id (which must exist).
  Status update_job(const JobRecord& record);
  Result<JobRecord> get_job(std::uint64_t job_id);
  /// All jobs, ascending id.
  Result<std::vector<JobRecord>> list_jobs();

  /// Commits one result exactly once: true when newly committed, false when
  /// that line was already committed (then nothing changes).
  Result<bool> put_result(std::uint64_t job_id, const StoredResult& result);
  /// Commits many results of one job in one synchronous batch; lines already
  /// committed (or repeated within `results`) are skipped. Returns how many
  /// were newly committed. The same batch deletes the resume records of the
  /// lines `drop_resume` (missing ones are no-ops; they are deleted even when
  /// no result is new).
  Result<std::size_t> put_results(std::uint64_t job_id, const std::vector<StoredResult>& results,
                                  const std::vector<std::uint64_t>& drop_resume = {});
  /// The committed output line, or nullopt.
  Result<std::optional<std::string>> get_result(std::uint64_t job_id, std::uint64_t line_index);
  Result<bool> has_result(std::uint64_t job_id, std::uint64_t line_index);
  /// Committed lines of the job (from the counters; no scan).
  Result<std::uint64_t> count_results(std::uint64_t job_id);
  Result<JobCounters> counters(std::uint64_t job_id);
  /// Calls fn(line_index, line) for committed results with line >= from_line,
  /// ascending, while fn returns true.
  Status scan_results(std::uint64_t job_id, std::uint64_t from_line,
                      const std::function<bool(std::uint64_t, std::string_view)>& fn);

  Result<OutputProgress> output_progress(std::uint64_t job_id);
  Status set_output_progress(std::uint64_t job_id, const OutputProgress& progress);

  /// Writes (overwrites) the resume records of `records`, of any jobs, in one
  /// WriteBatch to the WAL without a sync (see the file comment). Errors:
  /// disk_full, io.
  Status put_resume(const std::vector<ResumeRecord>& records);
  /// The resume records of a job, ascending line. Errors: io, corrupt.
  Result<std::vector<ResumeRecord>> load_resume(std::uint64_t job_id);
  /// Deletes every resume record of a job (one batch, synchronous). Errors:
  /// disk_full, io.
  Status delete_resume(std::uint64_t job_id);
  /// How many resume records a job has (a scan). Error: io.
  Result<std::size_t> count_resume_records(std::uint64_t job_id);

  /// Stores a job's prefix-aware line order ('L' records of kOrderChunk
  /// entries, 32 bytes each), in one synchronous batch. Errors: disk_full, io.
  Status put_line_order(std::uint64_t job_id, const std::vector<LineOrderEntry>& order);
  static constexpr std::size_t kOrderChunk = 4096;
  /// The stored order (empty when none). Errors: io, corrupt.
  Result<std::vector<LineOrderEntry>> load_line_order(std::uint64_t job_id);
  /// Deletes it (one batch, synchronous). Errors: disk_full, io.
  Status delete_line_order(std::uint64_t job_id);

  /// The job's recovery counters (zeros when never written). Errors: io, corrupt.
  Result<RecoveryCounters> recovery_counters(std::uint64_t job_id);
  /// Overwrites them, to the WAL without a sync. Errors: disk_full, io.
  Status set_recovery_counters(std::uint64_t job_id, const RecoveryCounters& counters);

  [[nodiscard]] const std::string& dir() const noexcept { return dir_; }
  /// How many times the database was closed and opened again after a
  /// failed write (a full disk: issue 46, items 7 and 8).
  [[nodiscard]] std::uint64_t reopens() const noexcept { return db_.reopens(); }

 private:
  JobStore(std::string dir, std::unique_ptr<rocksdb::Env> env, kvstore::ReopenableDb db, std::uint64_t next_job_id);
  Result<JobCounters> counters_locked(std::uint64_t job_id);
  /// Deletes every record of `job_id` under `tag` (one synchronous batch);
  /// `what` names them in errors.
  Status delete_job_records(char tag, std::uint64_t job_id, const char* what);
  /// db_.writable(), dropping the counter cache when it reopened.
  Status ready_locked();

  std::string dir_;
  std::unique_ptr<rocksdb::Env> env_;  ///< over options.file_system; null: the default Env. Outlives db_.
  kvstore::ReopenableDb db_;           ///< reopened after a write a full disk failed
  std::uint64_t next_job_id_;
  std::recursive_mutex mu_;  ///< scan_results' callback may call back in
  std::map<std::uint64_t, JobCounters> counter_cache_;
};

}  // namespace shardline::orchestrator
