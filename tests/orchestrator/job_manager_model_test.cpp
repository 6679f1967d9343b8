// Issue 46, item 10: a resumed job checks what it resumes. A job records the
// fingerprint of the cluster's model; reopened by a node that runs another
// model it is held back (not served, the reason in its progress) instead of
// mixing two models' lines in one file, and served again by its own model.
// A submit whose --model is readable and is not the cluster's is refused.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "orchestrator/job_manager.hpp"
#include "tests/orchestrator/temp_dir.hpp"

namespace shardline::orchestrator {
namespace orchestrator_job_manager_model_test {

using testing::TempDir;
using testing::write_file;

JobManagerOptions runs(const std::string& fingerprint, const std::string& dir) {
  JobManagerOptions o;
  o.model_fingerprint = fingerprint;
  o.model_dir = dir;
  return o;
}

JobSpec spec_of(const TempDir& tmp, const std::string& model) {
  JobSpec s;
  s.model_dir = model;
  s.input_paths = {tmp.file("in.jsonl")};
  s.output_path = tmp.file("out.jsonl");
  return s;
}

TEST(JobManagerModel, AJobIsHeldBackOnAnotherModelAndServedOnItsOwn) {
  TempDir tmp;
  write_file(tmp.file("in.jsonl"), "{\"prompt\":\"a\"}\n{\"prompt\":\"b\"}\n");
  std::uint64_t id = 0;
  {
    auto m = JobManager::open(tmp.file("state"), runs("aaaa1111", "/models/a"));
    ASSERT_TRUE(m.ok());
    auto submitted = (*m)->submit(spec_of(tmp, "/not/readable/here"));
    ASSERT_TRUE(submitted.ok()) << submitted.error().to_string();
    id = *submitted;
    EXPECT_EQ((*m)->job(id)->spec.model_fingerprint, "aaaa1111");
    ASSERT_EQ((*m)->next_work(1, "w").size(), 1u);  // then the node stops
  }
  {
    auto m = JobManager::open(tmp.file("state"), runs("bbbb2222", "/models/b"));
    ASSERT_TRUE(m.ok());
    const auto p = (*m)->progress(id);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(p->state, JobState::running);  // kept as it was
    EXPECT_NE(p->error.find("was started on another model than this node's --model /models/b"), std::string::npos)
        << p->error;
    EXPECT_NE(p->error.find("aaaa1111 vs bbbb2222"), std::string::npos) << p->error;
    EXPECT_FALSE((*m)->has_pending_work());
    EXPECT_TRUE((*m)->next_work(8, "w").empty());
    // A result of it (a worker that outlived the restart) is not committed.
    worker::BatchResult r;
    r.job_id = id;
    r.line_index = 0;
    r.ok = true;
    EXPECT_EQ(*(*m)->on_results({r}), 0u);
    // Its output stays its own: another job cannot take it.
    EXPECT_FALSE((*m)->submit(spec_of(tmp, "/x")).ok());
  }
  auto m = JobManager::open(tmp.file("state"), runs("aaaa1111", "/models/a"));
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE((*m)->progress(id)->error.empty());
  EXPECT_EQ((*m)->next_work(8, "w").size(), 2u);
}

TEST(JobManagerModel, ASubmitForAnotherReadableModelIsRefused) {
  TempDir tmp;
  write_file(tmp.file("in.jsonl"), "{\"prompt\":\"a\"}\n");
  std::filesystem::create_directories(tmp.file("other-model"));
  std::ofstream(tmp.file("other-model/config.json")) << "{}";
  auto m = JobManager::open(tmp.file("state"), runs("aaaa1111", "/models/a"));
  ASSERT_TRUE(m.ok());
  auto refused = (*m)->submit(spec_of(tmp, tmp.file("other-model")));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(refused.error().message.find("is not the model this cluster runs (/models/a)"), std::string::npos)
      << refused.error().message;
  EXPECT_TRUE((*m)->list_jobs().empty());
}

}  // namespace
}  // namespace shardline::orchestrator
