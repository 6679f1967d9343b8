#pragma once
/// \file
/// Encoding / decoding of the actor messages (Cap'n Proto, messages/*.capnp)
/// to and from the plain structs of messages/types.hpp.
///
/// One inbox struct per receiving actor plus one reply struct, each a tagged
/// record (no std::variant): `kind` says which member is meaningful, the other
/// members stay default. Build them with the `of(...)` factories:
///
///     std::string bytes = encode(OrchestratorMsg::of(SubmitJob{...}));
///     auto msg = decode_orchestrator(bytes);   // Result<OrchestratorMsg>
///     if (!msg) log(msg.error().to_string());
///     else if (msg->kind == OrchestratorMsg::Kind::submit_job) ... msg->submit_job ...
///
/// Bytes are a standard unpacked Cap'n Proto stream (segment table + segments)
/// whose root carries `version = kSchemaVersion`. Decoding never throws and
/// never trusts its input: it copies into an aligned buffer, checks the size
/// (<= kMaxMessageBytes, multiple of 8), the segment table (<= kMaxSegments,
/// sizes add up exactly, no trailing bytes), the schema version, bounds the
/// Cap'n Proto traversal (2x the message size) and nesting depth
/// (kMaxNestingDepth), the list lengths (kMaxListElements), and the fields
/// (enums in range; BatchRequest: n >= 1, token ids >= 0, tokenBudget "" or
/// a known policy; SubmitJob: parallel "" or a valid config, tokenBudget as
/// BatchRequest; WorkerHello: parallel "" (single) or a config with dp = 1;
/// SamplingParams::validate(); BatchResult: counts and indices >= 0).
/// Errors name the message (and its kind when known):
///   corrupt           the bytes are not a well-formed message of this schema
///                     (truncated, bad segment table, out-of-bounds pointer,
///                     unknown union member or enum value, ...);
///   invalid_argument  well-formed but refused: schema version mismatch
///                     ("schema version X, expected Y"), over a size limit,
///                     a field out of range.
///
/// encode() does not enforce kMaxMessageBytes (the receiver does); it throws
/// only where Cap'n Proto itself cannot represent a value (a list or text of
/// 2^29 elements or more).

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.hpp"
#include "messages/types.hpp"

namespace shardline::messages {

// ---- orchestrator inbox ----------------------------------------------------------

struct OrchestratorMsg {
  enum class Kind : std::uint8_t {
    submit_job,
    job_status_query,
    actor_list_query,
    kill_actor,
    worker_hello,
    worker_results,
    worker_heartbeat,
    shutdown,
  };
  Kind kind = Kind::shutdown;
  SubmitJob submit_job;
  JobStatusQuery job_status_query;
  KillActor kill_actor;
  WorkerHello worker_hello;
  WorkerResults worker_results;
  WorkerHeartbeat worker_heartbeat;

  static OrchestratorMsg of(SubmitJob v);
  static OrchestratorMsg of(JobStatusQuery v);
  static OrchestratorMsg of(ActorListQuery v);
  static OrchestratorMsg of(KillActor v);
  static OrchestratorMsg of(WorkerHello v);
  static OrchestratorMsg of(WorkerResults v);
  static OrchestratorMsg of(WorkerHeartbeat v);
  static OrchestratorMsg of(Shutdown v);
};

/// What the orchestrator sends back to a client.
struct OrchestratorReply {
  enum class Kind : std::uint8_t {
    job_submitted,
    job_status_list,
    actor_list,
    ack,
    error,
  };
  Kind kind = Kind::ack;
  JobSubmitted job_submitted;
  JobStatusList job_status_list;
  ActorList actor_list;
  Error error;

  static OrchestratorReply of(JobSubmitted v);
  static OrchestratorReply of(JobStatusList v);
  static OrchestratorReply of(ActorList v);
  static OrchestratorReply of(Ack v);
  static OrchestratorReply of(Error v);
};

// ---- worker ---------------------------------------------------------------------

struct WorkerMsg {
  enum class Kind : std::uint8_t {
    assign_work,
    cancel_job,
    status_query,
    shutdown,
  };
  Kind kind = Kind::shutdown;
  AssignWork assign_work;
  CancelJob cancel_job;

  static WorkerMsg of(AssignWork v);
  static WorkerMsg of(CancelJob v);
  static WorkerMsg of(WorkerStatusQuery v);
  static WorkerMsg of(Shutdown v);
};

struct WorkerReply {
  enum class Kind : std::uint8_t {
    status,
    ack,
    error,
  };
  Kind kind = Kind::ack;
  WorkerStatus status;
  Error error;

  static WorkerReply of(WorkerStatus v);
  static WorkerReply of(Ack v);
  static WorkerReply of(Error v);
};

// ---- kvstore --------------------------------------------------------------------

struct KvStoreMsg {
  enum class Kind : std::uint8_t {
    put_blocks,
    get_blocks,
    drop_blocks,
    stats_query,
  };
  Kind kind = Kind::stats_query;
  PutBlocks put_blocks;
  GetBlocks get_blocks;
  DropBlocks drop_blocks;

  static KvStoreMsg of(PutBlocks v);
  static KvStoreMsg of(GetBlocks v);
  static KvStoreMsg of(DropBlocks v);
  static KvStoreMsg of(StatsQuery v);
};

struct KvStoreReply {
  enum class Kind : std::uint8_t {
    blocks_data,
    stats,
    ack,
    error,
  };
  Kind kind = Kind::ack;
  BlocksData blocks_data;
  KvStoreStats stats;
  Error error;

  static KvStoreReply of(BlocksData v);
  static KvStoreReply of(KvStoreStats v);
  static KvStoreReply of(Ack v);
  static KvStoreReply of(Error v);
};

// ---- codec ------------------------------------------------------------------------

[[nodiscard]] std::string encode(const OrchestratorMsg& msg);
[[nodiscard]] std::string encode(const OrchestratorReply& msg);
[[nodiscard]] std::string encode(const WorkerMsg& msg);
[[nodiscard]] std::string encode(const WorkerReply& msg);
[[nodiscard]] std::string encode(const KvStoreMsg& msg);
[[nodiscard]] std::string encode(const KvStoreReply& msg);

[[nodiscard]] Result<OrchestratorMsg> decode_orchestrator(std::string_view bytes) noexcept;
[[nodiscard]] Result<OrchestratorReply> decode_orchestrator_reply(std::string_view bytes) noexcept;
[[nodiscard]] Result<WorkerMsg> decode_worker(std::string_view bytes) noexcept;
[[nodiscard]] Result<WorkerReply> decode_worker_reply(std::string_view bytes) noexcept;
[[nodiscard]] Result<KvStoreMsg> decode_kvstore(std::string_view bytes) noexcept;
[[nodiscard]] Result<KvStoreReply> decode_kvstore_reply(std::string_view bytes) noexcept;

/// Wire names of the kinds (the Cap'n Proto union member), e.g. "submitJob".
[[nodiscard]] const char* kind_name(OrchestratorMsg::Kind kind) noexcept;
[[nodiscard]] const char* kind_name(OrchestratorReply::Kind kind) noexcept;
[[nodiscard]] const char* kind_name(WorkerMsg::Kind kind) noexcept;
[[nodiscard]] const char* kind_name(WorkerReply::Kind kind) noexcept;
[[nodiscard]] const char* kind_name(KvStoreMsg::Kind kind) noexcept;
[[nodiscard]] const char* kind_name(KvStoreReply::Kind kind) noexcept;

}  // namespace shardline::messages
