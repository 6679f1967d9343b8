#include "actors/inbox.hpp"

#include <spdlog/spdlog.h>

namespace shardline::actors {

Status Inbox::authenticate(const caf::strong_actor_ptr& sender, std::string_view tag, std::string_view bytes) {
  const std::int64_t now = unix_now_ms();
  const ReplayGuard::Verdict v = key_ ? guard_.admit(*key_, tag, bytes, now) : ReplayGuard::Verdict::bad_tag;
  switch (v) {
    case ReplayGuard::Verdict::accepted:
      return Status::ok_status();
    case ReplayGuard::Verdict::bad_tag:
      spdlog::warn("{}: refused a message with a bad cluster key tag from {}", who_, caf::to_string(sender));
      if (metrics_) metrics_->add("shardline_auth_failures_total", "", 1);
      return make_error(ErrorCode::invalid_argument, "unauthenticated: wrong or missing cluster key");
    case ReplayGuard::Verdict::replayed:
      spdlog::warn("{}: refused a replayed message from {} (its nonce was seen before)", who_, caf::to_string(sender));
      if (metrics_) metrics_->add("shardline_replays_refused_total", "", 1);
      return make_error(ErrorCode::invalid_argument, "replayed: this signed message was accepted before");
    case ReplayGuard::Verdict::expired: {
      const std::int64_t issued = std::stoll(std::string(tag.substr(0, tag.find('.'))));
      spdlog::warn("{}: refused a message from {} signed {} s from now, outside the {} s window (replayed, or "
                   "clocks apart?)",
                   who_, caf::to_string(sender), (issued - now) / 1000, guard_.window_ms() / 1000);
      if (metrics_) metrics_->add("shardline_replays_refused_total", "", 1);
      return make_error(ErrorCode::invalid_argument,
                        "expired: signed " + std::to_string((issued - now) / 1000) + " s from the receiver's clock");
    }
  }
  return make_error(ErrorCode::internal, "unreachable");
}

}  // namespace shardline::actors
