#include "engine/llm_engine.hpp"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "sampling/sampler.hpp"

namespace shardline::engine {
namespace engine_llm_engine_test {

constexpr int kVocab = 32;
constexpr std::int32_t kEos = 31;

/// A model whose logits depend on the whole context, read back through the
/// paged KV cache: each step writes (token, position) at its slot, and each
/// logits row hashes the sequence's cached tokens found via its block table.
/// Wrong slots, stale blocks or a broken recompute change (or fail) outputs.
/// The favoured next token is (last_token * 7 + position) % vocab.
class FakeExecutor final : public model::ModelExecutor {
 public:
  FakeExecutor(int num_blocks, int block_size)
      : num_blocks_(num_blocks), block_size_(block_size),
        cache_tok_(static_cast<std::size_t>(num_blocks * block_size), -1),
        cache_pos_(static_cast<std::size_t>(num_blocks * block_size), -1) {}

  std::map<int, std::int32_t> force_at_position;  ///< sampled position -> strongly favoured token
  int num_steps = 0;
  int max_step_tokens = 0;

  Result<model::StepOutput> execute(const model::StepInput& in) override {
    ++num_steps;
    max_step_tokens = std::max(max_step_tokens, in.num_tokens());
    for (int r = 0; r < in.num_tokens(); ++r) {
      if (in.token_ids[r] < 0 || in.token_ids[r] >= kVocab)
        return make_error(ErrorCode::invalid_argument, "token id out of range");
      const int slot = in.slot_mapping[r];
      if (slot < 0 || slot >= num_blocks_ * block_size_) return make_error(ErrorCode::invalid_argument, "slot");
      cache_tok_[slot] = in.token_ids[r];
      cache_pos_[slot] = in.positions[r];
    }
    model::StepOutput out;
    out.vocab_size = kVocab;
    int row = 0;
    for (const model::StepSeq& s : in.seqs) {
      row += s.num_new_tokens;
      if (!s.needs_logits) continue;
      if (in.logits_rows[out.logits.size() / kVocab] != row - 1)
        return make_error(ErrorCode::internal, "logits row mismatch");
      const int len = s.num_computed_tokens + s.num_new_tokens;
      std::uint64_t h = 1469598103934665603ull;
      std::int32_t last = 0;
      for (int p = 0; p < len; ++p) {
        const int slot = s.block_table[p / block_size_] * block_size_ + p % block_size_;
        if (cache_pos_[slot] != p) return make_error(ErrorCode::internal, "stale KV slot");
        last = cache_tok_[slot];
        h = (h ^ static_cast<std::uint64_t>(last + 1)) * 1099511628211ull;
      }
      const int target = (last * 7 + (len - 1)) % kVocab;
      for (int v = 0; v < kVocab; ++v) {
        const std::uint64_t x = (h + static_cast<std::uint64_t>(v) * 0x9E3779B97F4A7C15ull) >> 40;
        float l = static_cast<float>(x % 1000) / 500.0f;  // [0, 2)
        if (v == target) l += 2.5f;
        if (v == kEos) l -= 4.0f;  // EOS only when forced
        out.logits.push_back(l);
      }
      if (const auto it = force_at_position.find(len); it != force_at_position.end())
        out.logits[out.logits.size() - kVocab + it->second] += 20.0f;
    }
    return out;
  }
  int vocab_size() const override { return kVocab; }
  int num_kv_blocks() const override { return num_blocks_; }
  int block_size() const override { return block_size_; }

 private:
  int num_blocks_, block_size_;
  std::vector<std::int32_t> cache_tok_, cache_pos_;
};

/// ids 0..25 -> 'a'..'z', 26..30 -> '0'..'4', 31 -> "</s>" (special EOS).
class FakeTokenizer final : public text::Tokenizer {
 public:
  std::vector<std::int32_t> encode(std::string_view text, bool) const override {
    std::vector<std::int32_t> ids;
    for (char c : text) ids.push_back(c >= 'a' && c <= 'z' ? c - 'a' : 26 + (c - '0'));
    return ids;
  }
  std::string decode(std::span<const std::int32_t> ids, bool skip) const override {
    std::string s;
    for (auto id : ids)
      if (!(skip && is_special(id))) s += token_bytes(id);
    return s;
  }
  std::string token_bytes(std::int32_t id) const override {
    if (id == kEos) return "</s>";
    return std::string(1, id < 26 ? static_cast<char>('a' + id) : static_cast<char>('0' + id - 26));
  }
  bool is_special(std::int32_t id) const override { return id == kEos; }
  bool strips_leading_space() const override { return false; }
  int vocab_size() const override { return kVocab; }
  std::int32_t bos_token_id() const override { return -1; }
  std::int32_t eos_token_id() const override { return kEos; }
  std::int32_t token_to_id(std::string_view) const override { return -1; }
};

EngineConfig base_config() {
  EngineConfig c;
  c.max_num_seqs = 16;
  c.max_num_batched_tokens = 256;
  c.max_model_len = 128;
  c.eos_token_ids = {kEos};
  c.seed = 2024;
  c.check_integrity = true;
  return c;
}

std::vector<std::vector<std::int32_t>> test_prompts() {
  return {{1, 2, 3}, {4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14}, {20}, {7, 7, 7, 7, 7, 7},
          {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22}, {30, 29}};
}

struct Harness {
  FakeExecutor exec;
  FakeTokenizer tok;
  std::unique_ptr<LlmEngine> engine;
  Harness(int num_blocks, int block_size, EngineConfig cfg) : exec(num_blocks, block_size) {
    auto r = LlmEngine::create(exec, tok, std::move(cfg));
    EXPECT_TRUE(r.ok()) << r.error().to_string();
    engine = std::move(r).value();
  }
};

/// Runs requests (id -> prompt) to completion; returns outputs by id.
std::map<std::uint64_t, RequestOutput> run(LlmEngine& engine, const std::map<std::uint64_t, std::vector<std::int32_t>>& reqs,
                                           const sampling::SamplingParams& params) {
  for (const auto& [id, prompt] : reqs) {
    const Status s = engine.add_request(id, prompt, params);
    EXPECT_TRUE(s.ok()) << s.error().to_string();
  }
  std::map<std::uint64_t, RequestOutput> outs;
  int guard = 0;
  while (engine.has_unfinished() && ++guard < 10000) {
    auto r = engine.step();
    EXPECT_TRUE(r.ok()) << r.error().to_string();
    if (!r.ok()) break;
    for (auto& o : r.value()) outs[o.request_id] = std::move(o);
  }
  return outs;
}

sampling::SamplingParams greedy(int max_tokens) {
  sampling::SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

sampling::SamplingParams random_params(int max_tokens) {
  sampling::SamplingParams p;
  p.temperature = 0.9f;
  p.top_p = 0.95f;
  p.top_k = 20;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

std::map<std::uint64_t, std::vector<std::int32_t>> as_map(const std::vector<std::vector<std::int32_t>>& prompts) {
  std::map<std::uint64_t, std::vector<std::int32_t>> m;
  for (std::size_t i = 0; i < prompts.size(); ++i) m[i] = prompts[i];
  return m;
}

void expect_same_tokens(const std::map<std::uint64_t, RequestOutput>& a, const std::map<std::uint64_t, RequestOutput>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [id, o] : a) {
    ASSERT_TRUE(b.count(id)) << id;
    EXPECT_EQ(o.token_ids, b.at(id).token_ids) << "request " << id;
    EXPECT_EQ(o.text, b.at(id).text) << "request " << id;
    EXPECT_EQ(o.finish_reason, b.at(id).finish_reason) << "request " << id;
  }
}

class BatchIndependence : public ::testing::TestWithParam<bool> {};

TEST_P(BatchIndependence, OutputsIndependentOfBatchChunkingAndPreemption) {
  const sampling::SamplingParams params = GetParam() ? random_params(20) : greedy(20);
  const auto prompts = as_map(test_prompts());
  // Reference: each request alone, big cache, big budget.
  std::map<std::uint64_t, RequestOutput> solo;
  for (const auto& [id, prompt] : prompts) {
    Harness h(256, 4, base_config());
    auto o = run(*h.engine, {{id, prompt}}, params);
    solo[id] = o.at(id);
    EXPECT_EQ(solo[id].token_ids.size(), 20u);
  }
  {
    Harness h(256, 4, base_config());
    expect_same_tokens(run(*h.engine, prompts, params), solo);
  }
  {  // tiny token budget: prompts are chunked, decodes share steps with chunks
    auto cfg = base_config();
    cfg.max_num_batched_tokens = 5;
    Harness h(256, 4, cfg);
    expect_same_tokens(run(*h.engine, prompts, params), solo);
    EXPECT_LE(h.exec.max_step_tokens, 5);
  }
  {  // tiny KV cache: preemption by recompute
    auto cfg = base_config();
    cfg.max_model_len = 44;
    Harness h(11, 4, cfg);
    const auto outs = run(*h.engine, prompts, params);
    expect_same_tokens(outs, solo);
    int preemptions = 0;
    for (const auto& [id, o] : outs) preemptions += o.num_preemptions;
    EXPECT_GT(preemptions, 0);
    EXPECT_GT(h.engine->scheduler().total_preemptions(), 0);
  }
  {  // max_num_seqs = 1: strictly sequential
    auto cfg = base_config();
    cfg.max_num_seqs = 1;
    Harness h(256, 4, cfg);
    expect_same_tokens(run(*h.engine, prompts, params), solo);
  }
}

INSTANTIATE_TEST_SUITE_P(GreedyAndSeeded, BatchIndependence, ::testing::Values(false, true));

TEST(LlmEngine, GreedyFollowsFavouredToken) {
  Harness h(64, 4, base_config());
  auto outs = run(*h.engine, {{0, {3}}}, greedy(5));
  // Favoured next token (last * 7 + pos) % 32 beats noise in [0, 2) by 2.5.
  std::vector<std::int32_t> want;
  std::int32_t last = 3;
  for (int pos = 0; pos < 5; ++pos) want.push_back(last = (last * 7 + pos) % kVocab);
  EXPECT_EQ(outs.at(0).token_ids, want);
  EXPECT_EQ(outs.at(0).finish_reason, FinishReason::length);
  EXPECT_EQ(outs.at(0).prompt_token_ids, std::vector<std::int32_t>{3});
}

TEST(LlmEngine, MaxTokensGivesLength) {
  Harness h(64, 4, base_config());
  auto outs = run(*h.engine, {{0, {1, 2}}, {1, {3}}}, greedy(7));
  for (const auto& [id, o] : outs) {
    EXPECT_EQ(o.token_ids.size(), 7u);
    EXPECT_EQ(o.finish_reason, FinishReason::length);
    EXPECT_STREQ(finish_reason_name(o.finish_reason), "length");
    EXPECT_EQ(o.text.size(), 7u);
  }
}

TEST(LlmEngine, EosStopsUnlessIgnoredOrBeforeMinTokens) {
  auto params = greedy(10);
  params.ignore_eos = false;
  {
    Harness h(64, 4, base_config());
    h.exec.force_at_position[6] = kEos;  // prompt of 3 -> 4th generated token
    auto o = run(*h.engine, {{0, {1, 2, 3}}}, params).at(0);
    ASSERT_EQ(o.token_ids.size(), 4u);
    EXPECT_EQ(o.token_ids.back(), kEos);
    EXPECT_EQ(o.finish_reason, FinishReason::stop);
    EXPECT_EQ(o.text.size(), 3u);  // EOS is special: not in the text
  }
  {
    Harness h(64, 4, base_config());
    h.exec.force_at_position[6] = kEos;
    auto p = params;
    p.ignore_eos = true;
    auto o = run(*h.engine, {{0, {1, 2, 3}}}, p).at(0);
    EXPECT_EQ(o.token_ids.size(), 10u);
    EXPECT_EQ(o.token_ids[3], kEos);
    EXPECT_EQ(o.finish_reason, FinishReason::length);
  }
  {
    Harness h(64, 4, base_config());
    h.exec.force_at_position[6] = kEos;
    h.exec.force_at_position[8] = kEos;
    auto p = params;
    p.min_tokens = 5;  // EOS masked at the 4th token, allowed at the 6th
    auto o = run(*h.engine, {{0, {1, 2, 3}}}, p).at(0);
    ASSERT_EQ(o.token_ids.size(), 6u);
    EXPECT_NE(o.token_ids[3], kEos);
    EXPECT_EQ(o.token_ids[5], kEos);
    EXPECT_EQ(o.finish_reason, FinishReason::stop);
  }
}

TEST(LlmEngine, StopTokenIds) {
  Harness h(64, 4, base_config());
  h.exec.force_at_position[5] = 9;
  auto p = greedy(10);
  p.stop_token_ids = {9};
  auto o = run(*h.engine, {{0, {1, 2}}}, p).at(0);
  ASSERT_EQ(o.token_ids.size(), 4u);
  EXPECT_EQ(o.token_ids.back(), 9);
  EXPECT_EQ(o.finish_reason, FinishReason::stop);
  EXPECT_EQ(o.stop_reason, "9");
}

TEST(LlmEngine, StopStringCutsTextAndStops) {
  const std::vector<std::int32_t> prompt{5, 6, 7};
  std::string full;
  {
    Harness h(64, 4, base_config());
    full = run(*h.engine, {{0, prompt}}, greedy(12)).at(0).text;
  }
  ASSERT_EQ(full.size(), 12u);
  const std::string stop = full.substr(5, 2);
  const std::size_t at = full.find(stop);
  auto p = greedy(12);
  p.stop = {"not-there", stop};
  Harness h(64, 4, base_config());
  auto o = run(*h.engine, {{0, prompt}}, p).at(0);
  EXPECT_EQ(o.finish_reason, FinishReason::stop);
  EXPECT_EQ(o.stop_reason, stop);
  EXPECT_EQ(o.text, full.substr(0, at));
  EXPECT_EQ(o.token_ids.size(), at + stop.size());  // one char per token
}

TEST(LlmEngine, SeededSamplingReproducibleAndBatchIndependent) {
  auto p = random_params(16);
  p.temperature = 1.5f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.has_seed = true;
  p.seed = 77;
  const std::vector<std::int32_t> prompt{2, 4, 6};
  Harness h1(128, 4, base_config());
  const auto a = run(*h1.engine, {{0, prompt}}, p).at(0);
  Harness h2(128, 4, base_config());
  auto others = as_map(test_prompts());
  others[42] = prompt;  // different id, same seed -> same tokens
  const auto b = run(*h2.engine, others, p);
  EXPECT_EQ(a.token_ids, b.at(42).token_ids);
  auto p2 = p;
  p2.seed = 78;
  Harness h3(128, 4, base_config());
  const auto c = run(*h3.engine, {{0, prompt}}, p2).at(0);
  EXPECT_NE(a.token_ids, c.token_ids);
  // Without a seed, different request ids draw differently.
  auto p3 = p;
  p3.has_seed = false;
  Harness h4(128, 4, base_config());
  const auto d = run(*h4.engine, {{0, prompt}, {1, prompt}}, p3);
  EXPECT_NE(d.at(0).token_ids, d.at(1).token_ids);
}

TEST(LlmEngine, BadRequestsRejectedOthersComplete) {
  Harness h(64, 4, base_config());
  auto bad = greedy(4);
  bad.top_p = 0.0f;
  Status s = h.engine->add_request(1, {1, 2}, bad);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(s.error().message.find("top_p"), std::string::npos) << s.error().message;
  EXPECT_NE(s.error().message.find("request 1"), std::string::npos) << s.error().message;

  ASSERT_TRUE(h.engine->add_request(2, {1, 2}, greedy(4)).ok());
  s = h.engine->add_request(3, {}, greedy(4));
  EXPECT_EQ(s.error().code, ErrorCode::invalid_argument);
  s = h.engine->add_request(4, std::vector<std::int32_t>(129, 1), greedy(4));  // > max_model_len
  EXPECT_EQ(s.error().code, ErrorCode::invalid_argument);
  s = h.engine->add_request(5, {1, kVocab}, greedy(4));
  EXPECT_EQ(s.error().code, ErrorCode::invalid_argument);
  s = h.engine->add_request(2, {1}, greedy(4));  // duplicate id
  EXPECT_EQ(s.error().code, ErrorCode::invalid_argument);
  ASSERT_TRUE(h.engine->add_request(6, {3, 4, 5}, greedy(6)).ok());

  std::map<std::uint64_t, RequestOutput> outs;
  while (h.engine->has_unfinished()) {
    auto r = h.engine->step();
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    for (auto& o : r.value()) outs[o.request_id] = std::move(o);
  }
  ASSERT_EQ(outs.size(), 2u);
  EXPECT_EQ(outs.at(2).token_ids.size(), 4u);
  EXPECT_EQ(outs.at(6).token_ids.size(), 6u);
}

TEST(LlmEngine, MaxModelLenCapsGeneration) {
  auto cfg = base_config();
  cfg.max_model_len = 32;
  Harness h(8, 4, cfg);  // 32 tokens of cache
  auto p = greedy(20);
  const Status s = h.engine->add_request(0, std::vector<std::int32_t>(20, 1), p);  // 40 tokens, capped at 32
  EXPECT_TRUE(s.ok());
  auto outs = run(*h.engine, {}, p);
  EXPECT_EQ(outs.at(0).finish_reason, FinishReason::length);
  EXPECT_EQ(outs.at(0).token_ids.size(), 12u);  // stops at max_model_len
}

TEST(LlmEngine, CreateRejectsCacheSmallerThanOneSequence) {
  FakeExecutor exec(3, 4);
  FakeTokenizer tok;
  auto cfg = base_config();
  cfg.max_model_len = 13;
  auto r = LlmEngine::create(exec, tok, cfg);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::out_of_memory);
  EXPECT_NE(r.error().message.find("max_model_len"), std::string::npos);
  cfg.max_model_len = 12;
  EXPECT_TRUE(LlmEngine::create(exec, tok, cfg).ok());
  cfg.max_num_batched_tokens = 0;
  EXPECT_EQ(LlmEngine::create(exec, tok, cfg).error().code, ErrorCode::invalid_argument);
}

TEST(LlmEngine, CaptureLogitsKeepsRawRows) {
  auto cfg = base_config();
  cfg.capture_logits = true;
  Harness h(64, 4, cfg);
  auto p = greedy(6);
  p.repetition_penalty = 1.3f;  // captured rows are before penalties
  auto o = run(*h.engine, {{0, {1, 2, 3}}}, p).at(0);
  ASSERT_EQ(o.logits.size(), 6u);
  for (std::size_t k = 0; k < o.logits.size(); ++k) {
    ASSERT_EQ(o.logits[k].size(), static_cast<std::size_t>(kVocab));
    // Re-applying the sampler to the captured row reproduces the token.
    std::vector<std::int32_t> out_so_far(o.token_ids.begin(), o.token_ids.begin() + k);
    std::vector<float> row = o.logits[k];
    sampling::SampleContext ctx;
    ctx.prompt_ids = o.prompt_token_ids;
    ctx.output_ids = out_so_far;
    ctx.position = 3 + static_cast<int>(k);
    EXPECT_EQ(sampling::sample(row, p, ctx), o.token_ids[k]);
  }
}

TEST(LlmEngine, LogprobsAreTheRawRowsLogSoftmaxAndBatchIndependent) {
  auto cfg = base_config();
  cfg.capture_logits = true;
  Harness h(64, 4, cfg);
  auto p = random_params(6);
  p.has_seed = true;
  p.seed = 5;
  p.temperature = 1.7f;
  p.repetition_penalty = 1.3f;  // logprobs are of the raw row: penalties and temperature do not change them
  p.logprobs = 3;
  const auto o = run(*h.engine, {{0, {1, 2, 3}}}, p).at(0);
  ASSERT_EQ(o.logprobs.size(), o.token_ids.size());
  ASSERT_EQ(o.logits.size(), o.token_ids.size());
  for (std::size_t k = 0; k < o.token_ids.size(); ++k) {
    EXPECT_EQ(o.logprobs[k], sampling::compute_logprobs(o.logits[k], o.token_ids[k], 3)) << "token " << k;
    EXPECT_EQ(o.logprobs[k].top.size(), 3u);
  }
  // Alone or among other requests (other batches and chunking): the same logprobs.
  Harness h2(64, 4, base_config());
  auto others = as_map(test_prompts());
  others[42] = {1, 2, 3};
  const auto b = run(*h2.engine, others, p);
  EXPECT_EQ(b.at(42).token_ids, o.token_ids);
  EXPECT_EQ(b.at(42).logprobs, o.logprobs);
  // Not asked: none.
  auto q = p;
  q.logprobs = -1;
  Harness h3(64, 4, base_config());
  EXPECT_TRUE(run(*h3.engine, {{0, {1, 2, 3}}}, q).at(0).logprobs.empty());
}

TEST(LlmEngine, StepStatsClassifyPrefillAndDecode) {
  Harness h(64, 4, base_config());
  std::vector<StepStats> seen;
  h.engine->set_step_callback([&](const StepStats& s) { seen.push_back(s); });
  auto outs = run(*h.engine, {{0, {1, 2, 3}}, {1, {4, 5}}}, greedy(5));
  ASSERT_EQ(outs.size(), 2u);
  const auto& stats = h.engine->step_stats();
  ASSERT_EQ(stats.size(), seen.size());
  int prefill = 0, decode = 0;
  for (const auto& s : stats) {
    prefill += s.num_prefill_tokens;
    decode += s.num_decode_tokens;
    EXPECT_GE(s.step_ms, 0.0);
  }
  EXPECT_EQ(prefill, 5);
  EXPECT_EQ(decode, 2 * 4);  // the first token of each comes from the prefill step
  EXPECT_EQ(stats.front().num_prefill_tokens, 5);
  EXPECT_EQ(stats.front().num_decode_tokens, 0);
}

TEST(LlmEngine, GenerateReturnsInPromptOrder) {
  Harness h(256, 4, base_config());
  const auto prompts = test_prompts();
  auto r = h.engine->generate(prompts, greedy(3));
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  ASSERT_EQ(r->size(), prompts.size());
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ((*r)[i].request_id, i);
    EXPECT_EQ((*r)[i].prompt_token_ids, prompts[i]);
    EXPECT_EQ((*r)[i].token_ids.size(), 3u);
  }
  auto bad = greedy(3);
  bad.max_tokens = 0;
  auto e = h.engine->generate(prompts, bad);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("max_tokens"), std::string::npos);
  EXPECT_FALSE(h.engine->has_unfinished());
}

TEST(LlmEngine, AbortReturnsPartialOutput) {
  Harness h(64, 4, base_config());
  ASSERT_TRUE(h.engine->add_request(0, {1, 2}, greedy(50)).ok());
  ASSERT_TRUE(h.engine->add_request(1, {1, 2}, greedy(3)).ok());
  ASSERT_TRUE(h.engine->step().ok());
  EXPECT_TRUE(h.engine->abort_request(0));
  EXPECT_FALSE(h.engine->abort_request(0));
  std::map<std::uint64_t, RequestOutput> outs;
  while (h.engine->has_unfinished()) {
    auto r = h.engine->step();
    ASSERT_TRUE(r.ok());
    for (auto& o : r.value()) outs[o.request_id] = std::move(o);
  }
  EXPECT_EQ(outs.at(0).finish_reason, FinishReason::abort);
  EXPECT_EQ(outs.at(0).token_ids.size(), 1u);
  EXPECT_EQ(outs.at(1).token_ids.size(), 3u);
  EXPECT_EQ(h.engine->scheduler().block_manager().num_free_blocks(), 64);
}

TEST(LlmEngine, ExecutorErrorsPropagate) {
  class Broken final : public model::ModelExecutor {
   public:
    Result<model::StepOutput> execute(const model::StepInput&) override { return make_error(ErrorCode::internal, "boom"); }
    int vocab_size() const override { return kVocab; }
    int num_kv_blocks() const override { return 64; }
    int block_size() const override { return 4; }
  } exec;
  FakeTokenizer tok;
  auto engine = LlmEngine::create(exec, tok, base_config());
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE((*engine)->add_request(0, {1}, greedy(2)).ok());
  auto r = (*engine)->step();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "boom");
}

}  // namespace
}  // namespace shardline::engine

namespace shardline::engine {
namespace engine_llm_engine_test {

/// A policy that never lets anything through.
class HoldEverything final : public TokenBudgetPolicy {
 public:
  MicroBatchBudget budget(const SchedulerState&) const override { return {0, 0}; }
  const char* name() const override { return "hold"; }
};

TEST(LlmEngine, ATokenBudgetPolicyThatHoldsEverythingBackCannotStallTheEngine) {
  EngineConfig cfg = base_config();
  cfg.token_budget = std::make_shared<HoldEverything>();
  Harness h(64, 4, cfg);
  auto outs = run(*h.engine, {{0, {3, 4, 5}}, {1, {6}}}, greedy(5));
  EXPECT_EQ(outs.at(0).token_ids.size(), 5u);
  EXPECT_EQ(outs.at(1).token_ids.size(), 5u);
  EXPECT_EQ(outs.at(0).finish_reason, FinishReason::length);
}

/// A phase hook that records what the step loop asks it (engine/step_phases.hpp):
/// every `period`-th admission asks for a transition, and every
/// micro-batch is limited to `max_prefill` prompt and one decode token.
class RecordingPhases final : public StepPhaseHook {
 public:
  RecordingPhases(int period, int max_prefill) : period_(period), max_prefill_(max_prefill) {}
  int admits = 0, transitions = 0, submitted = 0;
  Result<PhaseAdmission> admit() override {
    ++admits;
    return PhaseAdmission{admits % period_ == 0, -1};
  }
  Result<PhaseAdmission> transition() override {
    ++transitions;
    return PhaseAdmission{false, -1};
  }
  bool limits(int depth, bool limited, MicroBatchBudget& budget) const override {
    EXPECT_EQ(depth, 1);
    EXPECT_FALSE(limited);  // no token budget policy is set
    budget = MicroBatchBudget{max_prefill_, 1};
    return true;
  }
  void on_offload() override { ADD_FAILURE() << "nothing is offloaded without phases in the scheduler"; }
  void on_submitted() override { ++submitted; }

 private:
  int period_, max_prefill_;
};

TEST(LlmEngine, APhaseHookIsAskedBeforeEveryMicroBatchAndItsLimitsAndTransitionsApply) {
  EngineConfig plain = base_config();
  Harness reference(64, 4, plain);
  const auto want = run(*reference.engine, as_map(test_prompts()), greedy(6));

  EngineConfig cfg = base_config();
  RecordingPhases* hook = nullptr;
  const EngineParts* seen_parts = nullptr;
  EngineParts parts_copy;
  cfg.step_phases = [&](const EngineParts& parts) -> Result<std::unique_ptr<StepPhaseHook>> {
    parts_copy = parts;
    seen_parts = &parts;
    auto h = std::make_unique<RecordingPhases>(3, 4);
    hook = h.get();
    return std::unique_ptr<StepPhaseHook>(std::move(h));
  };
  Harness h(64, 4, cfg);
  ASSERT_NE(hook, nullptr);
  ASSERT_NE(seen_parts, nullptr);
  EXPECT_EQ(h.engine->step_phases(), hook);
  EXPECT_EQ(parts_copy.executor, &h.exec);
  EXPECT_EQ(parts_copy.scheduler, &h.engine->scheduler());
  EXPECT_EQ(parts_copy.kv_io, &h.engine->kv_io());
  EXPECT_EQ(parts_copy.max_num_seqs, cfg.max_num_seqs);
  EXPECT_EQ(parts_copy.max_model_len, cfg.max_model_len);

  const auto got = run(*h.engine, as_map(test_prompts()), greedy(6));
  expect_same_tokens(got, want);  // the fake model is batch-invariant
  // The limits held in every step: 4 prompt tokens and 1 decode token at most.
  EXPECT_LE(h.exec.max_step_tokens, 5);
  for (const StepStats& s : h.engine->step_stats()) {
    EXPECT_LE(s.num_prefill_tokens, 4);
    EXPECT_LE(s.num_decode_tokens, 1);
  }
  EXPECT_EQ(hook->submitted, h.exec.num_steps);
  EXPECT_GE(hook->admits, hook->submitted);
  // Nothing is ever in flight between steps of a one-stage executor, so each
  // asked-for transition ran at once.
  EXPECT_EQ(hook->transitions, hook->admits / 3);
  EXPECT_GT(hook->transitions, 0);
}

TEST(LlmEngine, APhaseFactoryErrorFailsCreate) {
  EngineConfig cfg = base_config();
  cfg.step_phases = [](const EngineParts&) -> Result<std::unique_ptr<StepPhaseHook>> {
    return make_error(ErrorCode::invalid_argument, "engine config: this technique cannot run here");
  };
  FakeExecutor exec(64, 4);
  FakeTokenizer tok;
  auto r = LlmEngine::create(exec, tok, cfg);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(r.error().message, "engine config: this technique cannot run here");
}

}  // namespace
}  // namespace shardline::engine
