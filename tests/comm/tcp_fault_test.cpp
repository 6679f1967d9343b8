// TCP communicator with a real second process: a forked child joins the
// group and is then killed (SIGKILL), exits, or hangs (SIGSTOP) while the
// parent's ranks are inside a collective. The survivors' collective must fail
// with io within the timeout (usually at once, from the closed connection),
// and never hang.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "comm/tcp.hpp"
#include "tests/comm/comm_test_util.hpp"

namespace shardline::comm {
namespace comm_tcp_fault_test {

using namespace testing;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

enum class ChildEnd { keep_going, exit_after, pause_after };

/// The child: joins as rank `rank`, runs `iters` all_reduce_sum calls, then
/// either exits without a goodbye, blocks forever (to be killed or stopped),
/// or keeps running collectives until they fail. Never returns.
[[noreturn]] void child_main(int rank, int world, int port, int iters, ChildEnd end) {
  TcpOptions o;
  o.rank = rank;
  o.world_size = world;
  o.master_port = port;
  o.timeout = milliseconds(20000);
  auto comm = TcpGroup::create(o);
  if (!comm.ok()) _exit(3);
  std::vector<float> data(4096);
  for (int it = 0; end == ChildEnd::keep_going || it < iters; ++it) {
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = value(rank, i, it);
    if (!(*comm)->all_reduce_sum(data.data(), data.size()).ok()) _exit(4);
  }
  if (end == ChildEnd::exit_after) _exit(0);  // sockets closed by the kernel
  for (;;) ::pause();
}

struct Child {
  pid_t pid = -1;
  ~Child() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
  int reap() {
    int status = 0;
    ::waitpid(pid, &status, 0);
    pid = -1;
    return status;
  }
};

/// Rank 0 (and rank 1 when world == 3) in this process, the last rank in a
/// forked child. Returns the parent's communicators.
std::vector<std::unique_ptr<TcpCommunicator>> start(int world, int child_iters, ChildEnd end,
                                                    Child& child,
                                                    milliseconds timeout = milliseconds(10000)) {
  TcpOptions o0;
  o0.world_size = world;
  o0.timeout = milliseconds(20000);
  auto g0 = TcpGroup::listen(o0);
  EXPECT_TRUE(g0.ok()) << g0.error().to_string();
  if (!g0.ok()) return {};
  const int port = g0->port();
  // Fork before this process starts any thread of its own.
  child.pid = ::fork();
  if (child.pid == 0) child_main(world - 1, world, port, child_iters, end);
  EXPECT_GT(child.pid, 0);
  std::vector<std::unique_ptr<TcpCommunicator>> comms(static_cast<std::size_t>(world - 1));
  std::vector<std::thread> threads;
  for (int r = 0; r < world - 1; ++r) {
    threads.emplace_back([&, r] {
      Result<std::unique_ptr<TcpCommunicator>> c = make_error(ErrorCode::internal, "unset");
      if (r == 0) {
        c = g0->connect();
      } else {
        TcpOptions o = o0;
        o.rank = r;
        o.master_port = port;
        c = TcpGroup::create(o);
      }
      EXPECT_TRUE(c.ok()) << c.error().to_string();
      if (c.ok()) {
        (*c)->set_timeout(timeout);
        comms[static_cast<std::size_t>(r)] = std::move(c).value();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& c : comms)
    if (!c) return {};
  return comms;
}

/// Runs all_reduce_sum on every parent rank until it fails; checks the
/// failure is io, names the child's rank, and came within `bound` of the
/// start of the failing call.
void collectives_until_failure(std::vector<std::unique_ptr<TcpCommunicator>>& comms, int world,
                               milliseconds bound, const std::string& expect,
                               std::vector<milliseconds>* failing_call_ms = nullptr) {
  std::vector<std::thread> threads;
  std::vector<milliseconds> took(comms.size());
  for (std::size_t r = 0; r < comms.size(); ++r) {
    threads.emplace_back([&, r] {
      TcpCommunicator& c = *comms[r];
      std::vector<float> data(4096);
      for (int it = 0;; ++it) {
        for (std::size_t i = 0; i < data.size(); ++i) data[i] = value(static_cast<int>(r), i, it);
        const auto t0 = Clock::now();
        const Status st = c.all_reduce_sum(data.data(), data.size());
        if (st.ok()) {
          ASSERT_LT(it, 1000000) << "the collective never failed";
          continue;
        }
        took[r] = std::chrono::duration_cast<milliseconds>(Clock::now() - t0);
        EXPECT_EQ(st.error().code, ErrorCode::io) << st.error().to_string();
        const std::string& m = st.error().message;
        EXPECT_NE(m.find("all_reduce_sum: rank " + std::to_string(r)), std::string::npos) << m;
        EXPECT_NE(m.find(expect), std::string::npos) << m;
        EXPECT_LT(took[r], bound) << m;
        // Poisoned from now on: fails at once.
        const auto t1 = Clock::now();
        EXPECT_EQ(c.barrier().error().code, ErrorCode::io);
        EXPECT_LT(Clock::now() - t1, milliseconds(200));
        return;
      }
    });
  }
  for (auto& t : threads) t.join();
  if (failing_call_ms) *failing_call_ms = took;
  (void)world;
}

TEST(TcpFault, ChildKilledMidCollectiveFailsSurvivorWithIoWithinTimeout) {
  constexpr milliseconds kTimeout(5000);
  Child child;
  auto comms = start(2, 20, ChildEnd::pause_after, child, kTimeout);
  ASSERT_EQ(comms.size(), 1u);
  // Rank 0 runs 20 good collectives, then blocks in the 21st (the child
  // waits in pause()), and the child is killed while rank 0 is inside it.
  std::thread killer([&] {
    std::this_thread::sleep_for(milliseconds(500));
    ::kill(child.pid, SIGKILL);
  });
  std::vector<milliseconds> took;
  collectives_until_failure(comms, 2, kTimeout + milliseconds(2000), "peer rank 1 is dead", &took);
  killer.join();
  EXPECT_LT(took[0], kTimeout) << "a closed connection should be noticed before the timeout";
  const int status = child.reap();
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  EXPECT_TRUE(comms[0]->peer_dead(1));
}

TEST(TcpFault, ChildThatExitsWithoutGoodbyeFailsSurvivorWithIo) {
  constexpr milliseconds kTimeout(5000);
  Child child;
  auto comms = start(2, 30, ChildEnd::exit_after, child, kTimeout);
  ASSERT_EQ(comms.size(), 1u);
  std::vector<milliseconds> took;
  collectives_until_failure(comms, 2, kTimeout + milliseconds(2000), "peer rank 1 is dead", &took);
  EXPECT_LT(took[0], kTimeout);
  const int status = child.reap();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST(TcpFault, HungChildTimesOutWithinBound) {
  constexpr milliseconds kTimeout(700);
  Child child;
  auto comms = start(2, 10, ChildEnd::pause_after, child, kTimeout);
  ASSERT_EQ(comms.size(), 1u);
  ::kill(child.pid, SIGSTOP);  // alive, connected, silent
  std::vector<milliseconds> took;
  collectives_until_failure(comms, 2, kTimeout + milliseconds(2000),
                            "timed out after 700 ms waiting for rank 1", &took);
  EXPECT_GE(took[0], kTimeout - milliseconds(10));
  ::kill(child.pid, SIGKILL);
  child.reap();
}

TEST(TcpFault, ChildKilledAtARandomPointOfAThreeRankLoop) {
  // Ranks 0 and 1 are threads here, rank 2 the child; everyone runs
  // collectives back to back and the child dies somewhere inside one.
  constexpr milliseconds kTimeout(5000);
  for (int round = 0; round < 3; ++round) {
    Child child;
    auto comms = start(3, 0, ChildEnd::keep_going, child, kTimeout);
    ASSERT_EQ(comms.size(), 2u);
    std::thread killer([&] {
      std::this_thread::sleep_for(milliseconds(150 + 97 * round));
      ::kill(child.pid, SIGKILL);
    });
    collectives_until_failure(comms, 3, kTimeout + milliseconds(2000), "rank 2");
    killer.join();
    child.reap();
  }
}

}  // namespace
}  // namespace shardline::comm
