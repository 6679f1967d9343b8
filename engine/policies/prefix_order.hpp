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

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
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

/// The same over any ids compared with < and == (the orchestrator orders a
/// job's lines by hashes of their text's chunks: orchestrator/line_order.hpp);
/// prompt_tokens and tree_tokens then count those ids.
template <class Id>
[[nodiscard]] PrefixOrder prefix_order_of(std::span<const std::vector<Id>> prompts) {
  PrefixOrder out;
  out.order.resize(prompts.size());
  std::iota(out.order.begin(), out.order.end(), std::size_t{0});
  std::stable_sort(out.order.begin(), out.order.end(), [&](std::size_t a, std::size_t b) {
    return std::lexicographical_compare(prompts[a].begin(), prompts[a].end(), prompts[b].begin(), prompts[b].end());
  });
  for (const auto& p : prompts) out.prompt_tokens += p.size();
  std::uint64_t shared = 0;
  for (std::size_t i = 1; i < out.order.size(); ++i) {
    const auto& a = prompts[out.order[i - 1]];
    const auto& b = prompts[out.order[i]];
    shared += static_cast<std::uint64_t>(
        std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first - a.begin());
  }
  out.tree_tokens = out.prompt_tokens - shared;
  return out;
}

}  // namespace shardline::engine
