// cuda::paged_attention (label gpu) against cpu::paged_attention on random
// inputs. Without a device every test that needs one skips; the host-side
// argument checks (no CUDA call) run everywhere.
//
// Both sides read the same cache bytes (F32, or BF16 bits), so the tolerance
// is the F32 math one for both dtypes: max |gpu - cpu| / max |cpu| < 1e-5.
// Slots past a sequence's context and blocks no table references hold NaN:
// neither kernel may let them reach an output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/dtype.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cuda/attention.hpp"
#include "kernels/cuda/device.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "tests/kernels/cuda/gpu_test_util.hpp"

namespace shardline::kernels::cuda {
namespace {

using gpu_test::download;
using gpu_test::normalized_error;
using gpu_test::upload;

constexpr double kTol = 1e-5;

#define ASSERT_STATUS_OK(expr)                        \
  do {                                                \
    const Status st_ = (expr);                        \
    ASSERT_TRUE(st_.ok()) << st_.error().to_string(); \
  } while (0)

class CudaAttention : public ::testing::Test {
 protected:
  void SetUp() override {
    const DeviceQuery q = query_devices();
    if (q.devices.empty()) GTEST_SKIP() << "no CUDA device: " << q.error;
  }
};

struct SeqSpec {
  int num_q;
  int context_len;
};

struct Config {
  DType dtype = DType::f32;
  int block_size = 16;
  int kv_heads = 2;
  int group = 4;
  int head_dim = 64;
};

std::string describe(const Config& c) {
  return std::string(dtype_name(c.dtype)) + " bs=" + std::to_string(c.block_size) +
         " kv_heads=" + std::to_string(c.kv_heads) + " group=" + std::to_string(c.group) +
         " head_dim=" + std::to_string(c.head_dim);
}

/// A random batch: host q / cache / block tables, the CPU reference output,
/// and the same data on the device.
class Batch {
 public:
  Batch(const Config& cfg, std::vector<SeqSpec> specs, std::uint32_t seed)
      : cfg_(cfg), specs_(std::move(specs)) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
    const int d = cfg.head_dim, bs = cfg.block_size;
    num_heads_ = cfg.kv_heads * cfg.group;
    row_ = num_heads_ * d;
    q_stride_ = row_ + 8;
    out_stride_ = row_ + 4;
    scale_ = 1.0f / std::sqrt(static_cast<float>(d));
    int rows = 0, blocks = 0;
    for (const SeqSpec& s : specs_) {
      rows += s.num_q;
      blocks += (s.context_len + bs - 1) / bs;
    }
    rows_ = rows;
    num_blocks_ = blocks + 3;  // spare blocks nobody references: NaN
    std::vector<std::int32_t> perm(num_blocks_);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);

    q_.assign(static_cast<std::size_t>(std::max(rows, 1)) * q_stride_, 0.0f);
    for (float& x : q_) x = dist(rng);

    const std::size_t elems = static_cast<std::size_t>(num_blocks_) * cfg.kv_heads * bs * d;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> k(elems, nan), v(elems, nan);
    int next = 0, q_start = 0;
    for (const SeqSpec& s : specs_) {
      const int nb = (s.context_len + bs - 1) / bs;
      table_offsets_.push_back(static_cast<int>(tables_.size()));
      for (int b = 0; b < nb; ++b) tables_.push_back(perm[next++]);
      for (int j = 0; j < s.context_len; ++j) {
        const long blk = tables_[table_offsets_.back() + j / bs], o = j % bs;
        for (int h = 0; h < cfg.kv_heads; ++h) {
          const long slab = (blk * cfg.kv_heads + h) * static_cast<long>(bs) * d;
          for (int i = 0; i < d; ++i) {
            k[slab + static_cast<long>(i) * bs + o] = dist(rng);
            v[slab + o * d + i] = dist(rng);
          }
        }
      }
      host_seqs_.push_back({q_start, s.num_q, s.context_len, nullptr});
      q_start += s.num_q;
    }
    for (std::size_t i = 0; i < host_seqs_.size(); ++i)
      host_seqs_[i].block_table = tables_.data() + table_offsets_[i];
    if (tables_.empty()) tables_.push_back(0);

    cpu::KvCacheLayer host{nullptr, nullptr, cfg.dtype, num_blocks_, bs, cfg.kv_heads, d};
    if (cfg.dtype == DType::bf16) {
      kb_.resize(elems);
      vb_.resize(elems);
      for (std::size_t i = 0; i < elems; ++i) {
        kb_[i] = f32_to_bf16(k[i]);
        vb_[i] = f32_to_bf16(v[i]);
      }
      host.k = kb_.data();
      host.v = vb_.data();
    } else {
      kf_ = std::move(k);
      vf_ = std::move(v);
      host.k = kf_.data();
      host.v = vf_.data();
    }
    cpu_out_.assign(static_cast<std::size_t>(std::max(rows, 1)) * out_stride_, 0.0f);
    cpu::paged_attention(q_.data(), q_stride_, host_seqs_, host, num_heads_, scale_,
                         cpu_out_.data(), out_stride_);
  }

  /// Runs the GPU kernel on the sequences `which` (indices into the batch,
  /// same rows and cache) and returns the whole out buffer.
  std::vector<float> run_gpu(const std::vector<int>& which) {
    if (!uploaded_) upload();
    std::vector<AttentionSeq> seqs;
    int max_q = 0, max_ctx = 0;
    for (int i : which) {
      AttentionSeq s = host_seqs_[i];
      s.block_table = d_tables_.as<std::int32_t>() + table_offsets_[i];
      seqs.push_back(s);
      max_q = std::max(max_q, s.num_q);
      max_ctx = std::max(max_ctx, s.context_len);
    }
    const int n = static_cast<int>(seqs.size());
    Result<DeviceBuffer> d_seqs = DeviceBuffer::from_host(seqs);
    EXPECT_TRUE(d_seqs.ok());
    const std::size_t ws_bytes =
        paged_attention_workspace_bytes(n, num_heads_, cfg_.head_dim, max_ctx);
    Result<DeviceBuffer> ws = DeviceBuffer::allocate(ws_bytes);
    EXPECT_TRUE(ws.ok());
    std::vector<float> zeros(cpu_out_.size(), 0.0f);
    Result<DeviceBuffer> d_out = DeviceBuffer::from_host(zeros);
    EXPECT_TRUE(d_out.ok());
    if (!d_seqs.ok() || !ws.ok() || !d_out.ok()) return {};
    const cpu::KvCacheLayer cache{d_k_.data(), d_v_.data(), cfg_.dtype, num_blocks_,
                                  cfg_.block_size, cfg_.kv_heads, cfg_.head_dim};
    Status st = paged_attention(d_q_.as<float>(), q_stride_, d_seqs->as<AttentionSeq>(), n, max_q,
                                max_ctx, cache, num_heads_, scale_, d_out->as<float>(),
                                out_stride_, ws->data(), ws_bytes, nullptr);
    EXPECT_TRUE(st.ok()) << st.error().to_string();
    st = synchronize(nullptr);
    EXPECT_TRUE(st.ok()) << st.error().to_string();
    Result<std::vector<float>> h = d_out->to_host<float>();
    EXPECT_TRUE(h.ok());
    return h.ok() ? std::move(h).value() : std::vector<float>();
  }

  std::vector<float> run_gpu_all() {
    std::vector<int> all(host_seqs_.size());
    std::iota(all.begin(), all.end(), 0);
    return run_gpu(all);
  }

  /// Rows [q_start, q_start + num_q) of sequence i, out_stride apart.
  std::vector<float> rows_of(const std::vector<float>& out, int i) const {
    const auto b = out.begin() + static_cast<long>(host_seqs_[i].q_start) * out_stride_;
    return {b, b + static_cast<long>(host_seqs_[i].num_q) * out_stride_};
  }

  const std::vector<float>& cpu_out() const { return cpu_out_; }
  int size() const { return static_cast<int>(host_seqs_.size()); }

 private:
  template <class T>
  static DeviceBuffer up(const std::vector<T>& h) {
    Result<DeviceBuffer> b = DeviceBuffer::from_host(h);
    EXPECT_TRUE(b.ok()) << b.error().to_string();
    return b.ok() ? std::move(b).value() : DeviceBuffer();
  }
  void upload() {
    d_q_ = up(q_);
    d_tables_ = up(tables_);
    if (cfg_.dtype == DType::bf16) {
      d_k_ = up(kb_);
      d_v_ = up(vb_);
    } else {
      d_k_ = up(kf_);
      d_v_ = up(vf_);
    }
    uploaded_ = true;
  }

  Config cfg_;
  std::vector<SeqSpec> specs_;
  int num_heads_ = 0, row_ = 0, q_stride_ = 0, out_stride_ = 0, rows_ = 0, num_blocks_ = 0;
  float scale_ = 1.0f;
  std::vector<float> q_, kf_, vf_, cpu_out_;
  std::vector<std::uint16_t> kb_, vb_;
  std::vector<std::int32_t> tables_;
  std::vector<int> table_offsets_;
  std::vector<cpu::AttentionSeq> host_seqs_;
  bool uploaded_ = false;
  DeviceBuffer d_q_, d_tables_, d_k_, d_v_;
};

void expect_matches_cpu(const Config& cfg, const std::vector<SeqSpec>& specs, std::uint32_t seed) {
  Batch b(cfg, specs, seed);
  const std::vector<float> gpu = b.run_gpu_all();
  const double err = normalized_error(gpu, b.cpu_out());
  EXPECT_LT(err, kTol) << describe(cfg);
}

// ---- host-side checks (no device needed) -------------------------------------------

TEST(CudaAttentionArgs, RejectedBeforeAnyLaunchAndEmptyBatchIsOk) {
  // None of these paths makes a CUDA call: they hold with or without a GPU.
  float dummy[4] = {};
  const auto* seqs = reinterpret_cast<const AttentionSeq*>(dummy);  // never dereferenced
  const int d = 64, heads = 8;
  const cpu::KvCacheLayer cache{dummy, dummy, DType::f32, 4, 16, 2, d};
  const int row = heads * d;
  auto call = [&](int num_seqs, int max_q, int max_ctx, const cpu::KvCacheLayer& c, int nh,
                  int qs, int os, void* ws, std::size_t wsb, const AttentionSeq* s = nullptr) {
    return paged_attention(dummy, qs, s ? s : seqs, num_seqs, max_q, max_ctx, c, nh, 0.125f, dummy,
                           os, ws, wsb, nullptr);
  };
  // Empty batch: ok, even with nothing else valid.
  EXPECT_TRUE(paged_attention(nullptr, 0, nullptr, 0, 0, 0, cpu::KvCacheLayer{}, 0, 1.0f, nullptr,
                              0, nullptr, 0, nullptr)
                  .ok());
  EXPECT_TRUE(call(3, 0, 0, cache, heads, row, row, nullptr, 0).ok());  // no query tokens
  const auto code = [](const Status& s) { return s.ok() ? ErrorCode::internal : s.error().code; };
  EXPECT_EQ(code(call(-1, 1, 1, cache, heads, row, row, nullptr, 0)), ErrorCode::invalid_argument);
  EXPECT_EQ(code(call(1, -1, 1, cache, heads, row, row, nullptr, 0)), ErrorCode::invalid_argument);
  cpu::KvCacheLayer f16 = cache;
  f16.dtype = DType::f16;
  EXPECT_EQ(code(call(1, 1, 1, f16, heads, row, row, nullptr, 0)), ErrorCode::unsupported);
  cpu::KvCacheLayer d300 = cache;
  d300.head_dim = 300;
  EXPECT_EQ(code(call(1, 1, 1, d300, heads, 300 * heads, 300 * heads, nullptr, 0)),
            ErrorCode::unsupported);
  cpu::KvCacheLayer bs0 = cache;
  bs0.block_size = 0;
  EXPECT_EQ(code(call(1, 1, 1, bs0, heads, row, row, nullptr, 0)), ErrorCode::invalid_argument);
  EXPECT_EQ(code(call(1, 1, 1, cache, 7, 7 * d, 7 * d, nullptr, 0)), ErrorCode::invalid_argument);
  EXPECT_EQ(code(call(1, 1, 1, cache, heads, row - 1, row, nullptr, 0)),
            ErrorCode::invalid_argument);
  EXPECT_EQ(code(call(1, 1, 1, cache, heads, row, row - 1, nullptr, 0)),
            ErrorCode::invalid_argument);
  EXPECT_EQ(code(call(1, 4, 3, cache, heads, row, row, nullptr, 0)), ErrorCode::invalid_argument);
  EXPECT_EQ(code(call(65536, 1, 1, cache, heads, row, row, nullptr, 0)),
            ErrorCode::invalid_argument);
  cpu::KvCacheLayer null_k = cache;
  null_k.k = nullptr;
  EXPECT_EQ(code(call(1, 1, 1, null_k, heads, row, row, nullptr, 0)), ErrorCode::invalid_argument);
  EXPECT_EQ(code(paged_attention(dummy, row, nullptr, 1, 1, 1, cache, heads, 0.125f, dummy, row,
                                 nullptr, 0, nullptr)),
            ErrorCode::invalid_argument);
  // Long contexts need the split-decode workspace.
  const int ctx = 3 * kDecodeSplitTokens + 1;
  const std::size_t need = paged_attention_workspace_bytes(2, heads, d, ctx);
  EXPECT_EQ(need, 2u * heads * 4u * (d + 2) * sizeof(float));
  EXPECT_EQ(code(call(2, 1, ctx, cache, heads, row, row, nullptr, need)),
            ErrorCode::invalid_argument);
  EXPECT_EQ(code(call(2, 1, ctx, cache, heads, row, row, dummy, need - 4)),
            ErrorCode::invalid_argument);
  EXPECT_EQ(paged_attention_workspace_bytes(5, heads, d, kDecodeSplitTokens), 0u);
  EXPECT_EQ(paged_attention_workspace_bytes(0, heads, d, 8192), 0u);
  EXPECT_TRUE(attention_head_dim_supported(128));
  EXPECT_TRUE(attention_head_dim_supported(96));
  EXPECT_TRUE(attention_head_dim_supported(8));
  EXPECT_FALSE(attention_head_dim_supported(0));
  EXPECT_FALSE(attention_head_dim_supported(257));
}

TEST(CudaAttentionArgs, HarnessReferenceIsFiniteDespiteNaNSlots) {
  // The harness alone (no CUDA call until run_gpu): NaN in the unused slots
  // and blocks must not reach the CPU reference, or every comparison is moot.
  for (DType dtype : {DType::f32, DType::bf16})
    for (int bs : {16, 5, 1}) {
      Batch b({dtype, bs, 2, 4, 64}, {{1, 1}, {5, 37}, {1, 49}, {16, 32}, {1, 1100}}, 3);
      for (float x : b.cpu_out()) ASSERT_TRUE(std::isfinite(x)) << dtype_name(dtype) << " bs=" << bs;
      double max_abs = 0.0;
      for (float x : b.cpu_out()) max_abs = std::max(max_abs, static_cast<double>(std::fabs(x)));
      EXPECT_GT(max_abs, 0.01);
    }
}

// ---- against the CPU ----------------------------------------------------------------

TEST_F(CudaAttention, MatchesCpuOverShapesAndBlockSizes) {
  // One token; a whole prompt; a chunk after cached tokens; decode at and
  // across block boundaries (16: 48 / 49 / 32); a prompt ending on a boundary.
  const std::vector<SeqSpec> specs = {{1, 1},  {7, 7},  {5, 37}, {1, 48},
                                      {1, 49}, {16, 32}, {3, 17}, {1, 80}};
  std::uint32_t seed = 10;
  for (DType dtype : {DType::f32, DType::bf16})
    for (int bs : {16, 1, 5})
      for (int d : {64, 128})
        for (int group : {1, 4, 8}) {
          Config cfg{dtype, bs, 2, group, d};
          SCOPED_TRACE(describe(cfg));
          expect_matches_cpu(cfg, specs, ++seed);
        }
}

TEST_F(CudaAttention, SingleTokenAndSingleSequence) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    expect_matches_cpu({dtype, 16, 1, 1, 128}, {{1, 1}}, 1);
    expect_matches_cpu({dtype, 16, 8, 4, 128}, {{33, 33}}, 2);  // prompt across 3 blocks
    expect_matches_cpu({dtype, 16, 8, 4, 128}, {{2, 16}}, 3);   // context exactly one block
  }
}

// Head dims between the kernel's tiles are zero-padded: stories260K's 8, and
// 80 / 96 / 200 (odd tiles of 32, 128, 256).
TEST_F(CudaAttention, PaddedHeadDims) {
  std::uint32_t seed = 40;
  for (DType dtype : {DType::f32, DType::bf16})
    for (int d : {8, 80, 96, 200}) {
      const Config cfg{dtype, 16, 4, 2, d};
      SCOPED_TRACE(describe(cfg));
      expect_matches_cpu(cfg, {{1, 1}, {7, 7}, {5, 37}, {1, 49}, {1, 600}, {40, 40}}, ++seed);
    }
}

TEST_F(CudaAttention, HeadDim256) {
  for (DType dtype : {DType::f32, DType::bf16})
    expect_matches_cpu({dtype, 16, 2, 4, 256}, {{9, 40}, {1, 700}, {70, 70}}, 4);
}

TEST_F(CudaAttention, PrefillTilesAndLongChunks) {
  // > 64 rows per KV head: several prefill CTAs; a chunk after many cached tokens.
  for (DType dtype : {DType::f32, DType::bf16})
    for (int group : {1, 8})
      expect_matches_cpu({dtype, 16, 2, group, 128}, {{130, 130}, {100, 1000}, {1, 1}}, 5);
}

TEST_F(CudaAttention, LongContextSplitDecode) {
  // 8192: 16 splits; 512 / 513 / 1024: one split exactly, just over, two exactly.
  for (DType dtype : {DType::f32, DType::bf16})
    for (int bs : {16, 5}) {
      const Config cfg{dtype, bs, 2, 4, 128};
      SCOPED_TRACE(describe(cfg));
      expect_matches_cpu(cfg, {{1, 8192}, {1, 512}, {1, 513}, {1, 1024}, {64, 8000}}, 6);
    }
}

TEST_F(CudaAttention, MixedPrefillDecodeBatch) {
  std::mt19937 rng(7);
  std::vector<SeqSpec> specs;
  for (int i = 0; i < 24; ++i) {
    const int ctx = 1 + static_cast<int>(rng() % 1500);
    const int nq = (i % 3 == 0) ? 1 : 1 + static_cast<int>(rng() % std::min(ctx, 90));
    specs.push_back({nq, ctx});
  }
  for (DType dtype : {DType::f32, DType::bf16})
    expect_matches_cpu({dtype, 16, 4, 2, 64}, specs, 8);
}

TEST_F(CudaAttention, BatchInvariantAndDeterministic) {
  // Sequences 0 (long decode: split-K), 1 (prefill chunk) and 2 (short
  // decode), alone and in a batch of 16 whose others are larger (bigger
  // grids, more splits): bit-identical rows.
  std::mt19937 rng(9);
  std::vector<SeqSpec> specs = {{1, 5000}, {40, 900}, {1, 77}};
  while (specs.size() < 16) {
    const int ctx = 1 + static_cast<int>(rng() % 9000);
    specs.push_back({(specs.size() % 2) ? 1 : 1 + static_cast<int>(rng() % std::min(ctx, 200)), ctx});
  }
  for (DType dtype : {DType::f32, DType::bf16}) {
    Batch b({dtype, 16, 2, 4, 128}, specs, 11);
    const std::vector<float> full = b.run_gpu_all();
    EXPECT_LT(normalized_error(full, b.cpu_out()), kTol);
    const std::vector<float> again = b.run_gpu_all();
    EXPECT_EQ(std::memcmp(full.data(), again.data(), full.size() * sizeof(float)), 0)
        << "not deterministic run to run";
    for (int i : {0, 1, 2}) {
      const std::vector<float> alone = b.run_gpu({i});
      const std::vector<float> a = b.rows_of(alone, i), f = b.rows_of(full, i);
      ASSERT_EQ(a.size(), f.size());
      EXPECT_EQ(std::memcmp(a.data(), f.data(), a.size() * sizeof(float)), 0)
          << "sequence " << i << " differs alone vs in a batch of 16 (" << dtype_name(dtype) << ")";
    }
  }
}

}  // namespace
}  // namespace shardline::kernels::cuda
