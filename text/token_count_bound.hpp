#pragma once
/// \file
/// A lower bound on a text's token count from one pass over its bytes,
/// without tokenizing (issue 46, item 6: a prompt that cannot fit the
/// context is refused before the tokenizer spends seconds on it).
///
/// The bound counts the text's *stable characters*: a character that every
/// supported normalizer leaves as it is and that always lands whole in one
/// token. Such a character is
///  - a letter, number, punctuation or symbol (Unicode L*, N*, P*, S*; not
///    whitespace, control, format, unassigned or a combining mark: those may
///    be collapsed, deleted or composed by NFKC, sentencepiece's
///    nmt_nfkc, Strip or a whitespace split);
///  - without a decomposition mapping, so NFC, NFD, NFKC and NFKD keep it;
///  - not a Hangul jamo (jamo compose with each other);
///  - not followed by a combining mark (it would compose with it);
///  - covered: the tokenizer never turns it into an unknown token (byte-
///    level and byte-fallback vocabularies cover every character; otherwise
///    the character must be a token of its own), since consecutive unknown
///    characters can fuse into one token.
///  - not "▁" (U+2581), which sentencepiece and Metaspace treat as a space.
/// Each stable character of the text lands in one token (the one holding its
/// first byte), and no token holds more than `max_per_token.stable` of them
/// (counted over every token as it stands in the normalized text, added and
/// special tokens included). So encode(text).size() >= ceil(stable /
/// max_per_token.stable), and likewise for letters and numbers alone.
/// Normalizers that can change or remove such characters (a Lowercase over
/// a vocabulary that does not cover every character, a regex Replace, a
/// Split that removes non-whitespace) make the bound unknown: 0.

#include <array>
#include <cstddef>
#include <functional>
#include <string_view>

namespace shardline::text {

/// Characters of one token that count against the bound.
struct TokenChars {
  std::size_t stable = 0;   ///< first bytes of characters, except ASCII whitespace and "▁"
  std::size_t letters = 0;  ///< of those, letters and numbers (L*, N*; an incomplete character counts)
  /// The larger of each count.
  [[nodiscard]] TokenChars max_with(const TokenChars& o) const noexcept {
    return {stable > o.stable ? stable : o.stable, letters > o.letters ? letters : o.letters};
  }
};

class TokenCountBound {
 public:
  /// No bound: min_num_tokens() is always 0.
  TokenCountBound() = default;

  /// A bound whose tokens hold at most `max_per_token` characters of each
  /// kind (the tokenizer takes TokenChars::max_with over count_token_chars()
  /// of all its tokens). `covered(ch)` says whether the character `ch` (its
  /// UTF-8 bytes) is never an unknown token; null means every character is
  /// covered (byte-level or byte-fallback vocabularies). A zero
  /// max_per_token.stable gives no bound.
  [[nodiscard]] static TokenCountBound of(TokenChars max_per_token,
                                          std::function<bool(std::string_view ch)> covered);

  /// The characters of a token, as it stands in the normalized text, that
  /// count against the bound.
  [[nodiscard]] static TokenChars count_token_chars(std::string_view token);

  /// Whether the character `cp` is stable in the sense above, coverage
  /// aside (and ignoring what follows it).
  [[nodiscard]] static bool is_stable_char(char32_t cp);

  /// A lower bound on the number of tokens of `text` (without added special
  /// tokens such as BOS): the larger of ceil(stable characters /
  /// max stable per token) and ceil(stable letters and numbers / max letters
  /// and numbers per token), the second being tighter where the longest
  /// tokens are punctuation runs ("//-----..."). 0 when unknown. O(text bytes).
  [[nodiscard]] std::size_t min_num_tokens(std::string_view text) const;

  /// The most characters of each kind one token holds; zeros when there is no bound.
  [[nodiscard]] TokenChars max_per_token() const noexcept { return max_per_token_; }

 private:
  enum class CharClass : unsigned char { none, stable, letter };
  TokenChars max_per_token_;
  std::function<bool(std::string_view)> covered_;  ///< null: every character
  std::array<CharClass, 128> ascii_{};             ///< ASCII byte -> its class (covered ones only)
};

}  // namespace shardline::text
