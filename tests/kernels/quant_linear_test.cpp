// Quantized linear layers (kernels/cpu/quant_linear.hpp, issue 40 step 2 in
// part): x rows (and weights quantized on load: Q8_0, Q4_0, Q4_1)
// quantized bit for bit like the `gguf` package;
// the scalar, AVX2 and AVX512-VNNI kernels on packed weights bit for bit
// like the scalar definition (llama.cpp's quantize_row_q8_0_ref and
// ggml_vec_dot_{q8_0,q4_0}_q8_0) for any batch, row position and thread
// count; and close to the dequantized product.

#include "kernels/cpu/quant_linear.hpp"

#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <fstream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/dtype.hpp"
#include "kernels/cpu/weight_linear.hpp"
#include "tests/support/ggml_blocks.hpp"
#include "tests/support/python.hpp"

namespace shardline::kernels::cpu {
namespace kernels_quant_linear_test {

/// Rows of x: random normals, plus blocks that test the rounding: all zero,
/// one huge value beside tiny ones, values at exact halves of the step (both
/// signs), tiny values whose scale underflows F16, a NaN (unless
/// `with_nan` is false), values a hair below a half of the step; row 8
/// (when m > 8) all zeros.
std::vector<float> make_x(int m, int k, std::mt19937& rng, bool with_nan = true) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(m) * k);
  for (float& v : x) v = normal(rng);
  for (int i = 0; i < m; ++i) {
    float* row = x.data() + static_cast<std::size_t>(i) * k;
    const int b = (i % (k / kQuantBlock)) * kQuantBlock;
    switch (i % 7) {
      case 0: std::fill(row + b, row + b + kQuantBlock, 0.0f); break;
      case 1:
        row[b] = 3.0e4f;
        for (int j = 1; j < kQuantBlock; ++j) row[b + j] = 1e-3f * static_cast<float>(j);
        break;
      case 2:  // amax 127: d = 1, so j + 0.5 is an exact half
        row[b] = 127.0f;
        for (int j = 1; j < kQuantBlock; ++j) row[b + j] = (j % 2 == 0 ? 1.0f : -1.0f) * (static_cast<float>(j) + 0.5f);
        break;
      case 3:  // a scale that underflows F16 to zero
        for (int j = 0; j < kQuantBlock; ++j) row[b + j] = 1e-30f * static_cast<float>(j - 16);
        break;
      case 4:  // the largest magnitude twice, both signs (Q4_0 takes the first)
        row[b + 3] = -4.0f;
        row[b + 9] = 4.0f;
        for (int j = 0; j < kQuantBlock; ++j)
          if (j != 3 && j != 9) row[b + j] = 0.25f * static_cast<float>(j % 16) - 2.0f;
        break;
      case 5:  // a NaN (quantized to 0; llama.cpp leaves it undefined: not for the oracles)
        if (with_nan) row[b + 7] = std::numeric_limits<float>::quiet_NaN();
        break;
      default:  // amax 127 (d = 1) and values a hair below a half: x + 0.5 would round them up
        row[b] = -127.0f;
        for (int j = 1; j < kQuantBlock; ++j)
          row[b + j] = (j % 2 == 0 ? 1.0f : -1.0f) * std::nextafter(static_cast<float>(j % 4) + 0.5f, 0.0f);
        break;
    }
  }
  if (m > 8)  // a whole row of zeros (Q8_K: all-zero super-blocks)
    std::fill(x.begin() + static_cast<std::ptrdiff_t>(8) * k, x.begin() + static_cast<std::ptrdiff_t>(9) * k, 0.0f);
  return x;
}

using testing_support::random_ggml_blocks;

bool k_quant(GgmlType t) { return testing_support::is_k_quant(t); }

/// A k of `k32` 32-element blocks' size for the 32-block types, 8 x that
/// for the K-quants (whole super-blocks).
int scaled_k(GgmlType t, int k32) { return k_quant(t) ? 8 * k32 : k32; }

std::vector<float> reference(const std::vector<float>& x, int m, int k, GgmlType type,
                             const std::vector<std::uint8_t>& w, int n) {
  std::vector<float> y(static_cast<std::size_t>(m) * n, -1.0f);
  const Status s = quant_linear_reference(x.data(), m, k, type, w, n, k, y.data(), n);
  EXPECT_TRUE(s.ok()) << s.error().to_string();
  return y;
}

std::vector<float> run(const std::vector<float>& x, int m, int k, const PackedQuantLinear& w, QuantKernel kernel) {
  std::vector<float> y(static_cast<std::size_t>(m) * w.out_features(), -1.0f);
  const Status s = quant_linear(x.data(), m, k, w, y.data(), w.out_features(), kernel);
  EXPECT_TRUE(s.ok()) << s.error().to_string();
  return y;
}

/// Elements whose bits differ (the first few reported).
int mismatches(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  int bad = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], 4) != 0 && ++bad <= 3)
      ADD_FAILURE() << what << " element " << i << ": " << a[i] << " vs " << b[i];
  return bad;
}

/// Every kernel this CPU runs (the scalar one everywhere).
std::vector<QuantKernel> kernels() {
  std::vector<QuantKernel> out;
  for (const QuantKernel k : {QuantKernel::scalar, QuantKernel::avx2, QuantKernel::avx512_vnni})
    if (quant_kernel_supported(k)) out.push_back(k);
  return out;
}

std::string kernel_label(QuantKernel k) {
  return k == QuantKernel::avx2 ? "avx2" : k == QuantKernel::avx512_vnni ? "avx512_vnni" : "scalar";
}

class QuantizeRow : public ::testing::TestWithParam<GgmlType> {};
INSTANTIATE_TEST_SUITE_P(Types, QuantizeRow, ::testing::Values(GgmlType::q8_0, GgmlType::q4_0, GgmlType::q4_1),
                         [](const auto& info) { return ggml_type_name(static_cast<std::uint32_t>(info.param)); });

// Weights quantized on load (--quantization) and activations (Q8_0) are
// llama.cpp's quantize_row_*_ref, bit for bit like the gguf package.
TEST_P(QuantizeRow, RowsQuantizeLikeTheGgufPackage) {
  const GgmlType type = GetParam();
  const std::string problem = testing_support::python_env_problem("gguf, numpy");
  ASSERT_TRUE(problem.empty()) << problem;
  constexpr int kM = 40, kK = 256;
  std::mt19937 rng(4001);
  const std::vector<float> x = make_x(kM, kK, rng, /*with_nan=*/false);
  const std::size_t row_bytes = *ggml_row_bytes(static_cast<std::uint32_t>(type), kK);
  std::vector<std::uint8_t> ours(kM * row_bytes);
  for (int i = 0; i < kM; ++i) {
    const Status s = quantize_row(type, x.data() + static_cast<std::size_t>(i) * kK, kK, ours.data() + i * row_bytes);
    ASSERT_TRUE(s.ok()) << s.error().to_string();
  }
  if (type == GgmlType::q8_0) {  // the activations' quantizer is the same function
    std::vector<BlockQ8_0> act(static_cast<std::size_t>(kM) * kK / kQuantBlock);
    for (int i = 0; i < kM; ++i)
      quantize_row_q8_0(x.data() + static_cast<std::size_t>(i) * kK, kK,
                        act.data() + static_cast<std::size_t>(i) * kK / kQuantBlock);
    EXPECT_EQ(std::memcmp(act.data(), ours.data(), ours.size()), 0);
  }
  const std::string name = ggml_type_name(static_cast<std::uint32_t>(type));
  const auto dir = std::filesystem::temp_directory_path() /
                   ("shardline_quant_linear_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "x.f32", std::ios::binary)
      .write(reinterpret_cast<const char*>(x.data()), static_cast<std::streamsize>(x.size() * 4));
  const auto r = testing_support::run_command(testing_support::kPython + " " + SHARDLINE_SOURCE_DIR +
                                              "/tests/kernels/quant_oracle.py " + dir.string() + " " +
                                              std::to_string(kK) + " " + name);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::ifstream in(dir / "x.blocks", std::ios::binary);
  std::vector<char> want(ours.size());
  in.read(want.data(), static_cast<std::streamsize>(want.size()));
  ASSERT_EQ(in.gcount(), static_cast<std::streamsize>(want.size()));
  const std::size_t block_bytes = row_bytes / (kK / kQuantBlock);
  int bad = 0;
  for (std::size_t b = 0; b < ours.size() / block_bytes; ++b)
    if (std::memcmp(ours.data() + b * block_bytes, want.data() + b * block_bytes, block_bytes) != 0 && ++bad <= 3)
      ADD_FAILURE() << name << " block " << b << " (row " << b / (kK / kQuantBlock) << ") differs from gguf's";
  EXPECT_EQ(bad, 0);
  std::filesystem::remove_all(dir);
}

// Q4_K's and Q6_K's activations: ggml's quantize_row_q8_K_ref, written out
// in numpy by the oracle (the gguf package has no Q8_K quantizer). The rows
// hold exact halves of the step (round half to even), a largest magnitude
// seen twice with both signs (the first one sets the sign of d), a scale
// that underflows, and an all-zero super-block.
TEST(QuantizeRowQ8K, RowsQuantizeLikeGgmlsDefinition) {
  const std::string problem = testing_support::python_env_problem("gguf, numpy");
  ASSERT_TRUE(problem.empty()) << problem;
  constexpr int kM = 41, kK = 512, kBlocks = kK / kQuantSuperBlock;
  std::mt19937 rng(4006);
  std::vector<float> x = make_x(kM - 1, kK, rng, /*with_nan=*/false);
  x.resize(static_cast<std::size_t>(kM) * kK, 0.0f);
  // Every path: the scalar definition, and AVX2 where the CPU has it.
  std::vector<std::vector<BlockQ8_K>> paths;
  for (const QuantKernel kernel : {QuantKernel::scalar, QuantKernel::avx2}) {
    if (!quant_kernel_supported(kernel)) continue;
    std::vector<BlockQ8_K>& ours = paths.emplace_back(static_cast<std::size_t>(kM) * kBlocks);
    for (int i = 0; i < kM; ++i)
      quantize_row_q8_k(x.data() + static_cast<std::size_t>(i) * kK, kK,
                        ours.data() + static_cast<std::size_t>(i) * kBlocks, kernel);
  }
  const auto dir = std::filesystem::temp_directory_path() / ("shardline_quant_q8k_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "x.f32", std::ios::binary)
      .write(reinterpret_cast<const char*>(x.data()), static_cast<std::streamsize>(x.size() * 4));
  const auto r = testing_support::run_command(testing_support::kPython + " " + SHARDLINE_SOURCE_DIR +
                                              "/tests/kernels/quant_oracle.py " + dir.string() + " " +
                                              std::to_string(kK) + " Q8_K");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::ifstream in(dir / "x.blocks", std::ios::binary);
  std::vector<BlockQ8_K> want(static_cast<std::size_t>(kM) * kBlocks);
  in.read(reinterpret_cast<char*>(want.data()), static_cast<std::streamsize>(want.size() * sizeof(BlockQ8_K)));
  ASSERT_EQ(in.gcount(), static_cast<std::streamsize>(want.size() * sizeof(BlockQ8_K)));
  for (std::size_t p = 0; p < paths.size(); ++p) {
    const std::vector<BlockQ8_K>& ours = paths[p];
    int bad = 0;
    for (std::size_t b = 0; b < ours.size(); ++b)
      if (std::memcmp(&ours[b], &want[b], sizeof(BlockQ8_K)) != 0 && ++bad <= 3)
        ADD_FAILURE() << (p == 0 ? "scalar" : "avx2") << " Q8_K block " << b << " (row " << b / kBlocks
                      << ") differs: d " << ours[b].d << " vs " << want[b].d;
    EXPECT_EQ(bad, 0);
    EXPECT_EQ(ours.back().d, 0.0f) << "an all-zero block";
  }
  std::filesystem::remove_all(dir);
}

TEST(QuantizeRowErrors, PartialBlocksAndOtherTypesAreRefused) {
  std::vector<float> x(48, 1.0f);
  std::vector<std::uint8_t> out(64);
  const Status partial = quantize_row(GgmlType::q4_0, x.data(), 48, out.data());
  ASSERT_FALSE(partial.ok());
  EXPECT_EQ(partial.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(partial.error().message.find("48 elements"), std::string::npos) << partial.error().message;
  const Status other = quantize_row(GgmlType::q4_k, x.data(), 32, out.data());
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.error().code, ErrorCode::unsupported);
  EXPECT_NE(other.error().message.find("Q4_K"), std::string::npos) << other.error().message;
}

TEST(QuantLinear, Q8_1IsQ8_0WithTheSumOfItsValuesTimesTheScale) {
  constexpr int kM = 40, kK = 256;
  std::mt19937 rng(4005);
  const std::vector<float> x = make_x(kM, kK, rng);
  std::vector<BlockQ8_0> q80(kK / kQuantBlock);
  std::vector<BlockQ8_1> q81(kK / kQuantBlock);
  for (int i = 0; i < kM; ++i) {
    const float* row = x.data() + static_cast<std::size_t>(i) * kK;
    quantize_row_q8_0(row, kK, q80.data());
    quantize_row_q8_1(row, kK, q81.data());
    for (int b = 0; b < kK / kQuantBlock; ++b) {
      const BlockQ8_0& a = q80[static_cast<std::size_t>(b)];
      const BlockQ8_1& c = q81[static_cast<std::size_t>(b)];
      ASSERT_EQ(a.d, c.d) << "row " << i << " block " << b;
      ASSERT_EQ(std::memcmp(a.qs, c.qs, sizeof(a.qs)), 0) << "row " << i << " block " << b;
      // ggml's quantize_row_q8_1_ref: s = F16(sum * d) with the F32 d.
      float amax = 0.0f;
      int sum = 0;
      for (int j = 0; j < kQuantBlock; ++j) {
        amax = std::max(amax, std::fabs(row[b * kQuantBlock + j]));
        sum += c.qs[j];
      }
      EXPECT_EQ(c.s, f32_to_f16(static_cast<float>(sum) * (amax / 127.0f))) << "row " << i << " block " << b;
    }
  }
}

class QuantLinearTypes : public ::testing::TestWithParam<GgmlType> {};

INSTANTIATE_TEST_SUITE_P(Types, QuantLinearTypes,
                         ::testing::Values(GgmlType::q8_0, GgmlType::q4_0, GgmlType::q4_1, GgmlType::q4_k,
                                           GgmlType::q6_k),
                         [](const ::testing::TestParamInfo<GgmlType>& i) {
                           return ggml_type_name(static_cast<std::uint32_t>(i.param));
                         });

TEST_P(QuantLinearTypes, EveryKernelMatchesTheScalarDefinitionBitForBit) {
  std::mt19937 rng(4002);
  // n: one panel, a partial one, odd and even panel counts (the VNNI
  // kernel takes panels in pairs).
  for (const auto& [n, k32] : std::vector<std::pair<int, int>>{{37, 256}, {8, 32}, {64, 512}, {3, 96}, {24, 64}}) {
    const int k = scaled_k(GetParam(), k32);
    const std::vector<std::uint8_t> w = random_ggml_blocks(GetParam(), n, k, rng);
    auto packed = PackedQuantLinear::pack(GetParam(), w, n, k);
    ASSERT_TRUE(packed.ok()) << packed.error().to_string();
    for (const int m : {1, 3, 4, 5, 9}) {
      const std::vector<float> x = make_x(m, k, rng);
      const std::vector<float> want = reference(x, m, k, GetParam(), w, n);
      for (const QuantKernel kernel : kernels()) {
        const std::string what = kernel_label(kernel) + " n " +
                                 std::to_string(n) + " k " + std::to_string(k) + " m " + std::to_string(m);
        EXPECT_EQ(mismatches(run(x, m, k, *packed, kernel), want, what), 0) << what;
      }
    }
  }
}

/// Weights of `type` [n, k] (GGUF blocks and packed) and x [m, k].
struct Problem {
  std::vector<std::uint8_t> w;
  PackedQuantLinear packed;
  std::vector<float> x;
};

Problem make_problem(GgmlType type, int n, int k, int m, std::mt19937& rng) {
  Problem p;
  p.w = random_ggml_blocks(type, n, k, rng);
  auto packed = PackedQuantLinear::pack(type, p.w, n, k);
  EXPECT_TRUE(packed.ok()) << packed.error().to_string();
  if (packed.ok()) p.packed = std::move(packed).value();
  p.x = make_x(m, k, rng);
  return p;
}

TEST_P(QuantLinearTypes, ARowsResultDoesNotDependOnTheBatchOrTheThreads) {
  std::mt19937 rng(4003);
  constexpr int kN = 45, kM = 11;
  const int kK = scaled_k(GetParam(), 320);
  const Problem problem = make_problem(GetParam(), kN, kK, kM, rng);
  const auto& [w, packed, x] = problem;
  const int threads = omp_get_max_threads();
  for (const QuantKernel kernel : kernels()) {
    omp_set_num_threads(2);
    const std::vector<float> batch = run(x, kM, kK, packed, kernel);
    omp_set_num_threads(1);
    const std::vector<float> one_thread = run(x, kM, kK, packed, kernel);
    EXPECT_EQ(mismatches(one_thread, batch, "1 vs 2 threads"), 0);
    for (int i = 0; i < kM; ++i) {
      const std::vector<float> row(x.begin() + static_cast<std::ptrdiff_t>(i) * kK,
                                   x.begin() + static_cast<std::ptrdiff_t>(i + 1) * kK);
      const std::vector<float> alone = run(row, 1, kK, packed, kernel);
      const std::vector<float> in_batch(batch.begin() + static_cast<std::ptrdiff_t>(i) * kN,
                                        batch.begin() + static_cast<std::ptrdiff_t>(i + 1) * kN);
      EXPECT_EQ(mismatches(alone, in_batch, "row " + std::to_string(i) + " alone vs in the batch"), 0);
    }
  }
  omp_set_num_threads(threads);
}

/// The K-quants' half of the test below: y [m, n] against the dequantized
/// weights `wd` times x dequantized from Q8_K, in double. Q4_K's weights
/// are d sc q - dmin m: both parts are dequantized apart (a copy with dmin
/// zeroed, one with d zeroed) so that the bound covers their cancellation.
void expect_k_quant_product(GgmlType type, const std::vector<std::uint8_t>& w, const std::vector<float>& wd,
                            const std::vector<float>& x, const std::vector<float>& y, int n, int k, int m) {
  std::vector<float> scale_part = wd, min_part(wd.size(), 0.0f);
  if (type == GgmlType::q4_k) {
    std::vector<std::uint8_t> no_min = w, no_scale = w;
    for (std::size_t at = 0; at < w.size(); at += 144) {
      std::memset(no_min.data() + at + 2, 0, 2);
      std::memset(no_scale.data() + at, 0, 2);
    }
    const auto count = static_cast<std::int64_t>(wd.size());
    ASSERT_TRUE(dequantize_row(type, no_min.data(), scale_part.data(), count).ok());
    ASSERT_TRUE(dequantize_row(type, no_scale.data(), min_part.data(), count).ok());
  }
  std::vector<BlockQ8_K> xq(static_cast<std::size_t>(k / kQuantSuperBlock));
  for (int i = 0; i < m; ++i) {
    quantize_row_q8_k(x.data() + static_cast<std::size_t>(i) * k, k, xq.data());
    for (int j = 0; j < n; ++j) {
      double exact = 0.0, magnitude = 0.0;
      for (int e = 0; e < k; ++e) {
        const BlockQ8_K& b = xq[static_cast<std::size_t>(e / kQuantSuperBlock)];
        const double x_e = static_cast<double>(b.d) * b.qs[e % kQuantSuperBlock];
        const std::size_t at = static_cast<std::size_t>(j) * k + e;
        exact += (static_cast<double>(scale_part[at]) + min_part[at]) * x_e;
        magnitude += (std::fabs(scale_part[at]) + std::fabs(min_part[at])) * std::fabs(x_e);
      }
      EXPECT_NEAR(y[static_cast<std::size_t>(i) * n + j], exact, 1e-5 * magnitude + 1e-30)
          << "row " << i << " column " << j;
    }
  }
}

TEST_P(QuantLinearTypes, TheResultIsTheDequantizedProductUpToF32Rounding) {
  std::mt19937 rng(4004);
  constexpr int kN = 24, kM = 6;
  const int kK = scaled_k(GetParam(), 512);
  const Problem problem = make_problem(GetParam(), kN, kK, kM, rng);
  const auto& [w, packed, x] = problem;
  const std::vector<float> y = run(x, kM, kK, packed, QuantKernel::automatic);
  std::vector<float> wd(static_cast<std::size_t>(kN) * kK);
  ASSERT_TRUE(dequantize_row(GetParam(), w.data(), wd.data(), static_cast<std::int64_t>(wd.size())).ok());
  if (k_quant(GetParam())) {
    expect_k_quant_product(GetParam(), w, wd, x, y, kN, kK, kM);
    return;
  }
  for (int i = 0; i < kM; ++i) {
    std::vector<BlockQ8_1> xq(kK / kQuantBlock);
    quantize_row_q8_1(x.data() + static_cast<std::size_t>(i) * kK, kK, xq.data());
    for (int j = 0; j < kN; ++j) {
      // In double: the dequantized weights times the dequantized x. Q4_1's
      // minimum multiplies the block's s, F16 like ggml's (not the exact
      // sum of the dequantized x).
      double exact = 0.0, magnitude = 0.0;
      for (int e = 0; e < kK; ++e) {
        const BlockQ8_1& b = xq[static_cast<std::size_t>(e / kQuantBlock)];
        double w_e = wd[static_cast<std::size_t>(j) * kK + e];
        if (GetParam() == GgmlType::q4_1) {
          std::uint16_t m;
          std::memcpy(&m, w.data() + (static_cast<std::size_t>(j) * kK + e) / kQuantBlock * 20 + 2, 2);
          w_e -= f16_to_f32(m);  // the nibble's part; the minimum's is added per block below
          if (e % kQuantBlock == 0) {
            const double mterm = static_cast<double>(f16_to_f32(m)) * f16_to_f32(b.s);
            exact += mterm;
            magnitude += std::fabs(mterm);
          }
        }
        const double term = w_e * static_cast<double>(f16_to_f32(b.d)) * b.qs[e % kQuantBlock];
        exact += term;
        magnitude += std::fabs(term);
      }
      EXPECT_NEAR(y[static_cast<std::size_t>(i) * kN + j], exact, 1e-5 * magnitude + 1e-30)
          << "row " << i << " column " << j;
    }
  }
}

TEST(QuantLinear, AStackOfTypesIsEachPartsOwnProductBitForBit) {
  // A Q4_K_M file's fused q/k/v: Q4_K rows above Q6_K rows. linear() on the
  // stack writes each part's columns at its offset, exactly the part's own
  // quant_linear, then the bias over all of them.
  std::mt19937 rng(4011);
  constexpr int kK = 512, kM = 5, kN0 = 37, kN1 = 24, kN = kN0 + kN1, kStride = kN + 3;
  const std::vector<std::uint8_t> w0 = random_ggml_blocks(GgmlType::q4_k, kN0, kK, rng);
  const std::vector<std::uint8_t> w1 = random_ggml_blocks(GgmlType::q6_k, kN1, kK, rng);
  PackedQuantStack st;
  for (const auto& [type, w, n] : {std::tuple{GgmlType::q4_k, &w0, kN0}, std::tuple{GgmlType::q6_k, &w1, kN1}}) {
    auto p = PackedQuantLinear::pack(type, *w, n, kK);
    ASSERT_TRUE(p.ok()) << p.error().to_string();
    st.parts.push_back(std::move(p).value());
  }
  const std::size_t part_bytes = st.parts[0].bytes() + st.parts[1].bytes();
  const PackedWeight stacked(std::move(st));
  EXPECT_EQ(stacked.format_name(), "Q4_K+Q6_K");
  EXPECT_EQ(stacked.out_features(), kN);
  EXPECT_EQ(stacked.in_features(), kK);
  EXPECT_EQ(stacked.bytes(), part_bytes);
  const std::vector<float> x = make_x(kM, kK, rng);
  const std::vector<float> want0 = reference(x, kM, kK, GgmlType::q4_k, w0, kN0);
  const std::vector<float> want1 = reference(x, kM, kK, GgmlType::q6_k, w1, kN1);
  std::vector<float> bias(kN);
  for (int j = 0; j < kN; ++j) bias[j] = 0.125f * static_cast<float>(j) - 3.0f;
  for (const bool with_bias : {false, true}) {
    std::vector<float> y(static_cast<std::size_t>(kM) * kStride, -7.0f);  // [m, stride]: n columns and a margin
    linear(x.data(), kM, kK, stacked, with_bias ? bias.data() : nullptr, y.data(), kStride);
    int bad = 0;
    for (int i = 0; i < kM; ++i) {
      for (int j = 0; j < kN; ++j) {
        float want = j < kN0 ? want0[static_cast<std::size_t>(i) * kN0 + j]
                             : want1[static_cast<std::size_t>(i) * kN1 + j - kN0];
        if (with_bias) want += bias[j];
        const float got = y[static_cast<std::size_t>(i) * kStride + j];
        if (std::memcmp(&got, &want, 4) != 0 && ++bad <= 3)
          ADD_FAILURE() << "row " << i << " column " << j << (with_bias ? " with bias: " : ": ") << got << " vs "
                        << want;
      }
      for (int j = kN; j < kStride; ++j)
        EXPECT_EQ(y[static_cast<std::size_t>(i) * kStride + j], -7.0f) << "the margin past n is untouched";
    }
    EXPECT_EQ(bad, 0);
  }
}

TEST(QuantLinear, BadShapesAndTypesAreRefusedWithAClearError) {
  std::vector<std::uint8_t> w(34 * 4);
  auto q5k = PackedQuantLinear::pack(GgmlType::q5_k, w, 1, 256);
  ASSERT_FALSE(q5k.ok());
  EXPECT_EQ(q5k.error().code, ErrorCode::unsupported);
  EXPECT_NE(q5k.error().message.find("Q5_K"), std::string::npos) << q5k.error().message;
  auto partial_super_block = PackedQuantLinear::pack(GgmlType::q4_k, w, 1, 128);
  ASSERT_FALSE(partial_super_block.ok());
  EXPECT_EQ(partial_super_block.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(partial_super_block.error().message.find("multiple of 256"), std::string::npos)
      << partial_super_block.error().message;
  auto odd_k = PackedQuantLinear::pack(GgmlType::q8_0, w, 1, 48);
  ASSERT_FALSE(odd_k.ok());
  EXPECT_EQ(odd_k.error().code, ErrorCode::invalid_argument);
  auto short_bytes = PackedQuantLinear::pack(GgmlType::q8_0, w, 2, 128);  // needs 2 x 136 bytes
  ASSERT_FALSE(short_bytes.ok());
  EXPECT_NE(short_bytes.error().message.find("needs 272"), std::string::npos) << short_bytes.error().message;
  auto ok = PackedQuantLinear::pack(GgmlType::q8_0, w, 1, 128);
  ASSERT_TRUE(ok.ok());
  std::vector<float> x(128), y(1);
  const Status stride = quant_linear(x.data(), 1, 64, *ok, y.data(), 1);
  ASSERT_FALSE(stride.ok());
  EXPECT_EQ(stride.error().code, ErrorCode::invalid_argument);
  EXPECT_TRUE(quant_linear(x.data(), 0, 128, *ok, y.data(), 1).ok()) << "an empty batch is no error";
}

}  // namespace kernels_quant_linear_test
}  // namespace shardline::kernels::cpu
