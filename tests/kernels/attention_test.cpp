#include "kernels/cpu/attention.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

namespace shardline::kernels::cpu {
namespace {

/// A paged cache with blocks handed out in shuffled order, plus the dense
/// K/V/Q of every sequence for the reference.
struct Fixture {
  int block_size, num_heads, num_kv_heads, head_dim;
  std::vector<float> k_cache, v_cache;  // [num_blocks, hkv, block_size, d]
  KvCacheLayer cache;
  std::vector<int> free_blocks;
  std::mt19937 rng{42};

  Fixture(int bs, int heads, int kv_heads, int d, int num_blocks)
      : block_size(bs), num_heads(heads), num_kv_heads(kv_heads), head_dim(d) {
    const std::size_t n = static_cast<std::size_t>(num_blocks) * kv_heads * bs * d;
    k_cache.assign(n, std::nanf(""));  // unwritten slots must never be read
    v_cache.assign(n, std::nanf(""));
    cache = {k_cache.data(), v_cache.data(), DType::f32, num_blocks, bs, kv_heads, d};
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

struct Shape {
  int block_size, heads, kv_heads, head_dim;
};

class PagedAttentionTest : public ::testing::TestWithParam<Shape> {};

TEST_P(PagedAttentionTest, MatchesDenseCausalGqa) {
  const Shape sh = GetParam();
  Fixture f(sh.block_size, sh.heads, sh.kv_heads, sh.head_dim, 256);
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
  paged_attention(q.data(), q_stride, batch, f.cache, sh.heads, scale, out.data(), out_stride);
  for (std::size_t s = 0; s < seqs.size(); ++s)
    for (int i = 0; i < batch[s].num_q; ++i) {
      const int p = batch[s].context_len - batch[s].num_q + i;
      const auto ref = reference(f, &seqs[s].q[i * qrow], seqs[s].k, seqs[s].v, p, scale);
      const float* o = &out[(batch[s].q_start + i) * out_stride];
      for (int e = 0; e < qrow; ++e) ASSERT_NEAR(o[e], ref[e], 2e-5) << "seq " << s << " q " << i << " e " << e;
    }
}

TEST_P(PagedAttentionTest, ChunkingInvariantBitExact) {
  const Shape sh = GetParam();
  const int prompt = 37, row = sh.kv_heads * sh.head_dim, qrow = sh.heads * sh.head_dim;
  const float scale = 0.125f;
  Fixture f(sh.block_size, sh.heads, sh.kv_heads, sh.head_dim, 64);
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

INSTANTIATE_TEST_SUITE_P(Shapes, PagedAttentionTest,
                         ::testing::Values(Shape{16, 4, 2, 8}, Shape{4, 4, 2, 8}, Shape{16, 12, 12, 64},
                                           Shape{4, 6, 2, 64}, Shape{16, 8, 2, 128},
                                           Shape{4, 4, 1, 128}, Shape{16, 2, 2, 24}));

TEST(PagedAttention, LongContextDecode) {
  Fixture f(16, 8, 2, 128, 70);
  const int ctx = 1000, row = 2 * 128, qrow = 8 * 128;
  const auto k = f.randn(static_cast<std::size_t>(ctx) * row), v = f.randn(k.size());
  const auto q = f.randn(qrow);
  const auto table = f.alloc_table(ctx);
  f.write(k, v, table, 0, ctx);
  std::vector<float> out(qrow);
  const AttentionSeq seq{0, 1, ctx, table.data()};
  const float scale = 1.0f / std::sqrt(128.0f);
  paged_attention(q.data(), qrow, {&seq, 1}, f.cache, 8, scale, out.data(), qrow);
  const auto ref = reference(f, q.data(), k, v, ctx - 1, scale);
  for (int e = 0; e < qrow; ++e) ASSERT_NEAR(out[e], ref[e], 1e-5) << e;
}

TEST(WriteKv, NegativeSlotSkipped) {
  Fixture f(4, 2, 1, 8, 2);
  const auto k = f.randn(16), v = f.randn(16);
  const std::int32_t slots[] = {5, -1};
  write_kv(k.data(), v.data(), 8, 2, slots, f.cache);
  // slot 5 = block 1, offset 1 -> [1, 0, 1, :]
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(f.k_cache[(4 + 1) * 8 + i], k[i]);
    EXPECT_EQ(f.v_cache[(4 + 1) * 8 + i], v[i]);
  }
  int written = 0;
  for (float x : f.k_cache) written += !std::isnan(x);
  EXPECT_EQ(written, 8);
}

}  // namespace
}  // namespace shardline::kernels::cpu
