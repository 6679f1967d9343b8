// kernels::dequantize_row against llama.cpp's reference as the `gguf` PyPI
// package implements it (tests/kernels/ggml_quants_oracle.py), bit for bit,
// for every type a GGUF file of the common kinds holds (F32, F16, BF16,
// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K). The
// blocks are random bytes with their scales set to edge values in turn: zero,
// the smallest and largest F16 subnormals, the largest finite F16, negative
// scales, and (Q8_K's F32 scale) F32 subnormals and the largest float.
// NaN compares equal to NaN (both sides compute the same NaN, but a payload
// is not a value); every other element must have the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/ggml_quants.hpp"
#include "tests/support/python.hpp"

namespace shardline::kernels {
namespace kernels_ggml_quants_test {

struct TypeCase {
  GgmlType type;
  std::vector<int> half_scale_offsets;  // byte offsets of F16 scale fields in a block
  int f32_scale_offset = -1;            // Q8_K's F32 d
};

const std::vector<TypeCase> kCases = {
    {GgmlType::f32, {}},        {GgmlType::f16, {}},        {GgmlType::bf16, {}},
    {GgmlType::q4_0, {0}},      {GgmlType::q4_1, {0, 2}},   {GgmlType::q5_0, {0}},
    {GgmlType::q5_1, {0, 2}},   {GgmlType::q8_0, {0}},      {GgmlType::q2_k, {80, 82}},
    {GgmlType::q3_k, {108}},    {GgmlType::q4_k, {0, 2}},   {GgmlType::q5_k, {0, 2}},
    {GgmlType::q6_k, {208}},    {GgmlType::q8_k, {}, 0},
};

// F16 bit patterns: 0, -0, smallest subnormal, largest subnormal, smallest
// normal, 1, -1, 0.5, largest finite, its negative.
const std::vector<std::uint16_t> kEdgeHalves = {0x0000, 0x8000, 0x0001, 0x03FF, 0x0400,
                                                0x3C00, 0xBC00, 0x3800, 0x7BFF, 0xFBFF};
const std::vector<float> kEdgeFloats = {0.0f, -0.0f, 1.4e-45f, 1.1754942e-38f, 1.0f, -3.5f, 3.4028235e38f, 1e-20f};

std::string type_name(GgmlType t) { return ggml_type_name(static_cast<std::uint32_t>(t)); }

/// Random blocks of `c.type`; block b's scales take edge values in turn.
std::vector<std::uint8_t> random_blocks(const TypeCase& c, int num_blocks, std::mt19937& rng) {
  const auto traits = *ggml_type_traits(static_cast<std::uint32_t>(c.type));
  std::vector<std::uint8_t> data(static_cast<std::size_t>(num_blocks) * traits.type_size);
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : data) b = static_cast<std::uint8_t>(byte(rng));
  for (int b = 0; b < num_blocks; ++b) {
    std::uint8_t* block = data.data() + static_cast<std::size_t>(b) * traits.type_size;
    for (std::size_t k = 0; k < c.half_scale_offsets.size(); ++k) {
      // Half the blocks keep random scales; the others cycle through the edges.
      if (b % 2 == 0) {
        const std::uint16_t h = kEdgeHalves[(b / 2 + k * 3) % kEdgeHalves.size()];
        std::memcpy(block + c.half_scale_offsets[k], &h, 2);
      }
    }
    if (c.f32_scale_offset >= 0) {
      float f = kEdgeFloats[b % kEdgeFloats.size()];
      if (b % 3 == 2) f = std::ldexp(static_cast<float>(byte(rng) - 128), byte(rng) % 60 - 30);
      std::memcpy(block + c.f32_scale_offset, &f, 4);
    }
  }
  if (c.type == GgmlType::f16) {  // plant the edge values among the random halves
    for (std::size_t i = 0; i < kEdgeHalves.size(); ++i) std::memcpy(data.data() + 2 * i, &kEdgeHalves[i], 2);
  }
  if (c.type == GgmlType::f32) {
    for (std::size_t i = 0; i < kEdgeFloats.size(); ++i) std::memcpy(data.data() + 4 * i, &kEdgeFloats[i], 4);
  }
  return data;
}

TEST(GgmlQuants, EveryTypeDequantizesBitForBitLikeTheGgufPackage) {
  const std::string problem = testing_support::python_env_problem("gguf, numpy");
  ASSERT_TRUE(problem.empty()) << problem;
  const auto dir = std::filesystem::temp_directory_path() / ("shardline_ggml_quants_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::mt19937 rng(20261129);
  std::vector<std::vector<float>> ours;
  std::string names;
  for (const TypeCase& c : kCases) {
    const auto traits = *ggml_type_traits(static_cast<std::uint32_t>(c.type));
    const int num_blocks = traits.block_size == 1 ? 4096 : 64;
    const auto data = random_blocks(c, num_blocks, rng);
    std::ofstream(dir / (type_name(c.type) + ".bin"), std::ios::binary)
        .write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
    std::vector<float> out(static_cast<std::size_t>(num_blocks) * traits.block_size);
    ASSERT_TRUE(dequantize_row(c.type, data.data(), out.data(), static_cast<std::int64_t>(out.size())).ok())
        << type_name(c.type);
    ours.push_back(std::move(out));
    names += " " + type_name(c.type);
  }
  const auto r = testing_support::run_command(testing_support::kPython + " " + SHARDLINE_SOURCE_DIR +
                                              "/tests/kernels/ggml_quants_oracle.py " + dir.string() + names);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  for (std::size_t k = 0; k < kCases.size(); ++k) {
    const std::string name = type_name(kCases[k].type);
    std::ifstream in(dir / (name + ".f32"), std::ios::binary);
    std::vector<float> want(ours[k].size());
    in.read(reinterpret_cast<char*>(want.data()), static_cast<std::streamsize>(want.size() * 4));
    ASSERT_EQ(in.gcount(), static_cast<std::streamsize>(want.size() * 4)) << name << ": the oracle wrote too little";
    int mismatches = 0, finite = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      const float a = ours[k][i], b = want[i];
      if (std::isnan(a) && std::isnan(b)) continue;
      if (std::isfinite(a)) ++finite;
      std::uint32_t ua, ub;
      std::memcpy(&ua, &a, 4);
      std::memcpy(&ub, &b, 4);
      if (ua != ub && ++mismatches <= 5)
        ADD_FAILURE() << name << " element " << i << " (block " << i / ggml_type_traits(static_cast<std::uint32_t>(kCases[k].type))->block_size
                      << "): ours " << a << " (0x" << std::hex << ua << "), gguf " << b << " (0x" << ub << std::dec << ")";
    }
    EXPECT_EQ(mismatches, 0) << name;
    EXPECT_GT(finite, static_cast<int>(want.size() / 2)) << name << ": too few finite values to test anything";
  }
  std::filesystem::remove_all(dir);
}

TEST(GgmlQuants, RowBytesAndErrors) {
  EXPECT_EQ(ggml_row_bytes(static_cast<std::uint32_t>(GgmlType::q4_k), 512), std::optional<std::size_t>(288));
  EXPECT_EQ(ggml_row_bytes(static_cast<std::uint32_t>(GgmlType::q8_0), 64), std::optional<std::size_t>(68));
  EXPECT_EQ(ggml_row_bytes(static_cast<std::uint32_t>(GgmlType::f16), 3), std::optional<std::size_t>(6));
  EXPECT_FALSE(ggml_row_bytes(static_cast<std::uint32_t>(GgmlType::q4_k), 100).has_value());
  EXPECT_FALSE(ggml_row_bytes(17, 256).has_value()) << "IQ2_XS is not a type this build knows";
  EXPECT_EQ(ggml_type_name(17), "type 17");
  EXPECT_EQ(ggml_type_name(14), "Q6_K");
  std::vector<std::uint8_t> block(36);
  std::vector<float> out(32);
  const Status q81 = dequantize_row(GgmlType::q8_1, block.data(), out.data(), 32);
  ASSERT_FALSE(q81.ok());
  EXPECT_EQ(q81.error().code, ErrorCode::unsupported);
  EXPECT_NE(q81.error().message.find("Q8_1"), std::string::npos) << q81.error().message;
  const Status partial = dequantize_row(GgmlType::q4_0, block.data(), out.data(), 31);
  ASSERT_FALSE(partial.ok());
  EXPECT_EQ(partial.error().code, ErrorCode::invalid_argument);
}

}  // namespace
}  // namespace shardline::kernels
