#pragma once
/// \file
/// Step metadata on the wire: the StepInput the rank-0 scheduler of an
/// engine group sends every other rank ahead of the activations (gLLM,
/// seed 004 §3.3: metadata first, so a stage can prepare its step while the
/// previous stage still computes). A flat array of int32 words:
///   [version=1, num_seqs, num_tokens, num_logits, block_size,
///    per seq: seq_id low, seq_id high, num_computed, num_new, needs_logits,
///             table_len, table...,
///    token_ids..., positions..., slot_mapping..., logits_rows...]

#include <cstdint>
#include <span>
#include <vector>

#include "common/result.hpp"
#include "model/executor.hpp"

namespace shardline::engine {

[[nodiscard]] std::vector<std::int32_t> encode_step(const model::StepInput& input);

/// Errors: corrupt (wrong version, truncated, negative counts, trailing words).
[[nodiscard]] Result<model::StepInput> decode_step(std::span<const std::int32_t> words);

}  // namespace shardline::engine
