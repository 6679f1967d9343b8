// Golden: the CPU forward pass of stories260K against reference_greedy.json
// (numpy float32 reference, identical ids to llama2.c run.c). Drives the
// runner directly with hand-built steps, so it pins the model math
// independently of the scheduler; engine-level golden tests are in
// tests/engine/.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <cmath>
#include <memory>
#include <numeric>
#include <vector>

#include "model/cpu_runner.hpp"
#include "model/weights.hpp"
#include "tests/support/runner_driver.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline::model {
namespace model_cpu_runner_golden_test {

using testing_support::expect_top5;
using testing_support::kStoriesDir;
using RefCase = testing_support::StoriesCase;

std::vector<RefCase> load_reference() { return testing_support::load_stories_reference(); }

constexpr int kBlockSize = 4;  // small, so sequences cross many block boundaries

using Driver = testing_support::RunnerDriver;
using testing_support::argmax_of;

std::unique_ptr<CpuModelRunner> make_runner(DType dtype, int num_blocks = 256,
                                            CpuRunnerOptions options = CpuRunnerOptions{}) {
  LoadOptions opts;
  opts.dtype = dtype;
  auto w = load_model(kStoriesDir, opts);
  EXPECT_TRUE(w.ok()) << (w.ok() ? "" : w.error().to_string());
  if (!w.ok()) return nullptr;
  auto shared = std::make_shared<const ModelWeights>(std::move(w).value());
  options.num_kv_blocks = num_blocks;
  options.block_size = kBlockSize;
  auto r = CpuModelRunner::create(shared, options);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().to_string());
  return r.ok() ? std::move(r).value() : nullptr;
}

// Greedy decoding from a whole-prompt prefill reproduces the reference ids and
// top-5 logits within 1e-4 at every one of the 48 steps.
TEST(CpuRunnerGolden, Stories260kGreedyAndTop5Logits) {
  const auto cases = load_reference();
  ASSERT_EQ(cases.size(), 3u);
  auto runner = make_runner(DType::f32);
  ASSERT_TRUE(runner);
  Driver d(*runner, kBlockSize);
  for (std::size_t ci = 0; ci < cases.size(); ++ci) {
    const RefCase& c = cases[ci];
    const int seq = d.add_seq(static_cast<int>(ci) * 20, 20);
    auto rows = d.step({{seq, c.prompt_ids, true}});
    ASSERT_EQ(rows.size(), 1u);
    for (std::size_t step = 0; step < c.generated_ids.size(); ++step) {
      const std::string where = "case " + std::to_string(ci) + " step " + std::to_string(step);
      expect_top5(rows[0], c.top5[step], where);
      const int next = argmax_of(rows[0]);
      ASSERT_EQ(next, c.generated_ids[step]) << where;
      if (step + 1 < c.generated_ids.size()) rows = d.step({{seq, {next}, true}});
    }
  }
}

// BF16 weights compute in BF16 (activations rounded to BF16 at each linear
// layer, VDPBF16PS dot products; kernels/cpu/linear.hpp): with the reference
// ids fed back at every step (teacher forcing), the greedy id matches the
// reference at all 48 steps of each case, and the reference's top-5 logits
// stay within kBf16Top5Bound of the F32 reference.
//
// The bound is measured, not chosen. Builds with AVX512-BF16, with AVX-512F
// only, and with AVX2 give the same bits (every kernel keeps one order on
// each; the three were built and run here, 2026-11-28), so there the largest
// deviation is one number: 0.073449 (printed below); the bound is that
// rounded up to two significant digits. The portable scalar build (no AVX)
// gives 0.072003: its linear layers have the same bits, its attention and
// exp keep an order of their own. The logits of stories260K span about
// -15..+15.
constexpr double kBf16Top5Bound = 0.074;

TEST(CpuRunnerGolden, Stories260kBf16ComputeGreedyIdsAndTop5WithinMeasuredBound) {
  const auto cases = load_reference();
  auto runner = make_runner(DType::bf16);
  ASSERT_TRUE(runner);
  Driver d(*runner, kBlockSize);
  double max_dev = 0.0;
  int mismatched_ids = 0;
  for (std::size_t ci = 0; ci < cases.size(); ++ci) {
    const RefCase& c = cases[ci];
    const int seq = d.add_seq(static_cast<int>(ci) * 20, 20);
    auto rows = d.step({{seq, c.prompt_ids, true}});
    for (std::size_t step = 0; step < c.generated_ids.size(); ++step) {
      ASSERT_EQ(rows.size(), 1u);
      for (const auto& [id, logit] : c.top5[step])
        max_dev = std::max(max_dev, std::fabs(static_cast<double>(rows[0][id]) - logit));
      if (argmax_of(rows[0]) != c.generated_ids[step]) ++mismatched_ids;
      EXPECT_EQ(argmax_of(rows[0]), c.generated_ids[step]) << "case " << ci << " step " << step;
      if (step + 1 < c.generated_ids.size()) rows = d.step({{seq, {c.generated_ids[step]}, true}});
    }
  }
  std::printf("BF16 compute: max |top-5 logit - F32 reference| = %.6f over 3 x 48 steps, %d ids differ\n",
              max_dev, mismatched_ids);
  EXPECT_LE(max_dev, kBf16Top5Bound);
}

// Batch and chunk invariance of the forward pass: the logits of each step are
// bit-identical whether a sequence runs alone with its prompt in one chunk, or
// batched with the other two, its prompt fed one token at a time.
TEST(CpuRunnerGolden, LogitsBitIdenticalAloneVsBatchedAndChunked) {
  const auto cases = load_reference();
  constexpr int kSteps = 12;
  // Alone, whole-prompt prefill.
  std::vector<std::vector<std::vector<float>>> alone(cases.size());
  {
    auto runner = make_runner(DType::f32);
    ASSERT_TRUE(runner);
    Driver d(*runner, kBlockSize);
    for (std::size_t ci = 0; ci < cases.size(); ++ci) {
      const int seq = d.add_seq(static_cast<int>(ci) * 20, 20);
      auto rows = d.step({{seq, cases[ci].prompt_ids, true}});
      alone[ci].push_back(rows[0]);
      for (int s = 0; s + 1 < kSteps; ++s) {
        rows = d.step({{seq, {cases[ci].generated_ids[s]}, true}});
        alone[ci].push_back(rows[0]);
      }
    }
  }
  // Batched: prompts fed one token per step (no logits until the last one),
  // then decode all together. Blocks are allocated in a different place.
  auto runner = make_runner(DType::f32);
  ASSERT_TRUE(runner);
  Driver d(*runner, kBlockSize);
  std::vector<int> seqs;
  for (std::size_t ci = 0; ci < cases.size(); ++ci)
    seqs.push_back(d.add_seq(200 - static_cast<int>(ci + 1) * 20, 20));
  std::size_t max_prompt = 0;
  for (const auto& c : cases) max_prompt = std::max(max_prompt, c.prompt_ids.size());
  std::vector<std::vector<std::vector<float>>> batched(cases.size());
  for (std::size_t t = 0; t < max_prompt; ++t) {
    std::vector<Driver::Chunk> chunks;
    std::vector<std::size_t> who;
    for (std::size_t ci = 0; ci < cases.size(); ++ci) {
      if (t >= cases[ci].prompt_ids.size()) continue;
      const bool last = t + 1 == cases[ci].prompt_ids.size();
      chunks.push_back({seqs[ci], {cases[ci].prompt_ids[t]}, last});
      if (last) who.push_back(ci);
    }
    auto rows = d.step(chunks);
    for (std::size_t i = 0; i < who.size(); ++i) batched[who[i]].push_back(rows[i]);
  }
  for (int s = 0; s + 1 < kSteps; ++s) {
    std::vector<Driver::Chunk> chunks;
    for (std::size_t ci = 0; ci < cases.size(); ++ci)
      chunks.push_back({seqs[ci], {cases[ci].generated_ids[s]}, true});
    auto rows = d.step(chunks);
    for (std::size_t ci = 0; ci < cases.size(); ++ci) batched[ci].push_back(rows[ci]);
  }
  for (std::size_t ci = 0; ci < cases.size(); ++ci) {
    ASSERT_EQ(batched[ci].size(), alone[ci].size());
    for (std::size_t s = 0; s < alone[ci].size(); ++s)
      ASSERT_EQ(0, std::memcmp(alone[ci][s].data(), batched[ci][s].data(), alone[ci][s].size() * sizeof(float)))
          << "case " << ci << " step " << s << " differs between alone and batched";
  }
}

// Every StepOverlap gives the same logits bit for bit (issue 17, item 3):
// prefill chunks of uneven length next to decode rows, so the nano-batch
// split falls between sequences of different sizes and moves from step to
// step; F32 and BF16 weights and KV; prefetch budgets from unbounded down to
// less than one sequence's KV (the queue stops mid-sequence).
TEST(CpuRunnerGolden, LogitsBitIdenticalUnderEveryStepOverlap) {
  const auto cases = load_reference();
  ASSERT_GE(cases.size(), 3u);
  auto run = [&](DType dtype, StepOverlap overlap, std::size_t prefetch_bytes) {
    CpuRunnerOptions o;
    o.kv_cache_dtype = dtype;
    o.overlap = overlap;
    o.overlap_prefetch_bytes = prefetch_bytes;
    auto runner = make_runner(dtype, 256, o);
    std::vector<std::vector<float>> logits;
    if (!runner) return logits;
    Driver d(*runner, kBlockSize);
    std::vector<int> seqs;
    for (std::size_t ci = 0; ci < cases.size(); ++ci) seqs.push_back(d.add_seq(static_cast<int>(ci) * 40, 40));
    // Step 1: case 0's whole prompt alone; step 2: case 0 decodes while the
    // others prefill in chunks of 3 and 5 tokens; then all decode.
    for (auto& r : d.step({{seqs[0], cases[0].prompt_ids, true}})) logits.push_back(std::move(r));
    std::vector<std::size_t> fed(cases.size(), 0);
    fed[0] = cases[0].prompt_ids.size();
    std::vector<std::size_t> gen(cases.size(), 0);
    for (int step = 0; step < 14; ++step) {
      std::vector<Driver::Chunk> chunks;
      for (std::size_t ci = 0; ci < cases.size(); ++ci) {
        const auto& prompt = cases[ci].prompt_ids;
        if (fed[ci] < prompt.size()) {
          const std::size_t take = std::min<std::size_t>(ci % 2 == 1 ? 3 : 5, prompt.size() - fed[ci]);
          chunks.push_back({seqs[ci], {prompt.begin() + static_cast<long>(fed[ci]),
                                       prompt.begin() + static_cast<long>(fed[ci] + take)},
                            fed[ci] + take == prompt.size()});
          fed[ci] += take;
        } else if (gen[ci] < cases[ci].generated_ids.size()) {
          chunks.push_back({seqs[ci], {cases[ci].generated_ids[gen[ci]++]}, true});
        }
      }
      for (auto& r : d.step(chunks)) logits.push_back(std::move(r));
    }
    return logits;
  };
  for (const DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const auto serial = run(dtype, StepOverlap::none, 0);
    ASSERT_GT(serial.size(), 30u);
    for (const StepOverlap overlap : {StepOverlap::kv_prefetch, StepOverlap::nano_batch}) {
      for (const std::size_t budget : {std::size_t{0}, std::size_t{3000}}) {
        SCOPED_TRACE(testing::Message() << step_overlap_name(overlap) << ", prefetch budget " << budget);
        const auto overlapped = run(dtype, overlap, budget);
        ASSERT_EQ(overlapped.size(), serial.size());
        for (std::size_t i = 0; i < serial.size(); ++i)
          ASSERT_EQ(0, std::memcmp(serial[i].data(), overlapped[i].data(), serial[i].size() * sizeof(float)))
              << "logits row " << i << " differs from the serial step's";
      }
    }
  }
}

TEST(StepOverlap, NamesParseAndABadOneIsRefusedNamingTheChoices) {
  for (const StepOverlap o : {StepOverlap::none, StepOverlap::kv_prefetch, StepOverlap::nano_batch}) {
    auto parsed = parse_step_overlap(step_overlap_name(o));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, o);
  }
  auto bad = parse_step_overlap("nanoflow");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().to_string().find("none, kv-prefetch or nano-batch"), std::string::npos);
  EXPECT_NE(bad.error().to_string().find("'nanoflow'"), std::string::npos);
}

// A malformed step is refused with a clear error, and the runner keeps working.
TEST(CpuRunner, BadStepIsRejectedAndRunnerStillWorks) {
  auto runner = make_runner(DType::f32, 8);
  ASSERT_TRUE(runner);
  model::StepInput in;
  in.block_size = kBlockSize;
  in.token_ids = {1, 9999};
  in.positions = {0, 1};
  in.slot_mapping = {0, 1};
  model::StepSeq s;
  s.num_new_tokens = 2;
  s.needs_logits = true;
  s.block_table = {0};
  in.seqs = {s};
  in.logits_rows = {1};
  auto out = runner->execute(in);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(out.error().message.find("9999"), std::string::npos) << out.error().message;

  in.token_ids = {1, 403};
  in.seqs[0].block_table = {42};  // outside the 8-block cache
  out = runner->execute(in);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.error().message.find("block id 42"), std::string::npos) << out.error().message;

  in.seqs[0].block_table = {0};
  out = runner->execute(in);
  ASSERT_TRUE(out.ok()) << out.error().to_string();
  EXPECT_EQ(out->logits.size(), 512u);
}

}  // namespace
}  // namespace shardline::model
