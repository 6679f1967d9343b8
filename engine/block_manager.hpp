#pragma once
/// \file
/// Paged KV-cache block manager (vLLM / PagedAttention, SOSP'23): the cache is
/// `num_blocks` fixed-size blocks of `block_size` tokens; each sequence owns a
/// block table (logical block i -> physical block id) grown on demand from a
/// free list. Pure bookkeeping: the memory itself lives in the ModelExecutor.

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "common/result.hpp"

namespace shardline::engine {

class BlockManager {
 public:
  /// `num_blocks` >= 0, `block_size` >= 1.
  BlockManager(int num_blocks, int block_size);

  [[nodiscard]] int num_blocks() const { return num_blocks_; }
  [[nodiscard]] int block_size() const { return block_size_; }
  [[nodiscard]] int num_free_blocks() const { return static_cast<int>(free_list_.size()); }
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

  /// Returns all of `seq_id`'s blocks to the free list (no-op if unknown).
  void free(std::uint64_t seq_id);

  /// `seq_id`'s block table (empty when it has none).
  [[nodiscard]] const std::vector<std::int32_t>& block_table(std::uint64_t seq_id) const;
  /// Tokens `seq_id`'s table was last grown to cover (0 when unknown).
  [[nodiscard]] int num_tokens_covered(std::uint64_t seq_id) const;
  [[nodiscard]] bool has_seq(std::uint64_t seq_id) const { return seqs_.count(seq_id) != 0; }

  /// Every block is exactly once either free or in one sequence's table, and
  /// each table has exactly blocks_for_tokens(covered tokens) entries.
  /// Errors: internal, naming the broken invariant.
  [[nodiscard]] Status check_integrity() const;

 private:
  struct SeqBlocks {
    std::vector<std::int32_t> table;
    int num_tokens = 0;
  };
  int num_blocks_;
  int block_size_;
  std::vector<std::int32_t> free_list_;  ///< stack; back() is handed out next
  std::unordered_map<std::uint64_t, SeqBlocks> seqs_;
};

}  // namespace shardline::engine
