#include "kernels/cpu/attention.hpp"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <bit>
#include <cstring>
#include <limits>
#include <string>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "common/dtype.hpp"
#include "tests/kernels/simd_order_reference.hpp"

namespace shardline::kernels::cpu {
namespace kernels_attention_test {

/// K/V values as the cache holds them: BF16-rounded for a BF16 cache.
std::vector<float> as_stored(std::vector<float> x, DType dtype) {
  if (dtype == DType::bf16)
    for (float& e : x) e = bf16_to_f32(f32_to_bf16(e));
  return x;
}

/// A paged cache with blocks handed out in shuffled order, plus the dense
/// K/V/Q of every sequence for the reference.
struct Fixture {
  int block_size, num_heads, num_kv_heads, head_dim;
  DType dtype;
  // F32: K [num_blocks, hkv, d, block_size] (transposed), V [num_blocks, hkv, block_size, d]
  std::vector<float> k_cache, v_cache;
  std::vector<std::uint16_t> k_bf16, v_bf16;  // BF16: same shape
  KvCacheLayer cache;
  std::vector<int> free_blocks;
  std::mt19937 rng{42};

  Fixture(int bs, int heads, int kv_heads, int d, int num_blocks, DType dt = DType::f32)
      : block_size(bs), num_heads(heads), num_kv_heads(kv_heads), head_dim(d), dtype(dt) {
    const std::size_t n = static_cast<std::size_t>(num_blocks) * kv_heads * bs * d;
    // unwritten slots must never be read: NaN
    if (dt == DType::bf16) {
      k_bf16.assign(n, 0x7fc0);
      v_bf16.assign(n, 0x7fc0);
      cache = {k_bf16.data(), v_bf16.data(), dt, num_blocks, bs, kv_heads, d};
    } else {
      k_cache.assign(n, std::nanf(""));
      v_cache.assign(n, std::nanf(""));
      cache = {k_cache.data(), v_cache.data(), dt, num_blocks, bs, kv_heads, d};
    }
    free_blocks.resize(num_blocks);
    std::iota(free_blocks.begin(), free_blocks.end(), 0);
    std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
  }

  [[nodiscard]] std::vector<float> randn(std::size_t n) {
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(rng);
    return v;
  }

  [[nodiscard]] std::vector<std::int32_t> alloc_table(int tokens) {
    std::vector<std::int32_t> table;
    for (int b = 0; b < (tokens + block_size - 1) / block_size; ++b) {
      table.push_back(free_blocks.back());
      free_blocks.pop_back();
    }
    return table;
  }

  /// Writes tokens [t0, t1) of a sequence (dense rows k, v: [tokens, hkv * d]).
  void write(const std::vector<float>& k, const std::vector<float>& v,
             const std::vector<std::int32_t>& table, int t0, int t1) {
    const int row = num_kv_heads * head_dim;
    std::vector<std::int32_t> slots;
    for (int t = t0; t < t1; ++t) slots.push_back(table[t / block_size] * block_size + t % block_size);
    write_kv(k.data() + static_cast<std::size_t>(t0) * row, v.data() + static_cast<std::size_t>(t0) * row,
             row, t1 - t0, slots.data(), cache);
  }
};

/// Dense causal GQA attention in double for query token at position p.
std::vector<double> reference(const Fixture& f, const float* q, const std::vector<float>& k,
                              const std::vector<float>& v, int p, float scale) {
  const int d = f.head_dim, group = f.num_heads / f.num_kv_heads, row = f.num_kv_heads * d;
  std::vector<double> out(static_cast<std::size_t>(f.num_heads) * d, 0.0);
  for (int h = 0; h < f.num_heads; ++h) {
    const int kh = h / group;
    std::vector<double> s(p + 1);
    for (int j = 0; j <= p; ++j) {
      double dot = 0;
      for (int i = 0; i < d; ++i) dot += static_cast<double>(q[h * d + i]) * k[j * row + kh * d + i];
      s[j] = dot * scale;
    }
    const double mx = *std::max_element(s.begin(), s.end());
    double sum = 0;
    for (auto& x : s) sum += (x = std::exp(x - mx));
    for (int j = 0; j <= p; ++j)
      for (int i = 0; i < d; ++i) out[h * d + i] += s[j] / sum * v[j * row + kh * d + i];
  }
  return out;
}

/// Every instruction path of paged_attention this CPU can run (the SIMD
/// ones are compiled whatever the build machine and chosen at run time).
std::vector<AttentionKernel> runnable_kernels() {
  std::vector<AttentionKernel> out;
  for (AttentionKernel k : {AttentionKernel::portable, AttentionKernel::avx2, AttentionKernel::avx512})
    if (attention_kernel_supported(k)) out.push_back(k);
  return out;
}

/// The SIMD paths this CPU can run: both follow the order below, bit for bit.
std::vector<AttentionKernel> simd_kernels() {
  std::vector<AttentionKernel> out;
  for (AttentionKernel k : {AttentionKernel::avx2, AttentionKernel::avx512})
    if (attention_kernel_supported(k)) out.push_back(k);
  return out;
}

/// Output of query head h of one token at position p in the documented order
/// of the SIMD paths (attention_avx512.cpp): 8 score chains and their tree, 16-lane
/// max / sums reduced like GCC's _mm512_reduce_{max,add}_ps, even / odd PV
/// chains. k, v: dense rows [pos, kv_heads * d] as stored.
std::vector<float> order_reference(const float* q, const std::vector<float>& k,
                                   const std::vector<float>& v, int row, int kh, int d, int p,
                                   float scale) {
  const int n = p + 1, nt = (n + 15) / 16;
  std::vector<float> s(static_cast<std::size_t>(nt) * 16, 0.0f);
  for (int j = 0; j < n; ++j) {
    float a[8] = {};
    for (int i = 0; i < d; ++i) a[i % 8] = std::fma(q[i], k[j * row + kh * d + i], a[i % 8]);
    const float t = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
    s[j] = testing_order::opaque(t * scale);
  }
  using testing_order::exp_lane, testing_order::max_lane, testing_order::reduce16;
  float lane[16];
  std::fill(lane, lane + 16, -std::numeric_limits<float>::infinity());
  for (int j = 0; j < nt * 16; ++j)
    lane[j % 16] = max_lane(lane[j % 16], j < n ? s[j] : -std::numeric_limits<float>::infinity());
  const float m = reduce16(lane, max_lane);
  std::fill(lane, lane + 16, 0.0f);
  for (int j = 0; j < nt * 16; ++j) {
    const float e = j < n ? exp_lane(s[j] - m) : 0.0f;
    s[j] = e;
    lane[j % 16] = lane[j % 16] + e;
  }
  const float inv = 1.0f / reduce16(lane, [](float a, float b) { return a + b; });
  std::vector<float> out(d);
  for (int c = 0; c < d; ++c) {
    float a = 0.0f, b = 0.0f;
    for (int j = 0; j < n; ++j) {
      float& acc = j % 2 ? b : a;
      acc = std::fma(s[j], v[j * row + kh * d + c], acc);
    }
    out[c] = (a + b) * inv;
  }
  return out;
}

struct Shape {
  int block_size, heads, kv_heads, head_dim;
};

class PagedAttentionTest : public ::testing::TestWithParam<std::tuple<Shape, DType>> {};

// The reference uses the K/V as stored (BF16-rounded for a BF16 cache), so the
// tolerance is the same for both dtypes.
TEST_P(PagedAttentionTest, MatchesDenseCausalGqa) {
  const auto [sh, dtype] = GetParam();
  Fixture f(sh.block_size, sh.heads, sh.kv_heads, sh.head_dim, 256, dtype);
  const int row = sh.kv_heads * sh.head_dim, qrow = sh.heads * sh.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(sh.head_dim));
  // (context_len, num_q): prefill from 0, chunk mid-prompt, decode steps.
  const std::pair<int, int> specs[] = {{37, 37}, {50, 13}, {17, 1}, {33, 1}, {5, 5}};
  struct Seq {
    std::vector<float> k, v, q;
    std::vector<std::int32_t> table;
  };
  std::vector<Seq> seqs;
  std::vector<AttentionSeq> batch;
  int rows = 0;
  for (auto [ctx, nq] : specs) {
    Seq s{f.randn(static_cast<std::size_t>(ctx) * row), f.randn(static_cast<std::size_t>(ctx) * row),
          f.randn(static_cast<std::size_t>(nq) * qrow), f.alloc_table(ctx)};
    f.write(s.k, s.v, s.table, 0, ctx);
    seqs.push_back(std::move(s));
    batch.push_back({rows, nq, ctx, nullptr});
    rows += nq;
  }
  const int q_stride = qrow + 7, out_stride = qrow + 3;
  std::vector<float> q(static_cast<std::size_t>(rows) * q_stride), out(static_cast<std::size_t>(rows) * out_stride);
  for (std::size_t s = 0; s < seqs.size(); ++s) {
    batch[s].block_table = seqs[s].table.data();
    for (int i = 0; i < batch[s].num_q; ++i)
      std::copy_n(&seqs[s].q[i * qrow], qrow, &q[(batch[s].q_start + i) * q_stride]);
  }
  for (const AttentionKernel kernel : runnable_kernels()) {
    SCOPED_TRACE(attention_kernel_name(kernel));
    std::fill(out.begin(), out.end(), std::nanf(""));
    paged_attention(q.data(), q_stride, batch, f.cache, sh.heads, scale, out.data(), out_stride, kernel);
    for (std::size_t s = 0; s < seqs.size(); ++s)
      for (int i = 0; i < batch[s].num_q; ++i) {
        const int p = batch[s].context_len - batch[s].num_q + i;
        const auto ref = reference(f, &seqs[s].q[i * qrow], as_stored(seqs[s].k, dtype),
                                   as_stored(seqs[s].v, dtype), p, scale);
        const float* o = &out[(batch[s].q_start + i) * out_stride];
        for (int e = 0; e < qrow; ++e) ASSERT_NEAR(o[e], ref[e], 2e-5) << "seq " << s << " q " << i << " e " << e;
      }
  }
}

TEST_P(PagedAttentionTest, ChunkingInvariantBitExact) {
  const auto [sh, dtype] = GetParam();
  const int prompt = 37, row = sh.kv_heads * sh.head_dim, qrow = sh.heads * sh.head_dim;
  const float scale = 0.125f;
  Fixture f(sh.block_size, sh.heads, sh.kv_heads, sh.head_dim, 64, dtype);
  const auto k = f.randn(static_cast<std::size_t>(prompt) * row), v = f.randn(k.size());
  const auto q = f.randn(static_cast<std::size_t>(prompt) * qrow);

  // Runs the prompt in the given chunks on a fresh table; returns [prompt, qrow].
  auto run = [&](const std::vector<int>& chunks) {
    const auto table = f.alloc_table(prompt);
    std::vector<float> out(static_cast<std::size_t>(prompt) * qrow);
    int done = 0;
    for (int c : chunks) {
      f.write(k, v, table, done, done + c);
      const AttentionSeq seq{0, c, done + c, table.data()};
      paged_attention(q.data() + static_cast<std::size_t>(done) * qrow, qrow, {&seq, 1}, f.cache,
                      sh.heads, scale, out.data() + static_cast<std::size_t>(done) * qrow, qrow);
      done += c;
    }
    return out;
  };
  const auto whole = run({prompt});
  const auto chunked = run({5, 16, 16});
  const auto tokenwise = run(std::vector<int>(prompt, 1));
  for (int t = 0; t < prompt; ++t) {
    EXPECT_EQ(std::memcmp(&whole[t * qrow], &chunked[t * qrow], sizeof(float) * qrow), 0) << t;
    EXPECT_EQ(std::memcmp(&whole[t * qrow], &tokenwise[t * qrow], sizeof(float) * qrow), 0) << t;
  }
}

// The AVX-512 and AVX2 paths give the same bits: both must match the scalar
// emulation of their documented order, on whichever of them is compiled
// here; prefill chunks and decode steps, scores spread wide enough (scale 6)
// that exp underflows to denormals and 0.
TEST_P(PagedAttentionTest, MatchesSimdOrderBitExact) {
  if (simd_kernels().empty()) GTEST_SKIP() << "this CPU has neither AVX2+FMA nor AVX-512: no SIMD path to check";
  const auto [sh, dtype] = GetParam();
  Fixture f(sh.block_size, sh.heads, sh.kv_heads, sh.head_dim, 256, dtype);
  const int row = sh.kv_heads * sh.head_dim, qrow = sh.heads * sh.head_dim, d = sh.head_dim;
  const int group = sh.heads / sh.kv_heads;
  const std::pair<int, int> specs[] = {{37, 37}, {50, 13}, {33, 1}, {100, 1}};
  for (const float scale : {0.125f, 6.0f}) {
    for (auto [ctx, nq] : specs) {
      SCOPED_TRACE(testing::Message() << "scale " << scale << " ctx " << ctx << " nq " << nq);
      const auto k = f.randn(static_cast<std::size_t>(ctx) * row), v = f.randn(k.size());
      const auto q = f.randn(static_cast<std::size_t>(nq) * qrow);
      const auto table = f.alloc_table(ctx);
      f.write(k, v, table, 0, ctx);
      const AttentionSeq seq{0, nq, ctx, table.data()};
      const auto ks = as_stored(k, dtype), vs = as_stored(v, dtype);
      for (const AttentionKernel kernel : simd_kernels()) {
        SCOPED_TRACE(attention_kernel_name(kernel));
        std::vector<float> out(q.size());
        paged_attention(q.data(), qrow, {&seq, 1}, f.cache, sh.heads, scale, out.data(), qrow, kernel);
        for (int i = 0; i < nq; ++i)
          for (int h = 0; h < sh.heads; ++h) {
            const std::size_t at = static_cast<std::size_t>(i) * qrow + static_cast<std::size_t>(h) * d;
            const auto ref = order_reference(&q[at], ks, vs, row, h / group, d, ctx - nq + i, scale);
            ASSERT_EQ(std::memcmp(&out[at], ref.data(), sizeof(float) * d), 0) << "q " << i << " head " << h;
          }
      }
      for (std::int32_t b : table) f.free_blocks.push_back(b);
    }
  }
}

// A decode token's output must not depend on the batch: decode items take all
// KV heads of a sequence (or slices of them, with few sequences or threads),
// and must match a lone decode, at 1 or more threads, and a prefill of the
// same token.
TEST_P(PagedAttentionTest, DecodeBatchInvariantBitExact) {
  const auto [sh, dtype] = GetParam();
  const int row = sh.kv_heads * sh.head_dim, qrow = sh.heads * sh.head_dim;
  const int ctxs[] = {1, 16, 17, 40, 64, 5, 33, 48, 3, 70, 31, 2, 100, 9, 47, 21, 80, 12, 64, 1};
  const int nseq = static_cast<int>(std::size(ctxs));
  Fixture f(sh.block_size, sh.heads, sh.kv_heads, sh.head_dim, 512, dtype);
  const float scale = 0.3f;
  std::vector<std::vector<float>> ks, vs;
  std::vector<std::vector<std::int32_t>> tables;
  std::vector<AttentionSeq> batch;
  for (int s = 0; s < nseq; ++s) {
    ks.push_back(f.randn(static_cast<std::size_t>(ctxs[s]) * row));
    vs.push_back(f.randn(ks.back().size()));
    tables.push_back(f.alloc_table(ctxs[s]));
    f.write(ks[s], vs[s], tables[s], 0, ctxs[s]);
    batch.push_back({s, 1, ctxs[s], tables[s].data()});
  }
  const auto q = f.randn(static_cast<std::size_t>(nseq) * qrow);
  std::vector<float> batched(q.size()), alone(q.size()), one_thread(q.size());
  paged_attention(q.data(), qrow, batch, f.cache, sh.heads, scale, batched.data(), qrow);
  for (int s = 0; s < nseq; ++s) {
    const AttentionSeq seq{0, 1, ctxs[s], tables[s].data()};
    paged_attention(q.data() + static_cast<std::size_t>(s) * qrow, qrow, {&seq, 1}, f.cache, sh.heads,
                    scale, alone.data() + static_cast<std::size_t>(s) * qrow, qrow);
  }
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  paged_attention(q.data(), qrow, batch, f.cache, sh.heads, scale, one_thread.data(), qrow);
  omp_set_num_threads(threads);
  EXPECT_EQ(std::memcmp(batched.data(), alone.data(), sizeof(float) * q.size()), 0);
  EXPECT_EQ(std::memcmp(batched.data(), one_thread.data(), sizeof(float) * q.size()), 0);

  // The last token of sequence 4 as part of a prefill of its whole prompt.
  const int s = 4, ctx = ctxs[s];
  std::vector<float> qp(static_cast<std::size_t>(ctx) * qrow, 0.5f), outp(qp.size());
  std::copy_n(&q[static_cast<std::size_t>(s) * qrow], qrow, &qp[static_cast<std::size_t>(ctx - 1) * qrow]);
  const AttentionSeq pre{0, ctx, ctx, tables[s].data()};
  paged_attention(qp.data(), qrow, {&pre, 1}, f.cache, sh.heads, scale, outp.data(), qrow);
  EXPECT_EQ(std::memcmp(&outp[static_cast<std::size_t>(ctx - 1) * qrow], &batched[static_cast<std::size_t>(s) * qrow],
                        sizeof(float) * qrow), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, PagedAttentionTest,
    ::testing::Combine(::testing::Values(Shape{16, 4, 2, 8}, Shape{4, 4, 2, 8}, Shape{16, 12, 12, 64},
                                         Shape{4, 6, 2, 64}, Shape{16, 8, 2, 128}, Shape{4, 4, 1, 128},
                                         Shape{16, 2, 2, 24}, Shape{32, 8, 8, 64},
                                         Shape{8, 6, 3, 32}, Shape{12, 4, 2, 40}, Shape{48, 4, 4, 64},
                                         Shape{16, 4, 4, 20}),
                       ::testing::Values(DType::f32, DType::bf16)),
    [](const auto& info) {
      const Shape sh = std::get<0>(info.param);
      return "bs" + std::to_string(sh.block_size) + "_h" + std::to_string(sh.heads) + "_kv" +
             std::to_string(sh.kv_heads) + "_d" + std::to_string(sh.head_dim) + "_" +
             dtype_name(std::get<1>(info.param));
    });

TEST(PagedAttention, LongContextDecode) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    Fixture f(16, 8, 2, 128, 70, dtype);
    const int ctx = 1000, row = 2 * 128, qrow = 8 * 128;
    const auto k = f.randn(static_cast<std::size_t>(ctx) * row), v = f.randn(k.size());
    const auto q = f.randn(qrow);
    const auto table = f.alloc_table(ctx);
    f.write(k, v, table, 0, ctx);
    std::vector<float> out(qrow);
    const AttentionSeq seq{0, 1, ctx, table.data()};
    const float scale = 1.0f / std::sqrt(128.0f);
    paged_attention(q.data(), qrow, {&seq, 1}, f.cache, 8, scale, out.data(), qrow);
    const auto ref = reference(f, q.data(), as_stored(k, dtype), as_stored(v, dtype), ctx - 1, scale);
    for (int e = 0; e < qrow; ++e) ASSERT_NEAR(out[e], ref[e], 1e-5) << dtype_name(dtype) << " " << e;
  }
}

// BF16 vs F32 KV cache on the same data: the outputs differ by no more than the
// exact (double) attention moves when K/V are rounded to BF16, plus the F32
// kernel error of each side.
TEST(PagedAttention, Bf16CacheCloseToF32) {
  const int bs = 16, heads = 8, kv_heads = 2, d = 64, ctx = 300;
  const int row = kv_heads * d, qrow = heads * d;
  Fixture f32(bs, heads, kv_heads, d, 32, DType::f32), bf(bs, heads, kv_heads, d, 32, DType::bf16);
  const auto k = f32.randn(static_cast<std::size_t>(ctx) * row), v = f32.randn(k.size());
  const auto q = f32.randn(static_cast<std::size_t>(4) * qrow);
  const auto table = f32.alloc_table(ctx);
  f32.write(k, v, table, 0, ctx);
  bf.write(k, v, table, 0, ctx);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  // the last 4 tokens as a prefill chunk, then the last one as a decode step
  for (int nq : {4, 1}) {
    const AttentionSeq seq{0, nq, ctx, table.data()};
    const float* qs = q.data() + static_cast<std::size_t>(4 - nq) * qrow;
    std::vector<float> out_f(static_cast<std::size_t>(nq) * qrow), out_b(out_f.size());
    paged_attention(qs, qrow, {&seq, 1}, f32.cache, heads, scale, out_f.data(), qrow);
    paged_attention(qs, qrow, {&seq, 1}, bf.cache, heads, scale, out_b.data(), qrow);
    double max_diff = 0;
    for (int i = 0; i < nq; ++i) {
      const int p = ctx - nq + i;
      const auto ref_f = reference(f32, qs + static_cast<std::size_t>(i) * qrow, k, v, p, scale);
      const auto ref_b = reference(f32, qs + static_cast<std::size_t>(i) * qrow, as_stored(k, DType::bf16),
                                   as_stored(v, DType::bf16), p, scale);
      for (int e = 0; e < qrow; ++e) {
        const double diff = std::abs(static_cast<double>(out_b[i * qrow + e]) - out_f[i * qrow + e]);
        max_diff = std::max(max_diff, diff);
        ASSERT_LE(diff, std::abs(ref_b[e] - ref_f[e]) + 4e-5) << "nq " << nq << " q " << i << " e " << e;
      }
    }
    // BF16 keeps 8 significand bits: outputs of size ~0.1 move by ~1e-3, not more.
    EXPECT_LT(max_diff, 1e-2);
    EXPECT_GT(max_diff, 0.0);  // the cache really is BF16
  }
}

// BF16 cache: each element is f32_to_bf16 of its input (round to nearest
// even, NaN kept), vector body and masked tail (head_dim 24) alike.
TEST(WriteKv, Bf16RoundsToNearestEven) {
  Fixture f(4, 2, 2, 24, 2, DType::bf16);
  std::vector<float> k = f.randn(2 * 48), v = f.randn(2 * 48);
  const float special[] = {1.0f + 0x1p-8f,  // tie, even below: rounds down
                           1.0f + 0x3p-8f,  // tie, odd below: rounds up
                           1.0f + 0x1p-8f + 0x1p-20f, -3.0e38f, 3.4e38f, 1e-40f, -0.0f,
                           std::numeric_limits<float>::infinity(), std::nanf(""),
                           std::bit_cast<float>(0x7f800001u)};
  for (std::size_t i = 0; i < std::size(special); ++i) {
    k[i] = special[i];
    v[46 - i] = special[i];  // head 1, some in the masked tail
  }
  const std::int32_t slots[] = {6, 1};  // block 1 offset 2; block 0 offset 1
  write_kv(k.data(), v.data(), 48, 2, slots, f.cache);
  for (int t = 0; t < 2; ++t)
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 24; ++i) {
        const int block = slots[t] / 4, off = slots[t] % 4;
        const std::size_t slab = (static_cast<std::size_t>(block) * 2 + h) * 4 * 24;
        const std::size_t kdst = slab + static_cast<std::size_t>(i) * 4 + off;  // K: [i][offset]
        const std::size_t vdst = slab + static_cast<std::size_t>(off) * 24 + i;  // V: [offset][i]
        const std::size_t src = static_cast<std::size_t>(t) * 48 + h * 24 + i;
        EXPECT_EQ(f.k_bf16[kdst], f32_to_bf16(k[src])) << t << " " << h << " " << i;
        EXPECT_EQ(f.v_bf16[vdst], f32_to_bf16(v[src])) << t << " " << h << " " << i;
      }
  EXPECT_EQ(f32_to_bf16(special[0]), 0x3f80);
  EXPECT_EQ(f32_to_bf16(special[1]), 0x3f82);
  int written = 0;
  for (std::uint16_t x : f.k_bf16) written += x != 0x7fc0;
  EXPECT_GE(written, 2 * 2 * 24 - 2);  // all but the NaN inputs (same bits)
}

TEST(WriteKv, NegativeSlotSkipped) {
  Fixture f(4, 2, 1, 8, 2);
  const auto k = f.randn(16), v = f.randn(16);
  const std::int32_t slots[] = {5, -1};
  write_kv(k.data(), v.data(), 8, 2, slots, f.cache);
  // slot 5 = block 1, offset 1 -> K [1, 0, :, 1], V [1, 0, 1, :]
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(f.k_cache[32 + i * 4 + 1], k[i]);
    EXPECT_EQ(f.v_cache[(4 + 1) * 8 + i], v[i]);
  }
  int written = 0;
  for (float x : f.k_cache) written += !std::isnan(x);
  EXPECT_EQ(written, 8);
}

}  // namespace
}  // namespace shardline::kernels::cpu
