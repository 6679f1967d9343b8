#pragma once
/// \file
/// Continuous batching at iteration level (Orca, OSDI'22) with chunked
/// prefill under a per-step token budget (Sarathi-Serve, OSDI'24) over a
/// paged KV cache with preemption by recompute (vLLM / PagedAttention, SOSP'23)
/// or by swapping (DéjàVu's microbatch swapping, seed 003 §4.2.2).
///
/// Each `schedule()`: running sequences first, in arrival order (a decode is 1
/// token; a sequence still prefilling continues with its next chunk); then
/// waiting sequences are admitted FCFS while `max_num_seqs`, the token budget
/// and free KV blocks allow, the last admitted prompt chunked to fit the budget.
/// When a running sequence cannot get a block, the most recently arrived
/// running sequence is preempted: its blocks are freed, num_computed_tokens
/// reset to 0 and it goes back to the waiting queue ahead of everything that
/// arrived later; its generated tokens are kept. With preemption by
/// recompute they are re-prefilled; with preemption by swap the schedule
/// lists the victim's blocks in `swap_outs` (the engine copies that KV to
/// host memory before the step runs) and, when the sequence is admitted
/// again, its restored positions in `restores` (the engine copies the KV
/// back into the new blocks before the step runs): only the tokens after
/// them are computed. A plain single-threaded class.

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/result.hpp"
#include "engine/block_manager.hpp"
#include "engine/prefix_tier.hpp"
#include "engine/sequence.hpp"
#include "model/executor.hpp"
#include "engine/policies/seesaw_policy.hpp"
#include "engine/policies/token_budget.hpp"

namespace shardline::engine {

/// What a preemption does with the victim's KV.
enum class PreemptionMode {
  recompute,  ///< drop it; recompute prompt + generated tokens on readmission (vLLM)
  swap,       ///< copy it to host memory and back on readmission (DéjàVu §4.2.2)
};

/// "recompute" / "swap".
[[nodiscard]] const char* preemption_mode_name(PreemptionMode mode) noexcept;
/// Parses "recompute" / "swap". Errors: invalid_argument naming the choices.
[[nodiscard]] Result<PreemptionMode> parse_preemption_mode(const std::string& name);

/// Which steps the scheduler builds (Seesaw, seed 000 §4.2: a cluster that
/// alternates between a prefill config and a decode config runs phases of
/// pure prefill and pure decode, with a host KV buffer between them).
enum class SchedulePhase {
  mixed,    ///< continuous batching: decodes and prompt chunks in one step (Orca / Sarathi-Serve)
  /// Prompt chunks only. A running sequence whose prefill is done (its first
  /// token sampled) is offloaded: its KV is to be copied to the host KV
  /// buffer (SchedulerOutput::offloads) and it waits, KvPending::offloading,
  /// holding its blocks until offload_done() (the copy runs on Seesaw's
  /// prefetcher thread while later steps compute, §5.2); then it is
  /// decode-ready. Decode-ready waiting sequences are not admitted.
  prefill,
  /// Decodes only. Decode-ready waiting sequences get blocks while there are
  /// free ones and sequence slots, and their KV is to be copied in
  /// (SchedulerOutput::onboards: the prefetcher's swap-in, §5.2); they run,
  /// KvPending::onboarding, and decode from the first schedule after
  /// onboard_done(). Sequences that still need prefill wait for the next
  /// prefill phase.
  decode,
};

/// "mixed" / "prefill" / "decode".
[[nodiscard]] const char* schedule_phase_name(SchedulePhase phase) noexcept;

struct SchedulerConfig {
  int max_num_seqs = 256;              ///< running sequences at most
  int max_num_batched_tokens = 2048;   ///< tokens per step at most (prefill chunks + decodes)
  int max_model_len = 4096;            ///< prompt + output tokens at most
  PreemptionMode preemption_mode = PreemptionMode::recompute;
  /// Automatic prefix caching (engine/prefix_cache.hpp): a new sequence
  /// (nothing to restore) starts from the named blocks its prompt leads
  /// with; its full blocks are named as they are computed. Off here; the
  /// engine's default is on (EngineConfig).
  PrefixCacheConfig prefix_cache{false, 0};
};

/// A swap preemption: the KV the victim had computed, to be copied out
/// before the step runs (its blocks are free from now on).
struct SwapOut {
  std::uint64_t seq_id = 0;
  std::vector<std::int32_t> block_table;  ///< the victim's blocks at preemption
  int num_tokens = 0;                     ///< positions [0, num_tokens) to copy out
};

/// A readmitted sequence whose KV positions [0, num_tokens) the engine must
/// copy into its (new) blocks before the step runs.
struct KvRestore {
  std::uint64_t seq_id = 0;
  int num_tokens = 0;
};

/// Prefix caching's copy-on-write of a shared block's head: positions
/// [token_begin, token_begin + num_tokens) of `seq_id` (all in its block
/// token_begin / block_size) equal those of the named block `src_block`,
/// which another sequence computed; the engine copies their KV from it into
/// the sequence's own block before the step runs, and the sequence computes
/// from token_begin + num_tokens on. `src_block` stays pinned until the next
/// schedule().
struct PrefixCopy {
  std::uint64_t seq_id = 0;
  std::int32_t src_block = -1;
  int token_begin = 0;  ///< a multiple of block_size
  int num_tokens = 0;   ///< < block_size
};

/// Blocks of a new sequence's prompt fetched from a prefix tier at its
/// admission (engine/prefix_tier.hpp): blocks[i] is the canonical chunk of
/// all layers x positions [token_begin + i * block_size, + block_size); the
/// engine copies them into the sequence's own blocks before the step runs
/// (after the spills). token_begin is where its device hit ends.
struct TierRestore {
  std::uint64_t seq_id = 0;
  int token_begin = 0;
  std::vector<std::vector<std::byte>> blocks;
};

/// One sequence's share of a step.
struct ScheduledSeq {
  Sequence* seq = nullptr;
  int num_new_tokens = 0;
};

/// Builds the flattened StepInput for `scheduled` (token ids, absolute
/// positions, slot_mapping from the block tables, logits_rows for sequences
/// whose chunk reaches their last known token).
[[nodiscard]] model::StepInput make_step_input(std::span<const ScheduledSeq> scheduled, const BlockManager& blocks);

struct SchedulerOutput {
  std::vector<ScheduledSeq> scheduled;  ///< same order as input.seqs
  model::StepInput input;
  int num_prefill_tokens = 0;  ///< prompt / recompute tokens
  int num_decode_tokens = 0;   ///< single-token steps on a generated token
  int num_preemptions = 0;     ///< sequences preempted while building this step
  std::vector<SwapOut> swap_outs;   ///< swap preemptions of this step, in order
  std::vector<KvRestore> restores;  ///< admissions that restore KV instead of recomputing it
  /// Prefill phase: sequences whose prefill is done, their KV to be copied
  /// to the host KV buffer (they hold their blocks until offload_done). Not
  /// preemptions: nothing is counted as one.
  std::vector<SwapOut> offloads;
  /// Partial-block prefix hits to copy before the step runs (before any
  /// other KV move), in admission order.
  std::vector<PrefixCopy> prefix_copies;
  /// With a prefix tier (set_prefix_spill): named blocks evicted by this
  /// schedule, whose KV is to be copied out to the tier before any other KV
  /// move (the step, or a restore, may write the blocks again).
  std::vector<NamedBlock> prefix_spills;
  /// With a prefix tier: admissions whose next blocks came from it.
  std::vector<TierRestore> tier_restores;
  /// Decode phase: decode-ready sequences given blocks, whose held KV
  /// positions [0, num_tokens) are to be copied in before onboard_done().
  std::vector<KvRestore> onboards;
  /// No step to run (KV moves may still be listed).
  [[nodiscard]] bool empty() const { return scheduled.empty(); }
};

class Scheduler {
 public:
  /// `config` must have positive limits (the engine validates them).
  Scheduler(SchedulerConfig config, int num_kv_blocks, int block_size);

  /// Queues a sequence (status waiting; `arrival` assigned here). Errors:
  /// invalid_argument (duplicate id, empty prompt, prompt > max_model_len),
  /// out_of_memory (prompt + max_tokens can never fit the whole KV cache).
  [[nodiscard]] Status add(std::unique_ptr<Sequence> seq);
  /// Prefix caching: whether an admission may also copy the KV of a named
  /// block's leading tokens that its next tokens match (PrefixCopy), so a
  /// shared prefix that ends mid-block, or a prompt whose last block another
  /// request computed, is not computed again (off by default; the engine
  /// turns it on when its caches can be copied).
  void set_partial_block_copies(bool on) noexcept { partial_block_copies_ = on; }
  /// Prefix caching with a tier below it (null: none; it must outlive its
  /// use here): named blocks evicted from now on are listed in
  /// SchedulerOutput::prefix_spills, and an admission whose next full
  /// blocks after its device hit are not cached, nor being computed, takes
  /// those the tier has (SchedulerOutput::tier_restores), while the epoch
  /// is 0 (a tier's names are epoch 0's). A tier that keeps shared
  /// blocks (PrefixTier::keeps_shared_blocks) also gets each named block
  /// the first time a second sequence shares it.
  void set_prefix_tier(PrefixTier* tier) noexcept {
    tier_ = tier;
    blocks_.set_spill(tier != nullptr);
    blocks_.set_spill_shared(tier != nullptr && tier->keeps_shared_blocks());
  }
  /// Switches how later preemptions treat the victim's KV.
  void set_preemption_mode(PreemptionMode mode) noexcept { config_.preemption_mode = mode; }

  /// Plans one step (micro-batch). Empty when nothing is schedulable.
  /// Sequences in flight (an earlier micro-batch not yet updated) are
  /// skipped and never preempted. `limits` (a TokenBudgetPolicy's answer)
  /// caps decode and prefill tokens separately, under max_num_batched_tokens;
  /// null = one shared budget of max_num_batched_tokens.
  /// In the prefill phase, `admit_kv_tokens` >= 0 caps the KV tokens
  /// (num_tokens() each) of the sequences admitted by this call: the room
  /// left in the host KV buffer they will be offloaded to; < 0: no cap.
  [[nodiscard]] SchedulerOutput schedule(const MicroBatchBudget* limits = nullptr, long long admit_kv_tokens = -1);

  /// Seesaw: the kind of steps schedule() builds from now on (mixed by default).
  /// (Resets the KV tokens admitted in the phase.) A change of phase is a
  /// change of parallel config, which lays the KV memory out its own way:
  /// the prefix cache starts a new epoch (no block named before is a hit).
  void set_phase(SchedulePhase phase) noexcept {
    if (phase != phase_) blocks_.new_prefix_epoch();
    phase_ = phase;
    phase_admitted_tokens_ = 0;
  }
  [[nodiscard]] SchedulePhase phase() const noexcept { return phase_; }
  /// A transition: every running sequence leaves the device. One with
  /// computed KV is offloaded (appended to `offloads`, to be copied to the
  /// host KV buffer; it waits, KvPending::offloading, with
  /// num_restore_tokens = its computed tokens, until offload_done), one
  /// without goes back to waiting. Errors: invalid_argument when a sequence
  /// is in flight (drain the pipeline first) or has a KV copy pending
  /// (drain the mover first); nothing moved.
  [[nodiscard]] Status offload_resident(std::vector<SwapOut>& offloads);
  /// The copy of an offloaded sequence's KV finished: its device blocks are
  /// freed. `kept` false: the host buffer had no room, so nothing is held
  /// and it is prefilled again. Errors: not_found (unknown id),
  /// invalid_argument (no offload pending for it).
  [[nodiscard]] Status offload_done(std::uint64_t seq_id, bool kept);
  /// The copy of an onboarding sequence's KV finished: it decodes from the
  /// next schedule. Errors: not_found, invalid_argument (no onboard pending).
  [[nodiscard]] Status onboard_done(std::uint64_t seq_id);
  /// A waiting sequence whose prompt is prefilled and whose KV is held
  /// outside the cache up to its last token (no copy pending): the decode
  /// phase admits it.
  [[nodiscard]] static bool is_decode_ready(const Sequence& seq) {
    return seq.status == SeqStatus::waiting && seq.kv_pending == KvPending::none && seq.num_output_tokens() > 0 &&
           seq.num_restore_tokens == seq.num_tokens() - 1;
  }
  /// What Seesaw's phase policy decides from (engine/policies/seesaw_policy.hpp),
  /// with the host KV buffer's held and capacity KV tokens as the engine
  /// knows them.
  [[nodiscard]] SeesawCounts seesaw_counts(long long host_held_tokens, long long host_capacity_tokens) const;
  /// Sequences offloaded so far (prefill ends and transitions).
  [[nodiscard]] int total_offloads() const { return total_offloads_; }
  /// What a token budget policy needs (#WP, #RD, KV blocks) for a pipeline of
  /// `pipeline_depth` micro-batches.
  [[nodiscard]] SchedulerState state(int pipeline_depth) const;

  /// Applies a step: clears in_flight and advances num_computed_tokens of every scheduled sequence
  /// and appends `sampled[i]` to the i-th sequence with needs_logits (in
  /// logits_rows order). Does not check stops.
  void update(const SchedulerOutput& out, std::span<const std::int32_t> sampled);

  /// Removes a sequence (any state), frees its blocks, marks it finished with
  /// `reason` and hands it back. nullptr when unknown. The caller makes sure
  /// no KV copy of it is pending (its blocks would be reused under the copy).
  [[nodiscard]] std::unique_ptr<Sequence> finish(std::uint64_t seq_id, FinishReason reason);

  [[nodiscard]] Sequence* get(std::uint64_t seq_id);
  /// The same, read-only (null when unknown or finished).
  [[nodiscard]] const Sequence* find(std::uint64_t seq_id) const;
  [[nodiscard]] bool has_unfinished() const { return !seqs_.empty(); }
  [[nodiscard]] int num_waiting() const { return static_cast<int>(waiting_.size()); }
  [[nodiscard]] int num_running() const { return static_cast<int>(running_.size()); }
  [[nodiscard]] const BlockManager& block_manager() const { return blocks_; }
  [[nodiscard]] const SchedulerConfig& config() const { return config_; }
  [[nodiscard]] int total_preemptions() const { return total_preemptions_; }
  /// Prefix caching's counters, in tokens (vLLM's prefix cache queries and
  /// hits): the tokens of every sequence admitted with nothing to restore,
  /// and those of them found cached.
  [[nodiscard]] long long prefix_query_tokens() const { return prefix_query_tokens_; }
  [[nodiscard]] long long prefix_hit_tokens() const { return prefix_hit_tokens_; }
  /// Admissions put off because the request's next block was being
  /// computed by a running sequence (ComputingPrefixes).
  [[nodiscard]] long long prefix_waits() const { return prefix_waits_; }

  /// Block-manager integrity plus: running tables cover num_computed_tokens,
  /// waiting sequences hold no blocks (but those being offloaded), running
  /// <= max_num_seqs. Errors: internal.
  [[nodiscard]] Status check_integrity() const;

 private:
  /// The newest running sequence not in flight and with no KV copy pending
  /// (nullptr if none).
  [[nodiscard]] Sequence* last_preemptible() const;
  void preempt(Sequence* victim, SchedulerOutput& out);
  /// Moves a running sequence not in flight off the device (its computed KV,
  /// if any, listed in `offloads`; its blocks held until offload_done).
  void offload(Sequence* seq, std::vector<SwapOut>& offloads);
  /// Decode phase: gives decode-ready waiting sequences blocks for their
  /// held KV and their last token, FCFS while blocks and slots last, and
  /// lists them in `out.onboards` (KvPending::onboarding).
  void onboard_decode_ready(SchedulerOutput& out);
  void insert_by_arrival(std::deque<Sequence*>& queue, Sequence* seq);
  void insert_by_arrival(std::vector<Sequence*>& queue, Sequence* seq);

  SchedulerConfig config_;
  BlockManager blocks_;
  std::unordered_map<std::uint64_t, std::unique_ptr<Sequence>> seqs_;
  std::deque<Sequence*> waiting_;   ///< sorted by arrival
  std::vector<Sequence*> running_;  ///< sorted by arrival
  std::uint64_t next_arrival_ = 0;
  int total_preemptions_ = 0;
  int total_offloads_ = 0;
  long long prefix_query_tokens_ = 0;
  long long prefix_hit_tokens_ = 0;
  long long prefix_waits_ = 0;
  ComputingPrefixes computing_;  ///< prefix caching: blocks running sequences are computing
  bool partial_block_copies_ = false;
  PrefixTier* tier_ = nullptr;
  long long phase_admitted_tokens_ = 0;  ///< KV tokens (num_tokens) admitted since set_phase
  SchedulePhase phase_ = SchedulePhase::mixed;
};

}  // namespace shardline::engine
