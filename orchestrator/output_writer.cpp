#include "orchestrator/output_writer.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

namespace shardline::orchestrator {
namespace {

constexpr std::size_t kFlushBytes = 4u << 20;

Error os_error(const std::string& what, const std::string& path, int err) {
  return make_error(ErrorCode::io, "output " + path + ": " + what + ": " + std::strerror(err));
}

/// fsync of the folder holding `path`, so that a new file's entry is durable.
void sync_parent(const std::string& path) {
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (parent.empty()) parent = ".";
  const int dfd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return;
  (void)::fsync(dfd);
  ::close(dfd);
}

}  // namespace

OutputWriter::OutputWriter(JobStore& store, std::uint64_t job_id, std::string path,
                           std::uint64_t total_lines, int fd)
    : store_(store), job_id_(job_id), path_(std::move(path)), total_lines_(total_lines), fd_(fd) {}

OutputWriter::~OutputWriter() {
  if (fd_ >= 0) ::close(fd_);
}

Result<std::unique_ptr<OutputWriter>> OutputWriter::open(JobStore& store, std::uint64_t job_id,
                                                         std::string path, std::uint64_t total_lines) {
  std::error_code ec;
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  bool existed = ::access(path.c_str(), F_OK) == 0;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return os_error("open", path, errno);
  if (!existed) sync_parent(path);
  std::unique_ptr<OutputWriter> w(new OutputWriter(store, job_id, std::move(path), total_lines, fd));
  if (Status st = w->recover(); !st.ok()) return st.error();
  return w;
}

Status OutputWriter::recover() {
  auto p = store_.output_progress(job_id_);
  if (!p.ok()) return p.error();
  progress_ = *p;
  struct stat sb {};
  if (::fstat(fd_, &sb) != 0) return os_error("stat", path_, errno);
  if (static_cast<std::uint64_t>(sb.st_size) < progress_.offset) {
    // The file lost acknowledged bytes (not by us): rebuild it from the store.
    progress_ = OutputProgress{};
    if (Status st = store_.set_output_progress(job_id_, progress_); !st.ok()) return st;
  }
  if (::ftruncate(fd_, static_cast<off_t>(progress_.offset)) != 0) return os_error("truncate", path_, errno);
  if (::fdatasync(fd_) != 0) return os_error("sync", path_, errno);
  dirty_ = false;
  return Status::ok_status();
}

Status OutputWriter::flush(const std::string& buf, std::uint64_t lines) {
  if (dirty_) {
    if (::ftruncate(fd_, static_cast<off_t>(progress_.offset)) != 0) return os_error("truncate", path_, errno);
    dirty_ = false;
  }
  std::size_t done = 0;
  while (done < buf.size()) {
    const ssize_t n = ::pwrite(fd_, buf.data() + done, buf.size() - done,
                               static_cast<off_t>(progress_.offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      dirty_ = true;
      return os_error("write", path_, errno);
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fdatasync(fd_) != 0) {
    dirty_ = true;
    return os_error("sync", path_, errno);
  }
  const OutputProgress next{progress_.offset + buf.size(), progress_.next_line + lines};
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
    if (Status st = flush(buf, lines); !st.ok()) return st.error();
    appended += lines;
  }
  return appended;
}

}  // namespace shardline::orchestrator
