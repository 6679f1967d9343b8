// Admission of jobs and workers by model folder, parallel config, weight
// sharing and token budget policy (orchestrator/job_admission.hpp).
#include "orchestrator/job_admission.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>


namespace shardline::orchestrator {
namespace orchestrator_job_admission_test {

using engine::ParallelConfig;

TEST(JobAdmission, GroupLabelHasNoDp) {
  EXPECT_EQ(group_label(ParallelConfig{2, 3, 4, 5}), "tp=2,pp=3,sp=4");
  EXPECT_EQ(group_of(ParallelConfig{2, 3, 4, 5}), (ParallelConfig{2, 3, 4, 1}));
}

TEST(JobAdmission, JobMustAskWhatTheWorkersRun) {
  const ParallelConfig tp2{2, 1, 1, 1};
  EXPECT_TRUE(check_job_parallel(ParallelConfig{2, 1, 1, 1}, tp2, 1).ok());
  EXPECT_TRUE(check_job_parallel(ParallelConfig{2, 1, 1, 2}, tp2, 2).ok());
  // The cluster config's own dp is ignored: the number of groups counts.
  EXPECT_TRUE(check_job_parallel(ParallelConfig{2, 1, 1, 3}, ParallelConfig{2, 1, 1, 2}, 3).ok());

  const Status other_shape = check_job_parallel(ParallelConfig{1, 2, 1, 1}, tp2, 1);
  ASSERT_FALSE(other_shape.ok());
  EXPECT_EQ(other_shape.error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(other_shape.error().message,
            "job asks tp=1,pp=2,sp=1,dp=1; this cluster's workers are 1 engine group of [tp=2,pp=1,sp=1] "
            "(tp=2,pp=1,sp=1,dp=1); submit without --parallel, or start the nodes with --parallel "
            "tp=1,pp=2,sp=1,dp=1");
  const Status other_dp = check_job_parallel(ParallelConfig{1, 1, 1, 1}, ParallelConfig{}, 2);
  ASSERT_FALSE(other_dp.ok());
  EXPECT_NE(other_dp.error().message.find("job asks tp=1,pp=1,sp=1,dp=1; this cluster's workers are 2 engine "
                                          "groups of [tp=1,pp=1,sp=1] (tp=1,pp=1,sp=1,dp=2)"),
            std::string::npos)
      << other_dp.error().message;
}

TEST(JobAdmission, SamePathSeesThroughSpellingsAndSymlinks) {
  const auto dir = std::filesystem::temp_directory_path() / ("shardline_same_path_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "a");
  std::filesystem::create_directory_symlink(dir / "a", dir / "link");
  const std::string a = (dir / "a").string();
  EXPECT_TRUE(same_path(a, (dir / "." / "a").string()));
  EXPECT_TRUE(same_path(a, (dir / "b" / ".." / "a").string()));
  EXPECT_TRUE(same_path(a, (dir / "link").string()));
  EXPECT_TRUE(same_path((dir / "a" / "out.jsonl").string(), (dir / "link" / "out.jsonl").string()));  // not there yet
  EXPECT_FALSE(same_path(a, (dir / "b").string()));
  EXPECT_FALSE(same_path((dir / "a" / "x").string(), (dir / "a" / "y").string()));
  std::filesystem::remove_all(dir);
}

TEST(JobAdmission, AJobRunsOnWhatItAsksOrOnTheClustersConfig) {
  const auto dir = std::filesystem::temp_directory_path() / ("shardline_admission_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir / "model");
  const std::string model = (dir / "model").string();
  const ClusterShape cluster{model, ParallelConfig{2, 1, 1, 1}, 3, "none"};

  // Nothing asked: the cluster's group shape with dp = its engine groups,
  // and the model folder through another spelling of its path.
  auto runs_on = admit_job(JobAsk{(dir / "." / "model" / "").string(), std::nullopt, ""}, cluster);
  ASSERT_TRUE(runs_on.ok()) << runs_on.error().to_string();
  EXPECT_EQ(*runs_on, (ParallelConfig{2, 1, 1, 3}));
  runs_on = admit_job(JobAsk{model, ParallelConfig{2, 1, 1, 3}, "none"}, cluster);
  ASSERT_TRUE(runs_on.ok()) << runs_on.error().to_string();
  EXPECT_EQ(*runs_on, (ParallelConfig{2, 1, 1, 3}));

  const auto other_model = admit_job(JobAsk{(dir / "other").string(), std::nullopt, ""}, cluster);
  ASSERT_FALSE(other_model.ok());
  EXPECT_EQ(other_model.error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(other_model.error().message,
            "this cluster serves the model " + model + ", not " + (dir / "other").string());
  const auto other_dp = admit_job(JobAsk{model, ParallelConfig{2, 1, 1, 1}, ""}, cluster);
  ASSERT_FALSE(other_dp.ok());
  EXPECT_NE(other_dp.error().message.find("job asks tp=2,pp=1,sp=1,dp=1; this cluster's workers are 3 engine groups"),
            std::string::npos)
      << other_dp.error().message;
  const auto other_sharing = admit_job(JobAsk{model, std::nullopt, "sidp"}, cluster);
  ASSERT_FALSE(other_sharing.ok());
  EXPECT_EQ(other_sharing.error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(other_sharing.error().message,
            "this cluster runs --weight-sharing none; the job asks for --weight-sharing sidp");
  std::filesystem::remove_all(dir);
}

TEST(JobAdmission, WorkerMustHaveTheClusterGroupShape) {
  EXPECT_TRUE(check_worker_group("b/cpu:0-1", ParallelConfig{2, 1, 1, 1}, ParallelConfig{2, 1, 1, 4}).ok());
  const Status st = check_worker_group("b/cpu:0", ParallelConfig{}, ParallelConfig{2, 1, 1, 1});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("worker b/cpu:0 runs engine groups of [tp=1,pp=1,sp=1], this cluster's "
                                    "workers run [tp=2,pp=1,sp=1]"),
            std::string::npos)
      << st.error().message;
}

TEST(JobAdmission, TokenBudgetNames) {
  EXPECT_EQ(normalize_token_budget("").value(), "fixed");
  EXPECT_EQ(normalize_token_budget("fixed").value(), "fixed");
  EXPECT_EQ(normalize_token_budget("throttle").value(), "throttle");
  const auto bad = normalize_token_budget("greedy");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(bad.error().message.find("'greedy'"), std::string::npos) << bad.error().message;
  EXPECT_NE(bad.error().message.find("fixed, throttle"), std::string::npos) << bad.error().message;
}

}  // namespace
}  // namespace shardline::orchestrator
