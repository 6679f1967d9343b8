#include "bench/hardware.hpp"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>

namespace shardline::bench {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

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

}  // namespace shardline::bench
