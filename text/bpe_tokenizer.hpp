#pragma once
/// \file
/// Hugging Face `tokenizer.json` with a BPE model, run as the `tokenizers`
/// library runs it: added tokens split out first (longest match; `lstrip`,
/// `rstrip`, `single_word`), then for each remaining segment the normalizer,
/// the pre-tokenizer and the model, and on `add_special_tokens` the
/// post-processor's specials.
///
/// Supported parts (anything else fails to load with `unsupported` naming
/// the part):
///  - normalizers: Sequence, NFC, NFD, NFKC, NFKD (utf8proc), Prepend,
///    Replace (String or Regex), Strip, Lowercase;
///  - pre-tokenizers: Sequence, Split (String or Regex; behaviours Removed,
///    Isolated, MergedWithPrevious, MergedWithNext, Contiguous; invert),
///    ByteLevel (with or without its GPT-2 regex, add_prefix_space),
///    Metaspace (replacement, prepend_scheme always / first / never, split),
///    Digits, Punctuation, Whitespace, WhitespaceSplit (PCRE2, UTF + UCP, JIT);
///  - model: BPE, byte-level (a ByteLevel pre-tokenizer: symbols are bytes)
///    or over characters with `byte_fallback` (`<0xNN>` tokens), `unk_token`
///    and `fuse_unk`; `ignore_merges`; `dropout` null (a set dropout is
///    refused: it makes encoding random);
///  - decoders: Sequence, ByteLevel, Replace (String), ByteFallback, Fuse,
///    Strip (one leading space after Fuse), Metaspace; applied per token at
///    load, so `token_bytes()` is each token's bytes and a stripped leading
///    space shows as `strips_leading_space()`;
///  - post-processors: Sequence, ByteLevel, TemplateProcessing (single).
/// Known difference: a Split regex that matches the empty string splits
/// nowhere here (PCRE2_NOTEMPTY), where Rust's regex splits around each
/// empty match; no shipped tokenizer has such a pattern.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/token_count_bound.hpp"
#include "text/tokenizer.hpp"

namespace shardline::text {

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
  /// The same from the text of a tokenizer.json; `name` (a file, or
  /// "FILE.gguf metadata") prefixes every error.
  [[nodiscard]] static Result<std::unique_ptr<BpeTokenizer>> load_json(
      std::string_view json_text, const std::string& name, std::optional<bool> add_bos_token,
      std::string_view bos_token, std::string_view eos_token);

  ~BpeTokenizer() override = default;
  BpeTokenizer(const BpeTokenizer&) = delete;
  BpeTokenizer& operator=(const BpeTokenizer&) = delete;

  [[nodiscard]] std::vector<std::int32_t> encode(std::string_view text,
                                                 bool add_special_tokens) const override;
  [[nodiscard]] std::size_t min_num_tokens(std::string_view text) const override {
    return count_bound_.min_num_tokens(text);
  }
  [[nodiscard]] std::string decode(std::span<const std::int32_t> ids,
                                   bool skip_special_tokens) const override;
  [[nodiscard]] std::string token_bytes(std::int32_t id) const override;
  [[nodiscard]] bool is_special(std::int32_t id) const override;
  [[nodiscard]] bool strips_leading_space() const override { return strips_leading_space_; }
  [[nodiscard]] int vocab_size() const override { return static_cast<int>(id_bytes_.size()); }
  [[nodiscard]] std::int32_t bos_token_id() const override { return bos_id_; }
  [[nodiscard]] std::int32_t eos_token_id() const override { return eos_id_; }
  [[nodiscard]] std::int32_t token_to_id(std::string_view token) const override;

 private:
  struct Loader;  // reads tokenizer.json's parts (bpe_tokenizer.cpp)
  struct Merge {
    std::int32_t rank;
    std::int32_t id;
  };
  struct AddedToken {
    std::string content;
    std::int32_t id;
    bool lstrip = false, rstrip = false, single_word = false;
  };
  struct NormStep;  // bpe_tokenizer.cpp
  struct PreStep;

  BpeTokenizer() = default;
  /// One segment between added tokens: normalize, pre-tokenize, BPE.
  void encode_text(std::string_view text, bool first_segment, std::vector<std::int32_t>& out) const;
  [[nodiscard]] std::string normalize(std::string text) const;
  void encode_word(std::string_view word, std::vector<std::int32_t>& out) const;
  void bpe(std::string_view word, std::vector<std::int32_t>& out) const;
  /// The word's first symbols: bytes (byte-level) or characters with byte fallback / unk.
  void initial_symbols(std::string_view word, std::vector<std::int32_t>& ids) const;
  /// Whether the character `ch` (UTF-8) never becomes the unk token.
  [[nodiscard]] bool covers(std::string_view ch) const;
  /// min_num_tokens' bound; none when a normalizer or pre-tokenizer can
  /// change or drop stable characters (token_count_bound.hpp).
  [[nodiscard]] TokenCountBound make_count_bound() const;

  std::unordered_map<std::string, std::int32_t> vocab_;   ///< raw bytes -> id (byte-level only)
  std::unordered_map<std::string, std::int32_t> tokens_;  ///< token string -> id
  std::vector<std::string> id_bytes_;                      ///< id -> raw bytes (decoded)
  std::vector<bool> special_;
  std::unordered_map<std::uint64_t, Merge> merges_;  ///< (left id, right id) -> merge
  std::int32_t byte_ids_[256] = {};  ///< byte-level: the token of each byte; else byte fallback's <0xNN> (-1: none)
  std::vector<AddedToken> added_;  ///< matched in raw text, longest first
  std::vector<std::shared_ptr<NormStep>> normalizers_;
  std::vector<std::shared_ptr<PreStep>> pre_tokenizers_;
  bool byte_level_ = false;     ///< symbols are bytes (a ByteLevel pre-tokenizer)
  bool byte_fallback_ = false;  ///< unknown characters become <0xNN> tokens
  bool fuse_unk_ = false;
  std::int32_t unk_id_ = -1;
  bool ignore_merges_ = false;
  bool drops_non_whitespace_ = false;  ///< a Split pre-tokenizer with behavior Removed (not Whitespace*)
  TokenCountBound count_bound_;
  bool strips_leading_space_ = false;  ///< a Strip-after-Fuse or Metaspace decoder
  std::vector<std::int32_t> prepend_, append_;  ///< post-processor specials
  std::int32_t bos_id_ = -1;
  std::int32_t eos_id_ = -1;

  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<std::int32_t>> cache_;
};

}  // namespace shardline::text
