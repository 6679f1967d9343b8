#pragma once
// A conversation file of `tokenize --messages` and `generate --messages`:
// {"messages": [...], "chat_template_kwargs"?: {...}} or a bare list of
// messages.

#include <string>

#include <nlohmann/json.hpp>

#include "common/result.hpp"

namespace shardline::cli {

struct Conversation {
  nlohmann::ordered_json messages;                                    ///< a JSON array
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();  ///< chat_template_kwargs
};

/// Reads `file`. Errors: io (unreadable; exit 1), invalid_argument (not a
/// conversation, or kwargs not an object; a usage error, exit 2).
[[nodiscard]] Result<Conversation> read_conversation(const std::string& file);

}  // namespace shardline::cli
