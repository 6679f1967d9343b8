#pragma once
/// \file
/// Continuous batching at iteration level (Orca, OSDI'22) with chunked
/// prefill under a per-step token budget (Sarathi-Serve, OSDI'24) over a
/// paged KV cache with preemption by recompute (vLLM / PagedAttention, SOSP'23).
///
/// Each `schedule()`: running sequences first, in arrival order (a decode is 1
/// token; a sequence still prefilling continues with its next chunk); then
/// waiting sequences are admitted FCFS while `max_num_seqs`, the token budget
/// and free KV blocks allow, the last admitted prompt chunked to fit the budget.
/// When a running sequence cannot get a block, the most recently arrived
/// running sequence is preempted: its blocks are freed, num_computed_tokens
/// reset to 0 and it goes back to the waiting queue ahead of everything that
/// arrived later; its generated tokens are kept and re-prefilled. A plain
/// single-threaded class.

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/result.hpp"
#include "engine/block_manager.hpp"
#include "engine/sequence.hpp"
#include "model/executor.hpp"
#include "engine/policies/token_budget.hpp"

namespace shardline::engine {

struct SchedulerConfig {
  int max_num_seqs = 256;              ///< running sequences at most
  int max_num_batched_tokens = 2048;   ///< tokens per step at most (prefill chunks + decodes)
  int max_model_len = 4096;            ///< prompt + output tokens at most
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

  /// Plans one step (micro-batch). Empty when nothing is schedulable.
  /// Sequences in flight (an earlier micro-batch not yet updated) are
  /// skipped and never preempted. `limits` (a TokenBudgetPolicy's answer)
  /// caps decode and prefill tokens separately, under max_num_batched_tokens;
  /// null = one shared budget of max_num_batched_tokens.
  [[nodiscard]] SchedulerOutput schedule(const MicroBatchBudget* limits = nullptr);
  /// What a token budget policy needs (#WP, #RD, KV blocks) for a pipeline of
  /// `pipeline_depth` micro-batches.
  [[nodiscard]] SchedulerState state(int pipeline_depth) const;

  /// Applies a step: clears in_flight and advances num_computed_tokens of every scheduled sequence
  /// and appends `sampled[i]` to the i-th sequence with needs_logits (in
  /// logits_rows order). Does not check stops.
  void update(const SchedulerOutput& out, std::span<const std::int32_t> sampled);

  /// Removes a sequence (any state), frees its blocks, marks it finished with
  /// `reason` and hands it back. nullptr when unknown.
  [[nodiscard]] std::unique_ptr<Sequence> finish(std::uint64_t seq_id, FinishReason reason);

  [[nodiscard]] Sequence* get(std::uint64_t seq_id);
  [[nodiscard]] bool has_unfinished() const { return !seqs_.empty(); }
  [[nodiscard]] int num_waiting() const { return static_cast<int>(waiting_.size()); }
  [[nodiscard]] int num_running() const { return static_cast<int>(running_.size()); }
  [[nodiscard]] const BlockManager& block_manager() const { return blocks_; }
  [[nodiscard]] const SchedulerConfig& config() const { return config_; }
  [[nodiscard]] int total_preemptions() const { return total_preemptions_; }

  /// Block-manager integrity plus: running tables cover num_computed_tokens,
  /// waiting sequences hold no blocks, running <= max_num_seqs. Errors: internal.
  [[nodiscard]] Status check_integrity() const;

 private:
  /// The newest running sequence not in flight (nullptr if none).
  [[nodiscard]] Sequence* last_preemptible() const;
  void preempt(Sequence* victim);
  void insert_by_arrival(std::deque<Sequence*>& queue, Sequence* seq);
  void insert_by_arrival(std::vector<Sequence*>& queue, Sequence* seq);

  SchedulerConfig config_;
  BlockManager blocks_;
  std::unordered_map<std::uint64_t, std::unique_ptr<Sequence>> seqs_;
  std::deque<Sequence*> waiting_;   ///< sorted by arrival
  std::vector<Sequence*> running_;  ///< sorted by arrival
  std::uint64_t next_arrival_ = 0;
  int total_preemptions_ = 0;
};

}  // namespace shardline::engine
