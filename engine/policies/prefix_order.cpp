#include "engine/policies/prefix_order.hpp"

namespace shardline::engine {

PrefixOrder prefix_order(std::span<const std::vector<std::int32_t>> prompts) { return prefix_order_of(prompts); }

}  // namespace shardline::engine
