// The side prefetch stream of issue 17's overlapped step: the queue's
// slices, the runs attention will read, and a GEMM carrying the queue.
#include "kernels/cpu/prefetch.hpp"

#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/linear.hpp"

namespace shardline::kernels::cpu {
namespace kernels_prefetch_test {

TEST(LinePrefetchQueue, EachThreadPopsItsOwnSliceInOrder) {
  std::vector<char> mem(64 * 10);
  LinePrefetchQueue q;
  q.assign({{LineRun{mem.data(), 1}, LineRun{mem.data() + 64, 2}}, {LineRun{mem.data() + 192, 3}}});
  EXPECT_EQ(q.size(), 3u);
  EXPECT_EQ(q.total_lines(), 6u);
  LineRun r;
  ASSERT_TRUE(q.pop(1, r));
  EXPECT_EQ(r.begin, mem.data() + 192);
  EXPECT_FALSE(q.pop(1, r)) << "thread 1's slice is empty";
  ASSERT_TRUE(q.pop(0, r));
  EXPECT_EQ(r.lines, 1);
  EXPECT_EQ(q.runs_left(), 1u);
  EXPECT_FALSE(q.pop(2, r)) << "no slice 2";
  EXPECT_FALSE(q.pop(-1, r));
  ASSERT_TRUE(q.pop(0, r));
  EXPECT_EQ(r.lines, 2);
  EXPECT_EQ(q.runs_left(), 0u);
  q.assign({});
  EXPECT_FALSE(q.pop(0, r));
  EXPECT_EQ(q.size(), 0u);
}

// The runs are exactly the K and V blocks of each sequence's block table
// (all KV heads of a block: one contiguous run each), dealt to the threads in
// paged_attention's order (longest context first), up to max_bytes.
TEST(KvLineRuns, CoverEachSequencesBlocksInAttentionOrderDealtToThreads) {
  constexpr int kBlocks = 32, kBs = 16, kHeads = 3, kHd = 8;
  const std::size_t block_bytes = static_cast<std::size_t>(kHeads) * kBs * kHd * 2;  // BF16
  std::vector<char> k(kBlocks * block_bytes), v(k.size());
  KvCacheLayer cache{k.data(), v.data(), DType::bf16, kBlocks, kBs, kHeads, kHd};
  const std::vector<std::int32_t> t0{5, 9}, t1{2, 30, 7, 1}, t2{11};
  // contexts 20 (2 blocks), 64 (4 blocks), 3 (1 block): attention order 1, 0, 2
  const std::vector<AttentionSeq> seqs{{0, 1, 20, t0.data()}, {1, 1, 64, t1.data()}, {2, 1, 3, t2.data()}};
  const auto slices = kv_line_runs(seqs, cache, 2, 0);
  ASSERT_EQ(slices.size(), 2u);
  const int lines = static_cast<int>(block_bytes / 64);
  auto expect_blocks = [&](const std::vector<LineRun>& runs, std::vector<std::int32_t> blocks) {
    ASSERT_EQ(runs.size(), 2 * blocks.size());
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      EXPECT_EQ(runs[2 * i].begin, k.data() + blocks[i] * block_bytes) << "K of block " << blocks[i];
      EXPECT_EQ(runs[2 * i + 1].begin, v.data() + blocks[i] * block_bytes) << "V of block " << blocks[i];
      EXPECT_EQ(runs[2 * i].lines, lines);
      EXPECT_EQ(runs[2 * i + 1].lines, lines);
    }
  };
  expect_blocks(slices[0], {2, 30, 7, 1, 11});  // sequences 1 and 2 (1st and 3rd in order)
  expect_blocks(slices[1], {5, 9});             // sequence 0 (2nd)
  // A budget of 3 blocks' K and V: the first three blocks of sequence 1.
  const auto capped = kv_line_runs(seqs, cache, 1, 5 * block_bytes);
  ASSERT_EQ(capped.size(), 1u);
  expect_blocks(capped[0], {2, 30, 7});
}

// A GEMM carrying the queue computes the same bits as without it (every
// tile height and thread split), pops thread t's runs only from slice t, up
// to two per register tile, and a second GEMM carrying the same queue goes on
// where the first stopped. (The portable build without AVX ignores the
// queue: it checks the bits only.)
TEST(LinearSidePrefetch, SameBitsAndConsumesTheQueueAcrossGemms) {
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int n = 512, k = 96;  // 8 panels of 64 columns: 4 per thread
  std::vector<char> target(64 * 4096);
  for (const DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    std::vector<float> wf(static_cast<std::size_t>(n) * k);
    for (float& x : wf) x = dist(rng);
    std::vector<std::uint16_t> wb;
    for (float x : wf) wb.push_back(f32_to_bf16(x));
    const auto packed = PackedLinear::pack(dt == DType::f32 ? static_cast<const void*>(wf.data()) : wb.data(),
                                           dt, n, k);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(2);
    for (const int m : {1, 5, 12, 13}) {
      SCOPED_TRACE(testing::Message() << "m=" << m);
      std::vector<float> x(static_cast<std::size_t>(m) * k);
      for (float& e : x) e = dist(rng);
      std::vector<float> plain(static_cast<std::size_t>(m) * n), with_side(plain.size());
      linear(x.data(), m, k, packed, nullptr, plain.data(), n);
      std::vector<std::vector<LineRun>> slices(2);
      for (int t = 0; t < 2; ++t)
        for (int r = 0; r < 10; ++r) slices[t].push_back(LineRun{target.data() + (t * 10 + r) * 64 * 8, 8});
      LinePrefetchQueue q;
      q.assign(slices);
      linear(x.data(), m, k, packed, nullptr, with_side.data(), n, &q);
      EXPECT_EQ(std::memcmp(plain.data(), with_side.data(), plain.size() * sizeof(float)), 0);
      if (m == 1 && linear_uses_side_prefetch()) {
        // one tile per panel: 4 panels x 2 runs = 8 of each thread's 10
        EXPECT_EQ(q.runs_left(), 4u);
        linear(x.data(), m, k, packed, nullptr, with_side.data(), n, &q);
        EXPECT_EQ(q.runs_left(), 0u) << "the second GEMM took the rest";
        EXPECT_EQ(std::memcmp(plain.data(), with_side.data(), plain.size() * sizeof(float)), 0);
      }
    }
    omp_set_num_threads(saved);
  }
}

}  // namespace
}  // namespace shardline::kernels::cpu
