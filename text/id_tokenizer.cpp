#include "text/id_tokenizer.hpp"

#include <charconv>

namespace shardline::text {

std::vector<std::int32_t> IdTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<std::int32_t> ids;
  if (add_special_tokens && bos_ >= 0) ids.push_back(bos_);
  std::size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && (text[i] < '0' || text[i] > '9')) ++i;
    std::size_t j = i;
    while (j < text.size() && text[j] >= '0' && text[j] <= '9') ++j;
    if (j > i) {
      std::int32_t id = -1;
      const auto [p, ec] = std::from_chars(text.data() + i, text.data() + j, id);
      if (ec == std::errc() && id >= 0 && id < vocab_size_) ids.push_back(id);
    }
    i = j;
  }
  return ids;
}

std::string IdTokenizer::token_bytes(std::int32_t id) const { return " " + std::to_string(id); }

std::string IdTokenizer::decode(std::span<const std::int32_t> ids, bool skip_special_tokens) const {
  std::string out;
  for (std::int32_t id : ids) {
    if (skip_special_tokens && is_special(id)) continue;
    out += token_bytes(id);
  }
  if (!out.empty()) out.erase(0, 1);  // like sentencepiece: no leading space
  return out;
}

std::int32_t IdTokenizer::token_to_id(std::string_view token) const {
  std::int32_t id = -1;
  const auto [p, ec] = std::from_chars(token.data(), token.data() + token.size(), id);
  return (ec == std::errc() && p == token.data() + token.size() && id >= 0 && id < vocab_size_) ? id : -1;
}

}  // namespace shardline::text
