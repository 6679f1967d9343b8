// Quantized linear layers (kernels/cpu/quant_linear.hpp, issue 40 step 2 in
// part): x rows (and weights quantized on load: Q8_0, Q4_0, Q4_1)
// quantized bit for bit like the `gguf` package;
// the scalar and AVX2 kernels on packed Q8_0 / Q4_0 weights bit for bit
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
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.hpp"
#include "tests/support/python.hpp"

namespace shardline::kernels::cpu {
namespace kernels_quant_linear_test {

/// Rows of x: random normals, plus blocks that test the rounding: all zero,
/// one huge value beside tiny ones, values at exact halves of the step (both
/// signs), tiny values whose scale underflows F16.
std::vector<float> make_x(int m, int k, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(m) * k);
  for (float& v : x) v = normal(rng);
  for (int i = 0; i < m; ++i) {
    float* row = x.data() + static_cast<std::size_t>(i) * k;
    const int b = (i % (k / kQuantBlock)) * kQuantBlock;
    switch (i % 5) {
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
      default:  // the largest magnitude twice, both signs (Q4_0 takes the first)
        row[b + 3] = -4.0f;
        row[b + 9] = 4.0f;
        for (int j = 0; j < kQuantBlock; ++j)
          if (j != 3 && j != 9) row[b + j] = 0.25f * static_cast<float>(j % 16) - 2.0f;
        break;
    }
  }
  return x;
}

/// n rows of `type` blocks with random values and sane random F16 scales;
/// Q8_0 values cover -128 .. 127 (a file may hold -128).
std::vector<std::uint8_t> make_w(GgmlType type, int n, int k, std::mt19937& rng) {
  const std::size_t row_bytes = *ggml_row_bytes(static_cast<std::uint32_t>(type), k);
  std::vector<std::uint8_t> w(static_cast<std::size_t>(n) * row_bytes);
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& v : w) v = static_cast<std::uint8_t>(byte(rng));
  std::uniform_real_distribution<float> scale(-0.02f, 0.02f);
  const std::size_t block_bytes = type == GgmlType::q8_0 ? 34 : type == GgmlType::q4_0 ? 18 : 20;
  for (std::size_t at = 0; at < w.size(); at += block_bytes) {
    const std::uint16_t h = f32_to_f16(scale(rng));
    std::memcpy(w.data() + at, &h, 2);
    if (type == GgmlType::q4_1) {  // Q4_1's minimum
      const std::uint16_t m = f32_to_f16(scale(rng) * 8.0f);
      std::memcpy(w.data() + at + 2, &m, 2);
    }
  }
  return w;
}

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

std::vector<QuantKernel> kernels() {
  std::vector<QuantKernel> out{QuantKernel::scalar};
  if (std::string(quant_kernel_name()) == "avx2") out.push_back(QuantKernel::avx2);
  return out;
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
  const std::vector<float> x = make_x(kM, kK, rng);
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

INSTANTIATE_TEST_SUITE_P(Types, QuantLinearTypes, ::testing::Values(GgmlType::q8_0, GgmlType::q4_0, GgmlType::q4_1),
                         [](const ::testing::TestParamInfo<GgmlType>& i) {
                           return ggml_type_name(static_cast<std::uint32_t>(i.param));
                         });

TEST_P(QuantLinearTypes, EveryKernelMatchesTheScalarDefinitionBitForBit) {
  std::mt19937 rng(4002);
  for (const auto& [n, k] : std::vector<std::pair<int, int>>{{37, 256}, {8, 32}, {64, 512}, {3, 96}}) {
    const std::vector<std::uint8_t> w = make_w(GetParam(), n, k, rng);
    auto packed = PackedQuantLinear::pack(GetParam(), w, n, k);
    ASSERT_TRUE(packed.ok()) << packed.error().to_string();
    for (const int m : {1, 3, 4, 5, 9}) {
      const std::vector<float> x = make_x(m, k, rng);
      const std::vector<float> want = reference(x, m, k, GetParam(), w, n);
      for (const QuantKernel kernel : kernels()) {
        const std::string what = std::string(kernel == QuantKernel::avx2 ? "avx2" : "scalar") + " n " +
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
  p.w = make_w(type, n, k, rng);
  auto packed = PackedQuantLinear::pack(type, p.w, n, k);
  EXPECT_TRUE(packed.ok()) << packed.error().to_string();
  if (packed.ok()) p.packed = std::move(packed).value();
  p.x = make_x(m, k, rng);
  return p;
}

TEST_P(QuantLinearTypes, ARowsResultDoesNotDependOnTheBatchOrTheThreads) {
  std::mt19937 rng(4003);
  constexpr int kN = 45, kK = 320, kM = 11;
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

TEST_P(QuantLinearTypes, TheResultIsTheDequantizedProductUpToF32Rounding) {
  std::mt19937 rng(4004);
  constexpr int kN = 24, kK = 512, kM = 6;
  const Problem problem = make_problem(GetParam(), kN, kK, kM, rng);
  const auto& [w, packed, x] = problem;
  const std::vector<float> y = run(x, kM, kK, packed, QuantKernel::automatic);
  std::vector<float> wd(static_cast<std::size_t>(kN) * kK);
  ASSERT_TRUE(dequantize_row(GetParam(), w.data(), wd.data(), static_cast<std::int64_t>(wd.size())).ok());
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

TEST(QuantLinear, BadShapesAndTypesAreRefusedWithAClearError) {
  std::vector<std::uint8_t> w(34 * 4);
  auto q4k = PackedQuantLinear::pack(GgmlType::q4_k, w, 1, 256);
  ASSERT_FALSE(q4k.ok());
  EXPECT_EQ(q4k.error().code, ErrorCode::unsupported);
  EXPECT_NE(q4k.error().message.find("Q4_K"), std::string::npos) << q4k.error().message;
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
