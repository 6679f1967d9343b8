#pragma once
/// \file
/// Paged KV-cache block manager (vLLM / PagedAttention, SOSP'23): the cache is
/// `num_blocks` fixed-size blocks of `block_size` tokens; each sequence owns a
/// block table (logical block i -> physical block id) grown on demand from a
/// free list. Pure bookkeeping: the memory itself lives in the ModelExecutor.
///
/// With prefix caching (engine/prefix_cache.hpp, issue 42) a sequence's full
/// blocks are named once computed (cache_full_blocks), a new sequence starts
/// with the named blocks its tokens lead with (acquire_cached_prefix), shared
/// and reference-counted, and a block no sequence holds stays named and
/// reusable until a fresh block is needed and no unnamed one is free (then
/// the least recently freed is evicted). A shared block is never written:
/// a sequence computes from the end of its shared blocks on.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/result.hpp"
#include "engine/prefix_cache.hpp"
#include "engine/prefix_tier.hpp"

namespace shardline::engine {

class BlockManager {
 public:
  /// `num_blocks` >= 0, `block_size` >= 1; prefix caching off.
  BlockManager(int num_blocks, int block_size);
  /// The same with `prefix` (prefix caching when prefix.enabled).
  BlockManager(int num_blocks, int block_size, PrefixCacheConfig prefix);

  [[nodiscard]] int num_blocks() const { return num_blocks_; }
  [[nodiscard]] int block_size() const { return block_size_; }
  /// Blocks a sequence may take: unnamed free ones plus named ones no
  /// sequence holds (evicted when taken).
  [[nodiscard]] int num_free_blocks() const {
    return static_cast<int>(free_list_.size()) + (cache_ ? cache_->num_evictable() : 0);
  }
  [[nodiscard]] bool prefix_caching() const { return cache_ != nullptr; }
  [[nodiscard]] int num_seqs() const { return static_cast<int>(seqs_.size()); }

  /// ceil(num_tokens / block_size).
  [[nodiscard]] int blocks_for_tokens(int num_tokens) const;

  /// True when a new sequence of `num_tokens` tokens would fit now.
  [[nodiscard]] bool can_allocate(int num_tokens) const;
  /// Blocks `seq_id` still lacks to cover `num_total_tokens` (0 if covered).
  [[nodiscard]] int num_missing_blocks(std::uint64_t seq_id, int num_total_tokens) const;
  /// True when `allocate_slots(seq_id, num_total_tokens)` would succeed.
  [[nodiscard]] bool can_grow(std::uint64_t seq_id, int num_total_tokens) const;

  /// Grows `seq_id`'s table (creating it if new) to cover `num_total_tokens`
  /// tokens. All or nothing. Errors: out_of_memory (not enough free blocks;
  /// nothing is allocated), invalid_argument (negative count).
  [[nodiscard]] Status allocate_slots(std::uint64_t seq_id, int num_total_tokens);

  /// Returns all of `seq_id`'s blocks (no-op if unknown): a block no other
  /// sequence holds goes back to the free list, or, named, becomes evictable
  /// (the sequence's last blocks the first to go).
  void free(std::uint64_t seq_id);

  /// A sequence's token ids: its prompt, then its output.
  struct Tokens {
    std::span<const std::int32_t> prompt;
    std::span<const std::int32_t> output;
    [[nodiscard]] int size() const { return static_cast<int>(prompt.size() + output.size()); }
    [[nodiscard]] std::int32_t at(int pos) const {
      const auto p = static_cast<std::size_t>(pos);
      return p < prompt.size() ? prompt[p] : output[p - prompt.size()];
    }
  };
  /// Prefix caching: a sequence with no blocks yet starts with the longest
  /// run of named blocks its leading full blocks match, within its first
  /// `max_tokens` tokens (the caller leaves at least its last token to
  /// compute). They become its first table entries, shared. Returns the
  /// tokens they hold (a multiple of block_size; 0 with caching off, no hit,
  /// or a sequence that has blocks). Free it to give them back.
  int acquire_cached_prefix(std::uint64_t seq_id, const Tokens& tokens, int max_tokens);
  /// The same; `miss_name`, when given, gets the name of the first full
  /// block within max_tokens that was not cached (nullopt when every one was).
  int acquire_cached_prefix(std::uint64_t seq_id, const Tokens& tokens, int max_tokens,
                            std::optional<std::uint64_t>* miss_name);
  /// A partial-block hit: the block to copy a sequence's next tokens' KV from.
  struct PartialBlockHit {
    std::int32_t src_block = -1;
    int num_tokens = 0;  ///< its leading positions to copy (0: no hit)
  };
  /// Prefix caching's copy-on-write of a shared block's head: `seq_id`, which
  /// holds only the cached full blocks acquire_cached_prefix gave it (k of
  /// them; or none and no table), continues with tokens [k * block_size,
  /// min((k + 1) * block_size, max_tokens)). Finds the named block after its
  /// last one (another sequence's block k) whose tokens begin with the
  /// longest run of those, and pins it (it is neither evicted nor handed
  /// out) until release_pins(): the caller copies those positions' KV from
  /// it into the sequence's own block k (a shared block is never written)
  /// and computes from there on. {-1, 0} with caching off, a sequence that
  /// computed blocks of its own, or no match of min_partial_tokens() or more.
  [[nodiscard]] PartialBlockHit acquire_partial_block(std::uint64_t seq_id, const Tokens& tokens, int max_tokens);
  /// A match shorter than this is not worth a copy (a prompt's first token,
  /// BOS, matches nearly every first block): block_size / 4, at least 1.
  [[nodiscard]] int min_partial_tokens() const noexcept { return std::max(1, block_size_ / 4); }
  /// Unpins the blocks acquire_partial_block pinned (their copies are done).
  void release_pins();
  /// Unpins one pin of `block` (an admission that gave its partial hit up).
  void unpin(std::int32_t block);
  /// The names of `seq_id`'s full blocks within its first `max_tokens`
  /// tokens that it has not named yet (the ones it is about to compute),
  /// continuing its chain (none with caching off or an unknown sequence).
  [[nodiscard]] std::vector<std::uint64_t> pending_names(std::uint64_t seq_id, const Tokens& tokens,
                                                         int max_tokens) const;
  /// Prefix caching: names `seq_id`'s full blocks within its first
  /// `num_computed_tokens` tokens (their KV is in the cache) that are not
  /// named yet; a block whose name another block has is left unnamed.
  void cache_full_blocks(std::uint64_t seq_id, const Tokens& tokens, int num_computed_tokens);
  /// Prefix caching: no block named so far is a hit any more (the KV memory
  /// is laid out anew: Seesaw's switch of parallel config). Names already
  /// given stay until evicted; chains started before go on under them.
  void new_prefix_epoch() noexcept;
  /// The prefix index (null with caching off).
  [[nodiscard]] const PrefixCache* prefix_cache() const { return cache_.get(); }

  // ---- a PrefixTier below the cache (engine/prefix_tier.hpp) ----
  /// Whether named blocks evicted from now on are listed for a spill
  /// (take_evicted), while the epoch is 0 (a tier's names are epoch 0's).
  void set_spill(bool on) noexcept { spill_ = on; }
  /// Whether a named block is also listed (once per naming) when a second
  /// sequence first shares it (PrefixTier::keeps_shared_blocks).
  void set_spill_shared(bool on) noexcept { spill_shared_ = on; }
  /// The named blocks evicted since the last call (with spill_shared, also
  /// those first shared), with what named them: their KV is in the cache
  /// until a step writes the blocks again (a shared block is not written).
  [[nodiscard]] std::vector<NamedBlock> take_evicted() { return std::exchange(evicted_, {}); }
  /// Every named block (a spill of the whole cache); none outside epoch 0.
  [[nodiscard]] std::vector<NamedBlock> named_blocks() const;
  /// Names continue a tier's chain: epoch 0 (no Seesaw phase change yet).
  [[nodiscard]] bool tier_names() const noexcept { return cache_ != nullptr && epoch_ == 0; }
  /// The chunks a prefix tier holds for `seq_id`'s next full blocks after
  /// the cached ones it holds (acquire_cached_prefix; none: from the first),
  /// within max_tokens, up to the first the tier lacks. Empty when the tier
  /// is null, names are not epoch 0's, or the sequence computed blocks of
  /// its own. Nothing is acquired.
  [[nodiscard]] std::vector<std::vector<std::byte>> fetch_from_tier(PrefixTier* tier, std::uint64_t seq_id,
                                                                    const Tokens& tokens, int max_tokens) const;
  /// The full blocks of `tokens` within `max_tokens` after those named in
  /// the cache now, in chain order, with what names them (`block` -1): a
  /// prefix tier may hold them. Empty with caching off or outside epoch 0.
  [[nodiscard]] std::vector<NamedBlock> uncached_blocks(const Tokens& tokens, int max_tokens) const;
  /// The names of `tokens`' first `num_blocks` full blocks in chain order,
  /// from the root (root_name()): what a prefix tier keys them by. Empty
  /// with caching off or outside epoch 0 (tier_names()).
  [[nodiscard]] std::vector<std::uint64_t> head_names(const Tokens& tokens, int num_blocks) const;
  /// The first block's parent name (the salt's and the epoch's).
  [[nodiscard]] std::uint64_t root_name() const noexcept { return root_name_; }
  /// Leading full blocks of `tokens`, within `max_tokens`, named in the
  /// cache now (tokens; nothing is acquired).
  [[nodiscard]] int peek_cached_prefix(const Tokens& tokens, int max_tokens) const;

  /// `seq_id`'s block table (empty when it has none).
  [[nodiscard]] const std::vector<std::int32_t>& block_table(std::uint64_t seq_id) const;
  /// Tokens `seq_id`'s table was last grown to cover (0 when unknown).
  [[nodiscard]] int num_tokens_covered(std::uint64_t seq_id) const;
  [[nodiscard]] bool has_seq(std::uint64_t seq_id) const { return seqs_.count(seq_id) != 0; }

  /// Every block is either free (unnamed, once), evictable (named, no
  /// holder) or in as many tables and pins as its reference count (more than
  /// one only when named; pinned only when named), and each table has
  /// exactly blocks_for_tokens(covered tokens) entries.
  /// Errors: internal, naming the broken invariant.
  [[nodiscard]] Status check_integrity() const;

 private:
  struct SeqBlocks {
    std::vector<std::int32_t> table;
    int num_tokens = 0;
    std::vector<std::uint64_t> names;  ///< prefix caching: names of table[0 .. names.size()) (full blocks)
  };
  /// A block for a table: an unnamed free one, else the evicted LRU named one.
  [[nodiscard]] std::int32_t take_block();
  /// The name of full block `block` of `tokens` after `parent` (its ids into `ids`).
  [[nodiscard]] std::uint64_t name_block(const Tokens& tokens, int block, std::uint64_t parent,
                                         std::vector<std::int32_t>& ids) const;
  /// The named blocks `tokens`' leading full blocks (within max_tokens) are
  /// in the cache now, up to the first that is not, appended to `blocks`
  /// and `names`; `miss_name`, when given, gets that first one's name.
  void cached_chain(const Tokens& tokens, int max_tokens, std::vector<std::int32_t>& blocks,
                    std::vector<std::uint64_t>& names, std::optional<std::uint64_t>* miss_name) const;
  /// Where `seq_id`'s shared head ends: its next block index and that
  /// block's parent name (block 0 and the root without a hit). False when
  /// it computed blocks of its own (it is past its shared head).
  [[nodiscard]] bool shared_head_end(std::uint64_t seq_id, std::size_t& block, std::uint64_t& parent) const;
  /// The parent name of `s`'s block `block` (block <= s.names.size()).
  [[nodiscard]] std::uint64_t parent_name(const SeqBlocks& s, std::size_t block) const;
  int num_blocks_;
  int block_size_;
  std::vector<std::int32_t> free_list_;  ///< stack; back() is handed out next
  std::vector<int> refs_;                ///< [blocks] tables holding the block
  std::unique_ptr<PrefixCache> cache_;   ///< null: prefix caching off
  std::uint64_t salt_ = 0;
  std::uint64_t epoch_ = 0;              ///< new_prefix_epoch calls
  std::uint64_t root_name_ = 0;          ///< the first block's parent name (salt and epoch)
  std::unordered_map<std::uint64_t, SeqBlocks> seqs_;
  std::vector<std::int32_t> pins_;       ///< blocks pinned as copy sources (each holds a reference)
  bool spill_ = false;
  bool spill_shared_ = false;
  std::vector<char> offered_;            ///< [blocks] listed since named (spill_shared_)
  std::vector<NamedBlock> evicted_;      ///< evicted (or, with spill_shared_, first shared) since take_evicted
};

}  // namespace shardline::engine
