#pragma once
/// \file
/// gLLM's Token Throttling (seed 004, §3): the prefill and decode token counts
/// of each micro-batch are throttled separately from global state, so that
/// the micro-batches in a pipeline carry balanced work and bubbles shrink.
///
///  - Prefill (§3.1): from the tokens waiting for prefill (#WP, "WT", eq. 1)
///    and the KV cache idle rate (KV_free, "UT", eq. 2), combined with the
///    KV_thresh safeguard (§3.1.3) into eq. 3.
///  - Decode (§3.2.1, eq. 4): the running decode sequences are spread evenly
///    over the #PP micro-batches that can be in flight.
///
/// Paper defaults (§4.1, "we set the hyperparameters as follows"): #T = 8,
/// #MaxP = 2048, #MinP = 32, KV_thresh = 0.05.

#include "common/result.hpp"
#include "engine/policies/token_budget.hpp"

namespace shardline::engine {

/// Hyperparameters of Token Throttling (names as in seed 004 §3.1).
struct TokenThrottlingParams {
  /// #T: iterations (micro-batches) over which the tokens now waiting for
  /// prefill are spread (eq. 1, 3). Unitless, >= 1. Paper default 8.
  int iterations = 8;
  /// #MinP: least prefill tokens batched while prefill is allowed (eq. 1–3).
  /// Tokens, >= 0, <= max_prefill_tokens. Paper default 32.
  int min_prefill_tokens = 32;
  /// #MaxP: most prefill tokens batched per micro-batch (eq. 1–3). Tokens,
  /// >= 1. Paper default 2048 (the token budget of its vLLM / SGLang baselines).
  int max_prefill_tokens = 2048;
  /// KV_thresh: KV cache idle-rate threshold (§3.1.3, eq. 3). Fraction of all
  /// KV blocks, in [0, 1). Below it prefill is suspended. Paper default 0.05.
  double kv_thresh = 0.05;

  /// ok, or invalid_argument naming the bad field and the allowed range.
  [[nodiscard]] Status validate() const;
};

/// gLLM Token Throttling as a per-micro-batch budget policy.
///
/// For a state s (negative counts read as 0; PP = max(1, s.pipeline_depth);
/// cap = max(0, s.max_num_batched_tokens)):
///
///   decode (eq. 4, rounded up so that #PP micro-batches cover all #RD):
///     #D = ceil(#RD / #PP);              max_decode_tokens = min(#D, cap)
///
///   prefill, KV_free = s.num_free_kv_blocks / s.num_total_kv_blocks
///   (clamped to [0, 1]; 1 when num_total_kv_blocks <= 0, i.e. no KV limit known):
///     #WP = 0                 -> #P = 0 (nothing to prefill, §3.1)
///     KV_free < KV_thresh     -> #P = 0 (prefill suspended, §3.1.3)
///     otherwise (eq. 3):
///       #P = max(min(floor(#WP / #T),
///                    floor(#MaxP * (KV_free - KV_thresh) / (1 - KV_thresh))),
///                #MinP)
///   max_prefill_tokens = min(#P, #WP, cap - max_decode_tokens)
///
/// The paper gives eq. 1–4 over the reals; the floors (and the ceil of eq. 4)
/// are this implementation's integer rounding. Clamping #P to #WP changes
/// nothing that is scheduled (there is no more to prefill); clamping to the
/// cap keeps decodes-first within the engine's per-step limit.
class TokenThrottling final : public TokenBudgetPolicy {
 public:
  /// Precondition: params.validate() is ok (make_token_budget_policy checks);
  /// out-of-range values are clamped into range here.
  explicit TokenThrottling(TokenThrottlingParams params = {});

  [[nodiscard]] MicroBatchBudget budget(const SchedulerState& state) const override;
  /// "throttle".
  [[nodiscard]] const char* name() const override { return "throttle"; }
  [[nodiscard]] const TokenThrottlingParams& params() const { return p_; }

  /// Eq. 1 (WT only): min(max(floor(#WP / #T), #MinP), #MaxP) tokens.
  [[nodiscard]] int prefill_by_waiting(int waiting_prefill_tokens) const;
  /// Eq. 2 (UT only): max(floor(#MaxP * KV_free), #MinP) tokens; KV_free in [0, 1].
  [[nodiscard]] int prefill_by_kv_free(double kv_free) const;
  /// Eq. 3 with the §3.1.3 threshold: 0 when #WP = 0 or KV_free < KV_thresh,
  /// else max(min(floor(#WP / #T), floor(#MaxP * (KV_free - KV_thresh) /
  /// (1 - KV_thresh))), #MinP) tokens (not yet clamped to #WP or the cap).
  [[nodiscard]] int prefill_tokens(int waiting_prefill_tokens, double kv_free) const;
  /// Eq. 4: ceil(#RD / #PP) decode tokens (#PP < 1 read as 1).
  [[nodiscard]] static int decode_tokens(int running_decode_seqs, int pipeline_depth);

 private:
  TokenThrottlingParams p_;
};

}  // namespace shardline::engine
