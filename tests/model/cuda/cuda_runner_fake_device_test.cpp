// The REAL CUDA runner (model/cuda/cuda_runner.cpp) end to end on a FAKE CUDA
// device (tests/model/cuda/fake_device.hpp: a CPU test double of the CUDA
// runtime calls and of the kernels::cuda API, no GPU involved). What this
// checks is the runner's host logic -- the weight arena and dtype
// conversion, the step metadata (pinned mirror copied to fixed device
// addresses), packed block tables, CUDA-graph capture at start-up and replay
// with padding rows, the device-sampling plumbing (SampleRow + penalty /
// masked id lists), the forward op order, error paths and clean-up -- against
// the stories260K golden reference. The kernels' own numerics are the CPU
// reference kernels' here; the real kernels are tested by the *_gpu_test
// files on a GPU.
//
// Every test runs twice: with the fake device executing queued work at once
// and deferring it to the next synchronisation point (the two extremes of a
// GPU's timing). After each test the fake must have recorded no anomaly
// (out-of-bounds or freed ranges, bad block ids, attention sequences outside
// their launch bounds, API misuse) and hold no allocation, stream or graph.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <thread>

#include <cuda_runtime_api.h>  // cudaError_t values for fault injection

#include <nlohmann/json.hpp>
#include <regex>

#include "engine/gpu_memory_plan.hpp"
#include "model/tokenizer_loader.hpp"
#include "engine/llm_engine.hpp"
#include "model/config.hpp"
#include "model/cpu_runner.hpp"
#include "model/cuda/cuda_runner.hpp"
#include "text/id_tokenizer.hpp"
#include "text/tokenizer.hpp"
#include "model/weights.hpp"
#include "sampling/structured_output/grammar.hpp"
#include "tests/model/cuda/dummy_archs.hpp"
#include "tests/model/cuda/fake_device.hpp"
#include "tests/support/engine_runs.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline::testing_support::fake_cuda {
void PrintTo(Execution e, std::ostream* os) { *os << (e == Execution::immediate ? "immediate" : "deferred"); }
}  // namespace shardline::testing_support::fake_cuda

namespace shardline::engine {
namespace {

namespace fc = testing_support::fake_cuda;
using testing_support::add_fillers;
using testing_support::bit_identical;
using testing_support::kStoriesDir;
using testing_support::run_all;
using model::ModelExecutor;
using model::RowSampling;
using model::StepInput;

constexpr int kMaxTokens = 48;
constexpr int kMaxNumSeqs = 64;
constexpr int kMaxModelLen = 512;  // stories260K's max_position_embeddings
constexpr int kNumKvBlocks = 409;  // what 8 MiB of F32 KV holds (the GPU test's kv_cache_bytes)

/// Host weights, loaded once: F32 (for F32 and F16 on the device, as the
/// engine builder loads them) or BF16.
std::shared_ptr<const model::ModelWeights> host_weights(DType load_dtype) {
  static std::map<DType, std::shared_ptr<const model::ModelWeights>> cache;
  auto& w = cache[load_dtype];
  if (!w) {
    model::LoadOptions lo;
    lo.dtype = load_dtype;
    auto r = model::load_model(kStoriesDir, lo);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().to_string());
    if (r.ok()) w = std::make_shared<const model::ModelWeights>(std::move(r).value());
  }
  return w;
}

const text::Tokenizer& tokenizer() {
  static std::unique_ptr<text::Tokenizer> tok = [] {
    auto r = model::load_tokenizer(kStoriesDir);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().to_string());
    return r.ok() ? std::move(r).value() : nullptr;
  }();
  return *tok;
}

struct Config {
  int max_num_batched_tokens = 2048;
  bool capture_logits = true;  // host sampling; off: the runner samples on the device
  DType weight_dtype = DType::f32;
  DType kv_cache_dtype = DType::f32;
  bool cuda_graphs = true;
  bool deterministic = true;
  int max_model_len = kMaxModelLen;  // the runner's and the engine's
  std::vector<int> cuda_graph_batch_sizes;  // empty: the defaults
  int block_size = 16;
  int num_kv_blocks = kNumKvBlocks;
};

model::CudaRunnerOptions runner_options(const Config& s) {
  model::CudaRunnerOptions o;
  o.num_kv_blocks = s.num_kv_blocks;
  o.block_size = s.block_size;
  o.weight_dtype = s.weight_dtype;
  o.kv_cache_dtype = s.kv_cache_dtype;
  o.max_num_batched_tokens = s.max_num_batched_tokens;
  o.max_num_seqs = kMaxNumSeqs;
  o.max_model_len = s.max_model_len;
  o.deterministic = s.deterministic;
  o.cuda_graphs = s.cuda_graphs;
  o.cuda_graph_batch_sizes = s.cuda_graph_batch_sizes;
  return o;
}

struct Instance {
  std::unique_ptr<model::CudaModelRunner> runner;
  std::unique_ptr<LlmEngine> engine;
};

Instance make(const Config& s) {
  Instance e;
  const DType load = s.weight_dtype == DType::bf16 ? DType::bf16 : DType::f32;
  auto r = model::CudaModelRunner::create(host_weights(load), runner_options(s));
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().to_string());
  if (!r.ok()) return e;
  e.runner = std::move(r).value();
  EngineConfig ec;
  ec.max_num_seqs = kMaxNumSeqs;
  ec.max_num_batched_tokens = s.max_num_batched_tokens;
  ec.max_model_len = s.max_model_len;
  ec.eos_token_ids = e.runner->config().eos_token_ids;
  ec.capture_logits = s.capture_logits;
  ec.check_integrity = true;
  auto eng = LlmEngine::create(*e.runner, tokenizer(), ec);
  EXPECT_TRUE(eng.ok()) << (eng.ok() ? "" : eng.error().to_string());
  if (eng.ok()) e.engine = std::move(eng).value();
  return e;
}

sampling::SamplingParams greedy() {
  sampling::SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = kMaxTokens;
  return p;
}

void expect_reference(const testing_support::StoriesCase& ref, const RequestOutput& out, const std::string& where) {
  testing_support::expect_reference(ref, out, kMaxTokens, where);
}

/// Steps in which the runner replayed a graph, and those with padding rows.
/// A replayed graph is the smallest captured batch size that holds the step.
struct GraphUse {
  int graph_steps = 0;
  int padded_steps = 0;
};
void count_graph_use(Instance& e, GraphUse& use) {
  model::CudaModelRunner* r = e.runner.get();
  e.engine->set_step_callback([r, &use](const StepStats& s) {
    const model::CudaStepStats& cs = r->last_step_stats();
    if (!cs.used_graph) return;
    ++use.graph_steps;
    const std::vector<int> sizes = r->captured_batch_sizes();
    const auto fit = std::lower_bound(sizes.begin(), sizes.end(), s.num_seqs);
    ASSERT_NE(fit, sizes.end());
    EXPECT_EQ(cs.padded_batch, *fit) << s.num_seqs << " sequences";
    // One token per sequence (a decode, or the last token of a prompt).
    EXPECT_EQ(s.num_decode_tokens + s.num_prefill_tokens, s.num_seqs);
    if (cs.padded_batch > s.num_seqs) ++use.padded_steps;
  });
}

/// A greedy request of about `n` prompt tokens (stories text repeated).
std::vector<std::int32_t> long_prompt(const std::string& text, std::size_t n) {
  std::string t = text;
  while (tokenizer().encode(t, true).size() < n) t += " " + text;
  std::vector<std::int32_t> ids = tokenizer().encode(t, true);
  ids.resize(n);
  return ids;
}

/// The outputs of the requests `add` puts in an engine that samples on the
/// device ([0]) and in one that samples captured logits on the host ([1]),
/// and the sample kernels each ran.
struct DeviceAndHost {
  std::map<std::uint64_t, RequestOutput> outs[2];
  long sample_kernels[2] = {0, 0};
};
DeviceAndHost run_device_and_host(const std::function<void(LlmEngine&)>& add) {
  DeviceAndHost r;
  for (int host = 0; host < 2; ++host) {
    Config s;
    s.max_num_batched_tokens = 256;
    s.capture_logits = host == 1;
    Instance e = make(s);
    EXPECT_NE(e.engine, nullptr);
    if (e.engine == nullptr) return r;
    const long before = fc::kernel_runs("sample");
    add(*e.engine);
    r.outs[host] = run_all(*e.engine);
    r.sample_kernels[host] = fc::kernel_runs("sample") - before;
  }
  return r;
}

class CudaRunnerFakeDevice : public testing_support::FakeDeviceTimingTest {
 protected:
  void SetUp() override {
    ASSERT_NE(host_weights(DType::f32), nullptr);
    FakeDeviceTimingTest::SetUp();
  }
};

INSTANTIATE_TEST_SUITE_P(Timing, CudaRunnerFakeDevice, testing_support::fake_timings(),
                         testing_support::fake_timing_name);

// 1. Greedy stories260K alone, logits captured (host sampling): the
// reference ids, text and top-5 logits within 1e-4; prefill eager, decode
// through the batch-1 graph. (Both GEMM modes: the fake computes them alike.)
TEST_P(CudaRunnerFakeDevice, Stories260KAloneGivesTheReference) {
  const auto refs = testing_support::load_stories_reference();
  ASSERT_EQ(refs.size(), 3u);
  for (bool deterministic : {false, true})
  for (std::size_t i = 0; i < refs.size(); ++i) {
    Config s;
    s.deterministic = deterministic;
    Instance e = make(s);
    ASSERT_NE(e.engine, nullptr);
    EXPECT_EQ(e.runner->graph_capture_error(), "");
    EXPECT_EQ(e.runner->captured_batch_sizes(), model::default_cuda_graph_batch_sizes(kMaxNumSeqs));
    GraphUse use;
    count_graph_use(e, use);
    ASSERT_TRUE(e.engine->add_request(7, tokenizer().encode(refs[i].prompt, true), greedy()).ok());
    auto outs = run_all(*e.engine);
    ASSERT_EQ(outs.size(), 1u);
    EXPECT_EQ(outs.at(7).prompt_token_ids, refs[i].prompt_ids);
    expect_reference(refs[i], outs.at(7), "case " + std::to_string(i));
    EXPECT_EQ(use.graph_steps, kMaxTokens - 1) << "every decode step replays the batch-1 graph";
    EXPECT_EQ(fc::pending_ops(), 0);
  }
}

// 2. The three reference requests among 61 fillers at token budgets 7, 64 and
// 2048 (prefill chunked differently; decode through graphs of other batch
// sizes, padded) have the reference outputs and logits bit-identical to
// running alone without graphs. The fake kernels compute row by row, so any
// difference would come from the runner's batching, padding, metadata or
// graph replay. Contexts of up to 1024 tokens are allowed here and one more
// request has a 600-token prompt, so decode attention takes two splits and
// its workspace is in use (the fake checks its size and the launch bounds).
TEST_P(CudaRunnerFakeDevice, BatchedThroughGraphsIsBitIdenticalToAloneEager) {
  const auto refs = testing_support::load_stories_reference();
  const std::vector<std::int32_t> long_ids = long_prompt(refs[1].full_text, 600);
  sampling::SamplingParams long_params = greedy();
  long_params.max_tokens = 16;
  std::vector<RequestOutput> alone;
  for (std::size_t i = 0; i <= refs.size(); ++i) {
    Config s;
    s.cuda_graphs = false;
    s.max_model_len = 1024;
    Instance e = make(s);
    ASSERT_NE(e.engine, nullptr);
    EXPECT_TRUE(e.runner->captured_batch_sizes().empty());
    if (i < refs.size())
      ASSERT_TRUE(e.engine->add_request(7, tokenizer().encode(refs[i].prompt, true), greedy()).ok());
    else
      ASSERT_TRUE(e.engine->add_request(7, long_ids, long_params).ok());
    alone.push_back(run_all(*e.engine).at(7));
  }
  ASSERT_EQ(alone.back().token_ids.size(), 16u);
  EXPECT_EQ(fc::counters().graph_launches, 0);
  for (int budget : {7, 64, 2048}) {
    Config s;
    s.max_num_batched_tokens = budget;
    s.max_model_len = 1024;
    Instance e = make(s);
    ASSERT_NE(e.engine, nullptr);
    EXPECT_EQ(e.runner->graph_capture_error(), "");
    EXPECT_FALSE(e.runner->captured_batch_sizes().empty());
    GraphUse use;
    count_graph_use(e, use);
    const long launches_before = fc::counters().graph_launches;
    for (std::size_t i = 0; i < refs.size(); ++i)
      ASSERT_TRUE(e.engine->add_request(i, tokenizer().encode(refs[i].prompt, true), greedy()).ok());
    add_fillers(*e.engine, tokenizer(), 100, 61);
    ASSERT_TRUE(e.engine->add_request(200, long_ids, long_params).ok());
    auto outs = run_all(*e.engine);
    ASSERT_EQ(outs.size(), 65u) << "budget " << budget;
    for (std::size_t i = 0; i < refs.size(); ++i) {
      const std::string where = "budget " + std::to_string(budget) + " case " + std::to_string(i);
      expect_reference(refs[i], outs.at(i), where);
      EXPECT_TRUE(bit_identical(outs.at(i), alone[i])) << where << ": logits differ from alone";
    }
    EXPECT_TRUE(bit_identical(outs.at(200), alone.back())) << "budget " << budget << ": long prompt";
    EXPECT_GT(use.graph_steps, 0) << "budget " << budget << ": decode steps should replay graphs";
    EXPECT_GT(use.padded_steps, 0) << "budget " << budget << ": some decode batches should be padded";
    EXPECT_EQ(fc::counters().graph_launches - launches_before, use.graph_steps);
  }
}

// Graphs of chosen batch sizes only ({5, 3}): larger decode batches run
// eagerly, smaller ones through the next size up, padded; results as alone.
// Sizes outside [1, max_num_seqs] are refused.
TEST_P(CudaRunnerFakeDevice, ChosenGraphBatchSizes) {
  const auto refs = testing_support::load_stories_reference();
  Config s;
  s.cuda_graph_batch_sizes = {5, 3, 5};
  Instance e = make(s);
  ASSERT_NE(e.engine, nullptr);
  EXPECT_EQ(e.runner->captured_batch_sizes(), (std::vector<int>{3, 5}));
  GraphUse use;
  int eager_decode_steps = 0;
  model::CudaModelRunner* r = e.runner.get();
  e.engine->set_step_callback([&](const StepStats& st) {
    const model::CudaStepStats& cs = r->last_step_stats();
    if (!cs.used_graph) {
      if (st.num_prefill_tokens == 0) {
        ++eager_decode_steps;
        EXPECT_GT(st.num_seqs, 5) << "a decode batch that fits a graph ran eagerly";
      }
      return;
    }
    ++use.graph_steps;
    EXPECT_EQ(cs.padded_batch, st.num_seqs <= 3 ? 3 : 5) << st.num_seqs << " sequences";
    if (cs.padded_batch > st.num_seqs) ++use.padded_steps;
  });
  for (std::size_t i = 0; i < refs.size(); ++i)
    ASSERT_TRUE(e.engine->add_request(i, tokenizer().encode(refs[i].prompt, true), greedy()).ok());
  add_fillers(*e.engine, tokenizer(), 100, 7);
  auto outs = run_all(*e.engine);
  ASSERT_EQ(outs.size(), 10u);
  for (std::size_t i = 0; i < refs.size(); ++i) expect_reference(refs[i], outs.at(i), "case " + std::to_string(i));
  EXPECT_GT(use.graph_steps, 0);
  EXPECT_GT(use.padded_steps, 0);
  EXPECT_GT(eager_decode_steps, 0) << "batches of more than 5 run eagerly";

  for (std::vector<int> bad : {std::vector<int>{0}, std::vector<int>{kMaxNumSeqs + 1}}) {
    Config b;
    b.cuda_graph_batch_sizes = bad;
    auto r = model::CudaModelRunner::create(host_weights(DType::f32), runner_options(b));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
  }
}

// A block size that divides nothing (7 tokens): longer block tables, blocks
// straddling chunk boundaries; the batch still gives the reference.
TEST_P(CudaRunnerFakeDevice, OddBlockSizeGivesTheReference) {
  const auto refs = testing_support::load_stories_reference();
  Config s;
  s.block_size = 7;
  s.num_kv_blocks = kNumKvBlocks * 16 / 7;
  s.max_num_batched_tokens = 64;
  Instance e = make(s);
  ASSERT_NE(e.engine, nullptr);
  GraphUse use;
  count_graph_use(e, use);
  for (std::size_t i = 0; i < refs.size(); ++i)
    ASSERT_TRUE(e.engine->add_request(i, tokenizer().encode(refs[i].prompt, true), greedy()).ok());
  add_fillers(*e.engine, tokenizer(), 100, 20);
  auto outs = run_all(*e.engine);
  ASSERT_EQ(outs.size(), 23u);
  for (std::size_t i = 0; i < refs.size(); ++i) expect_reference(refs[i], outs.at(i), "case " + std::to_string(i));
  EXPECT_GT(use.graph_steps, 0);
}

// The same with the production dtypes, BF16 weights and BF16 KV cache (no
// reference to compare with): batched through graphs == alone, bit for bit.
TEST_P(CudaRunnerFakeDevice, Bf16BatchedIsBitIdenticalToAlone) {
  const auto refs = testing_support::load_stories_reference();
  Config s;
  s.weight_dtype = DType::bf16;
  s.kv_cache_dtype = DType::bf16;
  std::vector<RequestOutput> alone;
  for (const auto& r : refs) {
    Config a = s;
    a.cuda_graphs = false;
    Instance e = make(a);
    ASSERT_NE(e.engine, nullptr);
    ASSERT_TRUE(e.engine->add_request(7, tokenizer().encode(r.prompt, true), greedy()).ok());
    alone.push_back(run_all(*e.engine).at(7));
  }
  s.max_num_batched_tokens = 64;
  Instance e = make(s);
  ASSERT_NE(e.engine, nullptr);
  GraphUse use;
  count_graph_use(e, use);
  for (std::size_t i = 0; i < refs.size(); ++i)
    ASSERT_TRUE(e.engine->add_request(i, tokenizer().encode(refs[i].prompt, true), greedy()).ok());
  add_fillers(*e.engine, tokenizer(), 100, 61);
  auto outs = run_all(*e.engine);
  ASSERT_EQ(outs.size(), 64u);
  for (std::size_t i = 0; i < refs.size(); ++i)
    EXPECT_TRUE(bit_identical(outs.at(i), alone[i])) << "case " << i << ": logits differ from alone";
  EXPECT_GT(use.graph_steps, 0);
}

// 3. Sampling on the device (no logits captured) with penalties, min_tokens,
// top-k / top-p / min-p and seeds draws the ids host sampling draws from the
// same runner's logits; greedy device sampling gives the reference ids.
TEST_P(CudaRunnerFakeDevice, DeviceSamplingMatchesHostSampling) {
  const auto refs = testing_support::load_stories_reference();
  std::vector<sampling::SamplingParams> params = testing_support::mixed_sampling_params(16, 30);
  // min_tokens masking that decides the output: case 0's first greedy token
  // as a stop token, masked for the first 4 tokens (greedy and sampled).
  const std::int32_t masked_first = refs[0].generated_ids[0];
  for (int i = 0; i < 2; ++i) {
    sampling::SamplingParams p;
    p.max_tokens = 12;
    p.temperature = i == 0 ? 0.0f : 0.3f;
    p.seed = 77;
    p.has_seed = true;
    p.stop_token_ids = {masked_first};
    p.min_tokens = 4;
    params.push_back(p);
  }
  const std::size_t first_masked_request = params.size() - 2;
  const auto prompt_of = [&](std::size_t i) {
    const char* prompts[] = {"Once upon a time", "The little girl", "Tom had a", "In the park"};
    return tokenizer().encode(i >= first_masked_request ? refs[0].prompt : prompts[i % 4], true);
  };
  const DeviceAndHost run = run_device_and_host([&](LlmEngine& engine) {
    for (std::size_t i = 0; i < params.size(); ++i)
      ASSERT_TRUE(engine.add_request(i, prompt_of(i), params[i]).ok());
  });
  const auto& outs = run.outs;
  const auto& sample_kernels = run.sample_kernels;
  EXPECT_GT(sample_kernels[0], 0) << "device sampling should run the sample kernel";
  EXPECT_EQ(sample_kernels[1], 0) << "captured logits are sampled on the host";
  ASSERT_EQ(outs[0].size(), params.size());
  ASSERT_EQ(outs[1].size(), params.size());
  for (const auto& [id, out] : outs[1]) {
    EXPECT_EQ(outs[0].at(id).token_ids, out.token_ids) << "request " << id;
    EXPECT_EQ(outs[0].at(id).finish_reason, out.finish_reason) << "request " << id;
    EXPECT_TRUE(outs[0].at(id).logits.empty());
  }
  // min_tokens held EOS / the stop token back where asked.
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (params[i].min_tokens > 0) {
      EXPECT_GE(outs[0].at(i).token_ids.size(), static_cast<std::size_t>(params[i].min_tokens)) << "request " << i;
    }
  }
  for (std::size_t i = first_masked_request; i < params.size(); ++i) {
    const auto& ids = outs[0].at(i).token_ids;
    EXPECT_EQ(std::count(ids.begin(), ids.begin() + std::min<std::size_t>(4, ids.size()), masked_first), 0)
        << "request " << i;
  }

  Config s;
  s.capture_logits = false;
  Instance e = make(s);
  ASSERT_NE(e.engine, nullptr);
  for (std::size_t i = 0; i < refs.size(); ++i)
    ASSERT_TRUE(e.engine->add_request(i, tokenizer().encode(refs[i].prompt, true), greedy()).ok());
  auto greedy_outs = run_all(*e.engine);
  ASSERT_EQ(greedy_outs.size(), refs.size());
  for (std::size_t i = 0; i < refs.size(); ++i)
    EXPECT_EQ(greedy_outs.at(i).token_ids, refs[i].generated_ids) << "greedy case " << i;
}

// 3b. Structured outputs sampled on the device: each constrained row's
// grammar bitmask goes up with its SampleRow and the sample kernel masks the
// row first; the outputs are those of host sampling (captured logits), and
// each matches its grammar.
TEST_P(CudaRunnerFakeDevice, DeviceSamplingAppliesGrammarMasks) {
  Config probe;
  Instance first = make(probe);
  ASSERT_NE(first.engine, nullptr);
  const model::ModelConfig& mc = first.runner->config();
  auto compiler = sampling::GrammarCompiler::create(tokenizer(), mc.vocab_size, mc.eos_token_ids);
  ASSERT_TRUE(compiler.ok()) << compiler.error().to_string();
  const std::vector<sampling::GrammarSpec> specs = {
      {sampling::GrammarKind::regex, "[a-c]{2}-[0-9]{3}", {}, true},
      {sampling::GrammarKind::choice, "", {"Once upon a time", "The end", "Lily"}, true},
      {sampling::GrammarKind::json_schema,
       R"({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
           "required": ["n"], "additionalProperties": false})",
       {},
       false},
  };
  std::vector<std::shared_ptr<const sampling::CompiledGrammar>> grammars;
  for (const auto& spec : specs) {
    auto g = (*compiler)->compile(spec);
    ASSERT_TRUE(g.ok()) << g.error().to_string();
    grammars.push_back(*g);
  }
  const char* prompts[] = {"Once upon a time", "The little girl", "Tom had a"};
  const DeviceAndHost run = run_device_and_host([&](LlmEngine& engine) {
    std::uint64_t id = 0;
    for (std::size_t g = 0; g < grammars.size(); ++g)
      for (const char* prompt : prompts)
        for (const bool greedy : {true, false}) {
          sampling::SamplingParams p;
          p.max_tokens = 40;
          p.temperature = greedy ? 0.0f : 1.0f;
          p.seed = 500 + id;
          p.has_seed = !greedy;
          ASSERT_TRUE(engine.add_request(id++, tokenizer().encode(prompt, true), p, grammars[g]).ok());
        }
  });
  const auto& outs = run.outs;
  const auto& sample_kernels = run.sample_kernels;
  EXPECT_GT(sample_kernels[0], 0) << "constrained rows should be sampled on the device";
  EXPECT_EQ(sample_kernels[1], 0);
  ASSERT_EQ(outs[0].size(), 18u);
  ASSERT_EQ(outs[1].size(), 18u);
  for (const auto& [id, out] : outs[1]) {
    EXPECT_EQ(outs[0].at(id).token_ids, out.token_ids) << "request " << id;
    EXPECT_EQ(outs[0].at(id).finish_reason, FinishReason::stop) << "request " << id << ": " << outs[0].at(id).text;
    const std::string& text = outs[0].at(id).text;
    switch (id / 6) {
      case 0: EXPECT_TRUE(std::regex_match(text, std::regex("[a-c]{2}-[0-9]{3}"))) << text; break;
      case 1: EXPECT_TRUE(text == "Once upon a time" || text == "The end" || text == "Lily") << text; break;
      default: {
        const auto j = nlohmann::json::parse(text, nullptr, false);
        ASSERT_TRUE(j.is_object() && j.size() == 1 && j.contains("n") && j["n"].is_number_integer()) << text;
        EXPECT_LE(j["n"].get<int>(), 99) << text;
      }
    }
  }
}

// 4. BF16 and F16 weights (converted while uploading) stay close to the F32
// reference: case 0's first tokens, where the reference's top-1 leads the
// top-2 by more than 1 logit, are the reference's; the first top logit is
// within 5 %.
TEST_P(CudaRunnerFakeDevice, Bf16AndF16WeightsStayCloseToTheReference) {
  const auto refs = testing_support::load_stories_reference();
  const auto& ref = refs[0];
  int clear_steps = 0;  // leading steps with a top-1 / top-2 gap > 1
  while (clear_steps < kMaxTokens && ref.top5[clear_steps][0].second - ref.top5[clear_steps][1].second > 1.0f)
    ++clear_steps;
  ASSERT_GE(clear_steps, 4);
  std::size_t f32_weight_bytes = 0;
  {
    Instance e = make(Config{});
    ASSERT_NE(e.runner, nullptr);
    f32_weight_bytes = e.runner->weight_bytes();
  }
  for (DType dtype : {DType::bf16, DType::f16}) {
    Config s;
    s.weight_dtype = dtype;
    s.deterministic = false;
    Instance e = make(s);
    ASSERT_NE(e.engine, nullptr);
    // Matrices in 2 bytes, norms and RoPE frequencies in F32: a bit more than half.
    EXPECT_LT(e.runner->weight_bytes(), f32_weight_bytes * 6 / 10) << dtype_name(dtype);
    EXPECT_GT(e.runner->weight_bytes(), f32_weight_bytes / 2) << dtype_name(dtype);
    ASSERT_TRUE(e.engine->add_request(1, tokenizer().encode(ref.prompt, true), greedy()).ok());
    const RequestOutput out = run_all(*e.engine).at(1);
    ASSERT_EQ(out.logits.size(), static_cast<std::size_t>(kMaxTokens));
    for (int step = 0; step < clear_steps; ++step)
      ASSERT_EQ(out.token_ids[step], ref.generated_ids[step]) << dtype_name(dtype) << " step " << step;
    const float ref_top = ref.top5[0][0].second;
    EXPECT_NEAR(out.logits[0][ref.top5[0][0].first], ref_top, 0.05f * std::max(1.0f, std::fabs(ref_top)))
        << dtype_name(dtype);
    // Not the F32 result: the weights really are rounded.
    EXPECT_NE(out.logits[0][ref.top5[0][0].first], ref_top) << dtype_name(dtype);
  }
}

// The weight arena holds exactly the model's tensors (engine/gpu_memory_plan's
// weight_bytes_for) plus the RoPE frequencies and 256-byte alignment, and
// what create() allocates on the device is what the memory plan sets aside:
// weights + KV cache + activation_bytes_for + cuda_runner_workspace_bytes
// (the fake's GemmContext allocates what the real one does), to alignment.
TEST_P(CudaRunnerFakeDevice, DeviceMemoryIsWhatTheMemoryPlanSetsAside) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f16})
    for (int budget : {7, 2048}) {
      const std::string where = std::string(dtype_name(dtype)) + " budget " + std::to_string(budget);
      Config s;
      s.weight_dtype = dtype;
      s.max_num_batched_tokens = budget;
      s.max_model_len = 1024;  // a split-decode workspace
      Instance e = make(s);
      ASSERT_NE(e.runner, nullptr);
      const model::ModelConfig& c = e.runner->config();
      const std::uint64_t tensors = weight_bytes_for(c, dtype);
      const std::uint64_t inv_freq = c.head_dim / 2 * 4;
      const std::uint64_t weight_slack = (2 + 7 * static_cast<std::uint64_t>(c.num_hidden_layers) + 1) * 256;
      EXPECT_GE(e.runner->weight_bytes(), tensors + inv_freq) << where;
      EXPECT_LE(e.runner->weight_bytes(), tensors + inv_freq + weight_slack) << where;
      EXPECT_EQ(e.runner->kv_cache_bytes(), static_cast<std::size_t>(kNumKvBlocks) * 16 * c.num_hidden_layers * 2 *
                                                c.num_key_value_heads * c.head_dim * 4)
          << where;
      const model::CudaRunnerOptions o = runner_options(s);
      const std::uint64_t plan = tensors + e.runner->kv_cache_bytes() +
                                 activation_bytes_for(c, std::max(budget, kMaxNumSeqs), kMaxNumSeqs) +
                                 model::cuda_runner_workspace_bytes(c, o);
      const std::uint64_t used = fc::live_device_bytes();
      EXPECT_LE(used, plan + inv_freq + weight_slack + 16 * 256) << where;
      EXPECT_GE(used + 16 * 256, plan) << where << ": the plan sets aside more than the runner uses";
    }
}

// Qwen3 (q / k RMSNorm, heads * head_dim != hidden), Qwen2 (QKV bias, untied
// lm_head) and Llama 3 (RoPE scaling, attention bias, MHA, head_dim 20)
// shapes with seeded dummy weights: the CUDA runner on the fake device, F32,
// graphs on, chunked prefill, agrees with the CPU runner (the CPU forward of
// model/shard_runner.cpp) on every generated step's logits, batched. Only a
// near-tie in the CPU logits may turn greedy decoding another way.
TEST_P(CudaRunnerFakeDevice, OtherArchitecturesMatchTheCpuRunner) {
  for (const std::string name : {"qwen3", "qwen2", "llama3"}) {
    const auto w = testing_support::load_dummy_arch(name, "fake_device");
    ASSERT_NE(w, nullptr);
    const model::ModelConfig& c = w->config;
    ASSERT_EQ(c.qk_norm, name == "qwen3");
    ASSERT_EQ(c.qkv_bias, name != "qwen3");
    auto cuda = model::CudaModelRunner::create(w, testing_support::dummy_cuda_options());
    ASSERT_TRUE(cuda.ok()) << name << ": " << cuda.error().to_string();
    model::CpuRunnerOptions po;
    po.num_kv_blocks = testing_support::kDummyBlocks;
    auto cpu = model::CpuModelRunner::create(w, po);
    ASSERT_TRUE(cpu.ok()) << name << ": " << cpu.error().to_string();
    int graph_steps = 0;
    std::map<std::uint64_t, RequestOutput> outs[2];
    outs[0] = testing_support::run_dummy_requests(**cuda, c.vocab_size, true, testing_support::greedy_eight(),
                                                  [&] { graph_steps += (*cuda)->last_step_stats().used_graph; });
    outs[1] = testing_support::run_dummy_requests(**cpu, c.vocab_size, true, testing_support::greedy_eight());
    EXPECT_GT(graph_steps, 0) << name;
    ASSERT_EQ(outs[0].size(), 6u) << name;
    testing_support::expect_close_to_cpu(outs[0], outs[1], name);
  }
}

using testing_support::three_token_step;

// 5. Bad steps are refused with invalid_argument before anything runs, and
// the runner then computes a good step exactly as a fresh runner does.
TEST_P(CudaRunnerFakeDevice, BadStepsAreRefusedAndTheRunnerGoesOn) {
  Instance fresh = make(Config{});
  ASSERT_NE(fresh.runner, nullptr);
  auto expected = fresh.runner->execute(three_token_step(16));
  ASSERT_TRUE(expected.ok()) << expected.error().to_string();
  ASSERT_EQ(expected->logits.size(), 512u);

  Instance e = make(Config{});
  ASSERT_NE(e.runner, nullptr);
  ModelExecutor& x = *e.runner;
  {  // a token id outside the vocabulary
    StepInput in = three_token_step(16);
    in.token_ids[1] = 9999;
    auto bad = x.execute(in);
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(bad.error().message.find("9999"), std::string::npos) << bad.error().message;
  }
  {  // a context beyond max_model_len
    StepInput in = three_token_step(16);
    in.seqs[0].num_computed_tokens = kMaxModelLen;
    in.seqs[0].block_table.assign(33, 0);
    in.positions = {kMaxModelLen, kMaxModelLen + 1, kMaxModelLen + 2};
    auto bad = x.execute(in);
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(bad.error().message.find("max_model_len"), std::string::npos) << bad.error().message;
  }
  {  // sampling rows that do not match the logits rows
    StepInput in = three_token_step(16);
    sampling::SamplingParams p = greedy();
    in.sampling.resize(2);
    for (RowSampling& r : in.sampling) r.params = &p;
    auto bad = x.execute(in);
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.error().code, ErrorCode::invalid_argument);
  }
  auto good = x.execute(three_token_step(16));
  ASSERT_TRUE(good.ok()) << good.error().to_string();
  ASSERT_EQ(good->logits.size(), expected->logits.size());
  EXPECT_EQ(good->logits, expected->logits);

  // More rows than the runner holds (max(max_num_batched_tokens 16,
  // max_num_seqs 64) = 64) is refused with the numbers.
  Config s;
  s.max_num_batched_tokens = 16;
  Instance small = make(s);
  ASSERT_NE(small.runner, nullptr);
  constexpr int kRows = 65;
  StepInput big = three_token_step(16);
  big.seqs[0].num_new_tokens = kRows;
  big.seqs[0].block_table = {0, 1, 2, 3, 4};
  big.token_ids.assign(kRows, 1);
  big.positions.resize(kRows);
  big.slot_mapping.resize(kRows);
  for (int t = 0; t < kRows; ++t) big.positions[t] = big.slot_mapping[t] = t;
  big.logits_rows = {kRows - 1};
  auto refused = small.runner->execute(big);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(refused.error().message.find("max_num_batched_tokens"), std::string::npos) << refused.error().message;
  // 64 rows fit.
  big.seqs[0].num_new_tokens = 64;
  big.token_ids.resize(64);
  big.positions.resize(64);
  big.slot_mapping.resize(64);
  big.seqs[0].block_table = {0, 1, 2, 3};
  big.logits_rows = {63};
  auto fits = small.runner->execute(big);
  EXPECT_TRUE(fits.ok()) << fits.error().to_string();
}

// Seesaw's `--reshard-weights reload` on CUDA (seed 000 §4.1): a runner
// made without weights (upload_weights = false) or whose weights were
// released refuses steps and holds no arena on the device; load_weights
// uploads them again from the host copy, and the logits are the resident
// runner's, bit for bit. A host copy without matrices is refused; a runner
// with captured decode graphs cannot release its weights.
TEST_P(CudaRunnerFakeDevice, ReleasedWeightsRefuseStepsUntilLoadedAgain) {
  Config eager;
  eager.cuda_graphs = false;
  Instance resident = make(eager);
  ASSERT_NE(resident.runner, nullptr);
  auto expected = resident.runner->execute(three_token_step(16));
  ASSERT_TRUE(expected.ok()) << expected.error().to_string();
  const std::size_t weight_bytes = resident.runner->weight_bytes();
  const std::size_t live_with_weights = fc::live_device_bytes();
  resident = Instance{};

  model::CudaRunnerOptions o = runner_options(eager);
  o.upload_weights = false;
  const auto host = host_weights(DType::f32);
  auto r = model::CudaModelRunner::create(host, o);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  model::CudaModelRunner& x = **r;
  EXPECT_FALSE(x.weights_on_device());
  EXPECT_EQ(x.weight_bytes(), 0u);
  EXPECT_EQ(fc::live_device_bytes() + weight_bytes, live_with_weights) << "everything but the weight arena";
  auto refused = x.execute(three_token_step(16));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(refused.error().message.find("load_weights"), std::string::npos) << refused.error().message;

  auto config_only = std::make_shared<model::ModelWeights>();
  config_only->config = host->config;
  EXPECT_EQ(x.load_weights(*config_only).error().code, ErrorCode::invalid_argument);
  for (int round = 0; round < 2; ++round) {
    ASSERT_TRUE(x.load_weights(*host).ok());
    EXPECT_EQ(x.weight_bytes(), weight_bytes);
    auto got = x.execute(three_token_step(16));
    ASSERT_TRUE(got.ok()) << got.error().to_string();
    EXPECT_EQ(got->logits, expected->logits) << "round " << round;
    ASSERT_TRUE(x.release_weights().ok());
    EXPECT_FALSE(x.weights_on_device());
    EXPECT_FALSE(x.execute(three_token_step(16)).ok());
  }

  Instance graphs = make(Config{});
  ASSERT_NE(graphs.runner, nullptr);
  ASSERT_FALSE(graphs.runner->captured_batch_sizes().empty());
  EXPECT_EQ(graphs.runner->release_weights().error().code, ErrorCode::unsupported);
}

// A graph capture that fails (here cudaGraphInstantiate of the third batch
// size) leaves no graph behind and the runner working eagerly, with the
// reference results.
TEST_P(CudaRunnerFakeDevice, FailedGraphCaptureFallsBackToEager) {
  for (const char* call : {"cudaGraphInstantiate", "cudaStreamEndCapture"}) {
    fc::fail_call(call, cudaErrorMemoryAllocation, 2);
    Instance e = make(Config{});
    ASSERT_NE(e.engine, nullptr);
    EXPECT_NE(e.runner->graph_capture_error(), "") << call;
    EXPECT_TRUE(e.runner->captured_batch_sizes().empty()) << call;
    EXPECT_EQ(fc::live_graph_execs(), 0) << call;
    EXPECT_EQ(fc::live_graphs(), 0) << call;
    GraphUse use;
    count_graph_use(e, use);
    const auto refs = testing_support::load_stories_reference();
    ASSERT_TRUE(e.engine->add_request(7, tokenizer().encode(refs[0].prompt, true), greedy()).ok());
    expect_reference(refs[0], run_all(*e.engine).at(7), call);
    EXPECT_EQ(use.graph_steps, 0) << call;
  }
}

// create() errors: no device, a failed device allocation (out_of_memory,
// naming what), a failed pinned allocation; nothing is left allocated.
TEST_P(CudaRunnerFakeDevice, CreateErrorsLeaveNothingBehind) {
  const auto w = host_weights(DType::f32);
  fc::set_device_count(-1);
  auto none = model::CudaModelRunner::create(w, runner_options(Config{}));
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code, ErrorCode::not_found);
  fc::set_device_count(1);

  fc::fail_call("cudaMalloc", cudaErrorMemoryAllocation, 1);  // the second: the KV cache
  auto oom = model::CudaModelRunner::create(w, runner_options(Config{}));
  ASSERT_FALSE(oom.ok());
  EXPECT_EQ(oom.error().code, ErrorCode::out_of_memory);
  EXPECT_NE(oom.error().message.find("KV cache"), std::string::npos) << oom.error().message;

  fc::fail_call("cudaMallocHost", cudaErrorMemoryAllocation);
  auto pinned = model::CudaModelRunner::create(w, runner_options(Config{}));
  ASSERT_FALSE(pinned.ok());
  EXPECT_EQ(pinned.error().code, ErrorCode::out_of_memory);

  Config bad;
  bad.kv_cache_dtype = DType::f16;
  auto refused = model::CudaModelRunner::create(w, runner_options(bad));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, ErrorCode::invalid_argument);
}


// The fake keeps CUDA's capture modes (two engines of one process: one
// captures its decode graphs while the other allocates): a thread-local
// capture prohibits cudaMalloc on its own thread only, a global one on
// every thread (the call fails and the anomaly is reported).
TEST_P(CudaRunnerFakeDevice, CaptureModesProhibitUnsafeCallsOnTheRightThreads) {
  namespace fc = testing_support::fake_cuda;
  for (const cudaStreamCaptureMode mode : {cudaStreamCaptureModeThreadLocal, cudaStreamCaptureModeGlobal}) {
    const bool local = mode == cudaStreamCaptureModeThreadLocal;
    cudaStream_t s = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamBeginCapture(s, mode), cudaSuccess);
    cudaError_t other = cudaSuccess;
    void* p = nullptr;
    std::thread([&] { other = cudaMalloc(&p, 256); }).join();
    EXPECT_EQ(other == cudaSuccess, local) << "another thread allocates during a thread-local capture only";
    EXPECT_EQ(fc::anomalies().empty(), local);
    void* q = nullptr;
    EXPECT_NE(cudaMalloc(&q, 256), cudaSuccess) << "the capturing thread may not allocate";
    (void)cudaGetLastError();
    cudaGraph_t g = nullptr;
    EXPECT_NE(cudaStreamEndCapture(s, &g), cudaSuccess) << "the prohibited call invalidated the capture";
    (void)cudaGetLastError();
    EXPECT_FALSE(fc::anomalies().empty());
    if (p != nullptr) ASSERT_EQ(cudaFree(p), cudaSuccess);
    ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
    fc::reset(GetParam());  // the anomalies above were the point
  }
}

}  // namespace
}  // namespace shardline::engine
