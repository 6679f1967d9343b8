#pragma once
/// \file
/// Internals of the codec, for messages/codec_*.cpp only (it includes the
/// generated Cap'n Proto headers; users include messages/codec.hpp).
///
/// One table per schema root: for each alternative T of the root's
/// std::variant, a specialisation `Member<Root, T>` names the union member it
/// travels as and converts it:
///
///     template <> struct Member<wire::WorkerMessage, CancelJob> {
///       static constexpr auto which = wire::WorkerMessage::CANCEL_JOB;   // the union member
///       static void put(wire::WorkerMessage::Builder root, const CancelJob& m) {
///         root.initCancelJob().setJobId(m.job_id);
///       }
///       static CancelJob get(wire::WorkerMessage::Reader root) {      // may fail(): see below
///         return CancelJob{root.getCancelJob().getJobId()};
///       }
///     };
///
/// encode_table() visits the variant and calls the alternative's put();
/// decode_table() checks the frame once (read_frame: size, segment table,
/// traversal and nesting limits), the schema version, and the union member,
/// then calls get() through an array indexed by the root's which(). A
/// variant lists its alternatives in the order of the union's members
/// (variant index == which(); a static_assert holds every table to it), so
/// the wire name of an alternative is the schema's union field at its index.
/// A get() refuses a field with fail(code, "field: why"); the error then
/// reads "<what> <wireName>: field: why".

#include <capnp/message.h>
#include <capnp/schema.h>
#include <kj/function.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "common/result.hpp"
#include "messages/common.capnp.h"
#include "messages/kvstore.capnp.h"
#include "messages/types.hpp"

namespace shardline::messages::detail {

// ---- failures --------------------------------------------------------------------

/// Thrown by the field checks inside a decode; read_frame turns it into an
/// Error (it never escapes the codec).
struct DecodeFailure {
  ErrorCode code;
  std::string message;
};

[[noreturn]] void fail(ErrorCode code, std::string message);

/// Where a decode is, for error messages: "<what> <kind>: ...".
struct Where {
  const char* what;            ///< e.g. "orchestrator message"
  const char* kind = nullptr;  ///< union member once known, e.g. "submitJob"
  [[nodiscard]] std::string prefix() const;
};

// ---- frame -----------------------------------------------------------------------

/// Checks the frame of `bytes` (non-empty, <= kMaxMessageBytes, a multiple of
/// 8, a segment table of <= kMaxSegments whose sizes add up exactly), copies
/// it to aligned memory, opens it with a traversal limit of 2x its size and
/// kMaxNestingDepth, and runs `body(reader, where)`. Every failure (the
/// frame's, a DecodeFailure, a Cap'n Proto exception, bad_alloc) becomes an
/// Error prefixed with where.prefix().
[[nodiscard]] Status read_frame(std::string_view bytes, const char* what,
                                kj::FunctionParam<void(capnp::MessageReader&, Where&)> body) noexcept;

/// fail()s with invalid_argument unless version == kSchemaVersion.
void check_version(std::uint16_t version);

/// Serializes a built message as a flat (unpacked) stream.
[[nodiscard]] std::string to_bytes(capnp::MessageBuilder& mb);

// ---- fields ----------------------------------------------------------------------

[[nodiscard]] capnp::Text::Reader text(const std::string& s);
[[nodiscard]] capnp::Data::Reader data(const std::string& s);
[[nodiscard]] std::string str(capnp::Text::Reader t);
[[nodiscard]] std::string str(capnp::Data::Reader d);
/// "field[i]".
[[nodiscard]] std::string at(const std::string& field, std::size_t i);

/// fail()s with invalid_argument when a list is longer than kMaxListElements.
template <class List>
void check_len(const List& list, const std::string& field) {
  if (list.size() > kMaxListElements)
    fail(ErrorCode::invalid_argument, field + ": " + std::to_string(list.size()) +
                                          " elements, more than the limit of " +
                                          std::to_string(kMaxListElements));
}

void set_texts(capnp::List<capnp::Text>::Builder list, const std::vector<std::string>& v);
[[nodiscard]] std::vector<std::string> get_texts(capnp::List<capnp::Text>::Reader list, const std::string& field);

/// A parallel config as text ("tp=2,pp=1,sp=1,dp=1"); "" reads as nullopt;
/// fail()s on a config parse_parallel_config refuses.
[[nodiscard]] std::optional<engine::ParallelConfig> get_parallel(capnp::Text::Reader r, const std::string& field);
/// A token budget policy name: "" (the default, fixed) or a known policy.
[[nodiscard]] std::string get_token_budget(capnp::Text::Reader r, const std::string& field);

// ---- structs shared by the schemas (common.capnp) --------------------------------

void put(wire::ErrorReply::Builder b, const Error& e);
[[nodiscard]] Error get(wire::ErrorReply::Reader r);
void put(wire::BatchRequest::Builder b, const worker::BatchRequest& r);
[[nodiscard]] worker::BatchRequest get(wire::BatchRequest::Reader r, const std::string& field);
void put(wire::BatchResult::Builder b, const worker::BatchResult& r);
[[nodiscard]] worker::BatchResult get(wire::BatchResult::Reader r, const std::string& field);
void put(wire::JobProgress::Builder b, const JobProgress& p);
[[nodiscard]] JobProgress get(wire::JobProgress::Reader r);
void put(wire::WorkerStatus::Builder b, const WorkerStatus& s);
[[nodiscard]] WorkerStatus get(wire::WorkerStatus::Reader r);
void put(wire::ActorInfo::Builder b, const ActorInfo& a);
[[nodiscard]] ActorInfo get(wire::ActorInfo::Reader r);
void put(wire::KvStoreStats::Builder b, const KvStoreStats& m);
[[nodiscard]] KvStoreStats get(wire::KvStoreStats::Reader r);
void put(wire::SidpGroupStatus::Builder b, const SidpGroupStatus& g);
[[nodiscard]] SidpGroupStatus get(wire::SidpGroupStatus::Reader r, const std::string& field);
/// fail()s with invalid_argument unless `mode` is "was" or "cas" (or "" when allow_empty).
void check_sidp_mode(const std::string& mode, const std::string& field, bool allow_empty);
void put(wire::KvProgress::Builder b, const worker::KvProgress& p);
[[nodiscard]] worker::KvProgress get(wire::KvProgress::Reader r, const std::string& field);

/// Fills `list` (already sized) from `v` with put().
template <class ListBuilder, class T>
void put_all(ListBuilder list, const std::vector<T>& v) {
  for (unsigned i = 0; i < v.size(); ++i) put(list[i], v[i]);
}

// ---- tables ----------------------------------------------------------------------

/// The table entry of alternative T in the schema root Root (see the file
/// comment). No primary definition: an alternative without an entry does not
/// compile.
template <class Root, class T>
struct Member;

/// Members several roots share by name: `ack`, `errorReply` (replies) and
/// `shutdown` (inboxes).
template <class Root>
struct Member<Root, Ack> {
  static constexpr auto which = Root::ACK;
  static void put(typename Root::Builder root, const Ack&) { root.setAck(); }
  static Ack get(typename Root::Reader) { return {}; }
};

template <class Root>
struct Member<Root, Error> {
  static constexpr auto which = Root::ERROR_REPLY;
  static void put(typename Root::Builder root, const Error& e) { detail::put(root.initErrorReply(), e); }
  static Error get(typename Root::Reader root) { return detail::get(root.getErrorReply()); }
};

template <class Root>
struct Member<Root, Shutdown> {
  static constexpr auto which = Root::SHUTDOWN;
  static void put(typename Root::Builder root, const Shutdown&) { root.setShutdown(); }
  static Shutdown get(typename Root::Reader) { return {}; }
};

template <class Root, class Msg>
struct Table;

/// The table of the root Root for the variant Msg.
template <class Root, class... Ts>
struct Table<Root, std::variant<Ts...>> {
  using Msg = std::variant<Ts...>;
  using Reader = typename Root::Reader;

  template <std::size_t... I>
  static constexpr bool in_wire_order(std::index_sequence<I...>) {
    return ((static_cast<std::size_t>(Member<Root, Ts>::which) == I) && ...);
  }
  static_assert(in_wire_order(std::index_sequence_for<Ts...>{}),
                "a message variant lists its alternatives in the order of the schema's union members: "
                "Member<Root, T>::which must equal T's index in the variant");

  template <class T>
  static Msg get_as(Reader root) {
    return Msg(std::in_place_type<T>, Member<Root, T>::get(root));
  }
  /// get() of each alternative, indexed by which().
  static constexpr std::array<Msg (*)(Reader), sizeof...(Ts)> get{&get_as<Ts>...};
};

/// The wire name (union member) of the root's member `which`, e.g.
/// "submitJob"; "?" if there is none.
template <class Root>
[[nodiscard]] const char* wire_name(std::size_t which) noexcept {
  const auto fields = capnp::Schema::from<Root>().getUnionFields();
  if (which >= fields.size()) return "?";
  return fields[static_cast<unsigned>(which)].getProto().getName().cStr();
}

template <class Root, class Msg>
[[nodiscard]] std::string encode_table(const Msg& msg) {
  capnp::MallocMessageBuilder mb;
  auto root = mb.initRoot<Root>();
  root.setVersion(kSchemaVersion);
  std::visit([&root](const auto& m) { Member<Root, std::decay_t<decltype(m)>>::put(root, m); }, msg);
  return to_bytes(mb);
}

template <class Root, class Msg>
[[nodiscard]] Result<Msg> decode_table(std::string_view bytes, const char* what) noexcept {
  std::optional<Msg> out;
  Status st = read_frame(bytes, what, [&out](capnp::MessageReader& reader, Where& where) {
    auto root = reader.getRoot<Root>();
    check_version(root.getVersion());
    const auto which = static_cast<std::size_t>(root.which());
    if (which >= std::variant_size_v<Msg>)
      fail(ErrorCode::corrupt, "unknown message kind (union member " + std::to_string(which) + ")");
    where.kind = wire_name<Root>(which);
    out.emplace(Table<Root, Msg>::get[which](root));
  });
  if (!st) return st.error();
  return std::move(*out);
}

}  // namespace shardline::messages::detail
