#include "actors/inbox.hpp"

#include <spdlog/spdlog.h>

namespace shardline::actors {

Status Inbox::authenticate(const caf::strong_actor_ptr& sender, std::string_view tag,
                           std::string_view bytes) const {
  if (key_ && key_->verify(bytes, tag)) return Status::ok_status();
  spdlog::warn("{}: refused a message with a bad cluster key tag from {}", who_, caf::to_string(sender));
  if (metrics_) metrics_->add("shardline_auth_failures_total", "", 1);
  return make_error(ErrorCode::invalid_argument, "unauthenticated: wrong or missing cluster key");
}

}  // namespace shardline::actors
