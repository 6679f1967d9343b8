#include "kvstore/rocksdb_support.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <mutex>
#include <string>

#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/file_system.h>
#include <rocksdb/options.h>
#include <rocksdb/status.h>

namespace shardline::kvstore {
namespace {

/// RocksDB's LOG through plain write(2): one append per message, its
/// result ignored (a full disk loses log lines, nothing else). The file is
/// opened at the first message, once RocksDB has created the folder.
class InfoLog final : public rocksdb::Logger {
 public:
  explicit InfoLog(std::string dir) : rocksdb::Logger(rocksdb::InfoLogLevel::INFO_LEVEL), dir_(std::move(dir)) {}
  ~InfoLog() override {
    if (fd_ >= 0) ::close(fd_);
  }
  InfoLog(const InfoLog&) = delete;
  InfoLog& operator=(const InfoLog&) = delete;

  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override {
    char line[4096];  // [prefix + message + '\n'], cut to fit
    const auto now = std::chrono::system_clock::now();
    const std::time_t secs = std::chrono::system_clock::to_time_t(now);
    const auto micros =
        std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() % 1000000;
    std::tm tm{};
    ::gmtime_r(&secs, &tm);
    const int n = std::snprintf(line, sizeof(line), "%04d/%02d/%02d-%02d:%02d:%02d.%06lld ", tm.tm_year + 1900,
                                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                                static_cast<long long>(micros));
    if (n < 0) return;
    va_list copy;
    va_copy(copy, ap);
    const int m = std::vsnprintf(line + n, sizeof(line) - static_cast<std::size_t>(n) - 1, format, copy);
    va_end(copy);
    if (m < 0) return;
    std::size_t size = std::min(sizeof(line) - 2, static_cast<std::size_t>(n) + static_cast<std::size_t>(m));
    line[size++] = '\n';
    std::lock_guard lock(mu_);  // the descriptor stays ours while we write
    const int fd = file_locked();
    if (fd < 0) return;
    const ssize_t wrote = ::write(fd, line, size);  // dropped on failure: the log is best effort
    if (wrote > 0) bytes_ += static_cast<std::uint64_t>(wrote);
  }

 private:
  /// The LOG's descriptor, opening it (after moving an earlier one to
  /// LOG.old) on the first call that finds the folder; -1 until then, and
  /// for good after kMaxOpenTries failed tries (no space for the file).
  /// A LOG past kMaxLogBytes becomes LOG.old and a new one starts.
  int file_locked() {
    const std::string log = dir_ + "/LOG";
    std::error_code ec;
    if (fd_ >= 0 && bytes_ > kMaxLogBytes) {
      ::close(fd_);
      fd_ = -1;
      tries_ = 0;
    }
    if (fd_ >= 0 || tries_ >= kMaxOpenTries) return fd_;
    if (!std::filesystem::is_directory(dir_, ec)) return -1;
    if (tries_++ == 0) std::filesystem::rename(log, dir_ + "/LOG.old", ec);  // none yet: nothing to keep
    fd_ = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    bytes_ = 0;
    return fd_;
  }

  static constexpr int kMaxOpenTries = 8;
  static constexpr std::uint64_t kMaxLogBytes = 4ull << 20;
  const std::string dir_;
  std::mutex mu_;
  int fd_ = -1;
  int tries_ = 0;
  std::uint64_t bytes_ = 0;  ///< written to the current LOG
};

}  // namespace

Error rocksdb_error(const std::string& what, const rocksdb::Status& st) {
  ErrorCode code = ErrorCode::io;
  if (st.IsNoSpace()) code = ErrorCode::disk_full;
  else if (st.IsCorruption()) code = ErrorCode::corrupt;
  return make_error(code, what + ": " + st.ToString());
}

bool stops_writes(const rocksdb::Status& st) { return st.IsIOError(); }

Status probe_free_space(rocksdb::Env& env, const std::string& dir, std::size_t bytes) {
  rocksdb::FileSystem& fs = *env.GetFileSystem();
  const std::string path = dir + "/DISK_SPACE_PROBE";
  const rocksdb::IOOptions io;
  std::unique_ptr<rocksdb::FSWritableFile> file;
  rocksdb::IOStatus st = fs.NewWritableFile(path, rocksdb::FileOptions(), &file, nullptr);
  if (st.ok()) {
    const std::string zeros(64 << 10, '\0');
    for (std::size_t done = 0; st.ok() && done < bytes; done += zeros.size())
      st = file->Append(rocksdb::Slice(zeros.data(), std::min(zeros.size(), bytes - done)), io, nullptr);
    if (st.ok()) st = file->Sync(io, nullptr);
    const rocksdb::IOStatus closed = file->Close(io, nullptr);
    if (st.ok()) st = closed;
  }
  file.reset();
  (void)fs.DeleteFile(path, io, nullptr);  // absent when the create failed
  if (!st.ok()) return rocksdb_error("probe for free space in " + dir, st);
  return {};
}

std::shared_ptr<rocksdb::Logger> open_info_log(const std::string& dir) { return std::make_shared<InfoLog>(dir); }

ReopenableDb::ReopenableDb() = default;
ReopenableDb::~ReopenableDb() = default;
ReopenableDb::ReopenableDb(ReopenableDb&&) noexcept = default;
ReopenableDb& ReopenableDb::operator=(ReopenableDb&&) noexcept = default;

Result<ReopenableDb> ReopenableDb::open(std::string name, std::string dir, rocksdb::Options options,
                                        std::chrono::milliseconds probe_interval) {
  ReopenableDb d;
  d.name_ = std::move(name);
  d.dir_ = std::move(dir);
  d.options_ = std::make_unique<rocksdb::Options>(std::move(options));
  d.options_->info_log = open_info_log(d.dir_);  // RocksDB's own aborts on a full disk
  d.probe_interval_ = probe_interval;
  rocksdb::DB* raw = nullptr;
  const rocksdb::Status st = rocksdb::DB::Open(*d.options_, d.dir_, &raw);
  if (!st.ok()) return d.error("open " + d.dir_, st);
  d.db_.reset(raw);
  return d;
}

Status ReopenableDb::writable() {
  if (db_ && !reopen_) return {};
  const auto now = std::chrono::steady_clock::now();
  if (db_ && now < next_probe_) return stopped_;
  next_probe_ = now + probe_interval_;
  if (Status room = probe_free_space(*options_->env, dir_, kReopenProbeBytes); !room.ok()) {
    stopped_ = room.error();
    return room;
  }
  db_.reset();
  rocksdb::DB* raw = nullptr;
  const rocksdb::Status st = rocksdb::DB::Open(*options_, dir_, &raw);
  if (!st.ok()) return error("reopen " + dir_ + " after a failed write", st);  // closed: the next call tries again
  db_.reset(raw);
  reopen_ = false;
  ++reopens_;
  return {};
}

Status ReopenableDb::readable() { return db_ ? Status{} : writable(); }

Error ReopenableDb::write_failed(const std::string& what, const rocksdb::Status& st) {
  Error e = error(what, st);
  if (stops_writes(st)) {
    reopen_ = true;
    stopped_ = e;
  }
  return e;
}

Error ReopenableDb::error(const std::string& what, const rocksdb::Status& st) const {
  return rocksdb_error(name_ + ": " + what, st);
}

}  // namespace shardline::kvstore
