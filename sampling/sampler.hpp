#pragma once
/// \file
/// Token sampling from one logits row, in vLLM's order: penalties
/// (repetition over prompt + output, CTRL-style; presence / frequency over
/// output counts, OpenAI-style), min_tokens masking of stop ids, then greedy
/// argmax (temperature 0) or temperature -> top-k -> top-p -> min-p ->
/// inverse-CDF draw with the Philox uniform of (seed, position).

#include <cstdint>
#include <span>
#include <vector>

#include "sampling/sampling_params.hpp"

namespace shardline::sampling {

/// What the sampler needs besides the logits and the params.
struct SampleContext {
  std::uint64_t seed = 0;  ///< the request's effective seed (params.seed or derived)
  int position = 0;        ///< absolute position of the token being sampled
  std::span<const std::int32_t> prompt_ids;
  std::span<const std::int32_t> output_ids;
  /// Ids masked to -inf while output_ids.size() < params.min_tokens
  /// (EOS ids unless ignore_eos, plus stop_token_ids).
  std::span<const std::int32_t> min_tokens_masked_ids;
};

/// Samples one token id from `logits` ([vocab], modified in place: penalties,
/// masks and temperature are applied to it). Deterministic: the same inputs
/// give the same id on every run and batch. Greedy ties go to the lowest id;
/// truncation ties (top-k / top-p boundary) keep the lower id. Out-of-range
/// ids in the context are ignored. `params` must be valid.
[[nodiscard]] std::int32_t sample(std::span<float> logits, const SamplingParams& params,
                                  const SampleContext& ctx);

/// sample() of a row that must stay as it is: the row is copied into
/// `scratch` ([vocab], reused across calls) and sampled there when the
/// params change logits (penalties, min_tokens masks, a temperature);
/// a plain greedy row is read in place. Same id as sample() on a copy.
[[nodiscard]] std::int32_t sample_row(std::span<const float> logits, const SamplingParams& params,
                                      const SampleContext& ctx, std::vector<float>& scratch);

/// Index of the largest value (lowest index on ties; NaN never wins).
[[nodiscard]] std::int32_t argmax(std::span<const float> values);

}  // namespace shardline::sampling
