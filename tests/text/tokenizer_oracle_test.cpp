// Hugging Face's tokenizers as the oracle of Shardline's tokenizers, over a
// corpus of about 4,000 strings (tests/text/tokenizer_oracle.py: the shared
// goldens, multilingual text, emoji, whitespace runs, numbers, code, special
// tokens in text, random Unicode from many blocks, random splices of all of
// those). For every string: the ids without and with the special tokens, and
// the ids decoded back (specials kept), all equal.
//  - every tokenizer.json under ../shared/tokenizers/ against the `tokenizers`
//    library;
//  - SmolLM2's GGUF (`gpt2` vocabulary) against the tokenizer transformers
//    builds from the same file;
//  - Llama 2's vocabulary written as a `llama` (SentencePiece-style) GGUF,
//    whose merges both sides rebuild from the scores, against transformers'
//    tokenizer from that file and against the tokenizer.json it came from.
// Where transformers' GGUF tokenizer splits text otherwise than llama.cpp
// (a pre-tokenizer name it has no regex for; the llama space prefix), the
// oracle puts llama.cpp's splitting in its place and says so (the script's
// llama_cpp_pre_tokenization, docs/models.md); the test prints how many
// strings that changed.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/tokenizer.hpp"
#include "model/tokenizer_loader.hpp"
#include "tests/support/process.hpp"
#include "tests/support/python.hpp"

namespace shardline::text {
namespace text_tokenizer_oracle_test {

using json = nlohmann::json;

const std::string kShared = SHARDLINE_SHARED_DIR;
const std::string kScript = std::string(SHARDLINE_SOURCE_DIR) + "/tests/text/tokenizer_oracle.py";
const std::string kSmolDir = std::string(SHARDLINE_SOURCE_DIR) + "/models/smollm2-135m-instruct";
const std::string kSmolGguf = "SmolLM2-135M-Instruct.Q4_1.gguf";
constexpr std::size_t kMinCorpus = 3000;

std::string ids_text(const std::vector<std::int32_t>& ids) {
  std::ostringstream o;
  o << "[";
  for (std::size_t i = 0; i < ids.size(); ++i) o << (i ? ", " : "") << ids[i];
  o << "]";
  return o.str();
}

class TokenizerOracle : public testing_support::TempDirTest {
 protected:
  /// Runs the oracle script with `args` (its output file last) and reads it.
  json oracle(const std::string& args, const std::string& out) {
    const std::string problem = testing_support::python_env_problem("tokenizers, transformers, gguf");
    EXPECT_TRUE(problem.empty()) << problem;
    if (!problem.empty()) return json();
    const auto r = testing_support::run_command("TQDM_DISABLE=1 HF_HUB_OFFLINE=1 SHARDLINE_SHARED_DIR=" + kShared +
                                                " " + testing_support::kPython + " " + kScript + " " + args + " " +
                                                path(out));
    EXPECT_EQ(r.exit_code, 0) << r.out;
    if (r.exit_code != 0) return json();
    return json::parse(testing_support::read_file(path(out)));
  }

  /// Every string of the oracle's corpus encoded and decoded by `tok`;
  /// the mismatches are printed (the first 10 in full) and counted.
  static void expect_same(const Tokenizer& tok, const json& want, const std::string& what) {
    ASSERT_TRUE(want.is_object()) << what;
    const auto& texts = want["texts"];
    ASSERT_GE(texts.size(), kMinCorpus) << what;
    ASSERT_EQ(want["ids"].size(), texts.size());
    std::size_t mismatches = 0, num_ids = 0;
    for (std::size_t i = 0; i < texts.size(); ++i) {
      const std::string text = texts[i].get<std::string>();
      const auto ids = want["ids"][i].get<std::vector<std::int32_t>>();
      const auto ids_special = want["ids_special"][i].get<std::vector<std::int32_t>>();
      const std::string decoded = want["decoded"][i].get<std::string>();
      num_ids += ids.size();
      const auto got = tok.encode(text, /*add_special_tokens=*/false);
      const auto got_special = tok.encode(text, /*add_special_tokens=*/true);
      const std::string got_decoded = tok.decode(ids, /*skip_special_tokens=*/false);
      if (got == ids && got_special == ids_special && got_decoded == decoded) continue;
      if (++mismatches <= 10) {
        ADD_FAILURE() << what << ": string " << i << " " << json(text).dump() << "\n  oracle ids " << ids_text(ids)
                      << "\n  shardline  " << ids_text(got) << "\n  oracle with specials " << ids_text(ids_special)
                      << "\n  shardline            " << ids_text(got_special) << "\n  oracle decoded "
                      << json(decoded).dump() << "\n  shardline      " << json(got_decoded).dump();
      }
    }
    std::cout << what << ": " << texts.size() << " strings, " << num_ids << " ids, " << mismatches << " mismatches\n";
    EXPECT_EQ(mismatches, 0u) << what;
  }

  static std::unique_ptr<Tokenizer> load(const std::string& where) {
    auto t = model::load_tokenizer(where);
    EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.error().to_string());
    return t.ok() ? std::move(t).value() : nullptr;
  }
};

TEST_F(TokenizerOracle, EverySharedTokenizerJsonMatchesTheTokenizersLibrary) {
  int num_tokenizers = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kShared + "/tokenizers")) {
    const auto file = entry.path() / "tokenizer.json";
    if (!std::filesystem::exists(file)) continue;
    ++num_tokenizers;
    const std::string name = entry.path().filename().string();
    SCOPED_TRACE(name);
    const json want = oracle("json " + file.string(), name + ".json");
    const auto tok = load(entry.path().string());
    ASSERT_NE(tok, nullptr);
    expect_same(*tok, want, name + " tokenizer.json");
  }
  EXPECT_GE(num_tokenizers, 3);  // llama2, llama3_1, qwen3
}

TEST_F(TokenizerOracle, SmolLm2GgufMatchesTransformersTokenizerFromTheSameFile) {
  ASSERT_TRUE(std::filesystem::exists(kSmolDir + "/" + kSmolGguf))
      << kSmolDir << " has no " << kSmolGguf << " (run `bash deploy/fetch-models.sh`)";
  const json want = oracle("gguf " + kSmolDir + " " + kSmolGguf, "smollm2.json");
  ASSERT_TRUE(want.is_object());
  std::cout << "oracle adjustment: " << want["adjustment"].dump() << ", changed "
            << want["texts_the_adjustment_changed"] << " strings\n";
  const auto tok = load(kSmolDir + "/" + kSmolGguf);
  ASSERT_NE(tok, nullptr);
  expect_same(*tok, want, "SmolLM2 GGUF");
}

TEST_F(TokenizerOracle, LlamaVocabularyGgufMatchesTransformersAndItsTokenizerJson) {
  const std::string source = kShared + "/tokenizers/llama2/tokenizer.json";
  std::filesystem::create_directories(path("llama"));
  const auto w = testing_support::run_command(testing_support::kPython + " " + kScript + " write-llama-gguf " +
                                              source + " " + path("llama/llama2.gguf"));
  ASSERT_EQ(w.exit_code, 0) << w.out;
  const auto tok = load(path("llama/llama2.gguf"));
  ASSERT_NE(tok, nullptr);
  const json want = oracle("gguf " + path("llama") + " llama2.gguf", "llama-gguf.json");
  ASSERT_TRUE(want.is_object());
  std::cout << "oracle adjustment: " << want["adjustment"].dump() << ", changed "
            << want["texts_the_adjustment_changed"] << " strings\n";
  expect_same(*tok, want, "llama GGUF vs transformers");
  expect_same(*tok, oracle("json " + source, "llama2-json.json"), "llama GGUF vs its tokenizer.json");
}

}  // namespace
}  // namespace shardline::text
