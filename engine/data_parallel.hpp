#pragma once
/// \file
/// Data parallelism inside one process: `dp` independent engine replicas
/// (each maybe an engine group), requests dealt round-robin by index, each
/// replica stepping on its own thread. Across processes and nodes DP is the
/// orchestrator's: every worker (engine group) pulls its own requests.

#include <cstdint>
#include <vector>

#include "common/result.hpp"
#include "engine/llm_engine.hpp"

namespace shardline::engine {

/// Generates `prompts` over the replicas: prompt i runs on replica i % dp as
/// request id i (so seeded results do not depend on dp). Outputs in prompt
/// order. `threads_per_replica` > 0 sets the OpenMP threads of each
/// replica's driving thread. Errors: invalid_argument (no replicas), the
/// first replica error.
[[nodiscard]] Result<std::vector<RequestOutput>> generate_data_parallel(
    const std::vector<LlmEngine*>& replicas, const std::vector<std::vector<std::int32_t>>& prompts,
    const sampling::SamplingParams& params, int threads_per_replica = 0);

/// The same with one SamplingParams per prompt (params.size() == prompts.size()).
[[nodiscard]] Result<std::vector<RequestOutput>> generate_data_parallel(
    const std::vector<LlmEngine*>& replicas, const std::vector<std::vector<std::int32_t>>& prompts,
    const std::vector<sampling::SamplingParams>& params, int threads_per_replica = 0);

}  // namespace shardline::engine
