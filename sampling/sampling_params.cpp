#include "sampling/sampling_params.hpp"

#include <cmath>
#include <string>

#include "sampling/logprobs.hpp"

namespace shardline::sampling {
namespace {

Status bad(const std::string& field, const std::string& why) {
  return make_error(ErrorCode::invalid_argument, "sampling params: " + field + " " + why);
}

}  // namespace

Status SamplingParams::validate() const {
  // Written as !(ok) so that NaN fails every check.
  if (!(temperature >= 0.0f) || !std::isfinite(temperature))
    return bad("temperature", "must be >= 0 and finite, got " + std::to_string(temperature));
  if (!(top_k >= -1))
    return bad("top_k", "must be -1, 0 (disabled) or >= 1, got " + std::to_string(top_k));
  if (!(top_p > 0.0f && top_p <= 1.0f))
    return bad("top_p", "must be in (0, 1], got " + std::to_string(top_p));
  if (!(min_p >= 0.0f && min_p <= 1.0f))
    return bad("min_p", "must be in [0, 1], got " + std::to_string(min_p));
  if (!(repetition_penalty > 0.0f) || !std::isfinite(repetition_penalty))
    return bad("repetition_penalty", "must be > 0 and finite, got " + std::to_string(repetition_penalty));
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f))
    return bad("presence_penalty", "must be in [-2, 2], got " + std::to_string(presence_penalty));
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f))
    return bad("frequency_penalty", "must be in [-2, 2], got " + std::to_string(frequency_penalty));
  if (max_tokens < 1) return bad("max_tokens", "must be >= 1, got " + std::to_string(max_tokens));
  if (min_tokens < 0 || min_tokens > max_tokens)
    return bad("min_tokens", "must be in [0, max_tokens=" + std::to_string(max_tokens) + "], got " +
                                 std::to_string(min_tokens));
  for (int id : stop_token_ids)
    if (id < 0) return bad("stop_token_ids", "must be >= 0, got " + std::to_string(id));
  if (logprobs < -1 || logprobs > kMaxLogprobs)
    return bad("logprobs", "must be in [0, " + std::to_string(kMaxLogprobs) + "] (or -1: none), got " +
                               std::to_string(logprobs));
  for (const auto& s : stop)
    if (s.empty()) return bad("stop", "must not contain an empty string");
  return Status::ok_status();
}

}  // namespace shardline::sampling
