#pragma once
/// \file
/// What a job and a worker must agree on with the cluster before they are
/// accepted, as plain functions the orchestrator actor calls (no actors here):
///  - a job's parallel config (`job submit --parallel`), when given, must be
///    the one the cluster's workers run: the same engine-group shape
///    (tp, pp, sp) and dp = the number of engine groups;
///  - a worker's engine-group shape must be the cluster's (a node that joins
///    with another --parallel is refused);
///  - a job's token budget policy must be a known one ("" = "fixed").

#include <string>
#include <string_view>

#include "common/result.hpp"
#include "engine/parallel_config.hpp"

namespace shardline::orchestrator {

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

/// Checks a worker's engine-group shape against the cluster's. Errors:
/// invalid_argument naming both shapes.
[[nodiscard]] Status check_worker_group(const std::string& worker_name, const engine::ParallelConfig& worker_group,
                                        const engine::ParallelConfig& cluster_group);

/// The policy name a job records: "" becomes "fixed"; a known name
/// (make_token_budget_policy) is returned as is. Errors: invalid_argument
/// naming the bad value and the valid names.
[[nodiscard]] Result<std::string> normalize_token_budget(std::string_view name);

}  // namespace shardline::orchestrator
