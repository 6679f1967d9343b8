#pragma once
/// \file
/// Seesaw's phase policy (seed 000, §4.2 "Tiered KV cache buffering and
/// transition-minimizing scheduling", Fig. 2 and Fig. 6). A Seesaw engine
/// group runs *phases*: pure prefill under the prefill config cp, pure decode
/// under the decode config cd. Every transition re-shards the model (§4.1),
/// so when to transition is the policy. KV moves through a host-memory KV
/// buffer (the tiered KV cache): prefill offloads each prefilled prompt's KV
/// into it, decode onboards sequences by swapping their KV in from it.
///
/// The policy is a pure function of counts the scheduler fills
/// (SeesawCounts): before each micro-batch the engine calls plan(); when the
/// plan's phase differs from the current one the engine drains the pipeline,
/// transitions (offloads every resident sequence, switches the config) and
/// calls on_transition(). Three schedules:
///
/// **transition-minimizing** (§4.2, Fig. 2c; the default):
///
///   prefill: stay while a prompt is part-way through its prefill, or while
///            the head prompt fits the host buffer's room;
///            -> decode when it does not ("the CPU KV storage is fully
///            utilized") or no prompt is left, if anything waits to decode.
///   decode:  stay while the host buffer holds prefilled sequences
///            (continuous batching, "keeping GPU KV cache fully utilized");
///            -> prefill once the host buffer is empty ("the entire CPU KV
///            cache has been transferred to GPU memory") and a prompt waits;
///            with no prompt waiting, stay and decode the tail to the end.
///
/// **prefill-prioritizing** (Fig. 2a; vLLM's eager prefill, with re-sharding):
///
///   decode:  -> prefill as soon as the host buffer is empty (vLLM runs
///            swapped sequences before new prompts) and the head prompt's
///            blocks(P+1) fit the device's free blocks above the watermark;
///   prefill: as above, but the phase admits at most the device's free KV
///            tokens above the watermark, snapshotted at the transition, so
///            the new prompts fit beside the decodes that come back.
///
/// **decode-prioritizing** (Fig. 2b; FasterTransformer's static batching):
///
///   prefill: as above, but the phase admits at most the device's KV
///            capacity (total_blocks · block_size tokens): one batch;
///   decode:  -> prefill only when every sequence has finished decoding
///            (nothing resident, nothing in the host buffer).
///
/// Rules common to all three, which keep the engine from stalling or
/// flapping:
///  - decode -> prefill when nothing is left to decode (no decode resident,
///    host buffer empty) and a prompt waits;
///  - decode -> prefill only if the head prompt still fits the host buffer
///    after the transition offloads every resident decode into it
///    (room − running_decode_tokens); otherwise the new prefill phase could
///    admit nothing and would flip straight back. So the first plan after a
///    transition (made from the counts after the offloads) keeps the new
///    phase;
///  - prefill -> decode never while a prompt is part-way through its prefill
///    (a transition would offload a partial prefill);
///  - a prefill phase with prompts waiting, none fitting and nothing to decode
///    stays (reason `blocked`): the engine must refuse such budgets up front
///    (a prompt larger than the host buffer).
///
/// Units: KV tokens (positions of one sequence's KV, all layers and heads;
/// the host buffer's byte budget divided by bytes per token) and device
/// blocks of `block_size` tokens. The watermark is vLLM's: floor(1 % of the
/// device blocks).
///
/// Not thread-safe, no threads, no clock: the engine thread owns one.

#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>

#include "common/result.hpp"

namespace shardline::engine {

/// Which config the group runs: cp (prefill) or cd (decode).
enum class SeesawPhase { prefill, decode };

/// "prefill" or "decode".
[[nodiscard]] const char* to_string(SeesawPhase phase) noexcept;

/// When to transition between the phases (Fig. 2).
enum class SeesawSchedule {
  transition_minimizing,  ///< "transition-minimizing" (§4.2, Fig. 2c)
  prefill_prioritizing,   ///< "prefill-prioritizing" (Fig. 2a, baseline)
  decode_prioritizing,    ///< "decode-prioritizing" (Fig. 2b, baseline)
};

/// "transition-minimizing", "prefill-prioritizing" or "decode-prioritizing".
[[nodiscard]] const char* to_string(SeesawSchedule schedule) noexcept;
/// Parses the names to_string() gives (exact, lower case).
/// Errors: invalid_argument naming the text and the choices.
[[nodiscard]] Result<SeesawSchedule> parse_seesaw_schedule(std::string_view text);

/// Options (`--seesaw-policy`, `--seesaw-min-prefill-prompts`). The two knobs
/// apply to transition-minimizing only; the baselines follow Fig. 2 as drawn.
struct SeesawPolicyOptions {
  SeesawSchedule schedule = SeesawSchedule::transition_minimizing;
  /// decode -> prefill needs at least this many waiting prompts (while
  /// decodes remain; with nothing left to decode one prompt suffices).
  /// >= 1; 1 is the paper's rule.
  int min_prefill_prompts = 1;
  /// decode -> prefill also needs the device blocks in use to be at most
  /// this fraction of the device's blocks: 1.0 (the paper) leaves decode as
  /// soon as the host buffer is empty, 0.0 waits until every resident decode
  /// has finished. In [0, 1].
  double decode_drain_fraction = 1.0;

  /// ok, or invalid_argument naming the option and its allowed range.
  [[nodiscard]] Status validate() const;
};

/// What the scheduler reports before each micro-batch (all >= 0). A "prompt"
/// is a waiting sequence that needs (more) prefill; a "host-ready" sequence
/// is a waiting one whose prefill is done and whose KV is in the host buffer.
struct SeesawCounts {
  long long waiting_prompts = 0;
  /// The head waiting prompt's num_tokens (P); 0 when none waits.
  long long head_prompt_tokens = 0;
  /// KV tokens admitting the head prompt adds to the host buffer: P minus
  /// what the buffer already holds of it (a partly swapped prompt counts only
  /// its extra tokens). 0 when none waits.
  long long head_prompt_extra_tokens = 0;
  /// Running sequences whose prefill is not finished (chunked prefill).
  long long prefilling_seqs = 0;
  /// Running sequences whose prefill is done (resident decodes; in flight
  /// included), and the KV tokens they hold: what a transition offloads.
  long long running_decode_seqs = 0;
  long long running_decode_tokens = 0;
  /// Host-ready sequences (waiting, prefilled, KV in the host buffer).
  long long host_ready_seqs = 0;
  /// Host buffer, in KV tokens: held (chunks in it), reserved (by running
  /// prefills, which offload into it when they finish, and in a prefill
  /// phase by running decodes, just prefilled, which the next schedule
  /// offloads), capacity.
  long long host_held_tokens = 0;
  long long host_reserved_tokens = 0;
  long long host_capacity_tokens = 0;
  /// KV tokens the current phase has admitted so far (reset at a transition).
  long long phase_admitted_tokens = 0;
  /// Device KV blocks: free, total, and tokens per block (>= 1).
  long long free_blocks = 0;
  long long total_blocks = 0;
  long long block_size = 1;
};

/// Why a plan is what it is (for logs, stats and tests).
enum class SeesawReason {
  // prefill, staying
  prefilling,   ///< a prompt is part-way through its prefill
  prompt_fits,  ///< the head prompt fits what the phase may still admit
  idle,         ///< no prompt waits and nothing waits to decode
  blocked,      ///< prompts wait, none fits, nothing to decode: no progress
  // prefill -> decode
  phase_full,  ///< the head prompt does not fit: host buffer full (or the phase cap reached)
  no_prompts,  ///< no prompt waits (in decode: the tail, stay)
  // decode, staying
  host_not_empty,   ///< host-ready sequences remain to be swapped in
  too_few_prompts,  ///< fewer than min_prefill_prompts wait
  device_busy,      ///< TM: device use above decode_drain_fraction; PP: the head prompt does not fit the device
  no_host_room,     ///< the head prompt would not fit the host once the resident decodes are offloaded
  decoding,         ///< DP: decodes remain
  // decode -> prefill
  host_empty,          ///< TM: the host buffer is empty and a prompt waits
  prompt_fits_device,  ///< PP: the head prompt fits the device's free blocks
  decodes_finished,    ///< nothing left to decode and a prompt waits
};

/// "prefilling", "prompt-fits", ... (the enumerator with '-' for '_').
[[nodiscard]] const char* to_string(SeesawReason reason) noexcept;

/// The phase to run the next micro-batch in.
struct SeesawPlan {
  SeesawPhase phase = SeesawPhase::prefill;
  /// KV tokens the scheduler may still admit into the host buffer in this
  /// phase (>= 0): in prefill, min(host room, phase cap − phase admitted)
  /// with host room = capacity − held − reserved; in decode, the host room
  /// (what swap-outs may use). 0 when the plan changes the phase: the
  /// transition moves KV, so plan again after on_transition().
  long long admit_kv_tokens = 0;
  SeesawReason reason = SeesawReason::idle;

  friend bool operator==(const SeesawPlan&, const SeesawPlan&) = default;
};

class SeesawPolicy {
 public:
  /// No phase cap (transition-minimizing's prefill).
  static constexpr long long kNoCap = std::numeric_limits<long long>::max();

  /// Starts in prefill (Fig. 6: the warm-up prefill fills the host buffer).
  /// Errors: what options.validate() returns.
  [[nodiscard]] static Result<SeesawPolicy> create(const SeesawPolicyOptions& options);

  /// The plan for the next micro-batch. Pure: changes nothing, so the engine
  /// may call it repeatedly while it drains in-flight micro-batches.
  [[nodiscard]] SeesawPlan plan(const SeesawCounts& counts) const;

  /// Records a transition to `to` (a call with the current phase changes
  /// nothing). `counts`: the counts the plan that chose `to` was made from,
  /// taken before the transition offloads anything (prefill-prioritizing
  /// snapshots the device's free blocks from them; decode-prioritizing, the
  /// device capacity).
  void on_transition(SeesawPhase to, const SeesawCounts& counts);

  [[nodiscard]] SeesawPhase phase() const { return phase_; }
  /// Transitions recorded so far (both directions).
  [[nodiscard]] std::uint64_t transitions() const { return transitions_; }
  /// KV tokens the current prefill phase may admit in all (kNoCap: none),
  /// given `counts` (the initial phase has no snapshot and uses them).
  [[nodiscard]] long long prefill_cap_tokens(const SeesawCounts& counts) const;
  /// vLLM's watermark: floor(1 % of total_blocks).
  [[nodiscard]] static long long watermark_blocks(const SeesawCounts& counts);
  [[nodiscard]] const SeesawPolicyOptions& options() const { return options_; }

 private:
  explicit SeesawPolicy(const SeesawPolicyOptions& options) : options_(options) {}
  [[nodiscard]] SeesawPlan plan_prefill(const SeesawCounts& c) const;
  [[nodiscard]] SeesawPlan plan_decode(const SeesawCounts& c) const;
  /// The prefill cap a transition to prefill made from `c` would snapshot.
  [[nodiscard]] long long cap_at_transition(const SeesawCounts& c) const;

  SeesawPolicyOptions options_;
  SeesawPhase phase_ = SeesawPhase::prefill;
  std::uint64_t transitions_ = 0;
  std::optional<long long> cap_snapshot_;  ///< set by the last decode -> prefill
};

/// Pipelined decode (§5.1): when the decode config has `pipeline_depth`
/// stages, each decode micro-batch takes 1/PP of the decodes the device
/// can run now, so the stages work on different sequences at once:
/// ceil(R / PP) decode tokens, R = the resident decodes (in flight or not)
/// plus the host-ready sequences the device can onboard now (up to
/// `max_num_seqs` running). Without the second term a cap computed before
/// the admissions would starve them. At least 1; R itself when
/// pipeline_depth <= 1.
[[nodiscard]] int pipelined_decode_tokens(const SeesawCounts& counts, int max_num_seqs, int pipeline_depth);

}  // namespace shardline::engine
