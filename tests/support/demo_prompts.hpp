#pragma once
// The shipped demo dataset (deploy/demo/prompts.jsonl) as test input: its
// first lines, each request body optionally edited, written to a JSONL file.
#include <fstream>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

namespace shardline::testing_support {

/// Writes the first `n` demo lines to `out_path`; `edit(i, body)` may change
/// line i's request body (nullptr: lines are copied as they are). Returns the
/// number of lines written.
inline int write_demo_prompts(const std::string& out_path, int n,
                              const std::function<void(int, nlohmann::json&)>& edit = nullptr) {
  std::ifstream demo(std::string(SHARDLINE_SOURCE_DIR) + "/deploy/demo/prompts.jsonl");
  std::ofstream out(out_path);
  std::string line;
  int written = 0;
  for (; written < n && std::getline(demo, line); ++written) {
    if (!edit) {
      out << line << "\n";
      continue;
    }
    nlohmann::json j = nlohmann::json::parse(line);
    edit(written, j["body"]);
    out << j.dump() << "\n";
  }
  return written;
}

}  // namespace shardline::testing_support
