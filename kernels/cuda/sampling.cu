#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/sampling.hpp"
#include "sampling/rng.hpp"

// One block of kSampleThreads threads per row. A candidate is ordered by its
// 64-bit key (ordered logit bits << 32 | (vocab - 1 - id)): larger key =
// larger logit, then lower id -- exactly the CPU's sort order (logit desc, id
// asc; -0 == +0), with NaN below -inf. Every "prefix of the sorted order" of
// the CPU sampler is the set {key >= lo} for some element key lo, found by
// MSB-first bisection over the key bits with a monotone predicate evaluated
// by a fixed-order block reduction (deterministic, batch-invariant).
//
// Float ops use the explicit round-to-nearest intrinsics so that nvcc does
// not contract them into FMAs (the CPU formulas are plain mul / add / div),
// except the frequency / presence term, which the CPU build fuses (below).

namespace shardline::kernels::cuda {
namespace {

constexpr int kT = kSampleThreads;
constexpr float kNegInf = -__builtin_huge_valf();
constexpr std::uint64_t kFiniteKeyLo = 0x00800000ull << 32;  ///< smallest key with logit > -inf

using detail::launch_status;
using detail::bad_arg;

/// Monotone map of a float to uint32 (NaN -> 0, below -inf; -0 == +0).
__device__ __forceinline__ std::uint32_t ordered_bits(float v) {
  if (v != v) return 0u;
  if (v == 0.0f) v = 0.0f;
  const std::uint32_t b = __float_as_uint(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ std::uint64_t key_of(float v, int i, int vocab) {
  return (static_cast<std::uint64_t>(ordered_bits(v)) << 32) |
         static_cast<std::uint32_t>(vocab - 1 - i);
}

__device__ __forceinline__ int id_of(std::uint64_t key, int vocab) {
  return vocab - 1 - static_cast<int>(static_cast<std::uint32_t>(key));
}

/// Probability weight as on the CPU: exp(double(logit) - max_logit) in double.
__device__ __forceinline__ double weight(float x, float max_logit) {
  return exp(__dsub_rn(static_cast<double>(x), static_cast<double>(max_logit)));
}

struct Shared {
  double d[kT];
  unsigned long long u[kT];
};

enum class Op { sum, max, min };

/// Fixed-tree block reduction; the result is returned in every thread.
template <Op O>
__device__ __forceinline__ unsigned long long reduce_u(unsigned long long v, Shared& s) {
  s.u[threadIdx.x] = v;
  __syncthreads();
#pragma unroll
  for (int w = kT / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) {
      const unsigned long long a = s.u[threadIdx.x], b = s.u[threadIdx.x + w];
      if constexpr (O == Op::sum) s.u[threadIdx.x] = a + b;
      else if constexpr (O == Op::max) s.u[threadIdx.x] = a > b ? a : b;
      else s.u[threadIdx.x] = a < b ? a : b;
    }
    __syncthreads();
  }
  const unsigned long long r = s.u[0];
  __syncthreads();
  return r;
}

__device__ __forceinline__ double reduce_sum_d(double v, Shared& s) {
  s.d[threadIdx.x] = v;
  __syncthreads();
#pragma unroll
  for (int w = kT / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) s.d[threadIdx.x] = __dadd_rn(s.d[threadIdx.x], s.d[threadIdx.x + w]);
    __syncthreads();
  }
  const double r = s.d[0];
  __syncthreads();
  return r;
}

/// The largest x such that pred(x) holds, for pred monotone (true up to the
/// answer, false above it) and an answer whose low-word bits at or above
/// `low_bits` are zero; the high word is searched only if `high`.
template <class Pred>
__device__ std::uint64_t bisect_max(Pred pred, bool high, int low_bits) {
  std::uint64_t prefix = 0;
  if (high)
    for (int b = 63; b >= 32; --b) {
      const std::uint64_t cand = prefix | (1ull << b);
      if (pred(cand)) prefix = cand;
    }
  for (int b = low_bits - 1; b >= 0; --b) {
    const std::uint64_t cand = prefix | (1ull << b);
    if (pred(cand)) prefix = cand;
  }
  return prefix;
}

/// sampling::argmax over the row: max key, all-NaN -> vocab - 1.
__device__ int row_argmax(const float* l, int vocab, Shared& s) {
  unsigned long long best = 0;
  for (int i = threadIdx.x; i < vocab; i += kT) {
    const std::uint64_t k = key_of(l[i], i, vocab);
    best = k > best ? k : best;
  }
  const int id = id_of(reduce_u<Op::max>(best, s), vocab);
  return l[id] != l[id] ? vocab - 1 : id;
}

__global__ void __launch_bounds__(kT)
    sample_kernel(float* logits, int vocab, const SampleRow* __restrict__ rows,
                  std::int32_t* __restrict__ out) {
  __shared__ Shared s;
  const SampleRow p = rows[blockIdx.x];
  float* l = logits + static_cast<long>(blockIdx.x) * vocab;
  const int tid = threadIdx.x;

  // 0. the grammar's token bitmask (structured outputs).
  if (p.token_bitmask != nullptr) {
    for (int i = tid; i < vocab; i += kT)
      if (((p.token_bitmask[i >> 5] >> (i & 31)) & 1u) == 0u) l[i] = kNegInf;
    __syncthreads();
  }
  // 1. penalties (each listed id is distinct, so one thread owns each write).
  const bool rep = p.repetition_penalty != 1.0f;
  const bool pres_freq = p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
  if (rep || pres_freq) {
    for (int j = tid; j < p.num_penalty_ids; j += kT) {
      const std::int32_t id = p.penalty_ids[j];
      if (id < 0 || id >= vocab) continue;
      float x = l[id];
      if (rep)
        x = x > 0.0f ? __fdiv_rn(x, p.repetition_penalty) : __fmul_rn(x, p.repetition_penalty);
      const std::int32_t c = p.output_counts[j];
      if (pres_freq && c != 0)  // fused, as the CPU build computes it (see sampling.hpp)
        x = __fsub_rn(x, __fmaf_rn(p.frequency_penalty, static_cast<float>(c), p.presence_penalty));
      l[id] = x;
    }
  }
  __syncthreads();
  // 2. min_tokens masking.
  if (p.num_output_tokens < p.min_tokens)
    for (int j = tid; j < p.num_masked_ids; j += kT) {
      const std::int32_t id = p.masked_ids[j];
      if (id >= 0 && id < vocab) l[id] = kNegInf;
    }
  __syncthreads();

  // 3. greedy.
  if (p.temperature == 0.0f) {
    const int id = row_argmax(l, vocab, s);
    if (tid == 0) out[blockIdx.x] = id;
    return;
  }

  // 4. temperature, all-masked fallback.
  for (int i = tid; i < vocab; i += kT) l[i] = __fdiv_rn(l[i], p.temperature);
  __syncthreads();
  const int am = row_argmax(l, vocab, s);
  const float max_logit = l[am];
  if (!(max_logit > kNegInf)) {
    if (tid == 0) out[blockIdx.x] = am;
    return;
  }

  const bool use_top_k = p.top_k > 0 && p.top_k < vocab;
  const bool truncate = use_top_k || p.top_p < 1.0f || p.min_p > 0.0f;
  const double u = sampling::philox_uniform(p.seed, static_cast<std::uint64_t>(p.position));
  const int low_bits = vocab > 1 ? 32 - __clz(static_cast<unsigned>(vocab - 1)) : 0;

  if (!truncate) {  // full distribution, inverse CDF in id order (key = vocab - 1 - id)
    double part = 0.0;
    unsigned long long last = 0;  // last id with a non-zero weight (NaN counts)
    for (int i = tid; i < vocab; i += kT) {
      const double w = weight(l[i], max_logit);
      part = __dadd_rn(part, w);
      if (w != 0.0) last = static_cast<unsigned long long>(i);
    }
    const double total = reduce_sum_d(part, s);
    const int last_nonzero = static_cast<int>(reduce_u<Op::max>(last, s));
    const double target = __dmul_rn(u, total);
    int id = last_nonzero;
    if (total > target) {
      auto mass_above = [&](std::uint64_t x) {  // sum of weights with key >= x
        double acc = 0.0;
        for (int i = tid; i < vocab; i += kT)
          if (static_cast<std::uint64_t>(vocab - 1 - i) >= x)
            acc = __dadd_rn(acc, weight(l[i], max_logit));
        return reduce_sum_d(acc, s) > target;
      };
      id = vocab - 1 - static_cast<int>(bisect_max(mass_above, false, low_bits));
    }
    if (tid == 0) out[blockIdx.x] = id;
    return;
  }

  // Candidates: {key >= lo}, the CPU's sorted prefix.
  std::uint64_t lo = 0;
  if (use_top_k) {
    const unsigned long long k = static_cast<unsigned long long>(p.top_k);
    auto at_least_k = [&](std::uint64_t x) {
      unsigned long long c = 0;
      for (int i = tid; i < vocab; i += kT) c += key_of(l[i], i, vocab) >= x ? 1u : 0u;
      return reduce_u<Op::sum>(c, s) >= k;
    };
    lo = bisect_max(at_least_k, true, low_bits);
  }
  if (lo < kFiniteKeyLo) {  // drop masked (-inf, NaN) tokens; lo = the last candidate's key
    unsigned long long m = ~0ull;
    for (int i = tid; i < vocab; i += kT) {
      const std::uint64_t k = key_of(l[i], i, vocab);
      if (k >= kFiniteKeyLo && k < m) m = k;
    }
    lo = reduce_u<Op::min>(m, s);  // the top token is a candidate: never ~0
  }

  // Sum of weights of the candidates with key >= x.
  auto mass = [&](std::uint64_t x) {
    if (x < lo) x = lo;
    double acc = 0.0;
    for (int i = tid; i < vocab; i += kT) {
      const float v = l[i];
      if (key_of(v, i, vocab) >= x) acc = __dadd_rn(acc, weight(v, max_logit));
    }
    return reduce_sum_d(acc, s);
  };

  if (p.top_p < 1.0f) {  // smallest prefix with cumulative mass >= top_p * total
    const double total = mass(lo);
    const double threshold = __dmul_rn(static_cast<double>(p.top_p), total);
    if (total >= threshold)
      lo = bisect_max([&](std::uint64_t x) { return mass(x) >= threshold; }, true, low_bits);
  }
  const std::uint64_t top_key = key_of(max_logit, am, vocab);
  if (p.min_p > 0.0f) {  // keep weights >= min_p * weight(top); at least the top
    const double threshold = __dmul_rn(static_cast<double>(p.min_p), weight(max_logit, max_logit));
    unsigned long long m = ~0ull;
    for (int i = tid; i < vocab; i += kT) {
      const float v = l[i];
      const std::uint64_t k = key_of(v, i, vocab);
      if (k >= lo && weight(v, max_logit) >= threshold && k < m) m = k;
    }
    m = reduce_u<Op::min>(m, s);
    lo = m == ~0ull ? top_key : m;
  }

  const double total = mass(lo);
  const double target = __dmul_rn(u, total);
  std::uint64_t chosen = lo;  // the CPU's order[n - 1] when no prefix exceeds target
  if (total > target)
    chosen = bisect_max([&](std::uint64_t x) { return mass(x) > target; }, true, low_bits);
  if (tid == 0) out[blockIdx.x] = id_of(chosen, vocab);
}

__global__ void philox_kernel(const std::uint64_t* __restrict__ seeds,
                              const std::int32_t* __restrict__ positions, int n,
                              float* __restrict__ out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = sampling::philox_uniform(seeds[i], static_cast<std::uint64_t>(positions[i]));
}

}  // namespace

Status sample(float* logits, int num_rows, int vocab, const SampleRow* rows,
              std::int32_t* out_ids, Stream stream) {
  if (num_rows < 0 || vocab < 0) return bad_arg("sample", "negative size");
  if (num_rows == 0) return Status::ok_status();
  if (out_ids == nullptr) return bad_arg("sample", "null out_ids");
  if (vocab == 0) {  // sampling::sample on an empty row returns 0
    const cudaError_t err =
        cudaMemsetAsync(out_ids, 0, static_cast<std::size_t>(num_rows) * sizeof(std::int32_t), stream);
    if (err != cudaSuccess)
      return make_error(ErrorCode::internal,
                        std::string("cuda sample: ") + cudaGetErrorString(err));
    return Status::ok_status();
  }
  if (logits == nullptr || rows == nullptr) return bad_arg("sample", "null logits or rows");
  sample_kernel<<<static_cast<unsigned>(num_rows), kT, 0, stream>>>(logits, vocab, rows, out_ids);
  return launch_status("sample");
}

Status philox_uniforms(const std::uint64_t* seeds, const std::int32_t* positions, int n,
                       float* out, Stream stream) {
  if (n < 0) return bad_arg("philox_uniforms", "negative size");
  if (n == 0) return Status::ok_status();
  if (seeds == nullptr || positions == nullptr || out == nullptr)
    return bad_arg("philox_uniforms", "null pointer");
  philox_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(seeds, positions, n,
                                                                             out);
  return launch_status("philox_uniforms");
}

}  // namespace shardline::kernels::cuda
