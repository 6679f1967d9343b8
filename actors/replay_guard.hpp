#pragma once
/// \file
/// Message tags that are valid once (issue 46, item 2). A signed message's
/// tag is "ISSUED_MS.NONCE.MAC":
///   * ISSUED_MS: when the sender signed it, milliseconds since the Unix
///     epoch (decimal);
///   * NONCE: 32 hex digits, 16 random bytes drawn once per process followed
///     by a 64-bit counter, so no two messages of any process share one;
///   * MAC: HMAC-SHA256(ClusterKey::message_tag_key(), "ISSUED_MS.NONCE." ||
///     bytes), hex.
/// A receiver (ReplayGuard, one per actor's inbox) accepts a message only if
/// its MAC verifies, it was signed within `window` of the receiver's clock
/// (either way: clocks of a cluster's machines must agree within it), and
/// its nonce was not seen in that window. So a copy of a message sent again
/// later, on any connection, is refused: as replayed while its nonce is
/// remembered, as expired afterwards. Memory: one nonce per message of the
/// last `window` (about 60 bytes each).
///
/// Scope: this guards against a key holder (or anyone who got a copy of a
/// signed message, e.g. from a log) sending a captured message again. A
/// network attacker never sees a message: every connection is mutual TLS
/// (actors/cluster_tls.hpp), and a recorded TLS stream does not play back
/// on a new connection. A receiver that restarts (a killed orchestrator)
/// starts with an empty memory: within `window` after that, a message it
/// had accepted before could be accepted once more (docs/cluster.md).

#include <chrono>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>

#include "actors/auth.hpp"
#include "common/result.hpp"

namespace shardline::actors {

/// A fresh tag for `bytes`, signed now with a new nonce.
[[nodiscard]] std::string make_message_tag(const ClusterKey& key, std::string_view bytes);
/// A tag for `bytes` with the given fields (tests; make_message_tag uses the
/// clock and the process's nonce counter).
[[nodiscard]] std::string make_message_tag(const ClusterKey& key, std::string_view bytes, std::int64_t issued_ms,
                                           std::string_view nonce);
/// Whether `tag` is a well-formed tag whose MAC verifies for `bytes`
/// (freshness not checked).
[[nodiscard]] bool message_tag_is_authentic(const ClusterKey& key, std::string_view tag, std::string_view bytes);
/// Milliseconds since the Unix epoch now (the system clock).
[[nodiscard]] std::int64_t unix_now_ms();

class ReplayGuard {
 public:
  /// How far a message's signing time may be from the receiver's clock.
  static constexpr std::chrono::milliseconds kDefaultWindow{std::chrono::minutes(5)};

  enum class Verdict {
    accepted,
    bad_tag,   ///< malformed, or the MAC does not verify: not signed with this key
    expired,   ///< signed more than `window` before (or after) now
    replayed,  ///< its nonce was accepted before
  };

  explicit ReplayGuard(std::chrono::milliseconds window = kDefaultWindow) : window_ms_(window.count()) {}

  /// Checks `tag` for `bytes` at `now_ms` and, when accepted, remembers its
  /// nonce until it would expire anyway.
  [[nodiscard]] Verdict admit(const ClusterKey& key, std::string_view tag, std::string_view bytes,
                              std::int64_t now_ms);
  /// Nonces remembered now.
  [[nodiscard]] std::size_t remembered() const { return seen_.size(); }
  [[nodiscard]] std::int64_t window_ms() const { return window_ms_; }

 private:
  void forget_before(std::int64_t issued_ms);
  std::int64_t window_ms_;
  std::unordered_set<std::string> seen_;                    ///< nonces
  std::set<std::pair<std::int64_t, std::string>> by_time_;  ///< (issued_ms, nonce), to forget old ones
};

[[nodiscard]] const char* verdict_name(ReplayGuard::Verdict v);

/// Bytes of a reply's seal: HMAC-SHA256 in hex.
inline constexpr std::size_t kReplySealHex = 64;

/// A signed reply to the message tagged `request_tag`: the seal
/// HMAC-SHA256(ClusterKey::reply_seal_key(), request_tag "." bytes), in
/// hex, followed by `bytes`. Bound to its request's tag, whose nonce no
/// other message shares, a reply can be neither forged nor an old reply
/// passed off as this one. Empty bytes (no reply) stay empty.
[[nodiscard]] std::string seal_reply(const ClusterKey& key, std::string_view request_tag, std::string_view bytes);
/// The bytes of `reply`, a reply sealed for `request_tag`, or
/// invalid_argument "unauthenticated reply: ..." (empty, too short, or a
/// seal that does not verify: not from a holder of the key, or not to this
/// request). The view points into `reply`.
[[nodiscard]] Result<std::string_view> open_reply(const ClusterKey& key, std::string_view request_tag,
                                                  std::string_view reply);

}  // namespace shardline::actors
