#include "engine/kv_budget.hpp"

#include <charconv>
#include <fstream>
#include <sstream>
#include <string>

namespace shardline::engine {

std::int64_t num_kv_blocks_for_budget(std::uint64_t bytes_budget, int num_layers, int num_kv_heads,
                                      int head_dim, int block_size, int bytes_per_elem) noexcept {
  const std::uint64_t per_block =
      kv_bytes_per_block(num_layers, num_kv_heads, head_dim, block_size, bytes_per_elem);
  return per_block == 0 ? 0 : static_cast<std::int64_t>(bytes_budget / per_block);
}

Result<std::uint64_t> parse_mem_available_bytes(std::string_view text) {
  constexpr std::string_view kKey = "MemAvailable:";
  std::size_t pos = text.find(kKey);
  while (pos != std::string_view::npos && pos != 0 && text[pos - 1] != '\n')
    pos = text.find(kKey, pos + 1);
  if (pos == std::string_view::npos)
    return make_error(ErrorCode::corrupt, "/proc/meminfo: no MemAvailable line");
  std::string_view rest = text.substr(pos + kKey.size());
  rest = rest.substr(0, rest.find('\n'));
  const auto first = rest.find_first_not_of(' ');
  if (first == std::string_view::npos)
    return make_error(ErrorCode::corrupt, "/proc/meminfo: empty MemAvailable value");
  rest.remove_prefix(first);
  std::uint64_t kib = 0;
  const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), kib);
  if (ec != std::errc{} || std::string_view(end, rest.data() + rest.size()).find("kB") == std::string_view::npos)
    return make_error(ErrorCode::corrupt, "/proc/meminfo: unparsable MemAvailable '" + std::string(rest) + "'");
  return kib * 1024ull;
}

Result<std::uint64_t> available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  if (!in) return make_error(ErrorCode::io, "cannot open /proc/meminfo");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_mem_available_bytes(ss.str());
}

}  // namespace shardline::engine
