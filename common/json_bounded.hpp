#pragma once
/// \file
/// JSON from untrusted input (job lines, uploads, HTTP bodies) parsed with a
/// bound on nesting depth. nlohmann's parser is iterative, but a parsed
/// value's dump(), copy and comparison recurse once per level, so a line of
/// 100,000 nested arrays crashed a node with SIGSEGV (issue 46, item 5).
/// Values parsed here are at most `max_depth` arrays / objects deep, which
/// keeps every later recursion shallow.
///
/// The bound is nlohmann's own parser callback (called at every array and
/// object start with the number of containers already open); the library has
/// no depth option of its own.

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/result.hpp"

namespace shardline {

/// Nesting allowed in untrusted JSON: OpenAI request bodies and chat
/// messages nest a handful of levels; 64 leaves room for any real schema.
inline constexpr int kMaxJsonDepth = 64;

namespace detail {
struct JsonTooDeep {};
}  // namespace detail

/// Parses `text` as one JSON value (nlohmann::json or ordered_json).
/// Errors: corrupt ("not valid JSON"), invalid_argument ("JSON nested deeper
/// than N levels"). Never throws.
template <class Json = nlohmann::json>
[[nodiscard]] Result<Json> parse_json_bounded(std::string_view text, int max_depth = kMaxJsonDepth) {
  const auto callback = [max_depth](int depth, typename Json::parse_event_t event, Json& /*parsed*/) -> bool {
    if ((event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start) &&
        depth >= max_depth)
      throw detail::JsonTooDeep{};
    return true;
  };
  try {
    Json j = Json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/false);
    if (j.is_discarded()) return make_error(ErrorCode::corrupt, "not valid JSON");
    return j;
  } catch (const detail::JsonTooDeep&) {
    return make_error(ErrorCode::invalid_argument,
                      "JSON nested deeper than " + std::to_string(max_depth) + " levels");
  } catch (const std::exception& e) {  // e.g. bad_alloc on a huge input
    return make_error(ErrorCode::corrupt, std::string("not valid JSON: ") + e.what());
  }
}

}  // namespace shardline
