// A full disk under the output file or under jobs.db (issue 46, items 7 and
// 8). Before, the results of the failed commit were dropped (their lines
// were neither in flight nor pending: the job hung at "300/300 ETA 0:00"),
// a failed output append was retried only when more results came (never,
// after the last one), and jobs.db refused every write until the process
// restarted. Now the job pauses (JobProgress::paused says why), keeps its
// results, hands out no more work, retries with back-off, and resumes when
// space is back; the file then holds every line exactly once, as a run on a
// disk that never filled.

#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "orchestrator/job_manager.hpp"
#include "tests/orchestrator/fake_clock.hpp"
#include "tests/orchestrator/fake_worker.hpp"
#include "tests/orchestrator/temp_dir.hpp"
#include "tests/support/full_disk.hpp"
#include "tests/support/output_ids.hpp"

namespace shardline::orchestrator {
namespace orchestrator_job_manager_disk_full_fault_test {

using testing::fake_result;
using testing::FakeClock;
using testing::read_file;
using testing::TempDir;
using testing::write_file;
using testing_support::DiskSpace;
using testing_support::FullDiskFileSystem;
using testing_support::FullDiskRocksDbFs;

constexpr int kLines = 12;

/// A data dir and an input of kLines lines; `output_full` puts the output
/// file on the full-able disk, else jobs.db.
struct Bed {
  TempDir tmp;
  FakeClock clock;
  std::shared_ptr<DiskSpace> space = std::make_shared<DiskSpace>();
  std::unique_ptr<JobManager> jobs;
  std::uint64_t job = 0;

  explicit Bed(bool output_full) {
    std::string input;
    for (int i = 0; i < kLines; ++i)
      input += "{\"custom_id\":\"c" + std::to_string(i) + "\",\"prompt\":\"p" + std::to_string(i) + "\"}\n";
    write_file(tmp.file("in.jsonl"), input);
    JobManagerOptions options;
    options.clock = clock.fn();
    if (output_full) options.file_system = std::make_shared<FullDiskFileSystem>(space);
    else options.store.file_system = std::make_shared<FullDiskRocksDbFs>(space);
    auto opened = JobManager::open(tmp.file("state"), options);
    EXPECT_TRUE(opened.ok()) << opened.error().to_string();
    jobs = std::move(opened).value();
    JobSpec spec;
    spec.model_dir = "/models/m";
    spec.input_paths = {tmp.file("in.jsonl")};
    spec.output_path = tmp.file("out/o.jsonl");
    auto id = jobs->submit(spec);
    EXPECT_TRUE(id.ok()) << id.error().to_string();
    job = *id;
  }

  std::vector<worker::BatchResult> answers(const std::vector<worker::BatchRequest>& work) {
    std::vector<worker::BatchResult> out;
    for (const auto& r : work) out.push_back(fake_result(r));
    return out;
  }
  JobProgress progress() { return *jobs->progress(job); }
};

/// Runs every line of `jobs` with the fake worker, `batch` at a time; every
/// commit must succeed.
void drain(JobManager& jobs, std::size_t batch) {
  for (int guard = 0; guard < 100; ++guard) {
    auto work = jobs.next_work(batch, "w");
    if (work.empty()) break;
    std::vector<worker::BatchResult> results;
    for (const auto& r : work) results.push_back(fake_result(r));
    auto committed = jobs.on_results(results);
    ASSERT_TRUE(committed.ok()) << committed.error().to_string();
  }
}

/// The output of an uninterrupted run of the same input (ids normalized).
std::string clean_output(const std::string& input_path, const std::string& dir) {
  auto jobs = JobManager::open(dir + "/state");
  JobSpec spec;
  spec.model_dir = "/models/m";
  spec.input_paths = {input_path};
  spec.output_path = dir + "/clean.jsonl";
  EXPECT_TRUE((*jobs)->submit(spec).ok());
  drain(**jobs, 5);
  return read_file(dir + "/clean.jsonl");
}

void full_disk_pauses_keeps_results_and_resumes(bool output_full) {
  Bed bed(output_full);
  auto first = bed.jobs->next_work(4, "w");
  ASSERT_EQ(first.size(), 4u);
  ASSERT_TRUE(bed.jobs->on_results(bed.answers(first)).ok());
  EXPECT_EQ(bed.progress().written, 4u);

  auto second = bed.jobs->next_work(4, "w");
  ASSERT_EQ(second.size(), 4u);
  bed.space->full = true;
  auto failed = bed.jobs->on_results(bed.answers(second));
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.error().code, ErrorCode::disk_full) << failed.error().to_string();

  JobProgress p = bed.progress();
  EXPECT_EQ(p.state, JobState::running);  // paused, not failed
  EXPECT_TRUE(p.paused.starts_with("disk_full: ")) << p.paused;
  EXPECT_EQ(p.pauses, 1u);
  EXPECT_EQ(p.written, 4u);
  // The four results wait in memory: counted in flight, not pending.
  EXPECT_EQ(p.in_flight + p.done, 8u);
  EXPECT_EQ(p.pending, static_cast<std::uint64_t>(kLines) - 8u);
  // A paused job hands out nothing more.
  EXPECT_TRUE(bed.jobs->next_work(4, "w").empty());
  EXPECT_FALSE(bed.jobs->has_pending_work());
  EXPECT_FALSE(bed.jobs->idle());

  // Back-off: nothing is tried before 0.5 s, then 1 s after the next failure.
  const int refused = bed.space->writes_refused;
  bed.clock.t += 0.4;
  EXPECT_TRUE(bed.jobs->retry_paused().empty());
  EXPECT_EQ(bed.space->writes_refused, refused) << "retried before its back-off";
  bed.clock.t += 0.1;
  EXPECT_TRUE(bed.jobs->retry_paused().empty());  // still full
  EXPECT_GT(bed.space->writes_refused, refused);
  EXPECT_FALSE(bed.progress().paused.empty());
  bed.space->full = false;
  bed.clock.t += 0.9;  // the second wait is 1 s
  EXPECT_TRUE(bed.jobs->retry_paused().empty());
  EXPECT_FALSE(bed.progress().paused.empty());
  bed.clock.t += 0.1;
  EXPECT_EQ(bed.jobs->retry_paused(), std::vector<std::uint64_t>{bed.job});

  p = bed.progress();
  EXPECT_TRUE(p.paused.empty()) << p.paused;
  EXPECT_EQ(p.done, 8u);
  EXPECT_EQ(p.written, 8u);
  EXPECT_EQ(p.in_flight, 0u);
  drain(*bed.jobs, 3);
  p = bed.progress();
  EXPECT_EQ(p.state, JobState::done);
  EXPECT_EQ(p.pauses, 1u);
  const std::string out = read_file(bed.tmp.file("out/o.jsonl"));
  TempDir clean_dir;
  EXPECT_TRUE(testing_support::same_output(out, clean_output(bed.tmp.file("in.jsonl"), clean_dir.path())));
}

TEST(JobManagerDiskFull, OutputDiskFullPausesTheJobKeepsItsResultsAndResumesWhenSpaceIsBack) {
  full_disk_pauses_keeps_results_and_resumes(/*output_full=*/true);
}

TEST(JobManagerDiskFull, JobsDbDiskFullPausesTheJobReopensTheStoreAndResumes) {
  full_disk_pauses_keeps_results_and_resumes(/*output_full=*/false);
}

// The last results of a job fail to reach the output: nothing else would
// come to retry them (the hang of item 8); the retry finishes the job.
TEST(JobManagerDiskFull, TheLastLinesAreWrittenByTheRetryAlone) {
  Bed bed(/*output_full=*/true);
  auto work = bed.jobs->next_work(kLines, "w");
  ASSERT_EQ(work.size(), static_cast<std::size_t>(kLines));
  bed.space->full = true;
  ASSERT_FALSE(bed.jobs->on_results(bed.answers(work)).ok());
  JobProgress p = bed.progress();
  EXPECT_EQ(p.done, static_cast<std::uint64_t>(kLines));  // committed to jobs.db (another disk)
  EXPECT_EQ(p.written, 0u);
  EXPECT_NE(p.state, JobState::done);
  bed.space->full = false;
  bed.clock.t += JobManager::kFirstRetryS;
  EXPECT_EQ(bed.jobs->retry_paused().size(), 1u);
  p = bed.progress();
  EXPECT_EQ(p.state, JobState::done);
  EXPECT_EQ(p.written, static_cast<std::uint64_t>(kLines));
  EXPECT_TRUE(p.paused.empty());
}

// Results that arrive while the job is paused wait with the others (no
// write is tried for them: the back-off decides), and a duplicate of a
// waiting line is dropped.
TEST(JobManagerDiskFull, ResultsArrivingWhilePausedWaitAndDuplicatesCountOnce) {
  Bed bed(/*output_full=*/false);
  auto work = bed.jobs->next_work(6, "w");
  ASSERT_EQ(work.size(), 6u);
  const std::vector<worker::BatchRequest> a(work.begin(), work.begin() + 3), b(work.begin() + 3, work.end());
  bed.space->full = true;
  ASSERT_FALSE(bed.jobs->on_results(bed.answers(a)).ok());
  const int refused = bed.space->writes_refused;
  auto later = bed.jobs->on_results(bed.answers(b));
  ASSERT_TRUE(later.ok()) << later.error().to_string();
  EXPECT_EQ(*later, 0u);
  EXPECT_EQ(bed.space->writes_refused, refused) << "a paused job wrote before its back-off";
  ASSERT_TRUE(bed.jobs->on_results(bed.answers(a)).ok());  // a retried worker's duplicates
  EXPECT_EQ(bed.progress().in_flight, 6u);
  bed.space->full = false;
  bed.clock.t += JobManager::kFirstRetryS;
  EXPECT_EQ(bed.jobs->retry_paused().size(), 1u);
  const JobProgress p = bed.progress();
  EXPECT_EQ(p.done, 6u);
  EXPECT_EQ(p.written, 6u);
  EXPECT_EQ(p.in_flight, 0u);
}

// A restart while paused loses only memory: the waiting results were never
// committed, so their lines are pending again and the job completes.
TEST(JobManagerDiskFull, ARestartWhilePausedServesTheWaitingLinesAgain) {
  TempDir tmp;
  std::string input;
  for (int i = 0; i < kLines; ++i) input += "{\"prompt\":\"p" + std::to_string(i) + "\"}\n";
  write_file(tmp.file("in.jsonl"), input);
  auto space = std::make_shared<DiskSpace>();
  JobSpec spec;
  spec.model_dir = "/models/m";
  spec.input_paths = {tmp.file("in.jsonl")};
  spec.output_path = tmp.file("o.jsonl");
  {
    JobManagerOptions options;
    options.file_system = std::make_shared<FullDiskFileSystem>(space);
    options.store.file_system = std::make_shared<FullDiskRocksDbFs>(space);
    auto jobs = JobManager::open(tmp.file("state"), options);
    ASSERT_TRUE(jobs.ok());
    ASSERT_TRUE((*jobs)->submit(spec).ok());
    auto work = (*jobs)->next_work(5, "w");
    space->full = true;
    std::vector<worker::BatchResult> results;
    for (const auto& r : work) results.push_back(fake_result(r));
    ASSERT_FALSE((*jobs)->on_results(results).ok());
  }
  space->full = false;
  auto jobs = JobManager::open(tmp.file("state"));
  ASSERT_TRUE(jobs.ok()) << jobs.error().to_string();
  drain(**jobs, 4);
  const auto p = (*jobs)->list_jobs().at(0);
  EXPECT_EQ(p.state, JobState::done);
  TempDir clean_dir;
  EXPECT_TRUE(testing_support::same_output(read_file(tmp.file("o.jsonl")),
                                           clean_output(tmp.file("in.jsonl"), clean_dir.path())));
}

// jobs.db's files stop growing (RLIMIT_FSIZE: EFBIG, as deterministic as a
// full disk), its LOG included: writes fail as errors and the process
// lives (RocksDB's own logger aborts on the LOG line after a failed one; see
// kv_store_disk_full_fault_test). In a child process, which keeps the limit
// and an abort to itself.
TEST(JobStoreDiskFull, AnUnwritableDiskFailsWritesAndNeverAbortsTheProcess) {
  TempDir tmp;
  const int status = testing_support::status_of_child([&] {
    auto store = JobStore::open(tmp.file("jobs.db"));
    if (!store.ok()) return 3;
    JobRecord rec;
    rec.spec.output_path = "/o";
    auto id = (*store)->create_job(rec);
    if (!id.ok()) return 4;
    if (!testing_support::stop_files_growing_past(tmp.file("jobs.db/LOG"))) return 5;
    int failed = 0;
    for (std::uint64_t line = 0; line < 200; ++line) {
      StoredResult r;
      r.line_index = line;
      r.line = std::string(4096, 'x');
      if (!(*store)->put_results(*id, {r}).ok()) ++failed;
    }
    return failed > 0 ? 0 : 6;  // the writes failed, as errors
  });
  ASSERT_TRUE(WIFEXITED(status)) << "the store's process died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace shardline::orchestrator
