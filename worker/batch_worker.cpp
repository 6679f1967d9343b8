#include "worker/batch_worker.hpp"
#include "model/tokenizer_loader.hpp"

#include <algorithm>
#include <cmath>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/json_bounded.hpp"
#include "text/bpe_tokenizer.hpp"
#include "sampling/rng.hpp"

namespace shardline::worker {

using engine::EngineInstance;
using engine::LlmEngine;
using engine::BlockManager;
using engine::RequestOutput;
using engine::Scheduler;


namespace {

/// Domain separator of line-derived seeds ("Shardlin"), so they never
/// coincide with the engine's own sampling::mix_seed(engine seed, request id) chain.
constexpr std::uint64_t kLineSeedDomain = 0x53686172646C696EULL;

}  // namespace

BatchWorker::BatchWorker(EngineInstance engine, std::string name) : engine_(std::move(engine)), name_(std::move(name)) {}

Result<BatchWorker> BatchWorker::create(EngineInstance engine, std::string name) {
  if (!engine.engine) return make_error(ErrorCode::invalid_argument, "batch worker '" + name + "': no engine");
  if (!engine.tokenizer) return make_error(ErrorCode::invalid_argument, "batch worker '" + name + "': no tokenizer");
  return BatchWorker(std::move(engine), std::move(name));
}

std::uint64_t BatchWorker::derive_choice_seed(std::uint64_t job_id, std::uint64_t line_index, int choice) noexcept {
  return sampling::mix_seed(sampling::mix_seed(sampling::mix_seed(kLineSeedDomain, job_id), line_index), static_cast<std::uint64_t>(choice));
}

std::string BatchWorker::context_length_message(int max_model_len, std::uint64_t prompt_tokens, int max_tokens,
                                                bool lower_bound) {
  const std::uint64_t total = prompt_tokens + static_cast<std::uint64_t>(std::max(max_tokens, 0));
  const std::string at_least = lower_bound ? "at least " : "";
  return "This model's maximum context length is " + std::to_string(max_model_len) + " tokens. However, you requested " +
         at_least + std::to_string(total) + " tokens (" + at_least + std::to_string(prompt_tokens) +
         " in the messages, " + std::to_string(max_tokens) +
         " in the completion). Please reduce the length of the messages or completion.";
}

bool BatchWorker::holds(const LineKey& key) const {
  if (lines_.count(key) != 0) return true;
  return std::any_of(ready_.begin(), ready_.end(), [&](const BatchResult& r) {
    return r.job_id == key.first && r.line_index == key.second;
  });
}

void BatchWorker::push_error(const BatchRequest& request, std::string code, std::string message) {
  BatchResult r;
  r.job_id = request.job_id;
  r.line_index = request.line_index;
  r.custom_id = request.custom_id;
  r.ok = false;
  r.error_code = std::move(code);
  r.error_message = std::move(message);
  ready_.push_back(std::move(r));
}

Result<std::string> BatchWorker::render_chat(const BatchRequest& request) {
  auto it = chat_templates_.find(request.chat_template);
  if (it == chat_templates_.end()) {
    if (chat_templates_.size() >= 16) chat_templates_.clear();  // job templates: a small cache
    auto loaded = request.chat_template.empty()
                      ? model::load_chat_template(engine_.tokenizer_dir)
                      : model::chat_template_from_source(engine_.tokenizer_dir, request.chat_template,
                                                         "the job's --chat-template");
    Result<std::shared_ptr<const text::ChatTemplate>> entry =
        loaded.ok() ? Result<std::shared_ptr<const text::ChatTemplate>>(
                          std::make_shared<const text::ChatTemplate>(std::move(loaded).value()))
                    : Result<std::shared_ptr<const text::ChatTemplate>>(std::move(loaded).error());
    it = chat_templates_.emplace(request.chat_template, std::move(entry)).first;
  }
  if (!it->second.ok()) {
    Error e = it->second.error();
    constexpr std::string_view kTag = "chat_template_missing: ";
    if (e.message.rfind(kTag, 0) == 0) e.message.erase(0, kTag.size());
    return e;
  }
  const auto messages = parse_json_bounded<nlohmann::ordered_json>(request.messages_json);
  if (!messages.ok() || !messages->is_array())
    return make_error(ErrorCode::invalid_argument, "messages: not a JSON array");
  auto kwargs = nlohmann::ordered_json::object();
  if (!request.chat_template_kwargs_json.empty()) {
    auto parsed = parse_json_bounded<nlohmann::ordered_json>(request.chat_template_kwargs_json);
    if (!parsed.ok() || !parsed->is_object())
      return make_error(ErrorCode::invalid_argument, "chat_template_kwargs: not a JSON object");
    kwargs = std::move(parsed).value();
  }
  Result<std::string> prompt = (*it->second)->render(*messages, request.add_generation_prompt, kwargs);
  if (!prompt.ok()) return make_error(prompt.error().code, "chat template: " + prompt.error().message);
  return prompt;
}

namespace {

/// Code points of valid UTF-8 text.
int code_points(std::string_view s) {
  int n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80 ? 1 : 0;
  return n;
}

}  // namespace

std::vector<ChoiceTokenLogprobs> BatchWorker::logprob_texts(const std::vector<sampling::SampleLogprobs>& lps,
                                                            int offset) const {
  const text::Tokenizer& tok = *engine_.tokenizer;
  auto text_of = [&](const sampling::TokenLogprob& t) {
    TokenLogprobText out;
    out.bytes = tok.token_bytes(t.token_id);
    out.token = text::utf8_lossy(out.bytes);
    // JSON has no -inf: vLLM writes -9999.0.
    out.logprob = std::isfinite(t.logprob) ? t.logprob : -9999.0f;
    return out;
  };
  std::vector<ChoiceTokenLogprobs> out;
  out.reserve(lps.size());
  for (const sampling::SampleLogprobs& lp : lps) {
    ChoiceTokenLogprobs c;
    c.sampled = text_of(lp.sampled);
    for (const sampling::TokenLogprob& t : lp.top) c.top.push_back(text_of(t));
    c.text_offset = offset;
    offset += code_points(c.sampled.token);
    out.push_back(std::move(c));
  }
  return out;
}

class BatchWorker::StreamAdapter final : public engine::KvStreamSink {
 public:
  StreamAdapter(KvStreamer* streamer, const std::unordered_map<std::uint64_t, RequestRef>* requests,
                StorePrefixTier* prefix_tier)
      : streamer_(streamer), requests_(requests), prefix_tier_(prefix_tier) {}
  void set_prefix_tier(StorePrefixTier* tier) { prefix_tier_ = tier; }
  bool accepting() const override { return streamer_->accepting(); }
  /// A cached head whose blocks the node's KV store keeps (or is about to:
  /// the prefix tier sends them) goes as a link, not as KV.
  int link_prefix(std::uint64_t request_id, std::uint64_t root, std::span<const std::uint64_t> names,
                  std::span<const std::int32_t> token_ids, int num_prompt_tokens) override {
    StorePrefixTier* tier = prefix_tier_;
    if (tier == nullptr || !streamer_->takes_prefix_links() || names.empty()) return 0;
    const auto it = requests_->find(request_id);
    if (it == requests_->end()) return 0;
    const std::size_t k = tier->linkable_blocks(names);
    if (k == 0) return 0;
    const std::size_t block = token_ids.size() / names.size();
    const int linked = static_cast<int>(k * block);
    QueuedIncrement q;
    q.key = kvstore::KvChunkKey{it->second.line.first, kv_request_key(it->second.line.second, it->second.choice),
                                kvstore::KvRange{0, streamer_->num_layers(), 0, linked}};
    q.token_ids.assign(token_ids.begin(), token_ids.begin() + linked);
    q.num_prompt_tokens = num_prompt_tokens;
    q.link = QueuedLink{tier->salt(), root, std::vector<std::uint64_t>(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(k))};
    streamer_->push(std::move(q));
    return linked;
  }
  void push(engine::KvIncrement inc) override {
    const auto it = requests_->find(inc.request_id);
    if (it == requests_->end()) return;  // aborted
    QueuedIncrement q;
    q.key = kvstore::KvChunkKey{it->second.line.first, kv_request_key(it->second.line.second, it->second.choice),
                                inc.range};
    q.chunk = std::move(inc.chunk);
    q.token_ids = std::move(inc.token_ids);
    q.num_prompt_tokens = inc.num_prompt_tokens;
    streamer_->push(std::move(q));
  }
  /// A finished or cancelled choice: its queued KV is garbage.
  void forget(const RequestRef& ref) {
    (void)streamer_->forget_request(ref.line.first, kv_request_key(ref.line.second, ref.choice));
  }

 private:
  KvStreamer* streamer_;
  const std::unordered_map<std::uint64_t, RequestRef>* requests_;
  StorePrefixTier* prefix_tier_;  ///< the worker's (null: none, every position is streamed)
};

void BatchWorker::set_prefix_store_tier(StorePrefixTier* tier) {
  prefix_store_tier_ = tier;
  if (stream_adapter_) stream_adapter_->set_prefix_tier(tier);
}

bool BatchWorker::restream_kv(std::uint64_t job_id, std::uint64_t request_key) {
  for (const auto& [id, ref] : *requests_)
    if (ref.line.first == job_id && kv_request_key(ref.line.second, ref.choice) == request_key)
      return engine_.engine->restream_kv(id);
  return false;
}

BatchWorker::BatchWorker(BatchWorker&&) noexcept = default;
BatchWorker& BatchWorker::operator=(BatchWorker&&) noexcept = default;
BatchWorker::~BatchWorker() = default;

void BatchWorker::set_kv_streamer(KvStreamer* streamer) {
  if (streamer == nullptr) {
    engine_.engine->set_kv_sink(nullptr);
    engine_.engine->set_stream_prompt_by_layer(false);
    stream_adapter_.reset();
    return;
  }
  stream_adapter_ = std::make_unique<StreamAdapter>(streamer, requests_.get(), prefix_store_tier_);
  engine_.engine->set_kv_sink(stream_adapter_.get());
  engine_.engine->set_stream_prompt_by_layer(true);
}

void BatchWorker::submit(BatchRequest request) {
  const LineKey key{request.job_id, request.line_index};
  if (holds(key)) return;  // re-sent line: one result only
  LlmEngine& eng = *engine_.engine;
  const text::Tokenizer& tok = *engine_.tokenizer;

  if (request.n < 1) {
    push_error(request, "invalid_parameter", "n must be >= 1, got " + std::to_string(request.n));
    return;
  }
  if (Status s = request.params.validate(); !s.ok()) {
    push_error(request, "invalid_parameter", s.error().message);
    return;
  }

  // Structured outputs: the line's grammar (a schema the grammar engine
  // cannot compile or enforce fails this line only).
  std::shared_ptr<const sampling::CompiledGrammar> grammar;
  if (!request.grammar_kind.empty()) {
    if (request.params.ignore_eos) {
      push_error(request, "invalid_parameter",
                 "ignore_eos: a structured output ends with its grammar, so it cannot ignore EOS");
      return;
    }
    Result<std::shared_ptr<const sampling::CompiledGrammar>> g = compile_grammar(request);
    if (!g.ok()) {
      push_error(request, "invalid_response_format", g.error().message);
      return;
    }
    grammar = std::move(g).value();
  }

  // A long prompt that cannot fit is refused before it is tokenized: a line
  // of megabytes would hold this thread, and so its heartbeats, for seconds
  // (issue 46, item 6). The bound never refuses a prompt that fits; shorter
  // prompts are tokenized (milliseconds) for vLLM's exact message.
  const int max_model_len = eng.config().max_model_len;
  const auto cannot_fit = [&](std::string_view text) {
    if (text.size() < kPrecheckPromptBytes) return false;
    const std::uint64_t min_tokens = tok.min_num_tokens(text);
    const int min_completion = request.max_tokens_from_context ? 1 : request.params.max_tokens;
    if (min_tokens + static_cast<std::uint64_t>(std::max(min_completion, 0)) <=
        static_cast<std::uint64_t>(max_model_len))
      return false;
    push_error(request, "context_length_exceeded",
               context_length_message(max_model_len, min_tokens, min_completion, /*lower_bound=*/true));
    return true;
  };

  std::vector<std::int32_t> ids;
  if (request.chat) {
    Result<std::string> prompt = render_chat(request);
    if (!prompt.ok()) {
      const bool missing = prompt.error().code == ErrorCode::not_found;
      push_error(request, missing ? "chat_template_missing" : "chat_template_error", prompt.error().message);
      return;
    }
    if (cannot_fit(*prompt)) return;
    // The template wrote the special tokens (BOS, role markers) itself.
    ids = tok.encode(*prompt, /*add_special_tokens=*/false);
  } else if (!request.prompt_token_ids.empty()) {
    ids = std::move(request.prompt_token_ids);
    const int vocab = tok.vocab_size();
    for (std::size_t i = 0; i < ids.size(); ++i)
      if (ids[i] < 0 || ids[i] >= vocab) {
        push_error(request, "invalid_parameter",
                   "prompt token id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                       " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
        return;
      }
  } else if (!request.prompt.empty()) {
    if (cannot_fit(request.prompt)) return;
    ids = tok.encode(request.prompt, /*add_special_tokens=*/true);
  }
  if (ids.empty()) {
    push_error(request, "missing_prompt", "the request has no prompt: 'prompt' is missing or empty");
    return;
  }

  const int prompt_tokens = static_cast<int>(ids.size());
  if (request.max_tokens_from_context) request.params.max_tokens = std::max(1, max_model_len - prompt_tokens);
  if (static_cast<long long>(prompt_tokens) + request.params.max_tokens > max_model_len) {
    push_error(request, "context_length_exceeded",
               context_length_message(max_model_len, prompt_tokens, request.params.max_tokens));
    return;
  }

  // Logprobs of tokens generated before a failure were not replicated:
  // such a line starts again from its prompt (same seeds, same result).
  if (request.params.logprobs >= 0) request.resume.clear();

  // The persistent prefix tier: the prompt's blocks the device lacks come
  // from the node's store into host memory, where the admission takes them.
  if (prefix_store_tier_ != nullptr && static_cast<int>(request.resume.size()) != request.n)
    (void)prefix_store_tier_->prefetch(eng.uncached_prefix_blocks(ids));

  Line line;
  line.custom_id = request.custom_id;
  line.return_token_ids = request.return_token_ids;
  line.chat = request.chat;
  line.logprobs = request.params.logprobs;
  if (request.echo)
    line.echo_text = !request.prompt.empty() ? request.prompt : tok.decode(ids, /*skip_special_tokens=*/true);
  line.prompt_tokens = prompt_tokens;
  line.choices.resize(static_cast<std::size_t>(request.n));
  line.done.assign(static_cast<std::size_t>(request.n), false);
  for (int i = 0; i < request.n; ++i) {
    sampling::SamplingParams p = request.params;
    p.seed = request.params.has_seed ? request.params.seed + static_cast<std::uint64_t>(i)
                                     : derive_choice_seed(request.job_id, request.line_index, i);
    p.has_seed = true;  // never let the engine derive a seed from its request id
    const std::uint64_t rid = next_request_id_++;
    // The last choice takes the ids; the others get copies.
    std::vector<std::int32_t> prompt = i + 1 < request.n ? ids : std::move(ids);
    const bool resumes = static_cast<int>(request.resume.size()) == request.n;
    Status s = Status::ok_status();
    if (resumes) {
      ChoiceResume& cr = request.resume[static_cast<std::size_t>(i)];
      engine::ResumeState rs{std::move(cr.output_ids), cr.num_kv_tokens, std::move(cr.kv_chunk)};
      s = eng.add_request(rid, std::move(prompt), p, std::move(rs), grammar);
    } else {
      s = eng.add_request(rid, std::move(prompt), p, grammar);
    }
    if (!s.ok()) {
      for (std::uint64_t prev : line.request_ids) {
        (void)eng.abort_request(prev);  // its abort output is ignored (unknown id)
        requests_->erase(prev);
      }
      const bool bad_param = s.error().code == ErrorCode::invalid_argument;
      push_error(request, bad_param ? "invalid_parameter" : "server_error", s.error().message);
      return;
    }
    line.request_ids.push_back(rid);
    requests_->emplace(rid, RequestRef{key, i});
  }
  lines_.emplace(key, std::move(line));
}

Result<std::shared_ptr<const sampling::CompiledGrammar>> BatchWorker::compile_grammar(const BatchRequest& request) {
  if (!grammar_compiler_) {
    // A constrained output ends on the engine's stop tokens (EOS, a chat
    // model's end-of-turn), which its grammar allows once it may end.
    auto c = engine::make_grammar_compiler(engine_);
    if (!c.ok()) return std::move(c).error();
    grammar_compiler_ = std::move(c).value();
  }
  const std::optional<sampling::GrammarKind> kind = sampling::parse_grammar_kind(request.grammar_kind);
  if (!kind)
    return make_error(ErrorCode::invalid_argument, "unknown structured-output kind \"" + request.grammar_kind + "\"");
  sampling::GrammarSpec spec;
  spec.kind = *kind;
  spec.text = request.grammar_text;
  spec.choices = request.grammar_choices;
  spec.any_whitespace = request.grammar_any_whitespace;
  return grammar_compiler_->compile(spec);
}

Result<std::vector<BatchResult>> BatchWorker::step() {
  LlmEngine& eng = *engine_.engine;
  if (eng.has_unfinished()) {
    Result<std::vector<RequestOutput>> outs = eng.step();
    if (!outs.ok()) return std::move(outs).error();
    ++steps_done_;
    for (const engine::StepStats& st : eng.step_stats())
      computed_tokens_ += static_cast<std::uint64_t>(st.num_prefill_tokens + st.num_decode_tokens);
    eng.clear_step_stats();  // a long-lived worker must not grow them without bound
    for (RequestOutput& out : outs.value()) {
      const auto it = requests_->find(out.request_id);
      if (it == requests_->end()) continue;  // aborted by cancel_job or a failed submit
      const RequestRef ref = it->second;
      requests_->erase(it);
      if (stream_adapter_) stream_adapter_->forget(ref);
      const auto lit = lines_.find(ref.line);
      if (lit == lines_.end()) continue;
      Line& line = lit->second;
      const auto c = static_cast<std::size_t>(ref.choice);
      prompt_tokens_ += out.prompt_token_ids.size();
      generated_tokens_ += out.token_ids.size();
      line.completion_tokens += static_cast<int>(out.token_ids.size());
      if (ref.choice == 0) line.cached_tokens = out.num_cached_tokens;
      BatchChoice& choice = line.choices[c];
      choice.index = ref.choice;
      choice.text = line.echo_text + out.text;
      if (line.logprobs >= 0) choice.logprobs = logprob_texts(out.logprobs, code_points(line.echo_text));
      choice.finish_reason = finish_reason_name(out.finish_reason);
      if (line.return_token_ids) choice.token_ids = std::move(out.token_ids);
      if (!line.done[c]) {
        line.done[c] = true;
        ++line.num_done;
      }
      if (line.num_done < static_cast<int>(line.choices.size())) continue;
      BatchResult r;
      r.job_id = ref.line.first;
      r.line_index = ref.line.second;
      r.custom_id = std::move(line.custom_id);
      r.ok = true;
      r.chat = line.chat;
      r.logprobs = line.logprobs;
      r.choices = std::move(line.choices);
      r.prompt_tokens = line.prompt_tokens;
      r.completion_tokens = line.completion_tokens;
      r.cached_tokens = line.cached_tokens;
      ready_.push_back(std::move(r));
      lines_.erase(lit);
    }
  }
  return drain_ready();
}

std::vector<BatchResult> BatchWorker::take_finished() { return drain_ready(); }

std::vector<BatchResult> BatchWorker::drain_ready() {
  std::vector<BatchResult> out = std::move(ready_);
  ready_.clear();
  std::sort(out.begin(), out.end(), [](const BatchResult& a, const BatchResult& b) {
    return std::pair(a.job_id, a.line_index) < std::pair(b.job_id, b.line_index);
  });
  for (const BatchResult& r : out) ++(r.ok ? lines_done_ : lines_failed_);
  return out;
}

bool BatchWorker::has_work() const {
  return !ready_.empty() || !lines_.empty() || engine_.engine->has_unfinished();
}

std::size_t BatchWorker::cancel_job(std::uint64_t job_id) {
  LlmEngine& eng = *engine_.engine;
  std::size_t dropped = 0;
  auto it = lines_.lower_bound(LineKey{job_id, 0});
  while (it != lines_.end() && it->first.first == job_id) {
    for (std::uint64_t rid : it->second.request_ids) {
      if (const auto r = requests_->find(rid); r != requests_->end()) {
        if (stream_adapter_) stream_adapter_->forget(r->second);
        requests_->erase(r);
        (void)eng.abort_request(rid);
      }
    }
    it = lines_.erase(it);
    ++dropped;
  }
  const auto ready_end = std::remove_if(ready_.begin(), ready_.end(),
                                        [&](const BatchResult& r) { return r.job_id == job_id; });
  dropped += static_cast<std::size_t>(ready_.end() - ready_end);
  ready_.erase(ready_end, ready_.end());
  return dropped;
}

WorkerStatusSnapshot BatchWorker::status() const {
  const LlmEngine& eng = *engine_.engine;
  const Scheduler& sched = eng.scheduler();
  const BlockManager& blocks = sched.block_manager();
  WorkerStatusSnapshot s;
  s.name = name_;
  s.num_running = sched.num_running();
  s.num_waiting = sched.num_waiting();
  s.num_lines = static_cast<int>(lines_.size());
  s.num_ready = static_cast<int>(ready_.size());
  s.kv_blocks_total = blocks.num_blocks();
  s.kv_blocks_used = blocks.num_blocks() - blocks.num_free_blocks();
  s.block_size = blocks.block_size();
  s.prompt_tokens = prompt_tokens_;
  s.generated_tokens = generated_tokens_;
  s.steps_done = steps_done_;
  s.computed_tokens = computed_tokens_;
  s.lines_done = lines_done_;
  s.lines_failed = lines_failed_;
  s.num_preemptions = static_cast<std::uint64_t>(sched.total_preemptions());
  s.prefix_query_tokens = static_cast<std::uint64_t>(sched.prefix_query_tokens());
  s.prefix_hit_tokens = static_cast<std::uint64_t>(sched.prefix_hit_tokens());
  const engine::KvIoStats& io = eng.kv_io().stats();
  s.kv_swap_outs = io.swap_outs;
  s.prefix_tier_restored_tokens = io.prefix_tier_restored_tokens;
  s.prefix_tier_spilled_blocks = io.prefix_tier_spilled_blocks;
  s.kv_restored_tokens = io.restored_tokens;
  s.kv_resume_fallbacks = io.resume_fallbacks;
  s.kv_resume_recomputed_tokens = io.resume_recomputed_tokens;
  s.kv_streamed_bytes = io.streamed_bytes;
  return s;
}

}  // namespace shardline::worker
