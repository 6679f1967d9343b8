// The tokenizer.json pipeline parts of text/bpe_tokenizer.hpp on tiny
// hand-written tokenizers, each expectation worked out from the tokenizers
// library's definition of the part (cited beside it): Split behaviours,
// Metaspace prepend schemes, Digits, Punctuation, Whitespace, the
// normalizers, BPE over characters with byte fallback and fused unks, the
// decoders, and added tokens with lstrip / rstrip / single_word. An unknown
// part fails to load with its name. (The real files are in
// tokenizer_golden_test.cpp.)
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "text/bpe_tokenizer.hpp"

namespace shardline::text {
namespace text_bpe_pipeline_test {

using json = nlohmann::json;

const char* const kMeta = "\xE2\x96\x81";  // U+2581, SentencePiece's space

/// A character-level BPE vocab: single characters, a few merges, byte fallback.
json char_model(bool byte_fallback = true, bool fuse_unk = false) {
  json vocab = json::object();
  int id = 0;
  for (const std::string t : {"<unk>", "<s>", "</s>"}) vocab[t] = id++;
  for (const std::string t : {"<0x41>", "<0x0A>", "<0xE2>", "<0x82>", "<0xAC>"}) vocab[t] = id++;
  for (const std::string t : {"a", "b", "c", "1", "2", "3", ",", "!", " ", kMeta}) vocab[t] = id++;
  for (const std::string& t : std::vector<std::string>{"ab", "abc", std::string(kMeta) + "a", std::string(kMeta) + "ab", "12"})
    vocab[t] = id++;
  // Ranks: "▁ a" before "a b", so "▁ab" forms as ▁a + b.
  json merges = json::array({std::string(kMeta) + " a", std::string(kMeta) + "a b", "a b", "ab c", "1 2"});
  return {{"type", "BPE"},         {"dropout", nullptr},       {"unk_token", "<unk>"},
          {"fuse_unk", fuse_unk},  {"byte_fallback", byte_fallback}, {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr}, {"vocab", vocab},   {"merges", merges}};
}

struct TempFile {
  std::filesystem::path dir;
  TempFile() {
    dir = std::filesystem::temp_directory_path() /
          ("shardline_bpe_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  ~TempFile() { std::filesystem::remove_all(dir); }
};

/// Loads a tokenizer.json made of these parts.
Result<std::unique_ptr<BpeTokenizer>> load(const json& normalizer, const json& pre_tokenizer, const json& decoder,
                                           json model = char_model(), json added = json::array()) {
  TempFile tmp;
  const json doc = {{"version", "1.0"},        {"added_tokens", added}, {"normalizer", normalizer},
                    {"pre_tokenizer", pre_tokenizer}, {"post_processor", nullptr}, {"decoder", decoder},
                    {"model", model}};
  std::ofstream(tmp.dir / "tokenizer.json") << doc.dump();
  return BpeTokenizer::load(tmp.dir / "tokenizer.json", std::nullopt, "<s>", "</s>");
}

/// The token strings of `text`'s ids, joined by '|'.
std::string pieces(const BpeTokenizer& tok, const std::string& text) {
  std::string out;
  for (const std::int32_t id : tok.encode(text, false)) {
    if (!out.empty()) out += '|';
    out += tok.token_bytes(id);
  }
  return out;
}

json split(const std::string& regex, const std::string& behavior, bool invert = false) {
  return {{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", behavior}, {"invert", invert}};
}

TEST(BpePipeline, SplitBehaviours) {
  // tokenizers' SplitDelimiterBehavior on "ab,c,,": the matches are the commas.
  const struct {
    const char* behavior;
    bool invert;
    const char* want;
  } cases[] = {
      {"Isolated", false, "ab|,|c|,|,"},
      {"Removed", false, "ab|c"},
      {"MergedWithPrevious", false, "ab|,|c|,|,"},  // "ab," "c," ","  -> BPE per piece
      {"MergedWithNext", false, "ab|,|c|,|,"},      // "ab" ",c" "," ","
      {"Contiguous", false, "ab|,|c|,|,"},          // "ab" "," "c" ",,"
      {"Removed", true, ",|,|,"},                   // invert: the words are the delimiters
  };
  for (const auto& c : cases) {
    auto tok = load(nullptr, split(",", c.behavior, c.invert), nullptr);
    ASSERT_TRUE(tok.ok()) << tok.error().to_string();
    EXPECT_EQ(pieces(**tok, "ab,c,,"), c.want) << c.behavior;
  }
  // The pieces matter where a merge would cross them: "abc" is one token,
  // but split before 'c' (MergedWithNext on 'c') it is "ab" + "c".
  auto whole = load(nullptr, nullptr, nullptr);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(pieces(**whole, "abc"), "abc");
  auto next = load(nullptr, split("c", "MergedWithNext"), nullptr);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(pieces(**next, "abc"), "ab|c");
  auto previous = load(nullptr, split("b", "MergedWithPrevious"), nullptr);
  ASSERT_TRUE(previous.ok());
  EXPECT_EQ(pieces(**previous, "abc"), "ab|c");  // "ab" "c"
  auto contiguous = load(nullptr, split("[ab]", "Contiguous"), nullptr);
  ASSERT_TRUE(contiguous.ok());
  EXPECT_EQ(pieces(**contiguous, "abc"), "ab|c");  // "ab" (two matches merged) "c"
  auto isolated = load(nullptr, split("[ab]", "Isolated"), nullptr);
  ASSERT_TRUE(isolated.ok());
  EXPECT_EQ(pieces(**isolated, "abc"), "a|b|c");
}

TEST(BpePipeline, MetaspacePrependSchemesAndItsDecoder) {
  const json dec = {{"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", "always"}, {"split", true}};
  // always: "ab ab" -> "▁ab▁ab" split before each ▁ -> "▁ab" "▁ab".
  auto always = load(nullptr, {{"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", "always"},
                               {"split", true}},
                     dec);
  ASSERT_TRUE(always.ok()) << always.error().to_string();
  const std::string meta_ab = std::string(" ab");  // token_bytes: ▁ decoded to a space
  EXPECT_EQ(pieces(**always, "ab ab"), meta_ab + "|" + meta_ab);
  EXPECT_TRUE((*always)->strips_leading_space());
  EXPECT_EQ((*always)->decode((*always)->encode("ab ab", false), false), "ab ab");
  // never: no ▁ in front of the first word.
  auto never = load(nullptr, {{"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", "never"},
                              {"split", true}},
                    nullptr);
  ASSERT_TRUE(never.ok());
  EXPECT_EQ(pieces(**never, "ab ab"), std::string("ab|") + kMeta + "ab");
  // first: only the piece at the start of the input gets one; after an
  // added token the next segment does not.
  const json added = json::array({{{"id", 1}, {"content", "<s>"}, {"special", true}}});
  auto first = load(nullptr, {{"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", "first"},
                              {"split", false}},
                    nullptr, char_model(), added);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(pieces(**first, "ab<s>ab"), std::string(kMeta) + "ab|<s>|ab");
}

TEST(BpePipeline, DigitsPunctuationWhitespace) {
  // Digits individual: "123" -> 1|2|3 (no "12" merge across pieces); grouped: 12|3.
  auto individual = load(nullptr, {{"type", "Digits"}, {"individual_digits", true}}, nullptr);
  ASSERT_TRUE(individual.ok()) << individual.error().to_string();
  EXPECT_EQ(pieces(**individual, "a123"), "a|1|2|3");
  auto grouped = load(nullptr, {{"type", "Digits"}, {"individual_digits", false}}, nullptr);
  ASSERT_TRUE(grouped.ok());
  EXPECT_EQ(pieces(**grouped, "a123"), "a|12|3");
  // Punctuation (Isolated): "ab!c" -> "ab" "!" "c".
  auto punct = load(nullptr, {{"type", "Punctuation"}, {"behavior", "Isolated"}}, nullptr);
  ASSERT_TRUE(punct.ok());
  EXPECT_EQ(pieces(**punct, "abc!abc"), "abc|!|abc");
  // Whitespace: \w+|[^\w\s]+ kept, spaces removed.
  auto ws = load(nullptr, {{"type", "Whitespace"}}, nullptr);
  ASSERT_TRUE(ws.ok());
  EXPECT_EQ(pieces(**ws, "ab  c,!"), "ab|c|,|!");
  auto wss = load(nullptr, {{"type", "WhitespaceSplit"}}, nullptr);
  ASSERT_TRUE(wss.ok());
  EXPECT_EQ(pieces(**wss, " ab  c,! "), "ab|c|,|!");
}

TEST(BpePipeline, NormalizersInOrder) {
  const json seq = {{"type", "Sequence"},
                    {"normalizers", json::array({{{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}},
                                                 {{"type", "Lowercase"}},
                                                 {{"type", "Replace"}, {"pattern", {{"Regex", "[0-9]+"}}},
                                                  {"content", "1"}},
                                                 {{"type", "Prepend"}, {"prepend", kMeta}}})}};
  auto tok = load(seq, nullptr, nullptr);
  ASSERT_TRUE(tok.ok()) << tok.error().to_string();
  // "  AB 987c \n" -> strip -> "AB 987c" -> lower -> "ab 987c" -> "ab 1c" -> "▁ab 1c"
  EXPECT_EQ(pieces(**tok, "  AB 987c \n"), std::string(kMeta) + "ab| |1|c");
  // Prepend leaves an empty segment empty.
  EXPECT_TRUE((*tok)->encode("   ", false).empty());
}

TEST(BpePipeline, ByteFallbackAndUnknownCharacters) {
  // 'A' is not a token, <0x41> is; '€' (E2 82 AC) falls back to its three bytes.
  auto tok = load(nullptr, nullptr,
                  {{"type", "Sequence"},
                   {"decoders", json::array({{{"type", "ByteFallback"}}, {{"type", "Fuse"}}})}});
  ASSERT_TRUE(tok.ok()) << tok.error().to_string();
  const auto ids = (*tok)->encode("aA\xE2\x82\xAC", false);
  ASSERT_EQ(ids.size(), 5u);
  EXPECT_EQ((*tok)->token_bytes(ids[1]), "A");
  EXPECT_EQ((*tok)->decode(ids, false), "aA\xE2\x82\xAC");
  // 'z' has no token and no <0x7A>: unk; fused when fuse_unk, one per character otherwise.
  EXPECT_EQ((*tok)->encode("zz", false), (std::vector<std::int32_t>{0, 0}));
  auto fused = load(nullptr, nullptr, nullptr, char_model(true, true));
  ASSERT_TRUE(fused.ok());
  EXPECT_EQ((*fused)->encode("zzaz", false), (std::vector<std::int32_t>{0, (*fused)->token_to_id("a"), 0}));
  // Without byte fallback 'A' is unknown too.
  auto no_fallback = load(nullptr, nullptr, nullptr, char_model(false));
  ASSERT_TRUE(no_fallback.ok());
  EXPECT_EQ((*no_fallback)->encode("A", false), (std::vector<std::int32_t>{0}));
}

TEST(BpePipeline, SentencePieceStyleDecoderStripsOneLeadingSpace) {
  const json norm = {{"type", "Sequence"},
                     {"normalizers", json::array({{{"type", "Prepend"}, {"prepend", kMeta}},
                                                  {{"type", "Replace"}, {"pattern", {{"String", " "}}},
                                                   {"content", kMeta}}})}};
  const json dec = {{"type", "Sequence"},
                    {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", kMeta}}},
                                               {"content", " "}},
                                              {{"type", "ByteFallback"}},
                                              {{"type", "Fuse"}},
                                              {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}};
  auto tok = load(norm, nullptr, dec);
  ASSERT_TRUE(tok.ok()) << tok.error().to_string();
  EXPECT_TRUE((*tok)->strips_leading_space());
  EXPECT_EQ(pieces(**tok, "ab abc"), " ab| ab|c");  // "▁ab▁abc": ▁ab, ▁ab, c
  EXPECT_EQ((*tok)->decode((*tok)->encode(" ab", false), false), " ab");  // "▁▁ab": one space stripped
}

TEST(BpePipeline, AddedTokensStripAndSingleWord) {
  const int c_id = char_model()["vocab"]["c"].get<int>();
  const json added = json::array({{{"id", 1}, {"content", "<s>"}, {"special", true}, {"lstrip", true},
                                   {"rstrip", true}},
                                  {{"id", c_id}, {"content", "c"}, {"special", false}, {"single_word", true}}});
  auto tok = load(nullptr, nullptr, nullptr, char_model(), added);
  ASSERT_TRUE(tok.ok()) << tok.error().to_string();
  // lstrip / rstrip: the spaces beside <s> go with it.
  EXPECT_EQ(pieces(**tok, "ab  <s>  ab"), "ab|<s>|ab");
  // single_word: inside "abc" the added "c" does not match, so BPE makes
  // "abc" (matched, the text would split into "ab" + "c"); alone it matches.
  EXPECT_EQ(pieces(**tok, "abc"), "abc");
  EXPECT_EQ(pieces(**tok, "ab c"), "ab| |c");
  // Without single_word it splits "abc".
  json plain = added;
  plain[1]["single_word"] = false;
  auto split_tok = load(nullptr, nullptr, nullptr, char_model(), plain);
  ASSERT_TRUE(split_tok.ok());
  EXPECT_EQ(pieces(**split_tok, "abc"), "ab|c");
}

TEST(BpePipeline, UnknownPartsFailToLoadNamingThem) {
  const struct {
    json normalizer, pre_tokenizer, decoder, model;
    const char* words;
  } cases[] = {
      {{{"type", "Precompiled"}}, nullptr, nullptr, char_model(), "normalizer Precompiled"},
      {nullptr, {{"type", "UnicodeScripts"}}, nullptr, char_model(), "pre-tokenizer UnicodeScripts"},
      {nullptr, split(",", "Sideways"), nullptr, char_model(), "Split behavior Sideways"},
      {nullptr, nullptr, {{"type", "WordPiece"}}, char_model(), "decoder WordPiece"},
      {nullptr, nullptr, nullptr, json{{"type", "Unigram"}, {"vocab", json::array()}}, "model Unigram"},
      {nullptr, nullptr, nullptr, [] {
         json m = char_model();
         m["dropout"] = 0.1;
         return m;
       }(),
       "BPE dropout"},
  };
  for (const auto& c : cases) {
    auto tok = load(c.normalizer, c.pre_tokenizer, c.decoder, c.model);
    ASSERT_FALSE(tok.ok()) << c.words;
    EXPECT_EQ(tok.error().code, ErrorCode::unsupported) << tok.error().to_string();
    EXPECT_NE(tok.error().message.find(c.words), std::string::npos) << tok.error().message;
  }
}

}  // namespace
}  // namespace shardline::text
