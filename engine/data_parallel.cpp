#include "engine/data_parallel.hpp"

#include "common/openmp_pool.hpp"

#include <omp.h>

#include <thread>

namespace shardline::engine {

Result<std::vector<RequestOutput>> generate_data_parallel(const std::vector<LlmEngine*>& replicas,
                                                          const std::vector<std::vector<std::int32_t>>& prompts,
                                                          const sampling::SamplingParams& params, int threads_per_replica) {
  return generate_data_parallel(replicas, prompts, std::vector<sampling::SamplingParams>(prompts.size(), params),
                                threads_per_replica);
}

Result<std::vector<RequestOutput>> generate_data_parallel(const std::vector<LlmEngine*>& replicas,
                                                          const std::vector<std::vector<std::int32_t>>& prompts,
                                                          const std::vector<sampling::SamplingParams>& params,
                                                          int threads_per_replica) {
  if (replicas.empty()) return make_error(ErrorCode::invalid_argument, "data parallel: no replicas");
  if (params.size() != prompts.size())
    return make_error(ErrorCode::invalid_argument, "data parallel: " + std::to_string(params.size()) +
                                                       " sampling params for " + std::to_string(prompts.size()) +
                                                       " prompts");
  for (const sampling::SamplingParams& p : params)
    if (Status s = p.validate(); !s.ok()) return s.error();
  const std::size_t dp = replicas.size();
  // This thread only waits now: its idle pool would slow the replicas' teams
  // (common/openmp_pool.hpp).
  (void)release_openmp_pool();
  std::vector<RequestOutput> outputs(prompts.size());
  std::vector<Status> statuses(dp);
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < dp; ++r) {
    threads.emplace_back([&, r] {
      if (threads_per_replica > 0) omp_set_num_threads(threads_per_replica);
      LlmEngine& eng = *replicas[r];
      for (std::size_t i = r; i < prompts.size(); i += dp) {
        if (Status s = eng.add_request(i, prompts[i], params[i]); !s.ok()) {
          statuses[r] = s;
          return;
        }
      }
      while (eng.has_unfinished()) {
        Result<std::vector<RequestOutput>> step = eng.step();
        if (!step.ok()) {
          statuses[r] = std::move(step).error();
          return;
        }
        for (RequestOutput& o : step.value()) outputs[o.request_id] = std::move(o);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const Status& s : statuses)
    if (!s.ok()) return s.error();
  return outputs;
}

}  // namespace shardline::engine
