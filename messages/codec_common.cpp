// The codec's shared part: the frame checks, the field helpers and the
// structs of common.capnp (see messages/codec_detail.hpp).
#include <capnp/serialize.h>
#include <kj/array.h>
#include <kj/exception.h>
#include <kj/io.h>

#include <cstring>
#include <exception>
#include <new>
#include <utility>

#include "sampling/structured_output/grammar.hpp"
#include "engine/policies/token_budget_policies.hpp"
#include "messages/codec_detail.hpp"

namespace shardline::messages::detail {

using worker::BatchChoice;
using worker::BatchRequest;
using worker::BatchResult;

// ============================================================================
// failures and frame
// ============================================================================

void fail(ErrorCode code, std::string message) { throw DecodeFailure{code, std::move(message)}; }

std::string Where::prefix() const {
  return kind ? std::string(what) + " " + kind + ": " : std::string(what) + ": ";
}

namespace {

std::uint32_t le32(const kj::byte* p) {
  return std::uint32_t{p[0]} | std::uint32_t{p[1]} << 8 | std::uint32_t{p[2]} << 16 |
         std::uint32_t{p[3]} << 24;
}

/// Cap'n Proto's description without the failed-condition source text:
/// "expected boundsCheck(...); Message contained out-of-bounds struct pointer."
/// -> "Message contained out-of-bounds struct pointer."
std::string describe(const kj::Exception& e) {
  std::string d = e.getDescription().cStr();
  if (d.rfind("expected ", 0) == 0) {
    if (auto semi = d.find("; "); semi != std::string::npos) d.erase(0, semi + 2);
  }
  return d;
}

}  // namespace

Status read_frame(std::string_view bytes, const char* what,
                  kj::FunctionParam<void(capnp::MessageReader&, Where&)> body) noexcept {
  Where where{what};
  try {
    if (bytes.empty()) return Error{ErrorCode::corrupt, where.prefix() + "empty message"};
    if (bytes.size() > kMaxMessageBytes)
      return Error{ErrorCode::invalid_argument,
                   where.prefix() + "message of " + std::to_string(bytes.size()) +
                       " bytes exceeds the limit of " + std::to_string(kMaxMessageBytes) + " bytes"};
    if (bytes.size() % sizeof(capnp::word) != 0)
      return Error{ErrorCode::corrupt, where.prefix() + "size " + std::to_string(bytes.size()) +
                                           " bytes is not a multiple of 8"};
    const std::size_t total_words = bytes.size() / sizeof(capnp::word);
    // Cap'n Proto readers need 8-byte alignment: copy.
    kj::Array<capnp::word> words = kj::heapArray<capnp::word>(total_words);
    std::memcpy(words.begin(), bytes.data(), bytes.size());

    // Segment table: u32 (count - 1), then count u32 sizes in words, padded to 8 bytes.
    const auto* raw = reinterpret_cast<const kj::byte*>(words.begin());
    const std::uint64_t segments = std::uint64_t{le32(raw)} + 1;
    if (segments > kMaxSegments)
      return Error{ErrorCode::corrupt, where.prefix() + "segment table declares " +
                                           std::to_string(segments) + " segments, more than " +
                                           std::to_string(kMaxSegments)};
    const std::uint64_t table_words = segments / 2 + 1;
    if (table_words > total_words)
      return Error{ErrorCode::corrupt, where.prefix() + "truncated segment table (" +
                                           std::to_string(segments) + " segments, " +
                                           std::to_string(bytes.size()) + " bytes)"};
    std::uint64_t declared = table_words;
    for (std::uint64_t i = 0; i < segments; ++i) declared += le32(raw + 4 + 4 * i);
    if (declared != total_words)
      return Error{ErrorCode::corrupt,
                   where.prefix() + "segment table declares " + std::to_string(declared * 8) +
                       " bytes, the message has " + std::to_string(bytes.size())};

    capnp::ReaderOptions options;
    options.traversalLimitInWords = 2 * total_words + 64;
    options.nestingLimit = kMaxNestingDepth;
    capnp::FlatArrayMessageReader reader(words.asPtr(), options);
    body(reader, where);
    return Status::ok_status();
  } catch (const DecodeFailure& f) {
    return Error{f.code, where.prefix() + f.message};
  } catch (const kj::Exception& e) {
    return Error{ErrorCode::corrupt, where.prefix() + describe(e)};
  } catch (const std::bad_alloc&) {
    return Error{ErrorCode::out_of_memory, where.prefix() + "out of memory while decoding"};
  } catch (const std::exception& e) {
    return Error{ErrorCode::corrupt, where.prefix() + e.what()};
  } catch (...) {
    return Error{ErrorCode::internal, where.prefix() + "unknown exception while decoding"};
  }
}

void check_version(std::uint16_t version) {
  if (version != kSchemaVersion)
    fail(ErrorCode::invalid_argument,
         "schema version " + std::to_string(version) + ", expected " + std::to_string(kSchemaVersion));
}

std::string to_bytes(capnp::MessageBuilder& mb) {
  const std::size_t words = capnp::computeSerializedSizeInWords(mb);
  std::string out(words * sizeof(capnp::word), '\0');
  kj::ArrayOutputStream os(kj::arrayPtr(reinterpret_cast<kj::byte*>(out.data()), out.size()));
  capnp::writeMessage(os, mb);
  return out;
}

// ============================================================================
// fields
// ============================================================================

capnp::Text::Reader text(const std::string& s) { return capnp::Text::Reader(s.c_str(), s.size()); }

capnp::Data::Reader data(const std::string& s) {
  return capnp::Data::Reader(reinterpret_cast<const kj::byte*>(s.data()), s.size());
}

std::string str(capnp::Text::Reader t) { return std::string(t.cStr(), t.size()); }

std::string str(capnp::Data::Reader d) {
  return std::string(reinterpret_cast<const char*>(d.begin()), d.size());
}

std::string at(const std::string& field, std::size_t i) {
  return field + "[" + std::to_string(i) + "]";
}

void set_texts(capnp::List<capnp::Text>::Builder list, const std::vector<std::string>& v) {
  for (unsigned i = 0; i < v.size(); ++i) list.set(i, text(v[i]));
}

std::vector<std::string> get_texts(capnp::List<capnp::Text>::Reader list, const std::string& field) {
  check_len(list, field);
  std::vector<std::string> out;
  out.reserve(list.size());
  for (auto t : list) out.push_back(str(t));
  return out;
}

std::string get_token_budget(capnp::Text::Reader r, const std::string& field) {
  std::string name = str(r);
  if (name.empty()) return name;
  if (Status st = engine::check_token_budget_policy_name(name); !st)
    fail(ErrorCode::invalid_argument, field + ": " + st.error().message);
  return name;
}

std::optional<engine::ParallelConfig> get_parallel(capnp::Text::Reader r, const std::string& field) {
  const std::string text = str(r);
  if (text.empty()) return std::nullopt;
  auto pc = engine::parse_parallel_config(text);
  if (!pc) fail(ErrorCode::invalid_argument, field + ": " + pc.error().message);
  return *pc;
}

namespace {

template <class T, class Builder>
void set_list(Builder list, const std::vector<T>& v) {
  for (unsigned i = 0; i < v.size(); ++i) list.set(i, v[i]);
}

template <class T, class Reader>
std::vector<T> get_list(Reader list, const std::string& field) {
  check_len(list, field);
  std::vector<T> out;
  out.reserve(list.size());
  for (auto x : list) out.push_back(static_cast<T>(x));
  return out;
}

std::vector<std::int32_t> get_token_ids(capnp::List<std::int32_t>::Reader list,
                                        const std::string& field) {
  auto ids = get_list<std::int32_t>(list, field);
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0)
      fail(ErrorCode::invalid_argument,
           field + "[" + std::to_string(i) + "]: token id must be >= 0, got " + std::to_string(ids[i]));
  return ids;
}

void check_nonneg(std::int64_t v, const std::string& field) {
  if (v < 0) fail(ErrorCode::invalid_argument, field + " must be >= 0, got " + std::to_string(v));
}

// ---- SamplingParams ----

void put(wire::SamplingParams::Builder b, const sampling::SamplingParams& p) {
  b.setTemperature(p.temperature);
  b.setTopK(p.top_k);
  b.setTopP(p.top_p);
  b.setMinP(p.min_p);
  b.setRepetitionPenalty(p.repetition_penalty);
  b.setPresencePenalty(p.presence_penalty);
  b.setFrequencyPenalty(p.frequency_penalty);
  b.setSeed(p.seed);
  b.setHasSeed(p.has_seed);
  b.setMaxTokens(p.max_tokens);
  b.setMinTokens(p.min_tokens);
  b.setIgnoreEos(p.ignore_eos);
  set_list(b.initStopTokenIds(static_cast<unsigned>(p.stop_token_ids.size())), p.stop_token_ids);
  set_texts(b.initStop(static_cast<unsigned>(p.stop.size())), p.stop);
  b.setLogprobs(p.logprobs);
}

sampling::SamplingParams get(wire::SamplingParams::Reader r, const std::string& field) {
  sampling::SamplingParams p;
  p.temperature = r.getTemperature();
  p.top_k = r.getTopK();
  p.top_p = r.getTopP();
  p.min_p = r.getMinP();
  p.repetition_penalty = r.getRepetitionPenalty();
  p.presence_penalty = r.getPresencePenalty();
  p.frequency_penalty = r.getFrequencyPenalty();
  p.seed = r.getSeed();
  p.has_seed = r.getHasSeed();
  p.max_tokens = r.getMaxTokens();
  p.min_tokens = r.getMinTokens();
  p.ignore_eos = r.getIgnoreEos();
  p.stop_token_ids = get_list<int>(r.getStopTokenIds(), field + ".stopTokenIds");
  p.stop = get_texts(r.getStop(), field + ".stop");
  p.logprobs = r.getLogprobs();
  if (Status s = p.validate(); !s) fail(ErrorCode::invalid_argument, field + ": " + s.error().message);
  return p;
}

}  // namespace

// ============================================================================
// shared structs
// ============================================================================

// ---- ErrorReply ----

void put(wire::ErrorReply::Builder b, const Error& e) {
  b.setCode(static_cast<wire::ErrorCode>(static_cast<std::uint16_t>(e.code)));
  b.setMessage(text(e.message));
}

Error get(wire::ErrorReply::Reader r) {
  const auto code = static_cast<std::uint16_t>(r.getCode());
  if (code > static_cast<std::uint16_t>(ErrorCode::disk_full))
    fail(ErrorCode::corrupt, "code: unknown error code " + std::to_string(code));
  return Error{static_cast<ErrorCode>(code), str(r.getMessage())};
}

// ---- BatchRequest ----

void put(wire::BatchRequest::Builder b, const worker::BatchRequest& r) {
  b.setJobId(r.job_id);
  b.setLineIndex(r.line_index);
  b.setCustomId(text(r.custom_id));
  b.setPrompt(text(r.prompt));
  set_list(b.initPromptTokenIds(static_cast<unsigned>(r.prompt_token_ids.size())), r.prompt_token_ids);
  put(b.initParams(), r.params);
  b.setReturnTokenIds(r.return_token_ids);
  b.setN(r.n);
  b.setTokenBudget(text(r.token_budget));
  auto resume = b.initResume(static_cast<unsigned>(r.resume.size()));
  for (unsigned i = 0; i < r.resume.size(); ++i) {
    const worker::ChoiceResume& c = r.resume[i];
    set_list(resume[i].initOutputIds(static_cast<unsigned>(c.output_ids.size())), c.output_ids);
    resume[i].setNumKvTokens(c.num_kv_tokens);
  }
  b.setChat(r.chat);
  b.setMessagesJson(text(r.messages_json));
  b.setChatTemplateKwargsJson(text(r.chat_template_kwargs_json));
  b.setAddGenerationPrompt(r.add_generation_prompt);
  b.setChatTemplate(text(r.chat_template));
  b.setMaxTokensFromContext(r.max_tokens_from_context);
  b.setEcho(r.echo);
  b.setGrammarKind(text(r.grammar_kind));
  b.setGrammarText(text(r.grammar_text));
  auto choices = b.initGrammarChoices(static_cast<unsigned>(r.grammar_choices.size()));
  for (unsigned i = 0; i < r.grammar_choices.size(); ++i) choices.set(i, text(r.grammar_choices[i]));
  b.setGrammarAnyWhitespace(r.grammar_any_whitespace);
}

BatchRequest get(wire::BatchRequest::Reader r, const std::string& field) {
  BatchRequest q;
  q.job_id = r.getJobId();
  q.line_index = r.getLineIndex();
  q.custom_id = str(r.getCustomId());
  q.prompt = str(r.getPrompt());
  q.prompt_token_ids = get_token_ids(r.getPromptTokenIds(), field + ".promptTokenIds");
  q.params = get(r.getParams(), field + ".params");
  q.return_token_ids = r.getReturnTokenIds();
  q.n = r.getN();
  if (q.n < 1) fail(ErrorCode::invalid_argument, field + ".n must be >= 1, got " + std::to_string(q.n));
  q.token_budget = get_token_budget(r.getTokenBudget(), field + ".tokenBudget");
  auto resume = r.getResume();
  check_len(resume, field + ".resume");
  if (resume.size() != 0 && static_cast<int>(resume.size()) != q.n)
    fail(ErrorCode::invalid_argument, field + ".resume has " + std::to_string(resume.size()) +
                                          " choices, the line has n = " + std::to_string(q.n));
  q.resume.reserve(resume.size());
  for (unsigned i = 0; i < resume.size(); ++i) {
    const std::string f = at(field + ".resume", i);
    worker::ChoiceResume c;
    c.output_ids = get_token_ids(resume[i].getOutputIds(), f + ".outputIds");
    c.num_kv_tokens = resume[i].getNumKvTokens();
    check_nonneg(c.num_kv_tokens, f + ".numKvTokens");
    q.resume.push_back(std::move(c));
  }
  q.chat = r.getChat();
  q.messages_json = str(r.getMessagesJson());
  q.chat_template_kwargs_json = str(r.getChatTemplateKwargsJson());
  q.add_generation_prompt = r.getAddGenerationPrompt();
  q.chat_template = str(r.getChatTemplate());
  q.max_tokens_from_context = r.getMaxTokensFromContext();
  q.echo = r.getEcho();
  q.grammar_kind = str(r.getGrammarKind());
  if (!q.grammar_kind.empty() && !sampling::parse_grammar_kind(q.grammar_kind))
    fail(ErrorCode::invalid_argument, field + ".grammarKind: unknown kind \"" + q.grammar_kind + "\"");
  q.grammar_text = str(r.getGrammarText());
  auto choices = r.getGrammarChoices();
  check_len(choices, field + ".grammarChoices");
  for (unsigned i = 0; i < choices.size(); ++i) q.grammar_choices.push_back(str(choices[i]));
  q.grammar_any_whitespace = r.getGrammarAnyWhitespace();
  if (q.chat && q.messages_json.empty()) fail(ErrorCode::invalid_argument, field + ": a chat line without messages");
  return q;
}

// ---- BatchChoice / BatchResult ----

namespace {

void put(wire::TokenLogprobText::Builder b, const worker::TokenLogprobText& t) {
  b.setToken(text(t.token));
  b.setBytes(kj::arrayPtr(reinterpret_cast<const kj::byte*>(t.bytes.data()), t.bytes.size()));
  b.setLogprob(t.logprob);
}

worker::TokenLogprobText get(wire::TokenLogprobText::Reader r) {
  worker::TokenLogprobText t;
  t.token = str(r.getToken());
  const auto bytes = r.getBytes();
  t.bytes.assign(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
  t.logprob = r.getLogprob();
  return t;
}

}  // namespace

void put(wire::BatchChoice::Builder b, const BatchChoice& c) {
  b.setIndex(c.index);
  b.setText(text(c.text));
  b.setFinishReason(text(c.finish_reason));
  set_list(b.initTokenIds(static_cast<unsigned>(c.token_ids.size())), c.token_ids);
  auto lps = b.initLogprobs(static_cast<unsigned>(c.logprobs.size()));
  for (unsigned i = 0; i < c.logprobs.size(); ++i) {
    const worker::ChoiceTokenLogprobs& t = c.logprobs[i];
    put(lps[i].initSampled(), t.sampled);
    auto top = lps[i].initTop(static_cast<unsigned>(t.top.size()));
    for (unsigned j = 0; j < t.top.size(); ++j) put(top[j], t.top[j]);
    lps[i].setTextOffset(t.text_offset);
  }
}

BatchChoice get(wire::BatchChoice::Reader r, const std::string& field) {
  BatchChoice c;
  c.index = r.getIndex();
  check_nonneg(c.index, field + ".index");
  c.text = str(r.getText());
  c.finish_reason = str(r.getFinishReason());
  c.token_ids = get_token_ids(r.getTokenIds(), field + ".tokenIds");
  auto lps = r.getLogprobs();
  check_len(lps, field + ".logprobs");
  c.logprobs.reserve(lps.size());
  for (unsigned i = 0; i < lps.size(); ++i) {
    const std::string f = at(field + ".logprobs", i);
    worker::ChoiceTokenLogprobs t;
    t.sampled = get(lps[i].getSampled());
    auto top = lps[i].getTop();
    check_len(top, f + ".top");
    for (unsigned j = 0; j < top.size(); ++j) t.top.push_back(get(top[j]));
    t.text_offset = lps[i].getTextOffset();
    check_nonneg(t.text_offset, f + ".textOffset");
    c.logprobs.push_back(std::move(t));
  }
  return c;
}

void put(wire::BatchResult::Builder b, const BatchResult& r) {
  b.setJobId(r.job_id);
  b.setLineIndex(r.line_index);
  b.setCustomId(text(r.custom_id));
  b.setOk(r.ok);
  auto choices = b.initChoices(static_cast<unsigned>(r.choices.size()));
  for (unsigned i = 0; i < r.choices.size(); ++i) put(choices[i], r.choices[i]);
  b.setPromptTokens(r.prompt_tokens);
  b.setCompletionTokens(r.completion_tokens);
  b.setErrorCode(text(r.error_code));
  b.setErrorMessage(text(r.error_message));
  b.setChat(r.chat);
  b.setLogprobs(r.logprobs);
  b.setCachedTokens(r.cached_tokens);
}

BatchResult get(wire::BatchResult::Reader r, const std::string& field) {
  BatchResult out;
  out.job_id = r.getJobId();
  out.line_index = r.getLineIndex();
  out.custom_id = str(r.getCustomId());
  out.ok = r.getOk();
  auto choices = r.getChoices();
  check_len(choices, field + ".choices");
  out.choices.reserve(choices.size());
  for (unsigned i = 0; i < choices.size(); ++i)
    out.choices.push_back(get(choices[i], at(field + ".choices", i)));
  out.prompt_tokens = r.getPromptTokens();
  check_nonneg(out.prompt_tokens, field + ".promptTokens");
  out.completion_tokens = r.getCompletionTokens();
  check_nonneg(out.completion_tokens, field + ".completionTokens");
  out.error_code = str(r.getErrorCode());
  out.error_message = str(r.getErrorMessage());
  out.chat = r.getChat();
  out.logprobs = r.getLogprobs();
  out.cached_tokens = r.getCachedTokens();
  check_nonneg(out.cached_tokens, field + ".cachedTokens");
  return out;
}

// ---- JobProgress / WorkerStatus / ActorInfo ----

void put(wire::JobProgress::Builder b, const JobProgress& p) {
  b.setJobId(p.job_id);
  b.setState(text(p.state));
  b.setTotal(p.total);
  b.setDone(p.done);
  b.setFailed(p.failed);
  b.setPromptTokens(p.prompt_tokens);
  b.setCompletionTokens(p.completion_tokens);
  b.setTokensPerS(p.tokens_per_s);
  b.setEtaS(p.eta_s);
  b.setOutput(text(p.output));
  set_texts(b.initInputs(static_cast<unsigned>(p.inputs.size())), p.inputs);
  b.setParallel(text(p.parallel));
  b.setTokenBudget(text(p.token_budget));
  b.setRequeued(p.requeued);
  b.setResumed(p.resumed);
  b.setError(text(p.error));
  b.setPaused(text(p.paused));
  b.setCachedTokens(p.cached_tokens);
  b.setPrefixOrdered(p.prefix_ordered);
  b.setPrefixIdealHitRate(p.prefix_ideal_hit_rate);
}

JobProgress get(wire::JobProgress::Reader r) {
  JobProgress p;
  p.job_id = r.getJobId();
  p.state = str(r.getState());
  p.total = r.getTotal();
  p.done = r.getDone();
  p.failed = r.getFailed();
  p.prompt_tokens = r.getPromptTokens();
  p.completion_tokens = r.getCompletionTokens();
  p.tokens_per_s = r.getTokensPerS();
  p.eta_s = r.getEtaS();
  p.output = str(r.getOutput());
  p.inputs = get_texts(r.getInputs(), "jobProgress.inputs");
  p.parallel = str(r.getParallel());
  p.token_budget = str(r.getTokenBudget());
  p.requeued = r.getRequeued();
  p.resumed = r.getResumed();
  p.error = str(r.getError());
  p.paused = str(r.getPaused());
  p.cached_tokens = r.getCachedTokens();
  p.prefix_ordered = r.getPrefixOrdered();
  p.prefix_ideal_hit_rate = r.getPrefixIdealHitRate();
  return p;
}

void put(wire::WorkerStatus::Builder b, const WorkerStatus& s) {
  b.setWorkerName(text(s.worker_name));
  b.setDevice(text(s.device));
  b.setState(text(s.state));
  b.setNumRunning(s.num_running);
  b.setNumWaiting(s.num_waiting);
  b.setKvBlocksUsed(s.kv_blocks_used);
  b.setKvBlocksTotal(s.kv_blocks_total);
  b.setPromptTokens(s.prompt_tokens);
  b.setGeneratedTokens(s.generated_tokens);
  b.setStepsDone(s.steps_done);
  b.setWeightBytes(s.weight_bytes);
  b.setSidpMode(text(s.sidp_mode));
  b.setSeesawPhase(text(s.seesaw_phase));
  b.setSeesawTransitions(s.seesaw_transitions);
}

WorkerStatus get(wire::WorkerStatus::Reader r) {
  WorkerStatus s;
  s.worker_name = str(r.getWorkerName());
  s.device = str(r.getDevice());
  s.state = str(r.getState());
  s.num_running = r.getNumRunning();
  s.num_waiting = r.getNumWaiting();
  s.kv_blocks_used = r.getKvBlocksUsed();
  s.kv_blocks_total = r.getKvBlocksTotal();
  s.prompt_tokens = r.getPromptTokens();
  s.generated_tokens = r.getGeneratedTokens();
  s.steps_done = r.getStepsDone();
  s.weight_bytes = r.getWeightBytes();
  s.sidp_mode = str(r.getSidpMode());
  check_sidp_mode(s.sidp_mode, "workerStatus.sidpMode", true);
  s.seesaw_phase = str(r.getSeesawPhase());
  if (!s.seesaw_phase.empty() && s.seesaw_phase != "prefill" && s.seesaw_phase != "decode")
    fail(ErrorCode::invalid_argument,
         "workerStatus.seesawPhase: a Seesaw phase is \"prefill\" or \"decode\" (or empty), got \"" + s.seesaw_phase +
             "\"");
  s.seesaw_transitions = r.getSeesawTransitions();
  return s;
}

// ---- SiDP ----

void check_sidp_mode(const std::string& mode, const std::string& field, bool allow_empty) {
  if (mode == "was" || mode == "cas" || (allow_empty && mode.empty())) return;
  fail(ErrorCode::invalid_argument, field + ": a SiDP mode is \"was\" or \"cas\"" +
                                        std::string(allow_empty ? " (or empty)" : "") + ", got \"" + mode + "\"");
}

void put(wire::SidpGroupStatus::Builder b, const SidpGroupStatus& g) {
  b.setGroup(text(g.group));
  b.setMode(text(g.mode));
  b.setSetting(text(g.setting));
  b.setNumRanks(g.num_ranks);
  b.setSwitchBatch(g.switch_batch);
  b.setGroupBatch(g.group_batch);
  auto list = b.initSwitches(static_cast<unsigned>(g.switches.size()));
  for (unsigned i = 0; i < list.size(); ++i) {
    const SidpSwitchRecord& s = g.switches[i];
    list[i].setToMode(text(s.to_mode));
    list[i].setAtUnixMs(s.at_unix_ms);
    list[i].setGroupBatch(s.group_batch);
    list[i].setEpoch(s.epoch);
  }
  b.setNumSwitches(g.num_switches);
}

SidpGroupStatus get(wire::SidpGroupStatus::Reader r, const std::string& field) {
  SidpGroupStatus g;
  g.group = str(r.getGroup());
  g.mode = str(r.getMode());
  check_sidp_mode(g.mode, field + ".mode", false);
  g.setting = str(r.getSetting());
  g.num_ranks = r.getNumRanks();
  g.switch_batch = r.getSwitchBatch();
  g.group_batch = r.getGroupBatch();
  auto list = r.getSwitches();
  check_len(list, field + ".switches");
  g.switches.reserve(list.size());
  for (unsigned i = 0; i < list.size(); ++i) {
    SidpSwitchRecord s{str(list[i].getToMode()), list[i].getAtUnixMs(), list[i].getGroupBatch(), list[i].getEpoch()};
    check_sidp_mode(s.to_mode, field + ".switches[" + std::to_string(i) + "].toMode", false);
    g.switches.push_back(std::move(s));
  }
  g.num_switches = r.getNumSwitches();
  return g;
}

void put(wire::ActorInfo::Builder b, const ActorInfo& a) {
  b.setName(text(a.name));
  b.setKind(text(a.kind));
  b.setNode(text(a.node));
  b.setState(text(a.state));
  b.setParallel(text(a.parallel));
  b.setDetail(text(a.detail));
}

ActorInfo get(wire::ActorInfo::Reader r) {
  return ActorInfo{str(r.getName()),  str(r.getKind()),     str(r.getNode()),
                   str(r.getState()), str(r.getParallel()), str(r.getDetail())};
}

// ---- KvProgress ----

void put(wire::KvProgress::Builder b, const worker::KvProgress& p) {
  b.setJobId(p.job_id);
  b.setLineIndex(p.line_index);
  b.setChoice(p.choice);
  b.setReplicatedTokens(p.replicated_tokens);
  set_list(b.initOutputIds(static_cast<unsigned>(p.output_ids.size())), p.output_ids);
}

worker::KvProgress get(wire::KvProgress::Reader r, const std::string& field) {
  worker::KvProgress p;
  p.job_id = r.getJobId();
  p.line_index = r.getLineIndex();
  p.choice = r.getChoice();
  check_nonneg(p.choice, field + ".choice");
  p.replicated_tokens = r.getReplicatedTokens();
  check_nonneg(p.replicated_tokens, field + ".replicatedTokens");
  p.output_ids = get_token_ids(r.getOutputIds(), field + ".outputIds");
  return p;
}

}  // namespace shardline::messages::detail
