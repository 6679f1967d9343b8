// SiDP weight sharing (seed 002) through the whole engine, in-process: dp
// engines whose FFN weights live on one owner per layer give the reference
// greedy ids and logits bit-identical (memcmp) to one device, in WaS, in CaS
// and when the mode switches back and forth mid-generation:
//  - stories260K (5 layers) at dp = 2 and 4, token budgets 7 (chunked
//    prefill) and 256;
//  - a dummy Qwen3 shape (qwen3-0.6b, 5 layers) at dp = 2 and 4.
//  - SmolLM2-135M's Q4_1 file (4 layers), its FFN kept quantized: WaS
//    fetches the blocks.
// Also: CaS dummy skipping, byte-exact (a rank with no work sends nothing
// but the step control and the outputs of the layers it owns).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/data_parallel.hpp"
#include "engine/group/engine_builder.hpp"
#include "engine/sidp/sidp_group.hpp"
#include "model/sidp/layer_owner.hpp"
#include "model/weights.hpp"
#include "tests/support/sidp_golden.hpp"
#include "tests/support/dummy_qwen3.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline::engine {
namespace engine_sidp_group_golden_test {

using model::sidp::SidpMode;
using testing_support::kStoriesDir;

EngineOptions stories_options(int max_num_batched_tokens) {
  EngineOptions o;
  o.model_dir = kStoriesDir;
  o.block_size = 16;
  o.kv_cache_bytes = 8u << 20;
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = max_num_batched_tokens;
  o.capture_logits = true;
  o.check_integrity = true;
  o.num_threads = 1;
  return o;
}

/// The dummy Qwen3 weights, generated once for every run of the test (the
/// 151936 x 1024 embedding dominates the time of a run).
std::shared_ptr<const model::ModelWeights> qwen3_weights() {
  static std::shared_ptr<const model::ModelWeights> w = [] {
    model::LoadOptions lo;
    lo.format = model::LoadFormat::dummy;
    lo.num_layers_override = 5;
    auto loaded = model::load_model(std::string(SHARDLINE_SHARED_DIR) + "/models/shapes/qwen3-0.6b", lo);
    EXPECT_TRUE(loaded.ok()) << loaded.error().to_string();
    return loaded.ok() ? std::make_shared<const model::ModelWeights>(std::move(loaded).value()) : nullptr;
  }();
  return w;
}

EngineOptions qwen3_options() {
  EngineOptions o = testing_support::dummy_qwen3_options();
  o.weights = qwen3_weights();
  return o;
}

using testing_support::expect_bit_identical;
using testing_support::run_single;
using testing_support::scripted_switches;
using Drive = testing_support::SidpDrive;
using testing_support::drive_name;

struct SidpRun {
  std::vector<RequestOutput> outputs;
  std::vector<model::sidp::SidpFfnStats> stats;  // [dp]
};

Result<SidpRun> run_sidp(const EngineOptions& o, int dp, Drive drive,
                         const std::vector<std::vector<std::int32_t>>& prompts, const sampling::SamplingParams& params) {
  SidpOptions so;
  so.dp = dp;
  so.initial_mode = drive == Drive::cas ? SidpMode::cas : SidpMode::was;
  auto group = SidpGroup::create(o, so);
  if (!group.ok()) return std::move(group).error();
  SidpGroup& g = **group;
  std::atomic<int> rank0_steps{0};
  SidpStepObserver observer;
  if (drive == Drive::switching) observer = scripted_switches(g, rank0_steps);
  auto out = generate_sidp(g, prompts, params, 1, observer);
  if (!out.ok()) return std::move(out).error();
  SidpRun run;
  run.outputs = std::move(out).value();
  for (int r = 0; r < dp; ++r) run.stats.push_back(g.ffn(r).stats());
  return run;
}

void expect_modes_ran(const SidpRun& run, Drive drive, const std::string& what) {
  testing_support::expect_modes_ran(run.stats, drive, what);
}

TEST(SidpGolden, Stories260KWasCasAndSwitchingAreBitIdenticalToOneDevice) {
  const auto cases = testing_support::load_stories_reference();
  const std::vector<std::vector<std::int32_t>> prompts = testing_support::stories_prompt_ids();
  sampling::SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 48;
  for (int budget : {7, 256}) {
    auto single = run_single(stories_options(budget), prompts, greedy);
    ASSERT_TRUE(single.ok()) << single.error().to_string();
    for (std::size_t i = 0; i < cases.size(); ++i) ASSERT_EQ(single->at(i).token_ids, cases[i].generated_ids);
    for (int dp : {2, 4})
      for (Drive drive : {Drive::was, Drive::cas, Drive::switching}) {
        const std::string what = "dp=" + std::to_string(dp) + " " + drive_name(drive) + " budget " +
                                 std::to_string(budget);
        SCOPED_TRACE(what);
        auto got = run_sidp(stories_options(budget), dp, drive, prompts, greedy);
        ASSERT_TRUE(got.ok()) << got.error().to_string();
        for (std::size_t i = 0; i < cases.size(); ++i)
          EXPECT_EQ(got->outputs[i].token_ids, cases[i].generated_ids) << "reference ids, case " << i;
        expect_bit_identical(got->outputs, *single, what);
        expect_modes_ran(*got, drive, what);
      }
  }
}

TEST(SidpGolden, DummyQwen3WasCasAndSwitchingAreBitIdenticalToOneDevice) {
  const std::vector<std::vector<std::int32_t>> prompts = {
      {151643, 785, 3974, 13876, 38835, 34208, 916, 279, 15678, 5562, 13, 576},
      {9707, 11, 1879},
      {40, 1079, 264, 2083, 1614, 323, 358, 1366, 311, 1492, 498, 449, 2146, 2797, 4755, 30, 21927},
      {785, 3974, 13876}};
  sampling::SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 8;
  greedy.ignore_eos = true;
  const auto t0 = std::chrono::steady_clock::now();
  auto single = run_single(qwen3_options(), prompts, greedy);
  std::printf("  single %.1f s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  ASSERT_TRUE(single.ok()) << single.error().to_string();
  // dp=4 replicates the 600 MB (F32) lm_head four times: one run, switching.
  for (const auto& [dp, drive] : {std::pair{2, Drive::was}, std::pair{2, Drive::cas}, std::pair{4, Drive::switching}}) {
      const std::string what = "qwen3 dp=" + std::to_string(dp) + " " + drive_name(drive);
      const auto t0 = std::chrono::steady_clock::now();
      auto got = run_sidp(qwen3_options(), dp, drive, prompts, greedy);
      ASSERT_TRUE(got.ok()) << got.error().to_string();
      std::printf("  %-22s %.1f s\n", what.c_str(),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      expect_bit_identical(got->outputs, *single, what);
      expect_modes_ran(*got, drive, what);
    }
}

// Dummy skipping (§4.3): rank 2 of 3 has no request at all, so every CaS step
// is a dummy step for it. It never packs or sends rows for the layers others
// own; what it sends is exactly the step control (2 peers x 4 floats per
// step) plus the outputs of the layers it owns, for the peers' rows. The
// owners skip it: (layer, rank 2) pairs are counted as skipped.
TEST(SidpGolden, CasDummyRankMovesNoActivationData) {
  const auto cases = testing_support::load_stories_reference();
  std::vector<std::vector<std::int32_t>> prompts = {cases[0].prompt_ids, cases[1].prompt_ids};
  sampling::SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 16;
  auto single = run_single(stories_options(64), prompts, greedy);
  ASSERT_TRUE(single.ok());
  SidpOptions so;
  so.dp = 3;
  so.initial_mode = SidpMode::cas;
  auto group = SidpGroup::create(stories_options(64), so);
  ASSERT_TRUE(group.ok()) << group.error().to_string();
  SidpGroup& g = **group;
  auto out = generate_sidp(g, prompts, greedy, 1);
  ASSERT_TRUE(out.ok()) << out.error().to_string();
  expect_bit_identical(*out, *single, "dp=3 cas with a dummy rank");

  const auto st2 = g.ffn(2).stats();
  EXPECT_EQ(st2.cas_steps, 0u);
  EXPECT_GT(st2.dummy_steps, 5u);
  EXPECT_EQ(st2.cas_rows_sent, 0u) << "the dummy rank sent activation rows";
  const int hidden = g.instance(0).weights->config.hidden_size;
  // Rank 2 owns layer 2 of 5 (balanced plan), so its fused rows are all peers'.
  ASSERT_EQ(g.owner(2).owned_layers(), std::vector<int>({2}));
  const std::uint64_t control_bytes = st2.dummy_steps * 2 * 4 * sizeof(float);
  const std::uint64_t served_bytes = st2.cas_fused_rows * hidden * sizeof(float);
  EXPECT_EQ(g.compute_comm(2).bytes_sent(), control_bytes + served_bytes);
  const auto st0 = g.ffn(0).stats();
  EXPECT_GT(st0.cas_peer_skips, 0u) << "owner 0 never skipped the dummy rank";
  EXPECT_EQ(g.ffn(2).stats().cache.fetches, 0u);
}

// A long-tailed job under --sidp-mode auto: 14 short requests (16..120
// tokens) and 2 long ones (400, 480) over dp = 2. The orchestrator's policy
// (b* = 4 running sequences in the group, no dwell) sees the group's
// batch fall as the short ones finish and switches the group to CaS for the
// tail; the output is bit-identical to one device's.
TEST(SidpGolden, AutoSwitchesToCasInTheTailAndKeepsTheOutput) {
  const auto cases = testing_support::load_stories_reference();
  std::vector<std::vector<std::int32_t>> prompts;
  std::vector<sampling::SamplingParams> params;
  for (int i = 0; i < 16; ++i) {
    prompts.push_back(cases[static_cast<std::size_t>(i) % cases.size()].prompt_ids);
    sampling::SamplingParams p;
    p.temperature = 0.0f;
    p.ignore_eos = true;
    p.max_tokens = i < 14 ? 16 + 8 * i : (i == 14 ? 400 : 480);
    params.push_back(p);
  }
  EngineOptions o = stories_options(256);
  auto single = build_engine(o);
  ASSERT_TRUE(single.ok());
  for (std::size_t i = 0; i < prompts.size(); ++i) ASSERT_TRUE(single->engine->add_request(i, prompts[i], params[i]).ok());
  std::vector<RequestOutput> ref(prompts.size());
  while (single->engine->has_unfinished()) {
    auto step = single->engine->step();
    ASSERT_TRUE(step.ok());
    for (auto& out : *step) ref[out.request_id] = std::move(out);
  }

  SidpOptions so;
  so.dp = 2;
  auto group = SidpGroup::create(o, so);
  ASSERT_TRUE(group.ok()) << group.error().to_string();
  SidpModePolicyOptions po;
  po.switch_batch = 4;
  po.min_dwell_s = 0;  // no wall-clock dwell: the test must not depend on how fast the machine is
  po.num_ranks = 2;
  auto policy = SidpModePolicy::create(po);
  ASSERT_TRUE(policy.ok());
  SidpAutoSwitcher switcher(**group, std::move(policy).value());
  auto got = generate_sidp(**group, prompts, params, 1, switcher.observer());
  ASSERT_TRUE(got.ok()) << got.error().to_string();
  expect_bit_identical(*got, ref, "auto, long tail");
  const auto sw = switcher.switches();
  ASSERT_FALSE(sw.empty()) << "the group never switched to CaS in its tail";
  EXPECT_EQ(sw.front().to, SidpMode::cas);
  EXPECT_LT(sw.front().group_batch, 4);
  std::uint64_t cas_work = 0;
  for (int r = 0; r < 2; ++r) {
    const auto st = (*group)->ffn(r).stats();
    EXPECT_GE(st.switches_to_cas, 1u) << "rank " << r;
    EXPECT_GT(st.was_steps, 0u) << "rank " << r << ": the bulk of the job must run in WaS";
    cas_work += st.cas_steps + st.dummy_steps;
  }
  EXPECT_GT(cas_work, 0u);
}

// Link emulation (comm/paced.hpp) slows transfers, never changes them.
TEST(SidpGolden, LinkEmulationKeepsOutputsBitIdentical) {
  const auto cases = testing_support::load_stories_reference();
  const std::vector<std::vector<std::int32_t>> prompts = testing_support::stories_prompt_ids();
  sampling::SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 24;
  auto single = run_single(stories_options(64), prompts, greedy);
  ASSERT_TRUE(single.ok());
  for (SidpMode mode : {SidpMode::was, SidpMode::cas}) {
    SidpOptions so;
    so.dp = 2;
    so.initial_mode = mode;
    so.link = comm::LinkSpec{2.0, 5.0};
    auto group = SidpGroup::create(stories_options(64), so);
    ASSERT_TRUE(group.ok()) << group.error().to_string();
    auto got = generate_sidp(**group, prompts, greedy, 1);
    ASSERT_TRUE(got.ok()) << got.error().to_string();
    expect_bit_identical(*got, *single, std::string("paced ") + model::sidp::mode_name(mode));
    ASSERT_NE((*group)->link(), nullptr);
  }
}

// The same group over TCP sockets (comm/tcp.hpp) instead of in-process
// communicators: weight regions and activation rows cross real sockets.
// (The ranks are threads of this process; TCP groups between processes are
// not wired yet.)
TEST(SidpGolden, OverTcpSocketsWasCasAndSwitchingAreBitIdentical) {
  const auto cases = testing_support::load_stories_reference();
  const std::vector<std::vector<std::int32_t>> prompts = testing_support::stories_prompt_ids();
  sampling::SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 48;
  auto single = run_single(stories_options(7), prompts, greedy);
  ASSERT_TRUE(single.ok());
  for (const auto& [dp, drive] : {std::pair{2, Drive::was}, std::pair{2, Drive::cas}, std::pair{3, Drive::switching}}) {
    const std::string what = std::string("tcp dp=") + std::to_string(dp) + " " + drive_name(drive);
    SidpOptions so;
    so.dp = dp;
    so.tcp = true;
    so.initial_mode = drive == Drive::cas ? SidpMode::cas : SidpMode::was;
    auto group = SidpGroup::create(stories_options(7), so);
    ASSERT_TRUE(group.ok()) << what << ": " << group.error().to_string();
    SidpGroup& g = **group;
    std::atomic<int> steps{0};
    SidpStepObserver observer;
    if (drive == Drive::switching) observer = scripted_switches(g, steps);
    auto got = generate_sidp(g, prompts, greedy, 1, observer);
    ASSERT_TRUE(got.ok()) << what << ": " << got.error().to_string();
    for (std::size_t i = 0; i < cases.size(); ++i)
      EXPECT_EQ(got->at(i).token_ids, cases[i].generated_ids) << what << " case " << i;
    expect_bit_identical(*got, *single, what);
    std::uint64_t wire = 0;
    for (int r = 0; r < dp; ++r) wire += g.weights_comm(r).bytes_sent() + g.compute_comm(r).bytes_sent();
    EXPECT_GT(wire, 0u) << what << ": nothing crossed the sockets";
  }
}

// WaS on a quantized file (issue 40, step 3): the owners keep SmolLM2's
// Q4_1 FFN blocks quantized, WaS fetches them as blocks (the kernels' packed
// Q4_1, 0.75 bytes a weight, against 2 for the same layer in BF16), and
// WaS, CaS and switching are bit-identical to one device on the same
// weights. Layer 1's FFN is dense BF16 here, so the layers' regions differ
// in size and the WaS slots hold the largest (a Q4_K_M file's Q6_K
// ffn_down layers do the same).
TEST(SidpGolden, QuantizedFfnCrossesAsItsBlocksAndMatchesOneDevice) {
  const std::string smol = std::string(SHARDLINE_SOURCE_DIR) + "/models/smollm2-135m-instruct";
  model::LoadOptions lo;
  lo.dtype = DType::bf16;
  lo.keep_quantized = true;
  lo.num_layers_override = 4;
  auto loaded = model::load_model(smol, lo);
  ASSERT_TRUE(loaded.ok()) << loaded.error().to_string();
  auto quant = std::make_shared<model::ModelWeights>(std::move(loaded).value());
  ASSERT_EQ(quant->layers[0].gate_up.format_name(), "Q4_1");
  auto dense = model::dequantized_weights(quant);
  ASSERT_TRUE(dense.ok()) << dense.error().to_string();
  auto mix = std::make_shared<model::ModelWeights>(*quant);
  mix->storage.insert(mix->storage.end(), (*dense)->storage.begin(), (*dense)->storage.end());
  mix->layers[1].gate_up = (*dense)->layers[1].gate_up;
  mix->layers[1].down_proj = (*dense)->layers[1].down_proj;

  EngineOptions o;
  o.model_dir = smol;
  o.weights = mix;
  o.dtype = DType::bf16;
  o.keep_quantized = true;
  o.block_size = 16;
  o.kv_cache_bytes = 8u << 20;
  o.max_num_seqs = 8;
  o.max_num_batched_tokens = 64;
  o.max_model_len = 128;
  o.capture_logits = true;
  o.num_threads = 1;
  const std::vector<std::vector<std::int32_t>> prompts = {
      {1, 504, 3458, 282, 4649, 314}, {1, 9690, 28, 940}, {1, 378, 4479, 30, 1010, 2165, 288, 253, 1834}};
  sampling::SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 20;  // the scripted switches come at rank 0's steps 3, 8 and 14
  greedy.ignore_eos = true;
  auto single = run_single(o, prompts, greedy);
  ASSERT_TRUE(single.ok()) << single.error().to_string();

  for (Drive drive : {Drive::was, Drive::cas, Drive::switching}) {
    const std::string what = std::string("SmolLM2 Q4_1 dp=2 ") + drive_name(drive);
    SCOPED_TRACE(what);
    SidpOptions so;
    so.dp = 2;
    so.initial_mode = drive == Drive::cas ? SidpMode::cas : SidpMode::was;
    auto group = SidpGroup::create(o, so);
    ASSERT_TRUE(group.ok()) << group.error().to_string();
    SidpGroup& g = **group;
    const model::sidp::LayerOwner& owner = g.owner(0);
    EXPECT_EQ(owner.format_name(), "Q4_1+BF16");
    // Layer 0: gate_up [3072, 576] and down [576, 1536] as packed Q4_1
    // blocks; layer 1 as packed BF16.
    const model::sidp::FfnLayout& q4 = owner.layout(0);
    const model::sidp::FfnLayout& bf16 = owner.layout(1);
    ASSERT_EQ(q4.gate_up_parts.size(), 1u);
    EXPECT_EQ(q4.gate_up_parts[0].part.quant, kernels::GgmlType::q4_1);
    EXPECT_FALSE(bf16.gate_up_parts[0].part.quant.has_value());
    const std::size_t weights = 3u * 576 * 1536;
    // Packed Q4_1: 16 bytes of nibbles and F32 d and m per 32 weights, 0.75
    // bytes a weight (the file's 0.625, with F16 scales); BF16: 2.
    EXPECT_EQ(q4.bytes, weights * 3 / 4);
    EXPECT_EQ(bf16.bytes, weights * 2);
    std::atomic<int> steps{0};
    SidpStepObserver observer;
    if (drive == Drive::switching) observer = scripted_switches(g, steps);
    auto got = generate_sidp(g, prompts, greedy, 1, observer);
    ASSERT_TRUE(got.ok()) << got.error().to_string();
    expect_bit_identical(*got, *single, what);
    std::vector<model::sidp::SidpFfnStats> stats;
    for (int r = 0; r < 2; ++r) stats.push_back(g.ffn(r).stats());
    testing_support::expect_modes_ran(stats, drive, what);
    if (drive == Drive::was) {
      // The owner of the BF16 layer fetches Q4_1 regions only; the other
      // rank's slots are sized for the BF16 one, the largest it fetches.
      const std::vector<int> own0 = g.owner(0).owned_layers();
      const int keeper = std::find(own0.begin(), own0.end(), 1) != own0.end() ? 0 : 1;
      const auto c = stats[static_cast<std::size_t>(keeper)].cache;
      ASSERT_GT(c.fetches, 0u);
      EXPECT_EQ(c.fetched_bytes, c.fetches * q4.bytes) << "rank " << keeper << " moved other than Q4_1 regions";
      const int fetcher = 1 - keeper;
      auto& f = g.ffn(fetcher);
      EXPECT_EQ(f.ffn_weight_bytes() - g.owner(fetcher).weight_bytes(),
                static_cast<std::size_t>(f.cache_slots()) * bf16.bytes);
    }
  }
}

}  // namespace
}  // namespace shardline::engine
