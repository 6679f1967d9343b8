#pragma once
/// \file
/// Prefix-aware order of an offline batch (issue 42, step 4): the order in
/// which to run a job's prompts so that prompts sharing a prefix run close
/// together, and the prefix cache (engine/prefix_cache.hpp) computes each
/// shared prefix once while it is still cached instead of after it was
/// evicted. The job is known up front, which an online server cannot count
/// on; BatchLLM (2024) reorders offline batches by their shared prefixes
/// for the same reason.
///
/// The order is a depth-first walk of the prompts' prefix tree (a trie over
/// token ids): the prompts sorted lexicographically by their token ids, ties
/// in input order (so the n copies of one prompt stay in their order). Every
/// prompt then sits next to the prompts it shares its longest prefix with.
/// The tree also gives the ideal a run is measured against, whatever its
/// order: it holds one node per distinct prefix, so tree_tokens =
/// prompt_tokens - the sum over neighbours in that order of their longest
/// common prefix is the fewest prompt tokens any run computes, reached by a
/// cache that never evicts (a block-level cache computes more: the partial
/// block after a shared prefix, and at least one token of a prompt that is
/// wholly cached). With eviction the order decides how close a run gets.
///
/// Cost: O(total tokens x log prompts) comparisons, no copy of the prompts.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace shardline::engine {

/// A batch's prefix-aware order and its prefix tree's size.
struct PrefixOrder {
  std::vector<std::size_t> order;   ///< [prompts] indices into the input, in run order
  std::uint64_t prompt_tokens = 0;  ///< the prompts' lengths summed
  std::uint64_t tree_tokens = 0;    ///< nodes of the prefix tree: the prompt tokens a run computes at best
  /// Prompt tokens that need not be computed: what the tree shares.
  [[nodiscard]] std::uint64_t shared_tokens() const noexcept { return prompt_tokens - tree_tokens; }
};

/// The prefix-aware order of `prompts` (token ids each; any may be empty).
[[nodiscard]] PrefixOrder prefix_order(std::span<const std::vector<std::int32_t>> prompts);

}  // namespace shardline::engine
