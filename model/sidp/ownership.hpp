#pragma once
/// \file
/// SiDP layer ownership (seed 002 §4.1) and the WaS prefetch order with peak
/// shifting (§4.2).
///
/// In a data-parallel group of `dp` ranks every decoder layer's FFN has one
/// owner rank, the only rank that holds its weights; attention, embeddings
/// and lm_head stay replicated. Non-owners run the layer by fetching its
/// weights (WaS) or by sending their rows to the owner (CaS).
///
/// Peak shifting (§4.2): layers are grouped into consecutive cycles of `dp`
/// layers. In the cycle starting at layer c, rank r begins prefetching at
/// layer c + r and proceeds in wrap-around order within the cycle, skipping
/// the layers it owns. Two properties follow (both unit-tested):
///  (i)  within a cycle, every rank fetches every non-owned layer of the cycle
///       once, after at most dp - 1 prefetches: no rank starves;
///  (ii) ranks start at different layers, so at any moment different ranks
///       tend to read from different owners (no incast on one owner's link).
/// Because the fetch order differs from the compute order (layer order), a
/// rank needs enough cache slots to hold a cycle's non-owned layers (the
/// paper provides "enough cache to hold dp - 1 remote layers");
/// min_cache_slots() computes the exact minimum for any plan.

#include <string>
#include <string_view>
#include <vector>

#include "common/result.hpp"

namespace shardline::model::sidp {

struct OwnershipPlan {
  int dp = 0;                       ///< ranks of the DP group (>= 2)
  std::vector<int> owner_of_layer;  ///< [num_layers] owner rank of each layer's FFN

  [[nodiscard]] int num_layers() const { return static_cast<int>(owner_of_layer.size()); }
  [[nodiscard]] int owner(int layer) const { return owner_of_layer[static_cast<std::size_t>(layer)]; }
  /// Layers `rank` owns, ascending.
  [[nodiscard]] std::vector<int> owned_layers(int rank) const;
  /// Layers `rank` does not own, ascending (the order it computes them in).
  [[nodiscard]] std::vector<int> remote_layers(int rank) const;
  /// "0,1,0,1": the owner of each layer (parse_plan's format).
  [[nodiscard]] std::string to_string() const;
};

/// The balanced plan: layer l is owned by rank l mod dp (§4.1).
/// Errors: invalid_argument (num_layers < 1, dp < 2).
[[nodiscard]] Result<OwnershipPlan> balanced_plan(int num_layers, int dp);

/// A stated plan: "balanced" / "" (the balanced plan) or a comma-separated
/// owner per layer, e.g. "0,1,1,0". Errors: invalid_argument naming the
/// problem (wrong count, an owner outside [0, dp), not a number, dp < 2).
/// A rank may own no layer.
[[nodiscard]] Result<OwnershipPlan> parse_plan(std::string_view text, int num_layers, int dp);

/// The order in which `rank` prefetches its remote layers in one pass over
/// the model (one step): layer order without peak shifting; with it, the
/// per-cycle shifted order above. Every remote layer appears exactly once.
[[nodiscard]] std::vector<int> prefetch_order(const OwnershipPlan& plan, int rank, bool peak_shifting);

/// The fewest cache slots with which a ring that fetches `fetch_order` over
/// and over (a slot is refilled only after the layer in it was computed) can
/// serve the compute order (remote layers ascending, over and over) without
/// waiting forever. 0 when the rank owns every layer. Exact: found by
/// simulating two passes for each candidate slot count.
[[nodiscard]] int min_cache_slots(const OwnershipPlan& plan, int rank, const std::vector<int>& fetch_order);

}  // namespace shardline::model::sidp
