#pragma once
/// \file
/// Tokenizer backed by libsentencepiece (`tokenizer.model`), decoding like
/// Hugging Face's legacy LlamaTokenizer: the first token's leading space is
/// stripped, byte-fallback pieces `<0xNN>` give raw bytes.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "text/token_count_bound.hpp"
#include "text/tokenizer.hpp"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace shardline::text {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  /// Loads `file` (tokenizer.model). `add_bos_token` defaults to true (HF
  /// LlamaTokenizer); `bos_token` / `eos_token` override the model's ids
  /// when non-empty. Errors: corrupt (unparsable model).
  [[nodiscard]] static Result<std::unique_ptr<SentencePieceTokenizer>> load(
      const std::filesystem::path& file, std::optional<bool> add_bos_token,
      std::string_view bos_token, std::string_view eos_token);

  ~SentencePieceTokenizer() override;
  SentencePieceTokenizer(const SentencePieceTokenizer&) = delete;
  SentencePieceTokenizer& operator=(const SentencePieceTokenizer&) = delete;

  [[nodiscard]] std::vector<std::int32_t> encode(std::string_view text,
                                                 bool add_special_tokens) const override;
  [[nodiscard]] std::size_t min_num_tokens(std::string_view text) const override {
    return count_bound_.min_num_tokens(text);
  }
  [[nodiscard]] std::string decode(std::span<const std::int32_t> ids,
                                   bool skip_special_tokens) const override;
  [[nodiscard]] std::string token_bytes(std::int32_t id) const override;
  [[nodiscard]] bool is_special(std::int32_t id) const override;
  [[nodiscard]] bool strips_leading_space() const override { return strips_space_; }
  [[nodiscard]] int vocab_size() const override { return static_cast<int>(bytes_.size()); }
  [[nodiscard]] std::int32_t bos_token_id() const override { return bos_id_; }
  [[nodiscard]] std::int32_t eos_token_id() const override { return eos_id_; }
  [[nodiscard]] std::int32_t token_to_id(std::string_view token) const override;

 private:
  SentencePieceTokenizer();

  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::vector<std::string> bytes_;  ///< id -> raw bytes (token_bytes)
  std::vector<bool> special_;
  bool add_bos_ = true;
  bool strips_space_ = true;
  std::int32_t bos_id_ = -1;
  std::int32_t eos_id_ = -1;
  TokenCountBound count_bound_;
};

}  // namespace shardline::text
