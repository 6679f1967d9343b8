#include "orchestrator/job_store.hpp"

#include <chrono>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>
#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/file_system.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

namespace shardline::orchestrator {
namespace {

using json = nlohmann::json;

constexpr char kMetaNextJob[] = "Mnext_job_id";

void put_be64(std::string& s, std::uint64_t v) {
  for (int i = 7; i >= 0; --i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::uint64_t get_be64(std::string_view s, std::size_t at) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < 8; ++i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}

std::string job_key(char tag, std::uint64_t job) {
  std::string k(1, tag);
  put_be64(k, job);
  return k;
}

std::string line_key(char tag, std::uint64_t job, std::uint64_t line) {
  std::string k = job_key(tag, job);
  put_be64(k, line);
  return k;
}

std::string result_key(std::uint64_t job, std::uint64_t line) { return line_key('R', job, line); }

void put_le32(std::string& s, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::uint32_t get_le32(std::string_view s, std::size_t at) {
  std::uint32_t v = 0;
  for (std::size_t i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(static_cast<unsigned char>(s[at + i])) << (8 * i);
  return v;
}

/// WAL only: survives a process crash, not necessarily a power cut.
rocksdb::WriteOptions unsynced_write() {
  rocksdb::WriteOptions w;
  w.sync = false;
  return w;
}

/// A damaged file is `corrupt` (issue 46, item 11), a full disk disk_full
/// (items 7, 8), anything else io.
Error db_error(const std::string& what, const rocksdb::Status& st) {
  return kvstore::rocksdb_error("job store: " + what, st);
}

rocksdb::WriteOptions sync_write() {
  rocksdb::WriteOptions w;
  w.sync = true;
  return w;
}

std::string encode_counters(const JobCounters& c) {
  std::string s;
  put_be64(s, c.ok);
  put_be64(s, c.failed);
  put_be64(s, c.prompt_tokens);
  put_be64(s, c.completion_tokens);
  put_be64(s, c.cached_tokens);
  return s;
}

std::string encode_record(const JobRecord& r) {
  json j;
  j["id"] = r.id;
  j["model_dir"] = r.spec.model_dir;
  j["model_name"] = r.spec.model_name;
  j["input_paths"] = r.spec.input_paths;
  j["output_path"] = r.spec.output_path;
  j["request_id_prefix"] = r.spec.request_id_prefix;
  j["parallel"] = r.spec.parallel;
  j["token_budget"] = r.spec.token_budget;
  if (!r.spec.chat_template.empty()) j["chat_template"] = r.spec.chat_template;
  if (!r.spec.model_fingerprint.empty()) j["model_fingerprint"] = r.spec.model_fingerprint;
  j["state"] = job_state_name(r.state);
  j["created_unix_ms"] = r.created_unix_ms;
  j["finished_unix_ms"] = r.finished_unix_ms;
  j["total_lines"] = r.total_lines;
  j["input_sizes"] = r.input_sizes;
  j["error"] = r.error;
  if (!r.output_id_key.empty()) j["output_id_key"] = r.output_id_key;
  if (r.prefix_ordered) j["prefix_ordered"] = true;
  if (r.prefix_prompt_bytes != 0) {
    j["prefix_prompt_bytes"] = r.prefix_prompt_bytes;
    j["prefix_shared_bytes"] = r.prefix_shared_bytes;
  }
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<JobRecord> decode_record(std::string_view s) {
  try {
    const json j = json::parse(s);
    JobRecord r;
    r.id = j.at("id").get<std::uint64_t>();
    r.spec.model_dir = j.at("model_dir").get<std::string>();
    r.spec.model_name = j.at("model_name").get<std::string>();
    r.spec.input_paths = j.at("input_paths").get<std::vector<std::string>>();
    r.spec.output_path = j.at("output_path").get<std::string>();
    r.spec.request_id_prefix = j.at("request_id_prefix").get<std::string>();
    // Added later: records written before have neither (the defaults apply).
    r.spec.parallel = j.value("parallel", std::string());
    r.spec.token_budget = j.value("token_budget", std::string("fixed"));
    r.spec.chat_template = j.value("chat_template", std::string());
    r.spec.model_fingerprint = j.value("model_fingerprint", std::string());
    r.output_id_key = j.value("output_id_key", std::string());
    r.prefix_ordered = j.value("prefix_ordered", false);
    r.prefix_prompt_bytes = j.value("prefix_prompt_bytes", std::uint64_t{0});
    r.prefix_shared_bytes = j.value("prefix_shared_bytes", std::uint64_t{0});
    const auto state = j.at("state").get<std::string>();
    if (state == "queued") r.state = JobState::queued;
    else if (state == "running") r.state = JobState::running;
    else if (state == "done") r.state = JobState::done;
    else if (state == "failed") r.state = JobState::failed;
    else if (state == "cancelled") r.state = JobState::cancelled;
    else return make_error(ErrorCode::corrupt, "job store: job record: unknown state '" + state + "'");
    r.created_unix_ms = j.at("created_unix_ms").get<std::int64_t>();
    r.finished_unix_ms = j.at("finished_unix_ms").get<std::int64_t>();
    r.total_lines = j.at("total_lines").get<std::uint64_t>();
    r.input_sizes = j.at("input_sizes").get<std::vector<std::uint64_t>>();
    r.error = j.at("error").get<std::string>();
    return r;
  } catch (const std::exception& e) {
    return make_error(ErrorCode::corrupt, std::string("job store: job record: ") + e.what());
  }
}

}  // namespace

const char* job_state_name(JobState s) noexcept {
  switch (s) {
    case JobState::queued: return "queued";
    case JobState::running: return "running";
    case JobState::done: return "done";
    case JobState::failed: return "failed";
    case JobState::cancelled: return "cancelled";
  }
  return "unknown";
}

JobStore::JobStore(std::string dir, std::unique_ptr<rocksdb::Env> env, kvstore::ReopenableDb db,
                   std::uint64_t next_job_id)
    : dir_(std::move(dir)), env_(std::move(env)), db_(std::move(db)), next_job_id_(next_job_id) {}

Status JobStore::ready_locked() {
  const std::uint64_t reopens = db_.reopens();
  if (Status st = db_.writable(); !st.ok()) return st;
  // Reopened: a record whose sync failed may be in the WAL after all.
  if (db_.reopens() != reopens) counter_cache_.clear();
  return Status::ok_status();
}

JobStore::~JobStore() = default;

Result<std::unique_ptr<JobStore>> JobStore::open(const std::string& dir, JobStoreOptions store_options) {
  rocksdb::Options options;
  options.create_if_missing = true;
  options.max_open_files = 256;
  std::unique_ptr<rocksdb::Env> env;
  if (store_options.file_system) {
    env = rocksdb::NewCompositeEnv(store_options.file_system);
    options.env = env.get();
  }
  // Free space is probed at every call while stopped: the job manager's
  // retries have their own back-off.
  auto db = kvstore::ReopenableDb::open("job store", dir, std::move(options), std::chrono::milliseconds(0));
  if (!db.ok()) return std::move(db).error();
  std::string v;
  std::uint64_t next = 1;
  const rocksdb::Status g = (*db)->Get(rocksdb::ReadOptions(), kMetaNextJob, &v);
  if (g.ok()) {
    if (v.size() != 8) return make_error(ErrorCode::corrupt, "job store: next_job_id: bad size");
    next = get_be64(v, 0);
  } else if (!g.IsNotFound()) {
    return db_error("read next_job_id", g);
  }
  return std::unique_ptr<JobStore>(new JobStore(dir, std::move(env), std::move(db).value(), next));
}

Result<std::uint64_t> JobStore::create_job(JobRecord record) {
  std::lock_guard lock(mu_);
  if (Status ready = ready_locked(); !ready.ok()) return ready.error();
  record.id = next_job_id_;
  rocksdb::WriteBatch batch;
  std::string next;
  put_be64(next, record.id + 1);
  batch.Put(kMetaNextJob, next);
  batch.Put(job_key('J', record.id), encode_record(record));
  batch.Put(job_key('C', record.id), encode_counters(JobCounters{}));
  const rocksdb::Status st = db_->Write(sync_write(), &batch);
  if (!st.ok()) return db_.write_failed("create job", st);
  ++next_job_id_;
  counter_cache_[record.id] = JobCounters{};
  return record.id;
}

Status JobStore::update_job(const JobRecord& record) {
  std::lock_guard lock(mu_);
  if (Status ready = ready_locked(); !ready.ok()) return ready.error();
  std::string v;
  const rocksdb::Status g = db_->Get(rocksdb::ReadOptions(), job_key('J', record.id), &v);
  if (g.IsNotFound())
    return make_error(ErrorCode::not_found, "job store: no job " + std::to_string(record.id));
  if (!g.ok()) return db_error("read job", g);
  const rocksdb::Status st = db_->Put(sync_write(), job_key('J', record.id), encode_record(record));
  if (!st.ok()) return db_.write_failed("update job", st);
  return Status::ok_status();
}

Result<JobRecord> JobStore::get_job(std::uint64_t job_id) {
  std::lock_guard lock(mu_);
  if (Status ready = db_.readable(); !ready.ok()) return ready.error();
  std::string v;
  const rocksdb::Status g = db_->Get(rocksdb::ReadOptions(), job_key('J', job_id), &v);
  if (g.IsNotFound()) return make_error(ErrorCode::not_found, "job store: no job " + std::to_string(job_id));
  if (!g.ok()) return db_error("read job", g);
  return decode_record(v);
}

Result<std::vector<JobRecord>> JobStore::list_jobs() {
  std::lock_guard lock(mu_);
  if (Status ready = db_.readable(); !ready.ok()) return ready.error();
  std::vector<JobRecord> out;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek("J"); it->Valid() && it->key().starts_with("J"); it->Next()) {
    auto rec = decode_record(it->value().ToStringView());
    if (!rec.ok()) return rec.error();
    out.push_back(std::move(rec.value()));
  }
  if (!it->status().ok()) return db_error("list jobs", it->status());
  return out;
}

Result<JobCounters> JobStore::counters_locked(std::uint64_t job_id) {
  if (auto it = counter_cache_.find(job_id); it != counter_cache_.end()) return it->second;
  std::string v;
  const rocksdb::Status g = db_->Get(rocksdb::ReadOptions(), job_key('C', job_id), &v);
  if (g.IsNotFound()) return make_error(ErrorCode::not_found, "job store: no job " + std::to_string(job_id));
  if (!g.ok()) return db_error("read counters", g);
  if (v.size() != 32 && v.size() != 40) return make_error(ErrorCode::corrupt, "job store: counters: bad size");
  JobCounters c{get_be64(v, 0), get_be64(v, 8), get_be64(v, 16), get_be64(v, 24),
                v.size() == 40 ? get_be64(v, 32) : 0};  // 32 bytes: before cached_tokens
  counter_cache_[job_id] = c;
  return c;
}

Result<JobCounters> JobStore::counters(std::uint64_t job_id) {
  std::lock_guard lock(mu_);
  if (auto it = counter_cache_.find(job_id); it != counter_cache_.end()) return it->second;
  if (Status ready = db_.readable(); !ready.ok()) return ready.error();
  return counters_locked(job_id);
}

Result<std::uint64_t> JobStore::count_results(std::uint64_t job_id) {
  auto c = counters(job_id);
  if (!c.ok()) return c.error();
  return c->committed();
}

Result<bool> JobStore::put_result(std::uint64_t job_id, const StoredResult& result) {
  auto n = put_results(job_id, {result});
  if (!n.ok()) return n.error();
  return *n == 1;
}

Result<std::size_t> JobStore::put_results(std::uint64_t job_id, const std::vector<StoredResult>& results,
                                          const std::vector<std::uint64_t>& drop_resume) {
  std::lock_guard lock(mu_);
  if (Status ready = ready_locked(); !ready.ok()) return ready.error();
  auto cur = counters_locked(job_id);
  if (!cur.ok()) return cur.error();
  JobCounters c = *cur;
  rocksdb::WriteBatch batch;
  std::set<std::uint64_t> seen;
  std::size_t added = 0;
  std::string existing;
  for (const auto& r : results) {
    if (!seen.insert(r.line_index).second) continue;
    const std::string key = result_key(job_id, r.line_index);
    const rocksdb::Status g = db_->Get(rocksdb::ReadOptions(), key, &existing);
    if (g.ok()) continue;  // already committed: exactly once
    if (!g.IsNotFound()) return db_error("read result", g);
    batch.Put(key, r.line);
    if (r.ok) ++c.ok;
    else ++c.failed;
    c.prompt_tokens += r.prompt_tokens;
    c.completion_tokens += r.completion_tokens;
    c.cached_tokens += r.cached_tokens;
    ++added;
  }
  for (const std::uint64_t line : drop_resume) batch.Delete(line_key('K', job_id, line));
  if (added == 0 && drop_resume.empty()) return std::size_t{0};
  if (added > 0) batch.Put(job_key('C', job_id), encode_counters(c));
  const rocksdb::Status st = db_->Write(sync_write(), &batch);
  if (!st.ok()) return db_.write_failed("commit results", st);
  if (added > 0) counter_cache_[job_id] = c;
  return added;
}

Result<std::optional<std::string>> JobStore::get_result(std::uint64_t job_id, std::uint64_t line_index) {
  std::lock_guard lock(mu_);
  if (Status ready = db_.readable(); !ready.ok()) return ready.error();
  std::string v;
  const rocksdb::Status g = db_->Get(rocksdb::ReadOptions(), result_key(job_id, line_index), &v);
  if (g.IsNotFound()) return std::optional<std::string>();
  if (!g.ok()) return db_error("read result", g);
  return std::optional<std::string>(std::move(v));
}

Result<bool> JobStore::has_result(std::uint64_t job_id, std::uint64_t line_index) {
  auto r = get_result(job_id, line_index);
  if (!r.ok()) return r.error();
  return r->has_value();
}

Status JobStore::scan_results(std::uint64_t job_id, std::uint64_t from_line,
                              const std::function<bool(std::uint64_t, std::string_view)>& fn) {
  std::lock_guard lock(mu_);
  if (Status ready = db_.readable(); !ready.ok()) return ready.error();
  const std::string prefix = job_key('R', job_id);
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(result_key(job_id, from_line)); it->Valid(); it->Next()) {
    const auto key = it->key().ToStringView();
    if (key.size() != 17 || !key.starts_with(prefix)) break;
    if (!fn(get_be64(key, 9), it->value().ToStringView())) break;
  }
  if (!it->status().ok()) return db_error("scan results", it->status());
  return Status::ok_status();
}

Result<OutputProgress> JobStore::output_progress(std::uint64_t job_id) {
  std::lock_guard lock(mu_);
  if (Status ready = db_.readable(); !ready.ok()) return ready.error();
  std::string v;
  const rocksdb::Status g = db_->Get(rocksdb::ReadOptions(), job_key('O', job_id), &v);
  if (g.IsNotFound()) return OutputProgress{};
  if (!g.ok()) return db_error("read output progress", g);
  // 16 bytes: written by a version without the checksum.
  if (v.size() == 16) return OutputProgress{get_be64(v, 0), get_be64(v, 8), kFnv1a64Empty, false};
  if (v.size() != 24) return make_error(ErrorCode::corrupt, "job store: output progress: bad size");
  return OutputProgress{get_be64(v, 0), get_be64(v, 8), get_be64(v, 16), true};
}

Status JobStore::set_output_progress(std::uint64_t job_id, const OutputProgress& p) {
  std::lock_guard lock(mu_);
  if (Status ready = ready_locked(); !ready.ok()) return ready.error();
  std::string v;
  put_be64(v, p.offset);
  put_be64(v, p.next_line);
  if (p.checksummed) put_be64(v, p.prefix_checksum);
  const rocksdb::Status st = db_->Put(sync_write(), job_key('O', job_id), v);
  if (!st.ok()) return db_.write_failed("write output progress", st);
  return Status::ok_status();
}

// ---- resume records ('K') and recovery counters ('F') ----------------------------

std::string encode_resume(const std::vector<worker::ChoiceResume>& choices) {
  std::string s;
  put_le32(s, static_cast<std::uint32_t>(choices.size()));
  for (const auto& c : choices) {
    put_le32(s, static_cast<std::uint32_t>(c.num_kv_tokens));
    put_le32(s, static_cast<std::uint32_t>(c.output_ids.size()));
    for (const std::int32_t id : c.output_ids) put_le32(s, static_cast<std::uint32_t>(id));
  }
  return s;
}

Result<std::vector<worker::ChoiceResume>> decode_resume(std::string_view v) {
  const auto bad = [](const std::string& why) {
    return make_error(ErrorCode::corrupt, "job store: resume record: " + why);
  };
  if (v.size() < 4) return bad("truncated");
  const std::uint32_t n = get_le32(v, 0);
  if (n > 128) return bad(std::to_string(n) + " choices (at most 128)");
  std::vector<worker::ChoiceResume> out(n);
  std::size_t at = 4;
  for (auto& c : out) {
    if (v.size() - at < 8) return bad("truncated");
    c.num_kv_tokens = static_cast<std::int32_t>(get_le32(v, at));
    const std::uint32_t ids = get_le32(v, at + 4);
    at += 8;
    if (c.num_kv_tokens < 0) return bad("negative num_kv_tokens");
    if ((v.size() - at) / 4 < ids) return bad("truncated");
    c.output_ids.resize(ids);
    for (auto& id : c.output_ids) {
      id = static_cast<std::int32_t>(get_le32(v, at));
      at += 4;
    }
  }
  if (at != v.size()) return bad(std::to_string(v.size() - at) + " trailing bytes");
  return out;
}

Status JobStore::put_resume(const std::vector<ResumeRecord>& records) {
  if (records.empty()) return Status::ok_status();
  std::lock_guard lock(mu_);
  if (Status ready = ready_locked(); !ready.ok()) return ready.error();
  rocksdb::WriteBatch batch;
  for (const auto& r : records) batch.Put(line_key('K', r.job_id, r.line_index), encode_resume(r.choices));
  const rocksdb::Status st = db_->Write(unsynced_write(), &batch);
  if (!st.ok()) return db_.write_failed("write resume records", st);
  return Status::ok_status();
}

Result<std::vector<ResumeRecord>> JobStore::load_resume(std::uint64_t job_id) {
  std::lock_guard lock(mu_);
  if (Status ready = db_.readable(); !ready.ok()) return ready.error();
  std::vector<ResumeRecord> out;
  const std::string prefix = job_key('K', job_id);
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(prefix); it->Valid(); it->Next()) {
    const auto key = it->key().ToStringView();
    if (!key.starts_with(prefix)) break;
    if (key.size() != 17) return make_error(ErrorCode::corrupt, "job store: resume record: bad key size");
    auto choices = decode_resume(it->value().ToStringView());
    if (!choices.ok()) return choices.error();
    out.push_back(ResumeRecord{job_id, get_be64(key, 9), std::move(choices.value())});
  }
  if (!it->status().ok()) return db_error("load resume records", it->status());
  return out;
}

Status JobStore::delete_resume(std::uint64_t job_id) { return delete_job_records('K', job_id, "resume records"); }

Status JobStore::delete_job_records(char tag, std::uint64_t job_id, const char* what) {
  std::lock_guard lock(mu_);
  if (Status ready = ready_locked(); !ready.ok()) return ready.error();
  const std::string prefix = job_key(tag, job_id);
  rocksdb::WriteBatch batch;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) batch.Delete(it->key());
  if (!it->status().ok()) return db_error(std::string("scan ") + what, it->status());
  if (batch.Count() == 0) return Status::ok_status();
  const rocksdb::Status st = db_->Write(sync_write(), &batch);
  if (!st.ok()) return db_.write_failed(std::string("delete ") + what, st);
  return Status::ok_status();
}

Status JobStore::put_line_order(std::uint64_t job_id, const std::vector<LineOrderEntry>& order) {
  std::lock_guard lock(mu_);
  if (Status ready = ready_locked(); !ready.ok()) return ready.error();
  rocksdb::WriteBatch batch;
  for (std::size_t first = 0, chunk = 0; first < order.size(); first += kOrderChunk, ++chunk) {
    std::string value;
    for (std::size_t i = first; i < std::min(order.size(), first + kOrderChunk); ++i) {
      put_be64(value, order[i].line_index);
      put_be64(value, order[i].shard);
      put_be64(value, order[i].byte_offset);
      put_be64(value, order[i].file_line);
    }
    batch.Put(line_key('L', job_id, chunk), value);
  }
  const rocksdb::Status st = db_->Write(sync_write(), &batch);
  if (!st.ok()) return db_.write_failed("store line order", st);
  return Status::ok_status();
}

Result<std::vector<LineOrderEntry>> JobStore::load_line_order(std::uint64_t job_id) {
  std::lock_guard lock(mu_);
  if (Status ready = db_.readable(); !ready.ok()) return ready.error();
  std::vector<LineOrderEntry> out;
  const std::string prefix = job_key('L', job_id);
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  std::uint64_t chunk = 0;
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next(), ++chunk) {
    const auto key = it->key().ToStringView();
    const auto value = it->value().ToStringView();
    if (key.size() != 17 || get_be64(key, 9) != chunk || value.empty() || value.size() % 32 != 0)
      return make_error(ErrorCode::corrupt, "job store: line order of job " + std::to_string(job_id) +
                                                ": chunk " + std::to_string(chunk) + " is missing or damaged");
    for (std::size_t at = 0; at < value.size(); at += 32)
      out.push_back({get_be64(value, at), get_be64(value, at + 8), get_be64(value, at + 16), get_be64(value, at + 24)});
  }
  if (!it->status().ok()) return db_error("load line order", it->status());
  return out;
}

Status JobStore::delete_line_order(std::uint64_t job_id) { return delete_job_records('L', job_id, "line order"); }

Result<std::size_t> JobStore::count_resume_records(std::uint64_t job_id) {
  std::lock_guard lock(mu_);
  if (Status ready = db_.readable(); !ready.ok()) return ready.error();
  const std::string prefix = job_key('K', job_id);
  std::size_t n = 0;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) ++n;
  if (!it->status().ok()) return db_error("count resume records", it->status());
  return n;
}

Result<RecoveryCounters> JobStore::recovery_counters(std::uint64_t job_id) {
  std::lock_guard lock(mu_);
  if (Status ready = db_.readable(); !ready.ok()) return ready.error();
  std::string v;
  const rocksdb::Status g = db_->Get(rocksdb::ReadOptions(), job_key('F', job_id), &v);
  if (g.IsNotFound()) return RecoveryCounters{};
  if (!g.ok()) return db_error("read recovery counters", g);
  if (v.size() != 16) return make_error(ErrorCode::corrupt, "job store: recovery counters: bad size");
  return RecoveryCounters{get_be64(v, 0), get_be64(v, 8)};
}

Status JobStore::set_recovery_counters(std::uint64_t job_id, const RecoveryCounters& c) {
  std::lock_guard lock(mu_);
  if (Status ready = ready_locked(); !ready.ok()) return ready.error();
  std::string v;
  put_be64(v, c.requeued);
  put_be64(v, c.resumed);
  const rocksdb::Status st = db_->Put(unsynced_write(), job_key('F', job_id), v);
  if (!st.ok()) return db_.write_failed("write recovery counters", st);
  return Status::ok_status();
}

}  // namespace shardline::orchestrator
