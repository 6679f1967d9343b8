// Structured outputs' grammar layer (sampling/structured_output/grammar.hpp)
// on xgrammar, with Shardline's own tokenizers (tests/sampling/
// grammar_walk.hpp). Each output of the constrained random walk is checked
// with an oracle of its own (nlohmann/json, std::regex, the choice list).

#include "sampling/structured_output/grammar.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "tests/sampling/grammar_walk.hpp"

namespace shardline::sampling {
namespace sampling_grammar_test {
using grammar_walk::generate;
using grammar_walk::Generated;
using grammar_walk::id_of_bytes;
using grammar_walk::smollm2;
using grammar_walk::stories260k;
using grammar_walk::Vocab;

TEST(StructuredOutputGrammar, BitmaskAppliesAsWordsOfBits) {
  EXPECT_EQ(bitmask_words(0), 0);
  EXPECT_EQ(bitmask_words(1), 1);
  EXPECT_EQ(bitmask_words(32), 1);
  EXPECT_EQ(bitmask_words(33), 2);
  std::vector<float> logits(40, 1.0f);
  // Word 0: tokens 0, 5 and 31 allowed; word 1: token 32 and 39 allowed
  // (bits past the vocabulary are ignored).
  const std::vector<std::uint32_t> mask{(1u << 0) | (1u << 5) | (1u << 31), (1u << 0) | (1u << 7) | (1u << 20)};
  apply_token_bitmask(logits, mask);
  for (int i = 0; i < 40; ++i) {
    const bool allowed = i == 0 || i == 5 || i == 31 || i == 32 || i == 39;
    if (allowed)
      EXPECT_EQ(logits[static_cast<std::size_t>(i)], 1.0f) << i;
    else
      EXPECT_EQ(logits[static_cast<std::size_t>(i)], -std::numeric_limits<float>::infinity()) << i;
  }
  // A word of zeros masks all its 32 tokens, one of ones none of them, a
  // mixed word exactly its clear bits (the three cases the apply handles
  // apart), up to a vocabulary that ends inside the last word.
  std::vector<float> row(100);
  for (std::size_t i = 0; i < row.size(); ++i) row[i] = static_cast<float>(i) - 50.0f;
  const std::vector<std::uint32_t> words{0u, 0xFFFFFFFFu, 0xA5A5A5A5u, 0xFFFFFFFFu};
  apply_token_bitmask(row, words);
  for (std::size_t i = 0; i < row.size(); ++i) {
    const bool allowed = ((words[i / 32] >> (i % 32)) & 1u) != 0;
    EXPECT_EQ(row[i], allowed ? static_cast<float>(i) - 50.0f : -std::numeric_limits<float>::infinity()) << i;
  }
}

TEST(StructuredOutputGrammar, JsonSchemaOutputsParseAndFitTheSchema) {
  const std::string schema = R"({"type": "object",
    "properties": {"name": {"type": "string", "maxLength": 6},
                   "age": {"type": "integer", "minimum": 0, "maximum": 120},
                   "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
    "required": ["name", "age"], "additionalProperties": false})";
  for (const Vocab& v : {stories260k(), smollm2()}) {
    for (const unsigned seed : {1u, 2u, 3u}) {
      GrammarSpec spec{GrammarKind::json_schema, schema, {}, false};
      const Generated g = generate(v, spec, seed);
      ASSERT_TRUE(g.terminated) << "seed " << seed << ": " << g.text;
      const auto j = nlohmann::json::parse(g.text, nullptr, false);
      ASSERT_FALSE(j.is_discarded()) << g.text;
      ASSERT_TRUE(j.is_object()) << g.text;
      ASSERT_TRUE(j.contains("name") && j["name"].is_string()) << g.text;
      EXPECT_LE(j["name"].get<std::string>().size(), 6u) << g.text;
      ASSERT_TRUE(j.contains("age") && j["age"].is_number_integer()) << g.text;
      EXPECT_GE(j["age"].get<long long>(), 0) << g.text;
      EXPECT_LE(j["age"].get<long long>(), 120) << g.text;
      for (const auto& [key, value] : j.items()) {
        EXPECT_TRUE(key == "name" || key == "age" || key == "tags") << g.text;
        if (key == "tags") {
          ASSERT_TRUE(value.is_array()) << g.text;
          EXPECT_LE(value.size(), 2u) << g.text;
          for (const auto& t : value) EXPECT_TRUE(t == "a" || t == "b") << g.text;
        }
      }
    }
  }
}

TEST(StructuredOutputGrammar, JsonObjectRegexChoiceAndEbnfOutputsMatch) {
  for (const Vocab& v : {stories260k(), smollm2()}) {
    for (const unsigned seed : {4u, 5u}) {
      const Generated obj = generate(v, GrammarSpec{GrammarKind::json_object, "", {}, false}, seed);
      ASSERT_TRUE(obj.terminated) << obj.text;
      EXPECT_FALSE(nlohmann::json::parse(obj.text, nullptr, false).is_discarded()) << obj.text;

      const Generated re = generate(v, GrammarSpec{GrammarKind::regex, "[a-c]{2}-[0-9]{3}", {}, true}, seed);
      ASSERT_TRUE(re.terminated) << re.text;
      EXPECT_TRUE(std::regex_match(re.text, std::regex("[a-c]{2}-[0-9]{3}"))) << re.text;

      const std::vector<std::string> choices{"yes", "no", "say \"maybe\"\\n"};
      const Generated ch = generate(v, GrammarSpec{GrammarKind::choice, "", choices, true}, seed);
      ASSERT_TRUE(ch.terminated) << ch.text;
      EXPECT_NE(std::find(choices.begin(), choices.end(), ch.text), choices.end()) << ch.text;

      const Generated eb =
          generate(v, GrammarSpec{GrammarKind::ebnf, R"g(root ::= "(" [0-9]+ ("," [0-9]+)* ")")g", {}, true}, seed);
      ASSERT_TRUE(eb.terminated) << eb.text;
      EXPECT_TRUE(std::regex_match(eb.text, std::regex(R"(\([0-9]+(,[0-9]+)*\))"))) << eb.text;
    }
  }
}

// json_object is any JSON object, its whitespace runs bounded as a schema's
// (at most 4 in a row): the fifth space in a row is refused, and a walk's
// output is an object.
TEST(StructuredOutputGrammar, JsonObjectIsAnObjectWithBoundedWhitespace) {
  for (const Vocab& v : {stories260k(), smollm2()}) {
    auto g = v.compiler->compile(GrammarSpec{GrammarKind::json_object, "", {}, true});
    ASSERT_TRUE(g.ok()) << g.error().to_string();
    const std::int32_t brace = id_of_bytes(*v.tokenizer, "{"), space = id_of_bytes(*v.tokenizer, " ");
    ASSERT_GE(brace, 0);
    ASSERT_GE(space, 0);
    GrammarMatcher m(*g);
    ASSERT_TRUE(m.accept_token(brace).ok());
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(m.accept_token(space).ok()) << "space " << i + 1;
    EXPECT_FALSE(m.accept_token(space).ok()) << "a fifth space in a row";
    GrammarMatcher arr(*g);
    EXPECT_FALSE(arr.accept_token(id_of_bytes(*v.tokenizer, "[")).ok()) << "an array is not an object";
    for (const unsigned seed : {1u, 2u}) {
      const Generated obj = generate(v, GrammarSpec{GrammarKind::json_object, "", {}, true}, seed);
      ASSERT_TRUE(obj.terminated) << obj.text;
      EXPECT_TRUE(nlohmann::json::parse(obj.text, nullptr, false).is_object()) << obj.text;
    }
  }
}

// A stop token is allowed exactly when the grammar may end: never inside
// "ab", and at the end of it.
TEST(StructuredOutputGrammar, StopTokenAllowedExactlyWhenTheGrammarMayEnd) {
  const Vocab v = stories260k();
  auto g = v.compiler->compile(GrammarSpec{GrammarKind::choice, "", {"ab"}, true});
  ASSERT_TRUE(g.ok()) << g.error().to_string();
  GrammarMatcher m(*g);
  const std::int32_t eos = v.tokenizer->eos_token_id();
  std::vector<std::uint32_t> mask(static_cast<std::size_t>(bitmask_words(v.compiler->vocab_size())));
  const auto allowed = [&](std::int32_t id) { return ((mask[static_cast<std::size_t>(id) / 32] >> (id % 32)) & 1u) != 0; };
  ASSERT_TRUE(m.fill_next_token_bitmask(mask).ok());
  EXPECT_FALSE(allowed(eos));
  // "a" then "b", each a token of its own bytes; EOS stays masked until
  // the last one.
  const std::vector<std::int32_t> ids{id_of_bytes(*v.tokenizer, "a"), id_of_bytes(*v.tokenizer, "b")};
  ASSERT_GE(ids[0], 0);
  ASSERT_GE(ids[1], 0);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ASSERT_TRUE(m.fill_next_token_bitmask(mask).ok());
    EXPECT_FALSE(allowed(eos)) << "before token " << i;
    ASSERT_TRUE(allowed(ids[i])) << "token " << ids[i] << " of \"ab\"";
    ASSERT_TRUE(m.accept_token(ids[i]).ok());
  }
  ASSERT_TRUE(m.fill_next_token_bitmask(mask).ok());
  EXPECT_TRUE(allowed(eos));
  // Only EOS: nothing may follow "ab".
  int num_allowed = 0;
  for (int id = 0; id < v.compiler->vocab_size(); ++id) num_allowed += allowed(id) ? 1 : 0;
  EXPECT_EQ(num_allowed, 1);
  // A refused token leaves the matcher as it was; a rollback undoes one.
  const Status refused = m.accept_token(ids[0]);
  EXPECT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, ErrorCode::invalid_argument);
  ASSERT_TRUE(m.rollback(1).ok());
  ASSERT_TRUE(m.fill_next_token_bitmask(mask).ok());
  EXPECT_FALSE(allowed(eos));
  EXPECT_FALSE(m.rollback(100).ok());
  ASSERT_TRUE(m.accept_token(ids.back()).ok());
  ASSERT_TRUE(m.accept_token(eos).ok());
  EXPECT_TRUE(m.is_terminated());
  EXPECT_FALSE(m.fill_next_token_bitmask(mask).ok());
}

// Lines that share a spec compile it once; specs that differ in any field
// compile apart.
TEST(StructuredOutputGrammar, CompilesEachSpecOnce) {
  const Vocab v = stories260k();
  const GrammarSpec a{GrammarKind::regex, "[0-9]+", {}, true};
  auto first = v.compiler->compile(a);
  auto second = v.compiler->compile(a);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(first->get(), second->get());
  EXPECT_EQ(v.compiler->num_compiled(), 1);
  ASSERT_TRUE(v.compiler->compile(GrammarSpec{GrammarKind::regex, "[0-9]*", {}, true}).ok());
  ASSERT_TRUE(v.compiler->compile(GrammarSpec{GrammarKind::json_schema, R"({"type": "integer"})", {}, true}).ok());
  ASSERT_TRUE(v.compiler->compile(GrammarSpec{GrammarKind::json_schema, R"({"type": "integer"})", {}, false}).ok());
  EXPECT_EQ(v.compiler->num_compiled(), 4);
}

// Bad input: each is a clear invalid_argument naming the kind, and the
// compiler goes on compiling good specs afterwards.
TEST(StructuredOutputGrammar, BadSpecsAreClearErrorsAndLoseNothing) {
  const Vocab v = stories260k();
  const struct {
    GrammarSpec spec;
    const char* names;
  } cases[] = {
      {GrammarSpec{GrammarKind::json_schema, R"({"type": "object", "properties": )", {}, true}, "json_schema"},
      {GrammarSpec{GrammarKind::json_schema, R"({"type": "no-such-type"})", {}, true}, "json_schema"},
      {GrammarSpec{GrammarKind::regex, "(ab", {}, true}, "regex"},
      {GrammarSpec{GrammarKind::ebnf, "root ::= ", {}, true}, "ebnf"},
      {GrammarSpec{GrammarKind::ebnf, R"(root ::= undefined_rule)", {}, true}, "ebnf"},
      {GrammarSpec{GrammarKind::choice, "", {}, true}, "choice"},
  };
  for (const auto& c : cases) {
    auto r = v.compiler->compile(c.spec);
    ASSERT_FALSE(r.ok()) << c.spec.text;
    EXPECT_EQ(r.error().code, ErrorCode::invalid_argument) << c.spec.text;
    EXPECT_EQ(r.error().message.rfind(c.names, 0), 0u) << r.error().message;
    EXPECT_GT(r.error().message.size(), std::string(c.names).size() + 2) << "no reason given: " << r.error().message;
  }
  EXPECT_EQ(v.compiler->num_compiled(), 0);
  const Generated ok = generate(v, GrammarSpec{GrammarKind::regex, "x[yz]", {}, true}, 9);
  EXPECT_TRUE(ok.terminated);
  EXPECT_TRUE(ok.text == "xy" || ok.text == "xz") << ok.text;
  // Compiler arguments.
  EXPECT_FALSE(GrammarCompiler::create(*v.tokenizer, v.tokenizer->vocab_size() - 1, {1}).ok());
  EXPECT_FALSE(GrammarCompiler::create(*v.tokenizer, v.tokenizer->vocab_size(), {}).ok());
  EXPECT_FALSE(GrammarCompiler::create(*v.tokenizer, v.tokenizer->vocab_size(), {v.tokenizer->vocab_size()}).ok());
  // A bitmask of the wrong size.
  auto g = v.compiler->compile(GrammarSpec{GrammarKind::regex, "x", {}, true});
  ASSERT_TRUE(g.ok());
  GrammarMatcher m(*g);
  std::vector<std::uint32_t> small(1);
  EXPECT_EQ(m.fill_next_token_bitmask(small).error().code, ErrorCode::invalid_argument);
}

}  // namespace sampling_grammar_test
}  // namespace shardline::sampling
