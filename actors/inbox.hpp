#pragma once
/// \file
/// The opening every actor's inbox shares: verify the message's tag (cluster
/// key, once: actors/replay_guard.hpp), decode the bytes into the actor's message variant, dispatch the
/// alternative to its handler, encode the reply.
///
///     [self](msg_atom, const std::string& tag, const std::string& bytes) -> std::string {
///       return self->state.inbox.serve(self->current_sender(), tag, bytes, messages::decode_kvstore,
///                                      [&](auto& msg) -> messages::KvStoreReply { return handle(self, msg); });
///     }

#include <caf/all.hpp>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

#include "actors/auth.hpp"
#include "actors/replay_guard.hpp"
#include "actors/metrics.hpp"
#include "common/result.hpp"
#include "messages/codec.hpp"

namespace shardline::actors {

/// One actor's inbox: who it is (for the log line), the cluster key, and the
/// registry that counts refused messages.
class Inbox {
 public:
  Inbox() = default;  ///< refuses every message (no key)
  /// `who`: the log prefix, e.g. "orchestrator" or "worker node0/cpu:0".
  /// `metrics`: where refusals are counted (shardline_auth_failures_total);
  /// null = not counted.
  Inbox(std::string who, std::shared_ptr<const ClusterKey> key, std::shared_ptr<MetricsRegistry> metrics)
      : who_(std::move(who)), key_(std::move(key)), metrics_(std::move(metrics)) {}

  /// Checks `tag` for `bytes` (actors/replay_guard.hpp): signed with the
  /// cluster key, within the time window, and not seen before. A bad tag is
  /// logged as "<who>: refused a message with a bad cluster key tag from
  /// <sender>", counted in shardline_auth_failures_total and answered with
  /// invalid_argument "unauthenticated: wrong or missing cluster key"; a
  /// replayed or expired one is logged as "<who>: refused a replayed
  /// message ..." / "... signed N s from now ...", counted in
  /// shardline_replays_refused_total and answered with invalid_argument
  /// "replayed: ..." / "expired: ...".
  [[nodiscard]] Status authenticate(const caf::strong_actor_ptr& sender, std::string_view tag,
                                    std::string_view bytes);

  /// Verify -> decode -> dispatch -> encode. `decode` is the actor's decoder
  /// (e.g. messages::decode_worker); `handler` is called with the decoded
  /// alternative (`handler(SubmitJob&)`, ... : an overload for each, or a
  /// generic lambda) and returns the actor's reply variant, or
  /// std::optional of it where nullopt means no reply (empty bytes). A
  /// refused tag or undecodable bytes are answered with the Error alternative
  /// of the reply; the handler is then not called. Replies are sealed to the
  /// request's tag (seal_reply): the requester opens them with open_reply.
  template <class Msg, class Handler>
  [[nodiscard]] std::string serve(const caf::strong_actor_ptr& sender, std::string_view tag,
                                  std::string_view bytes, Result<Msg> (*decode)(std::string_view) noexcept,
                                  Handler&& handler) {
    using R = decltype(std::visit(handler, std::declval<Msg&>()));
    using Reply = typename ReplyOf<R>::type;
    if (Status ok = authenticate(sender, tag, bytes); !ok) return seal(tag, messages::encode(Reply{ok.error()}));
    Result<Msg> msg = decode(bytes);
    if (!msg) return seal(tag, messages::encode(Reply{msg.error()}));
    R reply = std::visit(handler, *msg);
    if constexpr (ReplyOf<R>::optional) {
      return reply ? seal(tag, messages::encode(*reply)) : std::string();
    } else {
      return seal(tag, messages::encode(reply));
    }
  }

  /// `bytes` as a reply to the message tagged `request_tag`
  /// (seal_reply; unsealed by an inbox without a key).
  [[nodiscard]] std::string seal(std::string_view request_tag, std::string bytes) const {
    return key_ ? seal_reply(*key_, request_tag, bytes) : bytes;
  }

 private:
  template <class R>
  struct ReplyOf {
    using type = R;
    static constexpr bool optional = false;
  };
  template <class R>
  struct ReplyOf<std::optional<R>> {
    using type = R;
    static constexpr bool optional = true;
  };

  std::string who_;
  std::shared_ptr<const ClusterKey> key_;
  std::shared_ptr<MetricsRegistry> metrics_;
  ReplayGuard guard_;
};

}  // namespace shardline::actors
