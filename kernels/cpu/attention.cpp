#include "kernels/cpu/attention.hpp"

#include "kernels/cpu/attention_paths.hpp"
#include "kernels/cpu/kernel_paths.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

// paged_attention's three instruction paths (AttentionKernel): the AVX-512
// and AVX2 ones (attention_avx512.cpp, attention_avx2.cpp; the order of their
// float operations is described in attention_avx512.cpp: the same bits on
// both) and the portable one below, which keeps a plain order of its own
// (one FMA chain per score, std::exp, sequential sums): close, not
// bit-identical. The KV layout is attention.hpp's.

namespace shardline::kernels::cpu {
namespace {

using bf16_t = std::uint16_t;  ///< BF16 bits, as stored in a BF16 KV cache

// ---- the portable path ----

/// Widens the K (transposed = true) or V rows of positions 0..npos-1 of one
/// KV head to F32: [npos, head_dim].
template <typename T>
void gather_rows(const T* base, const KvCacheLayer& c, const std::int32_t* table, int kv_head,
                 int npos, bool transposed, std::vector<float>& dst) {
  const int d = c.head_dim, bs = c.block_size;
  dst.resize(static_cast<std::size_t>(npos) * d);
  for (int j = 0; j < npos; ++j) {
    const long block = table[j / bs];
    const T* slab = base + (block * c.num_kv_heads + kv_head) * static_cast<long>(bs) * d;
    for (int i = 0; i < d; ++i) {
      const T x = transposed ? slab[static_cast<long>(i) * bs + j % bs] : slab[static_cast<long>(j % bs) * d + i];
      if constexpr (sizeof(T) == 2)
        dst[static_cast<std::size_t>(j) * d + i] = bf16_to_f32(x);
      else
        dst[static_cast<std::size_t>(j) * d + i] = x;
    }
  }
}

/// Same three passes, scalar. k, v: [npos, head_dim].
void attend_scalar(const float* q, int head_dim, int group, float scale, const float* k,
                   const float* v, int npos, float* scores, float* out) {
  for (int g = 0; g < group; ++g) {
    const float* qg = q + g * head_dim;
    float* s = scores + static_cast<long>(g) * npos;
    float mx = -std::numeric_limits<float>::infinity();
    for (int j = 0; j < npos; ++j) {
      const float* kj = k + static_cast<long>(j) * head_dim;
      float acc = 0.0f;
      for (int i = 0; i < head_dim; ++i) acc = std::fma(qg[i], kj[i], acc);
      s[j] = acc * scale;
      mx = std::max(mx, s[j]);
    }
    float sum = 0.0f;
    for (int j = 0; j < npos; ++j) sum += (s[j] = std::exp(s[j] - mx));
    float* o = out + g * head_dim;
    std::fill(o, o + head_dim, 0.0f);
    for (int j = 0; j < npos; ++j) {
      const float* vj = v + static_cast<long>(j) * head_dim;
      for (int i = 0; i < head_dim; ++i) o[i] = std::fma(s[j], vj[i], o[i]);
    }
    const float inv = 1.0f / sum;
    for (int i = 0; i < head_dim; ++i) o[i] *= inv;
  }
}

template <typename T>
void paged_attention_scalar(const float* q, int q_stride, std::span<const AttentionSeq> seqs,
                            const KvCacheLayer& cache, int group, float scale, float* out,
                            int out_stride) {
  const int hkv = cache.num_kv_heads, d = cache.head_dim;
  // Work item w -> (sequence, query index, kv head) through a prefix sum.
  std::vector<long> first(seqs.size() + 1, 0);  // [num_seqs + 1]
  for (std::size_t s = 0; s < seqs.size(); ++s)
    first[s + 1] = first[s] + static_cast<long>(seqs[s].num_q) * hkv;
  const long items = first.back();
#pragma omp parallel if (items > 1)
  {
    std::vector<float> krows, vrows;  // [npos, d]
    std::vector<float> scores;        // [group, npos]
#pragma omp for schedule(dynamic, 1)
    for (long w = 0; w < items; ++w) {
      const auto s = static_cast<std::size_t>(
          std::upper_bound(first.begin(), first.end(), w) - first.begin() - 1);
      const AttentionSeq& seq = seqs[s];
      const long local = w - first[s];
      const int i = static_cast<int>(local / hkv), kh = static_cast<int>(local % hkv);
      const int npos = seq.context_len - seq.num_q + i + 1;  // causal: positions 0..p
      const long row = seq.q_start + i;
      gather_rows(static_cast<const T*>(cache.k), cache, seq.block_table, kh, npos, true, krows);
      gather_rows(static_cast<const T*>(cache.v), cache, seq.block_table, kh, npos, false, vrows);
      scores.resize(static_cast<std::size_t>(group) * npos);
      attend_scalar(q + row * q_stride + static_cast<long>(kh) * group * d, d, group, scale,
                    krows.data(), vrows.data(), npos, scores.data(),
                    out + row * out_stride + static_cast<long>(kh) * group * d);
    }
  }
}


/// The paths, widest first; SHARDLINE_ATTENTION_KERNEL may name the
/// automatic one.
constexpr detail::KernelPaths<AttentionKernel, 3> kPaths{
    "attention",
    AttentionKernel::automatic,
    "SHARDLINE_ATTENTION_KERNEL",
    {{{AttentionKernel::avx512, "avx512", detail::CpuFeatures::avx512},
      {AttentionKernel::avx2, "avx2", detail::CpuFeatures::avx2},
      {AttentionKernel::portable, "portable", detail::CpuFeatures::none}}}};

[[nodiscard]] AttentionKernel resolve(AttentionKernel kernel) { return kPaths.resolve(kernel); }

void check_dtype(const KvCacheLayer& cache) {
  if (cache.dtype != DType::f32 && cache.dtype != DType::bf16)
    throw std::invalid_argument(std::string("attention: KV cache dtype must be F32 or BF16, not ") +
                                dtype_name(cache.dtype));
}

}  // namespace

void write_kv(const float* k, const float* v, int row_stride, int num_tokens,
              const std::int32_t* slot_mapping, const KvCacheLayer& cache) {
  check_dtype(cache);
  const int d = cache.head_dim, bs = cache.block_size;
  const long head_stride = static_cast<long>(bs) * d;
  const bool bf16 = cache.dtype == DType::bf16;
  for (int t = 0; t < num_tokens; ++t) {
    const std::int32_t slot = slot_mapping[t];
    if (slot < 0) continue;
    const long block = slot / bs, off = slot % bs;
    for (int h = 0; h < cache.num_kv_heads; ++h) {
      const long slab = (block * cache.num_kv_heads + h) * head_stride;
      const long kdst = slab + off;           // K transposed: [i][offset], stride bs
      const long vdst = slab + off * d;       // V: [offset][i]
      const long src = static_cast<long>(t) * row_stride + static_cast<long>(h) * d;
      if (!bf16) {
        float* kd = static_cast<float*>(cache.k) + kdst;
        for (int i = 0; i < d; ++i) kd[static_cast<long>(i) * bs] = k[src + i];
        std::memcpy(static_cast<float*>(cache.v) + vdst, v + src, sizeof(float) * d);
        continue;
      }
      bf16_t* kd = static_cast<bf16_t*>(cache.k) + kdst;
      bf16_t* vd = static_cast<bf16_t*>(cache.v) + vdst;
      for (int c = 0; c < d; ++c) {
        kd[static_cast<long>(c) * bs] = f32_to_bf16(k[src + c]);
        vd[c] = f32_to_bf16(v[src + c]);
      }
    }
  }
}

bool attention_kernel_supported(AttentionKernel kernel) { return kPaths.supported(kernel); }

const char* attention_kernel_name(AttentionKernel kernel) { return kPaths.name(kernel); }

void paged_attention(const float* q, int q_stride, std::span<const AttentionSeq> seqs,
                     const KvCacheLayer& cache, int num_heads, float scale, float* out,
                     int out_stride, AttentionKernel kernel) {
  check_dtype(cache);
  const int hkv = cache.num_kv_heads;
  const int group = num_heads / hkv;
  const bool bf16 = cache.dtype == DType::bf16;
  switch (resolve(kernel)) {
    case AttentionKernel::avx512:
      detail::paged_attention_avx512(q, q_stride, seqs, cache, num_heads, scale, out, out_stride);
      return;
    case AttentionKernel::avx2:
      detail::paged_attention_avx2(q, q_stride, seqs, cache, num_heads, scale, out, out_stride);
      return;
    default:
      if (bf16)
        paged_attention_scalar<bf16_t>(q, q_stride, seqs, cache, group, scale, out, out_stride);
      else
        paged_attention_scalar<float>(q, q_stride, seqs, cache, group, scale, out, out_stride);
  }
}

std::vector<std::vector<LineRun>> kv_line_runs(std::span<const AttentionSeq> seqs, const KvCacheLayer& cache,
                                               int num_threads, std::size_t max_bytes) {
  const int nt = std::max(num_threads, 1);
  std::vector<std::vector<LineRun>> slices(static_cast<std::size_t>(nt));
  // paged_attention's order: costliest (longest context) first, stable.
  std::vector<std::size_t> order(seqs.size());
  for (std::size_t s = 0; s < order.size(); ++s) order[s] = s;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return seqs[a].context_len > seqs[b].context_len;
  });
  const std::size_t block_bytes = static_cast<std::size_t>(cache.num_kv_heads) * cache.block_size *
                                  cache.head_dim * dtype_size(cache.dtype);  // one block's K (or V), all heads
  const int lines = static_cast<int>((block_bytes + 63) / 64);
  const auto* kbase = static_cast<const char*>(cache.k);
  const auto* vbase = static_cast<const char*>(cache.v);
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < order.size(); ++i) {
    const AttentionSeq& seq = seqs[order[i]];
    std::vector<LineRun>& slice = slices[i % static_cast<std::size_t>(nt)];
    const int nblocks = (seq.context_len + cache.block_size - 1) / cache.block_size;
    for (int b = 0; b < nblocks; ++b) {
      if (max_bytes > 0 && bytes >= max_bytes) return slices;
      const std::size_t off = static_cast<std::size_t>(seq.block_table[b]) * block_bytes;
      slice.push_back(LineRun{kbase + off, lines});
      slice.push_back(LineRun{vbase + off, lines});
      bytes += 2 * block_bytes;
    }
  }
  return slices;
}

}  // namespace shardline::kernels::cpu
