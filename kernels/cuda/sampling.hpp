#pragma once
/// \file
/// Batched GPU token sampling: the device counterpart of sampling::sample
/// (sampling/sampler.hpp) for `num_rows` logits rows at once, with the same
/// order of operations per row:
///   1. penalties: repetition (CTRL-style, over prompt + output ids), then
///      presence / frequency (OpenAI-style, over output counts);
///   2. min_tokens masking (ids -> -inf while num_output_tokens < min_tokens);
///   3. temperature == 0: greedy argmax (lowest id on ties, NaN never wins,
///      all-NaN -> vocab - 1, exactly sampling::argmax);
///   4. otherwise logits /= temperature; everything masked -> argmax; then
///      top-k -> drop masked -> top-p -> min-p over the candidates sorted by
///      (logit desc, id asc), and the inverse-CDF draw with the Philox uniform
///      of (seed, position) (sampling::philox_uniform); without any truncation
///      the draw is over the full distribution in id order, as on the CPU.
///
/// Plain C++ header (no cuda_runtime.h needed); same conventions as
/// kernels/cuda/ops.hpp: device pointers, work queued on `stream`, host-side
/// argument checks return invalid_argument before anything is launched, the
/// launch status comes from cudaGetLastError, kernel faults surface at
/// `synchronize(stream)`.
///
/// Determinism / batch invariance: one thread block (kSampleThreads threads)
/// per row; every reduction (counts, key max / min, double sums of
/// probabilities) is a per-thread loop over i = tid, tid + T, ... followed by
/// a fixed shared-memory tree, so a row's token depends only on that row and
/// its SampleRow (never on num_rows or the other rows), run after run.
///
/// Exactness vs the CPU sampler:
///  - penalties, masking, temperature, greedy argmax, top-k membership, the
///    dropping of masked tokens and the Philox uniform are bit-exact, so
///    greedy ids are always identical to sampling::sample's.
///    One caveat: sampling/sampler.cpp computes the OpenAI term
///    `frequency_penalty * count + presence_penalty` in plain C++, which GCC
///    contracts into one FMA when it may (C++ defaults to -ffp-contract=fast;
///    the default -march=native build on any x86-64 with FMA, and aarch64).
///    The device computes it with fmaf to match that build; a CPU build
///    without FMA (SHARDLINE_NATIVE=OFF on x86-64) rounds the product first
///    and can differ from the device by one float ulp in penalised logits.
///  - probabilities are exp(double(logit) - max_logit) in double as on the
///    CPU, but the device exp may differ from libm in the last double ulp, and
///    the sums (top-p's cumulative mass, the normaliser and the inverse-CDF
///    cumulative sum) are tree sums instead of the CPU's left-to-right sums.
///    A top-p cut or the drawn token can therefore differ from the CPU's when
///    the threshold (top_p * total, or u * total) lies within a few double
///    ulps of a cumulative-sum boundary -- probability ~1e-15 per draw on
///    ordinary distributions, but not zero.
///  - NaN logits: greedy and the untruncated draw follow the CPU exactly
///    (NaN never wins argmax; a NaN probability makes the normaliser NaN and
///    the draw falls back to the last id with a non-zero probability). With
///    truncation (top-k / top-p / min-p) the CPU sorts with a comparator that
///    is not a strict weak order when NaN is present (unspecified result);
///    here NaN sorts after -inf, so NaN tokens are dropped like masked ones.
///  - +inf logits (max_logit = +inf): as on the CPU, exp(inf - inf) = NaN
///    probabilities, top-p keeps everything, min-p keeps one token, and the
///    draw falls back to the last candidate.
///
/// Cost: the truncated path locates the k-th key / top-p cut / drawn token by
/// MSB-first bisection over the 64-bit (logit, id) key, one pass over the row
/// per bit (about 32 + log2(vocab) passes each), without sorting and without
/// scratch memory.

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "common/result.hpp"
#include "sampling/sampler.hpp"
#include "sampling/sampling_params.hpp"

struct CUstream_st;  // = cudaStream_t's pointee (driver_types.h)

namespace shardline::kernels::cuda {

using Stream = CUstream_st*;

/// Threads per row block of sample() (power of two).
inline constexpr int kSampleThreads = 512;

/// Per-row sampling parameters, POD, in *device* memory (one per row). Field
/// for field the sampling::SamplingParams + sampling::SampleContext that
/// sampling::sample uses (build it with make_sample_row); the parameters must be
/// valid (SamplingParams::validate), as on the CPU.
struct SampleRow {
  float temperature = 1.0f;          ///< 0 = greedy
  int top_k = 0;                     ///< <= 0 or >= vocab: disabled
  float top_p = 1.0f;                ///< 1 = disabled
  float min_p = 0.0f;                ///< 0 = disabled
  float repetition_penalty = 1.0f;   ///< 1 = disabled
  float presence_penalty = 0.0f;     ///< 0 = disabled
  float frequency_penalty = 0.0f;    ///< 0 = disabled
  int min_tokens = 0;                ///< SamplingParams::min_tokens
  std::uint64_t seed = 0;            ///< SampleContext::seed (the effective seed)
  int position = 0;                  ///< SampleContext::position
  int num_output_tokens = 0;         ///< SampleContext::output_ids.size()
  /// Distinct ids of prompt_ids ∪ output_ids (device; ids outside [0, vocab)
  /// are ignored, as on the CPU) and, parallel to it, how often each occurs in
  /// output_ids (0 = prompt only). Repetition applies to every listed id,
  /// presence / frequency to those with a count > 0. A repeated id would be
  /// penalised twice: build the list with make_penalty_list. May be null
  /// when num_penalty_ids == 0.
  const std::int32_t* penalty_ids = nullptr;
  const std::int32_t* output_counts = nullptr;
  int num_penalty_ids = 0;
  /// SampleContext::min_tokens_masked_ids (device; repeats and out-of-range
  /// ids are harmless). May be null when num_masked_ids == 0.
  const std::int32_t* masked_ids = nullptr;
  int num_masked_ids = 0;
  /// Structured outputs: the grammar's token bitmask (device), [ceil(vocab /
  /// 32)] words, bit i % 32 of word i / 32 set when token i is allowed; every
  /// other token's logit becomes -inf first, before the penalties (as
  /// sampling::apply_token_bitmask before sampling::sample on the host).
  /// Null: no mask.
  const std::uint32_t* token_bitmask = nullptr;
};

/// The penalty list of a row: distinct in-range ids of prompt ∪ output,
/// ascending, with their occurrence counts in `output_ids`.
struct PenaltyList {
  std::vector<std::int32_t> ids;
  std::vector<std::int32_t> output_counts;
};

[[nodiscard]] inline PenaltyList make_penalty_list(std::span<const std::int32_t> prompt_ids,
                                                   std::span<const std::int32_t> output_ids,
                                                   int vocab) {
  std::vector<std::int32_t> all;
  all.reserve(prompt_ids.size() + output_ids.size());
  for (auto id : prompt_ids)
    if (id >= 0 && id < vocab) all.push_back(id);
  for (auto id : output_ids)
    if (id >= 0 && id < vocab) all.push_back(id);
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  std::vector<std::int32_t> out(output_ids.begin(), output_ids.end());
  std::sort(out.begin(), out.end());
  PenaltyList list;
  list.ids = all;
  list.output_counts.reserve(all.size());
  for (auto id : all) {
    const auto r = std::equal_range(out.begin(), out.end(), id);
    list.output_counts.push_back(static_cast<std::int32_t>(r.second - r.first));
  }
  return list;
}

/// The scalar fields of the SampleRow for (params, ctx); the device pointers
/// (penalty_ids, output_counts, masked_ids, token_bitmask) and their counts
/// are left for the caller to fill with device copies of
/// make_penalty_list(...), ctx.min_tokens_masked_ids and the grammar mask.
[[nodiscard]] inline SampleRow make_sample_row(const sampling::SamplingParams& params,
                                               const sampling::SampleContext& ctx) {
  SampleRow r;
  r.temperature = params.temperature;
  r.top_k = params.top_k;
  r.top_p = params.top_p;
  r.min_p = params.min_p;
  r.repetition_penalty = params.repetition_penalty;
  r.presence_penalty = params.presence_penalty;
  r.frequency_penalty = params.frequency_penalty;
  r.min_tokens = params.min_tokens;
  r.seed = ctx.seed;
  r.position = ctx.position;
  r.num_output_tokens = static_cast<int>(ctx.output_ids.size());
  return r;
}

/// Samples one token per row. logits: [num_rows, vocab] F32 contiguous on the
/// device, modified in place exactly like sampling::apply_token_bitmask then
/// sampling::sample modify the row (grammar mask, penalties, min_tokens
/// mask, then / temperature unless greedy); rows: [num_rows]
/// SampleRow on the device; out_ids: [num_rows] int32 on the device.
/// vocab == 0 gives id 0 for every row (as sampling::sample on an empty row).
/// Errors: invalid_argument for negative sizes or null pointers with
/// num_rows > 0 (nothing launched); num_rows == 0 launches nothing.
[[nodiscard]] Status sample(float* logits, int num_rows, int vocab, const SampleRow* rows,
                            std::int32_t* out_ids, Stream stream);

/// out[i] = sampling::philox_uniform(seeds[i], uint64(positions[i])) computed on
/// the device with the same Philox4x32-10 as sample() uses (for tests).
/// seeds: [n] uint64, positions: [n] int32, out: [n] F32, all on the device.
[[nodiscard]] Status philox_uniforms(const std::uint64_t* seeds, const std::int32_t* positions,
                                     int n, float* out, Stream stream);

}  // namespace shardline::kernels::cuda
