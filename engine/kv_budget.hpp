#pragma once
/// \file
/// KV-cache sizing: bytes per paged block and how many blocks a memory budget
/// holds (vLLM `gpu_memory_utilization`-style "fraction of free memory" mode
/// reads MemAvailable from /proc/meminfo).

#include <cstdint>
#include <string_view>

#include "common/result.hpp"

namespace shardline::engine {

/// Bytes of one block, K and V over all layers:
/// 2 * num_layers * num_kv_heads * head_dim * block_size * bytes_per_elem.
[[nodiscard]] constexpr std::uint64_t kv_bytes_per_block(int num_layers, int num_kv_heads, int head_dim,
                                                         int block_size, int bytes_per_elem) noexcept {
  if (num_layers <= 0 || num_kv_heads <= 0 || head_dim <= 0 || block_size <= 0 || bytes_per_elem <= 0)
    return 0;
  return 2ull * static_cast<std::uint64_t>(num_layers) * static_cast<std::uint64_t>(num_kv_heads) *
         static_cast<std::uint64_t>(head_dim) * static_cast<std::uint64_t>(block_size) *
         static_cast<std::uint64_t>(bytes_per_elem);
}

/// Whole blocks that fit in `bytes_budget` (floor). 0 for degenerate sizes.
[[nodiscard]] std::int64_t num_kv_blocks_for_budget(std::uint64_t bytes_budget, int num_layers,
                                                    int num_kv_heads, int head_dim, int block_size,
                                                    int bytes_per_elem) noexcept;

/// Parses the "MemAvailable: N kB" line of /proc/meminfo text into bytes.
/// Errors: corrupt (line missing or unparsable).
[[nodiscard]] Result<std::uint64_t> parse_mem_available_bytes(std::string_view meminfo_text);

/// MemAvailable of this machine in bytes. Errors: io, corrupt.
[[nodiscard]] Result<std::uint64_t> available_memory_bytes();

}  // namespace shardline::engine
