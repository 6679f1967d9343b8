#pragma once
// What the fake-device tests share: the check every test ends with (the
// fake clean), the small dummy-weight models they run beside the CPU runner
// -- Qwen3 (q/k norm, GQA, tied lm_head), Qwen2 (biases, an odd
// vocabulary), Llama 3 (RoPE scaling, attention bias, MHA, head_dim 20) --,
// the runner options and requests of those runs, and how a run's logits
// are compared with the CPU runner's: within 1e-4 relative each step, the
// same greedy ids unless the CPU logits have a near-tie (< 1e-3) at the
// step where they part.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/llm_engine.hpp"
#include "model/cuda/cuda_runner.hpp"
#include "model/weights.hpp"
#include "tests/support/engine_runs.hpp"
#include "tests/model/cuda/fake_device.hpp"
#include "text/id_tokenizer.hpp"

namespace shardline::testing_support {

/// What every fake-device test checks when it ends (everything it made is
/// gone by then): no anomaly recorded, no allocation, stream or graph left;
/// then the fake is reset.
inline void expect_fake_device_clean_and_reset() {
  namespace fc = fake_cuda;
  for (const std::string& a : fc::anomalies()) ADD_FAILURE() << "fake device anomaly: " << a;
  EXPECT_EQ(fc::live_device_allocations(), 0) << fc::live_device_bytes() << " device bytes leaked";
  EXPECT_EQ(fc::live_pinned_allocations(), 0);
  EXPECT_EQ(fc::live_streams(), 0);
  EXPECT_EQ(fc::live_graphs(), 0);
  EXPECT_EQ(fc::live_graph_execs(), 0);
  fc::reset(fc::Execution::immediate);
}

/// A fake-device test run in both timings of the fake (TEST_P over
/// fake_timings(), named by fake_timing_name): the fake is reset to the
/// timing before the test, and must be clean after it.
class FakeDeviceTimingTest : public ::testing::TestWithParam<fake_cuda::Execution> {
 protected:
  void SetUp() override { fake_cuda::reset(GetParam()); }
  void TearDown() override { expect_fake_device_clean_and_reset(); }
};

inline auto fake_timings() {
  return ::testing::Values(fake_cuda::Execution::immediate, fake_cuda::Execution::deferred);
}

inline std::string fake_timing_name(const ::testing::TestParamInfo<fake_cuda::Execution>& info) {
  return info.param == fake_cuda::Execution::immediate ? "Immediate" : "Deferred";
}

/// The config.json of dummy architecture `name` ("qwen3", "qwen2", "llama3").
inline nlohmann::json dummy_arch(const std::string& name) {
  nlohmann::json cfg;
  if (name == "qwen3")
    cfg = {{"architectures", {"Qwen3ForCausalLM"}}, {"model_type", "qwen3"}, {"hidden_size", 128},
           {"intermediate_size", 256}, {"num_hidden_layers", 2}, {"num_attention_heads", 8},
           {"num_key_value_heads", 2}, {"head_dim", 32}, {"vocab_size", 1000}, {"rope_theta", 1000000.0},
           {"tie_word_embeddings", true}, {"attention_bias", false}};
  else if (name == "qwen2")
    cfg = {{"architectures", {"Qwen2ForCausalLM"}}, {"model_type", "qwen2"}, {"hidden_size", 96},
           {"intermediate_size", 200}, {"num_hidden_layers", 2}, {"num_attention_heads", 6},
           {"num_key_value_heads", 2}, {"head_dim", 16}, {"vocab_size", 777}, {"rope_theta", 10000.0},
           {"tie_word_embeddings", false}};
  else if (name == "llama3")
    cfg = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"hidden_size", 80},
           {"intermediate_size", 160}, {"num_hidden_layers", 3}, {"num_attention_heads", 4},
           {"num_key_value_heads", 4}, {"head_dim", 20}, {"vocab_size", 640}, {"rope_theta", 500000.0},
           {"rope_scaling",
            {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
             {"original_max_position_embeddings", 64}}},
           {"tie_word_embeddings", false}, {"attention_bias", true}};
  cfg.update({{"rms_norm_eps", 1e-6}, {"max_position_embeddings", 4096}, {"bos_token_id", 1}, {"eos_token_id", 2},
              {"hidden_act", "silu"}, {"torch_dtype", "float32"}});
  return cfg;
}

/// Seeded (11) dummy weights of dummy_arch(name), written under a folder
/// named `tag`; null (and a test failure) when it does not load.
inline std::shared_ptr<const model::ModelWeights> load_dummy_arch(const std::string& name, const std::string& tag) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / (tag + "_" + name);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << dummy_arch(name).dump(2);
  model::LoadOptions lo;
  lo.format = model::LoadFormat::dummy;
  lo.seed = 11;
  auto loaded = model::load_model(dir, lo);
  EXPECT_TRUE(loaded.ok()) << name << ": " << (loaded.ok() ? "" : loaded.error().to_string());
  if (!loaded.ok()) return nullptr;
  return std::make_shared<const model::ModelWeights>(std::move(loaded).value());
}

/// The engine's and the runners' sizes for the dummy runs: 64 KV blocks, 8
/// sequences, 16-token steps (chunked prefill), 256 positions.
inline constexpr int kDummyBlocks = 64, kDummySeqs = 8, kDummyBudget = 16, kDummyLen = 256;

/// A CUDA runner for the dummy runs: F32 weights and KV, deterministic.
inline model::CudaRunnerOptions dummy_cuda_options() {
  model::CudaRunnerOptions co;
  co.num_kv_blocks = kDummyBlocks;
  co.weight_dtype = DType::f32;
  co.kv_cache_dtype = DType::f32;
  co.max_num_batched_tokens = kDummyBudget;
  co.max_num_seqs = kDummySeqs;
  co.max_model_len = kDummyLen;
  co.deterministic = true;
  return co;
}

/// Greedy, 8 tokens, EOS ignored.
inline sampling::SamplingParams greedy_eight() {
  sampling::SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = 8;
  p.ignore_eos = true;
  return p;
}

/// Six requests of varied prompt lengths (3 to 38 tokens: chunked prefill
/// under the 16-token budget) with `p` (request r seeded 100 + r), through
/// an engine over `x`; `on_step` runs after every engine step.
inline std::map<std::uint64_t, engine::RequestOutput> run_dummy_requests(
    model::ModelExecutor& x, int vocab, bool capture_logits, const sampling::SamplingParams& p,
    const std::function<void()>& on_step = {}) {
  const text::IdTokenizer tok(vocab, 1, 2);
  engine::EngineConfig ec;
  ec.max_num_seqs = kDummySeqs;
  ec.max_num_batched_tokens = kDummyBudget;
  ec.max_model_len = kDummyLen;
  ec.eos_token_ids = {2};
  ec.capture_logits = capture_logits;
  ec.check_integrity = true;
  auto eng = engine::LlmEngine::create(x, tok, ec);
  EXPECT_TRUE(eng.ok()) << (eng.ok() ? "" : eng.error().to_string());
  if (!eng.ok()) return {};
  if (on_step) (*eng)->set_step_callback([&on_step](const engine::StepStats&) { on_step(); });
  for (int r = 0; r < 6; ++r) {
    std::vector<std::int32_t> prompt;
    for (int t = 0; t < 3 + 7 * r; ++t) prompt.push_back(3 + (37 * r + 11 * t) % (vocab - 3));
    sampling::SamplingParams q = p;
    q.seed = 100 + static_cast<std::uint64_t>(r);
    q.has_seed = true;
    EXPECT_TRUE((*eng)->add_request(static_cast<std::uint64_t>(r), prompt, q).ok());
  }
  return run_all(**eng);
}

/// Every request of `got` against the CPU runner's `want` (captured logits).
inline void expect_close_to_cpu(const std::map<std::uint64_t, engine::RequestOutput>& got,
                                const std::map<std::uint64_t, engine::RequestOutput>& want, const std::string& name) {
  for (const auto& [id, ref] : want) {
    ASSERT_EQ(got.count(id), 1u) << name << " request " << id;
    const engine::RequestOutput& out = got.at(id);
    const std::string where = name + " request " + std::to_string(id);
    ASSERT_EQ(out.logits.size(), ref.logits.size()) << where;
    for (std::size_t step = 0; step < ref.logits.size(); ++step) {
      const std::vector<float>& a = out.logits[step];
      const std::vector<float>& b = ref.logits[step];
      ASSERT_EQ(a.size(), b.size()) << where;
      float worst = 0.0f;
      for (std::size_t v = 0; v < b.size(); ++v)
        worst = std::max(worst, std::fabs(a[v] - b[v]) / std::max(1.0f, std::fabs(b[v])));
      EXPECT_LT(worst, 1e-4f) << where << " step " << step;
      if (out.token_ids[step] != ref.token_ids[step]) {
        std::vector<float> sorted = b;
        std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
        EXPECT_LT(sorted[0] - sorted[1], 1e-3f) << where << " step " << step << ": ids differ without a near-tie";
        break;
      }
    }
  }
}

}  // namespace shardline::testing_support
