#pragma once
/// \file
/// Private to kernels/cpu/attention.cpp: paged_attention's SIMD paths, each
/// in its own file compiled for its own instructions whatever the build
/// machine (kernels/CMakeLists.txt), so that attention.cpp picks one at run
/// time (AttentionKernel). Both do the same float operations per (query
/// token, head) in the same order (attention_avx512.cpp's order comment),
/// so their outputs are bit-identical; the portable path in attention.cpp
/// keeps a plain order of its own (close, not bit-identical).

#include <span>

#include "kernels/cpu/attention.hpp"

namespace shardline::kernels::cpu::detail {

/// paged_attention() with 16-wide AVX-512 (F, BW, VL) vectors and FMA; same
/// arguments and contract. The cache dtype must already be checked (F32 or
/// BF16). Only on a CPU with those instructions.
void paged_attention_avx512(const float* q, int q_stride, std::span<const AttentionSeq> seqs,
                            const KvCacheLayer& cache, int num_heads, float scale, float* out, int out_stride);

/// paged_attention() with 8-wide AVX2 vectors and FMA; same arguments,
/// contract and bits as paged_attention_avx512. Only on a CPU with AVX2 and
/// FMA.
void paged_attention_avx2(const float* q, int q_stride, std::span<const AttentionSeq> seqs,
                          const KvCacheLayer& cache, int num_heads, float scale, float* out, int out_stride);

}  // namespace shardline::kernels::cpu::detail
