#pragma once
/// \file
/// Private to kernels/cpu/attention.cpp: the AVX2+FMA path of
/// paged_attention, for CPUs without AVX-512 (AMD Zen 2/3). It does the same
/// float operations per (query token, head) in the same order as the AVX-512
/// path (see the order comment in attention.cpp), so outputs are bit-identical
/// across the two instruction sets.

#include <span>

#include "kernels/cpu/attention.hpp"

#if !(defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)) && \
    defined(__AVX2__) && defined(__FMA__)
#define SHARDLINE_ATTENTION_AVX2 1

namespace shardline::kernels::cpu::detail {

/// paged_attention() with 8-wide vectors; same arguments and contract. The
/// cache dtype must already be checked (F32 or BF16).
void paged_attention_avx2(const float* q, int q_stride, std::span<const AttentionSeq> seqs,
                          const KvCacheLayer& cache, int num_heads, float scale, float* out,
                          int out_stride);

}  // namespace shardline::kernels::cpu::detail
#endif
