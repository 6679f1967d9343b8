// Golden tests: Qwen3 tokenizer.json (byte-level BPE) against ids produced by
// the transformers.js port, and stories260K's sentencepiece tokenizer against
// the prompt ids / texts of its reference greedy run.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "text/tokenizer.hpp"
#include "model/tokenizer_loader.hpp"

namespace shardline::text {
namespace text_tokenizer_golden_test {

const std::filesystem::path kShared = SHARDLINE_SHARED_DIR;

nlohmann::json read_json(const std::filesystem::path& file) {
  std::ifstream in(file);
  EXPECT_TRUE(in.good()) << file;
  return nlohmann::json::parse(in);
}

std::unique_ptr<Tokenizer> load_or_die(const std::filesystem::path& dir) {
  auto tok = model::load_tokenizer(dir);
  EXPECT_TRUE(tok.ok()) << (tok.ok() ? "" : tok.error().to_string());
  return tok.ok() ? std::move(tok).value() : nullptr;
}

TEST(Qwen3TokenizerGolden, EncodesAllCasesExactly) {
  const auto tok = load_or_die(kShared / "tokenizers/qwen3");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->token_to_id("<|im_end|>"), 151645);
  EXPECT_EQ(tok->eos_token_id(), 151645);
  EXPECT_EQ(tok->bos_token_id(), -1);
  EXPECT_TRUE(tok->is_special(151644));
  EXPECT_FALSE(tok->is_special(9707));
  EXPECT_FALSE(tok->strips_leading_space());
  const auto golden = read_json(kShared / "tokenizers/qwen3/encode_golden.json");
  ASSERT_EQ(golden["cases"].size(), 12u);
  for (const auto& c : golden["cases"]) {
    const auto text = c["text"].get<std::string>();
    const auto want = c["ids"].get<std::vector<std::int32_t>>();
    EXPECT_EQ(tok->encode(text, /*add_special_tokens=*/false), want) << text;
    // Qwen adds no BOS.
    EXPECT_EQ(tok->encode(text, /*add_special_tokens=*/true), want) << text;
  }
}

TEST(Qwen3TokenizerGolden, DecodeRoundTrips) {
  const auto tok = load_or_die(kShared / "tokenizers/qwen3");
  ASSERT_NE(tok, nullptr);
  const auto golden = read_json(kShared / "tokenizers/qwen3/encode_golden.json");
  for (const auto& c : golden["cases"]) {
    const auto text = c["text"].get<std::string>();
    const auto ids = c["ids"].get<std::vector<std::int32_t>>();
    // All golden texts are already NFC, so decoding gives them back verbatim.
    EXPECT_EQ(tok->decode(ids, /*skip_special_tokens=*/false), text);
  }
  const std::vector<std::int32_t> chat = {151644, 872, 198, 13048, 151645};
  EXPECT_EQ(tok->decode(chat, /*skip_special_tokens=*/true), "user\nHi");
}

// Llama 3.1 (byte-level BPE with its own split regex: digits in groups of
// up to three, ignore_merges, a TemplateProcessing BOS) and Llama 2
// (BPE over characters with byte fallback, Prepend + Replace normalizers
// putting U+2581 for spaces, a Replace / ByteFallback / Fuse / Strip
// decoder): ids from @lenml/tokenizers 3.7.2 (SOURCE.md beside them).
struct GoldenTokenizer {
  const char* dir;
  std::int32_t bos;  ///< what add_special_tokens=true puts first
  std::int32_t eos;
  bool strips_leading_space;
};

class HfTokenizerGolden : public ::testing::TestWithParam<GoldenTokenizer> {};

TEST_P(HfTokenizerGolden, EncodesAllCasesExactlyAndDecodeRoundTrips) {
  const GoldenTokenizer& g = GetParam();
  const auto tok = load_or_die(kShared / "tokenizers" / g.dir);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->bos_token_id(), g.bos);
  EXPECT_EQ(tok->eos_token_id(), g.eos);
  EXPECT_TRUE(tok->is_special(g.bos));
  EXPECT_EQ(tok->strips_leading_space(), g.strips_leading_space);
  const auto golden = read_json(kShared / "tokenizers" / g.dir / "encode_golden.json");
  ASSERT_EQ(golden.size(), 12u);
  for (const auto& c : golden) {
    const auto text = c["text"].get<std::string>();
    const auto want = c["ids"].get<std::vector<std::int32_t>>();
    EXPECT_EQ(tok->encode(text, /*add_special_tokens=*/false), want) << text;
    std::vector<std::int32_t> with_bos = {g.bos};
    with_bos.insert(with_bos.end(), want.begin(), want.end());
    EXPECT_EQ(tok->encode(text, /*add_special_tokens=*/true), with_bos) << text;
    EXPECT_EQ(tok->decode(want, /*skip_special_tokens=*/false), text) << "round trip";
    // Streaming the ids after BOS gives the same text.
    IncrementalDetokenizer detok(*tok, std::span(with_bos).first(1));
    std::string streamed;
    for (const std::int32_t id : want) streamed += detok.push(id);
    streamed += detok.finish();
    EXPECT_EQ(streamed, tok->decode(want, /*skip_special_tokens=*/true)) << "streamed (specials skipped)";
    if (text.find("<|") == std::string::npos) EXPECT_EQ(streamed, text);
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, HfTokenizerGolden,
                         ::testing::Values(GoldenTokenizer{"llama3_1", 128000, 128009, false},
                                           GoldenTokenizer{"llama2", 1, 2, true}),
                         [](const auto& info) { return std::string(info.param.dir); });

TEST(Stories260KTokenizerGolden, PromptIdsAndTexts) {
  const auto dir = kShared / "models/stories260K";
  const auto tok = load_or_die(dir);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocab_size(), 512);
  EXPECT_EQ(tok->bos_token_id(), 1);
  EXPECT_EQ(tok->eos_token_id(), 2);
  EXPECT_TRUE(tok->strips_leading_space());
  EXPECT_TRUE(tok->is_special(1));
  EXPECT_EQ(tok->token_bytes(3 + 0x41), "A");  // <0x41>
  const auto ref = read_json(dir / "reference_greedy.json");
  ASSERT_EQ(ref["cases"].size(), 3u);
  for (const auto& c : ref["cases"]) {
    const auto prompt = c["prompt"].get<std::string>();
    const auto prompt_ids = c["prompt_ids"].get<std::vector<std::int32_t>>();
    const auto gen = c["generated_ids"].get<std::vector<std::int32_t>>();
    EXPECT_EQ(tok->encode(prompt, /*add_special_tokens=*/true), prompt_ids) << prompt;
    EXPECT_EQ(tok->encode(prompt, /*add_special_tokens=*/false),
              std::vector<std::int32_t>(prompt_ids.begin() + 1, prompt_ids.end()));

    std::vector<std::int32_t> all(prompt_ids.begin() + 1, prompt_ids.end());
    all.insert(all.end(), gen.begin(), gen.end());
    EXPECT_EQ(tok->decode(all, true), c["full_text"].get<std::string>());
    EXPECT_EQ(tok->decode(prompt_ids, true), prompt);

    // generated_text is the generated ids decoded on their own (HF-style: the
    // first token's leading space stripped).
    EXPECT_EQ(tok->decode(gen, true), c["generated_text"].get<std::string>());

    // Streaming after the prompt emits the exact continuation:
    // prompt + streamed == full_text (decode(prefix + gen) minus decode(prefix)).
    IncrementalDetokenizer detok(*tok, prompt_ids);
    std::string streamed;
    for (const std::int32_t id : gen) streamed += detok.push(id);
    streamed += detok.finish();
    EXPECT_EQ(prompt + streamed, c["full_text"].get<std::string>()) << prompt;

    // Streaming with only BOS as prefix gives generated_text exactly.
    IncrementalDetokenizer fresh(*tok, std::span(prompt_ids).first(1));
    std::string alone;
    for (const std::int32_t id : gen) alone += fresh.push(id);
    alone += fresh.finish();
    EXPECT_EQ(alone, c["generated_text"].get<std::string>()) << prompt;
    EXPECT_EQ(detok.text(), streamed);
  }
}

TEST(Stories260KTokenizerGolden, DetokenizerWithoutPrefixStripsFirstSpace) {
  const auto dir = kShared / "models/stories260K";
  const auto tok = load_or_die(dir);
  ASSERT_NE(tok, nullptr);
  const auto ref = read_json(dir / "reference_greedy.json");
  const auto& c = ref["cases"][0];
  const auto prompt_ids = c["prompt_ids"].get<std::vector<std::int32_t>>();
  const auto gen = c["generated_ids"].get<std::vector<std::int32_t>>();
  // Only BOS as prefix: the whole text streams out, first space stripped.
  IncrementalDetokenizer detok(*tok, std::span(prompt_ids).first(1));
  std::string streamed;
  for (std::size_t i = 1; i < prompt_ids.size(); ++i) streamed += detok.push(prompt_ids[i]);
  for (const std::int32_t id : gen) streamed += detok.push(id);
  streamed += detok.finish();
  EXPECT_EQ(streamed, c["full_text"].get<std::string>());
}

}  // namespace
}  // namespace shardline::text
