#pragma once
/// \file
/// Per-micro-batch token budgets for the scheduler: how many prefill and how
/// many decode tokens the next micro-batch may carry. The scheduler asks its
/// policy once per micro-batch; implementations live in orchestrator/
/// (fixed_token_budget.hpp: Sarathi-Serve's fixed budget; token_throttling.hpp:
/// gLLM Token Throttling, seed 004 §3.2).

#include <memory>

namespace shardline::engine {

/// What the scheduler knows when it plans a micro-batch.
struct SchedulerState {
  int num_waiting_prefill_tokens = 0;  ///< #WP: prompt tokens not yet computed, all waiting + partially prefilled seqs
  int num_running_decode_seqs = 0;     ///< #RD: running sequences in the decode phase (in flight or not)
  int num_free_kv_blocks = 0;
  int num_total_kv_blocks = 0;
  int pipeline_depth = 1;              ///< #PP: micro-batches in flight at most (pipeline stages)
  int max_num_batched_tokens = 2048;   ///< the engine's per-step cap
};

/// Limits for one micro-batch; decodes are scheduled first.
struct MicroBatchBudget {
  int max_prefill_tokens = 0;  ///< prompt / recompute tokens at most
  int max_decode_tokens = 0;   ///< decode tokens (= sequences) at most
};

class TokenBudgetPolicy {
 public:
  virtual ~TokenBudgetPolicy() = default;
  [[nodiscard]] virtual MicroBatchBudget budget(const SchedulerState& state) const = 0;
  [[nodiscard]] virtual const char* name() const = 0;
};

}  // namespace shardline::engine
