#pragma once
/// \file
/// What a job and a worker must agree on with the cluster before they are
/// accepted, as plain functions (no actors here). JobManager::submit admits
/// a job with admit_job(); the orchestrator actor checks joining workers:
///  - a job's model folder must be the one the cluster's workers load;
///  - a job's parallel config (`job submit --parallel`), when given, must be
///    the one the cluster's workers run: the same engine-group shape
///    (tp, pp, sp) and dp = the number of engine groups;
///  - a worker's engine-group shape must be the cluster's (a node that joins
///    with another --parallel is refused);
///  - a job's `--weight-sharing`, when given, must be the cluster's;
///  - a job's token budget policy must be a known one ("" = "fixed").

#include <optional>
#include <string>
#include <string_view>

#include "common/result.hpp"
#include "engine/group/parallel_config.hpp"

namespace shardline::orchestrator {

/// Whether two paths name the same file, through symlinks, "." and "..":
/// compared after std::filesystem::weakly_canonical, or as given when
/// either cannot be resolved.
[[nodiscard]] bool same_path(const std::string& a, const std::string& b);

/// The shape of one engine group without dp: "tp=2,pp=1,sp=1".
[[nodiscard]] std::string group_label(const engine::ParallelConfig& pc);

/// The group config of `pc` (dp = 1).
[[nodiscard]] engine::ParallelConfig group_of(engine::ParallelConfig pc);

/// Checks a job's requested config against the cluster's workers: engine
/// groups of shape `cluster_group` (its dp is ignored), `num_groups` of them.
/// Errors: invalid_argument "job asks tp=2,pp=1,sp=1,dp=1; this cluster's
/// workers are 1 engine group of [tp=1,pp=1,sp=1] (tp=1,pp=1,sp=1,dp=1) ...".
[[nodiscard]] Status check_job_parallel(const engine::ParallelConfig& asked,
                                        const engine::ParallelConfig& cluster_group, int num_groups);

/// What the cluster's workers run, that a job is admitted against.
struct ClusterShape {
  std::string model_dir;          ///< the model folder the workers load
  engine::ParallelConfig group;   ///< one engine group's shape (its dp is ignored)
  int num_groups = 1;             ///< engine groups now (the dp a job runs with)
  std::string weight_sharing;     ///< the cluster's --weight-sharing
};

/// What a job asks of the cluster at submit.
struct JobAsk {
  std::string model_dir;
  std::optional<engine::ParallelConfig> parallel;  ///< `--parallel`; none: the cluster's
  std::string weight_sharing;                      ///< `--weight-sharing`; "": the cluster's
};

/// Admits a job: the same model folder (through any spelling of its path),
/// check_job_parallel when it asks a parallel config, and the same weight
/// sharing when it asks one. Returns the parallel config the job runs on:
/// the asked one, or the cluster's (its group shape, dp = num_groups).
/// Errors: invalid_argument "this cluster serves the model A, not B",
/// check_job_parallel's, or "this cluster runs --weight-sharing X; the job
/// asks for --weight-sharing Y".
[[nodiscard]] Result<engine::ParallelConfig> admit_job(const JobAsk& ask, const ClusterShape& cluster);

/// Checks a worker's engine-group shape against the cluster's. Errors:
/// invalid_argument naming both shapes.
[[nodiscard]] Status check_worker_group(const std::string& worker_name, const engine::ParallelConfig& worker_group,
                                        const engine::ParallelConfig& cluster_group);

/// The policy name a job records: "" becomes "fixed"; a known name
/// (make_token_budget_policy) is returned as is. Errors: invalid_argument
/// naming the bad value and the valid names.
[[nodiscard]] Result<std::string> normalize_token_budget(std::string_view name);

}  // namespace shardline::orchestrator
