#include "messages/codec.hpp"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/array.h>
#include <kj/exception.h>
#include <kj/io.h>

#include <cstring>
#include <exception>
#include <new>
#include <utility>

#include "messages/common.capnp.h"
#include "messages/kvstore.capnp.h"
#include "messages/orchestrator.capnp.h"
#include "messages/worker.capnp.h"
#include "engine/policies/token_budget_policies.hpp"

namespace shardline::messages {

using worker::BatchChoice;
using worker::BatchRequest;
using worker::BatchResult;

namespace {

// ============================================================================
// helpers
// ============================================================================

/// Thrown by the field checks inside a decode; caught by decode_frame (never
/// escapes this file).
struct DecodeFailure {
  ErrorCode code;
  std::string message;
};

[[noreturn]] void fail(ErrorCode code, std::string message) {
  throw DecodeFailure{code, std::move(message)};
}

capnp::Text::Reader text(const std::string& s) { return capnp::Text::Reader(s.c_str(), s.size()); }

capnp::Data::Reader data(const std::string& s) {
  return capnp::Data::Reader(reinterpret_cast<const kj::byte*>(s.data()), s.size());
}

std::string str(capnp::Text::Reader t) { return std::string(t.cStr(), t.size()); }

std::string str(capnp::Data::Reader d) {
  return std::string(reinterpret_cast<const char*>(d.begin()), d.size());
}

template <class List>
void check_len(const List& list, const std::string& field) {
  if (list.size() > kMaxListElements)
    fail(ErrorCode::invalid_argument, field + ": " + std::to_string(list.size()) +
                                          " elements, more than the limit of " +
                                          std::to_string(kMaxListElements));
}

template <class T, class Builder>
void set_list(Builder list, const std::vector<T>& v) {
  for (unsigned i = 0; i < v.size(); ++i) list.set(i, v[i]);
}

void set_texts(capnp::List<capnp::Text>::Builder list, const std::vector<std::string>& v) {
  for (unsigned i = 0; i < v.size(); ++i) list.set(i, text(v[i]));
}

template <class T, class Reader>
std::vector<T> get_list(Reader list, const std::string& field) {
  check_len(list, field);
  std::vector<T> out;
  out.reserve(list.size());
  for (auto x : list) out.push_back(static_cast<T>(x));
  return out;
}

std::vector<std::string> get_texts(capnp::List<capnp::Text>::Reader list, const std::string& field) {
  check_len(list, field);
  std::vector<std::string> out;
  out.reserve(list.size());
  for (auto t : list) out.push_back(str(t));
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

/// A token budget policy name: "" (the default, fixed) or a known policy.
std::string get_token_budget(capnp::Text::Reader r, const std::string& field) {
  std::string name = str(r);
  if (name.empty()) return name;
  if (Status st = engine::check_token_budget_policy_name(name); !st)
    fail(ErrorCode::invalid_argument, field + ": " + st.error().message);
  return name;
}

/// A parallel config as text ("tp=2,pp=1,sp=1,dp=1"); "" reads as nullopt.
std::optional<engine::ParallelConfig> get_parallel(capnp::Text::Reader r, const std::string& field) {
  const std::string text = str(r);
  if (text.empty()) return std::nullopt;
  auto pc = engine::parse_parallel_config(text);
  if (!pc) fail(ErrorCode::invalid_argument, field + ": " + pc.error().message);
  return *pc;
}

std::string at(const std::string& field, std::size_t i) {
  return field + "[" + std::to_string(i) + "]";
}

/// Serializes a built message as a flat (unpacked) stream.
std::string to_bytes(capnp::MessageBuilder& mb) {
  const std::size_t words = capnp::computeSerializedSizeInWords(mb);
  std::string out(words * sizeof(capnp::word), '\0');
  kj::ArrayOutputStream os(kj::arrayPtr(reinterpret_cast<kj::byte*>(out.data()), out.size()));
  capnp::writeMessage(os, mb);
  return out;
}

std::uint32_t le32(const kj::byte* p) {
  return std::uint32_t{p[0]} | std::uint32_t{p[1]} << 8 | std::uint32_t{p[2]} << 16 |
         std::uint32_t{p[3]} << 24;
}

/// Where a decode is, for error messages: "<what> <kind>: ...".
struct Where {
  const char* what;              ///< e.g. "orchestrator message"
  const char* kind = nullptr;    ///< union member once known, e.g. "submitJob"
  [[nodiscard]] std::string prefix() const {
    return kind ? std::string(what) + " " + kind + ": " : std::string(what) + ": ";
  }
};

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

/// Checks the frame (size, alignment, segment table), reads the root with
/// bounded traversal / nesting, checks the version, then runs `body(root,
/// where)`. Every failure, including Cap'n Proto's own exceptions, becomes an
/// Error naming `what`.
template <class Root, class Body>
auto decode_frame(std::string_view bytes, const char* what, Body&& body) noexcept
    -> decltype(Result(body(std::declval<typename Root::Reader>(), std::declval<Where&>()))) {
  Where where{what};
  using R = decltype(Result(body(std::declval<typename Root::Reader>(), std::declval<Where&>())));
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
    auto root = reader.getRoot<Root>();
    const std::uint16_t version = root.getVersion();
    if (version != kSchemaVersion)
      return Error{ErrorCode::invalid_argument,
                   where.prefix() + "schema version " + std::to_string(version) + ", expected " +
                       std::to_string(kSchemaVersion)};
    return R(body(root, where));
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

[[noreturn]] void unknown_kind(unsigned which) {
  fail(ErrorCode::corrupt, "unknown message kind (union member " + std::to_string(which) + ")");
}

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
  if (code > static_cast<std::uint16_t>(ErrorCode::internal))
    fail(ErrorCode::corrupt, "code: unknown error code " + std::to_string(code));
  return Error{static_cast<ErrorCode>(code), str(r.getMessage())};
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
  if (Status s = p.validate(); !s) fail(ErrorCode::invalid_argument, field + ": " + s.error().message);
  return p;
}

// ---- BatchRequest ----

void put(wire::BatchRequest::Builder b, const BatchRequest& r) {
  b.setJobId(r.job_id);
  b.setLineIndex(r.line_index);
  b.setCustomId(text(r.custom_id));
  b.setPrompt(text(r.prompt));
  set_list(b.initPromptTokenIds(static_cast<unsigned>(r.prompt_token_ids.size())), r.prompt_token_ids);
  put(b.initParams(), r.params);
  b.setReturnTokenIds(r.return_token_ids);
  b.setN(r.n);
  b.setTokenBudget(text(r.token_budget));
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
  return q;
}

// ---- BatchChoice / BatchResult ----

void put(wire::BatchChoice::Builder b, const BatchChoice& c) {
  b.setIndex(c.index);
  b.setText(text(c.text));
  b.setFinishReason(text(c.finish_reason));
  set_list(b.initTokenIds(static_cast<unsigned>(c.token_ids.size())), c.token_ids);
}

BatchChoice get(wire::BatchChoice::Reader r, const std::string& field) {
  BatchChoice c;
  c.index = r.getIndex();
  check_nonneg(c.index, field + ".index");
  c.text = str(r.getText());
  c.finish_reason = str(r.getFinishReason());
  c.token_ids = get_token_ids(r.getTokenIds(), field + ".tokenIds");
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
  return s;
}

void put(wire::ActorInfo::Builder b, const ActorInfo& a) {
  b.setName(text(a.name));
  b.setKind(text(a.kind));
  b.setNode(text(a.node));
  b.setState(text(a.state));
  b.setParallel(text(a.parallel));
}

ActorInfo get(wire::ActorInfo::Reader r) {
  return ActorInfo{str(r.getName()), str(r.getKind()), str(r.getNode()), str(r.getState()), str(r.getParallel())};
}

}  // namespace

// ============================================================================
// factories
// ============================================================================

#define SHARDLINE_MSG_FACTORY(Msg, Type, member, kind_value) \
  Msg Msg::of(Type v) {                                       \
    Msg m;                                                    \
    m.kind = Kind::kind_value;                                \
    m.member = std::move(v);                                  \
    return m;                                                 \
  }
#define SHARDLINE_MSG_TAG(Msg, Type, kind_value) \
  Msg Msg::of(Type) {                            \
    Msg m;                                       \
    m.kind = Kind::kind_value;                   \
    return m;                                    \
  }

SHARDLINE_MSG_FACTORY(OrchestratorMsg, SubmitJob, submit_job, submit_job)
SHARDLINE_MSG_FACTORY(OrchestratorMsg, JobStatusQuery, job_status_query, job_status_query)
SHARDLINE_MSG_TAG(OrchestratorMsg, ActorListQuery, actor_list_query)
SHARDLINE_MSG_FACTORY(OrchestratorMsg, KillActor, kill_actor, kill_actor)
SHARDLINE_MSG_FACTORY(OrchestratorMsg, WorkerHello, worker_hello, worker_hello)
SHARDLINE_MSG_FACTORY(OrchestratorMsg, WorkerResults, worker_results, worker_results)
SHARDLINE_MSG_FACTORY(OrchestratorMsg, WorkerHeartbeat, worker_heartbeat, worker_heartbeat)
SHARDLINE_MSG_TAG(OrchestratorMsg, Shutdown, shutdown)

SHARDLINE_MSG_FACTORY(OrchestratorReply, JobSubmitted, job_submitted, job_submitted)
SHARDLINE_MSG_FACTORY(OrchestratorReply, JobStatusList, job_status_list, job_status_list)
SHARDLINE_MSG_FACTORY(OrchestratorReply, ActorList, actor_list, actor_list)
SHARDLINE_MSG_TAG(OrchestratorReply, Ack, ack)
SHARDLINE_MSG_FACTORY(OrchestratorReply, Error, error, error)

SHARDLINE_MSG_FACTORY(WorkerMsg, AssignWork, assign_work, assign_work)
SHARDLINE_MSG_FACTORY(WorkerMsg, CancelJob, cancel_job, cancel_job)
SHARDLINE_MSG_TAG(WorkerMsg, WorkerStatusQuery, status_query)
SHARDLINE_MSG_TAG(WorkerMsg, Shutdown, shutdown)

SHARDLINE_MSG_FACTORY(WorkerReply, WorkerStatus, status, status)
SHARDLINE_MSG_TAG(WorkerReply, Ack, ack)
SHARDLINE_MSG_FACTORY(WorkerReply, Error, error, error)

SHARDLINE_MSG_FACTORY(KvStoreMsg, PutBlocks, put_blocks, put_blocks)
SHARDLINE_MSG_FACTORY(KvStoreMsg, GetBlocks, get_blocks, get_blocks)
SHARDLINE_MSG_FACTORY(KvStoreMsg, DropBlocks, drop_blocks, drop_blocks)
SHARDLINE_MSG_TAG(KvStoreMsg, StatsQuery, stats_query)

SHARDLINE_MSG_FACTORY(KvStoreReply, BlocksData, blocks_data, blocks_data)
SHARDLINE_MSG_FACTORY(KvStoreReply, KvStoreStats, stats, stats)
SHARDLINE_MSG_TAG(KvStoreReply, Ack, ack)
SHARDLINE_MSG_FACTORY(KvStoreReply, Error, error, error)

#undef SHARDLINE_MSG_FACTORY
#undef SHARDLINE_MSG_TAG

// ============================================================================
// kind names
// ============================================================================

const char* kind_name(OrchestratorMsg::Kind kind) noexcept {
  using K = OrchestratorMsg::Kind;
  switch (kind) {
    case K::submit_job: return "submitJob";
    case K::job_status_query: return "jobStatusQuery";
    case K::actor_list_query: return "actorListQuery";
    case K::kill_actor: return "killActor";
    case K::worker_hello: return "workerHello";
    case K::worker_results: return "workerResults";
    case K::worker_heartbeat: return "workerHeartbeat";
    case K::shutdown: return "shutdown";
  }
  return "?";
}

const char* kind_name(OrchestratorReply::Kind kind) noexcept {
  using K = OrchestratorReply::Kind;
  switch (kind) {
    case K::job_submitted: return "jobSubmitted";
    case K::job_status_list: return "jobStatusList";
    case K::actor_list: return "actorList";
    case K::ack: return "ack";
    case K::error: return "errorReply";
  }
  return "?";
}

const char* kind_name(WorkerMsg::Kind kind) noexcept {
  using K = WorkerMsg::Kind;
  switch (kind) {
    case K::assign_work: return "assignWork";
    case K::cancel_job: return "cancelJob";
    case K::status_query: return "statusQuery";
    case K::shutdown: return "shutdown";
  }
  return "?";
}

const char* kind_name(WorkerReply::Kind kind) noexcept {
  using K = WorkerReply::Kind;
  switch (kind) {
    case K::status: return "status";
    case K::ack: return "ack";
    case K::error: return "errorReply";
  }
  return "?";
}

const char* kind_name(KvStoreMsg::Kind kind) noexcept {
  using K = KvStoreMsg::Kind;
  switch (kind) {
    case K::put_blocks: return "putBlocks";
    case K::get_blocks: return "getBlocks";
    case K::drop_blocks: return "dropBlocks";
    case K::stats_query: return "statsQuery";
  }
  return "?";
}

const char* kind_name(KvStoreReply::Kind kind) noexcept {
  using K = KvStoreReply::Kind;
  switch (kind) {
    case K::blocks_data: return "blocksData";
    case K::stats: return "stats";
    case K::ack: return "ack";
    case K::error: return "errorReply";
  }
  return "?";
}

// ============================================================================
// orchestrator
// ============================================================================

std::string encode(const OrchestratorMsg& msg) {
  capnp::MallocMessageBuilder mb;
  auto root = mb.initRoot<wire::OrchestratorMessage>();
  root.setVersion(kSchemaVersion);
  using K = OrchestratorMsg::Kind;
  switch (msg.kind) {
    case K::submit_job: {
      auto b = root.initSubmitJob();
      b.setModelDir(text(msg.submit_job.model_dir));
      set_texts(b.initInputs(static_cast<unsigned>(msg.submit_job.inputs.size())), msg.submit_job.inputs);
      b.setOutput(text(msg.submit_job.output));
      if (msg.submit_job.parallel) b.setParallel(text(msg.submit_job.parallel->to_string()));
      b.setTokenBudget(text(msg.submit_job.token_budget));
      break;
    }
    case K::job_status_query: root.initJobStatusQuery().setJobId(msg.job_status_query.job_id); break;
    case K::actor_list_query: root.setActorListQuery(); break;
    case K::kill_actor: root.initKillActor().setName(text(msg.kill_actor.name)); break;
    case K::worker_hello: {
      auto b = root.initWorkerHello();
      b.setWorkerName(text(msg.worker_hello.worker_name));
      b.setDevice(text(msg.worker_hello.device));
      b.setMaxBatch(msg.worker_hello.max_batch);
      b.setParallel(text(msg.worker_hello.parallel.to_string()));
      break;
    }
    case K::worker_results: {
      auto b = root.initWorkerResults();
      b.setWorkerName(text(msg.worker_results.worker_name));
      const auto& results = msg.worker_results.results;
      auto list = b.initResults(static_cast<unsigned>(results.size()));
      for (unsigned i = 0; i < results.size(); ++i) put(list[i], results[i]);
      break;
    }
    case K::worker_heartbeat: {
      auto b = root.initWorkerHeartbeat();
      b.setWorkerName(text(msg.worker_heartbeat.worker_name));
      put(b.initStatus(), msg.worker_heartbeat.status);
      break;
    }
    case K::shutdown: root.setShutdown(); break;
  }
  return to_bytes(mb);
}

Result<OrchestratorMsg> decode_orchestrator(std::string_view bytes) noexcept {
  return decode_frame<wire::OrchestratorMessage>(
      bytes, "orchestrator message", [](wire::OrchestratorMessage::Reader root, Where& where) {
        using W = wire::OrchestratorMessage;
        using K = OrchestratorMsg::Kind;
        OrchestratorMsg m;
        switch (root.which()) {
          case W::SUBMIT_JOB: {
            m.kind = K::submit_job;
            where.kind = kind_name(m.kind);
            auto r = root.getSubmitJob();
            m.submit_job.model_dir = str(r.getModelDir());
            m.submit_job.inputs = get_texts(r.getInputs(), "inputs");
            m.submit_job.output = str(r.getOutput());
            m.submit_job.parallel = get_parallel(r.getParallel(), "parallel");
            m.submit_job.token_budget = get_token_budget(r.getTokenBudget(), "tokenBudget");
            break;
          }
          case W::JOB_STATUS_QUERY:
            m.kind = K::job_status_query;
            where.kind = kind_name(m.kind);
            m.job_status_query.job_id = root.getJobStatusQuery().getJobId();
            break;
          case W::ACTOR_LIST_QUERY: m.kind = K::actor_list_query; break;
          case W::KILL_ACTOR:
            m.kind = K::kill_actor;
            where.kind = kind_name(m.kind);
            m.kill_actor.name = str(root.getKillActor().getName());
            break;
          case W::WORKER_HELLO: {
            m.kind = K::worker_hello;
            where.kind = kind_name(m.kind);
            auto r = root.getWorkerHello();
            m.worker_hello.worker_name = str(r.getWorkerName());
            m.worker_hello.device = str(r.getDevice());
            m.worker_hello.max_batch = r.getMaxBatch();
            // "" (a sender without the field) is a single device.
            m.worker_hello.parallel = get_parallel(r.getParallel(), "parallel").value_or(engine::ParallelConfig{});
            if (m.worker_hello.parallel.dp != 1)
              fail(ErrorCode::invalid_argument, "parallel: a worker is one engine group, dp must be 1, got " +
                                                    std::to_string(m.worker_hello.parallel.dp));
            break;
          }
          case W::WORKER_RESULTS: {
            m.kind = K::worker_results;
            where.kind = kind_name(m.kind);
            auto r = root.getWorkerResults();
            m.worker_results.worker_name = str(r.getWorkerName());
            auto list = r.getResults();
            check_len(list, "results");
            m.worker_results.results.reserve(list.size());
            for (unsigned i = 0; i < list.size(); ++i)
              m.worker_results.results.push_back(get(list[i], at("results", i)));
            break;
          }
          case W::WORKER_HEARTBEAT: {
            m.kind = K::worker_heartbeat;
            where.kind = kind_name(m.kind);
            auto r = root.getWorkerHeartbeat();
            m.worker_heartbeat.worker_name = str(r.getWorkerName());
            m.worker_heartbeat.status = get(r.getStatus());
            break;
          }
          case W::SHUTDOWN: m.kind = K::shutdown; break;
          default: unknown_kind(static_cast<unsigned>(root.which()));
        }
        return m;
      });
}

std::string encode(const OrchestratorReply& msg) {
  capnp::MallocMessageBuilder mb;
  auto root = mb.initRoot<wire::OrchestratorReply>();
  root.setVersion(kSchemaVersion);
  using K = OrchestratorReply::Kind;
  switch (msg.kind) {
    case K::job_submitted: root.initJobSubmitted().setJobId(msg.job_submitted.job_id); break;
    case K::job_status_list: {
      const auto& jobs = msg.job_status_list.jobs;
      auto list = root.initJobStatusList().initJobs(static_cast<unsigned>(jobs.size()));
      for (unsigned i = 0; i < jobs.size(); ++i) put(list[i], jobs[i]);
      break;
    }
    case K::actor_list: {
      const auto& actors = msg.actor_list.actors;
      auto list = root.initActorList().initActors(static_cast<unsigned>(actors.size()));
      for (unsigned i = 0; i < actors.size(); ++i) put(list[i], actors[i]);
      break;
    }
    case K::ack: root.setAck(); break;
    case K::error: put(root.initErrorReply(), msg.error); break;
  }
  return to_bytes(mb);
}

Result<OrchestratorReply> decode_orchestrator_reply(std::string_view bytes) noexcept {
  return decode_frame<wire::OrchestratorReply>(
      bytes, "orchestrator reply", [](wire::OrchestratorReply::Reader root, Where& where) {
        using W = wire::OrchestratorReply;
        using K = OrchestratorReply::Kind;
        OrchestratorReply m;
        switch (root.which()) {
          case W::JOB_SUBMITTED:
            m.kind = K::job_submitted;
            where.kind = kind_name(m.kind);
            m.job_submitted.job_id = root.getJobSubmitted().getJobId();
            break;
          case W::JOB_STATUS_LIST: {
            m.kind = K::job_status_list;
            where.kind = kind_name(m.kind);
            auto list = root.getJobStatusList().getJobs();
            check_len(list, "jobs");
            m.job_status_list.jobs.reserve(list.size());
            for (auto j : list) m.job_status_list.jobs.push_back(get(j));
            break;
          }
          case W::ACTOR_LIST: {
            m.kind = K::actor_list;
            where.kind = kind_name(m.kind);
            auto list = root.getActorList().getActors();
            check_len(list, "actors");
            m.actor_list.actors.reserve(list.size());
            for (auto a : list) m.actor_list.actors.push_back(get(a));
            break;
          }
          case W::ACK: m.kind = K::ack; break;
          case W::ERROR_REPLY:
            m.kind = K::error;
            where.kind = kind_name(m.kind);
            m.error = get(root.getErrorReply());
            break;
          default: unknown_kind(static_cast<unsigned>(root.which()));
        }
        return m;
      });
}

// ============================================================================
// worker
// ============================================================================

std::string encode(const WorkerMsg& msg) {
  capnp::MallocMessageBuilder mb;
  auto root = mb.initRoot<wire::WorkerMessage>();
  root.setVersion(kSchemaVersion);
  using K = WorkerMsg::Kind;
  switch (msg.kind) {
    case K::assign_work: {
      const auto& requests = msg.assign_work.requests;
      auto list = root.initAssignWork().initRequests(static_cast<unsigned>(requests.size()));
      for (unsigned i = 0; i < requests.size(); ++i) put(list[i], requests[i]);
      break;
    }
    case K::cancel_job: root.initCancelJob().setJobId(msg.cancel_job.job_id); break;
    case K::status_query: root.setStatusQuery(); break;
    case K::shutdown: root.setShutdown(); break;
  }
  return to_bytes(mb);
}

Result<WorkerMsg> decode_worker(std::string_view bytes) noexcept {
  return decode_frame<wire::WorkerMessage>(
      bytes, "worker message", [](wire::WorkerMessage::Reader root, Where& where) {
        using W = wire::WorkerMessage;
        using K = WorkerMsg::Kind;
        WorkerMsg m;
        switch (root.which()) {
          case W::ASSIGN_WORK: {
            m.kind = K::assign_work;
            where.kind = kind_name(m.kind);
            auto list = root.getAssignWork().getRequests();
            check_len(list, "requests");
            m.assign_work.requests.reserve(list.size());
            for (unsigned i = 0; i < list.size(); ++i)
              m.assign_work.requests.push_back(get(list[i], at("requests", i)));
            break;
          }
          case W::CANCEL_JOB:
            m.kind = K::cancel_job;
            where.kind = kind_name(m.kind);
            m.cancel_job.job_id = root.getCancelJob().getJobId();
            break;
          case W::STATUS_QUERY: m.kind = K::status_query; break;
          case W::SHUTDOWN: m.kind = K::shutdown; break;
          default: unknown_kind(static_cast<unsigned>(root.which()));
        }
        return m;
      });
}

std::string encode(const WorkerReply& msg) {
  capnp::MallocMessageBuilder mb;
  auto root = mb.initRoot<wire::WorkerReply>();
  root.setVersion(kSchemaVersion);
  using K = WorkerReply::Kind;
  switch (msg.kind) {
    case K::status: put(root.initStatus(), msg.status); break;
    case K::ack: root.setAck(); break;
    case K::error: put(root.initErrorReply(), msg.error); break;
  }
  return to_bytes(mb);
}

Result<WorkerReply> decode_worker_reply(std::string_view bytes) noexcept {
  return decode_frame<wire::WorkerReply>(
      bytes, "worker reply", [](wire::WorkerReply::Reader root, Where& where) {
        using W = wire::WorkerReply;
        using K = WorkerReply::Kind;
        WorkerReply m;
        switch (root.which()) {
          case W::STATUS:
            m.kind = K::status;
            where.kind = kind_name(m.kind);
            m.status = get(root.getStatus());
            break;
          case W::ACK: m.kind = K::ack; break;
          case W::ERROR_REPLY:
            m.kind = K::error;
            where.kind = kind_name(m.kind);
            m.error = get(root.getErrorReply());
            break;
          default: unknown_kind(static_cast<unsigned>(root.which()));
        }
        return m;
      });
}

// ============================================================================
// kvstore
// ============================================================================

std::string encode(const KvStoreMsg& msg) {
  capnp::MallocMessageBuilder mb;
  auto root = mb.initRoot<wire::KvStoreMessage>();
  root.setVersion(kSchemaVersion);
  using K = KvStoreMsg::Kind;
  switch (msg.kind) {
    case K::put_blocks: {
      auto b = root.initPutBlocks();
      b.setKey(text(msg.put_blocks.key));
      b.setData(data(msg.put_blocks.data));
      break;
    }
    case K::get_blocks: root.initGetBlocks().setKey(text(msg.get_blocks.key)); break;
    case K::drop_blocks: root.initDropBlocks().setKey(text(msg.drop_blocks.key)); break;
    case K::stats_query: root.setStatsQuery(); break;
  }
  return to_bytes(mb);
}

Result<KvStoreMsg> decode_kvstore(std::string_view bytes) noexcept {
  return decode_frame<wire::KvStoreMessage>(
      bytes, "kvstore message", [](wire::KvStoreMessage::Reader root, Where& where) {
        using W = wire::KvStoreMessage;
        using K = KvStoreMsg::Kind;
        KvStoreMsg m;
        switch (root.which()) {
          case W::PUT_BLOCKS: {
            m.kind = K::put_blocks;
            where.kind = kind_name(m.kind);
            auto r = root.getPutBlocks();
            m.put_blocks.key = str(r.getKey());
            m.put_blocks.data = str(r.getData());
            break;
          }
          case W::GET_BLOCKS:
            m.kind = K::get_blocks;
            where.kind = kind_name(m.kind);
            m.get_blocks.key = str(root.getGetBlocks().getKey());
            break;
          case W::DROP_BLOCKS:
            m.kind = K::drop_blocks;
            where.kind = kind_name(m.kind);
            m.drop_blocks.key = str(root.getDropBlocks().getKey());
            break;
          case W::STATS_QUERY: m.kind = K::stats_query; break;
          default: unknown_kind(static_cast<unsigned>(root.which()));
        }
        return m;
      });
}

std::string encode(const KvStoreReply& msg) {
  capnp::MallocMessageBuilder mb;
  auto root = mb.initRoot<wire::KvStoreReply>();
  root.setVersion(kSchemaVersion);
  using K = KvStoreReply::Kind;
  switch (msg.kind) {
    case K::blocks_data: {
      auto b = root.initBlocksData();
      b.setKey(text(msg.blocks_data.key));
      b.setData(data(msg.blocks_data.data));
      b.setFound(msg.blocks_data.found);
      break;
    }
    case K::stats: {
      auto b = root.initStats();
      b.setNumEntries(msg.stats.num_entries);
      b.setBytesUsed(msg.stats.bytes_used);
      b.setBytesCapacity(msg.stats.bytes_capacity);
      break;
    }
    case K::ack: root.setAck(); break;
    case K::error: put(root.initErrorReply(), msg.error); break;
  }
  return to_bytes(mb);
}

Result<KvStoreReply> decode_kvstore_reply(std::string_view bytes) noexcept {
  return decode_frame<wire::KvStoreReply>(
      bytes, "kvstore reply", [](wire::KvStoreReply::Reader root, Where& where) {
        using W = wire::KvStoreReply;
        using K = KvStoreReply::Kind;
        KvStoreReply m;
        switch (root.which()) {
          case W::BLOCKS_DATA: {
            m.kind = K::blocks_data;
            where.kind = kind_name(m.kind);
            auto r = root.getBlocksData();
            m.blocks_data.key = str(r.getKey());
            m.blocks_data.data = str(r.getData());
            m.blocks_data.found = r.getFound();
            break;
          }
          case W::STATS: {
            m.kind = K::stats;
            where.kind = kind_name(m.kind);
            auto r = root.getStats();
            m.stats.num_entries = r.getNumEntries();
            m.stats.bytes_used = r.getBytesUsed();
            m.stats.bytes_capacity = r.getBytesCapacity();
            break;
          }
          case W::ACK: m.kind = K::ack; break;
          case W::ERROR_REPLY:
            m.kind = K::error;
            where.kind = kind_name(m.kind);
            m.error = get(root.getErrorReply());
            break;
          default: unknown_kind(static_cast<unsigned>(root.which()));
        }
        return m;
      });
}

}  // namespace shardline::messages
