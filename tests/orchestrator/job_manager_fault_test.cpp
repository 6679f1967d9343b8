// Real kill -9 of the orchestrator process in the middle of a job, several
// times, then recovery: the output must be byte-identical to a clean run.
// Each killed run is a fork()ed child (the parent opens RocksDB only after the
// last child, so no child inherits RocksDB threads).

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "orchestrator/job_manager.hpp"
#include "tests/orchestrator/fake_worker.hpp"
#include "tests/orchestrator/temp_dir.hpp"
#include "tests/support/output_ids.hpp"

namespace shardline::orchestrator {

using worker::BatchRequest;
using worker::BatchResult;

namespace orchestrator_job_manager_fault_test {

using testing::fake_result;
using testing::read_file;
using testing::TempDir;
using testing::write_file;

JobSpec spec_for(const TempDir& tmp, const std::string& out) {
  JobSpec s;
  s.model_dir = "m";
  s.input_paths = {tmp.file("a.jsonl"), tmp.file("b.jsonl")};
  s.output_path = tmp.file(out);
  return s;
}

/// Serves up to `commits` results (out of order within each batch), then
/// kills itself with SIGKILL; -1: run to the end.
int serve(const std::string& state, const JobSpec* submit, int commits) {
  auto m = JobManager::open(state);
  if (!m.ok()) return 2;
  if (submit != nullptr && !(*m)->submit(*submit).ok()) return 3;
  int done = 0;
  for (;;) {
    auto work = (*m)->next_work(7, "w");
    if (work.empty()) break;
    std::vector<BatchResult> results;
    for (auto it = work.rbegin(); it != work.rend(); ++it) results.push_back(fake_result(*it));
    // Half of the batch is lost in flight (committed by a later run).
    results.resize(results.size() / 2 + 1);
    for (const auto& r : results) {
      if (!(*m)->on_result(r).ok()) return 4;
      if (commits >= 0 && ++done >= commits) ::kill(::getpid(), SIGKILL);
    }
    (*m)->requeue_all();
  }
  return (*m)->idle() ? 0 : 5;
}

TEST(JobManagerFault, KillNineAtAnyPointLosesAndDuplicatesNothing) {
  TempDir tmp;
  std::string a, b;
  for (int i = 0; i < 60; ++i) a += (i % 11 == 3 ? std::string("oops\n") : "{\"prompt\":\"a" + std::to_string(i) + "\"}\n");
  for (int i = 0; i < 45; ++i) b += "{\"custom_id\":\"b" + std::to_string(i) + "\",\"body\":{\"prompt\":\"b\"}}\n";
  write_file(tmp.file("a.jsonl"), a);
  write_file(tmp.file("b.jsonl"), b);
  const JobSpec spec = spec_for(tmp, "run.out");

  const int kills[] = {1, 9, 17, 3, 30};
  for (std::size_t k = 0; k < std::size(kills); ++k) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) ::_exit(serve(tmp.file("state"), k == 0 ? &spec : nullptr, kills[k]));
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        << "run " << k << " exited with " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    // A torn write at the moment of the kill.
    std::ofstream(tmp.file("run.out"), std::ios::binary | std::ios::app) << "{\"id\":\"batch_req_1_";
  }
  ASSERT_EQ(serve(tmp.file("state"), nullptr, -1), 0);
  const JobSpec clean = spec_for(tmp, "clean.out");
  ASSERT_EQ(serve(tmp.file("clean"), &clean, -1), 0);
  const std::string expected = read_file(tmp.file("clean.out"));
  EXPECT_EQ(std::count(expected.begin(), expected.end(), '\n'), 105);
  EXPECT_EQ(testing_support::normalize_output_ids(read_file(tmp.file("run.out"))), testing_support::normalize_output_ids(expected));
}

}  // namespace
}  // namespace shardline::orchestrator
