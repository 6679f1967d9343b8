#include "orchestrator/job_admission.hpp"

#include <filesystem>
#include <system_error>

#include "engine/policies/token_budget_policies.hpp"

namespace shardline::orchestrator {
bool same_path(const std::string& a, const std::string& b) {
  std::error_code ec;
  const auto ca = std::filesystem::weakly_canonical(a, ec);
  if (ec) return a == b;
  const auto cb = std::filesystem::weakly_canonical(b, ec);
  if (ec) return a == b;
  return ca == cb;
}

std::string group_label(const engine::ParallelConfig& pc) {
  return "tp=" + std::to_string(pc.tp) + ",pp=" + std::to_string(pc.pp) + ",sp=" + std::to_string(pc.sp);
}

engine::ParallelConfig group_of(engine::ParallelConfig pc) {
  pc.dp = 1;
  return pc;
}

Status check_job_parallel(const engine::ParallelConfig& asked, const engine::ParallelConfig& cluster_group,
                          int num_groups) {
  engine::ParallelConfig cluster = group_of(cluster_group);
  cluster.dp = num_groups;
  if (asked == cluster) return {};
  return make_error(ErrorCode::invalid_argument,
                    "job asks " + asked.to_string() + "; this cluster's workers are " + std::to_string(num_groups) +
                        (num_groups == 1 ? " engine group" : " engine groups") + " of [" +
                        group_label(cluster_group) + "] (" + cluster.to_string() +
                        "); submit without --parallel, or start the nodes with --parallel " + asked.to_string());
}

Result<engine::ParallelConfig> admit_job(const JobAsk& ask, const ClusterShape& cluster) {
  if (!same_path(ask.model_dir, cluster.model_dir))
    return make_error(ErrorCode::invalid_argument,
                      "this cluster serves the model " + cluster.model_dir + ", not " + ask.model_dir);
  engine::ParallelConfig runs_on = group_of(cluster.group);
  runs_on.dp = cluster.num_groups;
  if (ask.parallel) {
    if (Status ok = check_job_parallel(*ask.parallel, cluster.group, cluster.num_groups); !ok) return ok.error();
    runs_on = *ask.parallel;
  }
  if (!ask.weight_sharing.empty() && ask.weight_sharing != cluster.weight_sharing)
    return make_error(ErrorCode::invalid_argument, "this cluster runs --weight-sharing " + cluster.weight_sharing +
                                                       "; the job asks for --weight-sharing " + ask.weight_sharing);
  return runs_on;
}

Status check_worker_group(const std::string& worker_name, const engine::ParallelConfig& worker_group,
                          const engine::ParallelConfig& cluster_group) {
  if (group_of(worker_group) == group_of(cluster_group)) return {};
  return make_error(ErrorCode::invalid_argument,
                    "worker " + worker_name + " runs engine groups of [" + group_label(worker_group) +
                        "], this cluster's workers run [" + group_label(cluster_group) +
                        "]; start the node with the same --parallel tp/pp/sp");
}

Result<std::string> normalize_token_budget(std::string_view name) {
  if (name.empty()) return std::string("fixed");
  if (Status st = engine::check_token_budget_policy_name(name); !st)
    return make_error(ErrorCode::invalid_argument, "--token-budget: " + st.error().message);
  return std::string(name);
}

}  // namespace shardline::orchestrator
