#pragma once
// The shipped demo dataset (deploy/demo/prompts.jsonl) as test input: its
// first lines, each request body optionally edited, written to a JSONL file.
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace shardline::testing_support {

/// Writes the first `n` demo lines to `out_path`; `edit(i, body)` may change
/// line i's request body (nullptr: lines are copied as they are). Past the
/// file's 1,100 lines it starts over, with custom ids suffixed "-r1", "-r2",
/// ... so every line stays unique. Returns the number of lines written.
inline int write_demo_prompts(const std::string& out_path, int n,
                              const std::function<void(int, nlohmann::json&)>& edit = nullptr) {
  std::ifstream demo(std::string(SHARDLINE_SOURCE_DIR) + "/deploy/demo/prompts.jsonl");
  std::vector<std::string> lines;
  for (std::string line; std::getline(demo, line);) lines.push_back(line);
  std::ofstream out(out_path);
  int written = 0;
  for (; written < n && !lines.empty(); ++written) {
    const std::size_t i = static_cast<std::size_t>(written);
    const std::size_t round = i / lines.size();  // past the file's end: its prompts again, new custom_ids
    if (!edit && round == 0) {
      out << lines[i] << "\n";
      continue;
    }
    nlohmann::json j = nlohmann::json::parse(lines[i % lines.size()]);
    if (round > 0) j["custom_id"] = j["custom_id"].get<std::string>() + "-r" + std::to_string(round);
    if (edit) edit(written, j["body"]);
    out << j.dump() << "\n";
  }
  return written;
}

}  // namespace shardline::testing_support
