#pragma once
/// \file
/// Per-request sampling parameters (vLLM `SamplingParams` semantics).

#include <cstdint>
#include <string>
#include <vector>

#include "common/result.hpp"

namespace shardline::sampling {

struct SamplingParams {
  float temperature = 1.0f;  ///< 0 = greedy (argmax)
  int top_k = 0;             ///< 0 or -1 = disabled
  float top_p = 1.0f;        ///< (0, 1]; 1 = disabled
  float min_p = 0.0f;        ///< [0, 1]; 0 = disabled
  float repetition_penalty = 1.0f;  ///< > 0; 1 = disabled (CTRL-style, over prompt + output)
  float presence_penalty = 0.0f;    ///< over output tokens (OpenAI semantics)
  float frequency_penalty = 0.0f;   ///< over output tokens (OpenAI semantics)
  std::uint64_t seed = 0;           ///< RNG key together with the token position
  bool has_seed = false;            ///< false: seed is derived from the request id
  int max_tokens = 16;              ///< generated tokens at most (>= 1)
  int min_tokens = 0;               ///< stop ids / EOS are masked before this many
  bool ignore_eos = false;          ///< do not stop at EOS ids (stop_token_ids still apply)
  std::vector<int> stop_token_ids;  ///< extra stop ids (EOS ids come from the model)
  std::vector<std::string> stop;    ///< stop strings; the match is cut from the text
  /// Logprobs of each generated token (sampling/logprobs.hpp): -1 = none;
  /// k in [0, kMaxLogprobs] = the sampled token's and the k most likely.
  int logprobs = -1;

  /// Checks ranges. Errors: invalid_argument naming the field.
  [[nodiscard]] Status validate() const;
};

}  // namespace shardline::sampling
