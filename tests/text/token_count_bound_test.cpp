// Tokenizer::min_num_tokens (text/token_count_bound.hpp): the bound the
// worker refuses over-long prompts with before tokenizing (issue 46, item 6).
// It must never exceed the real token count: checked against encode() on the
// shipped tokenizers (sentencepiece and three tokenizer.json kinds) over
// random texts built from the characters normalizers collapse, delete,
// compose or fuse; and it must be large enough to refuse a megabyte prompt.
// Normalizers that could change stable characters give no bound (0).

#include "text/token_count_bound.hpp"
#include "model/tokenizer_loader.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "text/bpe_tokenizer.hpp"
#include "text/tokenizer.hpp"

namespace shardline::text {
namespace text_token_count_bound_test {

const std::filesystem::path kShared = SHARDLINE_SHARED_DIR;

std::unique_ptr<Tokenizer> load_or_die(const std::filesystem::path& dir) {
  auto tok = model::load_tokenizer(dir);
  EXPECT_TRUE(tok.ok()) << (tok.ok() ? "" : tok.error().to_string());
  return tok.ok() ? std::move(tok).value() : nullptr;
}

const std::vector<std::filesystem::path>& shipped() {
  static const std::vector<std::filesystem::path> dirs = {
      kShared / "models/stories260K",      // sentencepiece tokenizer.model, byte fallback
      kShared / "tokenizers/llama2",       // tokenizer.json: Prepend + Replace normalizer, byte fallback
      kShared / "tokenizers/llama3_1",     // tokenizer.json: byte-level, no normalizer
      kShared / "tokenizers/qwen3",        // tokenizer.json: byte-level, NFC
  };
  return dirs;
}

/// Pieces that stress the bound: whitespace runs (collapsed or stripped),
/// controls and format characters (deleted by nmt_nfkc), combining marks
/// (composed with what precedes them), Hangul jamo (compose with each
/// other), compatibility characters (NFKC changes them), special-token
/// strings (one token for many characters), long runs that merge into one
/// token, and plain words.
const std::vector<std::string>& pieces() {
  static const std::vector<std::string> p = {
      "a", "e", "the", " ", "  ", "\t", "\n", "\r\n", "     ", "\x01", "\x7f", "\xC2\xA0" /* NBSP */,
      "\xE3\x80\x80" /* ideographic space */, "\xCC\x81" /* U+0301 */, "e\xCC\x81", "\xCC\x88",
      "\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8" /* jamo */, "\xED\x95\x9C" /* 한 */, "\xEF\xBC\xA1" /* Ａ */,
      "\xEF\xAC\x81" /* ﬁ */, "\xE4\xB8\xAD\xE6\x96\x87", "\xF0\x9F\x98\x80" /* 😀 */, "\xE2\x96\x81" /* ▁ */,
      "\xE2\x96\x81\xE2\x96\x81", "<|im_start|>", "<|im_end|>", "<s>", "</s>", "<|begin_of_text|>",
      "aaaaaaaaaaaaaaaa", "================", "0123456789", "\xE2\x80\x8B" /* ZWSP */,
      "\xC2\xAD" /* soft hyphen */, "\xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7", "\xE0\xA4\x95\xE0\xA4\xBF" /* कि */,
      "Once upon a time", ",", ".", "!", "'", "\"", "\xFF" /* invalid UTF-8 */, "\xE2\x82" /* truncated */};
  return p;
}

TEST(TokenCountBound, NeverExceedsTheTokenCountOfShippedTokenizers) {
  std::mt19937 rng(46);
  for (const auto& dir : shipped()) {
    const auto tok = load_or_die(dir);
    ASSERT_NE(tok, nullptr) << dir;
    EXPECT_GT(tok->min_num_tokens("Once upon a time"), 0u) << dir << ": no bound";
    std::uniform_int_distribution<std::size_t> pick(0, pieces().size() - 1), len(0, 60);
    for (int trial = 0; trial < 1500; ++trial) {
      std::string text;
      for (std::size_t n = len(rng); n > 0; --n) text += pieces()[pick(rng)];
      const std::size_t bound = tok->min_num_tokens(text);
      const std::size_t actual = tok->encode(text, /*add_special_tokens=*/false).size();
      ASSERT_LE(bound, actual) << dir << ": " << nlohmann::json(text).dump(-1, ' ', false,
                                                                           nlohmann::json::error_handler_t::replace);
    }
  }
}

TEST(TokenCountBound, RefusesAMegabyteOfProseWithoutTokenizingIt) {
  std::string prose;
  while (prose.size() < (1u << 20))
    prose += "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun. ";
  for (const auto& dir : shipped()) {
    const auto tok = load_or_die(dir);
    ASSERT_NE(tok, nullptr) << dir;
    const std::size_t bound = tok->min_num_tokens(prose);
    // At least one token per 64 bytes of prose: a 128K-token model refuses
    // any prose prompt over 8 MiB from the bound alone, stories260K (512
    // tokens) any over a few KiB. (The byte-level vocabularies' longest
    // tokens are "//---...": 114 characters, but only 41 letters.)
    EXPECT_GT(bound * 64, prose.size()) << dir;
    EXPECT_GT(bound, 512u) << dir;
    // And a real lower bound of this text too (checked on a slice: tokenizing
    // the whole megabyte is what the bound is for avoiding).
    const std::string slice = prose.substr(0, 20000);
    EXPECT_LE(tok->min_num_tokens(slice), tok->encode(slice, false).size()) << dir;
  }
}

/// A character-level tokenizer.json over "abc" with an unk token ("#"),
/// fused: no token holds more than 2 stable characters ("ab").
std::string char_tokenizer(const nlohmann::json& normalizer, const nlohmann::json& pre_tokenizer) {
  const nlohmann::json model = {{"type", "BPE"},     {"vocab", {{"#", 0}, {"a", 1}, {"b", 2}, {"c", 3}, {"ab", 4}}},
                                {"merges", {"a b"}}, {"unk_token", "#"},
                                {"fuse_unk", true}};
  const nlohmann::json doc = {{"version", "1.0"},          {"added_tokens", nlohmann::json::array()},
                              {"normalizer", normalizer},  {"pre_tokenizer", pre_tokenizer},
                              {"post_processor", nullptr}, {"decoder", nullptr},
                              {"model", model}};
  return doc.dump();
}

std::unique_ptr<BpeTokenizer> load_json_or_die(const std::string& text) {
  auto t = BpeTokenizer::load_json(text, "test tokenizer.json", std::nullopt, "", "");
  EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.error().to_string());
  return t.ok() ? std::move(t).value() : nullptr;
}

TEST(TokenCountBound, UnknownCharactersFuseSoOnlyCoveredOnesCount) {
  const auto tok = load_json_or_die(char_tokenizer(nullptr, nullptr));
  ASSERT_NE(tok, nullptr);
  // "zzzz" is one fused <unk>; "ab" one token: a bound of 1 ("ab" holds 2).
  EXPECT_EQ(tok->encode("zzzzab", false).size(), 2u);
  EXPECT_EQ(tok->min_num_tokens("zzzzab"), 1u);
  EXPECT_EQ(tok->min_num_tokens("zzzzzzzzzzzz"), 0u);
  EXPECT_EQ(tok->min_num_tokens("abcabc"), 3u);
  EXPECT_LE(tok->min_num_tokens("abcabc"), tok->encode("abcabc", false).size());
}

TEST(TokenCountBound, NormalizersThatCanChangeStableCharactersGiveNoBound) {
  using nlohmann::json;
  // A whitespace-only literal Replace and NFC keep the bound.
  const json keep = {{"type", "Sequence"},
                     {"normalizers",
                      {{{"type", "NFC"}},
                       {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}}}};
  const auto kept = load_json_or_die(char_tokenizer(keep, nullptr));
  ASSERT_NE(kept, nullptr);
  EXPECT_EQ(kept->min_num_tokens("abc abc"), 3u);

  const json regex_replace = {{"type", "Replace"}, {"pattern", {{"Regex", "c+"}}}, {"content", ""}};
  const json letter_replace = {{"type", "Replace"}, {"pattern", {{"String", "c"}}}, {"content", ""}};
  const json lowercase = {{"type", "Lowercase"}};
  const json removed_split = {{"type", "Split"}, {"pattern", {{"String", "c"}}}, {"behavior", "Removed"}};
  for (const auto& [normalizer, pre] : std::vector<std::pair<json, json>>{
           {regex_replace, nullptr}, {letter_replace, nullptr}, {lowercase, nullptr}, {nullptr, removed_split}}) {
    const auto tok = load_json_or_die(char_tokenizer(normalizer, pre));
    ASSERT_NE(tok, nullptr);
    EXPECT_EQ(tok->min_num_tokens("cccccccccccc"), 0u) << normalizer.dump() << " " << pre.dump();
  }
  // The whitespace-removing pre-tokenizers keep it.
  const auto ws = load_json_or_die(char_tokenizer(nullptr, {{"type", "WhitespaceSplit"}}));
  ASSERT_NE(ws, nullptr);
  EXPECT_EQ(ws->min_num_tokens("abc   abc"), 3u);
}

TEST(TokenCountBound, StableCharacters) {
  EXPECT_TRUE(TokenCountBound::is_stable_char(U'a'));
  EXPECT_TRUE(TokenCountBound::is_stable_char(U'\u4E2D'));   // 中
  EXPECT_TRUE(TokenCountBound::is_stable_char(U'\U0001F600'));
  EXPECT_FALSE(TokenCountBound::is_stable_char(U' '));
  EXPECT_FALSE(TokenCountBound::is_stable_char(U'\x01'));
  EXPECT_FALSE(TokenCountBound::is_stable_char(U'\u0301'));  // combining acute
  EXPECT_FALSE(TokenCountBound::is_stable_char(U'\u00E9'));  // é decomposes
  EXPECT_FALSE(TokenCountBound::is_stable_char(U'\uFF21'));  // fullwidth A: NFKC changes it
  EXPECT_FALSE(TokenCountBound::is_stable_char(U'\u1100'));  // jamo
  EXPECT_FALSE(TokenCountBound::is_stable_char(U'\uD55C'));  // 한 decomposes
  EXPECT_FALSE(TokenCountBound::is_stable_char(U'\u200B'));  // format
  EXPECT_FALSE(TokenCountBound::is_stable_char(U'\u2581'));  // ▁ is a space to sentencepiece
  const auto chars = [](std::string_view t) {
    const TokenChars c = TokenCountBound::count_token_chars(t);
    return std::pair{c.stable, c.letters};
  };
  EXPECT_EQ(chars("\xE2\x96\x81the"), std::pair(std::size_t{3}, std::size_t{3}));
  EXPECT_EQ(chars(" the\n"), std::pair(std::size_t{3}, std::size_t{3}));
  EXPECT_EQ(chars("//----"), std::pair(std::size_t{6}, std::size_t{0}));
  EXPECT_EQ(chars("\xE4\xB8"), std::pair(std::size_t{1}, std::size_t{1}));  // a byte-level token's cut character
  EXPECT_EQ(chars("\xAD\x87a"), std::pair(std::size_t{1}, std::size_t{1}));  // its tail: counted where it began
  // "e" before a combining mark composes with it: not counted.
  const auto b = TokenCountBound::of({1, 1}, nullptr);
  EXPECT_EQ(b.min_num_tokens("e\xCC\x81"), 0u);
  EXPECT_EQ(b.min_num_tokens("ee\xCC\x81"), 1u);
  EXPECT_EQ(TokenCountBound().min_num_tokens("abc"), 0u);
  // Letters bound tighter than all characters when the long tokens are punctuation.
  const auto punct = TokenCountBound::of({100, 2}, nullptr);
  EXPECT_EQ(punct.min_num_tokens("abcdef"), 3u);
  EXPECT_EQ(punct.min_num_tokens("------"), 1u);
}

}  // namespace
}  // namespace shardline::text
