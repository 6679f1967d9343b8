// kernels::cuda::sample (label gpu) against sampling::sample, row by row.
// Without a device every test that needs one skips; the host-side argument
// checks and the host helpers (make_penalty_list, make_sample_row) run
// everywhere.
//
// What must be exact: greedy ids, the logits after penalties / masks /
// temperature (bit for bit), the Philox uniforms, and batch invariance.
// Seeded draws are compared id for id too: they can only differ when u * total
// (or top_p * total) falls within a few double ulps of a cumulative-sum
// boundary (tree vs left-to-right sums), which none of these fixed seeds hits
// on the distributions used (peaked / moderately spread logits).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "sampling/rng.hpp"
#include "sampling/sampler.hpp"
#include "sampling/structured_output/grammar.hpp"
#include "sampling/sampling_params.hpp"
#include "kernels/cuda/device.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "tests/kernels/cuda/gpu_test_util.hpp"
#include "kernels/cuda/ops.hpp"
#include "kernels/cuda/sampling.hpp"

namespace shardline::kernels::cuda {
namespace {

using gpu_test::download;
using gpu_test::normalized_error;
using gpu_test::upload;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

class CudaSampling : public ::testing::Test {
 protected:
  void SetUp() override {
    const DeviceQuery q = query_devices();
    if (q.devices.empty()) GTEST_SKIP() << "no CUDA device: " << q.error;
  }
};

/// One row: its logits and everything sampling::sample gets.
struct RowSpec {
  std::vector<float> logits;
  sampling::SamplingParams params;
  std::uint64_t seed = 0;
  int position = 0;
  std::vector<std::int32_t> prompt, output, masked;
  std::vector<std::uint32_t> bitmask;  ///< a grammar's token bitmask, [ceil(vocab / 32)] words; empty: none
};

struct Outcome {
  std::vector<std::int32_t> ids;
  std::vector<std::vector<float>> logits;  ///< after the in-place modifications
};

Outcome run_cpu(const std::vector<RowSpec>& rows) {
  Outcome o;
  for (const RowSpec& r : rows) {
    std::vector<float> l = r.logits;
    if (!r.bitmask.empty()) sampling::apply_token_bitmask(l, r.bitmask);  // as the engine, before sampling
    sampling::SampleContext ctx{r.seed, r.position, r.prompt, r.output, r.masked};
    o.ids.push_back(sampling::sample(l, r.params, ctx));
    o.logits.push_back(std::move(l));
  }
  return o;
}

Outcome run_gpu(const std::vector<RowSpec>& rows, int vocab) {
  Outcome o;
  const int n = static_cast<int>(rows.size());
  std::vector<float> logits;
  std::vector<std::int32_t> ints;  // all penalty ids, counts and masked ids
  std::vector<SampleRow> srows;
  std::vector<std::size_t> pen_off, cnt_off, mask_off, bitmask_off;
  for (const RowSpec& r : rows) {
    EXPECT_EQ(static_cast<int>(r.logits.size()), vocab);
    logits.insert(logits.end(), r.logits.begin(), r.logits.end());
    sampling::SampleContext ctx{r.seed, r.position, r.prompt, r.output, r.masked};
    SampleRow s = make_sample_row(r.params, ctx);
    const PenaltyList pl = make_penalty_list(r.prompt, r.output, vocab);
    pen_off.push_back(ints.size());
    ints.insert(ints.end(), pl.ids.begin(), pl.ids.end());
    cnt_off.push_back(ints.size());
    ints.insert(ints.end(), pl.output_counts.begin(), pl.output_counts.end());
    mask_off.push_back(ints.size());
    ints.insert(ints.end(), r.masked.begin(), r.masked.end());
    bitmask_off.push_back(r.bitmask.empty() ? SIZE_MAX : ints.size());
    for (const std::uint32_t w : r.bitmask) ints.push_back(static_cast<std::int32_t>(w));
    s.num_penalty_ids = static_cast<int>(pl.ids.size());
    s.num_masked_ids = static_cast<int>(r.masked.size());
    srows.push_back(s);
  }
  ints.push_back(0);  // never empty
  DeviceBuffer d_ints = upload(ints);
  const auto* base = d_ints.as<std::int32_t>();
  for (int i = 0; i < n; ++i) {
    srows[i].penalty_ids = base + pen_off[i];
    srows[i].output_counts = base + cnt_off[i];
    srows[i].masked_ids = base + mask_off[i];
    if (bitmask_off[i] != SIZE_MAX) srows[i].token_bitmask = reinterpret_cast<const std::uint32_t*>(base + bitmask_off[i]);
  }
  logits.push_back(0.0f);
  srows.emplace_back();
  DeviceBuffer d_logits = upload(logits);
  DeviceBuffer d_rows = upload(srows);
  DeviceBuffer d_out = upload(std::vector<std::int32_t>(n + 1, -7));
  const Status st = sample(d_logits.as<float>(), n, vocab, d_rows.as<SampleRow>(),
                           d_out.as<std::int32_t>(), nullptr);
  EXPECT_TRUE(st.ok()) << st.error().to_string();
  const Status sy = synchronize(nullptr);
  EXPECT_TRUE(sy.ok()) << sy.error().to_string();
  o.ids = download<std::int32_t>(d_out);
  EXPECT_EQ(o.ids.back(), -7) << "wrote past num_rows";
  o.ids.pop_back();
  const std::vector<float> after = download<float>(d_logits);
  for (int i = 0; i < n; ++i)
    o.logits.emplace_back(after.begin() + static_cast<long>(i) * vocab,
                          after.begin() + static_cast<long>(i + 1) * vocab);
  return o;
}

/// Bit-identical, except that any two NaNs match: a NaN's payload is not part
/// of the contract. x86 keeps the operand's (NaN / T is that NaN), a GPU
/// writes its canonical 0x7fffffff (seen on an H200, 2026-11-28).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return false;
  }
  return true;
}

/// Whether this build's sampling::sample fuses frequency_penalty * count +
/// presence_penalty into one FMA (as the device does; see sampling.hpp). If
/// not, rows with presence / frequency penalties are not compared.
bool cpu_fuses_penalty() {
  for (int c = 1; c < 64; ++c) {
    const float fp = 0.1f + 0.013f * static_cast<float>(c), pp = 0.7f;
    volatile float prod = fp * static_cast<float>(c);
    const float unfused = prod + pp;
    const float fused = std::fma(fp, static_cast<float>(c), pp);
    if (fused == unfused) continue;
    sampling::SamplingParams p;
    p.temperature = 0.0f;
    p.frequency_penalty = fp;
    p.presence_penalty = pp;
    std::vector<float> l{0.0f, 0.0f};
    const std::vector<std::int32_t> out(static_cast<std::size_t>(c), 0);
    (void)sampling::sample(l, p, sampling::SampleContext{0, 0, {}, out, {}});
    return l[0] == -fused;
  }
  return true;
}

void expect_same(const std::vector<RowSpec>& rows, int vocab, bool check_logits = true) {
  static const bool fused = cpu_fuses_penalty();
  if (!fused) std::printf("note: CPU sampler built without FMA; penalised rows not compared\n");
  const Outcome cpu = run_cpu(rows);
  const Outcome gpu = run_gpu(rows, vocab);
  ASSERT_EQ(gpu.ids.size(), cpu.ids.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (!fused && !rows[i].output.empty() &&
        (rows[i].params.presence_penalty != 0.0f || rows[i].params.frequency_penalty != 0.0f))
      continue;
    EXPECT_EQ(gpu.ids[i], cpu.ids[i]) << "row " << i << " T=" << rows[i].params.temperature
                                      << " k=" << rows[i].params.top_k
                                      << " p=" << rows[i].params.top_p
                                      << " min_p=" << rows[i].params.min_p;
    if (check_logits) {
      EXPECT_TRUE(same_bits(gpu.logits[i], cpu.logits[i])) << "logits of row " << i;
    }
  }
}

std::vector<float> random_logits(int vocab, std::uint32_t seed, float scale, bool quantize) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<std::size_t>(vocab));
  for (float& x : v) x = quantize ? std::round(dist(rng) * 2.0f) / 2.0f : dist(rng);
  return v;
}

std::vector<std::int32_t> random_ids(int n, int vocab, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(0, vocab - 1);
  std::vector<std::int32_t> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

/// A mix of parameter combinations (index i picks one).
sampling::SamplingParams params_combo(int i) {
  sampling::SamplingParams p;
  switch (i % 10) {
    case 0: break;  // plain temperature 1
    case 1: p.temperature = 0.7f; p.top_k = 40; break;
    case 2: p.temperature = 0.9f; p.top_p = 0.9f; break;
    case 3: p.temperature = 1.3f; p.min_p = 0.05f; break;
    case 4: p.top_k = 50; p.top_p = 0.8f; p.min_p = 0.1f; break;
    case 5: p.repetition_penalty = 1.3f; p.presence_penalty = 0.5f; p.frequency_penalty = 0.25f; break;
    case 6: p.temperature = 0.8f; p.top_k = 1; p.repetition_penalty = 0.8f; break;
    case 7: p.top_p = 0.5f; p.frequency_penalty = -0.3f; p.min_tokens = 100; break;
    case 8: p.temperature = 0.0f; p.repetition_penalty = 1.2f; p.presence_penalty = 1.0f; break;
    case 9: p.top_k = 5; p.min_p = 0.3f; p.presence_penalty = -0.7f; break;
  }
  return p;
}

RowSpec make_row(int vocab, int i, float scale, bool quantize) {
  RowSpec r;
  r.logits = random_logits(vocab, 1000u + static_cast<std::uint32_t>(i), scale, quantize);
  r.params = params_combo(i);
  r.seed = sampling::mix_seed(42, static_cast<std::uint64_t>(i));
  r.position = 17 + 3 * i;
  r.prompt = random_ids(20, vocab, 7u * i + 1);
  r.prompt.push_back(-1);      // ignored
  r.prompt.push_back(vocab);   // ignored
  r.output = random_ids(12, vocab, 7u * i + 2);
  r.output.push_back(r.output[0]);  // repeated output ids: counts
  r.output.push_back(r.output[0]);
  r.masked = {0, 1, vocab - 1, vocab + 5};
  return r;
}

#define ASSERT_STATUS_OK(expr)                        \
  do {                                                \
    const Status st_ = (expr);                        \
    ASSERT_TRUE(st_.ok()) << st_.error().to_string(); \
  } while (0)

// ---- host-side (no device needed) ------------------------------------------------

TEST(CudaSamplingArgs, RejectedBeforeAnyLaunchAndEmptyBatchIsOk) {
  std::int32_t dummy_out = 0;
  EXPECT_EQ(sample(nullptr, -1, 10, nullptr, nullptr, nullptr).error().code,
            ErrorCode::invalid_argument);
  EXPECT_EQ(sample(nullptr, 1, -5, nullptr, &dummy_out, nullptr).error().code,
            ErrorCode::invalid_argument);
  EXPECT_EQ(sample(nullptr, 2, 10, nullptr, nullptr, nullptr).error().code,
            ErrorCode::invalid_argument);
  EXPECT_EQ(sample(nullptr, 2, 10, nullptr, &dummy_out, nullptr).error().code,
            ErrorCode::invalid_argument);
  EXPECT_TRUE(sample(nullptr, 0, 151936, nullptr, nullptr, nullptr).ok());
  EXPECT_EQ(philox_uniforms(nullptr, nullptr, -1, nullptr, nullptr).error().code,
            ErrorCode::invalid_argument);
  EXPECT_EQ(philox_uniforms(nullptr, nullptr, 3, nullptr, nullptr).error().code,
            ErrorCode::invalid_argument);
  EXPECT_TRUE(philox_uniforms(nullptr, nullptr, 0, nullptr, nullptr).ok());
}

TEST(CudaSamplingArgs, PenaltyListAndRowMirrorTheContext) {
  const std::vector<std::int32_t> prompt{5, 3, 5, -2, 100};
  const std::vector<std::int32_t> output{7, 3, 7, 7, 99, 100};
  const PenaltyList pl = make_penalty_list(prompt, output, 100);
  EXPECT_EQ(pl.ids, (std::vector<std::int32_t>{3, 5, 7, 99}));
  EXPECT_EQ(pl.output_counts, (std::vector<std::int32_t>{1, 0, 3, 1}));

  sampling::SamplingParams p;
  p.temperature = 0.5f;
  p.top_k = 7;
  p.top_p = 0.9f;
  p.min_p = 0.1f;
  p.repetition_penalty = 1.1f;
  p.presence_penalty = 0.2f;
  p.frequency_penalty = 0.3f;
  p.min_tokens = 4;
  const sampling::SampleContext ctx{123456789012345ull, 77, prompt, output, {}};
  const SampleRow r = make_sample_row(p, ctx);
  EXPECT_EQ(r.temperature, 0.5f);
  EXPECT_EQ(r.top_k, 7);
  EXPECT_EQ(r.top_p, 0.9f);
  EXPECT_EQ(r.min_p, 0.1f);
  EXPECT_EQ(r.repetition_penalty, 1.1f);
  EXPECT_EQ(r.presence_penalty, 0.2f);
  EXPECT_EQ(r.frequency_penalty, 0.3f);
  EXPECT_EQ(r.min_tokens, 4);
  EXPECT_EQ(r.seed, 123456789012345ull);
  EXPECT_EQ(r.position, 77);
  EXPECT_EQ(r.num_output_tokens, 6);
  EXPECT_EQ(r.penalty_ids, nullptr);
  EXPECT_EQ(r.num_penalty_ids, 0);
}

// ---- device ------------------------------------------------------------------------

TEST_F(CudaSampling, PhiloxUniformsAreBitExact) {
  std::vector<std::uint64_t> seeds;
  std::vector<std::int32_t> positions;
  for (int i = 0; i < 1000; ++i) {
    seeds.push_back(sampling::mix_seed(i, 99));
    positions.push_back(i % 7 == 0 ? -i : i * 31);
  }
  DeviceBuffer ds = upload(seeds), dp = upload(positions);
  DeviceBuffer dout = upload(std::vector<float>(seeds.size(), -1.0f));
  ASSERT_STATUS_OK(philox_uniforms(ds.as<std::uint64_t>(), dp.as<std::int32_t>(),
                                   static_cast<int>(seeds.size()), dout.as<float>(), nullptr));
  const std::vector<float> got = download<float>(dout);
  for (std::size_t i = 0; i < seeds.size(); ++i)
    ASSERT_EQ(got[i], sampling::philox_uniform(seeds[i], static_cast<std::uint64_t>(positions[i])))
        << i;
}

TEST_F(CudaSampling, EmptyBatchAndEmptyVocab) {
  DeviceBuffer out = upload(std::vector<std::int32_t>{-7, -7});
  ASSERT_STATUS_OK(sample(nullptr, 0, 1000, nullptr, out.as<std::int32_t>(), nullptr));
  ASSERT_STATUS_OK(sample(nullptr, 2, 0, nullptr, out.as<std::int32_t>(), nullptr));
  ASSERT_STATUS_OK(synchronize(nullptr));
  EXPECT_EQ(download<std::int32_t>(out), (std::vector<std::int32_t>{0, 0}));
  EXPECT_EQ(run_gpu({}, 1000).ids.size(), 0u);
}

TEST_F(CudaSampling, GreedyMatchesCpuWithTiesPenaltiesAndMasks) {
  for (int vocab : {1, 2, 33, 1000, 4099}) {
    std::vector<RowSpec> rows;
    for (int i = 0; i < 24; ++i) {
      RowSpec r = make_row(vocab, i, 1.0f, /*quantize=*/true);  // many exact ties
      r.params.temperature = 0.0f;
      if (i % 3 == 0) r.prompt.clear(), r.output.clear();
      rows.push_back(std::move(r));
    }
    // -0 vs +0 tie and a row of equal values: lowest id wins.
    rows[0].logits.assign(static_cast<std::size_t>(vocab), 0.0f);
    if (vocab > 2) rows[0].logits[1] = -0.0f;
    rows[1].logits.assign(static_cast<std::size_t>(vocab), 3.0f);
    rows[1].masked.clear();
    SCOPED_TRACE("vocab " + std::to_string(vocab));
    expect_same(rows, vocab);
  }
}

TEST_F(CudaSampling, SeededDrawsMatchCpuForTruncationAndPenaltyCombos) {
  for (int vocab : {7, 1000, 32000}) {
    for (float scale : {4.0f, 1.5f}) {  // peaked, then moderately spread
      std::vector<RowSpec> rows;
      for (int i = 0; i < 60; ++i) rows.push_back(make_row(vocab, i, scale, false));
      SCOPED_TRACE("vocab " + std::to_string(vocab) + " scale " + std::to_string(scale));
      expect_same(rows, vocab);
    }
  }
}

// Structured outputs: a row's grammar bitmask masks it first (words of
// zeros, of ones and mixed, a vocabulary ending inside a word), then the
// penalties and the rest, as the engine's host mask before sampling::sample.
TEST_F(CudaSampling, GrammarBitmaskMasksTheRowFirst) {
  for (int vocab : {33, 1000, 49152}) {
    std::vector<RowSpec> rows;
    std::mt19937 rng(43u + static_cast<std::uint32_t>(vocab));
    for (int i = 0; i < 30; ++i) {
      RowSpec r = make_row(vocab, i, 2.0f, false);
      r.bitmask.assign(static_cast<std::size_t>((vocab + 31) / 32), 0u);
      for (std::uint32_t& w : r.bitmask) {
        const unsigned kind = rng() % 4;  // mostly few allowed tokens, as a grammar's mask
        w = kind == 0 ? 0xFFFFFFFFu : kind == 1 ? static_cast<std::uint32_t>(rng()) : 0u;
      }
      r.bitmask[static_cast<std::size_t>(i) % r.bitmask.size()] |= 1u;  // never all masked
      if (i % 5 == 0) r.bitmask.clear();  // unconstrained rows beside them
      rows.push_back(std::move(r));
    }
    SCOPED_TRACE("vocab " + std::to_string(vocab));
    expect_same(rows, vocab);
  }
}

TEST_F(CudaSampling, SameDrawsAsCpuOverManyPositions) {
  // One distribution, many (seed, position) draws: exercises every part of the
  // inverse CDF, not only the mode.
  const int vocab = 500;
  std::vector<RowSpec> rows;
  for (int i = 0; i < 200; ++i) {
    RowSpec r;
    r.logits = random_logits(vocab, 5, 2.0f, false);
    r.params = params_combo(i % 5 == 3 ? 0 : i);
    r.params.min_tokens = 0;
    r.seed = 1234;
    r.position = i;
    rows.push_back(std::move(r));
  }
  expect_same(rows, vocab);
}

TEST_F(CudaSampling, FullQwenVocab) {
  const int vocab = 151936;
  std::vector<RowSpec> rows;
  for (int i = 0; i < 10; ++i) rows.push_back(make_row(vocab, i, 3.0f, false));
  expect_same(rows, vocab);
}

TEST_F(CudaSampling, NaNAndInfRowsFollowTheCpu) {
  const int vocab = 300;
  auto row = [&](float temperature, int top_k) {
    RowSpec r;
    r.logits = random_logits(vocab, 9, 1.0f, false);
    r.params.temperature = temperature;
    r.params.top_k = top_k;
    r.seed = 5;
    r.position = 3;
    return r;
  };
  std::vector<RowSpec> rows;
  for (float t : {0.0f, 1.0f}) {
    RowSpec a = row(t, 0);  // NaN scattered (greedy skips them; a draw falls back)
    a.logits[0] = kNaN, a.logits[17] = kNaN, a.logits[vocab - 1] = kNaN;
    rows.push_back(a);
    RowSpec b = row(t, 0);  // all NaN -> vocab - 1
    b.logits.assign(vocab, kNaN);
    rows.push_back(b);
    RowSpec c = row(t, 0);  // all -inf -> 0
    c.logits.assign(vocab, -kInf);
    rows.push_back(c);
    RowSpec d = row(t, 0);  // everything masked by min_tokens
    d.logits.assign(vocab, -kInf);
    d.logits[10] = 1.0f;
    d.params.min_tokens = 1;
    d.masked = {10};
    rows.push_back(d);
    RowSpec e = row(t, 0);  // +inf (twice): greedy takes the first; draws see NaN weights
    e.logits[40] = kInf, e.logits[200] = kInf;
    rows.push_back(e);
    RowSpec f = e;  // +inf with truncation
    f.params.top_k = 10, f.params.top_p = 0.9f;
    rows.push_back(f);
    RowSpec g = e;
    g.params.min_p = 0.2f;
    rows.push_back(g);
    RowSpec h = row(t, 20);  // -inf mostly, top-k larger than the finite count
    for (int i = 0; i < vocab; ++i)
      if (i % 50 != 7) h.logits[i] = -kInf;
    rows.push_back(h);
  }
  expect_same(rows, vocab);
}

TEST_F(CudaSampling, RowIsBatchInvariant) {
  const int vocab = 4096;
  std::vector<RowSpec> batch;
  for (int i = 0; i < 64; ++i) batch.push_back(make_row(vocab, i, 2.0f, i % 2 == 0));
  const Outcome all = run_gpu(batch, vocab);
  ASSERT_EQ(all.ids.size(), 64u);
  for (int i : {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 31, 63}) {
    const Outcome one = run_gpu({batch[i]}, vocab);
    ASSERT_EQ(one.ids.size(), 1u);
    EXPECT_EQ(one.ids[0], all.ids[i]) << "row " << i;
    EXPECT_TRUE(same_bits(one.logits[0], all.logits[i])) << "row " << i;
  }
  const Outcome again = run_gpu(batch, vocab);
  EXPECT_EQ(again.ids, all.ids);
}

}  // namespace
}  // namespace shardline::kernels::cuda
