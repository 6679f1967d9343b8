// CUDA element-wise / row-wise ops and write_kv (label gpu) against the CPU
// kernels on random inputs. Without a device every test that needs one skips;
// the host-side argument checks (no CUDA call) run everywhere.
//
// Tolerances: max |gpu - cpu| / max |cpu| < 1e-5 for the F32 math ops
// (different reduction order, expf / sincosf within a few ulp of libm);
// embedding, add_inplace, the residual of add_rms_norm and write_kv (F32 and
// BF16) must be bit-identical.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cuda/device.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "tests/kernels/cuda/gpu_test_util.hpp"
#include "kernels/cuda/ops.hpp"

namespace shardline::kernels::cuda {
namespace {

using gpu_test::download;
using gpu_test::normalized_error;
using gpu_test::upload;

constexpr float kF32Tol = 1e-5f;

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    const DeviceQuery q = query_devices();
    if (q.devices.empty()) GTEST_SKIP() << "no CUDA device: " << q.error;
  }
};

std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float lo = -2.0f,
                                 float hi = 2.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

template <class T>
void expect_bits_equal(const std::vector<T>& gpu, const std::vector<T>& cpu, const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  std::size_t first = gpu.size(), count = 0;
  for (std::size_t i = 0; i < gpu.size(); ++i)
    if (std::memcmp(&gpu[i], &cpu[i], sizeof(T)) != 0) {
      if (first == gpu.size()) first = i;
      ++count;
    }
  EXPECT_EQ(count, 0u) << what << ": " << count << " elements differ, first at " << first;
}

#define ASSERT_STATUS_OK(expr)                                  \
  do {                                                          \
    const Status st_ = (expr);                                  \
    ASSERT_TRUE(st_.ok()) << st_.error().to_string();           \
  } while (0)

// ---- host-side checks (no device needed) ---------------------------------------

TEST(CudaOpsArgs, RejectedBeforeAnyLaunchAndEmptyWorkIsOk) {
  // No CUDA call is made on these paths, so they hold with or without a GPU.
  EXPECT_EQ(rms_norm(nullptr, 8, nullptr, nullptr, 8, -1, 8, 1e-6f, nullptr).error().code,
            ErrorCode::invalid_argument);
  EXPECT_EQ(rope(nullptr, 1, 8, 1, 7, nullptr, nullptr, nullptr).error().code,
            ErrorCode::invalid_argument);
  cpu::KvCacheLayer f16_cache{nullptr, nullptr, DType::f16, 1, 16, 1, 8};
  EXPECT_EQ(write_kv(nullptr, nullptr, 8, 1, nullptr, f16_cache, nullptr).error().code,
            ErrorCode::unsupported);
  EXPECT_TRUE(rms_norm(nullptr, 8, nullptr, nullptr, 8, 0, 8, 1e-6f, nullptr).ok());
  EXPECT_TRUE(add_rms_norm(nullptr, nullptr, nullptr, nullptr, 0, 8, 1e-6f, nullptr).ok());
  EXPECT_TRUE(add_inplace(nullptr, nullptr, 0, nullptr).ok());
  EXPECT_TRUE(silu_and_mul(nullptr, nullptr, 0, 16, nullptr).ok());
  EXPECT_TRUE(embedding(nullptr, 0, nullptr, DType::bf16, 16, nullptr, nullptr).ok());
  EXPECT_TRUE(rope(nullptr, 0, 8, 1, 8, nullptr, nullptr, nullptr).ok());
  cpu::KvCacheLayer cache{nullptr, nullptr, DType::bf16, 1, 16, 1, 8};
  EXPECT_TRUE(write_kv(nullptr, nullptr, 8, 0, nullptr, cache, nullptr).ok());
  Result<DeviceBuffer> empty = DeviceBuffer::allocate(0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->data(), nullptr);
  EXPECT_EQ(empty->copy_from_host(nullptr, 4).error().code, ErrorCode::invalid_argument);
}

// ---- DeviceBuffer ----------------------------------------------------------------

TEST_F(CudaOps, DeviceBufferRoundTripAndMove) {
  const std::vector<float> h = random_floats(1000, 1);
  DeviceBuffer a = upload(h);
  EXPECT_EQ(a.size_bytes(), h.size() * sizeof(float));
  DeviceBuffer b = std::move(a);
  EXPECT_EQ(a.data(), nullptr);
  expect_bits_equal(download<float>(b), h, "round trip");
  std::vector<float> part(10);
  ASSERT_STATUS_OK(b.copy_to_host(part.data(), 10 * sizeof(float), 990 * sizeof(float)));
  EXPECT_EQ(part[9], h[999]);
  EXPECT_EQ(b.copy_to_host(part.data(), 11 * sizeof(float), 990 * sizeof(float)).error().code,
            ErrorCode::invalid_argument);
  ASSERT_STATUS_OK(b.fill_bytes(0));
  for (float x : download<float>(b)) ASSERT_EQ(x, 0.0f);
}

// ---- embedding ---------------------------------------------------------------------

TEST_F(CudaOps, EmbeddingMatchesCpuExactly) {
  const int vocab = 50, hidden = 200;  // hidden: not a multiple of 32
  const std::vector<float> table_f32 = random_floats(static_cast<std::size_t>(vocab) * hidden, 2);
  std::vector<std::uint16_t> table_bf16(table_f32.size()), table_f16(table_f32.size());
  std::mt19937 rng(3);
  for (std::size_t i = 0; i < table_f32.size(); ++i) {
    table_bf16[i] = f32_to_bf16(table_f32[i]);
    table_f16[i] = static_cast<std::uint16_t>(rng());  // any bits: subnormals, inf, NaN too
  }
  for (int num_tokens : {0, 1, 7, 300}) {
    std::vector<std::int32_t> ids(num_tokens);
    for (int t = 0; t < num_tokens; ++t) ids[t] = static_cast<std::int32_t>(rng() % vocab);
    ids.push_back(0);  // keep the upload non-empty; not passed as a token
    DeviceBuffer d_ids = upload(ids);
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      const void* host_table = dt == DType::f32    ? static_cast<const void*>(table_f32.data())
                               : dt == DType::bf16 ? static_cast<const void*>(table_bf16.data())
                                                   : static_cast<const void*>(table_f16.data());
      std::vector<std::uint8_t> bytes(table_f32.size() * dtype_size(dt));
      std::memcpy(bytes.data(), host_table, bytes.size());
      DeviceBuffer d_table = upload(bytes);
      std::vector<float> want(static_cast<std::size_t>(num_tokens) * hidden);
      cpu::embedding(ids.data(), num_tokens, host_table, dt, hidden, want.data());
      Result<DeviceBuffer> d_out = DeviceBuffer::allocate(want.size() * sizeof(float));
      ASSERT_TRUE(d_out.ok());
      ASSERT_STATUS_OK(embedding(d_ids.as<std::int32_t>(), num_tokens, d_table.data(), dt, hidden,
                                 d_out->as<float>(), nullptr));
      ASSERT_STATUS_OK(synchronize(nullptr));
      expect_bits_equal(download<float>(*d_out), want,
                        std::string("embedding ") + dtype_name(dt) + " tokens=" +
                            std::to_string(num_tokens));
    }
  }
}

// ---- rms_norm ------------------------------------------------------------------------

TEST_F(CudaOps, RmsNormStridedMatchesCpu) {
  const float eps = 1e-6f;
  for (int dim : {1, 7, 128, 1000, 4099}) {
    for (int rows : {0, 1, 5, 33}) {
      const int xs = dim + 5, ys = dim + 3;
      const std::vector<float> x = random_floats(static_cast<std::size_t>(rows) * xs + 1, dim + rows);
      const std::vector<float> w = random_floats(dim, 7 * dim, 0.5f, 1.5f);
      std::vector<float> y_init = random_floats(static_cast<std::size_t>(rows) * ys + 1, 99);
      std::vector<float> want = y_init;
      cpu::rms_norm(x.data(), xs, w.data(), want.data(), ys, rows, dim, eps);
      DeviceBuffer dx = upload(x), dw = upload(w), dy = upload(y_init);
      ASSERT_STATUS_OK(rms_norm(dx.as<float>(), xs, dw.as<float>(), dy.as<float>(), ys, rows, dim,
                                eps, nullptr));
      ASSERT_STATUS_OK(synchronize(nullptr));
      const std::vector<float> got = download<float>(dy);
      EXPECT_LT(normalized_error(got, want), kF32Tol) << "dim=" << dim << " rows=" << rows;
      // Stride gaps untouched.
      for (int r = 0; r < rows; ++r)
        for (int i = dim; i < ys && static_cast<std::size_t>(r) * ys + i < got.size(); ++i)
          ASSERT_EQ(got[static_cast<std::size_t>(r) * ys + i], y_init[static_cast<std::size_t>(r) * ys + i]);
    }
  }
}

TEST_F(CudaOps, RmsNormInPlacePerHeadLikeQwen3QkNorm) {
  const int tokens = 9, heads = 6, head_dim = 128, row_stride = heads * head_dim + 2 * head_dim;
  std::vector<float> x = random_floats(static_cast<std::size_t>(tokens) * row_stride, 11);
  const std::vector<float> w = random_floats(head_dim, 12, 0.5f, 1.5f);
  // Per token, the first `heads` heads of a row: rows = heads with stride head_dim, per token.
  std::vector<float> want = x;
  for (int t = 0; t < tokens; ++t) {
    float* row = want.data() + static_cast<std::size_t>(t) * row_stride;
    cpu::rms_norm(row, head_dim, w.data(), row, head_dim, heads, head_dim, 1e-6f);
  }
  DeviceBuffer dx = upload(x), dw = upload(w);
  for (int t = 0; t < tokens; ++t) {
    float* row = dx.as<float>() + static_cast<std::size_t>(t) * row_stride;
    ASSERT_STATUS_OK(rms_norm(row, head_dim, dw.as<float>(), row, head_dim, heads, head_dim, 1e-6f,
                              nullptr));
  }
  ASSERT_STATUS_OK(synchronize(nullptr));
  const std::vector<float> got = download<float>(dx);
  EXPECT_LT(normalized_error(got, want), kF32Tol);
  for (int t = 0; t < tokens; ++t)  // the heads past `heads` are untouched
    for (int i = heads * head_dim; i < row_stride; ++i)
      ASSERT_EQ(got[static_cast<std::size_t>(t) * row_stride + i], x[static_cast<std::size_t>(t) * row_stride + i]);
}

// rms_norm_heads: one launch for every (token, head), bit-identical to the
// per-token rms_norm launches above (same kernel, same reduction).
TEST_F(CudaOps, RmsNormHeadsEqualsPerTokenRmsNorm) {
  for (int head_dim : {8, 128}) {
    const int tokens = 9, heads = 6, row_stride = heads * head_dim + 2 * head_dim + 3;
    const std::vector<float> x = random_floats(static_cast<std::size_t>(tokens) * row_stride, 13 + head_dim);
    const std::vector<float> w = random_floats(head_dim, 14, 0.5f, 1.5f);
    std::vector<float> want = x;
    for (int t = 0; t < tokens; ++t) {
      float* row = want.data() + static_cast<std::size_t>(t) * row_stride;
      cpu::rms_norm(row, head_dim, w.data(), row, head_dim, heads, head_dim, 1e-6f);
    }
    DeviceBuffer a = upload(x), b = upload(x), dw = upload(w);
    for (int t = 0; t < tokens; ++t) {
      float* row = a.as<float>() + static_cast<std::size_t>(t) * row_stride;
      ASSERT_STATUS_OK(rms_norm(row, head_dim, dw.as<float>(), row, head_dim, heads, head_dim, 1e-6f, nullptr));
    }
    ASSERT_STATUS_OK(rms_norm_heads(b.as<float>(), tokens, row_stride, heads, head_dim, dw.as<float>(), 1e-6f,
                                    nullptr));
    ASSERT_STATUS_OK(synchronize(nullptr));
    const std::vector<float> got = download<float>(b);
    expect_bits_equal(got, download<float>(a), "rms_norm_heads vs rms_norm per token");
    EXPECT_LT(normalized_error(got, want), kF32Tol) << "head_dim " << head_dim;
  }
  EXPECT_EQ(rms_norm_heads(nullptr, 2, 10, 2, 8, nullptr, 1e-6f, nullptr).error().code,
            ErrorCode::invalid_argument);  // row_stride < heads * head_dim
  EXPECT_TRUE(rms_norm_heads(nullptr, 0, 10, 2, 8, nullptr, 1e-6f, nullptr).ok());
}

// rms_norm_rows: the final norm of the logits rows, picked by index (repeats
// allowed), equal to rms_norm of each picked row.
TEST_F(CudaOps, RmsNormRowsPicksRowsByIndex) {
  const int rows = 20, dim = 300, ys = dim + 4;
  const std::vector<float> x = random_floats(static_cast<std::size_t>(rows) * dim, 31);
  const std::vector<float> w = random_floats(dim, 32, 0.5f, 1.5f);
  const std::vector<std::int32_t> picks = {19, 0, 7, 7, 12};
  std::vector<float> want(picks.size() * ys, -5.0f);
  for (std::size_t i = 0; i < picks.size(); ++i)
    cpu::rms_norm(x.data() + static_cast<std::size_t>(picks[i]) * dim, dim, w.data(), want.data() + i * ys, ys, 1,
                  dim, 1e-5f);
  DeviceBuffer dx = upload(x), dw = upload(w), dp = upload(picks), dy = upload(std::vector<float>(want.size(), -5.0f));
  ASSERT_STATUS_OK(rms_norm_rows(dx.as<float>(), dim, dp.as<std::int32_t>(), static_cast<int>(picks.size()),
                                 dw.as<float>(), dy.as<float>(), ys, dim, 1e-5f, nullptr));
  ASSERT_STATUS_OK(synchronize(nullptr));
  const std::vector<float> got = download<float>(dy);
  EXPECT_LT(normalized_error(got, want), kF32Tol);
  for (std::size_t i = 0; i < picks.size(); ++i)  // stride gaps untouched
    for (int c = dim; c < ys; ++c) ASSERT_EQ(got[i * ys + static_cast<std::size_t>(c)], -5.0f);
  EXPECT_EQ(rms_norm_rows(dx.as<float>(), dim, nullptr, 1, dw.as<float>(), dy.as<float>(), ys, dim, 1e-5f, nullptr)
                .error()
                .code,
            ErrorCode::invalid_argument);
}

// add_bias: exactly the CPU linear's `acc + bias[j]` (one F32 add per element).
TEST_F(CudaOps, AddBiasIsExact) {
  for (int rows : {0, 1, 70000}) {  // 70000 > 65535: several launches
    const int n = 96, stride = 100;
    const std::vector<float> y = random_floats(static_cast<std::size_t>(rows) * stride + 1, 41 + rows);
    const std::vector<float> bias = random_floats(n, 42);
    std::vector<float> want = y;
    for (int r = 0; r < rows; ++r)
      for (int j = 0; j < n; ++j) want[static_cast<std::size_t>(r) * stride + j] += bias[j];
    DeviceBuffer dy = upload(y), db = upload(bias);
    ASSERT_STATUS_OK(add_bias(dy.as<float>(), stride, db.as<float>(), rows, n, nullptr));
    ASSERT_STATUS_OK(synchronize(nullptr));
    expect_bits_equal(download<float>(dy), want, "add_bias rows=" + std::to_string(rows));
  }
  EXPECT_EQ(add_bias(nullptr, 5, nullptr, 1, 6, nullptr).error().code, ErrorCode::invalid_argument);
}

TEST_F(CudaOps, RmsNormIsBatchInvariantAndDeterministic) {
  const int dim = 4096, rows = 37;
  const std::vector<float> x = random_floats(static_cast<std::size_t>(rows) * dim, 21);
  const std::vector<float> w = random_floats(dim, 22, 0.5f, 1.5f);
  DeviceBuffer dx = upload(x), dw = upload(w);
  Result<DeviceBuffer> dy = DeviceBuffer::allocate(x.size() * sizeof(float));
  ASSERT_TRUE(dy.ok());
  ASSERT_STATUS_OK(rms_norm(dx.as<float>(), dim, dw.as<float>(), dy->as<float>(), dim, rows, dim,
                            1e-5f, nullptr));
  const std::vector<float> batch = download<float>(*dy);
  for (int r : {0, 17, 36}) {  // each row alone, written at row 0
    ASSERT_STATUS_OK(dy->fill_bytes(0));
    ASSERT_STATUS_OK(rms_norm(dx.as<float>() + static_cast<std::size_t>(r) * dim, dim,
                              dw.as<float>(), dy->as<float>(), dim, 1, dim, 1e-5f, nullptr));
    const std::vector<float> single = download<float>(*dy);
    ASSERT_EQ(std::memcmp(single.data(), batch.data() + static_cast<std::size_t>(r) * dim,
                          sizeof(float) * dim),
              0)
        << "row " << r << " differs alone vs in a batch of " << rows;
  }
  ASSERT_STATUS_OK(rms_norm(dx.as<float>(), dim, dw.as<float>(), dy->as<float>(), dim, rows, dim,
                            1e-5f, nullptr));
  expect_bits_equal(download<float>(*dy), batch, "rms_norm run to run");
}

TEST_F(CudaOps, AddRmsNormMatchesCpu) {
  for (int dim : {64, 1000, 5120}) {
    for (int rows : {0, 1, 9}) {
      const std::size_t n = static_cast<std::size_t>(rows) * dim;
      std::vector<float> res = random_floats(n + 1, 31 + dim), x = random_floats(n + 1, 32 + rows);
      const std::vector<float> w = random_floats(dim, 33, 0.5f, 1.5f);
      std::vector<float> want_res = res, want_y(n + 1, 0.0f);
      cpu::add_rms_norm(want_res.data(), x.data(), w.data(), want_y.data(), rows, dim, 1e-6f);
      DeviceBuffer dres = upload(res), dx = upload(x), dw = upload(w), dy = upload(std::vector<float>(n + 1, 0.0f));
      ASSERT_STATUS_OK(add_rms_norm(dres.as<float>(), dx.as<float>(), dw.as<float>(), dy.as<float>(),
                                    rows, dim, 1e-6f, nullptr));
      ASSERT_STATUS_OK(synchronize(nullptr));
      expect_bits_equal(download<float>(dres), want_res, "add_rms_norm residual");
      EXPECT_LT(normalized_error(download<float>(dy), want_y), kF32Tol) << "dim=" << dim << " rows=" << rows;
    }
  }
}

// ---- element-wise -------------------------------------------------------------------

TEST_F(CudaOps, AddInplaceMatchesCpuExactly) {
  for (long n : {0L, 1L, 1000L, (1L << 24) + 3}) {  // the last one needs the grid-stride loop
    std::vector<float> res = random_floats(static_cast<std::size_t>(n) + 1, 41), x = random_floats(static_cast<std::size_t>(n) + 1, 42);
    std::vector<float> want = res;
    cpu::add_inplace(want.data(), x.data(), n);
    DeviceBuffer dres = upload(res), dx = upload(x);
    ASSERT_STATUS_OK(add_inplace(dres.as<float>(), dx.as<float>(), n, nullptr));
    ASSERT_STATUS_OK(synchronize(nullptr));
    expect_bits_equal(download<float>(dres), want, "add_inplace n=" + std::to_string(n));
  }
}

TEST_F(CudaOps, SiluAndMulMatchesCpu) {
  for (int inter : {1, 300, 2048, 17408}) {
    for (int rows : {0, 1, 13}) {
      const std::size_t n = static_cast<std::size_t>(rows) * inter;
      const std::vector<float> gu = random_floats(2 * n + 1, 51 + inter, -8.0f, 8.0f);
      std::vector<float> want(n + 1, 0.0f);
      cpu::silu_and_mul(gu.data(), want.data(), rows, inter);
      DeviceBuffer dgu = upload(gu), dout = upload(std::vector<float>(n + 1, 0.0f));
      ASSERT_STATUS_OK(silu_and_mul(dgu.as<float>(), dout.as<float>(), rows, inter, nullptr));
      ASSERT_STATUS_OK(synchronize(nullptr));
      EXPECT_LT(normalized_error(download<float>(dout), want), kF32Tol)
          << "inter=" << inter << " rows=" << rows;
    }
  }
}

TEST_F(CudaOps, RopeMatchesCpu) {
  struct Case {
    int head_dim, num_heads, heads_in_row;
    bool llama3;
  };
  for (const Case c : {Case{128, 8, 12, true}, Case{64, 4, 4, false}, Case{128, 2, 3, false}}) {
    for (int tokens : {0, 1, 23}) {
      cpu::RopeParams p;
      p.head_dim = c.head_dim;
      p.theta = c.llama3 ? 500000.0f : 1000000.0f;
      p.llama3_scaling = c.llama3;
      const std::vector<float> inv = cpu::rope_inv_freq(p);
      const int row_stride = c.heads_in_row * c.head_dim + 3;
      std::vector<float> x = random_floats(static_cast<std::size_t>(tokens) * row_stride + 1, 61 + tokens);
      std::mt19937 rng(62);
      std::vector<std::int32_t> pos(tokens + 1, 0);
      for (int t = 0; t < tokens; ++t) pos[t] = t < 3 ? t : static_cast<std::int32_t>(rng() % 32768);
      std::vector<float> want = x;
      cpu::rope(want.data(), tokens, row_stride, c.num_heads, c.head_dim, pos.data(), inv.data());
      DeviceBuffer dx = upload(x), dpos = upload(pos), dinv = upload(inv);
      ASSERT_STATUS_OK(rope(dx.as<float>(), tokens, row_stride, c.num_heads, c.head_dim,
                            dpos.as<std::int32_t>(), dinv.as<float>(), nullptr));
      ASSERT_STATUS_OK(synchronize(nullptr));
      const std::vector<float> got = download<float>(dx);
      EXPECT_LT(normalized_error(got, want), kF32Tol) << "head_dim=" << c.head_dim << " tokens=" << tokens;
      for (int t = 0; t < tokens; ++t)  // heads past num_heads and the stride gap are untouched
        for (int i = c.num_heads * c.head_dim; i < row_stride; ++i)
          ASSERT_EQ(got[static_cast<std::size_t>(t) * row_stride + i], x[static_cast<std::size_t>(t) * row_stride + i]);
    }
  }
}

// ---- write_kv -------------------------------------------------------------------------

/// Writes `slots` through the CPU and the GPU into caches pre-filled with the
/// same garbage bytes and compares the whole caches bit for bit (so skipped
/// tokens and untouched slots are checked too).
void check_write_kv(DType dtype, int num_blocks, int block_size, int kv_heads, int head_dim,
                    const std::vector<std::int32_t>& slots, std::uint32_t seed) {
  const int num_tokens = static_cast<int>(slots.size());
  const int row_stride = kv_heads * head_dim + 5;
  std::vector<float> k = random_floats(static_cast<std::size_t>(num_tokens) * row_stride + 1, seed),
                     v = random_floats(static_cast<std::size_t>(num_tokens) * row_stride + 1, seed + 1);
  if (dtype == DType::bf16 && num_tokens > 0) {
    // Exact ties (round to even, both directions), inf and NaN in the first token.
    const std::uint32_t specials[] = {0x3f808000u, 0x3f818000u, 0xbf808000u, 0x7f800000u,
                                      0xff800000u, 0x7fc00001u, 0x7f800001u, 0x7f7fffffu};
    for (int i = 0; i < 8 && i < kv_heads * head_dim; ++i) {
      k[i] = std::bit_cast<float>(specials[i]);
      v[i] = std::bit_cast<float>(specials[7 - i]);
    }
  }
  const std::size_t elems = static_cast<std::size_t>(num_blocks) * kv_heads * block_size * head_dim;
  const std::size_t bytes = elems * dtype_size(dtype);
  std::vector<std::uint8_t> kc(bytes, 0xAB), vc(bytes, 0xCD);
  cpu::KvCacheLayer host{kc.data(), vc.data(), dtype, num_blocks, block_size, kv_heads, head_dim};
  cpu::write_kv(k.data(), v.data(), row_stride, num_tokens, slots.data(), host);

  std::vector<std::int32_t> slots_up = slots;
  slots_up.push_back(-1);  // non-empty upload
  DeviceBuffer dk = upload(k), dv = upload(v), dslots = upload(slots_up);
  DeviceBuffer dkc = upload(std::vector<std::uint8_t>(bytes, 0xAB));
  DeviceBuffer dvc = upload(std::vector<std::uint8_t>(bytes, 0xCD));
  cpu::KvCacheLayer dev{dkc.data(), dvc.data(), dtype, num_blocks, block_size, kv_heads, head_dim};
  ASSERT_STATUS_OK(write_kv(dk.as<float>(), dv.as<float>(), row_stride, num_tokens,
                            dslots.as<std::int32_t>(), dev, nullptr));
  ASSERT_STATUS_OK(synchronize(nullptr));
  const std::string what = std::string(dtype_name(dtype)) + " bs=" + std::to_string(block_size) +
                           " d=" + std::to_string(head_dim) + " tokens=" + std::to_string(num_tokens);
  expect_bits_equal(download<std::uint8_t>(dkc), kc, "K cache " + what);
  expect_bits_equal(download<std::uint8_t>(dvc), vc, "V cache " + what);
}

TEST_F(CudaOps, WriteKvMatchesCpuLayoutExactly) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (int block_size : {16, 5, 1}) {
      for (int head_dim : {64, 128, 80}) {
        const int num_blocks = 6, kv_heads = 2;
        const int bs = block_size;
        // Block boundaries (first / last offset of blocks, incl. the last slot
        // of the cache), negative slots, out-of-order slots.
        std::vector<std::int32_t> slots = {0,      bs - 1, bs,        -1,         2 * bs - 1,
                                           3 * bs, -7,     num_blocks * bs - 1, 4 * bs + bs / 2,
                                           5 * bs};
        std::vector<std::int32_t> dedup;  // small block sizes repeat slots: keep the first
        for (std::int32_t s : slots)
          if (s < 0 || std::find(dedup.begin(), dedup.end(), s) == dedup.end()) dedup.push_back(s);
        check_write_kv(dtype, num_blocks, block_size, kv_heads, head_dim, dedup, 71 + head_dim);
      }
    }
    // No tokens, all skipped, one token, a full cache in random order.
    check_write_kv(dtype, 3, 16, 4, 128, {}, 81);
    check_write_kv(dtype, 3, 16, 4, 128, {-1, -1, -5}, 82);
    check_write_kv(dtype, 3, 16, 4, 128, {17}, 83);
    std::vector<std::int32_t> all(3 * 16);
    for (int i = 0; i < 48; ++i) all[i] = i;
    std::shuffle(all.begin(), all.end(), std::mt19937(84));
    check_write_kv(dtype, 3, 16, 8, 128, all, 85);
  }
}

}  // namespace
}  // namespace shardline::kernels::cuda
