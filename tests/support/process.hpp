#pragma once
// Child processes for end-to-end and fault tests: run a command and capture
// its output, or spawn one in the background (stdout+stderr to a file) to
// kill it later.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace shardline::testing_support {

inline const std::string kShardline = std::string(SHARDLINE_BINARY_DIR) + "/cli/shardline";
/// `shardline` over the fake CUDA device and fake NCCL (built with the CUDA
/// backend only; tests/model/cuda/fake_cuda_process.cpp: its fake GPUs come
/// from SHARDLINE_FAKE_CUDA_DEVICES; it exits 86 after a device anomaly).
inline const std::string kShardlineFakeCuda = std::string(SHARDLINE_BINARY_DIR) + "/tests/shardline_fake_cuda";

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout + stderr
};

/// Runs `args` (a shell command line) to completion.
inline CommandResult run_command(const std::string& args) {
  CommandResult r;
  FILE* p = popen((args + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  std::size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

/// The little-endian float32 values of a whole file (an oracle's output).
inline std::vector<float> read_f32_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  std::vector<float> v(static_cast<std::size_t>(in.tellg()) / 4);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  return v;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// A TCP port on 127.0.0.1 that was free a moment ago: for a rendezvous
/// address a test hands to processes. It is drawn below the kernel's
/// ephemeral range (/proc/sys/net/ipv4/ip_local_port_range) and checked
/// with a bind. A port the kernel handed out for port 0 could be taken by
/// any outgoing connect() of the tests running beside this one before the
/// rendezvous binds it; a port below that range is only taken by an
/// explicit bind.
inline int free_loopback_port() {
  int ephemeral_low = 32768;
  if (std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range"); range) range >> ephemeral_low;
  const int low = 10000, high = std::max(low + 1000, ephemeral_low);  // [low, high)
  static std::atomic<unsigned> calls{0};
  std::minstd_rand rng(static_cast<unsigned>(::getpid()) * 7919u +
                       static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()) +
                       calls.fetch_add(1) * 104729u);
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int port = low + static_cast<int>(rng() % static_cast<unsigned>(high - low));
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    if (free) return port;
  }
  return 0;
}

/// A background child with stdout+stderr going to `log_path`.
class Child {
 public:
  Child(const std::vector<std::string>& argv, const std::string& log_path) : log_(log_path) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    if (posix_spawn(&pid_, args[0], &fa, nullptr, args.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
  }
  ~Child() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      wait();
    }
  }
  [[nodiscard]] bool started() const { return pid_ > 0; }
  /// The process id (-1 when the spawn failed).
  [[nodiscard]] pid_t pid() const { return pid_; }
  void kill(int sig) {
    if (pid_ > 0) ::kill(pid_, sig);
  }
  /// Waits for exit; returns the exit code (128 + signal when killed).
  int wait() {
    if (reaped_) return code_;
    int status = 0;
    waitpid(pid_, &status, 0);
    reaped_ = true;
    code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return code_;
  }
  /// Waits at most `timeout` for exit; then SIGKILLs the child and returns -1.
  int wait_or_kill(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!exited()) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        wait();
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return code_;
  }
  /// True when the child has exited (non-blocking).
  bool exited() {
    if (reaped_) return true;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      reaped_ = true;
      code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    return reaped_;
  }
  [[nodiscard]] std::string log() const { return read_file(log_); }
  /// Waits until the log contains `needle` (or timeout); returns the log.
  std::string wait_for_log(const std::string& needle, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      std::string l = log();
      if (l.find(needle) != std::string::npos || exited()) return l;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return log();
  }

 private:
  pid_t pid_ = -1;
  std::string log_;
  bool reaped_ = false;
  int code_ = -1;
};

}  // namespace shardline::testing_support

#include <gtest/gtest.h>

#include <filesystem>

namespace shardline::testing_support {

/// A fixture with a fresh temporary folder per test, removed afterwards.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() /
           ("shardline_" + std::string(info->test_suite_name()) + "_" + info->name() + "_" + std::to_string(getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  [[nodiscard]] std::string path(const std::string& name) const { return (dir_ / name).string(); }

  std::filesystem::path dir_;
};

}  // namespace shardline::testing_support
