#pragma once
/// \file
/// The offline engine loop: requests in, finished generations out. Each
/// `step()` schedules (Orca iteration-level batching, Sarathi-Serve chunked
/// prefill, vLLM paged KV with recompute preemption), runs one ModelExecutor
/// step, samples every sequence whose chunk reached its last token at that
/// token's position (Philox keyed by the request seed, so results do not
/// depend on the batch), then applies stop rules and frees finished requests.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/result.hpp"
#include "sampling/sampling_params.hpp"
#include "engine/kv_cache_io.hpp"
#include "engine/prefix_tier.hpp"
#include "engine/scheduler.hpp"
#include "engine/sequence.hpp"
#include "engine/step_phases.hpp"
#include "engine/structured_output/grammar_masks.hpp"
#include "model/executor.hpp"
#include "engine/policies/token_budget.hpp"
#include <deque>
#include "text/tokenizer.hpp"

namespace shardline::engine {

struct EngineConfig {
  int max_num_seqs = 256;             ///< concurrently running requests at most
  int max_num_batched_tokens = 2048;  ///< tokens per step at most
  int max_model_len = 4096;           ///< prompt + output tokens at most (cap: "length")
  std::vector<int> eos_token_ids;     ///< from ModelConfig::eos_token_ids
  std::uint64_t seed = 0;             ///< base of per-request seeds when params.has_seed is false
  bool skip_special_tokens = true;    ///< for the output text
  bool capture_logits = false;        ///< keep each generated step's raw logits row (before penalties)
  bool check_integrity = false;       ///< verify scheduler / block invariants every step (tests, debug)
  /// Per-micro-batch token budget (e.g. gLLM Token Throttling); null = a
  /// fixed budget of max_num_batched_tokens shared by decodes and prefills.
  std::shared_ptr<const TokenBudgetPolicy> token_budget;
  /// What a preemption does with the victim's KV (engine/scheduler.hpp).
  /// Swap needs caches that can be copied (KvCacheIo::can_copy_kv); without
  /// them, or when the swap space is full, a preemption recomputes.
  PreemptionMode preemption_mode = PreemptionMode::recompute;
  std::uint64_t swap_space_bytes = 4ull << 30;  ///< host memory for swapped-out KV (vLLM's --swap-space)
  /// Automatic prefix caching (engine/prefix_cache.hpp; off here, on in the
  /// job commands unless `--no-prefix-caching`): a request's leading full
  /// blocks that another request computed are shared, not computed again.
  /// Outputs are byte-identical either way (the kernels are batch-invariant).
  PrefixCacheConfig prefix_cache{};
  /// A technique that runs the step loop in phases, built over the
  /// engine's parts at create() (engine/step_phases.hpp): Seesaw's prefill
  /// and decode phases with a host KV buffer between them
  /// (engine/seesaw/seesaw_phases.hpp). Empty: continuous batching of
  /// prefills and decodes together (mixed).
  StepPhaseFactory step_phases;
};

/// Where a request resumes after a failure (DéjàVu §4.2.3): the tokens it
/// had generated, and the KV of its first positions as a KV store kept it.
struct ResumeState {
  std::vector<std::int32_t> output_ids;  ///< tokens generated before; generation continues after them
  /// Positions [0, num_kv_tokens) whose KV `kv_chunk` holds: the canonical
  /// chunk (kvstore/kv_stream.hpp) of KvRange{0, layers, 0, num_kv_tokens}.
  /// 0: no KV (everything is recomputed). At most prompt + output tokens - 1.
  int num_kv_tokens = 0;
  std::vector<std::byte> kv_chunk;
};

/// New KV of one running sequence, for token streaming (DéjàVu §4.1.1 (3)):
/// the positions computed since its last increment, handed to the stream
/// sink after a step.
struct KvIncrement {
  std::uint64_t request_id = 0;
  /// All layers x positions [token_begin, token_end); one layer only for a
  /// prompt chunk streamed layer by layer (set_stream_prompt_by_layer).
  kvstore::KvRange range;
  std::vector<std::byte> chunk;    ///< canonical chunk of `range`
  /// Token ids at positions [token_begin, token_end + 1): the tokens whose KV
  /// the chunk holds, and the newest known token (its KV comes later). A
  /// layer increment has [token_begin, token_end) only: it goes out before
  /// the step samples.
  std::vector<std::int32_t> token_ids;
  int num_prompt_tokens = 0;       ///< positions below this are prompt, the rest generated
};

/// Where a step's new KV goes (the worker's streaming queue). Backpressure
/// that never blocks the step loop: while the sink is not accepting, the
/// engine leaves the KV in its cache and later hands over one catch-up
/// increment from the last streamed position.
class KvStreamSink {
 public:
  virtual ~KvStreamSink() = default;
  /// Whether the sink takes increments after this step.
  [[nodiscard]] virtual bool accepting() const = 0;
  /// Takes one increment (called on the stepping thread: only queue it).
  virtual void push(KvIncrement increment) = 0;
  /// DéjàVu's streaming from the end of a cached prefix (issue 42): a
  /// request's first positions hold a cached prompt prefix of full blocks,
  /// named `names` by the prefix cache (chain order from `root`, the first
  /// one's parent) and holding `token_ids` (names.size() x block size ids).
  /// Returns how many of those positions the sink records by reference to
  /// the blocks (whole blocks, <= token_ids.size()) instead of taking their
  /// KV: the engine streams the request from there. Called on the stepping
  /// thread, once per request, at its first step. Default: 0 (every
  /// position is streamed).
  [[nodiscard]] virtual int link_prefix(std::uint64_t request_id, std::uint64_t root,
                                        std::span<const std::uint64_t> names,
                                        std::span<const std::int32_t> token_ids, int num_prompt_tokens) {
    (void)request_id, (void)root, (void)names, (void)token_ids, (void)num_prompt_tokens;
    return 0;
  }
};

struct RequestOutput {
  std::uint64_t request_id = 0;
  std::vector<std::int32_t> prompt_token_ids;
  std::vector<std::int32_t> token_ids;  ///< generated ids, including a final EOS / stop id
  std::string text;                     ///< detokenized output; a matched stop string and after are cut
  FinishReason finish_reason = FinishReason::none;
  std::string stop_reason;  ///< matched stop string, or the stop token id as text ("" otherwise)
  int num_preemptions = 0;
  /// Prefix caching: positions of its prompt found cached at its first
  /// admission (OpenAI's usage.prompt_tokens_details.cached_tokens); 0
  /// without caching or when it resumed or was restored.
  int num_cached_tokens = 0;
  /// With capture_logits: one raw logits row [vocab] per generated token.
  std::vector<std::vector<float>> logits;
  /// With SamplingParams::logprobs >= 0: the logprobs of each token this
  /// engine sampled, in order ([token_ids.size()] unless the request resumed
  /// with output ids, which have none: then the last entries).
  std::vector<sampling::SampleLogprobs> logprobs;
};

/// Statistics of one step, for the benchmark.
struct StepStats {
  int num_seqs = 0;
  int num_prefill_tokens = 0;
  int num_decode_tokens = 0;
  int num_preemptions = 0;
  double schedule_ms = 0.0;
  double execute_ms = 0.0;
  double sample_ms = 0.0;  ///< host sampling of the step's logits rows (0 when the executor samples)
  double step_ms = 0.0;  ///< whole step wall time
  /// Structured outputs: rows sampled under a grammar, the time sampling
  /// waited for their masks (the filling the forward pass did not hide;
  /// part of sample_ms), and the time the mask thread spent filling them.
  int num_constrained_rows = 0;
  double grammar_wait_ms = 0.0;
  double grammar_fill_ms = 0.0;
};

class LlmEngine {
 public:
  /// Checks the config against the executor's KV cache. Errors:
  /// invalid_argument (non-positive limits, block size mismatch),
  /// out_of_memory (the cache cannot hold one max_model_len sequence:
  /// num_kv_blocks * block_size < max_model_len).
  [[nodiscard]] static Result<std::unique_ptr<LlmEngine>> create(model::ModelExecutor& executor,
                                                                 const text::Tokenizer& tokenizer,
                                                                 EngineConfig config);

  /// Queues a request. Errors: invalid_argument (bad params naming the field,
  /// empty prompt, prompt longer than max_model_len, token id outside the
  /// vocab, duplicate id), out_of_memory (prompt + max_tokens never fits the cache).
  /// `grammar` (structured outputs): the grammar every generated token must
  /// match (sampling/structured_output/grammar.hpp; its stop tokens should
  /// be the ones this request stops on); null: unconstrained. Errors also:
  /// invalid_argument (a grammar compiled for another vocabulary size).
  [[nodiscard]] Status add_request(std::uint64_t request_id, std::vector<std::int32_t> prompt_token_ids,
                                   const sampling::SamplingParams& params,
                                   std::shared_ptr<const sampling::CompiledGrammar> grammar = nullptr);
  /// Queues a request that resumes after a failure: its generated tokens are
  /// taken as output so far (the text, penalties and stop rules see them),
  /// the KV of resume.num_kv_tokens positions is copied into the cache when
  /// it is admitted, and only the positions after them are computed. When
  /// the KV cannot be restored here (caches not host-addressable, or no
  /// chunk: the stores could not give it) it is
  /// recomputed and counted (KvIoStats::resume_fallbacks). Errors: as
  /// add_request; invalid_argument (an output id outside the vocab, as many
  /// outputs as max_tokens, num_kv_tokens out of range, a chunk of the wrong
  /// size).
  /// With a `grammar`, the resumed output ids are replayed into a fresh
  /// matcher first (invalid_argument when they do not fit it), so the
  /// request continues under the grammar exactly where it stopped.
  [[nodiscard]] Status add_request(std::uint64_t request_id, std::vector<std::int32_t> prompt_token_ids,
                                   const sampling::SamplingParams& params, ResumeState resume,
                                   std::shared_ptr<const sampling::CompiledGrammar> grammar = nullptr);

  /// Finishes a request now with finish_reason "abort" (one in flight: when
  /// its micro-batch lands); its output is returned by a later step(). False
  /// when unknown.
  bool abort_request(std::uint64_t request_id);

  /// Runs one iteration. Returns the requests that finished in it (in
  /// request-id order). With a pipelined executor (max_in_flight() > 1) an
  /// iteration first submits micro-batches until max_in_flight() are in
  /// flight or nothing more is schedulable (sequences in flight are not
  /// scheduled again), then collects the oldest one's logits and samples it
  /// (gLLM's asynchronous pipeline, seed 004 §3.3). Errors: whatever the
  /// executor returns; internal (broken invariant, wrong logits shape).
  [[nodiscard]] Result<std::vector<RequestOutput>> step();

  [[nodiscard]] bool has_unfinished() const { return scheduler_.has_unfinished() || !aborted_.empty(); }

  /// Adds `prompts` as requests 0..n-1 (params validated first; nothing is
  /// added on error) and steps until all finish. Outputs in prompt order.
  /// Errors: invalid_argument (also when requests are already in flight),
  /// any add_request / step error.
  /// `grammar`: every request under it (structured outputs); null: none.
  [[nodiscard]] Result<std::vector<RequestOutput>> generate(
      const std::vector<std::vector<std::int32_t>>& prompts, const sampling::SamplingParams& params,
      std::shared_ptr<const sampling::CompiledGrammar> grammar = nullptr);

  [[nodiscard]] const std::vector<StepStats>& step_stats() const { return step_stats_; }
  void clear_step_stats() { step_stats_.clear(); }
  /// Called after every step with its statistics (optional).
  void set_step_callback(std::function<void(const StepStats&)> cb) { step_callback_ = std::move(cb); }

  /// Switches the per-micro-batch token budget policy (e.g. per job); null =
  /// the fixed max_num_batched_tokens budget. Takes effect at the next step.
  void set_token_budget(std::shared_ptr<const TokenBudgetPolicy> policy) { config_.token_budget = std::move(policy); }
  [[nodiscard]] const Scheduler& scheduler() const { return scheduler_; }
  [[nodiscard]] const EngineConfig& config() const { return config_; }
  /// Switches the preemption mode (takes effect at the next preemption).
  void set_preemption_mode(PreemptionMode mode) {
    config_.preemption_mode = mode;
    scheduler_.set_preemption_mode(mode);
  }
  /// Receives every running sequence's new KV after each step (token
  /// streaming); null: none is copied out. Not owned; must outlive its use.
  void set_kv_sink(KvStreamSink* sink) { kv_sink_ = sink; }
  /// Streams request `request_id`'s KV again from position 0 (its head went
  /// as a prefix link the store cannot resolve: KvStreamSink::link_prefix);
  /// the positions go out after its next step. False when it is not held
  /// (finished or unknown).
  bool restream_kv(std::uint64_t request_id);
  /// A tier below the prefix cache (engine/prefix_tier.hpp; null: none; it
  /// must outlive the engine's use of it). With prefix caching on, named
  /// blocks the cache evicts are copied out to it before their blocks are
  /// written again, and an admission takes the blocks after its device
  /// hit that no request computes from it, copied into its own blocks
  /// before the step (KvIoStats::prefix_tier_*). Not while Seesaw's phases
  /// lay the KV out anew (the names' epoch is no longer 0), and not on an
  /// executor whose caches cannot be copied (then it is ignored).
  void set_prefix_tier(PrefixTier* tier);
  /// The full blocks of a prompt (within all its tokens but the last, whose
  /// logits an admission computes) after those the device cache holds now,
  /// in chain order, with their names: what a prefix tier could supply
  /// (worker/store_prefix_tier.hpp stages them from the node's KV store
  /// when a line arrives). Empty without a prefix tier or outside epoch 0.
  [[nodiscard]] std::vector<NamedBlock> uncached_prefix_blocks(std::span<const std::int32_t> prompt_ids) const;
  /// Copies every named block of the cache out to the prefix tier (a clean
  /// stop: the next engine given the tier starts warm). Call with nothing
  /// in flight. Errors: internal (a copy failed).
  [[nodiscard]] Status spill_prefix_cache();
  /// With a sink and an executor that supports_layer_kv_hook(): a step's
  /// prefill chunks (steps of more than one new token per sequence) are
  /// streamed layer by layer while the forward pass runs, each layer's
  /// positions as one increment of that layer only (token ids: those
  /// positions', without the next token), instead of after the step
  /// (DéjàVu §4.1.1 (3), prompt streaming). Decode steps stream after the
  /// step as before. Off by default.
  void set_stream_prompt_by_layer(bool on) { stream_prompt_by_layer_ = on; }
  [[nodiscard]] const KvCacheIo& kv_io() const { return kv_io_; }
  /// The engine's phase hook (EngineConfig::step_phases); null without one.
  [[nodiscard]] const StepPhaseHook* step_phases() const { return phases_.get(); }
  /// The KV mover's transfers, their time and the share of it hidden behind
  /// computation (zero without a mover: no phases).
  [[nodiscard]] KvMoverStats kv_mover_stats() const { return kv_io_.mover_stats(); }

 private:
  LlmEngine(model::ModelExecutor& executor, const text::Tokenizer& tokenizer, EngineConfig config);

  struct InFlight {
    SchedulerOutput sched;
    StepStats stats;
    std::chrono::steady_clock::time_point submitted;
  };

  // The phases of step(), in order (schedule -> execute -> sample -> finish).
  /// Schedules and submits micro-batches while the executor has a free slot
  /// (max_in_flight) and anything is schedulable. Errors: the executor's
  /// submit errors; internal (check_integrity).
  [[nodiscard]] Status fill_pipeline();
  /// Moves the KV a schedule asks for before its step runs: swap-outs of
  /// its preemptions (a victim that does not fit the swap space is switched
  /// to recompute), then restores of readmitted sequences; and starts the
  /// offloads and onboards of a phased schedule on the mover. Errors:
  /// internal.
  [[nodiscard]] Status apply_kv_moves(const SchedulerOutput& sched);
  /// Copies named block `b` out to the prefix tier, unless it keeps it
  /// already. Errors: internal.
  [[nodiscard]] Status spill_block(const NamedBlock& b);
  /// Hands the sink, when it accepts, each still-running sequence of
  /// `sched` whose KV is computed past what it streamed before.
  [[nodiscard]] Status stream_increments(const SchedulerOutput& sched);
  /// Offers the sink the cached head of each sequence of `sched` at its
  /// first step (KvStreamSink::link_prefix); what the sink links counts as
  /// streamed.
  void offer_prefix_links(const SchedulerOutput& sched);
  /// Gives each logits row of `sched` what the device needs to sample it.
  void attach_device_sampling(SchedulerOutput& sched) const;
  /// True when a row of `sched` that gets logits asks for logprobs.
  [[nodiscard]] static bool wants_logprobs(const SchedulerOutput& sched);
  /// True when a row of `sched` that gets logits has a grammar.
  [[nodiscard]] static bool has_grammar(const SchedulerOutput& sched);
  /// Whether every constrained row of `sched` has its next grammar mask, as
  /// device sampling needs before the step goes out: waits for the masks
  /// being filled (beside the micro-batches in flight) and fills the rest,
  /// adding the wait to `stats`. False when a grammar has no next mask (it
  /// ended, or its fill fails): that micro-batch samples on the host, where
  /// sample_rows ends such a request.
  [[nodiscard]] bool grammar_masks_ready(const SchedulerOutput& sched, StepStats& stats);
  /// Collects the oldest micro-batch's output and checks its shape (logits
  /// [num_logits, vocab], or num_logits sampled ids). Errors: the executor's;
  /// internal for a wrong shape.
  [[nodiscard]] Result<model::StepOutput> collect_oldest(InFlight& f);
  /// Samples every logits row of `f` (or takes the device's ids), appends
  /// the tokens (Scheduler::update) and returns the sequences that got one.
  /// A constrained row's logits in `output` are masked in place.
  [[nodiscard]] std::vector<Sequence*> sample_rows(InFlight& f, model::StepOutput& output);
  /// Applies the stop rules to `sampled` and finishes the stopped and the
  /// abort-requested sequences of `sched` into `results`.
  void finish_sequences(const SchedulerOutput& sched, const std::vector<Sequence*>& sampled,
                        std::vector<RequestOutput>& results);
  /// Stop rules after a token was appended; the finish reason or none.
  FinishReason check_stop(Sequence& seq);
  static RequestOutput to_output(Sequence& seq);

  model::ModelExecutor* executor_;
  const text::Tokenizer* tokenizer_;
  EngineConfig config_;
  Scheduler scheduler_;
  KvCacheIo kv_io_;
  KvStreamSink* kv_sink_ = nullptr;
  PrefixTier* prefix_tier_ = nullptr;
  bool stream_prompt_by_layer_ = false;
  /// Arms the executor's layer hook for the prefill chunks of `sched`
  /// (set_stream_prompt_by_layer); returns the sequences it will stream.
  struct LayerStream {
    std::uint64_t seq_id = 0;
    int token_begin = 0;
    int token_end = 0;
  };
  /// One step's layer-by-layer prompt streaming.
  struct LayerStreaming {
    std::vector<LayerStream> seqs;  ///< the step's prefill chunks that stream by layer (none: off)
    int layers_done = 0;            ///< layers whose increments went out (or, stream-ordered, were queued)
    Status error = Status::ok_status();
    /// Stream-ordered copiers: the ticket of each layer's copies, in order.
    std::vector<std::pair<int, std::uint64_t>> tickets;
  };
  /// Sets the executor's layer hook for `sched`'s step when it streams by
  /// layer (`ls.seqs` empty when not). The hook pushes each layer's
  /// increments, or, with a copier that orders copies on the device, begins
  /// them (finish_layer_streaming pushes them once the step returned).
  void arm_layer_streaming(const SchedulerOutput& sched, LayerStreaming& ls);
  /// Clears the hook; ends the step's stream-ordered copies (always) and
  /// pushes their increments (when the step ran). Errors: the hook's or a copy's.
  [[nodiscard]] Status finish_layer_streaming(LayerStreaming& ls, bool step_ran);
  /// The increment of `ls` for layer `layer` of a sequence.
  [[nodiscard]] KvIncrement layer_increment(const LayerStream& ls, int layer, std::vector<std::byte> chunk);
  std::vector<RequestOutput> aborted_;
  /// An error abort_request() met applying the mover's completions (it
  /// returns a bool): the next step() returns it.
  Status deferred_error_ = Status::ok_status();
  /// Fills constrained sequences' next masks beside the forward pass.
  GrammarMaskFiller grammar_masks_;
  std::deque<InFlight> in_flight_;  ///< micro-batches submitted, oldest first
  std::vector<StepStats> step_stats_;
  std::function<void(const StepStats&)> step_callback_;
  EngineParts parts_;  ///< what the phase hook works on (this engine's own)
  std::unique_ptr<StepPhaseHook> phases_;  ///< EngineConfig::step_phases', when set
};

}  // namespace shardline::engine
