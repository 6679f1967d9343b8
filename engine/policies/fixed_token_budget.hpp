#pragma once
/// \file
/// Sarathi-Serve's fixed per-micro-batch token budget (Agrawal et al., OSDI
/// 2024; the baseline of gLLM, seed 004 §2.3 and Fig. 7–8): every
/// micro-batch carries at most `token_budget` tokens; decodes are scheduled
/// first (one token per running decode sequence) and chunked prefill fills
/// the rest of the budget.

#include "engine/policies/token_budget.hpp"

namespace shardline::engine {

/// A fixed token budget per micro-batch.
///
/// For a state s, with B = min(token_budget, s.max_num_batched_tokens)
/// (both in tokens; B < 0 is treated as 0):
///   max_decode_tokens  = min(#RD, B)
///   max_prefill_tokens = min(#WP, B - max_decode_tokens)
/// where #RD = s.num_running_decode_seqs and #WP = s.num_waiting_prefill_tokens
/// (negative counts read as 0). The KV cache and the pipeline depth do not
/// enter: Sarathi-Serve schedules eagerly and lets the block manager refuse
/// or preempt (the behaviour gLLM's Token Throttling improves on).
///
/// Capping prefill at #WP changes nothing that is scheduled (there is no more
/// to prefill); it makes the budget of an idle state {0, 0}.
///
/// Note for pipeline parallelism: #RD counts decode sequences in flight too,
/// so when some of them are in flight the scheduler schedules fewer decodes
/// than max_decode_tokens and the micro-batch stays below B.
class FixedTokenBudget final : public TokenBudgetPolicy {
 public:
  /// `token_budget`: tokens per micro-batch; values < 1 are treated as 1
  /// (make_token_budget_policy rejects them with invalid_argument).
  explicit FixedTokenBudget(int token_budget);

  [[nodiscard]] MicroBatchBudget budget(const SchedulerState& state) const override;
  /// "fixed".
  [[nodiscard]] const char* name() const override { return "fixed"; }
  [[nodiscard]] int token_budget() const { return token_budget_; }

 private:
  int token_budget_;
};

}  // namespace shardline::engine
