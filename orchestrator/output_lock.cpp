#include "orchestrator/output_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace shardline::orchestrator {
namespace {

std::string errno_text(int e) { return std::strerror(e); }

/// What the holder wrote into its lock file (at most 1 KiB).
std::string read_holder(int fd) {
  std::string text(1024, '\0');
  const ssize_t n = ::pread(fd, text.data(), text.size(), 0);
  text.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
  return text.empty() ? "another process" : text;
}

/// Replaces the lock file's text with `holder` and a newline.
bool write_holder(int fd, const std::string& holder) {
  const std::string text = holder + "\n";
  return ::ftruncate(fd, 0) == 0 && ::pwrite(fd, text.data(), text.size(), 0) == static_cast<ssize_t>(text.size());
}

}  // namespace

std::string OutputLock::this_process() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "?");
  return "pid " + std::to_string(::getpid()) + " on host " + host;
}

Result<std::unique_ptr<OutputLock>> OutputLock::acquire(const std::string& output_path, const std::string& holder) {
  const std::string path = lock_path(output_path);
  for (int attempt = 0; attempt < 16; ++attempt) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return make_error(ErrorCode::io, "output " + output_path + ": cannot create its lock file " + path +
                                                     ": " + errno_text(errno));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int e = errno;
      if (e == EWOULDBLOCK) {
        const std::string who = read_holder(fd);
        ::close(fd);
        return make_error(ErrorCode::invalid_argument,
                          "output " + output_path + " is being written by " + who + " (lock file " + path +
                              "): wait for that job, cancel it, or choose another --output");
      }
      ::close(fd);
      return make_error(ErrorCode::io, "output " + output_path + ": cannot lock " + path + ": " + errno_text(e));
    }
    // A holder that released between our open and flock deleted the file we
    // locked: lock the one now at the path instead.
    struct stat held {}, named {};
    if (::fstat(fd, &held) != 0 || ::stat(path.c_str(), &named) != 0 || held.st_dev != named.st_dev ||
        held.st_ino != named.st_ino) {
      ::close(fd);
      continue;
    }
    if (!write_holder(fd, holder)) {
      const int e = errno;
      ::unlink(path.c_str());
      ::close(fd);
      return make_error(ErrorCode::io, "output " + output_path + ": cannot write its lock file " + path + ": " +
                                           errno_text(e));
    }
    return std::unique_ptr<OutputLock>(new OutputLock(fd, path));
  }
  return make_error(ErrorCode::io, "output " + output_path + ": its lock file " + path +
                                       " kept being replaced while taking it");
}

void OutputLock::describe(const std::string& holder) { (void)write_holder(fd_, holder); }

OutputLock::~OutputLock() {
  ::unlink(path_.c_str());  // before the unlock: a waiter then finds it replaced and retries
  ::close(fd_);
}

}  // namespace shardline::orchestrator
