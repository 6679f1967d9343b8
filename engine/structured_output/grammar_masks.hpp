#pragma once
/// \file
/// Structured outputs in the engine loop (issue 43, step 2): a constrained
/// sequence's grammar state, and the filling of the next token masks on a
/// CPU thread while the forward pass runs, as xgrammar and vLLM overlap it.
///
/// Per step, for a sequence with a grammar (LlmEngine::sample_rows):
///   1. wait for the masks started after the previous sampling;
///   2. mask the row's logits (sampling::apply_token_bitmask, in place; on
///      a copy when the row asks for logprobs, which stay those of the raw
///      row, as vLLM returns them) and sample from the masked row;
///   3. accept the sampled token into the matcher;
///   4. start filling the next masks of the sequences just sampled
///      (GrammarMaskFiller::start), which runs beside the next micro-batch's
///      forward pass.
/// An executor that samples on its device (the CUDA runner) gets each
/// constrained row's mask in its model::RowSampling and masks the row on the
/// device: the engine waits for the masks being filled before such a
/// micro-batch goes out (LlmEngine::grammar_masks_ready), so there the fill
/// overlaps only the micro-batches already in flight, as in vLLM V1, whose
/// scheduler fills the bitmasks before the forward pass.
/// A mask depends only on the tokens the sequence accepted, so a row's
/// output is the same alone or batched, at any pipeline depth (batch
/// invariance), and a resumed sequence that replays its generated tokens
/// into a fresh matcher continues where it was.

#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <vector>

#include "common/result.hpp"
#include "sampling/structured_output/grammar.hpp"

namespace shardline::engine {

/// One constrained sequence's grammar: its matcher and its next token's mask.
struct GrammarState {
  explicit GrammarState(std::shared_ptr<const sampling::CompiledGrammar> grammar);
  sampling::GrammarMatcher matcher;
  /// The next token's allowed ids: [bitmask_words(vocab)] words, valid when
  /// mask_ready.
  std::vector<std::uint32_t> mask;
  /// `mask` is the next token's: filled since the last accepted token.
  bool mask_ready = false;

  /// Fills `mask` unless it is ready. Errors: what the matcher returns.
  [[nodiscard]] Status fill_mask();
  /// Accepts the sampled token (the mask is stale after it). Errors:
  /// invalid_argument when the grammar does not allow it.
  [[nodiscard]] Status accept(std::int32_t token_id);
};

/// Fills grammar masks on one background thread at a time. Not
/// thread-safe: one engine loop calls it.
class GrammarMaskFiller {
 public:
  GrammarMaskFiller() = default;
  ~GrammarMaskFiller();
  GrammarMaskFiller(const GrammarMaskFiller&) = delete;
  GrammarMaskFiller& operator=(const GrammarMaskFiller&) = delete;

  /// Starts filling the masks of `states` that are not ready (a terminated
  /// matcher has none to fill) and returns; waits first for a previous
  /// start that is still running. The states stay alive while it runs.
  void start(std::vector<std::shared_ptr<GrammarState>> states);
  /// Waits for the last start(). Errors: the first a fill returned.
  [[nodiscard]] Status wait();
  /// Milliseconds the last waited-for start() spent filling masks (on its
  /// thread, beside the forward pass); 0 before any.
  [[nodiscard]] double last_fill_ms() const noexcept { return last_fill_ms_; }

 private:
  struct Filled {
    Status status;
    double fill_ms = 0;
  };
  std::future<Filled> pending_;
  double last_fill_ms_ = 0;
};

}  // namespace shardline::engine
