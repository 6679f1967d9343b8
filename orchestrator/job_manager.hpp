#pragma once
/// \file
/// The orchestrator's job logic as a plain class (no threads, no actors: the
/// orchestrator actor owns one JobManager and calls it from its behaviour).
///
/// Life of a job:
///  - submit(spec): counts the non-blank lines of all shards, stores the job
///    (state queued), parses every line once and commits the per-line parse
///    errors as error results right away. Good lines are NOT kept in memory:
///    they are read again lazily from the shards by next_work().
///  - next_work(n, worker): hands out up to n pending requests, FIFO over jobs
///    (lowest job id first; within a job, requeued lines first, then the
///    job's prefix-aware order (orchestrator/line_order.hpp: lines that
///    share a prompt prefix go out together, to the asking worker), or input
///    order) and marks them in flight on `worker`. The job becomes running.
///  - on_result(s): commits each result exactly once (duplicates, e.g. from a
///    retried worker, are ignored), then appends the contiguous committed
///    prefix to the output file. When every line is committed and written the
///    job is done.
///  - on_kv_progress(worker, progress): a worker reports how far the KV of
///    its in-flight choices is replicated; the latest becomes the line's
///    resume point (BatchRequest::resume), in memory and in jobs.db.
///  - requeue_in_flight(worker) when a worker dies; requeue_all() when every
///    worker is lost. The requeued lines keep their resume point, so the
///    next worker fetches that KV and recomputes only the positions after
///    it (DéjàVu, seed 003 §4.2.3). Which line is in flight where is memory
///    only: after a restart (JobManager::open) everything not committed is
///    pending again, with its stored resume point, and each unfinished job's
///    output file is recovered (torn tail truncated).
///  - cancel(job): the job stops (state cancelled, durably, first); nothing
///    more of it is handed out or committed, and its output file gets every
///    line committed until then, in line order (OutputWriter::
///    finish_partial). open() finishes that file when a crash came between
///    (best effort: cancel() again retries and reports an error).
///  - claim_in_flight(worker, lines) after a restart of the orchestrator
///    alone: a worker that lived through it reports the lines it still
///    holds, and they are in flight on it again instead of pending.
/// Memory: O(in-flight + requeued) requests per job, plus one open shard.
///
/// Determinism: the output bytes depend only on the committed results, never
/// on timing, order of arrival, crashes or restarts.

#include <cstdint>
#include <functional>
#include <fstream>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/file_system.hpp"
#include "common/result.hpp"
#include "worker/batch_types.hpp"
#include "orchestrator/batch_format.hpp"
#include "orchestrator/job_admission.hpp"
#include "orchestrator/job_store.hpp"
#include "orchestrator/line_order.hpp"
#include "orchestrator/output_lock.hpp"
#include "orchestrator/output_writer.hpp"
#include "orchestrator/shard_reader.hpp"

namespace shardline::orchestrator {

struct JobProgress {
  std::uint64_t job_id = 0;
  JobState state = JobState::queued;
  std::uint64_t total = 0;       ///< lines of the job
  std::uint64_t done = 0;        ///< committed lines (completions + errors)
  std::uint64_t failed = 0;      ///< committed error lines (part of done)
  std::uint64_t in_flight = 0;   ///< handed out, not yet committed
  std::uint64_t pending = 0;     ///< total - done - in_flight
  std::uint64_t written = 0;     ///< lines durably in the output file
  std::uint64_t prompt_tokens = 0;
  std::uint64_t completion_tokens = 0;
  /// Of prompt_tokens, those the workers found in their prefix caches (the
  /// first choice of each line): the job's hit rate is cached / prompt.
  std::uint64_t cached_tokens = 0;
  /// Completion tokens per second since this process started serving the
  /// job (frozen when it finishes); for a job finished by an earlier process,
  /// the average over created → finished. 0 when unknown.
  double tokens_per_s = 0.0;
  /// Seconds left at the current line rate; 0 when finished, -1 when unknown.
  double eta_s = -1.0;
  std::string error;  ///< state failed: why
  /// "" unless the job is paused: the error of the write that failed
  /// ("disk_full: write /out/o.jsonl: No space left on device"). A paused
  /// job stays queued or running; see JobManager::retry_paused().
  std::string paused;
  std::uint64_t pauses = 0;  ///< times it was paused since this process opened it
  /// Failures and recoveries (`job status`), over the job's life. Kept in
  /// jobs.db without a sync: a power cut may lose the newest increments.
  std::uint64_t requeued = 0;  ///< lines handed back to pending because their worker failed (each time)
  std::uint64_t resumed = 0;   ///< lines handed out with some choice's num_kv_tokens > 0 (each time)
  /// Its lines go out in prefix-aware order (else in input order).
  bool prefix_ordered = false;
  /// The prefix tree's share of the prompts' text, 0..1: the hit rate a
  /// prefix cache that never evicts reaches (0 when unknown).
  double prefix_ideal_hit_rate = 0.0;
};

struct JobManagerOptions {
  /// Monotonic seconds, for rates (tests inject a fake clock).
  std::function<double()> clock;
  /// Results per synchronous store batch while committing parse errors.
  std::size_t commit_batch = 1024;
  /// The file system of the output files and of the data dir's folders;
  /// null: posix_file_system(). Tests inject a fault-injecting one.
  std::shared_ptr<FileSystem> file_system;
  /// Options of the JobStore under data_dir/jobs.db (its RocksDB file system).
  JobStoreOptions store;
  /// model::model_fingerprint of the model this cluster's workers run, and
  /// its folder (for messages). Set: a submit records it in the job
  /// (JobSpec::model_fingerprint) and is refused when the job's model_dir is
  /// readable here and holds another model; open() holds back (does not
  /// serve, progress().error says why) an unfinished job recorded with
  /// another model, so two models' lines never share one file (issue 46,
  /// item 10). "" (tests): no check.
  std::string model_fingerprint;
  std::string model_dir;
  /// The longest input line, in bytes (without its newline), a job takes:
  /// a longer one is not read into memory but committed at submit as a
  /// `line_too_long` error (issue 46, item 6). 0: no limit.
  std::uint64_t max_line_bytes = kDefaultMaxLineBytes;
  static constexpr std::uint64_t kDefaultMaxLineBytes = 16ull << 20;
  /// Prefix-aware scheduling (issue 42, step 4; orchestrator/line_order.hpp):
  /// a job's lines go out in the order of its prompts' prefix tree, computed
  /// at submit and stored with it. False: input order.
  bool order_lines_by_prefix = true;
};

class JobManager {
 public:
  /// Opens (creating) the state in `data_dir` (RocksDB under data_dir/jobs.db;
  /// the folders are created durably, see create_directories_durably()),
  /// restores every job and recovers the output files of unfinished ones. A
  /// job whose shard vanished or changed size is marked failed.
  static Result<std::unique_ptr<JobManager>> open(const std::string& data_dir,
                                                  JobManagerOptions options = {});
  ~JobManager();
  JobManager(const JobManager&) = delete;
  JobManager& operator=(const JobManager&) = delete;

  /// Records a job and returns its id. With `cluster` (the orchestrator's
  /// submits), the job is first admitted against what the cluster runs
  /// (admit_job(): its model folder, its spec.parallel when given, its
  /// spec.weight_sharing when given), and spec.parallel becomes the config
  /// it runs on; without (tests, tools), none of that is checked.
  /// spec.token_budget "" becomes "fixed"; spec.parallel, when given, is
  /// stored in canonical form. Errors: admit_job's, or
  /// invalid_argument (no inputs, no output, output used by an unfinished job
  /// or equal to an input, an existing non-empty output file without
  /// spec.overwrite, an output another process holds the lock of (the
  /// message names it; OutputLock), unknown token budget policy, bad
  /// parallel config),
  /// not_found / io (a shard cannot be read; then no job is created).
  /// Lines that do not parse, and lines whose custom_id an earlier line of
  /// the job has (duplicate_custom_id), are committed as errors here.
  Result<std::uint64_t> submit(JobSpec spec, const ClusterShape* cluster = nullptr);

  /// Up to max_count pending requests, now in flight on `worker`; each
  /// carries its job's token budget policy (BatchRequest::token_budget).
  std::vector<worker::BatchRequest> next_work(std::size_t max_count, const std::string& worker = {});

  /// Commits results (any order, duplicates ignored, unknown jobs / lines out
  /// of range ignored) and advances the output files. Returns how many lines
  /// were newly committed. An error is a store or output write failure (a
  /// full disk: disk_full; issue 46, items 7 and 8): the job is then paused
  /// (JobProgress::paused says why). Nothing is lost: the results that could
  /// not be committed wait in memory (counted in_flight), a paused job hands
  /// out no more work, its later results wait too, and retry_paused() writes
  /// them all once the disk has room.
  Result<std::size_t> on_results(const std::vector<worker::BatchResult>& results);

  /// Retries the writes of every paused job whose back-off is due: commits
  /// its waiting results and advances its output file. A job whose writes
  /// all succeed resumes (next_work hands its lines out again); one that
  /// fails again waits twice as long as before (kFirstRetryS, doubling up to
  /// kMaxRetryS). Returns the ids of the jobs that resumed. The orchestrator
  /// calls it at every tick.
  std::vector<std::uint64_t> retry_paused();
  static constexpr double kFirstRetryS = 0.5;
  static constexpr double kMaxRetryS = 30.0;
  Result<std::size_t> on_result(const worker::BatchResult& result);

  /// Records replicated KV progress that `worker` reports (one entry per
  /// choice, worker::KvProgress). An entry counts when its line is in flight
  /// on `worker` (others are stale: lines in flight elsewhere, committed,
  /// pending, unknown jobs or lines), 0 <= choice < the line's n, and
  /// replicated_tokens >= 0 is greater than the choice's recorded one (acks
  /// never go back: a lower or equal one is ignored). It becomes the
  /// choice's ChoiceResume{output_ids, num_kv_tokens = replicated_tokens}
  /// (kv_chunk empty: the worker fetches the KV itself) in the line's resume
  /// vector (sized n; choices without progress keep a default one), which
  /// next_work() puts in BatchRequest::resume when it hands the line out
  /// again (after requeue_in_flight / requeue_all, or a restart). Every
  /// line changed by the call is written to jobs.db in one batch, to the WAL
  /// without a sync: a record lost to a power cut only means more recompute.
  /// Error: the store's io error; the memory state is updated even then (the
  /// lines resume from it while this process lives).
  Status on_kv_progress(const std::string& worker, std::span<const worker::KvProgress> progress);

  /// Cancels an unfinished job (the OpenAI batch `cancel`, `shardline job
  /// cancel`): its state becomes cancelled in jobs.db (synced) before
  /// anything else, so no later result of it is committed (on_results
  /// ignores finished jobs); its pending, requeued and in-flight lines are
  /// dropped, and its output file is finished with the lines committed so
  /// far, in line order (OutputWriter::finish_partial). Returns the workers
  /// that had lines of it in flight, in name order (the caller tells them to
  /// drop the job: CancelJob). Cancelling a cancelled job again returns no
  /// workers and retries finishing its file when an I/O error stopped that.
  /// Errors: not_found (no such job), invalid_argument (the job is done or
  /// failed: nothing to cancel), io (the record or the file could not be
  /// written; when the record was, the job is cancelled and a later cancel()
  /// or open() finishes the file).
  Result<std::vector<std::string>> cancel(std::uint64_t job_id);

  /// Makes the in-flight requests of `worker` pending again (first in line),
  /// with their recorded resume points. Counts them in JobProgress::requeued.
  std::size_t requeue_in_flight(const std::string& worker);
  /// Makes every in-flight request pending again (as requeue_in_flight).
  std::size_t requeue_all();

  /// Marks `lines`, which `worker` reports it holds, as in flight on it (so
  /// next_work() does not hand them out again): used when the orchestrator
  /// restarted (open() made every uncommitted line pending) and a worker
  /// that kept running re-registers. A line is claimed when its job is
  /// unfinished, it exists, has no committed result and is pending; a line
  /// already in flight on `worker` counts as claimed; one in flight on
  /// another worker, committed or unknown is skipped (the worker's result,
  /// if any, is then a duplicate that on_results ignores). Unread lines are
  /// read again from the shards (one pass per job, up to the highest line
  /// claimed). Returns the number of distinct lines of `lines` now in
  /// flight on `worker`. Errors: not_found / io (a shard cannot be read; the lines
  /// claimed before it stay claimed), or the store's.
  Result<std::size_t> claim_in_flight(const std::string& worker, const std::vector<worker::LineRef>& lines);

  /// Lines in flight on `worker`, over every job.
  [[nodiscard]] std::size_t in_flight_count(const std::string& worker) const;

  [[nodiscard]] Result<JobProgress> progress(std::uint64_t job_id) const;
  /// Progress of every job, ascending id.
  [[nodiscard]] std::vector<JobProgress> list_jobs() const;
  [[nodiscard]] Result<JobRecord> job(std::uint64_t job_id) const;
  /// True when some unfinished job has requests to hand out (or unread lines).
  [[nodiscard]] bool has_pending_work() const;
  /// True when no job is queued or running.
  [[nodiscard]] bool idle() const;

  [[nodiscard]] JobStore& store() noexcept { return *store_; }

 private:
  struct InFlight {
    std::string worker;
    worker::BatchRequest request;
  };
  /// The shard line `line` just read by `reader` as a request, or its error
  /// (a too-long line: line_too_long; else parse_batch_line's).
  [[nodiscard]] static BatchLine parse_read_line(const ShardReader& reader, const std::string& line,
                                                         std::uint64_t job_id, std::uint64_t line_index);
  struct Job {
    JobRecord rec;
    std::unique_ptr<OutputLock> lock;      ///< unfinished jobs only: its output file is ours
    std::unique_ptr<OutputWriter> writer;  ///< unfinished jobs only
    std::unique_ptr<ShardReader> reader;   ///< unfinished jobs only
    /// Where its lines start, recorded by every read of its shards (submit's
    /// passes, the reader): claim_in_flight seeks instead of reading again.
    LineIndex line_index;
    std::map<std::uint64_t, worker::BatchRequest> retry;
    /// Prefix-ordered jobs: where each line starts, in hand-out order, and
    /// the next place to hand out (memory only: after a restart it starts
    /// again at 0, skipping committed lines).
    std::vector<LineOrderEntry> order;
    std::size_t order_next = 0;
    std::map<std::uint64_t, InFlight> in_flight;
    /// Resume points of uncommitted lines ([n] per line), as in jobs.db 'K':
    /// the one source of BatchRequest::resume, which next_work() sets from it
    /// whenever it hands a line out (so requeued, claimed and reloaded lines
    /// all go out with their latest point; the requests kept in `retry` and
    /// `in_flight` hold what went out last).
    std::map<std::uint64_t, std::vector<worker::ChoiceResume>> resume;
    RecoveryCounters recovery;
    /// Why this unfinished job is not served (it was recorded with another
    /// model than this cluster's); "" = it is.
    std::string held;
    /// Results taken from workers and not yet in jobs.db (their commit
    /// failed), by line; save() commits them before anything else.
    std::map<std::uint64_t, StoredResult> unsaved;
    /// "" or why the job is paused (Error::to_string() of the failed write);
    /// retried at retry_at_s (clock seconds), after backoff_s.
    std::string paused;
    double retry_at_s = 0.0;
    double backoff_s = 0.0;
    std::uint64_t pauses = 0;
    bool session_started = false;
    double session_t0 = 0.0;
    double session_t1 = -1.0;  ///< when it finished in this process
    JobCounters session_c0;
  };

  JobManager(std::unique_ptr<JobStore> store, JobManagerOptions options);
  [[nodiscard]] static bool active(const Job& j) noexcept {
    return j.rec.state == JobState::queued || j.rec.state == JobState::running;
  }
  /// Unfinished and not held back: its lines are handed out and committed.
  [[nodiscard]] static bool served(const Job& j) noexcept { return active(j) && j.held.empty(); }
  [[nodiscard]] double now() const;
  /// submit's checks of a job against this manager's jobs and the cluster
  /// (`cluster` null: none), normalizing its parallel config, model name
  /// and token budget. Errors: invalid_argument, naming the problem.
  [[nodiscard]] Status check_spec(JobSpec& spec, const ClusterShape* cluster) const;
  /// submit's first read of the shards: their sizes and line count into
  /// `rec`, every shard checked to be JSONL, checkpoints into `line_index`.
  /// Errors: not_found / io (a shard), invalid_argument (not JSONL).
  [[nodiscard]] Status scan_shards(const JobSpec& spec, JobRecord& rec, LineIndex& line_index) const;
  /// submit's second read: commits the error result of each line that does
  /// not parse or repeats an earlier custom_id. Errors: reading, committing.
  [[nodiscard]] Status commit_bad_lines(Job& j);
  /// Whether lines of the job are still to be read and handed out (its
  /// order, or its reader, is not at the end).
  [[nodiscard]] static bool unread_left(const Job& j) noexcept {
    return j.rec.prefix_ordered ? j.order_next < j.order.size() : (j.reader && !j.reader->done());
  }
  /// next_work's handling of line `index`, just read by j.reader into
  /// `line`: skipped when committed (not looked up when `known_uncommitted`)
  /// or in flight; a request goes into `out`, in flight on `worker`; an
  /// error into `errors`. False when the store failed (the job is failed).
  bool hand_out_read_line(Job& j, std::uint64_t index, const std::string& line, const std::string& worker,
                          std::vector<worker::BatchRequest>& out, std::vector<StoredResult>& errors,
                          std::uint64_t& resumed, bool known_uncommitted = false);
  Status activate(Job& j);  ///< locks the output, opens writer + reader of an unfinished job
  /// Takes the lock of `output` (creating its folder) for a job of this
  /// data dir; job_id 0: not created yet.
  Result<std::unique_ptr<OutputLock>> lock_output(const std::string& output, std::uint64_t job_id) const;
  /// "job 3 of data dir /abs/dir (pid 123 on host h)"; job_id 0: "a job submitted to ...".
  [[nodiscard]] std::string lock_holder(std::uint64_t job_id) const;
  /// A cancelled job's output: finished with its committed lines (see
  /// cancel()) unless it already is.
  Status finish_cancelled_output(Job& j);
  void mark_started(Job& j);  ///< work went out: the session's rate clock starts, queued -> running
  /// Commits `batch` (cleared) and, in the same batch, deletes the resume
  /// records of `drop_resume` (also from j.resume when it succeeds).
  Status commit(Job& j, std::vector<StoredResult>& batch, std::size_t* added,
                const std::vector<std::uint64_t>& drop_resume = {});
  Status advance_output(Job& j);
  /// Commits j.unsaved (cleared when it worked) and advances the output;
  /// on a failure pauses the job (pause()) and returns the error.
  Status save(Job& j, std::size_t* added);
  /// Marks the job paused by `why`: the first time it retries after
  /// kFirstRetryS, then after twice the last wait (at most kMaxRetryS).
  void pause(Job& j, const Error& why);
  void fail_job(Job& j, const std::string& why);
  void finish_cleanup(Job& j);  ///< a finished job: drops its retry / in-flight state and resume records
  /// The job's settings every line carries: its token budget policy and,
  /// on chat lines, its --chat-template text.
  static void apply_job_settings(const Job& j, worker::BatchRequest& request);
  /// Sets request.resume to the line's resume point (none: empty; always
  /// none for a line with logprobs) and returns true when some choice has
  /// num_kv_tokens > 0.
  bool attach_resume(const Job& j, worker::BatchRequest& request) const;
  void add_recovery(Job& j, std::uint64_t requeued, std::uint64_t resumed);
  /// `input_line`: the line's number in its shard (BatchRequest::input_line),
  /// written as an error's "line"; 0 = not known.
  [[nodiscard]] StoredResult to_stored(const Job& j, const worker::BatchResult& r, std::uint64_t input_line) const;
  [[nodiscard]] JobProgress progress_of(const Job& j) const;

  std::unique_ptr<JobStore> store_;
  std::string data_dir_;  ///< named in output locks
  JobManagerOptions options_;
  std::map<std::uint64_t, Job> jobs_;
};

}  // namespace shardline::orchestrator
