#pragma once
/// \file
/// Hugging Face `tokenizer.json` byte-level BPE (GPT-2 / Qwen / Llama-3 style).
/// Normalizer (NFC/NFD/NFKC/NFKD via utf8proc), pre-tokenizer Split regex
/// (PCRE2, UTF + UCP, JIT) and ByteLevel, ranked merges, added tokens.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/tokenizer.hpp"

namespace shardline::model {

/// Lossy UTF-8 cleanup shared by the tokenizers: each maximal ill-formed
/// subpart becomes U+FFFD (as Rust's `String::from_utf8_lossy`). When `tail`
/// is given, a trailing incomplete-but-so-far-valid sequence is not replaced
/// but moved into `*tail` (for streaming); otherwise it becomes U+FFFD too.
[[nodiscard]] std::string utf8_lossy(std::string_view bytes, std::string* tail = nullptr);

class BpeTokenizer final : public Tokenizer {
 public:
  /// Parses `file` (tokenizer.json). `add_bos_token` / `bos_token` /
  /// `eos_token` come from tokenizer_config.json ("" / nullopt when absent).
  /// Errors: corrupt (bad JSON / fields), unsupported (unknown components).
  [[nodiscard]] static Result<std::unique_ptr<BpeTokenizer>> load(
      const std::filesystem::path& file, std::optional<bool> add_bos_token,
      std::string_view bos_token, std::string_view eos_token);

  ~BpeTokenizer() override;
  BpeTokenizer(const BpeTokenizer&) = delete;
  BpeTokenizer& operator=(const BpeTokenizer&) = delete;

  [[nodiscard]] std::vector<std::int32_t> encode(std::string_view text,
                                                 bool add_special_tokens) const override;
  [[nodiscard]] std::string decode(std::span<const std::int32_t> ids,
                                   bool skip_special_tokens) const override;
  [[nodiscard]] std::string token_bytes(std::int32_t id) const override;
  [[nodiscard]] bool is_special(std::int32_t id) const override;
  [[nodiscard]] bool strips_leading_space() const override { return false; }
  [[nodiscard]] int vocab_size() const override { return static_cast<int>(id_bytes_.size()); }
  [[nodiscard]] std::int32_t bos_token_id() const override { return bos_id_; }
  [[nodiscard]] std::int32_t eos_token_id() const override { return eos_id_; }
  [[nodiscard]] std::int32_t token_to_id(std::string_view token) const override;

 private:
  struct Merge {
    std::int32_t rank;
    std::int32_t id;
  };
  struct AddedToken {
    std::string content;
    std::int32_t id;
  };
  enum class Normalization { none, nfc, nfd, nfkc, nfkd };

  BpeTokenizer() = default;
  void encode_text(std::string_view text, std::vector<std::int32_t>& out) const;
  void encode_word(std::string_view word, std::vector<std::int32_t>& out) const;
  void bpe(std::string_view word, std::vector<std::int32_t>& out) const;

  std::unordered_map<std::string, std::int32_t> vocab_;   ///< raw bytes -> id
  std::unordered_map<std::string, std::int32_t> tokens_;  ///< token string -> id
  std::vector<std::string> id_bytes_;                      ///< id -> raw bytes
  std::vector<bool> special_;
  std::unordered_map<std::uint64_t, Merge> merges_;  ///< (left id, right id) -> merge
  std::int32_t byte_ids_[256] = {};
  std::vector<AddedToken> added_;  ///< matched in raw text, longest first
  std::vector<Normalization> normalizers_;
  void* regex_ = nullptr;  ///< pcre2_code_8*; null: no Split pre-tokenizer
  bool byte_level_regex_ = false;
  bool add_prefix_space_ = false;
  bool ignore_merges_ = false;
  std::vector<std::int32_t> prepend_, append_;  ///< post-processor specials
  std::int32_t bos_id_ = -1;
  std::int32_t eos_id_ = -1;

  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<std::int32_t>> cache_;
};

}  // namespace shardline::model
