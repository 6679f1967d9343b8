#include "orchestrator/output_writer.hpp"

#include <algorithm>
#include <filesystem>
#include <span>
#include <utility>

namespace shardline::orchestrator {
namespace {

constexpr std::size_t kFlushBytes = 4u << 20;

/// The file system's error (it names the file), prefixed with "output: ".
Error output_error(const Error& e) { return make_error(e.code, "output: " + e.message); }

}  // namespace

OutputWriter::OutputWriter(JobStore& store, std::uint64_t job_id, std::string path, std::uint64_t total_lines,
                           std::shared_ptr<FileSystem> fs, std::unique_ptr<WritableFile> file)
    : store_(store),
      job_id_(job_id),
      path_(std::move(path)),
      total_lines_(total_lines),
      fs_(std::move(fs)),
      file_(std::move(file)) {}

OutputWriter::~OutputWriter() = default;

Result<std::unique_ptr<OutputWriter>> OutputWriter::open(JobStore& store, std::uint64_t job_id, std::string path,
                                                         std::uint64_t total_lines, std::shared_ptr<FileSystem> fs) {
  if (!fs) fs = posix_file_system();
  if (!std::filesystem::path(path).parent_path().empty()) {
    if (Status st = create_directories_durably(*fs, parent_directory(path)); !st.ok())
      return make_error(st.error().code, "output " + path + ": " + st.error().message);
  }
  auto opened = fs->open_writable(path);
  if (!opened.ok()) return output_error(opened.error());
  // A new file's name is durable once its folder is synced (best effort).
  if (opened->created) (void)fs->sync_dir(parent_directory(path));
  std::unique_ptr<OutputWriter> w(
      new OutputWriter(store, job_id, std::move(path), total_lines, std::move(fs), std::move(opened->file)));
  if (Status st = w->recover(); !st.ok()) return st.error();
  return w;
}

Status OutputWriter::recover() {
  auto p = store_.output_progress(job_id_);
  if (!p.ok()) return p.error();
  progress_ = *p;
  auto size = file_->size();
  if (!size.ok()) return output_error(size.error());
  bool rebuild = *size < progress_.offset;  // the file lost acknowledged bytes (not by us)
  if (!rebuild && progress_.checksummed && progress_.offset > 0) {
    // Its written prefix must be what was written: an edited or damaged
    // line would otherwise survive the resume (issue 46, item 10).
    auto sum = prefix_checksum(progress_.offset);
    if (!sum.ok()) return sum.error();
    rebuild = *sum != progress_.prefix_checksum;
  }
  if (rebuild) {  // rewritten from the store, line 0 on
    progress_ = OutputProgress{};
    ++rebuilds_;
    if (Status st = store_.set_output_progress(job_id_, progress_); !st.ok()) return st;
  }
  if (Status st = file_->truncate(progress_.offset); !st.ok()) return output_error(st.error());
  if (Status st = file_->sync(); !st.ok()) return output_error(st.error());
  dirty_ = false;
  return Status::ok_status();
}

Result<std::uint64_t> OutputWriter::prefix_checksum(std::uint64_t bytes) {
  std::string buf(std::min<std::uint64_t>(bytes, 1 << 20), '\0');
  std::uint64_t sum = kFnv1a64Empty;
  for (std::uint64_t at = 0; at < bytes;) {
    const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), bytes - at));
    auto n = file_->read_at(at, std::span<char>(buf.data(), want));
    if (!n.ok()) return output_error(n.error());
    if (*n == 0) break;  // shorter than recorded: cannot match
    sum = fnv1a64(sum, std::string_view(buf.data(), *n));
    at += *n;
  }
  return sum;
}

Status OutputWriter::flush(const std::string& buf, std::uint64_t next_line) {
  if (dirty_) {
    if (Status st = file_->truncate(progress_.offset); !st.ok()) return output_error(st.error());
    dirty_ = false;
  }
  if (Status st = file_->write_at(progress_.offset, buf); !st.ok()) {
    dirty_ = true;
    return output_error(st.error());
  }
  if (Status st = file_->sync(); !st.ok()) {
    dirty_ = true;
    return output_error(st.error());
  }
  // A record of an older version has no checksum of its prefix: the bytes
  // written from here on cannot extend one, so it stays without.
  const OutputProgress next{progress_.offset + buf.size(), next_line, fnv1a64(progress_.prefix_checksum, buf),
                            progress_.checksummed};
  if (Status st = store_.set_output_progress(job_id_, next); !st.ok()) {
    dirty_ = true;  // the bytes are there but unacknowledged: rewrite them next time
    return st;
  }
  progress_ = next;
  return Status::ok_status();
}

Result<std::uint64_t> OutputWriter::advance() {
  std::uint64_t appended = 0;
  while (!complete()) {
    std::string buf;
    std::uint64_t lines = 0;
    std::uint64_t expect = progress_.next_line;
    Status scan = store_.scan_results(job_id_, expect, [&](std::uint64_t line, std::string_view text) {
      if (line != expect || line >= total_lines_) return false;
      buf.append(text);
      buf.push_back('\n');
      ++lines;
      ++expect;
      return buf.size() < kFlushBytes;
    });
    if (!scan.ok()) return scan.error();
    if (lines == 0) break;
    if (Status st = flush(buf, expect); !st.ok()) return st.error();
    appended += lines;
  }
  return appended;
}

Result<std::uint64_t> OutputWriter::finish_partial() {
  std::uint64_t appended = 0;
  while (!complete()) {
    std::string buf;
    std::uint64_t lines = 0;
    std::uint64_t next = total_lines_;  // nothing more committed: the file is finished
    Status scan = store_.scan_results(job_id_, progress_.next_line, [&](std::uint64_t line, std::string_view text) {
      if (line >= total_lines_) return false;
      buf.append(text);
      buf.push_back('\n');
      ++lines;
      next = line + 1;
      if (buf.size() < kFlushBytes) return true;
      return false;
    });
    if (!scan.ok()) return scan.error();
    // A chunk that stopped at kFlushBytes records its last line; the last
    // chunk (the scan ran out of committed lines) records total_lines.
    if (lines > 0 && buf.size() < kFlushBytes) next = total_lines_;
    if (Status st = flush(buf, next); !st.ok()) return st.error();
    appended += lines;
  }
  return appended;
}

}  // namespace shardline::orchestrator
