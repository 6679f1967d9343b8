#pragma once
/// \file
/// The engine's KV movement between its executor's paged caches and host
/// memory, over DéjàVuLib (kvstore/kv_stream.hpp): the *cache manager* of a
/// DéjàVu worker (seed 003 §4, Fig. 5). It
///  - swaps a preempted sequence's KV out to a host swap space and back in
///    when the sequence is readmitted (microbatch swapping, §4.2.2; the swap
///    space is vLLM's `--swap-space`: a byte budget, beyond which a
///    preemption falls back to recompute);
///  - holds the KV a resumed request brings from a KV store until the
///    scheduler admits it (recovery from the last replicated token, §4.2.3);
///  - copies out each step's new KV of a sequence as one canonical chunk
///    for token streaming (§4.1.1 (3)).
/// Every copy is split at the source and merged at the destination by
/// copy_out / copy_in, so it works for any engine group whose caches are
/// host-addressable (a CPU device, an in-process TP / SP / PP group).
/// A plain single-threaded class owned by the LlmEngine.

#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "common/result.hpp"
#include "engine/kv_transfer.hpp"
#include "engine/scheduler.hpp"
#include "kvstore/kv_stream.hpp"
#include "model/executor.hpp"

namespace shardline::engine {

/// Counters of the cache manager (monotonic).
struct KvIoStats {
  std::uint64_t swap_outs = 0;            ///< preemptions whose KV went to the swap space
  std::uint64_t swap_ins = 0;             ///< readmissions that copied it back
  std::uint64_t swap_fallbacks = 0;       ///< swap preemptions that recomputed instead (no room, no views)
  std::uint64_t swapped_out_bytes = 0;    ///< bytes copied to the swap space
  std::uint64_t swapped_in_bytes = 0;     ///< bytes copied back
  std::uint64_t restored_tokens = 0;      ///< KV positions restored from a KV store (resumed requests)
  std::uint64_t resume_fallbacks = 0;     ///< resumed requests whose KV could not be restored (recomputed)
  /// Positions resumed requests had computed before (prompt + generated
  /// tokens - 1) that were not restored: computed again, counted when the
  /// request is restored (or when it falls back to recompute).
  std::uint64_t resume_recomputed_tokens = 0;
  std::uint64_t streamed_bytes = 0;       ///< bytes copied out for token streaming
  std::uint64_t offloads = 0;              ///< Seesaw: prefilled sequences whose KV went to the host KV buffer
  std::uint64_t offload_fallbacks = 0;     ///< ... that did not fit it (they are prefilled again)
  std::uint64_t offloaded_bytes = 0;       ///< bytes copied to the host KV buffer
  std::uint64_t onboards = 0;              ///< restores of offloaded KV (the decode phase swapping sequences in)
  std::uint64_t onboarded_bytes = 0;
  std::uint64_t prefix_copied_tokens = 0;  ///< prefix caching: positions copied from another's block (copy_prefix)
  std::uint64_t prefix_tier_spilled_blocks = 0;  ///< evicted named blocks copied out to a PrefixTier
  std::uint64_t prefix_tier_restored_tokens = 0;  ///< positions restored from a PrefixTier instead of computed
  std::uint64_t swap_space_bytes_used = 0;  ///< now, not monotonic (swap space and host KV buffer)
};

class KvCacheIo {
 public:
  /// `executor` must outlive this object. `swap_space_bytes`: host memory
  /// for swapped-out KV.
  KvCacheIo(model::ModelExecutor& executor, std::uint64_t swap_space_bytes);

  /// True when the executor's caches are host-addressable views, or its
  /// KvCopier supports streaming (a CUDA device's): what DéjàVu's per-step
  /// streaming and resumed-KV restores need.
  [[nodiscard]] bool can_move_kv() const noexcept {
    return !views_.empty() || (remote_ != nullptr && remote_->supports_streaming());
  }
  /// True when whole sequences' KV can be copied out and back: views, or
  /// the executor's KvCopier (a TCP group's ranks copy their own share on
  /// request). Swap preemption and Seesaw's host KV buffer need this.
  [[nodiscard]] bool can_copy_kv() const noexcept { return !views_.empty() || remote_ != nullptr; }
  [[nodiscard]] const kvstore::KvModelShape& shape() const noexcept { return shape_; }
  /// False when the executor's copier moves no data (the simulator's): held
  /// chunks are then empty and only their byte counts are kept.
  [[nodiscard]] bool copies_bytes() const noexcept { return !views_.empty() || remote_ == nullptr || remote_->copies_bytes(); }
  /// Bytes of `num_tokens` positions of one sequence (all layers).
  [[nodiscard]] std::size_t bytes_for(int num_tokens) const noexcept;

  /// Copies a swap preemption's KV into the swap space. False (and nothing
  /// kept) when it does not fit the budget or the caches cannot be copied:
  /// the caller then recomputes the sequence. Errors: internal (a copy
  /// failed on a valid table: a bug).
  [[nodiscard]] Result<bool> swap_out(const SwapOut& swap);

  /// The executor's caches changed layout (Seesaw switched its config):
  /// later copies go to and from `views` (empty with a KvCopier, which
  /// follows the executor's active config itself). Errors: internal while
  /// a mover transfer is pending (a bug: drain_moves() first).
  [[nodiscard]] Status set_views(std::vector<kvstore::KvCacheView> views);

  // ---- Pipelined copies: Seesaw's tiered KV buffer (seed 000 §4.2) and ----
  // ---- its asynchronous pipeline (§5.2, engine/seesaw/kv_mover.hpp)      ----
  // swap_out / restore copy on the caller's thread at once. Offloads and
  // onboards go to a KvTransferQueue (the mover) instead, and the engine
  // applies their completions later (poll_moves / wait_moves / drain_moves).

  /// Devices the caches are spread over (each with its own host link).
  [[nodiscard]] int num_kv_devices() const noexcept {
    return views_.empty() ? (remote_ != nullptr ? remote_->num_devices() : 0) : static_cast<int>(views_.size());
  }
  /// Takes the mover (once, before any begin_*) and points it at the
  /// executor's caches. Errors: internal (already started, a null mover, or
  /// caches that cannot be copied).
  [[nodiscard]] Status start_mover(std::unique_ptr<KvTransferQueue> mover);
  /// Starts copying the KV of a sequence leaving the device (a finished
  /// prefill, or any resident sequence at a transition) into the host KV
  /// buffer (the swap space's budget), as one canonical HND chunk, so that
  /// an onboard can write it into another shard layout (the KV re-sharding
  /// of §4.1 happens in these copies). Reserves its bytes now; copies
  /// positions [0, num_tokens) out of `offload.block_table`, which the
  /// caller must keep allocated and out of every step until the completion
  /// is applied. False (nothing started, counted in offload_fallbacks) when
  /// the buffer has no room: the caller prefills the sequence again.
  /// Errors: internal (no mover, or KV already held for the sequence).
  [[nodiscard]] Result<bool> begin_offload(const SwapOut& offload);
  /// As restore(), on the mover (the prefetcher's swap-in; any held KV:
  /// offloaded, swapped or resumed, counted as restore() counts it):
  /// starts copying the held chunk into `block_table`, which the caller must
  /// keep out of every step until the completion is applied. The bytes stay
  /// counted until then. Errors: internal (no mover), not_found (nothing
  /// offloaded held for it), invalid_argument (token count mismatch).
  [[nodiscard]] Status begin_onboard(const KvRestore& restore, const std::vector<std::int32_t>& block_table);
  /// A mover transfer whose completion has been applied here.
  struct MoveDone {
    std::uint64_t seq_id = 0;
    bool to_host = false;  ///< an offload (else an onboard)
  };
  /// Applies the mover's completions ready now: an offload's chunk is held
  /// (decode-ready), an onboarded chunk is forgotten. Errors: internal (a
  /// copy failed: a bug).
  [[nodiscard]] Result<std::vector<MoveDone>> poll_moves();
  /// As poll_moves, blocking until at least one is ready (none pending:
  /// returns empty at once); the time blocked counts as the mover's wait_ms.
  [[nodiscard]] Result<std::vector<MoveDone>> wait_moves();
  /// As poll_moves, blocking until nothing is pending.
  [[nodiscard]] Result<std::vector<MoveDone>> drain_moves();
  /// Transfers started and not applied yet (0 without a mover).
  [[nodiscard]] int num_moves_pending() const noexcept { return mover_ ? mover_->num_pending() : 0; }
  /// Whether a mover transfer of `seq_id` is started and not applied.
  [[nodiscard]] bool move_pending(std::uint64_t seq_id) const;
  /// The mover's counters (zero without one).
  [[nodiscard]] KvMoverStats mover_stats() const { return mover_ ? mover_->stats() : KvMoverStats{}; }

  /// Keeps the KV of positions [0, num_tokens) of a resumed request (the
  /// canonical chunk of KvRange{0, layers, 0, num_tokens}; empty with a
  /// copier that moves no bytes) until restore().
  /// Errors: invalid_argument (wrong chunk size, caches not copyable).
  /// `known_positions`: positions the request had computed before (what is
  /// not restored of them counts as resume_recomputed_tokens at restore()).
  [[nodiscard]] Status hold_resumed(std::uint64_t seq_id, int num_tokens, std::vector<std::byte> chunk,
                                    int known_positions = 0);

  /// Copies a prefix tier's blocks (engine/prefix_tier.hpp) into a
  /// sequence's: `restore.blocks[i]` into positions [token_begin + i *
  /// block_size, + block_size) of `block_table`, every layer. Errors:
  /// invalid_argument (a chunk of the wrong size, positions outside the
  /// table), internal (caches that cannot be copied), the copier's.
  [[nodiscard]] Status restore_tier_blocks(const TierRestore& restore, const std::vector<std::int32_t>& block_table);
  /// Copies a named block's KV out (the canonical chunk of all layers x its
  /// positions: a spill to a prefix tier). Errors: invalid_argument.
  [[nodiscard]] Result<std::vector<std::byte>> copy_block(std::int32_t block);

  /// Copies the held KV of `restore.seq_id` (swapped or resumed) into the
  /// blocks of `block_table` and forgets it. Errors: not_found (nothing held
  /// for it: a bug), invalid_argument (token count mismatch).
  [[nodiscard]] Status restore(const KvRestore& restore, const std::vector<std::int32_t>& block_table);

  /// Prefix caching's copy-on-write of a shared block's head: copies the KV
  /// of `copy`'s positions (every layer) from `copy.src_block` into the same
  /// positions of `block_table` (the sequence's; it must cover them), through
  /// a host chunk (copy_out, then copy_in: it works for every executor whose
  /// caches can be copied). Errors: internal (caches that cannot be copied),
  /// invalid_argument (a range outside the table), the copier's.
  [[nodiscard]] Status copy_prefix(const PrefixCopy& copy, const std::vector<std::int32_t>& block_table);

  /// Copies layers [layer_begin, layer_end) of positions [token_begin,
  /// token_end) of a running sequence out of the caches as one canonical
  /// chunk (a layer-by-layer prompt increment). Errors: invalid_argument.
  [[nodiscard]] Result<std::vector<std::byte>> copy_layers(const std::vector<std::int32_t>& block_table,
                                                           int layer_begin, int layer_end, int token_begin,
                                                           int token_end);

  /// Each item's range of a running sequence, one canonical chunk each (one
  /// gather for all of them on a device copier: DéjàVu's buffered copies).
  /// The items' block tables must stay valid during the call. Errors:
  /// invalid_argument.
  [[nodiscard]] Result<std::vector<std::vector<std::byte>>> copy_increments(
      std::span<const kvstore::KvCopyItem> items);
  /// True when the executor's copier orders copies on the device
  /// (kvstore::KvCopier::copies_in_stream_order): a layer KV hook then
  /// begins copies instead of making them.
  [[nodiscard]] bool copies_in_stream_order() const noexcept {
    return views_.empty() && remote_ != nullptr && remote_->copies_in_stream_order();
  }
  /// kvstore::KvCopier::begin_copy_out on the executor's copier. Errors:
  /// internal (no such copier), the copier's.
  [[nodiscard]] Result<std::uint64_t> begin_copy_layers(std::span<const kvstore::KvCopyItem> items);
  /// kvstore::KvCopier::end_copy_out: the chunks of `ranges` (those of the
  /// ticket's items, in order). Errors: the copier's.
  [[nodiscard]] Result<std::vector<std::vector<std::byte>>> end_copy_layers(
      std::uint64_t ticket, std::span<const kvstore::KvRange> ranges);

  /// Forgets whatever is held for `seq_id` (it finished or was aborted).
  /// Nothing is dropped while a mover transfer of it is pending (the caller
  /// drains first).
  void drop(std::uint64_t seq_id);
  /// Whether KV is held for `seq_id`.
  [[nodiscard]] bool holds(std::uint64_t seq_id) const { return held_.count(seq_id) != 0; }

  /// Counts a resumed request whose KV was not restored.
  /// `known_positions` of it are computed again.
  void count_resume_fallback(int known_positions = 0) noexcept {
    ++stats_.resume_fallbacks;
    count_resume_recompute(known_positions);
  }
  /// A resumed request with no KV to restore: its known positions are computed again.
  void count_resume_recompute(int known_positions) noexcept {
    stats_.resume_recomputed_tokens += static_cast<std::uint64_t>(std::max(known_positions, 0));
  }
  [[nodiscard]] const KvIoStats& stats() const noexcept { return stats_; }

 private:
  struct Held {
    int num_tokens = 0;
    int known_positions = 0;  ///< resumed: positions computed before the failure
    bool swapped = false;  ///< in the swap space (counts against its budget); else resumed
    bool offloaded = false;  ///< Seesaw's host KV buffer (swapped too: the same budget)
    bool moving = false;     ///< with the mover (chunk empty here until its completion)
    std::size_t bytes = 0;   ///< the chunk's size (counted in the budget when swapped)
    std::vector<std::byte> chunk;  // canonical chunk of KvRange{0, layers, 0, num_tokens}
  };
  /// Counts a restore of `held` (all its positions) by its kind.
  void count_restore(const Held& held) noexcept;
  /// Applies completions (see poll_moves).
  [[nodiscard]] Result<std::vector<MoveDone>> apply_moves(std::vector<KvTransferDone> done);

  /// Copies positions [0, move.num_tokens) of a preempted sequence out of
  /// the caches into the swap space and holds them; false, copying nothing,
  /// when the space has no room or the sequence already has KV held. Counts
  /// no statistics. Errors: internal.
  [[nodiscard]] Result<bool> copy_and_hold(const SwapOut& move);
  /// copy_out / copy_in of whole sequences through the views, else the executor's copier.
  [[nodiscard]] Status copy_out(std::span<const std::int32_t> table, const kvstore::KvRange& range,
                                std::span<std::byte> chunk);
  [[nodiscard]] Status copy_in(std::span<const std::int32_t> table, const kvstore::KvRange& range,
                               std::span<const std::byte> chunk);

  kvstore::KvModelShape shape_;
  int block_size_;  ///< tokens per KV block of the executor's caches
  std::vector<kvstore::KvCacheView> views_;
  kvstore::KvCopier* remote_ = nullptr;  // the executor's, when its caches are not views
  std::uint64_t swap_space_bytes_;
  std::unordered_map<std::uint64_t, Held> held_;
  KvIoStats stats_;
  std::unique_ptr<KvTransferQueue> mover_;  // Seesaw §5.2, when started
};

}  // namespace shardline::engine
