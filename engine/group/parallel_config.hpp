#pragma once
/// \file
/// A parallel configuration: how many devices split one model and how.
///
///  - TP (tensor parallel, Megatron-LM): attention heads and FFN columns/rows
///    split over `tp` ranks; two all-reduces per layer.
///  - PP (pipeline parallel): `pp` stages of contiguous layer ranges; activations
///    move stage to stage; micro-batches keep the stages busy (gLLM, seed 004).
///  - SP (Ulysses sequence parallel, seed 001 Alg. 2): the step's tokens split
///    over `sp` ranks; all-to-all to heads before attention and back after.
///  - DP (data parallel): `dp` independent replicas (engine groups).
///
/// One engine group has tp * sp * pp ranks; a job needs world_size() =
/// tp * sp * pp * dp devices. Ranks inside a group are numbered
///   rank = stage * (sp * tp) + sp_rank * tp + tp_rank
/// so a stage's ranks are contiguous and a TP group is innermost.

#include <string>
#include <string_view>
#include <vector>

#include "common/result.hpp"

namespace shardline::engine {

struct ParallelConfig {
  int tp = 1;
  int pp = 1;
  int sp = 1;
  int dp = 1;

  /// Ranks of one engine group (tp * sp * pp).
  [[nodiscard]] int group_size() const { return tp * sp * pp; }
  /// Devices of the whole configuration (group_size() * dp).
  [[nodiscard]] int world_size() const { return group_size() * dp; }
  [[nodiscard]] bool is_single() const { return world_size() == 1; }
  /// "tp=2,pp=1,sp=1,dp=1" (always all four, parseable by parse_parallel_config).
  [[nodiscard]] std::string to_string() const;
  friend bool operator==(const ParallelConfig&, const ParallelConfig&) = default;
};

/// Parses "tp=2,pp=2" (any subset of tp, pp, sp, dp in any order; missing
/// ones are 1; "" and "single" mean all 1). Errors: invalid_argument naming
/// the bad part (unknown key, repeated key, value not an integer in [1, 64]).
[[nodiscard]] Result<ParallelConfig> parse_parallel_config(std::string_view text);

/// Coordinates of one rank inside an engine group (see the numbering above).
struct RankCoord {
  int stage = 0;    ///< pipeline stage in [0, pp)
  int sp_rank = 0;  ///< in [0, sp)
  int tp_rank = 0;  ///< in [0, tp)
};
[[nodiscard]] RankCoord rank_coord(const ParallelConfig& pc, int group_rank);
[[nodiscard]] int group_rank_of(const ParallelConfig& pc, RankCoord c);

/// Group ranks of the TP group of `c` (its stage and sp_rank; index = tp_rank).
[[nodiscard]] std::vector<int> tp_group_ranks(const ParallelConfig& pc, RankCoord c);
/// Group ranks of the SP group of `c` (its stage and tp_rank; index = sp_rank).
[[nodiscard]] std::vector<int> sp_group_ranks(const ParallelConfig& pc, RankCoord c);

}  // namespace shardline::engine
