// kernels/cpu/weight_linear.hpp: a packed weight copied elsewhere as its
// parts (what a SiDP owner exposes and WaS fetches) and viewed there
// computes the same bits as the weight it was copied from, dense, quantized
// or a stack of quantized parts; views of bad part lists are refused.
#include "kernels/cpu/weight_linear.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "common/memory.hpp"
#include "tests/support/ggml_blocks.hpp"

namespace shardline::kernels::cpu {
namespace kernels_weight_linear_test {

/// The parts of `w` copied into one fresh region, each at a 64-byte
/// aligned offset, and their descriptions pointing into it.
struct Copy {
  AlignedBuffer region;
  std::vector<PackedPart> parts;
};

Copy copy_parts(const PackedWeight& w) {
  Copy c;
  std::size_t bytes = 0;
  for (const PackedPart& p : w.parts()) bytes = (bytes + 63) / 64 * 64 + p.bytes;
  c.region = allocate_aligned(bytes);
  auto* base = static_cast<std::byte*>(c.region.get());
  std::size_t at = 0;
  for (PackedPart p : w.parts()) {
    at = (at + 63) / 64 * 64;
    std::memcpy(base + at, p.data, p.bytes);
    p.data = base + at;
    c.parts.push_back(p);
    at += p.bytes;
  }
  return c;
}

std::vector<float> random_x(int m, int k) {
  std::mt19937 g(11);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(m) * k);
  for (float& v : x) v = d(g);
  return x;
}

/// y = x W^T for the weight and for a view of its copied parts: the same
/// bits.
void expect_view_computes_the_same(const PackedWeight& w, const std::string& format) {
  ASSERT_EQ(w.format_name(), format);
  const Copy c = copy_parts(w);
  auto v = PackedWeight::view(c.parts);
  ASSERT_TRUE(v.ok()) << v.error().to_string();
  EXPECT_EQ(v->format_name(), format);
  EXPECT_EQ(v->out_features(), w.out_features());
  EXPECT_EQ(v->bytes(), w.bytes());
  const int m = 5, k = w.in_features(), n = w.out_features();
  const std::vector<float> x = random_x(m, k);
  std::vector<float> want(static_cast<std::size_t>(m) * n), got(want.size());
  linear(x.data(), m, k, w, nullptr, want.data(), n);
  linear(x.data(), m, k, *v, nullptr, got.data(), n);
  EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float))) << format;
}

PackedQuantLinear pack_random(GgmlType type, int rows, int cols, std::mt19937& rng) {
  const std::vector<std::uint8_t> blocks = testing_support::random_ggml_blocks(type, rows, cols, rng);
  auto p = PackedQuantLinear::pack(type, blocks, rows, cols);
  EXPECT_TRUE(p.ok()) << p.error().to_string();
  return std::move(p).value();
}

TEST(PackedWeightView, DenseQuantizedAndStackedPartsComputeTheSameBitsElsewhere) {
  std::mt19937 rng(5);
  std::vector<float> dense(static_cast<std::size_t>(24) * 256);
  std::uniform_real_distribution<float> d(-0.5f, 0.5f);
  for (float& v : dense) v = d(rng);
  expect_view_computes_the_same(PackedWeight(PackedLinear::pack(dense.data(), DType::f32, 24, 256)), "F32");
  expect_view_computes_the_same(PackedWeight(pack_random(GgmlType::q4_1, 20, 256, rng)), "Q4_1");
  PackedQuantStack stack;  // a Q4_K_M fused matrix: Q4_K rows over Q6_K rows
  stack.parts.push_back(pack_random(GgmlType::q4_k, 16, 256, rng));
  stack.parts.push_back(pack_random(GgmlType::q6_k, 12, 256, rng));
  expect_view_computes_the_same(PackedWeight(std::move(stack)), "Q4_K+Q6_K");
}

TEST(PackedWeightView, BadPartListsAreRefusedByWhatIsWrong) {
  std::mt19937 rng(6);
  const PackedWeight q(pack_random(GgmlType::q8_0, 8, 64, rng));
  const Copy c = copy_parts(q);
  auto refused = [](std::vector<PackedPart> parts, const std::string& says) {
    auto v = PackedWeight::view(parts);
    ASSERT_FALSE(v.ok()) << says;
    EXPECT_NE(v.error().message.find(says), std::string::npos) << v.error().message;
  };
  refused({}, "no parts");
  PackedPart short_part = c.parts[0];
  short_part.bytes -= 1;
  refused({short_part}, "bytes for a part that packs into");
  PackedPart misaligned = c.parts[0];
  misaligned.data += 8;
  refused({misaligned}, "not 64-byte aligned");
  PackedPart other_cols = c.parts[0];
  other_cols.cols = 32;
  other_cols.bytes = *packed_part_bytes(DType::f32, GgmlType::q8_0, 8, 32);
  refused({c.parts[0], other_cols}, "unequal in_features");
  PackedPart dense_part{DType::f32, std::nullopt, 8, 64, *packed_part_bytes(DType::f32, std::nullopt, 8, 64),
                        c.parts[0].data};
  refused({c.parts[0], dense_part}, "a dense part in a stack");
  PackedPart f16 = dense_part;
  f16.dtype = DType::f16;
  refused({f16}, "a dense part of F16");
  PackedPart odd_k = c.parts[0];
  odd_k.cols = 48;
  auto v = PackedWeight::view(std::vector<PackedPart>{odd_k});
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.error().code, ErrorCode::invalid_argument) << v.error().message;
}

}  // namespace kernels_weight_linear_test
}  // namespace shardline::kernels::cpu
