// Unit tests: incremental detokenizer UTF-8 safety, load errors, tokenizer-only folders.
#include <gtest/gtest.h>

#include <fstream>
#include <unistd.h>

#include "text/bpe_tokenizer.hpp"
#include "model/tokenizer_loader.hpp"
#include "text/tokenizer.hpp"

namespace shardline::text {
namespace text_tokenizer_test {

const std::filesystem::path kShared = SHARDLINE_SHARED_DIR;
const std::filesystem::path kQwen = kShared / "tokenizers/qwen3";

bool valid_utf8(std::string_view s) {
  std::string tail;
  return utf8_lossy(s, &tail) == s && tail.empty();
}

/// A fresh temp folder, removed at the end of the test.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    path = std::filesystem::temp_directory_path() /
           ("shardline_tok_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

const Tokenizer& qwen() {
  static const auto tok = [] {
    auto r = model::load_tokenizer(kQwen);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().to_string());
    return r.ok() ? std::move(r).value() : nullptr;
  }();
  if (tok == nullptr) throw std::runtime_error("qwen3 tokenizer did not load");
  return *tok;
}

TEST(Utf8Lossy, ReplacesMaximalIllFormedSubparts) {
  EXPECT_EQ(utf8_lossy("ab"), "ab");
  EXPECT_EQ(utf8_lossy("a\xF0\x9F\xA4"), "a\xEF\xBF\xBD");           // truncated emoji: one U+FFFD
  EXPECT_EQ(utf8_lossy("\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");      // two stray continuations
  EXPECT_EQ(utf8_lossy("\xE2\x82x"), "\xEF\xBF\xBDx");                // broken 3-byte sequence
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  std::string tail;
  EXPECT_EQ(utf8_lossy("x\xF0\x9F", &tail), "x");
  EXPECT_EQ(tail, "\xF0\x9F");
  EXPECT_EQ(utf8_lossy("x\xC3\xA9", &tail), "x\xC3\xA9");
  EXPECT_TRUE(tail.empty());
}

TEST(IncrementalDetokenizer, HoldsBackSplitMultiByteCharacters) {
  const Tokenizer& tok = qwen();
  // "emoji 🤖🚀..." from the golden: 🤖 is split over byte tokens 11162, 97, 244.
  const std::vector<std::int32_t> ids = {37523, 11162, 97, 244, 145836, 144349, 145375, 323};
  IncrementalDetokenizer detok(tok, {});
  std::vector<std::string> pieces;
  for (const std::int32_t id : ids) {
    pieces.push_back(detok.push(id));
    EXPECT_TRUE(valid_utf8(pieces.back())) << "after id " << id;
  }
  EXPECT_EQ(pieces[1], " ");  // token " \xF0\x9F": the space, first bytes of 🤖 held back
  EXPECT_EQ(pieces[2], "");
  EXPECT_EQ(pieces[3], "\xF0\x9F\xA4\x96");  // 🤖 once complete
  EXPECT_EQ(detok.finish(), "");
  EXPECT_EQ(detok.text(), tok.decode(ids, true));
  EXPECT_EQ(detok.text(), "emoji 🤖🚀👍🏽 and");
}

TEST(IncrementalDetokenizer, FinishFlushesIncompleteAsReplacement) {
  const Tokenizer& tok = qwen();
  IncrementalDetokenizer detok(tok, {});
  EXPECT_EQ(detok.push(37523), "emoji");
  EXPECT_EQ(detok.push(11162), " ");
  EXPECT_EQ(detok.finish(), "\xEF\xBF\xBD");
  EXPECT_EQ(detok.text(), tok.decode(std::vector<std::int32_t>{37523, 11162}, true));
}

TEST(IncrementalDetokenizer, PrefixCompletesInOutputAndSpecialsSkipped) {
  const Tokenizer& tok = qwen();
  // Prefix ends inside 🤖: the continuation starts with the completed char.
  const std::vector<std::int32_t> prefix = {37523, 11162};
  IncrementalDetokenizer detok(tok, prefix);
  std::string out = detok.push(97);
  out += detok.push(244);
  out += detok.push(151645);  // <|im_end|>, skipped
  out += detok.finish();
  EXPECT_EQ(out, "\xF0\x9F\xA4\x96");
  IncrementalDetokenizer keep(tok, {}, /*skip_special_tokens=*/false);
  EXPECT_EQ(keep.push(151645), "<|im_end|>");
}

TEST(LoadTokenizer, MissingFolderIsNotFoundNamingIt) {
  const std::filesystem::path dir = "/nonexistent/shardline/tokenizer-dir";
  const auto r = model::load_tokenizer(dir);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::not_found);
  EXPECT_NE(r.error().message.find(dir.string()), std::string::npos) << r.error().message;
}

TEST(LoadTokenizer, EmptyFolderIsNotFound) {
  TempDir tmp;
  const auto r = model::load_tokenizer(tmp.path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::not_found);
  EXPECT_NE(r.error().message.find(tmp.path.string()), std::string::npos);
}

TEST(LoadTokenizer, CorruptTokenizerJsonNamesTheFile) {
  TempDir tmp;
  std::ofstream(tmp.path / "tokenizer.json") << "{ this is not json \x01\x02";
  const auto r = model::load_tokenizer(tmp.path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::corrupt);
  EXPECT_NE(r.error().message.find((tmp.path / "tokenizer.json").string()), std::string::npos)
      << r.error().message;
}

TEST(LoadTokenizer, WellFormedJsonMissingFieldsIsCorrupt) {
  TempDir tmp;
  std::ofstream(tmp.path / "tokenizer.json") << R"({"model": {"type": "BPE"}})";
  const auto r = model::load_tokenizer(tmp.path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::corrupt);
  EXPECT_NE(r.error().message.find("tokenizer.json"), std::string::npos) << r.error().message;
}

TEST(LoadTokenizer, CorruptTokenizerModelNamesTheFile) {
  TempDir tmp;
  std::ofstream(tmp.path / "tokenizer.model") << "garbage, not a protobuf";
  const auto r = model::load_tokenizer(tmp.path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::corrupt);
  EXPECT_NE(r.error().message.find((tmp.path / "tokenizer.model").string()), std::string::npos)
      << r.error().message;
}

TEST(LoadTokenizer, FolderWithOnlyTokenizerFilesWorks) {
  TempDir tmp;
  std::filesystem::copy_file(kShared / "models/stories260K/tokenizer.model", tmp.path / "tokenizer.model");
  auto sp = model::load_tokenizer(tmp.path);
  ASSERT_TRUE(sp.ok()) << sp.error().to_string();
  // No tokenizer_config.json: LlamaTokenizer defaults (BOS added).
  EXPECT_EQ((*sp)->encode("Once upon a time", true), (std::vector<std::int32_t>{1, 403, 407, 261, 378}));

  // tokenizers/qwen3 holds only tokenizer.json + tokenizer_config.json.
  const Tokenizer& q = qwen();
  EXPECT_EQ(q.encode("Hello, my dog is cute", false),
            (std::vector<std::int32_t>{9707, 11, 847, 5562, 374, 18838}));
}

TEST(BpeTokenizer, LongAndUnusualInputs) {
  const Tokenizer& tok = qwen();
  const std::string long_word(5000, 'a');
  const auto ids = tok.encode(long_word, false);
  EXPECT_LT(ids.size(), long_word.size() / 2);
  EXPECT_EQ(tok.decode(ids, false), long_word);
  // Invalid UTF-8 input is encoded as U+FFFD.
  EXPECT_EQ(tok.decode(tok.encode("a\xFF" "b", false), false), "a\xEF\xBF\xBD" "b");
  EXPECT_TRUE(tok.encode("", false).empty());
  // NFC: "e" + combining acute encodes like precomposed "é".
  EXPECT_EQ(tok.encode("caf\x65\xCC\x81", false), tok.encode("caf\xC3\xA9", false));
}

}  // namespace
}  // namespace shardline::text
