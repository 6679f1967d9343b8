#include "orchestrator/line_order.hpp"

#include <algorithm>
#include <span>
#include <string_view>

#include "common/checksum.hpp"
#include "engine/policies/prefix_order.hpp"

namespace shardline::orchestrator {

std::string prefix_text(const worker::BatchRequest& request) {
  if (request.chat) return "c" + request.messages_json;
  if (!request.prompt_token_ids.empty()) {
    std::string s = "i";
    s.append(reinterpret_cast<const char*>(request.prompt_token_ids.data()),
             request.prompt_token_ids.size() * sizeof(std::int32_t));
    return s;
  }
  return "p" + request.prompt;
}

void LineOrderBuilder::add(std::uint64_t line_index, const LineCheckpoint& where,
                           const worker::BatchRequest& request) {
  const std::string text = prefix_text(request);
  std::vector<std::uint64_t> key;
  key.reserve((text.size() + kChunkBytes - 1) / kChunkBytes);
  for (std::size_t at = 0; at < text.size(); at += kChunkBytes) {
    const std::string_view chunk = std::string_view(text).substr(at, kChunkBytes);
    key.push_back(fnv1a64(kFnv1a64Empty, chunk));  // a collision only misplaces a line, never changes it
  }
  entries_.push_back({line_index, where.shard, where.byte_offset, where.file_line});
  keys_.push_back(std::move(key));
  text_bytes_.push_back(text.size());
}

namespace {

/// The prefix tree's depth-first order with each node's children in the
/// order of their first line (so lines that share nothing keep input
/// order): `sorted` (lexicographic by key, ties by line) regrouped. The
/// lines of a subtree are contiguous in `sorted`; a subtree's first line
/// is its smallest. Iterative: a shared prefix may be thousands of chunks.
std::vector<std::size_t> first_line_order(const std::vector<std::vector<std::uint64_t>>& keys,
                                          const std::vector<std::size_t>& sorted) {
  struct Node {
    std::size_t lo = 0, hi = 0, depth = 0;
    std::size_t first = 0;  ///< its smallest line
    bool ended = false;     ///< its lines' keys all end at depth: equal, emitted in line order
  };
  std::vector<std::size_t> out;
  out.reserve(sorted.size());
  std::vector<Node> stack;
  if (!sorted.empty()) stack.push_back({0, sorted.size(), 0, 0, false});
  std::vector<Node> children;
  while (!stack.empty()) {
    const Node n = stack.back();
    stack.pop_back();
    if (n.ended || n.hi - n.lo == 1) {
      for (std::size_t i = n.lo; i < n.hi; ++i) out.push_back(sorted[i]);  // ties are in line order
      continue;
    }
    children.clear();
    for (std::size_t i = n.lo; i < n.hi;) {
      const auto& ki = keys[sorted[i]];
      const bool ended = ki.size() <= n.depth;  // shorter keys sort first
      std::size_t j = i + 1;
      while (j < n.hi && (ended ? keys[sorted[j]].size() <= n.depth
                                : keys[sorted[j]].size() > n.depth && keys[sorted[j]][n.depth] == ki[n.depth]))
        ++j;
      std::size_t first = sorted[i];
      for (std::size_t k = i; k < j; ++k) first = std::min(first, sorted[k]);
      children.push_back({i, j, n.depth + 1, first, ended});
      i = j;
    }
    std::sort(children.begin(), children.end(), [](const Node& a, const Node& b) { return a.first < b.first; });
    for (auto c = children.rbegin(); c != children.rend(); ++c) stack.push_back(*c);
  }
  return out;
}

}  // namespace

LineOrderBuilder::Built LineOrderBuilder::build() {
  Built out;
  // Lexicographic by the chunks' hashes (a prefix tree with its children in
  // hash order), then the children in the order of their first line.
  const engine::PrefixOrder by_hash = engine::prefix_order_of(std::span<const std::vector<std::uint64_t>>(keys_));
  const std::vector<std::size_t> order = first_line_order(keys_, by_hash.order);
  out.order.reserve(order.size());
  for (std::size_t i = 0; i < order.size(); ++i) {
    const std::size_t line = order[i];
    out.order.push_back(entries_[line]);
    out.prompt_bytes += text_bytes_[line];
    if (i == 0) continue;
    // What this line shares with the one before it in the order: whole
    // equal chunks (a last, shorter chunk only when it is equal too).
    const std::size_t prev = order[i - 1];
    const auto& a = keys_[prev];
    const auto& b = keys_[line];
    const auto chunks = static_cast<std::uint64_t>(std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first - a.begin());
    out.shared_bytes += std::min({chunks * kChunkBytes, text_bytes_[prev], text_bytes_[line]});
  }
  entries_.clear();
  keys_.clear();
  text_bytes_.clear();
  return out;
}

}  // namespace shardline::orchestrator
