#pragma once
/// \file
/// The contract between the scheduler and a model runner: one forward step
/// over a flattened batch of tokens from several sequences (prefill chunks and
/// decode tokens mixed, Sarathi / vLLM-v1 style).

#include <cstdint>
#include <functional>
#include <deque>
#include <span>
#include <vector>

#include "common/result.hpp"
#include "kvstore/kv_stream.hpp"
#include "sampling/sampler.hpp"
#include "sampling/sampling_params.hpp"

namespace shardline::model {

/// One sequence's part of a step.
struct StepSeq {
  std::uint64_t seq_id = 0;
  int num_computed_tokens = 0;  ///< tokens already in the KV cache before this step
  int num_new_tokens = 0;       ///< tokens computed this step (chunk length, 1 for decode)
  bool needs_logits = false;    ///< true when this step reaches the sequence's last known token
  std::vector<std::int32_t> block_table;  // [ceil((num_computed_tokens + num_new_tokens) / block_size)]
};

/// What sampling one logits row needs, for an executor that samples on its
/// device (ModelExecutor::samples_on_device()). Points into the sequence,
/// which the engine leaves untouched while its step is in flight.
struct RowSampling {
  const sampling::SamplingParams* params = nullptr;  ///< valid (SamplingParams::validate)
  sampling::SampleContext ctx;                       ///< seed, position, prompt / output / masked ids
  /// Structured outputs: the row's grammar mask, [ceil(vocab / 32)] words,
  /// bit i of word i / 32 set when token i is allowed
  /// (sampling/structured_output/grammar.hpp); the sampler sets every other
  /// token's logit to -inf before anything else, as
  /// sampling::apply_token_bitmask does on the host. Empty: no mask.
  std::span<const std::uint32_t> token_bitmask;
};

/// A whole step, flattened. Token rows are ordered by sequence (seqs[0]'s
/// tokens first). Built by `make_step_input`.
struct StepInput {
  std::vector<StepSeq> seqs;
  std::vector<std::int32_t> token_ids;     // [num_tokens]
  std::vector<std::int32_t> positions;     // [num_tokens] absolute positions
  std::vector<std::int32_t> slot_mapping;  // [num_tokens] block_id * block_size + offset
  std::vector<std::int32_t> logits_rows;   // [num_logits] token rows whose logits are needed
  int block_size = 0;
  /// [num_logits] when the executor samples on its device (one per
  /// logits_rows entry, in order); empty otherwise. Not part of the wire
  /// format (engine/group/step_codec.hpp): only a single-device executor uses it.
  std::vector<RowSampling> sampling;

  [[nodiscard]] int num_tokens() const { return static_cast<int>(token_ids.size()); }
  [[nodiscard]] int num_logits() const { return static_cast<int>(logits_rows.size()); }
};

/// Logits of one step: one row per entry of StepInput::logits_rows, in order.
/// An executor that sampled on its device (StepInput::sampling non-empty)
/// returns the token ids instead and leaves `logits` empty.
struct StepOutput {
  std::vector<float> logits;  // [num_logits, vocab]
  int vocab_size = 0;
  std::vector<std::int32_t> sampled_token_ids;  // [num_logits] when sampled on the device, else empty
};

/// Which of an executor's parallel configs a step runs in (Seesaw: cp for
/// prefill phases, cd for decode phases).
enum class StepConfig { prefill, decode };

/// Something that runs forward steps (the CPU model runner, later CUDA and
/// sharded runners). Implementations own the KV cache memory laid out as
/// `num_kv_blocks` blocks of `block_size` tokens.
class ModelExecutor {
 public:
  virtual ~ModelExecutor() = default;
  /// Runs one step. Errors: invalid_argument (token id out of range, slot
  /// outside the cache), internal.
  [[nodiscard]] virtual Result<StepOutput> execute(const StepInput& input) = 0;
  [[nodiscard]] virtual int vocab_size() const = 0;
  [[nodiscard]] virtual int num_kv_blocks() const = 0;
  [[nodiscard]] virtual int block_size() const = 0;
  /// True when the executor can sample on its device: given
  /// StepInput::sampling it returns StepOutput::sampled_token_ids, the same
  /// ids sampling::sample would draw (see kernels/cuda/sampling.hpp for where
  /// the device may differ), and no logits.
  [[nodiscard]] virtual bool samples_on_device() const { return false; }

  // ---- KV streaming (DéjàVu, kvstore/kv_stream.hpp) -------------------------

  /// The model's KV geometry (layers, KV heads, head_dim, cache dtype).
  /// All zero for an executor whose caches cannot be streamed.
  [[nodiscard]] virtual kvstore::KvModelShape kv_model_shape() const { return {}; }
  /// Every rank's KV cache as a host-addressable view, in group-rank order
  /// (one view for a single device). Empty when the caches are not
  /// host-addressable (a CUDA device, ranks in other processes): then KV
  /// cannot be swapped, streamed or restored, and the engine recomputes.
  /// The memory may be read or written between steps, and while a step is
  /// in flight for blocks no in-flight step uses.
  [[nodiscard]] virtual std::vector<kvstore::KvCacheView> kv_cache_views() { return {}; }
  /// Caches that are not host-addressable but that the executor can copy on
  /// request (the ranks of a TCP group gather and scatter their own share):
  /// copies of the active step config's caches, one sequence at a time,
  /// from the stepping thread or one other thread (Seesaw's KV mover),
  /// while steps run for blocks no in-flight step uses. Null when there is
  /// none (then kv_cache_views() is the only way, or KV cannot be copied).
  [[nodiscard]] virtual kvstore::KvCopier* kv_copier() { return nullptr; }

  /// Called on the stepping thread during execute(), right after layer
  /// `layer`'s new KV was written to the cache: the step's KV of that layer
  /// may be read from kv_cache_views() then, while later layers compute
  /// (DéjàVu's layer-by-layer prompt streaming, seed 003 §4.1.1 (3)). On a
  /// device whose work runs behind the host (CUDA) the write is only queued:
  /// read it through kv_copier()'s begin_copy_out, which orders its copies
  /// after the write (kvstore::KvCopier::copies_in_stream_order()).
  using LayerKvHook = std::function<void(int layer)>;
  /// True when set_layer_kv_hook() takes effect: a single rank that runs
  /// every layer (the CPU runner, a whole-model CUDA runner).
  [[nodiscard]] virtual bool supports_layer_kv_hook() const { return false; }
  /// Sets the hook for the following steps; an empty one clears it.
  virtual void set_layer_kv_hook(LayerKvHook /*hook*/) {}

  // ---- step configs (Seesaw, seed 000 §4.1) --------------------------------
  // An executor may hold two parallel configs over the same devices: cp for
  // prefill, cd for decode. Each step runs in the active one; the KV views
  // follow it (kv_cache_views() returns the active config's caches).

  /// True when use_step_config() switches between two parallel configs.
  [[nodiscard]] virtual bool has_step_configs() const { return false; }
  /// Makes `config` the one the following steps run in, and whose caches
  /// kv_cache_views() returns. Only with no step in flight. Errors:
  /// unsupported (no step configs), invalid_argument (steps in flight).
  [[nodiscard]] virtual Status use_step_config(StepConfig /*config*/) {
    return make_error(ErrorCode::unsupported, "executor: one parallel config only");
  }

  // ---- asynchronous steps (pipeline parallelism) --------------------------
  // A pipelined executor (PP stages) accepts up to max_in_flight() steps
  // before the first one's logits are collected; collect() returns them in
  // submission order. The defaults run the step at submit.

  /// Micro-batches the executor can overlap (the number of pipeline stages).
  [[nodiscard]] virtual int max_in_flight() const { return 1; }
  /// Starts a step. Errors: as execute(); invalid_argument when
  /// max_in_flight() steps are already in flight.
  [[nodiscard]] virtual Status submit(const StepInput& input) {
    if (!pending_.empty()) return make_error(ErrorCode::invalid_argument, "executor: a step is already in flight");
    Result<StepOutput> r = execute(input);
    if (!r.ok()) return std::move(r).error();
    pending_.push_back(std::move(r).value());
    return Status::ok_status();
  }
  /// The logits of the oldest step in flight. Errors: invalid_argument when
  /// none is in flight; whatever the step failed with.
  [[nodiscard]] virtual Result<StepOutput> collect() {
    if (pending_.empty()) return make_error(ErrorCode::invalid_argument, "executor: no step in flight");
    StepOutput out = std::move(pending_.front());
    pending_.pop_front();
    return out;
  }

 private:
  std::deque<StepOutput> pending_;
};

/// Checks a step against a cache of num_kv_blocks blocks of block_size
/// tokens and a vocabulary of vocab_size ids: lengths agree, token ids in the
/// vocabulary, positions >= 0, slots and block ids inside the cache, block
/// tables long enough, sequences covering every row, logits rows inside the
/// batch. Every runner (CPU shards, CUDA) checks steps with it.
/// Errors: invalid_argument naming the row / sequence.
[[nodiscard]] Status validate_step(const StepInput& input, int vocab_size, int num_kv_blocks,
                                   int block_size);

}  // namespace shardline::model
