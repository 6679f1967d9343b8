#pragma once
/// \file
/// Encoding / decoding of the actor messages (Cap'n Proto, messages/*.capnp)
/// to and from the std::variants of messages/types.hpp (one per receiving
/// actor, one per reply):
///
///     std::string bytes = encode(OrchestratorMsg{SubmitJob{...}});
///     auto msg = decode_orchestrator(bytes);   // Result<OrchestratorMsg>
///     if (!msg) log(msg.error().to_string());
///     else if (auto* sj = std::get_if<SubmitJob>(&*msg)) ...   // or std::visit
///
/// Each schema root has one table (messages/codec_<schema>.cpp) mapping each
/// alternative to its union member; the frame, limit and version checks are
/// shared (messages/codec_common.cpp). How to add a message: docs/messages.md.
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
/// Errors name the message (and its kind when known, e.g. "orchestrator
/// message submitJob: parallel: ..."):
///   corrupt           the bytes are not a well-formed message of this schema
///                     (truncated, bad segment table, out-of-bounds pointer,
///                     unknown union member or enum value, ...);
///   invalid_argument  well-formed but refused: schema version mismatch
///                     ("schema version X, expected Y"), over a size limit,
///                     a field out of range.
///
/// A decoded reply holding an Error alternative is a *successful* decode of
/// an `errorReply`; the Result's own error means the bytes were refused.
///
/// encode() does not enforce kMaxMessageBytes (the receiver does); it throws
/// only where Cap'n Proto itself cannot represent a value (a list or text of
/// 2^29 elements or more).

#include <string>
#include <string_view>

#include "common/result.hpp"
#include "messages/types.hpp"

namespace shardline::messages {

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

/// The wire name of the message's alternative (its Cap'n Proto union
/// member, read from the schema), e.g. "submitJob", "errorReply".
[[nodiscard]] const char* kind_name(const OrchestratorMsg& msg) noexcept;
[[nodiscard]] const char* kind_name(const OrchestratorReply& msg) noexcept;
[[nodiscard]] const char* kind_name(const WorkerMsg& msg) noexcept;
[[nodiscard]] const char* kind_name(const WorkerReply& msg) noexcept;
[[nodiscard]] const char* kind_name(const KvStoreMsg& msg) noexcept;
[[nodiscard]] const char* kind_name(const KvStoreReply& msg) noexcept;

}  // namespace shardline::messages
