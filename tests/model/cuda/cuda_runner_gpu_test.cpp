// The CUDA runner through the whole engine on the shipped stories260K
// (model/cuda/cuda_runner.hpp): FP32 weights give the reference greedy ids and
// top-5 logits; the deterministic mode gives logits bit-identical alone and
// in a batch of 64 (eager prefill, graph decode at any batch size); the
// device sampler draws the ids the CPU sampler draws from the same logits;
// bad steps are refused without breaking the runner. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include "engine/group/engine_builder.hpp"
#include "kernels/cuda/device.hpp"
#include "model/cuda/cuda_runner.hpp"
#include "tests/support/engine_runs.hpp"
#include "tests/support/kv_host_tier.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline::engine {
namespace {

constexpr int kMaxTokens = 48;
using testing_support::kStoriesDir;
using model::ModelExecutor;
using model::StepInput;

class CudaRunnerGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    const kernels::cuda::DeviceQuery q = kernels::cuda::query_devices();
    if (q.devices.empty()) GTEST_SKIP() << "no CUDA device: " << q.error;
  }

  static EngineInstance make(int max_num_batched_tokens, bool deterministic, bool capture_logits,
                             DType dtype = DType::f32, bool graphs = true) {
    EngineOptions o;
    o.model_dir = kStoriesDir;
    o.device = model::DeviceKind::cuda;
    o.dtype = dtype;
    o.kv_cache_dtype = DType::f32;
    o.gpu_memory_utilization = 0.5;
    o.kv_cache_bytes = 8u << 20;
    o.max_num_seqs = 64;
    o.max_num_batched_tokens = max_num_batched_tokens;
    o.deterministic = deterministic;
    o.cuda_graphs = graphs;
    o.capture_logits = capture_logits;
    o.check_integrity = true;
    auto e = build_engine(o);
    EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().to_string());
    return std::move(e).value();
  }
};

sampling::SamplingParams greedy() {
  sampling::SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = kMaxTokens;
  return p;
}

using testing_support::add_fillers;
using testing_support::bit_identical;
using testing_support::run_all;

void expect_reference(const testing_support::StoriesCase& ref, const RequestOutput& out, const std::string& where) {
  testing_support::expect_reference(ref, out, kMaxTokens, where);
}

// FP32 weights and KV, cuBLAS FP32 (no TF32) and the batch-invariant GEMM:
// the reference ids, text and top-5 logits within 1e-4.
TEST_F(CudaRunnerGpu, Stories260KFp32GivesTheReference) {
  const auto refs = testing_support::load_stories_reference();
  ASSERT_EQ(refs.size(), 3u);
  for (bool deterministic : {false, true})
    for (std::size_t i = 0; i < refs.size(); ++i) {
      EngineInstance e = make(2048, deterministic, true);
      ASSERT_NE(e.executor_as<model::CudaModelRunner>(), nullptr);
      ASSERT_TRUE(e.engine->add_request(7, e.tokenizer->encode(refs[i].prompt, true), greedy()).ok());
      auto outs = run_all(*e.engine);
      ASSERT_EQ(outs.size(), 1u);
      EXPECT_EQ(outs.at(7).prompt_token_ids, refs[i].prompt_ids);
      expect_reference(refs[i], outs.at(7),
                       std::string(deterministic ? "deterministic" : "fast") + " case " + std::to_string(i));
    }
}

// Greedy ids from the device sampler (no logits captured) are the reference's.
TEST_F(CudaRunnerGpu, DeviceGreedySamplingGivesTheReferenceIds) {
  const auto refs = testing_support::load_stories_reference();
  EngineInstance e = make(2048, false, false);
  for (std::size_t i = 0; i < refs.size(); ++i)
    ASSERT_TRUE(e.engine->add_request(i, e.tokenizer->encode(refs[i].prompt, true), greedy()).ok());
  auto outs = run_all(*e.engine);
  ASSERT_EQ(outs.size(), refs.size());
  for (std::size_t i = 0; i < refs.size(); ++i) {
    EXPECT_EQ(outs.at(i).token_ids, refs[i].generated_ids) << "case " << i;
    EXPECT_TRUE(outs.at(i).logits.empty());
  }
}

// Deterministic mode: the three reference requests inside a batch of 64 at
// token budgets 7, 64 and 2048 (prefill chunked differently; decode through
// graphs of other batch sizes) have logits bit-identical to running alone.
TEST_F(CudaRunnerGpu, DeterministicModeIsBitIdenticalAloneAndBatched) {
  const auto refs = testing_support::load_stories_reference();
  std::vector<RequestOutput> alone;
  for (const auto& r : refs) {
    EngineInstance e = make(2048, true, true);
    ASSERT_TRUE(e.engine->add_request(7, e.tokenizer->encode(r.prompt, true), greedy()).ok());
    alone.push_back(run_all(*e.engine).at(7));
  }
  for (int budget : {64, 7, 2048}) {
    EngineInstance e = make(budget, true, true);
    for (std::size_t i = 0; i < refs.size(); ++i)
      ASSERT_TRUE(e.engine->add_request(i, e.tokenizer->encode(refs[i].prompt, true), greedy()).ok());
    add_fillers(*e.engine, *e.tokenizer, 100, 61);
    auto outs = run_all(*e.engine);
    ASSERT_EQ(outs.size(), 64u) << "budget " << budget;
    for (std::size_t i = 0; i < refs.size(); ++i) {
      const std::string where = "budget " + std::to_string(budget) + " case " + std::to_string(i);
      expect_reference(refs[i], outs.at(i), where);
      EXPECT_TRUE(bit_identical(outs.at(i), alone[i])) << where << ": logits differ from alone";
    }
  }
}

// Graph replay and eager decode compute the same logits (deterministic mode).
TEST_F(CudaRunnerGpu, GraphAndEagerDecodeAgreeBitForBit) {
  const auto refs = testing_support::load_stories_reference();
  EngineInstance graphs = make(2048, true, true, DType::f32, true);
  auto* runner = graphs.executor_as<model::CudaModelRunner>();
  EXPECT_EQ(runner->graph_capture_error(), "");
  EXPECT_FALSE(runner->captured_batch_sizes().empty());
  EngineInstance eager = make(2048, true, true, DType::f32, false);
  auto* eager_runner = eager.executor_as<model::CudaModelRunner>();
  EXPECT_TRUE(eager_runner->captured_batch_sizes().empty());
  for (EngineInstance* e : {&graphs, &eager}) {
    for (std::size_t i = 0; i < refs.size(); ++i)
      ASSERT_TRUE(e->engine->add_request(i, e->tokenizer->encode(refs[i].prompt, true), greedy()).ok());
    add_fillers(*e->engine, *e->tokenizer, 100, 5);
  }
  int graph_steps = 0;
  graphs.engine->set_step_callback([&](const StepStats&) { graph_steps += runner->last_step_stats().used_graph; });
  const auto a = run_all(*graphs.engine);
  const auto b = run_all(*eager.engine);
  EXPECT_GT(graph_steps, 0) << "decode steps should replay graphs";
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [id, out] : a) EXPECT_TRUE(bit_identical(out, b.at(id))) << "request " << id;
}

// The device sampler draws exactly what sampling::sample draws from the same
// logits: penalties, min_tokens, top-k / top-p / min-p, seeded.
TEST_F(CudaRunnerGpu, DeviceSamplingMatchesHostSamplingOnTheSameLogits) {
  std::vector<sampling::SamplingParams> params = testing_support::mixed_sampling_params(16, 30);
  const char* prompts[] = {"Once upon a time", "The little girl", "Tom had a", "In the park"};
  std::map<std::uint64_t, RequestOutput> outs[2];
  for (int host = 0; host < 2; ++host) {
    EngineInstance e = make(256, true, host == 1);  // capture_logits: sample on the host
    for (std::size_t i = 0; i < params.size(); ++i)
      ASSERT_TRUE(e.engine->add_request(i, e.tokenizer->encode(prompts[i % 4], true), params[i]).ok());
    outs[host] = run_all(*e.engine);
  }
  ASSERT_EQ(outs[0].size(), params.size());
  for (const auto& [id, out] : outs[1]) {
    EXPECT_EQ(outs[0].at(id).token_ids, out.token_ids) << "request " << id;
    EXPECT_EQ(outs[0].at(id).finish_reason, out.finish_reason) << "request " << id;
  }
}

// BF16 weights (tensor cores) stay close to the FP32 reference: the top-1 of
// the first steps is the reference's (later steps may drift on near-ties).
TEST_F(CudaRunnerGpu, Bf16AndF16WeightsStayCloseToTheReference) {
  const auto refs = testing_support::load_stories_reference();
  for (DType dtype : {DType::bf16, DType::f16}) {
    EngineInstance e = make(2048, false, true, dtype);
    ASSERT_TRUE(e.engine->add_request(1, e.tokenizer->encode(refs[0].prompt, true), greedy()).ok());
    const RequestOutput out = run_all(*e.engine).at(1);
    ASSERT_EQ(out.logits.size(), static_cast<std::size_t>(kMaxTokens));
    for (int s = 0; s < 4; ++s) EXPECT_EQ(out.token_ids[s], refs[0].generated_ids[s]) << dtype_name(dtype) << " step " << s;
    const float ref_top = refs[0].top5[0][0].second;
    EXPECT_NEAR(out.logits[0][refs[0].top5[0][0].first], ref_top, 0.05f * std::max(1.0f, std::fabs(ref_top)))
        << dtype_name(dtype);
  }
}

// A step with an id outside the vocabulary is refused before anything runs;
// the runner then runs a good step as if nothing happened.
TEST_F(CudaRunnerGpu, BadStepIsRefusedAndTheRunnerGoesOn) {
  EngineInstance e = make(2048, true, false);
  ModelExecutor& x = *e.executor;
  StepInput in = testing_support::three_token_step(x.block_size());
  in.token_ids[1] = 9999;
  auto bad = x.execute(in);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(bad.error().message.find("9999"), std::string::npos) << bad.error().message;
  in.token_ids = {1, 400, 3};
  auto good = x.execute(in);
  ASSERT_TRUE(good.ok()) << good.error().to_string();
  EXPECT_EQ(good->logits.size(), static_cast<std::size_t>(x.vocab_size()));
  // More rows than the runner holds (max(max_num_batched_tokens 16,
  // max_num_seqs 64) = 64) is refused with the numbers.
  EngineInstance small = make(16, true, false);
  constexpr int kRows = 65;
  StepInput big = in;
  big.seqs[0].num_new_tokens = kRows;
  big.seqs[0].block_table = {0, 1, 2, 3, 4};
  big.token_ids.assign(kRows, 1);
  big.positions.resize(kRows);
  big.slot_mapping.resize(kRows);
  for (int t = 0; t < kRows; ++t)
    big.positions[static_cast<std::size_t>(t)] = big.slot_mapping[static_cast<std::size_t>(t)] = t;
  big.logits_rows = {kRows - 1};
  auto refused = small.executor->execute(big);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("max_num_batched_tokens"), std::string::npos) << refused.error().message;
}

// A model that cannot fit in --gpu-memory-utilization is refused before its
// weights are loaded, with the sizes in GiB.
TEST_F(CudaRunnerGpu, ModelThatDoesNotFitIsRefusedWithSizes) {
  EngineOptions o;
  o.model_dir = std::string(SHARDLINE_SOURCE_DIR) + "/bench/shapes/llama-3.1-8b";
  if (!std::filesystem::exists(o.model_dir + "/config.json")) o.model_dir = std::string(SHARDLINE_SHARED_DIR) + "/models/shapes/llama-3.1-8b";
  o.load_format = model::LoadFormat::dummy;
  o.device = model::DeviceKind::cuda;
  o.dtype = DType::bf16;
  o.gpu_memory_utilization = 0.05;
  auto e = build_engine(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.error().code, ErrorCode::out_of_memory);
  EXPECT_NE(e.error().message.find("GiB"), std::string::npos) << e.error().message;
}

// DéjàVu on the GPU (issue 41 item 7; written before any GPU ran it): every
// step's KV increment streams out of the device cache through
// model::CudaKvCopier; each request resumed in a fresh engine from the KV of
// its first r positions computes only the positions after r and gives the
// undisturbed run's ids; swap preemption on a cache of 16 blocks gives the
// unpreempted run's ids and logits bit for bit (deterministic mode).
TEST_F(CudaRunnerGpu, StreamedKvResumesAndSwapsOnTheDevice) {
  const auto refs = testing_support::load_stories_reference();
  struct Sink final : KvStreamSink {
    std::map<std::uint64_t, std::unique_ptr<testing_support::HostTier>> tiers;
    bool accepting() const override { return true; }
    void push(KvIncrement inc) override { tiers.at(inc.request_id)->merge(inc.range, inc.chunk); }
  };
  Sink sink;
  std::map<std::uint64_t, RequestOutput> ref;
  std::vector<std::vector<std::int32_t>> prompts;
  {
    EngineInstance e = make(256, true, true);
    ASSERT_TRUE(e.engine->kv_io().can_move_kv());
    e.engine->set_kv_sink(&sink);
    for (std::uint64_t id = 0; id < refs.size(); ++id) {
      prompts.push_back(e.tokenizer->encode(refs[id].prompt, true));
      sink.tiers[id] = std::make_unique<testing_support::HostTier>(e.executor->kv_model_shape());
      ASSERT_TRUE(e.engine->add_request(id, prompts[id], greedy()).ok());
    }
    ref = run_all(*e.engine);
  }
  constexpr int kCut = 10;
  EngineInstance resumed = make(256, true, true);
  std::uint64_t restored = 0;
  for (std::uint64_t id = 0; id < refs.size(); ++id) {
    const int r = static_cast<int>(prompts[id].size()) + kCut - 1;
    ASSERT_GE(sink.tiers[id]->covered, r) << "request " << id << ": its KV was not streamed";
    ResumeState rs;
    rs.output_ids.assign(ref.at(id).token_ids.begin(), ref.at(id).token_ids.begin() + kCut);
    rs.num_kv_tokens = r;
    rs.kv_chunk = sink.tiers[id]->prefix(r);
    restored += static_cast<std::uint64_t>(r);
    ASSERT_TRUE(resumed.engine->add_request(id, prompts[id], greedy(), std::move(rs)).ok());
  }
  const auto got = run_all(*resumed.engine);
  for (const auto& [id, want] : ref) EXPECT_EQ(got.at(id).token_ids, want.token_ids) << "request " << id;
  EXPECT_EQ(resumed.engine->kv_io().stats().restored_tokens, restored);

  // Swap: 12 requests on 16 blocks of 16 tokens (stories260K: 1280 B per token).
  auto swap_run = [&](std::uint64_t kv_bytes, int* preemptions, KvIoStats* io) {
    EngineOptions o;
    o.model_dir = kStoriesDir;
    o.device = model::DeviceKind::cuda;
    o.kv_cache_dtype = DType::f32;
    o.gpu_memory_utilization = 0.5;
    o.kv_cache_bytes = kv_bytes;
    o.max_num_seqs = 64;
    o.max_num_batched_tokens = 256;
    o.max_model_len = 128;
    o.deterministic = true;
    o.capture_logits = true;
    o.preemption_mode = PreemptionMode::swap;
    auto e = build_engine(o);
    EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().to_string());
    for (std::uint64_t id = 0; id < 12; ++id)
      EXPECT_TRUE(e->engine->add_request(id, prompts[id % prompts.size()], greedy()).ok());
    auto out = run_all(*e->engine);
    *preemptions = e->engine->scheduler().total_preemptions();
    *io = e->engine->kv_io().stats();
    return out;
  };
  int none = 0, some = 0;
  KvIoStats io_none, io_some;
  const auto plenty = swap_run(8u << 20, &none, &io_none);
  const auto tight = swap_run(16ull * 16 * 1280, &some, &io_some);
  EXPECT_EQ(none, 0);
  ASSERT_GT(some, 0) << "16 blocks must be oversubscribed";
  EXPECT_EQ(io_some.swap_outs, static_cast<std::uint64_t>(some));
  EXPECT_EQ(io_some.swap_ins, io_some.swap_outs);
  for (const auto& [id, want] : plenty) EXPECT_TRUE(bit_identical(tight.at(id), want)) << "request " << id;
}

}  // namespace
}  // namespace shardline::engine
