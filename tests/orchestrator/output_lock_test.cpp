// OutputLock (issue 46, item 9): one writer per output file across
// processes; the refused one is told who holds it; a killed holder's lock
// is free at once; JobManager takes it for a job's life, and a second job on
// an existing output needs spec.overwrite.

#include "orchestrator/output_lock.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "orchestrator/job_manager.hpp"
#include "tests/orchestrator/temp_dir.hpp"

namespace shardline::orchestrator {
namespace orchestrator_output_lock_test {

using testing::read_file;
using testing::TempDir;
using testing::write_file;

TEST(OutputLock, OneHolderAtATimeAndTheRefusalNamesIt) {
  TempDir tmp;
  const std::string out = tmp.file("out.jsonl");
  auto first = OutputLock::acquire(out, "job 1 of data dir /a (pid 1 on host h)");
  ASSERT_TRUE(first.ok()) << first.error().to_string();
  EXPECT_EQ(read_file(out + ".lock"), "job 1 of data dir /a (pid 1 on host h)\n");
  auto second = OutputLock::acquire(out, "job 9 of data dir /b");
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(second.error().message, "output " + out + " is being written by job 1 of data dir /a (pid 1 on host h) "
                                    "(lock file " + out + ".lock): wait for that job, cancel it, or choose another --output");
  (*first)->describe("job 2");
  EXPECT_NE(OutputLock::acquire(out, "x").error().message.find("written by job 2 (lock file"), std::string::npos);
  first->reset();  // released: the lock file is gone
  EXPECT_FALSE(std::filesystem::exists(out + ".lock"));
  auto third = OutputLock::acquire(out, "job 9 of data dir /b");
  ASSERT_TRUE(third.ok()) << third.error().to_string();
  // Another output in the same folder is independent.
  EXPECT_TRUE(OutputLock::acquire(tmp.file("other.jsonl"), "y").ok());
}

TEST(OutputLock, AKilledHoldersLockIsFreeAtOnce) {
  TempDir tmp;
  const std::string out = tmp.file("out.jsonl");
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto lock = OutputLock::acquire(out, OutputLock::this_process());
    const char c = lock.ok() ? 'y' : 'n';
    (void)!::write(ready[1], &c, 1);
    for (;;) ::pause();
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, 'y');
  auto refused = OutputLock::acquire(out, "parent");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("pid " + std::to_string(child) + " on host "), std::string::npos)
      << refused.error().message;
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_TRUE(std::filesystem::exists(out + ".lock"));  // left behind, but not held
  auto taken = OutputLock::acquire(out, "parent");
  EXPECT_TRUE(taken.ok()) << taken.error().to_string();
  ::close(ready[0]);
  ::close(ready[1]);
}

JobSpec spec_of(const TempDir& tmp, bool overwrite = false) {
  JobSpec s;
  s.model_dir = "/models/stories260K";
  s.input_paths = {tmp.file("in.jsonl")};
  s.output_path = tmp.file("out/result.jsonl");
  s.overwrite = overwrite;
  return s;
}

/// Hands out and answers every line, as a worker would.
void drain(JobManager& m) {
  for (int guard = 0; guard < 1000; ++guard) {
    auto work = m.next_work(8, "w");
    if (work.empty()) return;
    std::vector<worker::BatchResult> results;
    for (const auto& r : work) {
      worker::BatchResult res;
      res.job_id = r.job_id;
      res.line_index = r.line_index;
      res.custom_id = r.custom_id;
      res.ok = true;
      res.choices.resize(1);
      res.choices[0].text = "x";
      results.push_back(res);
    }
    ASSERT_TRUE(m.on_results(results).ok());
  }
}

TEST(OutputLock, TwoDataDirsOneOutputThenOverwrite) {
  TempDir tmp;
  write_file(tmp.file("in.jsonl"), "{\"prompt\":\"a\"}\n{\"prompt\":\"b\"}\n");
  auto a = JobManager::open(tmp.file("state-a"));
  auto b = JobManager::open(tmp.file("state-b"));
  ASSERT_TRUE(a.ok() && b.ok());
  auto job_a = (*a)->submit(spec_of(tmp));
  ASSERT_TRUE(job_a.ok()) << job_a.error().to_string();
  EXPECT_NE(read_file(tmp.file("out/result.jsonl.lock")).find("job 1 of data dir " + tmp.file("state-a")),
            std::string::npos);
  // The other data dir is refused while job 1 runs, and nothing is created there.
  auto job_b = (*b)->submit(spec_of(tmp));
  ASSERT_FALSE(job_b.ok());
  EXPECT_NE(job_b.error().message.find("is being written by job 1 of data dir " + tmp.file("state-a")),
            std::string::npos)
      << job_b.error().message;
  EXPECT_TRUE((*b)->list_jobs().empty());
  drain(**a);
  ASSERT_EQ((*a)->progress(*job_a)->state, JobState::done);
  EXPECT_FALSE(std::filesystem::exists(tmp.file("out/result.jsonl.lock")));  // released when it finished
  const std::string written = read_file(tmp.file("out/result.jsonl"));
  ASSERT_FALSE(written.empty());

  // A finished job's output: refused without overwrite, in either data dir.
  for (auto* m : {a->get(), b->get()}) {
    auto again = m->submit(spec_of(tmp));
    ASSERT_FALSE(again.ok());
    EXPECT_EQ(again.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(again.error().message.find("already exists"), std::string::npos) << again.error().message;
    EXPECT_NE(again.error().message.find("pass --overwrite"), std::string::npos);
  }
  EXPECT_NE((*a)->submit(spec_of(tmp)).error().message.find("(the output of job 1, done)"), std::string::npos);
  EXPECT_EQ(read_file(tmp.file("out/result.jsonl")), written);
  auto replaced = (*b)->submit(spec_of(tmp, /*overwrite=*/true));
  ASSERT_TRUE(replaced.ok()) << replaced.error().to_string();
  drain(**b);
  EXPECT_EQ((*b)->progress(*replaced)->state, JobState::done);
  EXPECT_EQ((*b)->progress(*replaced)->written, 2u);
  const std::string rewritten = read_file(tmp.file("out/result.jsonl"));
  EXPECT_EQ(std::count(rewritten.begin(), rewritten.end(), '\n'), 2);  // replaced, not appended to
}

}  // namespace
}  // namespace shardline::orchestrator
