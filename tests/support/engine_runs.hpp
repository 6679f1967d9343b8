#pragma once
// Driving an LlmEngine to completion in tests, and comparing its outputs:
// shared by the CPU golden tests, the device-sampling tests and the CUDA
// runner tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "engine/llm_engine.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline::testing_support {

/// Steps until every request finished; outputs by request id. A failed step
/// fails the test and stops.
inline std::map<std::uint64_t, engine::RequestOutput> run_all(engine::LlmEngine& engine) {
  std::map<std::uint64_t, engine::RequestOutput> out;
  while (engine.has_unfinished()) {
    auto step = engine.step();
    EXPECT_TRUE(step.ok()) << (step.ok() ? "" : step.error().to_string());
    if (!step.ok()) break;
    for (auto& o : *step) out[o.request_id] = std::move(o);
  }
  return out;
}

/// `n` filler requests with ids first_id.. : different prompts and lengths,
/// seeded top-p sampling, so a batch around the requests under test is as
/// unlike "alone" as possible.
inline void add_fillers(engine::LlmEngine& engine, const text::Tokenizer& tok, std::uint64_t first_id, int n) {
  const char* starts[] = {"The cat", "A big dog ran to the", "Sam and Mia went to the park and", "One day",
                          "There was a boy who liked to play with his red car in the"};
  for (int i = 0; i < n; ++i) {
    sampling::SamplingParams p;
    p.temperature = 0.8f;
    p.top_p = 0.9f;
    p.seed = 1000 + static_cast<std::uint64_t>(i);
    p.has_seed = true;
    p.max_tokens = 20 + i % 40;
    ASSERT_TRUE(engine.add_request(first_id + static_cast<std::uint64_t>(i), tok.encode(starts[i % 5], true), p).ok());
  }
}

/// `n` requests' sampling parameters that exercise every sampler path:
/// greedy, temperatures 0.7-0.9, top-k, top-p, min-p, repetition / presence /
/// frequency penalties, min_tokens, each with its own seed.
inline std::vector<sampling::SamplingParams> mixed_sampling_params(int n, int max_tokens) {
  std::vector<sampling::SamplingParams> params;
  for (int i = 0; i < n; ++i) {
    sampling::SamplingParams p;
    p.max_tokens = max_tokens;
    p.temperature = i % 4 == 0 ? 0.0f : 0.7f + 0.1f * static_cast<float>(i % 3);
    p.top_k = i % 3 == 1 ? 25 : 0;
    p.top_p = i % 3 == 2 ? 0.85f : 1.0f;
    p.min_p = i % 5 == 4 ? 0.05f : 0.0f;
    p.repetition_penalty = i % 4 == 3 ? 1.2f : 1.0f;
    p.presence_penalty = i % 6 == 5 ? 0.4f : 0.0f;
    p.frequency_penalty = i % 7 == 6 ? 0.3f : 0.0f;
    p.min_tokens = i % 8 == 7 ? 12 : 0;
    p.seed = 500 + static_cast<std::uint64_t>(i);
    p.has_seed = true;
    params.push_back(p);
  }
  return params;
}

/// A three-token prefill of sequence 1 (ids 1, 400, 3 at positions 0..2)
/// in block 0, with the logits of its last row: the smallest valid step of
/// the stories260K runners' error-path tests.
inline model::StepInput three_token_step(int block_size) {
  model::StepInput in;
  in.block_size = block_size;
  model::StepSeq s;
  s.seq_id = 1;
  s.num_new_tokens = 3;
  s.needs_logits = true;
  s.block_table = {0};
  in.seqs = {s};
  in.token_ids = {1, 400, 3};
  in.positions = {0, 1, 2};
  in.slot_mapping = {0, 1, 2};
  in.logits_rows = {2};
  return in;
}

/// Same token ids and bit-identical captured logits.
inline bool bit_identical(const engine::RequestOutput& a, const engine::RequestOutput& b) {
  if (a.token_ids != b.token_ids || a.logits.size() != b.logits.size()) return false;
  for (std::size_t s = 0; s < a.logits.size(); ++s)
    if (a.logits[s].size() != b.logits[s].size() ||
        std::memcmp(a.logits[s].data(), b.logits[s].data(), a.logits[s].size() * sizeof(float)) != 0)
      return false;
  return true;
}

/// The same for two runs' outputs, in order.
inline bool bit_identical(const std::vector<engine::RequestOutput>& a, const std::vector<engine::RequestOutput>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!bit_identical(a[i], b[i])) return false;
  return true;
}

/// The largest |logit - reference| over two runs' captured logits, in order;
/// infinity when the runs differ in requests, steps or vocabulary.
inline float max_logit_diff(const std::vector<engine::RequestOutput>& got,
                            const std::vector<engine::RequestOutput>& ref) {
  if (got.size() != ref.size()) return std::numeric_limits<float>::infinity();
  float d = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (got[i].logits.size() != ref[i].logits.size()) return std::numeric_limits<float>::infinity();
    for (std::size_t s = 0; s < ref[i].logits.size(); ++s) {
      if (got[i].logits[s].size() != ref[i].logits[s].size()) return std::numeric_limits<float>::infinity();
      for (std::size_t v = 0; v < ref[i].logits[s].size(); ++v)
        d = std::max(d, std::fabs(got[i].logits[s][v] - ref[i].logits[s][v]));
    }
  }
  return d;
}

/// A greedy stories260K output is the reference: ids, text, and the top-5
/// logits of each of its `max_tokens` steps (captured logits) within 1e-4.
inline void expect_reference(const StoriesCase& ref, const engine::RequestOutput& out, int max_tokens,
                             const std::string& where) {
  ASSERT_EQ(out.token_ids, ref.generated_ids) << where;
  EXPECT_EQ(ref.prompt + out.text, ref.full_text) << where;
  ASSERT_EQ(out.logits.size(), static_cast<std::size_t>(max_tokens)) << where;
  for (int s = 0; s < max_tokens; ++s) expect_top5(out.logits[s], ref.top5[s], where + " step " + std::to_string(s));
}

}  // namespace shardline::testing_support
