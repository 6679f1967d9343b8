#include "orchestrator/job_manager.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <set>
#include <system_error>
#include <unordered_map>
#include <utility>

#include "common/json_bounded.hpp"
#include "model/model_fingerprint.hpp"
#include "orchestrator/batch_format.hpp"
#include "orchestrator/job_admission.hpp"

namespace shardline::orchestrator {

using worker::BatchRequest;
using worker::BatchResult;

namespace {

namespace fs = std::filesystem;

std::int64_t unix_ms_now() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string default_model_name(const std::string& model_dir) {
  fs::path p(model_dir);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();  // trailing '/'
  std::string name = p.filename().string();
  return name.empty() ? model_dir : name;
}

}  // namespace

BatchLine JobManager::parse_read_line(const ShardReader& reader, const std::string& line, std::uint64_t job_id,
                                      std::uint64_t line_index) {
  if (!reader.too_long()) return parse_batch_line(line, job_id, line_index);
  return BatchLine{make_error_result(job_id, line_index, default_custom_id(line_index), "line_too_long",
                                     "line " + std::to_string(reader.file_line()) + " of " + reader.shard_path() +
                                         " is " + std::to_string(reader.line_bytes()) +
                                         " bytes; a line may have at most " +
                                         std::to_string(reader.max_line_bytes()) + " bytes")};
}

// ---- JobManager -----------------------------------------------------------------

JobManager::JobManager(std::unique_ptr<JobStore> store, JobManagerOptions options)
    : store_(std::move(store)), options_(std::move(options)) {
  if (!options_.clock) options_.clock = steady_seconds;
  if (options_.commit_batch == 0) options_.commit_batch = 1;
  if (!options_.file_system) options_.file_system = posix_file_system();
}

JobManager::~JobManager() = default;

double JobManager::now() const { return options_.clock(); }

Result<std::unique_ptr<JobManager>> JobManager::open(const std::string& data_dir, JobManagerOptions options) {
  std::error_code ec;
  const std::string db_dir = (fs::path(data_dir) / "jobs.db").string();
  // Durably: RocksDB syncs what it writes inside jobs.db, not the folders above it.
  const auto file_system = options.file_system ? options.file_system : posix_file_system();
  if (Status st = create_directories_durably(*file_system, db_dir); !st.ok())
    return make_error(ErrorCode::io, "data dir " + data_dir + ": " + st.error().message);
  auto store = JobStore::open(db_dir, options.store);
  if (!store.ok()) return store.error();
  std::unique_ptr<JobManager> m(new JobManager(std::move(store.value()), std::move(options)));
  m->data_dir_ = data_dir;
  auto records = m->store_->list_jobs();
  if (!records.ok()) return records.error();
  for (auto& rec : *records) {
    const std::uint64_t id = rec.id;
    Job& j = m->jobs_[id];
    j.rec = std::move(rec);
    auto recovery = m->store_->recovery_counters(id);
    if (!recovery.ok()) return recovery.error();
    j.recovery = *recovery;
    if (!active(j)) {
      (void)m->store_->delete_resume(id);  // left over by a crash right after it finished
      (void)m->store_->delete_line_order(id);
      // A crash between the cancel's record and its finished output file.
      // Best effort: a file that cannot be written now must not keep the
      // orchestrator from starting; `job cancel` again retries and reports.
      if (j.rec.state == JobState::cancelled) (void)m->finish_cancelled_output(j);
      continue;
    }
    // Inputs must be what was submitted: line indexes depend on them.
    std::string changed;
    for (std::size_t i = 0; i < j.rec.spec.input_paths.size() && changed.empty(); ++i) {
      const auto& path = j.rec.spec.input_paths[i];
      const auto size = fs::file_size(path, ec);
      if (ec) changed = "input shard " + path + ": " + ec.message();
      else if (i < j.rec.input_sizes.size() && size != j.rec.input_sizes[i])
        changed = "input shard " + path + " changed since submit (" + std::to_string(j.rec.input_sizes[i]) +
                  " -> " + std::to_string(size) + " bytes)";
    }
    if (!changed.empty()) {
      m->fail_job(j, changed);
      continue;
    }
    const std::string& have = m->options_.model_fingerprint;
    if (!have.empty() && !j.rec.spec.model_fingerprint.empty() && j.rec.spec.model_fingerprint != have) {
      // Kept as it is, unserved: with its own model the job goes on.
      j.held = "job " + std::to_string(id) + " was started on another model than this node's --model " +
               m->options_.model_dir + " (model fingerprint " + j.rec.spec.model_fingerprint.substr(0, 12) +
               " vs " + have.substr(0, 12) + "): its lines so far came from that model; start the node with it to "
               "go on, or run the job again with --overwrite";
      continue;
    }
    if (Status st = m->activate(j); !st.ok()) {
      m->fail_job(j, st.error().to_string());
      continue;
    }
    if (!active(j)) continue;  // activate() found it complete
    if (j.rec.prefix_ordered) {
      // A damaged or missing order costs the job its order, not its lines:
      // it goes on in input order (committed lines are skipped either way).
      auto order = m->store_->load_line_order(id);
      if (order.ok() && !order->empty()) j.order = std::move(order).value();
      else j.rec.prefix_ordered = false;
    }
    auto resume = m->store_->load_resume(id);
    if (!resume.ok()) return resume.error();
    for (auto& r : *resume) {
      if (r.line_index >= j.rec.total_lines) continue;
      auto committed = m->store_->has_result(id, r.line_index);
      if (!committed.ok()) return committed.error();
      if (!*committed) j.resume[r.line_index] = std::move(r.choices);
    }
  }
  return m;
}

Result<std::unique_ptr<OutputLock>> JobManager::lock_output(const std::string& output, std::uint64_t job_id) const {
  const auto folder = fs::path(output).parent_path();
  if (!folder.empty()) {
    if (Status st = create_directories_durably(*options_.file_system, folder.string()); !st.ok())
      return make_error(st.error().code, "output " + output + ": " + st.error().message);
  }
  return OutputLock::acquire(output, lock_holder(job_id));
}

std::string JobManager::lock_holder(std::uint64_t job_id) const {
  std::error_code ec;
  const std::string dir = fs::absolute(data_dir_, ec).string();
  return (job_id ? "job " + std::to_string(job_id) + " of" : std::string("a job submitted to")) + " data dir " +
         (ec ? data_dir_ : dir) + " (" + OutputLock::this_process() + ")";
}

Status JobManager::activate(Job& j) {
  if (!j.lock) {
    auto lock = lock_output(j.rec.spec.output_path, j.rec.id);
    if (!lock.ok()) return lock.error();
    j.lock = std::move(lock).value();
  }
  auto w = OutputWriter::open(*store_, j.rec.id, j.rec.spec.output_path, j.rec.total_lines, options_.file_system);
  if (!w.ok()) return w.error();
  j.writer = std::move(w.value());
  j.reader = std::make_unique<ShardReader>(j.rec.spec.input_paths, options_.max_line_bytes, &j.line_index);
  return advance_output(j);
}

Status JobManager::finish_cancelled_output(Job& j) {
  auto op = store_->output_progress(j.rec.id);
  if (!op.ok()) return op.error();
  if (op->next_line >= j.rec.total_lines) return Status::ok_status();
  std::unique_ptr<OutputLock> lock;  // for this write only: the job is finished
  if (!j.lock) {
    auto l = lock_output(j.rec.spec.output_path, j.rec.id);
    if (!l.ok()) return l.error();
    lock = std::move(l).value();
  }
  auto w = OutputWriter::open(*store_, j.rec.id, j.rec.spec.output_path, j.rec.total_lines, options_.file_system);
  if (!w.ok()) return w.error();
  auto n = (*w)->finish_partial();
  if (!n.ok()) return n.error();
  return Status::ok_status();
}

Result<std::vector<std::string>> JobManager::cancel(std::uint64_t job_id) {
  const auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return make_error(ErrorCode::not_found, "job " + std::to_string(job_id) + ": no such job");
  Job& j = it->second;
  if (j.rec.state == JobState::cancelled) {
    if (Status st = finish_cancelled_output(j); !st.ok()) return st.error();
    return std::vector<std::string>{};
  }
  if (!active(j))
    return make_error(ErrorCode::invalid_argument, "job " + std::to_string(job_id) + " is already " +
                                                       job_state_name(j.rec.state) + ": nothing to cancel");
  std::set<std::string> workers;
  for (const auto& [line, f] : j.in_flight) workers.insert(f.worker);
  JobRecord rec = j.rec;
  rec.state = JobState::cancelled;
  rec.finished_unix_ms = unix_ms_now();
  if (Status st = store_->update_job(rec); !st.ok()) return st.error();  // still running, as it was
  j.rec = std::move(rec);
  // Nothing of it is committed from here on; the writer is done with once
  // the committed lines are in.
  Status written = Status::ok_status();
  if (j.writer) {
    auto n = j.writer->finish_partial();
    if (!n.ok()) written = n.error();
  } else {
    written = finish_cancelled_output(j);
  }
  finish_cleanup(j);
  if (!written.ok()) return written.error();
  return std::vector<std::string>(workers.begin(), workers.end());
}

void JobManager::fail_job(Job& j, const std::string& why) {
  j.rec.state = JobState::failed;
  j.rec.error = why;
  j.rec.finished_unix_ms = unix_ms_now();
  (void)store_->update_job(j.rec);  // best effort: an I/O error here leaves it unfinished
  finish_cleanup(j);
}

void JobManager::finish_cleanup(Job& j) {
  j.writer.reset();
  j.lock.reset();  // after the writer: its last write is in
  j.reader.reset();
  j.retry.clear();
  j.in_flight.clear();
  j.unsaved.clear();
  j.resume.clear();
  j.paused.clear();
  j.order.clear();
  j.order.shrink_to_fit();
  // Best effort: what an I/O error leaves behind, open() deletes.
  (void)store_->delete_resume(j.rec.id);
  (void)store_->delete_line_order(j.rec.id);
  if (j.session_started && j.session_t1 < 0) j.session_t1 = now();
}

void JobManager::apply_job_settings(const Job& j, BatchRequest& request) {
  request.token_budget = j.rec.spec.token_budget;
  if (request.chat) request.chat_template = j.rec.spec.chat_template;
}

bool JobManager::attach_resume(const Job& j, BatchRequest& request) const {
  const auto it = j.resume.find(request.line_index);
  // A line with logprobs starts again from its prompt: the logprobs of its
  // generated tokens were not replicated (the worker drops a resume too).
  if (it == j.resume.end() || request.params.logprobs >= 0) {
    request.resume.clear();
    return false;
  }
  request.resume = it->second;
  return std::any_of(request.resume.begin(), request.resume.end(),
                     [](const worker::ChoiceResume& c) { return c.num_kv_tokens > 0; });
}

void JobManager::add_recovery(Job& j, std::uint64_t requeued, std::uint64_t resumed) {
  if (requeued == 0 && resumed == 0) return;
  j.recovery.requeued += requeued;
  j.recovery.resumed += resumed;
  (void)store_->set_recovery_counters(j.rec.id, j.recovery);  // best effort: a lost write undercounts
}

Status JobManager::advance_output(Job& j) {
  if (!j.writer) return Status::ok_status();
  auto n = j.writer->advance();
  if (!n.ok()) return n.error();
  if (j.writer->complete()) {
    j.rec.state = JobState::done;
    j.rec.finished_unix_ms = unix_ms_now();
    if (Status st = store_->update_job(j.rec); !st.ok()) return st;
    finish_cleanup(j);
  }
  return Status::ok_status();
}

StoredResult JobManager::to_stored(const Job& j, const BatchResult& r, std::uint64_t input_line) const {
  StoredResult s;
  s.line_index = r.line_index;
  s.line = format_result_line(r, j.rec.spec.model_name, j.rec.spec.request_id_prefix, j.rec.output_id_key,
                              input_line);
  s.ok = r.ok;
  if (r.ok) {
    s.prompt_tokens = static_cast<std::uint64_t>(std::max(0, r.prompt_tokens));
    s.completion_tokens = static_cast<std::uint64_t>(std::max(0, r.completion_tokens));
    s.cached_tokens = static_cast<std::uint64_t>(std::clamp(r.cached_tokens, 0, std::max(0, r.prompt_tokens)));
  }
  return s;
}

Status JobManager::commit(Job& j, std::vector<StoredResult>& batch, std::size_t* added,
                          const std::vector<std::uint64_t>& drop_resume) {
  if (batch.empty()) return Status::ok_status();
  auto n = store_->put_results(j.rec.id, batch, drop_resume);
  batch.clear();
  if (!n.ok()) return n.error();
  for (const std::uint64_t line : drop_resume) j.resume.erase(line);
  if (added != nullptr) *added += *n;
  return Status::ok_status();
}

Status JobManager::check_spec(JobSpec& spec, const ClusterShape* cluster) const {
  JobAsk ask{spec.model_dir, std::nullopt, spec.weight_sharing};
  if (!spec.parallel.empty()) {
    auto pc = engine::parse_parallel_config(spec.parallel);
    if (!pc.ok()) return make_error(ErrorCode::invalid_argument, "job: " + pc.error().message);
    ask.parallel = *pc;
    spec.parallel = pc->to_string();
  }
  if (cluster != nullptr) {
    auto runs_on = admit_job(ask, *cluster);
    if (!runs_on.ok()) return runs_on.error();
    spec.parallel = runs_on->to_string();
  }
  if (spec.input_paths.empty()) return make_error(ErrorCode::invalid_argument, "job: no input shards");
  if (spec.output_path.empty()) return make_error(ErrorCode::invalid_argument, "job: no output path");
  for (const auto& in : spec.input_paths)
    if (same_path(in, spec.output_path))
      return make_error(ErrorCode::invalid_argument, "job: output " + spec.output_path + " is also an input");
  for (const auto& [id, j] : jobs_)
    if (active(j) && same_path(j.rec.spec.output_path, spec.output_path))
      return make_error(ErrorCode::invalid_argument, "job: output " + spec.output_path +
                                                         " is the output of unfinished job " + std::to_string(id));
  // A finished job's output, or any other file, is replaced only when asked
  // (issue 46, item 9): a rerun of `run` continues its job instead.
  if (std::error_code ec; !spec.overwrite && fs::is_regular_file(spec.output_path, ec) &&
                          fs::file_size(spec.output_path, ec) > 0 && !ec) {
    std::string whose;
    for (const auto& [id, j] : jobs_)
      if (same_path(j.rec.spec.output_path, spec.output_path))
        whose = " (the output of job " + std::to_string(id) + ", " + job_state_name(j.rec.state) + ")";
    return make_error(ErrorCode::invalid_argument, "job: output " + spec.output_path + " already exists" + whose +
                                                       ": pass --overwrite to replace it");
  }
  if (!options_.model_fingerprint.empty()) {
    if (auto asked = model::model_fingerprint(spec.model_dir); asked.ok() && *asked != options_.model_fingerprint)
      return make_error(ErrorCode::invalid_argument,
                        "job: --model " + spec.model_dir + " is not the model this cluster runs (" +
                            options_.model_dir + "): its workers would compute every line with " +
                            options_.model_dir);
    spec.model_fingerprint = options_.model_fingerprint;
  }
  if (spec.model_name.empty()) spec.model_name = default_model_name(spec.model_dir);
  auto budget = normalize_token_budget(spec.token_budget);
  if (!budget.ok()) return make_error(ErrorCode::invalid_argument, "job: " + budget.error().message);
  spec.token_budget = std::move(budget).value();
  return Status::ok_status();
}

Status JobManager::scan_shards(const JobSpec& spec, JobRecord& rec, LineIndex& line_index) const {
  std::error_code ec;
  for (const auto& path : spec.input_paths) {
    const auto size = fs::file_size(path, ec);
    if (ec) return make_error(ErrorCode::not_found, "input shard " + path + ": " + ec.message());
    rec.input_sizes.push_back(size);
  }
  ShardReader counter(spec.input_paths, options_.max_line_bytes, &line_index);
  std::string line;
  // A shard none of whose lines is a JSON object is not JSONL (a CSV, a
  // JSON array): refused, naming its first line, rather than a job whose
  // every line is an invalid_json error (issue 46, item 13). One good
  // line settles a shard; the rest are only counted.
  std::size_t shard = counter.shard();
  bool shard_ok = false;
  std::string first_bad;
  auto check_shard = [&]() -> Status {
    if (shard_ok || first_bad.empty()) return {};
    return make_error(ErrorCode::invalid_argument,
                      "input shard " + spec.input_paths[shard] +
                          " is not JSONL: no line is a JSON object (each line must be one request); " + first_bad);
  };
  for (;;) {
    auto more = counter.next(line);
    if (!more.ok()) return more.error();
    if (*more && counter.shard() != shard) {
      if (Status st = check_shard(); !st.ok()) return st.error();
      shard = counter.shard();
      shard_ok = false;
      first_bad.clear();
    }
    if (!*more) {
      if (Status st = check_shard(); !st.ok()) return st.error();
      break;
    }
    if (shard_ok || counter.too_long()) continue;  // a too-long line settles nothing
    auto parsed = parse_json_bounded(line);
    if (parsed.ok() && parsed->is_object()) {
      shard_ok = true;
    } else if (first_bad.empty()) {
      const std::string snippet = line.size() > 60 ? line.substr(0, 57) + "..." : line;
      first_bad = "line " + std::to_string(counter.file_line()) + ": " +
                  (parsed.ok() ? "a JSON " + std::string(parsed->type_name()) + ", not an object"
                               : parsed.error().message) +
                  ": " + nlohmann::json(snippet).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    }
  }
  rec.total_lines = counter.next_index();
  return Status::ok_status();
}

Status JobManager::commit_bad_lines(Job& j) {
  ShardReader parser(j.rec.spec.input_paths, options_.max_line_bytes, &j.line_index);
  std::vector<StoredResult> batch;
  std::unordered_map<std::string, std::uint64_t> first_line;  // custom_id -> its first line index
  LineOrderBuilder order;  // the good lines' prefix keys
  std::string line;
  for (;;) {
    auto more = parser.next(line);
    if (!more.ok()) return more.error();
    if (!*more || parser.next_index() > j.rec.total_lines) break;
    const std::uint64_t index = parser.next_index() - 1;
    BatchLine parsed = parse_read_line(parser, line, j.rec.id, index);
    const std::string& custom_id = parsed.is_request() ? parsed.request().custom_id : parsed.error().custom_id;
    const auto [first, fresh] = first_line.emplace(custom_id, index);
    if (!fresh) {
      batch.push_back(to_stored(j, make_error_result(j.rec.id, index, custom_id, "duplicate_custom_id",
                                                     "custom_id: '" + custom_id + "' is also the custom_id of line " +
                                                         std::to_string(first->second + 1) +
                                                         "; every line of a job needs its own"),
                                parser.file_line()));
    } else if (!parsed.is_request()) {
      batch.push_back(to_stored(j, parsed.error(), parser.file_line()));
    } else {
      order.add(index, parser.last_line_start(), parsed.request());
      continue;
    }
    if (batch.size() >= options_.commit_batch)
      if (Status st = commit(j, batch, nullptr); !st.ok()) return st;
  }
  if (Status st = commit(j, batch, nullptr); !st.ok()) return st;
  // The prefix-aware order: stored before the record says so (a crash in
  // between leaves the job in input order; finish_cleanup drops the order).
  LineOrderBuilder::Built built = order.build();
  j.rec.prefix_prompt_bytes = built.prompt_bytes;
  j.rec.prefix_shared_bytes = built.shared_bytes;
  // An order that cannot be stored (a full disk) leaves the job in input
  // order: the order is an optimisation, the job is not lost for it.
  if (options_.order_lines_by_prefix && built.order.size() > 1 &&
      store_->put_line_order(j.rec.id, built.order).ok()) {
    j.rec.prefix_ordered = true;
    j.order = std::move(built.order);
    j.order_next = 0;
  }
  return store_->update_job(j.rec);
}

Result<std::uint64_t> JobManager::submit(JobSpec spec, const ClusterShape* cluster) {
  if (Status st = check_spec(spec, cluster); !st.ok()) return st.error();
  // Another process writing this output (a `run` with another --data-dir)
  // is refused before anything is created.
  auto lock = lock_output(spec.output_path, 0);
  if (!lock.ok()) return lock.error();

  JobRecord rec;
  LineIndex line_index;
  rec.created_unix_ms = unix_ms_now();
  auto output_id_key = new_output_id_key();
  if (!output_id_key.ok()) return output_id_key.error();
  rec.output_id_key = std::move(output_id_key).value();
  // Pass 1: sizes and line count (nothing is created when a shard is unreadable).
  if (Status st = scan_shards(spec, rec, line_index); !st.ok()) return st.error();
  rec.spec = std::move(spec);
  rec.state = JobState::queued;
  auto id = store_->create_job(rec);
  if (!id.ok()) return id.error();
  rec.id = *id;
  Job& j = jobs_[rec.id];
  j.rec = std::move(rec);
  j.lock = std::move(lock).value();
  j.lock->describe(lock_holder(j.rec.id));
  j.line_index = std::move(line_index);
  // Pass 2: commit the parse errors and the lines whose custom_id an
  // earlier line has now (good lines are read again when they are handed
  // out; next_work skips committed ones). Then serve it.
  Status st = commit_bad_lines(j);
  if (st.ok()) st = activate(j);
  if (!st.ok()) {
    fail_job(j, st.error().to_string());
    return st.error();
  }
  return j.rec.id;
}

std::vector<BatchRequest> JobManager::next_work(std::size_t max_count, const std::string& worker) {
  std::vector<BatchRequest> out;
  for (auto& [id, j] : jobs_) {
    if (out.size() >= max_count) break;
    if (!served(j) || !j.paused.empty()) continue;  // a paused job's results could not be stored
    const std::size_t before = out.size();
    std::uint64_t resumed = 0;
    while (!j.retry.empty() && out.size() < max_count) {
      auto node = j.retry.extract(j.retry.begin());
      apply_job_settings(j, node.mapped());
      if (attach_resume(j, node.mapped())) ++resumed;
      j.in_flight[node.key()] = InFlight{worker, node.mapped()};
      out.push_back(std::move(node.mapped()));
    }
    std::vector<StoredResult> errors;
    std::string line;
    while (j.rec.prefix_ordered && j.reader && j.order_next < j.order.size() && out.size() < max_count) {
      const LineOrderEntry& e = j.order[j.order_next++];
      if (j.in_flight.count(e.line_index) != 0) continue;  // claimed (claim_in_flight)
      auto committed = store_->has_result(j.rec.id, e.line_index);
      if (!committed.ok()) {
        fail_job(j, committed.error().to_string());
        break;
      }
      if (*committed) continue;
      Status seek = j.reader->seek_to(e.line_index, {static_cast<std::size_t>(e.shard), e.byte_offset, e.file_line});
      auto more = seek.ok() ? j.reader->next(line) : Result<bool>(seek.error());
      // A blank line or another line where the job's line started: the
      // shard was edited in place (its size is checked at open).
      if (!more.ok() || !*more || j.reader->last_line_start().byte_offset != e.byte_offset) {
        fail_job(j, more.ok() ? "input shard " + j.rec.spec.input_paths[static_cast<std::size_t>(e.shard)] +
                                    ": line " + std::to_string(e.line_index + 1) +
                                    " of the job is not where it was at submit (the shard changed)"
                              : more.error().to_string());
        break;
      }
      if (!hand_out_read_line(j, e.line_index, line, worker, out, errors, resumed, /*known_uncommitted=*/true)) break;
    }
    while (!j.rec.prefix_ordered && j.reader && !j.reader->done() && out.size() < max_count) {
      auto more = j.reader->next(line);
      if (!more.ok()) {
        fail_job(j, more.error().to_string());
        break;
      }
      if (!*more) break;
      const std::uint64_t index = j.reader->next_index() - 1;
      if (index >= j.rec.total_lines) {  // the shard grew; sizes are checked at open
        j.reader->stop();
        break;
      }
      if (!hand_out_read_line(j, index, line, worker, out, errors, resumed)) break;
    }
    if (!active(j)) {  // failed while reading: take its requests back
      out.resize(before);
      continue;
    }
    add_recovery(j, 0, resumed);
    if (!errors.empty()) {
      if (Status st = commit(j, errors, nullptr); st.ok()) (void)advance_output(j);
    }
    if (out.size() > before) mark_started(j);
  }
  return out;
}

bool JobManager::hand_out_read_line(Job& j, std::uint64_t index, const std::string& line, const std::string& worker,
                                    std::vector<BatchRequest>& out, std::vector<StoredResult>& errors,
                                    std::uint64_t& resumed, bool known_uncommitted) {
  if (!known_uncommitted) {
    auto committed = store_->has_result(j.rec.id, index);
    if (!committed.ok()) {
      fail_job(j, committed.error().to_string());
      return false;
    }
    if (*committed) return true;
  }
  // Lines claimed ahead of the reader (claim_in_flight) are in flight;
  // requeued, they left retry (taken first) before this point.
  if (j.in_flight.count(index) != 0) return true;
  BatchLine parsed = parse_read_line(*j.reader, line, j.rec.id, index);
  if (!parsed.is_request()) {  // only after a crash during submit
    errors.push_back(to_stored(j, parsed.error(), j.reader->file_line()));
    return true;
  }
  parsed.request().input_line = j.reader->file_line();
  apply_job_settings(j, parsed.request());
  if (attach_resume(j, parsed.request())) ++resumed;  // pending since a restart
  j.in_flight[index] = InFlight{worker, parsed.request()};
  out.push_back(std::move(parsed.request()));
  return true;
}

void JobManager::mark_started(Job& j) {
  if (!j.session_started) {
    j.session_started = true;
    j.session_t0 = now();
    auto c = store_->counters(j.rec.id);
    if (c.ok()) j.session_c0 = *c;
  }
  if (j.rec.state == JobState::queued) {
    j.rec.state = JobState::running;
    (void)store_->update_job(j.rec);
  }
}

Result<std::size_t> JobManager::claim_in_flight(const std::string& worker, const std::vector<worker::LineRef>& lines) {
  std::size_t claimed = 0;
  std::map<std::uint64_t, std::set<std::uint64_t>> unread;  // job -> lines still to read from the shards
  const std::set<worker::LineRef> distinct(lines.begin(), lines.end());
  for (const worker::LineRef& l : distinct) {
    const auto it = jobs_.find(l.job_id);
    if (it == jobs_.end() || !served(it->second)) continue;
    Job& j = it->second;
    if (l.line_index >= j.rec.total_lines) continue;
    if (const auto f = j.in_flight.find(l.line_index); f != j.in_flight.end()) {
      if (f->second.worker == worker) ++claimed;
      continue;
    }
    if (auto r = j.retry.find(l.line_index); r != j.retry.end()) {
      BatchRequest req = std::move(r->second);
      j.retry.erase(r);
      apply_job_settings(j, req);
      j.in_flight[l.line_index] = InFlight{worker, std::move(req)};
      mark_started(j);
      ++claimed;
      continue;
    }
    // Pending lines the reader has passed are all in flight or in retry;
    // the others are unread (or committed).
    // (In prefix order, lines behind the place handed out next were all
    // handed out: in flight, in retry or committed.)
    if (!j.reader || (!j.rec.prefix_ordered && l.line_index < j.reader->next_index())) continue;
    auto committed = store_->has_result(j.rec.id, l.line_index);
    if (!committed.ok()) return committed.error();
    if (!*committed) unread[l.job_id].insert(l.line_index);
  }
  for (const auto& [id, wanted] : unread) {
    Job& j = jobs_.at(id);
    // Each wanted line is reached from the checkpoint at or before it, not
    // from the shards' start.
    ShardReader reader(j.rec.spec.input_paths, options_.max_line_bytes, &j.line_index);
    std::string line;
    auto next = wanted.begin();
    while (next != wanted.end()) {
      if (Status st = reader.seek_near(*next); !st) return st.error();
      auto more = reader.next(line);
      if (!more.ok()) return more.error();
      if (!*more) break;
      const std::uint64_t index = reader.next_index() - 1;
      if (index != *next) continue;
      ++next;
      BatchLine parsed = parse_read_line(reader, line, j.rec.id, index);
      if (!parsed.is_request()) continue;  // committed as an error at submit
      parsed.request().input_line = reader.file_line();
      apply_job_settings(j, parsed.request());
      j.in_flight[index] = InFlight{worker, std::move(parsed.request())};
      mark_started(j);
      ++claimed;
    }
  }
  return claimed;
}

std::size_t JobManager::in_flight_count(const std::string& worker) const {
  std::size_t n = 0;
  for (const auto& [id, j] : jobs_)
    for (const auto& [line, f] : j.in_flight)
      if (f.worker == worker) ++n;
  return n;
}

Result<std::size_t> JobManager::on_results(const std::vector<BatchResult>& results) {
  std::set<std::uint64_t> touched;
  for (const auto& r : results) {
    auto it = jobs_.find(r.job_id);
    if (it == jobs_.end() || !served(it->second)) continue;
    Job& j = it->second;
    if (r.line_index >= j.rec.total_lines) continue;
    std::uint64_t input_line = 0;  // known while the line is in flight or requeued here
    if (const auto rt = j.retry.find(r.line_index); rt != j.retry.end()) {
      input_line = rt->second.input_line;
      j.retry.erase(rt);
    }
    auto f = j.in_flight.find(r.line_index);
    if (f != j.in_flight.end()) input_line = f->second.request.input_line;
    StoredResult stored;
    if (f != j.in_flight.end() && f->second.request.custom_id != r.custom_id) {
      BatchResult fixed = r;  // the custom_id is the input's, whatever the worker says
      fixed.custom_id = f->second.request.custom_id;
      stored = to_stored(j, fixed, input_line);
    } else {
      stored = to_stored(j, r, input_line);
    }
    j.unsaved.try_emplace(r.line_index, std::move(stored));  // a duplicate keeps the first
    if (f != j.in_flight.end()) j.in_flight.erase(f);
    touched.insert(r.job_id);
  }
  std::size_t added = 0;
  Status first_error;
  for (const std::uint64_t id : touched) {
    Job& j = jobs_.at(id);
    if (!j.paused.empty()) continue;  // its writes wait for retry_paused()'s back-off
    if (Status st = save(j, &added); !st.ok() && first_error.ok()) first_error = st;
  }
  if (!first_error.ok()) return first_error.error();
  return added;
}

Status JobManager::save(Job& j, std::size_t* added) {
  if (!j.unsaved.empty()) {
    std::vector<StoredResult> batch;
    std::vector<std::uint64_t> drop_resume;  // lines whose resume record goes with the commit
    batch.reserve(j.unsaved.size());
    for (const auto& [line, stored] : j.unsaved) {
      batch.push_back(stored);
      if (j.resume.count(line) != 0) drop_resume.push_back(line);
    }
    if (Status st = commit(j, batch, added, drop_resume); !st.ok()) {
      pause(j, st.error());
      return st;
    }
    j.unsaved.clear();
  }
  if (Status st = advance_output(j); !st.ok()) {
    pause(j, st.error());
    return st;
  }
  return Status::ok_status();
}

void JobManager::pause(Job& j, const Error& why) {
  j.backoff_s = j.paused.empty() ? kFirstRetryS : std::min(2 * j.backoff_s, kMaxRetryS);
  if (j.paused.empty()) ++j.pauses;
  j.paused = why.to_string();
  j.retry_at_s = now() + j.backoff_s;
}

std::vector<std::uint64_t> JobManager::retry_paused() {
  std::vector<std::uint64_t> resumed;
  const double t = now();
  for (auto& [id, j] : jobs_) {
    if (j.paused.empty() || t < j.retry_at_s) continue;
    if (!served(j)) {  // finished (cancelled) meanwhile: nothing to write
      j.paused.clear();
      continue;
    }
    if (Status st = save(j, nullptr); !st.ok()) continue;  // paused again, twice as long
    j.paused.clear();
    j.backoff_s = 0.0;
    resumed.push_back(id);
  }
  return resumed;
}

Result<std::size_t> JobManager::on_result(const BatchResult& result) {
  return on_results(std::vector<BatchResult>{result});
}

Status JobManager::on_kv_progress(const std::string& worker, std::span<const worker::KvProgress> progress) {
  std::set<worker::LineRef> changed;
  for (const worker::KvProgress& p : progress) {
    const auto it = jobs_.find(p.job_id);
    if (it == jobs_.end() || !active(it->second)) continue;
    Job& j = it->second;
    const auto f = j.in_flight.find(p.line_index);
    if (f == j.in_flight.end() || f->second.worker != worker) continue;  // stale
    const int n = f->second.request.n;
    if (p.choice < 0 || p.choice >= n || p.replicated_tokens < 0) continue;
    const auto r = j.resume.find(p.line_index);
    const int recorded = r == j.resume.end() || static_cast<std::size_t>(p.choice) >= r->second.size()
                             ? 0
                             : r->second[static_cast<std::size_t>(p.choice)].num_kv_tokens;
    if (p.replicated_tokens <= recorded) continue;  // acks never go back
    auto& choices = j.resume[p.line_index];
    choices.resize(static_cast<std::size_t>(n));
    choices[static_cast<std::size_t>(p.choice)] = worker::ChoiceResume{p.output_ids, p.replicated_tokens, {}};
    changed.insert(worker::LineRef{p.job_id, p.line_index});
  }
  std::vector<ResumeRecord> records;
  records.reserve(changed.size());
  for (const worker::LineRef& l : changed)
    records.push_back(ResumeRecord{l.job_id, l.line_index, jobs_.at(l.job_id).resume.at(l.line_index)});
  return store_->put_resume(records);
}

std::size_t JobManager::requeue_in_flight(const std::string& worker) {
  std::size_t n = 0;
  for (auto& [id, j] : jobs_) {
    std::uint64_t job_n = 0;
    for (auto it = j.in_flight.begin(); it != j.in_flight.end();) {
      if (it->second.worker == worker) {
        j.retry[it->first] = std::move(it->second.request);  // next_work attaches its resume point
        it = j.in_flight.erase(it);
        ++job_n;
      } else {
        ++it;
      }
    }
    add_recovery(j, job_n, 0);
    n += job_n;
  }
  return n;
}

std::size_t JobManager::requeue_all() {
  std::size_t n = 0;
  for (auto& [id, j] : jobs_) {
    for (auto& [line, f] : j.in_flight) j.retry[line] = std::move(f.request);
    add_recovery(j, j.in_flight.size(), 0);
    n += j.in_flight.size();
    j.in_flight.clear();
  }
  return n;
}

JobProgress JobManager::progress_of(const Job& j) const {
  JobProgress p;
  p.job_id = j.rec.id;
  p.state = j.rec.state;
  p.total = j.rec.total_lines;
  p.error = j.held.empty() ? j.rec.error : j.held;
  p.requeued = j.recovery.requeued;
  p.resumed = j.recovery.resumed;
  p.prefix_ordered = j.rec.prefix_ordered;
  if (j.rec.prefix_prompt_bytes > 0)
    p.prefix_ideal_hit_rate =
        static_cast<double>(j.rec.prefix_shared_bytes) / static_cast<double>(j.rec.prefix_prompt_bytes);
  JobCounters c;
  if (auto cc = store_->counters(j.rec.id); cc.ok()) c = *cc;
  p.done = c.committed();
  p.failed = c.failed;
  p.prompt_tokens = c.prompt_tokens;
  p.completion_tokens = c.completion_tokens;
  p.cached_tokens = c.cached_tokens;
  p.in_flight = j.in_flight.size() + j.unsaved.size();
  p.paused = j.paused;
  p.pauses = j.pauses;
  p.pending = p.total > p.done + p.in_flight ? p.total - p.done - p.in_flight : 0;
  if (j.rec.state == JobState::cancelled) p.pending = 0;  // its uncommitted lines are dropped
  if (j.writer) p.written = j.writer->next_line();
  else if (j.rec.state == JobState::done) p.written = p.total;
  else if (auto op = store_->output_progress(j.rec.id); op.ok())
    // A cancelled job's finished file holds its committed lines, not all.
    p.written = j.rec.state == JobState::cancelled && op->next_line >= p.total ? p.done : op->next_line;

  if (j.session_started) {
    const double t1 = j.session_t1 >= 0 ? j.session_t1 : now();
    const double dt = t1 - j.session_t0;
    if (dt > 0) {
      p.tokens_per_s = static_cast<double>(c.completion_tokens - j.session_c0.completion_tokens) / dt;
      const double lines_per_s = static_cast<double>(c.committed() - j.session_c0.committed()) / dt;
      if (lines_per_s > 0) p.eta_s = static_cast<double>(p.total - p.done) / lines_per_s;
    }
  } else if (j.rec.state == JobState::done && j.rec.finished_unix_ms > j.rec.created_unix_ms) {
    p.tokens_per_s = static_cast<double>(c.completion_tokens) /
                     (static_cast<double>(j.rec.finished_unix_ms - j.rec.created_unix_ms) / 1000.0);
  }
  if (j.rec.state == JobState::done) p.eta_s = 0.0;
  else if (j.rec.state == JobState::failed || j.rec.state == JobState::cancelled) p.eta_s = -1.0;
  return p;
}

Result<JobProgress> JobManager::progress(std::uint64_t job_id) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return make_error(ErrorCode::not_found, "job " + std::to_string(job_id) + ": no such job");
  return progress_of(it->second);
}

std::vector<JobProgress> JobManager::list_jobs() const {
  std::vector<JobProgress> out;
  out.reserve(jobs_.size());
  for (const auto& [id, j] : jobs_) out.push_back(progress_of(j));
  return out;
}

Result<JobRecord> JobManager::job(std::uint64_t job_id) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return make_error(ErrorCode::not_found, "job " + std::to_string(job_id) + ": no such job");
  return it->second.rec;
}

bool JobManager::has_pending_work() const {
  for (const auto& [id, j] : jobs_)
    if (served(j) && j.paused.empty() && (!j.retry.empty() || unread_left(j))) return true;
  return false;
}

bool JobManager::idle() const {
  for (const auto& [id, j] : jobs_)
    if (active(j)) return false;
  return true;
}

}  // namespace shardline::orchestrator
