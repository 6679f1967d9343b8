#include "engine/policies/prefix_order.hpp"

#include <algorithm>
#include <numeric>

namespace shardline::engine {

namespace {

std::size_t common_prefix(const std::vector<std::int32_t>& a, const std::vector<std::int32_t>& b) {
  const std::size_t n = std::min(a.size(), b.size());
  std::size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

}  // namespace

PrefixOrder prefix_order(std::span<const std::vector<std::int32_t>> prompts) {
  PrefixOrder out;
  out.order.resize(prompts.size());
  std::iota(out.order.begin(), out.order.end(), std::size_t{0});
  std::stable_sort(out.order.begin(), out.order.end(), [&](std::size_t a, std::size_t b) {
    return std::lexicographical_compare(prompts[a].begin(), prompts[a].end(), prompts[b].begin(), prompts[b].end());
  });
  for (const auto& p : prompts) out.prompt_tokens += p.size();
  std::uint64_t shared = 0;
  for (std::size_t i = 1; i < out.order.size(); ++i)
    shared += common_prefix(prompts[out.order[i - 1]], prompts[out.order[i]]);
  out.tree_tokens = out.prompt_tokens - shared;
  return out;
}

}  // namespace shardline::engine
