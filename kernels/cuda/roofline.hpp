#pragma once
/// \file
/// Roofline probes for benchmarks: the device-memory bandwidth and the dense
/// GEMM throughput the current device actually reaches, measured with CUDA
/// events on a private stream (the two ceilings of a roofline / cost model).
///
/// Plain C++ header (no cuda_runtime.h). Each probe allocates its own device
/// buffers, runs one untimed warm-up, then times `iters` runs one by one
/// (one event pair around each, synchronised after each) and returns the
/// median, so a stray slow run (clock ramp, another process) does not move
/// it. Both synchronise the device's work on their own stream only; they are
/// meant for benchmark set-up, not for the serving path.
///
/// Errors: invalid_argument (sizes <= 0, iters < 1), unsupported (dtype),
/// out_of_memory (buffers), internal (any other CUDA / cuBLAS failure, e.g. no
/// device, with the runtime's message).

#include <cstddef>

#include "common/dtype.hpp"
#include "common/result.hpp"

namespace shardline::kernels::cuda {

/// Device-to-device copy bandwidth in GB/s (1e9 bytes per second): the median
/// over `iters` cudaMemcpyAsync of `bytes` between two device buffers,
/// counting bytes read plus bytes written (2 * bytes per copy), as HBM sees
/// them. Use a size well above the L2 cache (e.g. 1 GiB on an H100, whose
/// L2 is 50 MiB) to measure HBM rather than L2.
[[nodiscard]] Result<double> measure_d2d_bandwidth_gbs(std::size_t bytes, int iters);

/// Dense GEMM throughput in TFLOPS (1e12 FLOP/s, 2 * m * n * k FLOP per
/// GEMM): the median over `iters` runs of y[m, n] = a[m, k] · w[n, k]^T with
/// a and w of `dtype` and an F32 y. BF16 / F16: cuBLASLt tensor cores with
/// FP32 accumulation (GemmContext::linear_lowp, the fast-mode GEMM without
/// the activation cast); F32: cuBLASLt FP32 (no TF32; GemmContext::linear
/// fast). Inputs are pseudo-random values in [-1, 1) (not zeros, which
/// would flatter the tensor cores' power draw).
[[nodiscard]] Result<double> measure_gemm_tflops(DType dtype, int m, int n, int k, int iters);

}  // namespace shardline::kernels::cuda
