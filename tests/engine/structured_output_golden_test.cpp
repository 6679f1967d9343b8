// Structured outputs through the whole engine (issue 43, step 2) on the
// shipped stories260K: constrained requests (a JSON schema, a regex, a
// choice list, an EBNF grammar; greedy and seeded sampling) give outputs
// that match their grammar, the same alone as in a batch beside other
// constrained and unconstrained requests with chunked prefill, and the same
// after a resume that replays half of the generated tokens.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "engine/group/engine_builder.hpp"
#include "sampling/structured_output/grammar.hpp"
#include "tests/support/engine_runs.hpp"
#include "tests/support/sampling_executor.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline::engine {
namespace engine_structured_output_golden_test {

using sampling::GrammarKind;
using sampling::GrammarSpec;
using testing_support::kStoriesDir;
using testing_support::run_all;

EngineInstance make_engine(int max_num_batched_tokens) {
  EngineOptions o;
  o.model_dir = kStoriesDir;
  o.block_size = 16;
  o.kv_cache_bytes = 8u << 20;
  o.max_num_seqs = 64;
  o.max_num_batched_tokens = max_num_batched_tokens;
  auto e = build_engine(o);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().to_string());
  return std::move(e).value();
}

std::shared_ptr<sampling::GrammarCompiler> compiler_for(const EngineInstance& e) {
  auto c = sampling::GrammarCompiler::create(*e.tokenizer, e.executor->vocab_size(), {e.tokenizer->eos_token_id()});
  EXPECT_TRUE(c.ok()) << c.error().to_string();
  return std::move(c).value();
}

// Bounded grammars: every walk ends within max_tokens.
const std::string kSchema = R"({"type": "object", "properties": {
    "mood": {"enum": ["happy", "sad", "sleepy"]},
    "count": {"type": "integer", "minimum": 0, "maximum": 9},
    "name": {"type": "string", "maxLength": 5}},
  "required": ["mood", "count", "name"], "additionalProperties": false})";
const std::vector<GrammarSpec> kSpecs = {
    GrammarSpec{GrammarKind::json_schema, kSchema, {}, false},
    GrammarSpec{GrammarKind::regex, "[a-c]{2}-[0-9]{3}", {}, true},
    GrammarSpec{GrammarKind::choice, "", {"Once upon a time", "The end", "Lily"}, true},
    GrammarSpec{GrammarKind::ebnf, R"g(root ::= "(" [0-9] ("," [0-9]){0,3} ")")g", {}, true},
};
const char* const kPrompts[] = {"Once upon a time, there was a", "Tom had a ball. He", "The sun"};

/// Whether `text` is an output `spec` allows (the oracle of each kind).
bool matches(const GrammarSpec& spec, const std::string& text) {
  switch (spec.kind) {
    case GrammarKind::json_schema: {
      const auto j = nlohmann::json::parse(text, nullptr, false);
      if (j.is_discarded() || !j.is_object() || j.size() != 3) return false;
      if (!j.contains("mood") || !j.contains("count") || !j.contains("name")) return false;
      const std::string mood = j["mood"].is_string() ? j["mood"].get<std::string>() : "";
      return (mood == "happy" || mood == "sad" || mood == "sleepy") && j["count"].is_number_integer() &&
             j["count"].get<int>() >= 0 && j["count"].get<int>() <= 9 && j["name"].is_string() &&
             j["name"].get<std::string>().size() <= 5;
    }
    case GrammarKind::regex: return std::regex_match(text, std::regex("[a-c]{2}-[0-9]{3}"));
    case GrammarKind::choice:
      return std::find(spec.choices.begin(), spec.choices.end(), text) != spec.choices.end();
    case GrammarKind::ebnf: return std::regex_match(text, std::regex(R"(\([0-9](,[0-9]){0,3}\))"));
    case GrammarKind::json_object: return !nlohmann::json::parse(text, nullptr, false).is_discarded();
  }
  return false;
}

struct Case {
  std::size_t spec = 0;
  std::string prompt;
  sampling::SamplingParams params;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (std::size_t s = 0; s < kSpecs.size(); ++s)
    for (const char* prompt : kPrompts)
      for (const bool greedy : {true, false}) {
        Case c{s, prompt, {}};
        c.params.max_tokens = 96;
        c.params.temperature = greedy ? 0.0f : 1.0f;
        if (!greedy) {
          c.params.seed = 1000 + out.size();
          c.params.has_seed = true;
        }
        out.push_back(c);
      }
  return out;
}

class StructuredOutputEngine : public ::testing::Test {
 protected:
  void SetUp() override {
    // Alone: each case in its own engine, whole prompt in one step.
    for (const Case& c : cases()) {
      EngineInstance e = make_engine(2048);
      auto compiler = compiler_for(e);
      auto g = compiler->compile(kSpecs[c.spec]);
      ASSERT_TRUE(g.ok()) << g.error().to_string();
      ASSERT_TRUE(e.engine->add_request(1, e.tokenizer->encode(c.prompt, true), c.params, *g).ok());
      auto outs = run_all(*e.engine);
      ASSERT_EQ(outs.size(), 1u);
      alone_.push_back(outs.at(1));
    }
  }
  std::vector<RequestOutput> alone_;
};

TEST_F(StructuredOutputEngine, EveryOutputMatchesItsGrammarAndEnds) {
  const std::vector<Case> cs = cases();
  for (std::size_t i = 0; i < cs.size(); ++i) {
    const RequestOutput& o = alone_[i];
    EXPECT_EQ(o.finish_reason, FinishReason::stop) << i << ": " << o.text;
    EXPECT_TRUE(matches(kSpecs[cs[i].spec], o.text)) << "case " << i << " (" << sampling::grammar_kind_name(
                                                            kSpecs[cs[i].spec].kind) << "): " << o.text;
  }
}

// A constrained row's output depends only on itself: batched with every
// other case and 20 unconstrained sampled requests, prompts chunked 7 tokens
// at a time, the ids and text are the ones it had alone.
TEST_F(StructuredOutputEngine, BatchedEqualsAlone) {
  EngineInstance e = make_engine(7);
  auto compiler = compiler_for(e);
  const std::vector<Case> cs = cases();
  for (std::size_t i = 0; i < cs.size(); ++i) {
    auto g = compiler->compile(kSpecs[cs[i].spec]);
    ASSERT_TRUE(g.ok());
    ASSERT_TRUE(e.engine->add_request(i, e.tokenizer->encode(cs[i].prompt, true), cs[i].params, *g).ok());
  }
  testing_support::add_fillers(*e.engine, *e.tokenizer, 1000, 20);
  auto outs = run_all(*e.engine);
  EXPECT_EQ(compiler->num_compiled(), static_cast<long long>(kSpecs.size()));  // once per spec
  for (std::size_t i = 0; i < cs.size(); ++i) {
    EXPECT_EQ(outs.at(i).token_ids, alone_[i].token_ids) << "case " << i;
    EXPECT_EQ(outs.at(i).text, alone_[i].text) << "case " << i;
  }
}

// Device sampling (an executor that samples from its RowSampling, as the
// CUDA runner does): every constrained row goes out with its grammar's mask,
// and the outputs are those the engine gave sampling on the host, batched
// and chunked as above.
TEST_F(StructuredOutputEngine, DeviceSamplingMasksEachRowAndGivesTheSameOutputs) {
  EngineInstance e = make_engine(7);
  testing_support::SamplingExecutor exec(*e.executor);
  auto engine = LlmEngine::create(exec, *e.tokenizer, e.engine->config());
  ASSERT_TRUE(engine.ok()) << engine.error().to_string();
  auto compiler = compiler_for(e);
  const std::vector<Case> cs = cases();
  long constrained_tokens = 0;
  for (std::size_t i = 0; i < cs.size(); ++i) {
    auto g = compiler->compile(kSpecs[cs[i].spec]);
    ASSERT_TRUE(g.ok());
    ASSERT_TRUE((*engine)->add_request(i, e.tokenizer->encode(cs[i].prompt, true), cs[i].params, *g).ok());
    constrained_tokens += static_cast<long>(alone_[i].token_ids.size());
  }
  testing_support::add_fillers(**engine, *e.tokenizer, 1000, 20);
  auto outs = run_all(**engine);
  EXPECT_GT(exec.sampled_steps_, 0);
  EXPECT_EQ(exec.masked_rows_, constrained_tokens) << "each constrained token sampled on the device under its mask";
  for (std::size_t i = 0; i < cs.size(); ++i) {
    EXPECT_EQ(outs.at(i).token_ids, alone_[i].token_ids) << "case " << i;
    EXPECT_EQ(outs.at(i).text, alone_[i].text) << "case " << i;
  }
}

// After a failure the request resumes with what it generated: the matcher
// is rebuilt by replaying those tokens, and the output is the same.
TEST_F(StructuredOutputEngine, ResumeReplaysTheGrammarAndGivesTheSameOutput) {
  const std::vector<Case> cs = cases();
  for (std::size_t i = 0; i < cs.size(); ++i) {
    const RequestOutput& full = alone_[i];
    if (full.token_ids.size() < 2) continue;
    EngineInstance e = make_engine(2048);
    auto compiler = compiler_for(e);
    auto g = compiler->compile(kSpecs[cs[i].spec]);
    ASSERT_TRUE(g.ok());
    ResumeState resume;
    resume.output_ids.assign(full.token_ids.begin(), full.token_ids.begin() + full.token_ids.size() / 2);
    ASSERT_TRUE(e.engine->add_request(5, e.tokenizer->encode(cs[i].prompt, true), cs[i].params, resume, *g).ok());
    auto outs = run_all(*e.engine);
    EXPECT_EQ(outs.at(5).token_ids, full.token_ids) << "case " << i;
    EXPECT_EQ(outs.at(5).text, full.text) << "case " << i;
  }
}

// Bad input: a grammar for another vocabulary and a resume whose tokens do
// not fit the grammar are refused by the request; the engine goes on.
TEST(StructuredOutputEngineErrors, ForeignGrammarsAndUnfitResumesAreRefused) {
  EngineInstance e = make_engine(2048);
  const int vocab = e.executor->vocab_size();
  auto wide = sampling::GrammarCompiler::create(*e.tokenizer, vocab + 32, {e.tokenizer->eos_token_id()});
  ASSERT_TRUE(wide.ok());
  auto g = (*wide)->compile(kSpecs[1]);
  ASSERT_TRUE(g.ok());
  sampling::SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = 16;
  const Status foreign = e.engine->add_request(1, e.tokenizer->encode("The sun", true), p, *g);
  ASSERT_FALSE(foreign.ok());
  EXPECT_EQ(foreign.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(foreign.error().message.find("vocabulary"), std::string::npos) << foreign.error().message;

  auto compiler = compiler_for(e);
  auto regex = compiler->compile(kSpecs[1]);  // [a-c]{2}-[0-9]{3}
  ASSERT_TRUE(regex.ok());
  ResumeState resume;
  resume.output_ids = e.tokenizer->encode("zz", false);  // not [a-c]
  const Status unfit = e.engine->add_request(2, e.tokenizer->encode("The sun", true), p, resume, *regex);
  ASSERT_FALSE(unfit.ok());
  EXPECT_EQ(unfit.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(unfit.error().message.find("does not fit its grammar"), std::string::npos) << unfit.error().message;

  // Nothing else lost: the same engine serves a constrained request.
  ASSERT_TRUE(e.engine->add_request(3, e.tokenizer->encode("The sun", true), p, *regex).ok());
  auto outs = run_all(*e.engine);
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_TRUE(std::regex_match(outs.at(3).text, std::regex("[a-c]{2}-[0-9]{3}"))) << outs.at(3).text;
}

}  // namespace engine_structured_output_golden_test
}  // namespace shardline::engine
