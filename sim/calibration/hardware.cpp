#include "sim/calibration/hardware.hpp"

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "sim/calibration/workload.hpp"
#include "comm/inproc.hpp"
#include "common/dtype.hpp"
#include "kernels/cpu/linear.hpp"
#include "kernels/cpu/quant_linear.hpp"

namespace shardline::sim::calibration {

namespace {

struct FreeDeleter {
  void operator()(float* p) const noexcept { std::free(p); }
};
using AlignedFloats = std::unique_ptr<float[], FreeDeleter>;

AlignedFloats aligned_floats(long n) {
  return AlignedFloats(static_cast<float*>(std::aligned_alloc(64, ((n * 4 + 63) / 64) * 64)));
}

}  // namespace

double measure_triad_bandwidth_gbs(int num_threads, long array_bytes, int repeats) {
  const long n = array_bytes / static_cast<long>(sizeof(float));
  AlignedFloats a = aligned_floats(n), b = aligned_floats(n), c = aligned_floats(n);
  // First touch from the threads that will use the pages.
#pragma omp parallel for num_threads(num_threads) schedule(static)
  for (long i = 0; i < n; ++i) {
    a[i] = 0.0f;
    b[i] = 1.0f;
    c[i] = 2.0f;
  }
  double best = 1e30;
  const float s = 3.0f;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    float* pa = a.get();
    const float* pb = b.get();
    const float* pc = c.get();
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (long i = 0; i < n; ++i) pa[i] = pb[i] + s * pc[i];
    best = std::min(best, seconds_since(t0));
  }
  return 3.0 * static_cast<double>(n) * sizeof(float) / best / 1e9;
}

double measure_copy_bandwidth_gbs(int num_threads, long array_bytes, int repeats) {
  const long n = array_bytes / static_cast<long>(sizeof(float));
  AlignedFloats src = aligned_floats(n), dst = aligned_floats(n);
  const int threads = std::max(1, num_threads);
  const long share = (n + threads - 1) / threads;
  // First touch from the threads that will use the pages.
#pragma omp parallel for num_threads(threads) schedule(static)
  for (long i = 0; i < n; ++i) {
    src[i] = 1.0f;
    dst[i] = 0.0f;
  }
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel for num_threads(threads) schedule(static, 1)
    for (int t = 0; t < threads; ++t) {
      const long begin = std::min(n, t * share), end = std::min(n, begin + share);
      std::memcpy(dst.get() + begin, src.get() + begin, static_cast<std::size_t>(end - begin) * sizeof(float));
    }
    best = std::min(best, seconds_since(t0));
  }
  return static_cast<double>(n) * sizeof(float) / best / 1e9;
}

double measure_sgemm_gflops(int num_threads, int n, int repeats) {
  const long nn = static_cast<long>(n) * n;
  AlignedFloats a = aligned_floats(nn), b = aligned_floats(nn), c = aligned_floats(nn);
  for (long i = 0; i < nn; ++i) {
    a[i] = static_cast<float>((i * 7) % 13) * 0.01f;
    b[i] = static_cast<float>((i * 5) % 11) * 0.01f;
    c[i] = 0.0f;
  }
  openblas_set_num_threads(num_threads);
  // Warm-up (thread start, page faults).
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a.get(), n, b.get(), n, 0.0f,
              c.get(), n);
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a.get(), n, b.get(), n,
                0.0f, c.get(), n);
    best = std::min(best, seconds_since(t0));
  }
  return 2.0 * static_cast<double>(n) * n * n / best / 1e9;
}

/// Shardline's own linear layer on a 2048^3 problem (the GEMM the model runs).
double measure_linear_gflops(int n, int repeats, DType dtype) {
  std::vector<float> w(static_cast<std::size_t>(n) * n), x(w.size()), y(w.size());
  for (std::size_t i = 0; i < w.size(); ++i) {
    w[i] = static_cast<float>((i * 7) % 13) * 0.01f;
    x[i] = static_cast<float>((i * 5) % 11) * 0.01f;
  }
  std::vector<std::uint16_t> wb;  // [n, n] BF16 bits
  if (dtype == DType::bf16)
    for (const float v : w) wb.push_back(f32_to_bf16(v));
  const auto packed = dtype == DType::bf16 ? kernels::cpu::PackedLinear::pack(wb.data(), DType::bf16, n, n)
                                           : kernels::cpu::PackedLinear::pack(w.data(), DType::f32, n, n);
  kernels::cpu::linear(x.data(), n, n, packed, nullptr, y.data(), n);  // warm-up
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    kernels::cpu::linear(x.data(), n, n, packed, nullptr, y.data(), n);
    best = std::min(best, seconds_since(t0));
  }
  return 2.0 * n * static_cast<double>(n) * n / best / 1e9;
}

double measure_quant_linear_gflops(kernels::GgmlType type, int n, int repeats) {
  const auto row_bytes = kernels::ggml_row_bytes(static_cast<std::uint32_t>(type), n);
  if (!row_bytes) return 0.0;
  // Valid blocks of any type: bytes from a fixed pattern, with the F16
  // scales (d at byte 0, or 208 for Q6_K; Q4_1's m / Q4_K's dmin at 2) set
  // to 2^-10 so that no value is NaN or infinite.
  const auto traits = *kernels::ggml_type_traits(static_cast<std::uint32_t>(type));
  std::vector<std::uint8_t> blocks(static_cast<std::size_t>(n) * *row_bytes);
  for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<std::uint8_t>((i * 73 + 11) % 251);
  const std::uint16_t scale = f32_to_f16(1.0f / 1024.0f);
  for (std::size_t at = 0; at < blocks.size(); at += static_cast<std::size_t>(traits.type_size)) {
    std::memcpy(blocks.data() + at + (type == kernels::GgmlType::q6_k ? 208 : 0), &scale, 2);
    if (type == kernels::GgmlType::q4_1 || type == kernels::GgmlType::q4_k) std::memcpy(blocks.data() + at + 2, &scale, 2);
  }
  auto packed = kernels::cpu::PackedQuantLinear::pack(type, blocks, n, n);
  if (!packed.ok()) return 0.0;
  std::vector<float> x(static_cast<std::size_t>(n) * n), y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 5) % 11) * 0.01f - 0.05f;
  if (!kernels::cpu::quant_linear(x.data(), n, n, *packed, y.data(), n).ok()) return 0.0;  // warm-up
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    (void)kernels::cpu::quant_linear(x.data(), n, n, *packed, y.data(), n);
    best = std::min(best, seconds_since(t0));
  }
  return 2.0 * n * static_cast<double>(n) * n / best / 1e9;
}

namespace {

/// FLOPs of `iters` rounds of 12 independent register FMAs / dot products
/// on one thread (the values stay finite: tiny increments). The inner loops
/// must be unrolled: an array of accumulators left in memory runs at a third
/// of the peak (store-to-load forwarding, measured).
double fma_loop_flops(long iters, DType dtype, float* sink) {
  constexpr int kAcc = 12;  // enough independent chains to cover the FMA latency
#if defined(__AVX512F__)
  __m512 acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
#if defined(__AVX512BF16__)
  if (dtype == DType::bf16) {
    const __m512i a = _mm512_set1_epi32(0x3c003c00), b = _mm512_set1_epi32(0x3c003c00);  // pairs of 2^-7
    for (long it = 0; it < iters; ++it)
#pragma GCC unroll 12
      for (int i = 0; i < kAcc; ++i)
        acc[i] = _mm512_dpbf16_ps(acc[i], reinterpret_cast<__m512bh>(a), reinterpret_cast<__m512bh>(b));
    float s = 0;
    for (int i = 0; i < kAcc; ++i) s += _mm512_reduce_add_ps(acc[i]);
    *sink = s;
    return 64.0 * kAcc * static_cast<double>(iters);
  }
#endif
  (void)dtype;
  const __m512 a = _mm512_set1_ps(1e-7f), b = _mm512_set1_ps(1e-7f);
  for (long it = 0; it < iters; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_fmadd_ps(a, b, acc[i]);
  float s = 0;
  for (int i = 0; i < kAcc; ++i) s += _mm512_reduce_add_ps(acc[i]);
  *sink = s;
  return 32.0 * kAcc * static_cast<double>(iters);
#elif defined(__AVX2__) && defined(__FMA__)
  (void)dtype;
  __m256 acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 a = _mm256_set1_ps(1e-7f), b = _mm256_set1_ps(1e-7f);
  for (long it = 0; it < iters; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < kAcc; ++i) acc[i] = _mm256_fmadd_ps(a, b, acc[i]);
  alignas(32) float lanes[8];
  float s = 0;
  for (int i = 0; i < kAcc; ++i) {
    _mm256_store_ps(lanes, acc[i]);
    for (float v : lanes) s += v;
  }
  *sink = s;
  return 16.0 * kAcc * static_cast<double>(iters);
#else
  (void)dtype;
  float acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = static_cast<float>(i);
  for (long it = 0; it < iters; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < kAcc; ++i) acc[i] = std::fma(1e-7f, 1e-7f, acc[i]);
  float s = 0;
  for (float v : acc) s += v;
  *sink = s;
  return 2.0 * kAcc * static_cast<double>(iters);
#endif
}

}  // namespace

double measure_fma_peak_gflops(int num_threads, DType dtype, int repeats) {
  constexpr long kIters = 20'000'000;  // ~0.1 s per thread at the peak
  double best = 0;
  std::vector<float> sinks(static_cast<std::size_t>(std::max(1, num_threads)));
  for (int r = 0; r < repeats; ++r) {
    double flops = 0;
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(num_threads) reduction(+ : flops)
    flops += fma_loop_flops(kIters, dtype, &sinks[static_cast<std::size_t>(omp_get_thread_num())]);
    best = std::max(best, flops / seconds_since(t0) / 1e9);
  }
  return best;
}

namespace {

/// Seconds of `repeats` all-reduces of `count` floats on `num_ranks` threads, per call (rank 0's view).
std::vector<double> time_allreduce(int num_ranks, std::size_t count, int repeats) {
  auto group = comm::InProcGroup::create(num_ranks).value();
  std::vector<std::unique_ptr<comm::Communicator>> comms;
  for (int r = 0; r < num_ranks; ++r) comms.push_back(group->communicator(r).value());
  std::vector<double> times;
  std::vector<std::thread> threads;
  for (int r = 0; r < num_ranks; ++r) {
    threads.emplace_back([&, r] {
      std::vector<float> buf(count, 1.0f);
      (void)comms[static_cast<std::size_t>(r)]->all_reduce_sum(buf.data(), count);  // warm-up
      for (int i = 0; i < repeats; ++i) {
        (void)comms[static_cast<std::size_t>(r)]->barrier();
        const auto t0 = std::chrono::steady_clock::now();
        (void)comms[static_cast<std::size_t>(r)]->all_reduce_sum(buf.data(), count);
        if (r == 0) times.push_back(seconds_since(t0));
      }
    });
  }
  for (auto& t : threads) t.join();
  return times;
}

}  // namespace

double measure_inproc_allreduce_bytes_per_s(int num_ranks, long bytes, int repeats) {
  const std::vector<double> t = time_allreduce(num_ranks, static_cast<std::size_t>(bytes) / sizeof(float), repeats);
  const double best = *std::min_element(t.begin(), t.end());
  return 2.0 * (num_ranks - 1) / num_ranks * static_cast<double>(bytes) / best;
}

double measure_inproc_allreduce_latency_s(int num_ranks, int repeats) {
  std::vector<double> t = time_allreduce(num_ranks, 1, repeats);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace shardline::sim::calibration
