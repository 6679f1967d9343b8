#include "cli/conversation.hpp"

#include <fstream>

namespace shardline::cli {

Result<Conversation> read_conversation(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return make_error(ErrorCode::io, "cannot read --messages " + file);
  const auto doc = nlohmann::ordered_json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !(doc.is_array() || (doc.is_object() && doc.contains("messages"))))
    return make_error(ErrorCode::invalid_argument,
                      "--messages " + file + ": expected {\"messages\": [...]} or a JSON list of messages");
  Conversation c;
  c.messages = doc.is_array() ? doc : doc["messages"];
  if (doc.is_object() && doc.contains("chat_template_kwargs")) c.kwargs = doc["chat_template_kwargs"];
  if (!c.kwargs.is_object())
    return make_error(ErrorCode::invalid_argument, "--messages " + file + ": chat_template_kwargs must be an object");
  return c;
}

}  // namespace shardline::cli
