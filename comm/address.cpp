#include "comm/address.hpp"

#include <charconv>

namespace shardline::comm {

Result<std::pair<std::string, int>> parse_host_port(const std::string& hp) {
  const auto colon = hp.rfind(':');
  if (colon == std::string::npos || colon == 0)
    return make_error(ErrorCode::invalid_argument, "'" + hp + "' is not HOST:PORT");
  int port = -1;
  const char* b = hp.data() + colon + 1;
  const char* e = hp.data() + hp.size();
  const auto [p, ec] = std::from_chars(b, e, port);
  if (ec != std::errc() || p != e || port < 0 || port > 65535)
    return make_error(ErrorCode::invalid_argument, "'" + hp + "': port must be 0..65535");
  return std::make_pair(hp.substr(0, colon), port);
}

}  // namespace shardline::comm
