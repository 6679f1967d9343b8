#pragma once
// Output lines of different jobs carry different ids (issue 46, item 16:
// "batch_req_" + 32 hex digits drawn per job, and the same digits in the
// response's request_id). Tests that compare two jobs' outputs over the same
// input replace them with a placeholder first; everything else must match
// byte for byte.

#include <regex>
#include <string>

namespace shardline::testing_support {

/// `text` (output lines) with every output id and request id replaced by
/// "batch_req_X" / "cmpl-X" / "chatcmpl-X" (ids of older jobs,
/// "<job>_<line>", too).
inline std::string normalize_output_ids(const std::string& text) {
  static const std::regex id("\"batch_req_([0-9a-f]{32}|\\d+_\\d+)\"");
  static const std::regex req("\"(chat)?cmpl-([0-9a-f]{32}|\\d+_\\d+)\"");
  return std::regex_replace(std::regex_replace(text, id, "\"batch_req_X\""), req, "\"$1cmpl-X\"");
}

/// Whether two outputs are the same but for their ids.
inline bool same_output(const std::string& a, const std::string& b) {
  return normalize_output_ids(a) == normalize_output_ids(b);
}

}  // namespace shardline::testing_support
