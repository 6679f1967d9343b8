#pragma once
/// \file
/// Network addresses as the command line and the options give them.

#include <string>
#include <utility>

#include "common/result.hpp"

namespace shardline::comm {

/// Splits "HOST:PORT" at its last colon into (HOST, PORT); PORT may be 0 (a
/// free port, where the caller binds). HOST must not be empty and is
/// returned as written (an unbracketed IPv6 address such as "::1:80" splits
/// at the last colon; "[::1]:80" keeps its brackets). Errors:
/// invalid_argument naming the text: "'X' is not HOST:PORT" (no colon, or
/// nothing before it), "'X': port must be 0..65535" (PORT not a decimal
/// number in range).
[[nodiscard]] Result<std::pair<std::string, int>> parse_host_port(const std::string& host_port);

}  // namespace shardline::comm
