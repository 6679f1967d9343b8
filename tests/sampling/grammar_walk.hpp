#pragma once
// Test helpers of the structured-output tests (tests/sampling/): the
// tokenizers they constrain (stories260K's sentencepiece vocabulary, 512
// tokens with byte fallback; SmolLM2-135M's byte-level BPE one, 49,152
// tokens, from its GGUF file), each with a GrammarCompiler, and a
// constrained random walk: masked argmax over random logits, so that a
// grammar that let a wrong token through would show in the decoded text.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/tokenizer_loader.hpp"
#include "sampling/structured_output/grammar.hpp"
#include "text/tokenizer.hpp"

namespace shardline::sampling::grammar_walk {


struct Vocab {
  std::unique_ptr<text::Tokenizer> tokenizer;
  std::shared_ptr<GrammarCompiler> compiler;
  std::vector<std::int32_t> stops;
};

/// The first plain token whose bytes are `bytes`, -1 if none.
inline std::int32_t id_of_bytes(const text::Tokenizer& t, const std::string& bytes) {
  for (int id = 0; id < t.vocab_size(); ++id)
    if (!t.is_special(id) && t.token_bytes(id) == bytes) return id;
  return -1;
}

inline Vocab stories260k() {
  auto t = text::load_tokenizer_files(std::string(SHARDLINE_SOURCE_DIR) + "/deploy/demo/stories260K");
  EXPECT_TRUE(t.ok()) << t.error().to_string();
  Vocab v{std::move(t).value(), nullptr, {}};
  v.stops = {v.tokenizer->eos_token_id()};
  auto c = GrammarCompiler::create(*v.tokenizer, v.tokenizer->vocab_size(), v.stops);
  EXPECT_TRUE(c.ok()) << c.error().to_string();
  v.compiler = std::move(c).value();
  return v;
}

inline Vocab smollm2() {
  auto t = model::load_tokenizer(std::string(SHARDLINE_SOURCE_DIR) + "/models/smollm2-135m-instruct");
  EXPECT_TRUE(t.ok()) << t.error().to_string();
  Vocab v{std::move(t).value(), nullptr, {}};
  // The chat end token as well as EOS, as a chat job stops on either.
  v.stops = {v.tokenizer->eos_token_id()};
  if (const std::int32_t im_end = v.tokenizer->token_to_id("<|im_end|>"); im_end >= 0 && im_end != v.stops[0])
    v.stops.push_back(im_end);
  auto c = GrammarCompiler::create(*v.tokenizer, v.tokenizer->vocab_size(), v.stops);
  EXPECT_TRUE(c.ok()) << c.error().to_string();
  v.compiler = std::move(c).value();
  return v;
}

struct Generated {
  std::vector<std::int32_t> ids;  // without the stop token
  bool terminated = false;
  std::string text;
};

/// Masked argmax over random logits (normal, seeded) until the matcher
/// accepts a stop token or `max_tokens` are out. Tokens holding a `"` or
/// an `@` get +4 and the stop tokens +8, so that strings close (and an
/// email's local part ends) and the output ends once the grammar lets it
/// (an unbiased walk over 49,152 tokens would rarely close a string);
/// objects and arrays close by chance (`}` or `,` after a value). Biasing
/// `}` too kept some walks inside an email's local part, where `}` is
/// allowed, for good.
inline Generated generate(const Vocab& v, const GrammarSpec& spec, unsigned seed, int max_tokens = 300) {
  auto g = v.compiler->compile(spec);
  EXPECT_TRUE(g.ok()) << g.error().to_string();
  GrammarMatcher m(*g);
  const int n = v.compiler->vocab_size();
  std::vector<float> bias(static_cast<std::size_t>(n), 0.0f);
  for (int id = 0; id < n; ++id)
    if (!v.tokenizer->is_special(id) &&
        v.tokenizer->token_bytes(id).find_first_of("\"@") != std::string::npos)
      bias[static_cast<std::size_t>(id)] = 4.0f;
  for (const std::int32_t id : v.stops) bias[static_cast<std::size_t>(id)] = 8.0f;
  std::vector<std::uint32_t> mask(static_cast<std::size_t>(bitmask_words(n)));
  std::vector<float> logits(static_cast<std::size_t>(n));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Generated out;
  for (int step = 0; step < max_tokens; ++step) {
    for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = normal(rng) + bias[i];
    EXPECT_TRUE(m.fill_next_token_bitmask(mask).ok());
    apply_token_bitmask(logits, mask);
    const auto best = static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    EXPECT_TRUE(std::isfinite(logits[static_cast<std::size_t>(best)])) << "every token masked at step " << step;
    EXPECT_TRUE(m.accept_token(best).ok()) << "the argmax of the masked logits was refused: " << best;
    if (m.is_terminated()) {
      out.terminated = true;
      break;
    }
    out.ids.push_back(best);
  }
  out.text = v.tokenizer->decode(out.ids, true);
  return out;
}

}  // namespace shardline::sampling::grammar_walk
