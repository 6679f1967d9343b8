#pragma once
/// \file
/// Automatic prefix caching (vLLM v1's design, issue 42): a full KV block is
/// named by a hash of its token ids chained with its parent block's hash
/// (the chain starts from a root that hashes whatever else changes the KV:
/// the salt), so a block's name covers the whole prefix up to its end. A
/// request whose leading full blocks are named in the cache shares them
/// (engine/block_manager.hpp counts the references) instead of computing
/// their KV again.
///
/// PrefixCache is the index of one KV cache's named blocks: name -> block,
/// each with its tokens and parent name (compared on a hit, so a 64-bit hash
/// collision can never hand a request another prefix's KV), and the named
/// blocks no sequence holds, in LRU order: they stay reusable until blocks
/// run out, then the least recently freed is evicted (its name dropped).
///
/// The hash is this file's (64-bit splitmix64 chaining, not a library's):
/// a hit is checked token by token, so its quality only decides how often
/// two prefixes share a bucket, never what a request reads.

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/result.hpp"

namespace shardline::engine {

/// `--enable-prefix-caching` / `--no-prefix-caching`: on by default in the
/// commands that run jobs (`run`, `node start`, `generate`, `shard serve`);
/// off by default here and in `bench` (its synthetic prompts repeat).
struct PrefixCacheConfig {
  bool enabled = false;
  /// Hashed into every block's name: what changes the KV besides the tokens
  /// (the model, the KV dtype). One engine's cache holds one model, so 0 is
  /// safe within it; a tier shared by engines must set it.
  std::uint64_t salt = 0;
};

/// The name the chain starts from (the first block's parent).
[[nodiscard]] std::uint64_t prefix_root_hash(std::uint64_t salt) noexcept;
/// The name of a full block holding `tokens` (block_size ids) after the block named `parent`.
[[nodiscard]] std::uint64_t prefix_block_hash(std::uint64_t parent, std::span<const std::int32_t> tokens) noexcept;

/// A named block with what names it: its name, its parent's, its tokens.
struct NamedBlock {
  std::int32_t block = -1;
  std::uint64_t name = 0;
  std::uint64_t parent = 0;
  std::vector<std::int32_t> tokens;
};

class PrefixCache {
 public:
  /// An index over blocks [0, num_blocks).
  explicit PrefixCache(int num_blocks);

  /// The block named `hash` whose parent is `parent` and whose tokens are
  /// `tokens`; -1 when there is none (or only a colliding one).
  [[nodiscard]] int find(std::uint64_t hash, std::uint64_t parent, std::span<const std::int32_t> tokens) const;
  /// A partial-block hit (copy-on-write of a shared block's head): of the
  /// named blocks whose parent is `parent`, the one whose tokens begin with
  /// the longest run of `tokens` (tokens.size() <= a block), scanning at most
  /// kMaxPartialScan of them, newest named first. {-1, 0} when none shares
  /// a first token.
  struct PartialMatch {
    int block = -1;
    int num_tokens = 0;  ///< its leading tokens equal to tokens[0, num_tokens)
  };
  static constexpr int kMaxPartialScan = 64;
  [[nodiscard]] PartialMatch find_partial(std::uint64_t parent, std::span<const std::int32_t> tokens) const;
  /// Names `block` (not named yet) `hash`. False, and nothing changes, when
  /// another block has the name already (the first one stays cached).
  bool insert(int block, std::uint64_t hash, std::uint64_t parent, std::span<const std::int32_t> tokens);
  [[nodiscard]] bool is_named(int block) const { return named_[static_cast<std::size_t>(block)] != 0; }
  /// The name of a named block.
  [[nodiscard]] std::uint64_t name(int block) const { return hash_[static_cast<std::size_t>(block)]; }

  /// A named block no sequence holds any more: evictable, most recently used.
  void release(int block);
  /// A named block a sequence takes again: no longer evictable (a no-op if it was not).
  void hold(int block);
  [[nodiscard]] bool is_evictable(int block) const { return evictable_[static_cast<std::size_t>(block)] != 0; }
  [[nodiscard]] int num_evictable() const { return static_cast<int>(lru_.size()); }
  /// Drops the least recently used evictable block's name and returns the
  /// block (now a plain free block); -1 when none is evictable. `evicted`,
  /// when given, gets what named it (for a spill to a PrefixTier).
  int evict(NamedBlock* evicted = nullptr);
  /// What names a named block.
  [[nodiscard]] NamedBlock named_block(int block) const;

  [[nodiscard]] std::uint64_t num_named_blocks() const { return index_.size(); }
  [[nodiscard]] std::uint64_t num_evictions() const { return evictions_; }
  /// Every named block is indexed under its name and every indexed block is
  /// named, and listed once among its parent's children; every evictable
  /// block is named. Errors: internal.
  [[nodiscard]] Status check_integrity() const;

 private:
  std::unordered_map<std::uint64_t, int> index_;       ///< name -> block
  /// Parent's name -> named blocks, oldest first; a list, so that an
  /// eviction unlinks its block in O(1) (child_pos_) and keeps the order.
  std::unordered_map<std::uint64_t, std::list<int>> children_;
  std::vector<std::list<int>::iterator> child_pos_;  ///< [blocks] position among its parent's children (when named)
  std::vector<std::uint64_t> hash_;                   ///< [blocks] name (when named)
  std::vector<std::uint64_t> parent_;                 ///< [blocks] parent's name (when named)
  std::vector<std::vector<std::int32_t>> tokens_;     ///< [blocks] token ids (when named)
  std::vector<char> named_;                           ///< [blocks]
  std::vector<char> evictable_;                       ///< [blocks]
  std::list<int> lru_;                                ///< evictable blocks, least recently used first
  std::vector<std::list<int>::iterator> lru_pos_;     ///< [blocks] position in lru_ (when evictable)
  std::uint64_t evictions_ = 0;
};

/// Prefix caching's admission rule for requests that arrive together (the
/// `n` choices of a line, lines behind one head): the names of the full
/// blocks running sequences are computing now. The scheduler keeps a
/// request whose first uncached block is among them waiting until it is
/// named, so the block is computed once, not once per request (issue 42's
/// "n > 1 shares the prompt").
class ComputingPrefixes {
 public:
  /// Sequence `seq_id` computes the blocks named `names`, its blocks
  /// first_block, first_block + 1, ... (replaces what it computed before).
  void start(std::uint64_t seq_id, std::vector<std::uint64_t> names, int first_block);
  /// Its first `num_full_blocks` blocks are computed (named): no longer pending.
  void progress(std::uint64_t seq_id, int num_full_blocks);
  /// It stopped (finished, preempted, offloaded): none of its names is pending.
  void stop(std::uint64_t seq_id);
  /// Whether some running sequence is computing the block named `name`.
  [[nodiscard]] bool computing(std::uint64_t name) const { return count_.count(name) != 0; }
  /// Names pending, over every sequence (with repeats).
  [[nodiscard]] std::size_t num_pending() const;

 private:
  struct Entry {
    std::vector<std::uint64_t> names;
    int first_block = 0;
    std::size_t next = 0;  ///< names[0, next) are computed
  };
  void drop(std::uint64_t name);
  std::unordered_map<std::uint64_t, int> count_;     ///< name -> sequences computing it
  std::unordered_map<std::uint64_t, Entry> of_;      ///< by sequence
};

}  // namespace shardline::engine
