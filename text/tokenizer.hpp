#pragma once
/// \file
/// Tokenizers chosen from a model folder's tokenizer files: sentencepiece
/// `tokenizer.model` (through libsentencepiece) or Hugging Face
/// `tokenizer.json` BPE (text/bpe_tokenizer.hpp: pre-tokenizer regex with
/// Unicode classes via PCRE2, byte-to-unicode mapping, ranked merges, added
/// and special tokens). The `text/` layer: it depends on `common/` only.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.hpp"

namespace shardline::text {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  /// Text -> token ids. With `add_special_tokens` the model's BOS is
  /// prepended when its tokenizer config asks for it (Llama/sentencepiece:
  /// add_bos_token; Qwen: none). Special tokens written in the text
  /// (e.g. "<|im_end|>") are parsed as special tokens (HF tokenizer.json).
  [[nodiscard]] virtual std::vector<std::int32_t> encode(std::string_view text,
                                                         bool add_special_tokens) const = 0;

  /// A lower bound on encode(text, false).size(), from one O(bytes) pass
  /// over `text` without tokenizing it (text/token_count_bound.hpp); 0 when
  /// this tokenizer has no bound. The worker refuses a prompt that cannot
  /// fit the context with it before tokenizing (issue 46, item 6).
  [[nodiscard]] virtual std::size_t min_num_tokens(std::string_view text) const {
    (void)text;
    return 0;
  }

  /// Token ids -> text. Special tokens are skipped when `skip_special_tokens`.
  /// Invalid UTF-8 from incomplete byte tokens becomes U+FFFD.
  [[nodiscard]] virtual std::string decode(std::span<const std::int32_t> ids,
                                           bool skip_special_tokens) const = 0;

  /// The raw bytes token `id` contributes to text when it follows other text
  /// (sentencepiece "▁" -> ' ', byte-fallback <0xNN> -> that byte; BPE
  /// byte-level chars -> their bytes). Special tokens give their content.
  [[nodiscard]] virtual std::string token_bytes(std::int32_t id) const = 0;

  /// True for control / special tokens (BOS, EOS, <|im_start|>, ...).
  [[nodiscard]] virtual bool is_special(std::int32_t id) const = 0;

  /// True when decoding strips one leading space from the first token of a
  /// text (sentencepiece add_dummy_prefix).
  [[nodiscard]] virtual bool strips_leading_space() const = 0;

  [[nodiscard]] virtual int vocab_size() const = 0;
  [[nodiscard]] virtual std::int32_t bos_token_id() const = 0;  ///< -1 if none
  [[nodiscard]] virtual std::int32_t eos_token_id() const = 0;  ///< -1 if none
  /// Id of a token string ("<|im_end|>"), -1 if unknown.
  [[nodiscard]] virtual std::int32_t token_to_id(std::string_view token) const = 0;
};

/// Loads the tokenizer files of `dir`: `tokenizer.json` if present (and
/// supported), else `tokenizer.model`. `dir` may be a model folder or a
/// folder holding only tokenizer files (tokenizer_config.json is read for
/// add_bos_token, bos/eos). A GGUF model's tokenizer (its metadata) is the
/// model layer's: model/tokenizer_loader.hpp `load_tokenizer` reads either.
/// Errors: not_found (neither file), corrupt (unparsable file; names it).
[[nodiscard]] Result<std::unique_ptr<Tokenizer>> load_tokenizer_files(const std::filesystem::path& dir);

/// True when `dir` holds tokenizer.json or tokenizer.model.
[[nodiscard]] bool has_tokenizer_files(const std::filesystem::path& dir);

/// Incremental detokenization for streaming output: feed generated ids one at
/// a time and get only newly completed text. Never emits a broken UTF-8
/// sequence: bytes of an incomplete multi-byte character are held back until
/// the character completes (or flushed as U+FFFD by `finish()`).
class IncrementalDetokenizer {
 public:
  /// `prefix_ids`: ids already in the text (the prompt); text after them is
  /// what this object emits. With an empty prefix, a leading-space-stripping
  /// tokenizer strips the first token's leading space.
  IncrementalDetokenizer(const Tokenizer& tokenizer, std::span<const std::int32_t> prefix_ids,
                         bool skip_special_tokens = true);

  /// Appends a token; returns the text that became complete (maybe "").
  [[nodiscard]] std::string push(std::int32_t id);
  /// Flushes held-back bytes (as U+FFFD if they never completed).
  [[nodiscard]] std::string finish();
  /// All text emitted so far (what push/finish returned, concatenated).
  [[nodiscard]] const std::string& text() const { return text_; }

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  bool at_start_;
  std::string pending_;  ///< bytes of an incomplete UTF-8 character
  std::string text_;
};

}  // namespace shardline::text
