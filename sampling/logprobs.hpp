#pragma once
/// \file
/// Log-probabilities of sampled tokens, as the OpenAI `logprobs` /
/// `top_logprobs` fields report them. Computed as vLLM v1 does by default
/// (`logprobs_mode = "raw_logprobs"`): log_softmax of the model's raw logits
/// row, before penalties, min_tokens masks, temperature and truncation, so a
/// token's logprob does not depend on the sampling parameters.

#include <cstdint>
#include <span>
#include <vector>

namespace shardline::sampling {

/// The most top logprobs a request may ask for (OpenAI chat's top_logprobs
/// limit; also the completions limit here, where OpenAI allows 5).
inline constexpr int kMaxLogprobs = 20;

/// One token and its log-probability (natural log, <= 0).
struct TokenLogprob {
  std::int32_t token_id = 0;
  float logprob = 0.0f;
  bool operator==(const TokenLogprob&) const = default;
};

/// The logprobs of one generated token.
struct SampleLogprobs {
  TokenLogprob sampled;            ///< the token that was drawn
  std::vector<TokenLogprob> top;   ///< [num_top] most likely tokens, descending; ties: lower id first
  bool operator==(const SampleLogprobs&) const = default;
};

/// Logprobs of `sampled_id` and of the `num_top` most likely tokens of
/// `logits` ([vocab] raw logits). Deterministic: the log-sum-exp is summed in
/// double in index order. NaN logits count as -inf. `num_top` is clamped to
/// [0, vocab]; `sampled_id` must be in [0, vocab).
[[nodiscard]] SampleLogprobs compute_logprobs(std::span<const float> logits, std::int32_t sampled_id, int num_top);

}  // namespace shardline::sampling
