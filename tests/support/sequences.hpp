#pragma once
// Sequences for scheduler tests: a prompt of consecutive token ids.
#include <cstdint>
#include <memory>
#include <numeric>

#include "engine/sequence.hpp"

namespace shardline::testing_support {

/// Request `id` with a prompt of `prompt_len` ids first_token, first_token + 1, ...
/// (default id * 100) and params.max_tokens = max_tokens.
inline std::unique_ptr<engine::Sequence> make_seq(std::uint64_t id, int prompt_len, int max_tokens,
                                                  std::int32_t first_token = -1) {
  auto s = std::make_unique<engine::Sequence>();
  s->id = id;
  s->prompt_ids.resize(static_cast<std::size_t>(prompt_len));
  std::iota(s->prompt_ids.begin(), s->prompt_ids.end(),
            first_token >= 0 ? first_token : static_cast<std::int32_t>(id * 100));
  s->params.max_tokens = max_tokens;
  return s;
}

}  // namespace shardline::testing_support
